"""Train the one model: masked diffusion over the shared token space, on accelerate.

``unimodal train --preset small --data scenes,digits --out DIR`` runs :func:`train`. The same code runs on one
CPU process, several CPU processes (``ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 -m unimodal.training.train ...``,
gloo) and several GPUs (``accelerate launch -m unimodal.training.train ...``, DDP or FSDP through accelerate's config).

A step: draw a global batch of samples (a pure function of seed and step, so a resumed run sees the same
data), give each a task (which segments are conditions, which targets) and maybe drop its condition, mask
the targets at a random ratio, one forward/backward with the single objective. Every process takes its own
slice of the global batch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from unimodal.backbone.dit import DiT
from unimodal.training.checkpoint import resumed_config, save_atomic
from unimodal.training.critic import AttributeSwaps, CriticSpec, critic_objective
from unimodal.training.objective import (MASKINGS, NORMALISERS, WEIGHTINGS, CaptionSurprisal, LossSpec, TargetVocab,
                                         masked_diffusion_loss, masked_token_accuracy,
                                         next_token_accuracy, next_token_loss, sparse_diffusion_loss)
from unimodal.training.hardware import release_freed_memory, resident_mb
from unimodal.training.optim import warmup_cosine
from unimodal.training.schedule import MaskSchedule
from unimodal.training.tasks import DEFAULT_TASK_WEIGHTS, ExampleBatch, TaskMixture, build_example, collate_examples
from unimodal.training.tokens import MAX_AUDIO_SECONDS
from unimodal.core.errors import DataError, InputError
from unimodal.core.figures import pyplot, save_figure
from unimodal.core.paths import atomic_write, model_hash, user_path
from unimodal.training.data.sources import data_kind, dataset_names, resolve_weighted, weighted
from unimodal.core.int8 import load_pretrained

CRITIC_WEIGHT = 0.1  # --critic-weight to train the critic with: its BCE (~0.7 untrained, ~0.1-0.3 trained) then
# weighs about a tenth of the denoising loss (~1-4 per token), so the shared backbone keeps serving the generator
OBJECTIVES = ("diffusion", "ar")  # masked diffusion (the model) or next-token prediction (its autoregressive twin)
CRITIC_LABELS = ("decoded", "token")  # what the critic calls wrong (TrainConfig.critic_labels)
VAL_RATIOS = (0.15, 0.35, 0.55, 0.75, 0.95)  # fixed mask ratios of the validation loss (low variance)


@dataclass
class TrainConfig:
    preset: str = "small"
    model_overrides: dict = field(default_factory=dict)
    steps: int = 4000
    batch_size: int = 32  # global, summed over processes and accumulation
    grad_accum: int = 1
    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    warmup: int = 200
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ema_decay: float = 0.999
    bf16: bool | None = None  # None: bf16 autocast where the hardware multiplies bf16 natively (unimodal.training.hardware)
    # unimodal.training.objective.WEIGHTINGS. flat (every masked token counts once, whatever the ratio) drew and
    # read far better than 1/t in `bench recipe` (docs/results.md, "Flat loss weighting")
    loss_weighting: str = "flat"
    loss_norm: str = "real"  # unimodal.training.objective.NORMALISERS
    # unimodal.training.objective.MASKINGS. complementary (each sample twice, with a mask and its complement:
    # 2x the rows of batch_size) won at equal compute in `bench recipe` (docs/results.md, "Recipe variants")
    masking: str = "complementary"
    # Of the samples, those whose text target is masked as a suffix, the words before a cut point visible
    # (unimodal.training.objective.suffix_text_masks): the state a left-to-right decoder is in. 0: none
    suffix_share: float = 0.0
    # Caption words masked informative first (unimodal.training.objective.content_first_masks): the strength of the
    # order, each word scored by its surprisal in the training captions (0: the uniform choice, the default)
    content_first: float = 0.0
    sparse_head: bool = True  # logits only at masked slots, over their modality's ids (False: the first recipe)
    unpad: bool = True  # the per-token layers skip padding slots (same values, less work; False: the first recipe)
    task_weights: dict = field(default_factory=lambda: dict(DEFAULT_TASK_WEIGHTS))
    cond_drop: float = 0.1
    val_every: int = 200
    val_samples: int = 32  # per task
    checkpoint_every: int = 100
    seed: int = 0
    objective: str = "diffusion"
    train_subset: int | None = None  # train on the first N training samples only
    snapshots: list = field(default_factory=list)  # steps at which to also write OUT/model-stepN
    init_from: str | None = None  # a model folder whose backbone weights start the run (fine-tuning)
    # Set by the run, not the command: model_hash of init_from when the run started, so a model's lineage stays
    # readable after the folder it started from is replaced (a fine-tune of unimodal/default_model names a
    # folder that the next release overwrites). None: no init_from, or a checkpoint that predates the field.
    init_from_hash: str | None = None
    max_audio_seconds: float = MAX_AUDIO_SECONDS  # the audio segment's length: this many seconds of codes
    # Audio positions (tokenizers_mm/layout.py): text tokens per audio code on the second rotary axis, so a word and
    # its sound line up; 0 keeps (i, i). None (the command's default): what the --init-from model was trained
    # with, else 0; "auto": the training set's mean text tokens per audio code. A run stores the number it used.
    audio_position_rate: float | str | None = None
    # The learned critic (training/critic.py): weight of its loss beside the denoising loss. 0 (the default) leaves
    # the critic head out of the step, the graph and the optimizer: it costs a second forward and backward over
    # ``critic_share`` of the rows (at 0.25 about a quarter more model compute per step, counted, not timed) and
    # its worth over the free confidence critic is not measured yet, so a run opts in (CRITIC_WEIGHT).
    critic_weight: float = 0.0
    critic_share: float = 0.25  # of the step's rows, those filled by the model and critiqued
    critic_swap_rate: float = 0.1  # each critiqued row swaps up to this share of its codes and attribute words
    # Train the critic head alone on a model that is already trained (init_from): every other weight frozen, the
    # denoising forward run without gradient only to fill the drafts, the loss the critic's BCE alone. Generation
    # is exactly the starting model's, so a shipped model can gain a critic without being judged again; a step
    # costs two forwards (fill, critique) and the head's backward, not the generator's backward.
    critic_only: bool = False
    # What the critic learns to call wrong: "decoded" (image and audio codes whose decoded content differs beyond a
    # threshold, training/critic_labels.py; captions by token) or "token" (every code that differs from the real
    # one). A run from a pack has no codecs to decode with and uses "token", saying so.
    critic_labels: str = "decoded"

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise InputError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if not (isinstance(self.max_audio_seconds, (int, float)) and math.isfinite(self.max_audio_seconds)
                and self.max_audio_seconds > 0):
            raise InputError(f"max_audio_seconds must be a positive number of seconds, got {self.max_audio_seconds!r}")
        if self.train_subset is not None and self.train_subset < 1:
            raise InputError(f"train_subset must be a positive number of samples, got {self.train_subset}")
        if self.masking not in MASKINGS:
            raise InputError(f"masking must be one of {MASKINGS}, got {self.masking!r}")
        if not (isinstance(self.suffix_share, (int, float)) and 0 <= self.suffix_share <= 1):
            raise InputError(f"suffix_share must be a share in [0, 1], got {self.suffix_share!r}")
        if not (isinstance(self.content_first, (int, float)) and math.isfinite(self.content_first)
                and self.content_first >= 0):
            raise InputError(f"content_first must be a finite number >= 0 (0: off), got {self.content_first!r}")
        if self.loss_weighting not in WEIGHTINGS or self.loss_norm not in NORMALISERS:
            raise InputError(f"loss weighting must be one of {WEIGHTINGS} and normalisation one of {NORMALISERS}, "
                             f"got {self.loss_weighting!r} and {self.loss_norm!r}")
        if not (self.audio_position_rate is None or _position_rate_setting(self.audio_position_rate)):
            raise InputError(f"audio_position_rate must be 'auto', or text tokens per audio code in [0, 1] (0: "
                             f"audio positions (i, i)), got {self.audio_position_rate!r}")
        self._check_critic()

    def _check_critic(self) -> None:
        if not (isinstance(self.critic_weight, (int, float)) and math.isfinite(self.critic_weight)
                and self.critic_weight >= 0):
            raise InputError(f"critic_weight must be a finite number >= 0 (0: no critic), got {self.critic_weight!r}")
        if not 0 < self.critic_share <= 1 or not 0 <= self.critic_swap_rate < 1:
            raise InputError(f"critic_share must lie in (0, 1] and critic_swap_rate in [0, 1), got "
                             f"{self.critic_share!r} and {self.critic_swap_rate!r}")
        if self.trains_critic and self.autoregressive:
            raise InputError("the autoregressive twin has no critic: --critic-weight must be 0 and --critic-only "
                             "off with --objective ar")
        if self.critic_labels not in CRITIC_LABELS:
            raise InputError(f"critic_labels must be one of {CRITIC_LABELS}, got {self.critic_labels!r}")
        if self.critic_only and not self.init_from:
            raise InputError("--critic-only trains the critic head of a trained model and freezes the rest: give "
                             "the model with --init-from")

    @property
    def trains_critic(self) -> bool:
        """Whether the step trains the critic head (else the head is frozen and out of the optimizer)."""
        return self.critic_weight > 0 or self.critic_only

    # What a checkpoint written before a setting existed was trained with, so that it resumes as it ran.
    LEGACY_DEFAULTS = {"masking": "independent", "loss_norm": "maskable", "sparse_head": False, "loss_weighting": "elbo",
                       "critic_labels": "token", "audio_position_rate": 0.0}
    # What a resumed run takes from the command instead of its checkpoint: none of it changes what is trained.
    RESUME_OVERRIDES = ("steps", "snapshots")

    def loss_spec(self, layout, attributes: AttributeSwaps | None = None, labels=None,
                  train_tokens: list[dict] | None = None) -> LossSpec:
        """The step's loss; ``attributes``: the caption swaps of the critic's negatives (None: code swaps only);
        ``labels``: the critic's decoded-content labels (None: token inequality); ``train_tokens``: the training
        samples whose captions content-first masking scores words by (needed when ``content_first`` > 0)."""
        weight = 1.0 if self.critic_only else self.critic_weight  # alone, its weight is only a scale of the lr
        critic = CriticSpec.of(layout, weight, self.critic_share, self.critic_swap_rate, attributes, labels) \
            if self.trains_critic else None
        return LossSpec(TargetVocab.of(layout) if self.sparse_head else None, self.loss_weighting, self.loss_norm,
                        self.masking, critic, self.critic_only, self.unpad, self.suffix_share,
                        self.content_first, self._surprisal(layout, train_tokens))

    def _surprisal(self, layout, train_tokens: list[dict] | None) -> CaptionSurprisal | None:
        if self.content_first <= 0:
            return None
        if train_tokens is None:
            raise ValueError("content-first masking scores words by the training captions: give train_tokens")
        return CaptionSurprisal.of(layout, train_tokens)

    @property
    def autoregressive(self) -> bool:
        return self.objective == "ar"


def _position_rate_setting(rate) -> bool:
    """What ``--audio-position-rate`` may say: "auto", 0 (off) or a layout's rate (tokenizers_mm/layout.py)."""
    from unimodal.tokenizers_mm.layout import is_position_rate

    return rate == "auto" or (rate == 0 and not isinstance(rate, bool)) or is_position_rate(rate)


def lr_factor(cfg: TrainConfig, step: int) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio``."""
    return warmup_cosine(step, cfg.steps, cfg.warmup, cfg.min_lr_ratio)


def make_examples(layout, tokens: list[dict], mixture: TaskMixture, indices, rng: np.random.Generator,
                  pad_targets: bool = True):
    examples = []
    for index in indices:
        sample = tokens[int(index)]
        task = mixture.choose(rng, frozenset(sample))
        drop = bool(task.conditions) and rng.random() < mixture.cond_drop
        examples.append(build_example(layout, sample, task, drop_condition=drop, pad_targets=pad_targets))
    return examples


def length_grouped(examples: list, groups: int) -> list[list]:
    """Split a step's examples into ``groups`` equal micro-batches of similar length.

    A batch is padded to its longest example, and lengths differ by task (an image target alone: ~80 tokens;
    joint generation: ~180), so mixed micro-batches spend up to 40% of the compute on padding. Grouping by
    length inside the step keeps every task in every optimizer step.
    """
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].packed))
    size = len(examples) // groups
    return [[examples[i] for i in order[k * size:(k + 1) * size]] for k in range(groups)]


def global_batch_indices(n: int, cfg: TrainConfig, step: int) -> np.ndarray:
    """Indices of the global batch of ``step``: consecutive slices of a fresh permutation each epoch."""
    start = step * cfg.batch_size
    out = []
    while len(out) < cfg.batch_size:
        epoch, offset = divmod(start + len(out), n)
        perm = np.random.default_rng([cfg.seed, epoch]).permutation(n)
        out.extend(perm[offset:offset + cfg.batch_size - len(out)].tolist())
    return np.asarray(out)


def unwrapped(model) -> DiT:
    """The DiT inside a DDP / compiled / :class:`CompiledForward` wrapper (its output head is needed outside
    ``forward``)."""
    while not isinstance(model, DiT):
        model = getattr(model, "module", None) or getattr(model, "_orig_mod", None) or model.model
    return model


# A CPU run hands its freed memory back to the system every this many steps (release_freed_memory): every step cost
# ~20% of the step time in pages faulted in again, and the memory grows ~25 MB a step in between
TRIM_EVERY = 10


def step_loss(model, batch: ExampleBatch, schedule: MaskSchedule, generator: torch.Generator,
              spec: LossSpec = LossSpec(), t: torch.Tensor | None = None):
    """Mask, forward, loss. Returns (loss, masked-token accuracy). With ``spec.vocab`` the forward skips the
    vocabulary head and logits are computed only at masked slots, over their modality's ids."""
    b = batch.batch
    t = schedule.sample(b.ids.shape[0], generator) if t is None else t
    masked = spec.mask(b.ids, batch.maskable, t, generator, segment_ids=b.segment_ids)
    rows = masked.noisy_ids.shape[0] // b.ids.shape[0]  # 2 with complementary masks (every input twice), 4: partition

    device = next(model.parameters()).device

    def on_device(x: torch.Tensor) -> torch.Tensor:
        return (x if rows == 1 else x.repeat(rows, *([1] * (x.dim() - 1)))).to(device, non_blocking=True)

    inputs = (on_device(b.segment_ids), on_device(b.positions), on_device(batch.is_target),
              on_device(b.attention_mask))
    segment_ids = inputs[0]
    masked_on_device = type(masked)(*(x.to(device) for x in (masked.noisy_ids, masked.targets, masked.masked,
                                                                  masked.maskable, masked.t)))
    with torch.no_grad() if spec.critic_only else contextlib.nullcontext():  # critic only: the fills' forward
        # with complementary masks the batch is two copies of the samples: their conditions are computed once
        out = model(masked_on_device.noisy_ids, masked_on_device.t, *inputs, logits=spec.vocab is None, critic=False,
                    unpad=spec.unpad, copies=rows)
        if spec.vocab is None:
            loss = masked_diffusion_loss(out.logits, masked_on_device, spec.weighting, spec.normalise, segment_ids)
            acc = masked_token_accuracy(out.logits, masked_on_device)
        else:
            loss, acc = sparse_diffusion_loss(unwrapped(model).output_logits, out.hidden, segment_ids,
                                              masked_on_device, spec.vocab, spec.weighting, spec.normalise)
    if spec.critic is not None:
        critic = critic_objective(model, unwrapped(model).output_logits, out.hidden, masked_on_device, inputs,
                                  spec.critic, generator, spec.unpad)
        loss = critic if spec.critic_only else loss + spec.critic.weight * critic
    return loss, acc


class StepBatches(torch.utils.data.IterableDataset):
    """The micro-batches of steps ``start..stop-1``, each a pure function of (seed, step, rank) as the trainer
    draws them, so they can be built in DataLoader workers (a GPU step is faster than building its batch in
    Python) in exactly the order and content of the single-process loop. Yields (step, generator seed,
    micro-batches)."""

    def __init__(self, layout, tokens: list[dict], cfg: "TrainConfig", start: int, stop: int, rank: int, world: int):
        super().__init__()
        self.layout, self.tokens, self.cfg = layout, tokens, cfg
        self.start, self.stop, self.rank, self.world = start, stop, rank, world
        self.mixture = TaskMixture(cfg.task_weights, cfg.cond_drop)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        for step in range(self.start + worker, self.stop, workers):  # the DataLoader takes workers in turn
            yield self.batches(step)

    def batches(self, step: int):
        cfg = self.cfg
        rng = np.random.default_rng([cfg.seed, step, self.rank])
        generator_seed = int(rng.integers(2**62))
        mine = global_batch_indices(len(self.tokens), cfg, step)[self.rank::self.world]
        examples = make_examples(self.layout, self.tokens, self.mixture, mine, rng, pad_targets=not cfg.autoregressive)
        return step, generator_seed, [collate_examples(chunk) for chunk in length_grouped(examples, cfg.grad_accum)]


def step_batches(layout, tokens, cfg, start: int, rank: int, world: int, workers: int):
    """Iterator over :class:`StepBatches` up to ``cfg.steps``; ``workers`` > 0 builds them in subprocesses."""
    dataset = StepBatches(layout, tokens, cfg, start, cfg.steps, rank, world)
    if workers == 0:
        return iter(dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers, prefetch_factor=4,
                                         persistent_workers=False, collate_fn=lambda x: x)
    return iter(loader)


def ar_step_loss(model, batch: ExampleBatch, unpad: bool = True):
    """The autoregressive twin's step: one causal forward, next-token loss on the target slots."""
    b = batch.batch
    device = next(model.parameters()).device
    ids, predict = b.ids.to(device), batch.maskable.to(device)
    t = torch.zeros(ids.shape[0], device=device)  # a causal model sees clean tokens only
    out = model(ids, t, b.segment_ids.to(device), b.positions.to(device), batch.is_target.to(device),
                b.attention_mask.to(device), critic=False, unpad=unpad)
    return next_token_loss(out.logits, ids, predict), next_token_accuracy(out.logits, ids, predict)


def objective_loss(model, batch: ExampleBatch, cfg: "TrainConfig", schedule: MaskSchedule,
                   generator: torch.Generator, spec: LossSpec):
    if cfg.autoregressive:
        return ar_step_loss(model, batch, spec.unpad)
    return step_loss(model, batch, schedule, generator, spec)


class CompiledForward(torch.nn.Module):
    """The model with its forward (input checks aside) under ``torch.compile``, for training steps."""

    def __init__(self, model: DiT, backend: str = "inductor"):
        super().__init__()
        self.model = model
        # ``backend``: torch.compile's; tests trace with "eager" (the same graph capture, no code generation)
        self._compiled = torch.compile(model.forward_unchecked, dynamic=True, backend=backend)
        if next(model.parameters()).is_cuda:  # a compiler failure falls back to eager instead of ending a GPU run
            # bound under its own name: ``import torch._dynamo`` here would make ``torch`` a local of the whole
            # function and break the torch.compile call above (UnboundLocalError, the first GPU run's failure)
            from torch import _dynamo

            _dynamo.config.suppress_errors = True

    def forward(self, ids, t, segment_ids, positions, is_target, attention_mask, logits=True, critic=True,
                unpad=False, copies=1):
        # A compiled forward runs padded: the real-token count changes every batch, and each new count would
        # cost a recompilation or a graph break (compilation is for GPUs, where padding slots are nearly free).
        return self._compiled(ids, t, segment_ids, positions, is_target, attention_mask, logits, critic)


class EMA:
    """Exponential moving average of the weights; the shipped model uses these."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.shadow = {k: v.detach().clone().float() for k, v in model.state_dict().items()}

    def to(self, device) -> None:
        self.shadow = {k: v.to(device) for k, v in self.shadow.items()}

    @torch.no_grad()
    def update(self, model: torch.nn.Module, step: int) -> None:
        decay = min(self.decay, (1 + step) / (10 + step))  # short warm-up: early weights are noise
        state = model.state_dict()
        floats = [key for key, value in state.items() if value.is_floating_point()]
        # one fused kernel per group of tensors instead of two per tensor: it matters on a GPU
        torch._foreach_lerp_([self.shadow[k] for k in floats], [state[k].detach().float() for k in floats], 1 - decay)
        for key, value in state.items():
            if not value.is_floating_point():
                self.shadow[key].copy_(value)


def validation_spec(layout) -> LossSpec:
    """The validation loss is the ELBO per real target token whatever the recipe trains with, so runs with
    different weightings stay comparable."""
    return LossSpec(TargetVocab.of(layout), "elbo", "real")


@torch.no_grad()
def validation_losses(model, layout, tokens: list[dict], mixture: TaskMixture, cfg: TrainConfig,
                      spec: LossSpec | None = None) -> dict[str, float]:
    """Loss per task on the first ``val_samples`` validation samples, at fixed mask ratios and masks."""
    was_training = model.training
    model.eval()
    losses = {}
    for task in mixture.tasks:
        samples = [s for s in tokens if task.modalities <= frozenset(s)][: cfg.val_samples]
        if not samples:
            continue
        batch = collate_examples([build_example(layout, s, task, pad_targets=not cfg.autoregressive)
                                  for s in samples])
        if cfg.autoregressive:  # exact, no masks to draw
            losses[task.name] = float(ar_step_loss(model, batch)[0])
            continue
        total = 0.0
        for i, ratio in enumerate(VAL_RATIOS):
            generator = torch.Generator().manual_seed(1000 + i)
            t = torch.full((len(samples),), ratio)
            loss, _ = step_loss(model, batch, MaskSchedule(), generator, spec or validation_spec(layout), t=t)
            total += float(loss)
        losses[task.name] = total / len(VAL_RATIOS)
    model.train(was_training)
    return losses


def plot_history(history: list[dict], path: Path, objective: str = "diffusion") -> bool:
    """Validation loss per task against steps, as a PNG. False when matplotlib is missing."""
    try:
        plt = pyplot()
    except ImportError:
        return False
    rows = [h for h in history if h.get("val")]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for task in rows[-1]["val"]:
        ax.plot([h["step"] for h in rows], [h["val"].get(task, float("nan")) for h in rows], marker="o", label=task)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (next-token cross-entropy)" if objective == "ar"
                  else "validation loss (masked-diffusion ELBO per token)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)
    return True


def write_history(out_dir: Path, history: list[dict], objective: str = "diffusion") -> None:
    """``history.json`` and ``val_loss.png`` beside the checkpoint, so a running job can be watched."""
    tmp = out_dir / "history.json.tmp"
    tmp.write_text(json.dumps(history, indent=1))
    tmp.replace(out_dir / "history.json")
    plot_history(history, out_dir / "val_loss.png", objective)


def check_data(names: list[str] | tuple[str, ...]) -> None:
    """Refuse a ``--data`` that cannot be trained on before any codec loads or data set builds: none given, an
    entry that names nothing usable, a pack that is not one or does not come alone."""
    from unimodal.training.pack import PACK_SUFFIX, check_pack

    if not names:
        raise InputError("--data is empty; give an embedded set (scenes, digits), a built data set folder, a JSONL "
                         "manifest or one pack (*.pack.safetensors)")
    from unimodal.training.data.sources import split_weight

    for name in names:
        path, _ = split_weight(name)  # a weight was given when the entry is more than its (expanded) path
        if path.endswith(PACK_SUFFIX) and path != os.path.expanduser(str(name)):
            raise InputError(f"--data {name}: a pack's weights are set when it is packed (`unimodal data pack "
                             f"--data scenes,digits:4`); give the pack alone, without a weight")
    if any(str(name).endswith(PACK_SUFFIX) for name in names):
        if len(names) != 1:
            raise InputError(f"--data: a pack holds a whole training set; give it alone, got {list(names)}")
        check_pack(names[0])
        return
    for name in names:
        data_kind(name)


def training_record(cfg: TrainConfig, steps_done: int | None = None) -> dict:
    """What ``training_config.json`` says of the weights. A critic-only run's generator is its ``init_from``
    model's, unchanged: the record is that model's (how the generator was trained), with this run under
    ``critic_head``, so the folder does not read as a model of the critic run's few steps. ``steps_done``: the
    optimizer steps the weights had when written (``steps`` is the plan: a ``--max-minutes`` stop ends earlier)."""
    record = {**asdict(cfg), **({} if steps_done is None else {"steps_done": int(steps_done)}),
              "critic_trained": cfg.trains_critic}
    source = Path(cfg.init_from or "") / "training_config.json"
    if not cfg.critic_only or not source.is_file():
        return record
    generator = json.loads(source.read_text())
    return {**{k: v for k, v in generator.items() if k != "critic_head"}, "critic_trained": True,
            "critic_head": {k: v for k, v in record.items() if k != "critic_trained"}}


def write_model_folder(directory: Path, model: DiT, ema: EMA, layout, codec_dir: Path | None, cfg: TrainConfig,
                       shard_mb: int | None = None, half: bool = False, datasets: list[str] | None = None,
                       steps_done: int | None = None) -> Path:
    """A self-describing model folder: backbone (EMA weights), layout.json, the three codecs, the config.

    ``codec_dir`` None (a run on a pack, e.g. on a GPU machine without the codecs): the folder has no codecs
    yet; ``unimodal export-model --codecs`` adds them. ``shard_mb``/``half``: safetensors shards of at most
    that many MB, float16 (what comes back from a GPU machine, whose files are limited to 16 MiB each).
    ``datasets``: the embedded sets trained on; their caption vocabulary goes into ``vocabulary.json`` so the
    pipeline can warn about prompt words the model never saw. ``steps_done``: recorded in the config (see
    ``training_record``)."""
    import shutil

    directory.mkdir(parents=True, exist_ok=True)
    shipped = DiT.from_config(model.config)
    shipped.load_state_dict({k: v.to(shipped.state_dict()[k].dtype) for k, v in ema.shadow.items()})
    if half:
        shipped.half()
    shipped.save_pretrained(directory / "backbone", **({"max_shard_size": f"{shard_mb}MB"} if shard_mb else {}))
    layout.save(directory)
    if codec_dir is not None:
        from unimodal.training.tokens import CODEC_MODALITIES, codec_folder

        for modality in CODEC_MODALITIES:
            shutil.copytree(codec_folder(codec_dir, modality), directory / modality, dirs_exist_ok=True)
    # critic_trained: whether these weights' critic head was trained (critic="learned" refuses a model without).
    # The record is read first: a critic-only run may write over the very folder it started from.
    record = json.dumps(training_record(cfg, steps_done), indent=2)
    atomic_write(directory / "training_config.json", lambda path: Path(path).write_text(record))
    if datasets:
        from unimodal.core.grammar import known_vocabulary

        (directory / "vocabulary.json").write_text(json.dumps({"data": datasets, **known_vocabulary()}, indent=2))
    return directory


def load_initial_weights(model: DiT, source: str | Path, layout, log: bool = True) -> None:
    """Start ``model`` from the backbone of the model folder ``source`` (fine-tuning, or continuing a model on
    re-encoded data). Every weight must match in name and shape: a different preset or vocabulary is refused.
    A different layout (e.g. an audio codec with another frame rate but the same codebook size) is allowed and
    reported: the ids it changes start from what they meant before."""
    from unimodal.tokenizers_mm.layout import Layout

    folder = Path(source)
    if not (folder / "backbone").is_dir():
        raise InputError(f"--init-from {source}: not a model folder (expected {folder / 'backbone'}; use a "
                         f"training run's OUT/model or unimodal/default_model)")
    source_model = load_pretrained(DiT, folder / "backbone")
    differ = {k: (v, model.config.get(k)) for k, v in source_model.config.items()
              if not k.startswith("_") and k != "causal" and model.config.get(k) != v}
    if differ:  # same shapes are not enough: e.g. another head count reads the same weights differently
        raise InputError(f"--init-from {source}: its backbone does not fit this run's (preset / vocabulary "
                         f"differ): {', '.join(f'{k} {a} here {b}' for k, (a, b) in differ.items())}")
    weights, mine = source_model.state_dict(), model.state_dict()
    if set(weights) != set(mine) or any(weights[k].shape != mine[k].shape for k in mine):
        raise InputError(f"--init-from {source}: its backbone's weights do not fit this run's model")
    model.load_state_dict({k: v.to(mine[k].dtype) for k, v in weights.items()})
    if log and (folder / "layout.json").exists():
        before, after = Layout.load(folder).to_dict(), layout.to_dict()
        changed = {k: (before.get(k), after.get(k)) for k in {**before, **after} if before.get(k) != after.get(k)}
        objective = "" if source_model.config.causal == model.config.causal else \
            f"; attention {'causal' if model.config.causal else 'bidirectional'} now"
        print(f"initialised from {source}" + (f"; layout changes: {changed}" if changed else "") + objective,
              flush=True)


def _load_tokens(stack, codec_dir, data_dirs, split, progress, skip_bad: bool = False, quiet: bool = False):
    from unimodal.training.tokens import tokenized_split

    tokens = []
    for data_dir in data_dirs:
        tokens.extend(tokenized_split(stack, codec_dir, data_dir, split, progress=progress, skip_bad=skip_bad,
                                      quiet=quiet))
    return tokens


def weighted_train_tokens(stack, codec_dir, sources: list[tuple[Path, float]], seed: int = 0, progress: bool = False,
                          skip_bad: bool = False,
                          quiet: bool = False) -> tuple[list[dict], list[tuple[str, int, float]]]:
    """The training split of ``sources`` ((folder, weight) pairs, :func:`resolve_weighted`), each drawn as often
    as its weight says, and the (source, samples, weight) of each part; ``skip_bad``: a manifest's bad records
    skipped instead of refused; ``quiet``: nothing said of skipped or cut records (another process says it)."""
    tokens, parts = [], []
    for source, weight in sources:
        split = _load_tokens(stack, codec_dir, [source], "train", progress, skip_bad, quiet)
        tokens += weighted(split, weight, seed, str(source))
        parts.append((str(source), len(split), weight))
    return tokens, parts


@dataclass
class RunData:
    """What a run trains on: the layout, the training and validation ids, and the codecs when it has them."""

    layout: object
    train: list[dict]
    val: list[dict]
    codec_dir: Path | None
    sources: list[str]
    fingerprint: str | None = None
    datasets: list[str] | None = None  # names of the embedded sets trained on; None when any data is the user's


def load_run_data(data: list[str], codec_dir, cfg: TrainConfig, accelerator, progress: bool,
                  skip_bad: bool = False) -> RunData:
    """Ids from one pack (no codecs needed), or encoded from data sets with the codecs (token cache); ``skip_bad``:
    a manifest's bad records skipped instead of refused."""
    from unimodal.training.pack import is_pack, load_pack

    if any(is_pack(d) for d in data):
        if len(data) != 1:
            raise InputError(f"--data: a pack holds a whole training set; give it alone, got {data}")
        pack = load_pack(data[0])
        parts = pack.train_parts()
        if progress and accelerator.is_main_process:
            _print_shares(parts)
        if accelerator.is_main_process:  # what the pack's manifests left out (data pack --skip-bad), said again
            from unimodal.training.tokens import _say_skipped

            for part in pack.meta.get("train_parts") or []:
                _say_skipped(part["source"], "train", part.get("skipped", []), part["n"], " when packed")
        return RunData(pack.layout, pack.weighted_train(cfg.seed), pack.splits.get("val", []), None,
                       [str(data[0])], pack.fingerprint, pack.meta.get("datasets"))
    from unimodal.training.tokens import CodecStack

    codec_dir = Path(codec_dir)
    stack = CodecStack.load(codec_dir, max_audio_seconds=cfg.max_audio_seconds)
    sources = resolve_weighted(data)
    data_dirs = [source for source, _ in sources]
    with accelerator.main_process_first():
        show = progress and accelerator.is_main_process
        quiet = not accelerator.is_main_process  # the main process says what was skipped or cut, once
        train_tokens, parts = weighted_train_tokens(stack, codec_dir, sources, cfg.seed, show, skip_bad, quiet)
        # a folder named twice (or with a weight) is validated once: weights change what is trained on, not the yardstick
        val_tokens = _load_tokens(stack, codec_dir, list(dict.fromkeys(data_dirs)), "val", show, skip_bad, quiet)
    if show:
        _print_shares(parts)
    return RunData(stack.layout, train_tokens, val_tokens, codec_dir,
                   [str(d) + (f":{w:g}" if w != 1 else "") for d, w in sources], datasets=dataset_names(data_dirs))


def _print_shares(parts: list[tuple[str, int, float]]) -> None:
    """One line: each data set's training samples, weight and share of an epoch (when there is more than one)."""
    total = sum(n * w for _, n, w in parts)
    if len(parts) > 1 and total:
        print("data: " + ", ".join(f"{Path(s).name} {n:,} x{w:g} ({n * w / total:.0%})" for s, n, w in parts),
              flush=True)


@dataclass
class RunOptions:
    """How a run executes, not what it learns (not saved in the checkpoint's config): device, precision is in
    the config; ``compile`` None means on CUDA only; ``max_minutes``: stop cleanly (checkpoint and EMA model
    saved) before this wall-clock budget ends; ``shard_mb``/``half`` for the model folder."""

    device: str = "auto"
    compile: bool | None = None
    max_minutes: float | None = None
    shard_mb: int | None = None
    half: bool = False
    workers: int | None = None  # DataLoader workers building batches (None: 0 on the CPU, up to 8 on a GPU)
    fit_steps: bool = False  # with max_minutes: set the total steps (and so the cosine schedule) to what fits
    skip_bad: bool = False  # a manifest's bad records skipped (said on stderr) instead of refused; not saved: a
    # resume reads the manifest again, and without it a bad record refuses the resume as it would a fresh run


FIT_AFTER_STEPS = 30  # steps timed before --fit-steps sets the total, and between its later revisions
REFIT_TOLERANCE = 0.1  # after the warmup, --fit-steps revises the total only when what fits moved by more


SAVE_RESERVE_S = 30.0  # kept free at the end of a --max-minutes budget for validation and saving


class Deadline:
    """Stops a run before ``minutes`` of wall clock are spent, leaving room for its next step and the save."""

    def __init__(self, minutes: float | None):
        self.end = None if minutes is None else time.monotonic() + 60.0 * minutes
        self.slowest = 0.0

    def step_took(self, seconds: float) -> None:
        self.slowest = max(self.slowest, seconds)

    def reached(self) -> bool:
        return self.end is not None and time.monotonic() + 2 * self.slowest + SAVE_RESERVE_S >= self.end


def _accelerator(cfg: TrainConfig, options: RunOptions, progress: bool):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from unimodal.training.hardware import resolve_device, use_bf16

    device = resolve_device(options.device)
    bf16, why = use_bf16(cfg.bf16, device)
    # accelerate keeps its settings in a per-process singleton; a second run in the same process (a notebook,
    # a test) with another precision must start from fresh settings. The distributed set-up is kept.
    AcceleratorState._reset_state()
    accelerator = Accelerator(mixed_precision="bf16" if bf16 else "no", gradient_accumulation_steps=cfg.grad_accum,
                              cpu=device == "cpu")
    if progress and accelerator.is_main_process:
        print(f"device {accelerator.device}, {'bf16 autocast' if bf16 else 'float32'} ({why})", flush=True)
    return accelerator


def _optimizer(model: DiT, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (without the critic head when the run does not train it)."""
    fused = {"fused": True} if device.type == "cuda" else {}  # one kernel for all parameters on a GPU
    trainable = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(trainable, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay,
                             **fused)


def train(out_dir: str | Path, data: list[str], codec_dir: str | Path | None, cfg: TrainConfig | None = None,
          resume: bool = False, progress: bool = True, options: RunOptions | None = None) -> Path:
    """Train (or resume) a model; returns the folder of the trained model (``OUT/model``)."""
    out_dir, options = Path(out_dir), options or RunOptions()
    check_data(data)
    ckpt_path = out_dir / "checkpoint.pt"
    cfg, state = resumed_config(TrainConfig, cfg, ckpt_path, resume)
    if cfg.init_from and state is None:  # a fresh start: name the weights it starts from by their content, and
        # keep the backbone options it was built with in the run's own config (a resume builds the same model
        # even if the init_from folder is replaced meanwhile)
        cfg = replace(cfg, init_from_hash=model_hash(user_path(cfg.init_from, "--init-from")),
                      model_overrides={**_inherited_overrides(cfg), **cfg.model_overrides})
    deadline = Deadline(options.max_minutes)
    accelerator = _accelerator(cfg, options, progress)
    world, rank, main = accelerator.num_processes, accelerator.process_index, accelerator.is_main_process
    if cfg.batch_size % (world * cfg.grad_accum):
        raise InputError(f"batch size {cfg.batch_size} must divide evenly over {world} processes x "
                         f"{cfg.grad_accum} accumulation steps")
    run = load_run_data(data, codec_dir, cfg, accelerator, progress, options.skip_bad)
    if not run.train:  # a data set whose splits put nothing in train: say so rather than divide by zero
        raise DataError(f"--data {','.join(map(str, data))}: no training samples")
    cfg = replace(cfg, audio_position_rate=audio_position_rate(cfg, run.train))
    run.layout = replace(run.layout, audio_position_rate=cfg.audio_position_rate or None)
    if cfg.audio_position_rate and progress and main:
        print(f"audio positions at {cfg.audio_position_rate:g} text tokens per audio code", flush=True)
    train_tokens = _subset(run.train, cfg.train_subset)
    model, runner, optimizer, ema, history, start = _prepared_model(cfg, run, state, options, accelerator, progress)
    if state is not None and progress and main:  # a rerun of the same command says it continues, and from where
        print(f"resuming {ckpt_path} at step {start} of {cfg.steps}", flush=True)
    mixture, schedule = TaskMixture(cfg.task_weights, cfg.cond_drop), MaskSchedule()
    spec = cfg.loss_spec(run.layout, caption_swaps(cfg, run, progress and main),
                         decoded_labels(cfg, run, progress and main), train_tokens).to(accelerator.device)
    val_spec = validation_spec(run.layout).to(accelerator.device)
    workers = options.workers if options.workers is not None else (
        min(8, max(0, (os.cpu_count() or 1) - 2)) if accelerator.device.type == "cuda" else 0)
    bar = tqdm(total=cfg.steps, initial=start, desc="train", disable=not (progress and main))
    runner.train()
    step_times: list[float] = []
    ends: list[float] = []  # wall clock at the end of each step of this run: data, validation, checkpoints included
    asked_steps = cfg.steps  # --fit-steps never goes beyond the command's steps
    for step, generator_seed, chunks in step_batches(run.layout, train_tokens, cfg, start, rank, world, workers):
        if step >= cfg.steps:  # --fit-steps shortened the run below what the loader was asked for
            break
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * lr_factor(cfg, step)
        t0 = time.perf_counter()
        record = _optimizer_step(runner, optimizer, accelerator, chunks, cfg, schedule, spec,
                                 torch.Generator().manual_seed(generator_seed))
        ema.update(model, step)
        if accelerator.device.type == "cpu" and (step + 1) % TRIM_EVERY == 0:
            release_freed_memory()  # else the freed holes of each step's differently shaped tensors pile up
        step_times.append(time.perf_counter() - t0)
        deadline.step_took(step_times[-1])
        stopping = deadline.reached() and step + 1 < cfg.steps
        record = {"step": step + 1, "lr": cfg.lr * lr_factor(cfg, step), **record,
                  "tokens_per_s": record.pop("tokens") * world / step_times[-1],
                  "step_s": step_times[-1],  # the step's own seconds: summed over a resumed run's history
                  "rss_mb": resident_mb()}  # the process's memory after the step (None where unreadable)
        bar.update(1)
        bar.set_postfix(loss=f"{record['train_loss']:.3f}", acc=f"{record['accuracy']:.2f}",
                        tok_s=f"{record['tokens_per_s']:.0f}")
        if (step + 1) % cfg.val_every == 0 or step + 1 == cfg.steps or stopping:
            record["val"] = validation_losses(model, run.layout, run.val, mixture, cfg, val_spec)
        history.append(record)
        if main and step + 1 in cfg.snapshots:
            write_model_folder(out_dir / f"model-step{step + 1}", model, ema, run.layout, run.codec_dir, cfg,
                               datasets=run.datasets, steps_done=step + 1)
        if main and ((step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps or stopping):
            _save_checkpoint(ckpt_path, cfg, model, optimizer, ema, history, step + 1, run)
            write_history(out_dir, history, cfg.objective)
        ends.append(time.monotonic())
        if options.fit_steps and deadline.end is not None and len(ends) % FIT_AFTER_STEPS == 0 and not stopping:
            _fit_steps(cfg, bar, ends, step + 1, deadline, asked_steps, first=len(ends) == FIT_AFTER_STEPS,
                       log=progress and main)
        if stopping:
            if progress and main:
                print(f"\nstopping at step {step + 1} of {cfg.steps}: the --max-minutes {options.max_minutes} "
                      f"budget is nearly spent (resume with --resume)", flush=True)
            break
    bar.close()
    accelerator.wait_for_everyone()
    checksums = replica_checksums(accelerator, model)
    if main:
        with open(out_dir / "replica_checksums.json", "w") as f:
            json.dump(checksums, f)
        write_model_folder(out_dir / "model", model, ema, run.layout, run.codec_dir, cfg, options.shard_mb,
                           options.half, run.datasets, steps_done=history[-1]["step"] if history else start)
        write_history(out_dir, history, cfg.objective)
    if accelerator.num_processes > 1:  # every rank waits for the save, then leaves the group together: a rank
        accelerator.wait_for_everyone()  # that exited while another still wrote could abort the launch at teardown
        accelerator.end_training()
    return out_dir / "model"


def audio_position_rate(cfg: TrainConfig, train_tokens: list[dict]) -> float:
    """The run's text tokens per audio code (0: sequential audio positions), from ``cfg.audio_position_rate``:
    a number as given; "auto" the mean over training samples that have both text and audio; None what the
    ``init_from`` model's layout holds (0 when it has none)."""
    rate = cfg.audio_position_rate
    if rate == "auto":
        ratios = [s["text"].numel() / s["audio"].numel() for s in train_tokens
                  if "text" in s and "audio" in s and s["audio"].numel() and s["text"].numel()]
        if not ratios:
            raise DataError("--audio-position-rate auto: no training sample has both text and audio to measure "
                            "the rate on; give the rate as a number, or 0")
        return round(min(1.0, sum(ratios) / len(ratios)), 4)
    if rate is None:
        from unimodal.tokenizers_mm.layout import LAYOUT_FILE, Layout

        folder = user_path(cfg.init_from, "--init-from") if cfg.init_from else None
        if folder is None or not (Path(folder) / LAYOUT_FILE).is_file():
            return 0.0
        return float(Layout.load(folder).audio_position_rate or 0.0)
    return float(rate)


def caption_swaps(cfg: TrainConfig, run: RunData, log: bool) -> AttributeSwaps | None:
    """The critic's caption negatives, from the run's text codec; None when the run trains no critic or has no
    codec (a pack: code swaps only, said once)."""
    if not cfg.trains_critic:
        return None
    if run.codec_dir is None:
        if log:
            print("critic: no text codec in this run (a pack), so no caption attribute swaps; code swaps only",
                  flush=True)
        return None
    from unimodal.tokenizers_mm.text import TextCodec
    from unimodal.training.tokens import codec_folder

    return AttributeSwaps.of(TextCodec.from_pretrained(codec_folder(run.codec_dir, "text")), run.layout)


def decoded_labels(cfg: TrainConfig, run: RunData, log: bool):
    """The critic's decoded-content labels (critic_labels.DecodedLabels) from the run's image and audio codecs;
    None when the run trains no critic, asks for token labels, or has no codecs (a pack: said once)."""
    if not cfg.trains_critic or cfg.critic_labels == "token":
        return None
    if run.codec_dir is None:
        if log:
            print("critic: no codecs in this run (a pack), so codes are labelled wrong by token inequality, not by "
                  "decoded content", flush=True)
        return None
    from unimodal.tokenizers_mm.audio import AudioCodec
    from unimodal.tokenizers_mm.image import ImageCodec
    from unimodal.training.critic_labels import DecodedLabels
    from unimodal.training.tokens import codec_folder

    image = ImageCodec.from_pretrained(codec_folder(run.codec_dir, "image")).model.eval()
    audio = AudioCodec.from_pretrained(codec_folder(run.codec_dir, "audio")).model.eval()
    return DecodedLabels(run.layout, image, audio)


def _subset(tokens: list[dict], subset: int | None) -> list[dict]:
    if subset is None:
        return tokens
    if subset > len(tokens):
        raise InputError(f"train_subset {subset} is more than the {len(tokens)} training samples")
    return tokens[:subset]


def _prepared_model(cfg: TrainConfig, run: RunData, state: dict | None, options: RunOptions, accelerator,
                    progress: bool):
    """The model (fresh, fine-tuned from ``init_from`` or resumed), the runner accelerate prepared (compiled on
    CUDA unless told), the optimizer, the EMA, the history and the step to start from."""
    torch.manual_seed(cfg.seed)
    model = DiT.from_preset(cfg.preset, run.layout.vocab_size, **{**cfg.model_overrides,
                                                                  "causal": cfg.autoregressive})
    if cfg.init_from and state is None:
        load_initial_weights(model, cfg.init_from, run.layout, log=accelerator.is_main_process and progress)
    model.requires_grad_(not cfg.critic_only)  # critic only: the trained model stays exactly as it was
    model.critic_head.requires_grad_(cfg.trains_critic)  # off: no gradient, not in the optimizer nor DDP's buckets
    optimizer = _optimizer(model, cfg, accelerator.device)
    ema, history, start = EMA(model, cfg.ema_decay), [], 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(trainable_optimizer_state(state["optimizer"], model))
        ema.shadow, history, start = state["ema"], state["history"], state["step"]
    compiled = options.compile if options.compile is not None else accelerator.device.type == "cuda"
    model.to(accelerator.device)
    runner, optimizer = accelerator.prepare(CompiledForward(model) if compiled else model, optimizer)
    ema.to(accelerator.device)
    return model, runner, optimizer, ema, history, start


def _inherited_overrides(cfg: TrainConfig) -> dict:
    """What a fine-tune takes from its ``init_from`` model's backbone config unless the run sets it: whether its
    masked caption slots embed their neighbours (a model trained with them keeps them)."""
    if not cfg.init_from:
        return {}
    config = Path(user_path(cfg.init_from, "--init-from")) / "backbone" / "config.json"
    if not config.is_file():
        return {}  # load_initial_weights says what is missing
    return {"neighbour_inputs": bool(json.loads(config.read_text()).get("neighbour_inputs", False))}


def trainable_optimizer_state(saved: dict, model: DiT) -> dict:
    """An optimizer state to resume with. Checkpoints written before the critic objective hold every parameter
    (the critic head included); a run that does not train the critic optimises the others only, so such a state
    is cut to the trainable parameters, in order. Any other state is returned as it is."""
    trainable = [i for i, p in enumerate(model.parameters()) if p.requires_grad]
    groups = saved["param_groups"]
    total = sum(1 for _ in model.parameters())
    if len(groups) != 1 or len(groups[0]["params"]) != total or len(trainable) == total:
        return saved
    old_ids = groups[0]["params"]
    kept = {old_ids[i]: new for new, i in enumerate(trainable)}
    return {"state": {kept[k]: v for k, v in saved["state"].items() if k in kept},
            "param_groups": [{**groups[0], "params": list(range(len(trainable)))}]}


def _optimizer_step(runner, optimizer, accelerator, chunks, cfg: TrainConfig, schedule: MaskSchedule,
                    spec: LossSpec, generator: torch.Generator) -> dict:
    """One optimizer step over the step's micro-batches; returns its loss, accuracy and size."""
    tokens, examples, losses = 0, 0, []
    for batch in chunks:
        tokens += int(batch.batch.attention_mask.sum())
        examples += len(batch.tasks)
        with accelerator.accumulate(runner):
            loss, acc = objective_loss(runner, batch, cfg, schedule, generator, spec)
            accelerator.backward(loss)
            if accelerator.sync_gradients and cfg.grad_clip:
                accelerator.clip_grad_norm_(runner.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return {"train_loss": float(torch.stack(losses).mean()), "accuracy": float(acc), "tokens": tokens,
            "tokens_per_example": tokens / examples}


def fitted_steps(done: int, seconds_per_step: float, deadline: Deadline, asked: int) -> int:
    """The total steps that fit a budget: those done, plus what the time left holds at ``seconds_per_step``,
    less the save reserve; never more than ``asked``."""
    left = deadline.end - time.monotonic() - SAVE_RESERVE_S - 2 * seconds_per_step
    return max(done + 1, min(asked, done + int(0.97 * left / seconds_per_step)))


def seconds_per_step(ends: list[float], window: int) -> float:
    """Mean wall-clock seconds a step took over the last ``window`` steps (at most), the first step left out
    (compilation, warm caches): everything the loop does between steps counts, so validation and checkpoints
    are paid for in proportion."""
    n = min(len(ends) - 1, window)
    if n < 1:
        raise ValueError("seconds_per_step needs the end times of at least two steps")
    return (ends[-1] - ends[-1 - n]) / n


def refitted_total(current: int, fitted: int, done: int, warmup: int) -> int:
    """--fit-steps' total after a later timing: taken while the warmup lasts (the learning rate does not depend
    on the total there), and after it only when the total that fits moved by more than ``REFIT_TOLERANCE``: a
    machine that slowed down would have the budget cut the cosine short, one that sped up would end early."""
    if done < warmup or abs(fitted - current) > REFIT_TOLERANCE * current:
        return fitted
    return current


def _fit_steps(cfg: TrainConfig, bar, ends: list[float], done: int, deadline: Deadline, asked: int, first: bool,
               log: bool) -> None:
    """Set (``first``) or revise the run's total steps, and so its cosine schedule, to what the budget holds."""
    per_step = seconds_per_step(ends, max(FIT_AFTER_STEPS, cfg.checkpoint_every, cfg.val_every))
    fitted = fitted_steps(done, per_step, deadline, asked)
    total = fitted if first else refitted_total(cfg.steps, fitted, done, cfg.warmup)
    if total == cfg.steps and not first:
        return
    if log:
        if first:
            print(f"\n--fit-steps: {total} steps fit the budget ({per_step:.3f} s a step, validation and "
                  f"checkpoints included)", flush=True)
        else:
            after = "" if done < cfg.warmup else "; the cosine schedule is refitted from here"
            print(f"\n--fit-steps: at {per_step:.3f} s a step {total} steps fit the budget (were {cfg.steps})"
                  f"{after}", flush=True)
    cfg.steps = bar.total = total


def _save_checkpoint(path: Path, cfg, model, optimizer, ema, history, step: int, run: RunData) -> None:
    save_atomic({"config": asdict(cfg), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "ema": ema.shadow, "history": history, "step": step, "data": run.sources,
                 "codecs": None if run.codec_dir is None else str(run.codec_dir),
                 "codec_fingerprint": run.fingerprint}, path)


def replica_checksums(accelerator, model) -> list[float]:
    """One weight checksum per process: data-parallel replicas must agree (the 2-process test reads this)."""
    total = sum(p.detach().double().sum() for p in accelerator.unwrap_model(model).parameters())
    return [float(x) for x in accelerator.gather(total.reshape(1).float().to(accelerator.device)).cpu()]


def add_arguments(parser) -> None:
    """The ``unimodal train`` / ``python -m unimodal.training.train`` arguments."""
    from unimodal.core.paths import default_codecs_dir

    parser.add_argument("--preset", default="small", help="backbone size: tiny, mini, small or base")
    parser.add_argument("--data", default="scenes", help="comma-separated: scenes, digits, built data folders or "
                                                         "JSONL manifests of your own data; NAME:W draws a set's "
                                                         "training samples W times an epoch (e.g. scenes,digits:4; "
                                                         "a fraction keeps a fixed share), or one pack")
    parser.add_argument("--codecs", default=str(default_codecs_dir()),
                        help="folder holding text/, image/ and audio/ codecs (default: the codecs shipped in the "
                             "package, else ~/.cache/unimodal/codecs)")
    parser.add_argument("--out", required=True, help="run folder: checkpoint.pt, history.json, val_loss.png, model/")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"total optimizer steps (default {TrainConfig.steps}; with --resume, the run's own "
                             f"total unless given)")
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size, help="global batch size")
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--lr", type=float, default=TrainConfig.lr)
    parser.add_argument("--warmup", type=int, default=TrainConfig.warmup, help="learning-rate warm-up steps")
    parser.add_argument("--val-every", type=int, default=TrainConfig.val_every)
    parser.add_argument("--checkpoint-every", type=int, default=TrainConfig.checkpoint_every)
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--bf16", dest="bf16", action="store_true", default=None,
                           help="bf16 autocast (default: where the hardware multiplies bf16 natively)")
    precision.add_argument("--no-bf16", dest="bf16", action="store_false", help="train in float32")
    parser.add_argument("--loss-weighting", choices=WEIGHTINGS, default=TrainConfig.loss_weighting,
                        help="weight of a masked token's cross-entropy at mask ratio t: elbo 1/t, clipped "
                             "1/max(t, 0.1), flat 1, text-flat 1 for text targets and 1/t for image and audio codes")
    parser.add_argument("--loss-norm", choices=NORMALISERS, default=TrainConfig.loss_norm,
                        help="divide each sample's loss by its real target tokens or by all its maskable slots")
    parser.add_argument("--masking", choices=MASKINGS, default=TrainConfig.masking,
                        help="one mask per sample at ratio t, or complementary: each sample also with the "
                             "complement of its mask, so every target token is trained each step (2x the rows: "
                             "halve --batch-size for the same compute), or partition: the complement split at "
                             "random into three more rows, so over half of the target tokens are trained with "
                             "most of their target in view (4x the rows; the conditions computed once)")
    parser.add_argument("--suffix-share", type=float, default=TrainConfig.suffix_share,
                        help="share of the samples whose text target is masked as a suffix (the words before a "
                             "random cut visible, every slot after it masked: the state of a left-to-right "
                             "decoder); the others keep random masks. 0 (default): random masks only")
    parser.add_argument("--neighbour-inputs", action="store_true",
                        help="a fresh model whose masked caption slots also embed the nearest visible token of "
                             "their caption on each side and its distance (DiT neighbour_inputs; off by default; "
                             "a fine-tune keeps what its --init-from model has)")
    parser.add_argument("--content-first", type=float, default=TrainConfig.content_first,
                        help="mask a caption's informative words first (rare words such as a colour or a shape "
                             "before the frequent ones that set its phrasing), with this strength: each word "
                             "scored by its surprisal in the training captions times it, plus noise; the count "
                             "masked stays the draw at ratio t. 0 (default): uniform")
    parser.add_argument("--critic-weight", type=float, default=TrainConfig.critic_weight,
                        help=f"train the critic head (critic='learned' in refine) with this weight beside the "
                             f"denoising loss; 0 (default): off, the head takes no part; {CRITIC_WEIGHT} to train it")
    parser.add_argument("--critic-share", type=float, default=TrainConfig.critic_share,
                        help="share of each step's rows the model fills and the critic is trained on (second "
                             "forward and backward over them)")
    parser.add_argument("--critic-only", action="store_true",
                        help="train the critic head alone on the model given with --init-from, every other weight "
                             "frozen: generation stays exactly that model's (with --critic-share 1 every row is "
                             "critiqued; a step costs two forwards and the head's backward)")
    parser.add_argument("--critic-labels", choices=CRITIC_LABELS, default=TrainConfig.critic_labels,
                        help="what the critic learns to call wrong: decoded (default: image and audio codes whose "
                             "decoded content differs beyond a threshold; captions by token) or token (every "
                             "code that differs from the real one)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when there is a GPU), cpu or cuda")
    parser.add_argument("--compile", dest="compile", action="store_true", default=None,
                        help="run the forward under torch.compile (default: on CUDA only)")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="stop cleanly before this many minutes of wall clock (checkpoint and EMA model "
                             "saved; continue with --resume)")
    parser.add_argument("--shard-mb", type=int, default=None,
                        help="save the model's weights as safetensors shards of at most this many MB")
    parser.add_argument("--half-weights", action="store_true", help="save the model's weights in float16")
    parser.add_argument("--skip-bad", action="store_true",
                        help="a JSONL manifest's bad records (unreadable files, malformed lines) are skipped, counted "
                             "and listed on stderr, instead of refusing the run (`unimodal data check` lists them)")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes building batches (default: 0 on the CPU, up to 8 with a GPU)")
    parser.add_argument("--fit-steps", action="store_true",
                        help=f"with --max-minutes: after {FIT_AFTER_STEPS} timed steps, set the total steps (and the "
                             f"learning-rate schedule) to what fits the budget, at most --steps, timing whole steps "
                             f"(validation and checkpoints included); revised every {FIT_AFTER_STEPS} steps during the "
                             f"warmup, and after it when what fits moves by more than {REFIT_TOLERANCE:.0%}%")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--objective", choices=OBJECTIVES, default="diffusion",
                        help="diffusion (the model) or ar: its autoregressive twin (same backbone, causal mask, "
                             "next-token loss), the baseline of `unimodal bench versus-ar`")
    parser.add_argument("--train-subset", type=int, default=None,
                        help="train on the first N training samples only (data-efficiency runs: many epochs)")
    parser.add_argument("--snapshots", type=_step_list, default=[],
                        help="comma-separated steps at which to also write OUT/model-stepN (EMA weights)")
    parser.add_argument("--ema-decay", type=float, default=TrainConfig.ema_decay)
    parser.add_argument("--tasks", type=_task_weights, default=None,
                        help="task mixture as TASK=WEIGHT pairs, e.g. 'text->image=3,image->text=2' (quote it: "
                             "'>' redirects in a shell; default: the mixture in training/tasks.py)")
    parser.add_argument("--init-from", default=None,
                        help="start from this model folder's weights (fine-tuning, e.g. unimodal/default_model on "
                             "your own data); the preset and vocabulary must match")
    parser.add_argument("--max-audio-seconds", type=float, default=TrainConfig.max_audio_seconds,
                        help="longest audio a sample keeps (the audio segment's length)")
    parser.add_argument("--audio-position-rate", type=_position_rate, default=None,
                        help="put audio code i at text position i*RATE on the second rotary axis, so a word and its "
                             "sound line up: a number of text tokens per audio code, 'auto' (the training set's "
                             "mean) or 0 (positions (i, i)); default: what the --init-from model uses, else 0")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt (its config wins, "
                                                              "except --steps and --snapshots)")


def _step_list(text: str) -> list[int]:
    import argparse

    try:
        steps = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated step numbers, got {text!r}") from None
    if any(step < 1 for step in steps):
        raise argparse.ArgumentTypeError(f"snapshot steps must be >= 1, got {text!r}")
    return steps


def _position_rate(text: str) -> float | str:
    import argparse

    if text.strip().lower() == "auto":
        return "auto"
    try:
        rate = float(text)
    except ValueError:
        rate = None
    if rate is None or not _position_rate_setting(rate):
        raise argparse.ArgumentTypeError(f"expected 'auto' or text tokens per audio code in [0, 1] (0: off), got "
                                         f"{text!r}")
    return rate


def _task_weights(text: str) -> dict[str, float]:
    import argparse

    from unimodal.training.tasks import TaskMixture

    weights = {}
    for item in (part.strip() for part in text.split(",")):
        name, _, value = (part.strip() for part in item.rpartition("="))
        try:
            weight = float(value)
        except ValueError:
            weight = None
        if not name or weight is None:  # no '=' leaves the name empty
            raise argparse.ArgumentTypeError(f"--tasks takes TASK=WEIGHT pairs such as 'text->image=3'; got {item!r}")
        weights[name] = weight
    try:
        TaskMixture(weights)  # unknown task names and bad weights are refused here, before any data is loaded
    except InputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return weights


def run_from_args(args) -> int:
    from unimodal.training.checkpoint import cli_config

    if args.max_minutes is not None and not args.max_minutes > 0:
        raise InputError(f"--max-minutes must be a positive number of minutes, got {args.max_minutes}")
    if args.shard_mb is not None and args.shard_mb < 1:
        raise InputError(f"--shard-mb must be a positive number of MB, got {args.shard_mb}")
    cfg = cli_config(TrainConfig, args.out, args.resume, args.steps, preset=args.preset, batch_size=args.batch_size,
                     grad_accum=args.grad_accum, lr=args.lr, warmup=args.warmup, val_every=args.val_every,
                     checkpoint_every=args.checkpoint_every, bf16=args.bf16, seed=args.seed,
                     loss_weighting=args.loss_weighting, loss_norm=args.loss_norm, masking=args.masking,
                     suffix_share=args.suffix_share, content_first=args.content_first,
                     objective=args.objective, train_subset=args.train_subset, snapshots=args.snapshots,
                     ema_decay=args.ema_decay, init_from=args.init_from, max_audio_seconds=args.max_audio_seconds,
                     critic_weight=args.critic_weight, critic_share=args.critic_share, critic_only=args.critic_only,
                     critic_labels=args.critic_labels, audio_position_rate=args.audio_position_rate,
                     **({} if args.tasks is None else {"task_weights": args.tasks}),
                     **({"model_overrides": {"neighbour_inputs": True}} if args.neighbour_inputs else {}))
    if args.fit_steps and args.max_minutes is None:
        raise InputError("--fit-steps fits the run to --max-minutes; give both")
    options = RunOptions(args.device, args.compile, args.max_minutes, args.shard_mb, args.half_weights, args.workers,
                         args.fit_steps, args.skip_bad)
    model_dir = train(args.out, [d for d in args.data.split(",") if d], args.codecs, cfg, resume=args.resume,
                      options=options)
    print(model_dir)
    return 0


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m unimodal.training.train", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
