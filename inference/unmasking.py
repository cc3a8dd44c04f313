"""The commit rule of masked diffusion: the sampling settings, and which masked slots each step fills.

:class:`SamplerConfig` holds every setting; :data:`SAMPLER_SETTINGS` is the list of their names, taken from the
dataclass's fields, for whatever takes settings by name (the pipeline's keywords, the scheduler's stored
config, the CLI's flags). :class:`UnmaskingScheduler` is the one implementation of a step's rule, diffusers
style: :meth:`~UnmaskingScheduler.set_timesteps` records where the slots are and starts every row at step 0;
:meth:`~UnmaskingScheduler.step` draws a token per slot and commits some of the masked ones, by ``mode``:

* ``confidence`` (MaskGIT): the most confident, as many as keep ``masked_after_step(N, s, steps, schedule)`` of
  the ``N`` slots masked after step ``s``; a step that would commit nothing is skipped (more steps than slots,
  or slots already filled with PAD), so every step commits at least one slot;
* ``threshold`` (Fast-dLLM): every slot whose confidence is >= ``tau``, at least the most confident one; the
  last of ``steps`` steps commits all;
* ``semi_ar`` (LLaDA): each target segment's slots cut into blocks of ``block_length``, opened left to right,
  ``block_mode`` (one of the two rules above) inside the open block, ``steps`` steps per block.

"Most confident" is the probability of the drawn token, or with ``choice_temperature`` MaskGIT's order:
log-probability plus Gumbel noise scaled by ``choice_temperature * (1 - s / steps)`` (s: the row's step).
:func:`unimodal.inference.sampler.generate` runs the loop around it (model, guidance, step);
:class:`unimodal.inference.schedulers.MaskedDiffusionScheduler` stores the settings as a diffusers component
and delegates its ``step`` here. Neither has a rule of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from numbers import Real

import torch

from unimodal.tokenizers_mm.layout import EOS, MASK, MODALITIES, PAD
from unimodal.core.errors import InputError
from unimodal.core.seeds import check_seed

MODES = ("confidence", "threshold", "semi_ar")
BLOCK_MODES = ("confidence", "threshold")
# Fraction of the slots still masked once a fraction ``progress`` of the steps is done.
KEPT_FRACTION = {"cosine": lambda progress: math.cos(math.pi / 2 * progress), "linear": lambda progress: 1.0 - progress}
SCHEDULES = tuple(KEPT_FRACTION)
NO_BLOCK = 2**62  # block index of positions that are not slots: never the open block
# Field metadata of the settings that decide how the work runs but never the tokens (the condition cache is
# exact; batching never changes a request's tokens).
_RUN_ONLY = {"run_only": True}


# ---- settings -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplerConfig:
    """How to sample. Validated on construction (:class:`InputError` names the field and what it accepts).

    ``mode``: ``confidence`` (MaskGIT): a fixed number of steps, each committing the most confident masked
    slots so that the masked count follows ``schedule``; ``threshold`` (Fast-dLLM): each step commits every
    masked slot whose confidence is >= ``tau`` (at least the most confident one), so the step count adapts;
    ``semi_ar`` (LLaDA, for long text): each target segment's slots are cut into blocks of ``block_length``,
    decoded left to right with ``block_mode`` inside each; an END ends its segment, so no later block of it
    opens (images, which have no END, are decoded block by block in raster order).
    ``steps``: model calls in ``confidence`` mode (fewer when a step would commit nothing); the cap in
    ``threshold`` mode; per block in ``semi_ar``. ``schedule``: how many slots stay masked after step s of n
    (``cosine``: N cos(pi/2 (s+1)/n); ``linear``: N (1 - (s+1)/n), both floored). ``tau``: confidence threshold.
    ``temperature`` 0 means argmax; ``top_k`` 0 and ``top_p`` 1 disable those filters.
    ``cfg``: classifier-free guidance. A number s guides on all conditions at once:
    ``uncond + s (cond - uncond)`` with every condition dropped. A mapping ``{"text": 3.0}`` guides per condition
    modality, composably: ``cond + sum_m (s_m - 1) (cond - cond_without_m)``, one extra row per guided modality
    present in the request (with one condition modality both forms agree). Scale 1 (or None) is plain
    conditional sampling, one row. ``seed``: request i uses ``seed + i`` (None: a fresh seed, reported in the
    result). ``block_length`` / ``block_mode``: ``semi_ar`` block size and the rule inside a block.
    """

    steps: int = 16
    mode: str = "confidence"
    schedule: str = "cosine"
    tau: float = 0.9
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    choice_temperature: float = 0.0
    cfg: float | Mapping[str, float] | None = None
    seed: int | None = 0
    block_length: int = 16
    block_mode: str = "confidence"
    use_cache: bool = field(default=True, metadata=_RUN_ONLY)
    max_batch_size: int = field(default=64, metadata=_RUN_ONLY)

    def __post_init__(self):
        for name, low in (("steps", 1), ("top_k", 0), ("block_length", 1), ("max_batch_size", 1)):
            _check_int(name, getattr(self, name), low)
        for name, choices in (("mode", MODES), ("schedule", SCHEDULES), ("block_mode", BLOCK_MODES)):
            if getattr(self, name) not in choices:
                raise InputError(f"SamplerConfig.{name} must be one of {choices}, got {getattr(self, name)!r}")
        _check_real("tau", self.tau, "in (0, 1]", lambda x: 0 < x <= 1)
        _check_real("temperature", self.temperature, ">= 0", lambda x: x >= 0)
        _check_real("top_p", self.top_p, "in (0, 1]", lambda x: 0 < x <= 1)
        _check_real("choice_temperature", self.choice_temperature, ">= 0", lambda x: x >= 0)
        check_seed(self.seed, "SamplerConfig.seed")
        if not isinstance(self.use_cache, bool):
            raise InputError(f"SamplerConfig.use_cache must be a bool, got {self.use_cache!r}")
        object.__setattr__(self, "cfg", _checked_cfg(self.cfg))

    @property
    def random(self) -> bool:
        """Whether the seed changes the output: a drawn token (``temperature`` > 0) or a noisy commit order
        (``choice_temperature`` > 0). False (greedy tokens, committed by confidence): every seed gives the same
        tokens, so drawing several candidates of one request would draw the same one several times."""
        return self.temperature > 0 or self.choice_temperature > 0


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InputError(f"SamplerConfig.{name} must be an int >= {low}, got {value!r}")


def _check_real(name: str, value, accepted: str, ok: Callable[[float], bool]) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or not ok(value):
        raise InputError(f"SamplerConfig.{name} must be a number {accepted}, got {value!r}")


def _checked_cfg(cfg):
    """None, a scale >= 0, or {condition modality: scale >= 0} (copied, so the config stays immutable)."""
    if cfg is None or (isinstance(cfg, Real) and not isinstance(cfg, bool)):
        if cfg is not None:
            _check_real("cfg", cfg, ">= 0 (or a mapping modality -> scale)", lambda x: x >= 0)
        return cfg
    if not isinstance(cfg, Mapping):
        raise InputError(f"SamplerConfig.cfg must be None, a scale >= 0 or a mapping modality -> scale, got {cfg!r}")
    for modality, scale in cfg.items():
        if modality not in MODALITIES:
            raise InputError(f"SamplerConfig.cfg keys must be condition modalities {MODALITIES}, got {modality!r}")
        _check_real(f"cfg[{modality!r}]", scale, ">= 0", lambda x: x >= 0)
    return dict(cfg)


def masked_after_step(n_masked: int, step: int, steps: int, schedule: str) -> int:
    """Slots of ``n_masked`` still masked after step ``step`` (0-based) of ``steps``; 0 after the last step."""
    if step >= steps - 1:
        return 0
    # The epsilon keeps products that are integers in exact arithmetic (10 * 0.8) from flooring one too low.
    return math.floor(n_masked * KEPT_FRACTION[schedule]((step + 1) / steps) + 1e-9)


SAMPLER_SETTINGS = tuple(f.name for f in fields(SamplerConfig))  # every setting, in the dataclass's order
# The settings that decide the tokens: what a result reports as its settings (with the seed it used).
TOKEN_SETTINGS = tuple(f.name for f in fields(SamplerConfig) if not f.metadata.get("run_only"))


# ---- drawing tokens -----------------------------------------------------------------------------------------------


def _filtered(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Scores (..., V) with everything outside the top-k / the top-p nucleus set to -inf."""
    if 0 < top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]  # (..., 1)
        scores = scores.masked_fill(scores < kth, -math.inf)
    if top_p < 1.0:
        ordered, order = scores.sort(dim=-1, descending=True)
        probs = ordered.softmax(-1)
        outside = probs.cumsum(-1) - probs > top_p  # the mass before this token already exceeds top_p
        scores = scores.masked_fill(outside.scatter(-1, order, outside), -math.inf)
    return scores


def _gumbel(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    # float64: in float32 the Gumbel tail is coarse, which skews low-temperature sampling (noted by LLaDA).
    uniform = torch.rand(shape, generator=generator, device=device, dtype=torch.float64)
    return -torch.log(-torch.log(uniform.clamp_min(torch.finfo(torch.float64).tiny)))


def draw_tokens(logits: torch.Tensor, allowed: torch.Tensor, generators: Sequence[torch.Generator | None],
                config: SamplerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, L, V) logits -> a drawn id per position (b, L) and its probability (b, L) under the distribution
    restricted to ``allowed`` ((L, V) or (b, L, V) bool) but not tempered or filtered: argmax at temperature
    0, else Gumbel-max over the tempered, top-k / top-p filtered scores with row i's noise from
    ``generators[i]`` (None: torch's global generator)."""
    logits = logits.masked_fill(~allowed, -math.inf)  # (b, L, V)
    if config.temperature == 0:
        chosen = logits.argmax(-1)  # (b, L)
    else:
        scores = _filtered(logits / config.temperature, config.top_k, config.top_p).double()  # (b, L, V)
        noise = torch.stack([_gumbel(scores.shape[1:], g, scores.device) for g in generators])  # (b, L, V)
        chosen = (scores + noise).argmax(-1)  # (b, L)
    probs = logits.softmax(-1)  # (b, L, V)
    return chosen, probs.gather(-1, chosen[..., None]).squeeze(-1)


# ---- where the slots are ------------------------------------------------------------------------------------------


def slot_blocks(segments: Sequence[torch.Tensor], length: int, config: SamplerConfig) -> torch.Tensor:
    """(length,) block of each slot, given each target segment's slot positions in order: in ``semi_ar`` the
    slots of a segment cut into blocks of ``block_length`` left to right (a block never straddles two
    segments); otherwise block 0 for every slot. Other positions: :data:`NO_BLOCK`."""
    block_of = torch.full((length,), NO_BLOCK, dtype=torch.long)
    first_block = 0
    for slots in segments:
        if config.mode == "semi_ar":
            block_of[slots] = first_block + torch.arange(len(slots)) // config.block_length
            first_block += math.ceil(len(slots) / config.block_length)
        else:
            block_of[slots] = 0
    return block_of


def pad_after_end(ids: torch.Tensor, sequences: Sequence[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """Keeps text and audio well formed, in place: in each (slot positions, END id) of ``sequences``, every
    slot after the first END / PAD / EOS of ``ids`` (b, L) becomes PAD. Returns the slots changed (b, L)."""
    changed = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)  # (b, L)
    for slots, end in sequences:
        body = ids[:, slots]  # (b, n)
        stop = (body == end) | (body == PAD) | (body == EOS)
        after = (stop.long().cumsum(1) - stop.long()) > 0  # strictly after the first stop
        changed[:, slots] = after & (body != PAD)
        ids[:, slots] = body.masked_fill(after, PAD)
    return changed


# ---- the scheduler ------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class UnmaskingStepOutput:
    """What one :meth:`UnmaskingScheduler.step` did to the rows it was given.

    ``prev_sample`` (b, L): the ids after the step; ``committed`` (b, L) bool: the slots it committed;
    ``confidence`` (b, L): the probability of the token drawn at every position (meaningful where committed);
    ``step_index`` (b,): each row's step number (0-based, counted over all its steps, blocks included).
    """

    prev_sample: torch.Tensor
    committed: torch.Tensor
    confidence: torch.Tensor
    step_index: torch.Tensor


@dataclass(eq=False)
class _RowState:
    """One row's place in the schedule: its open block, the step within that block, the block's slot count
    when it opened, and the steps the row has taken in all."""

    block: int = -1
    block_step: int = 0
    block_size: int = 0
    steps_taken: int = 0


class UnmaskingScheduler:
    """The commit rule of :class:`SamplerConfig` ``config``, one step at a time (see the module docstring).

    Call :meth:`set_timesteps` once per generation, then :meth:`step` once per model call until no slot is
    masked. It keeps a little state per row (its block and step), so a row that leaves the loop early (a
    finished sample) is simply not passed again: ``step`` takes the rows it is given.
    """

    def __init__(self, config: SamplerConfig):
        if not isinstance(config, SamplerConfig):
            raise InputError(f"UnmaskingScheduler needs a SamplerConfig, got {type(config).__name__}")
        self.config = config
        self.rule = config.block_mode if config.mode == "semi_ar" else config.mode  # inside a block
        kept = KEPT_FRACTION[config.schedule]
        # The masked fraction of a block before each of its steps (1.0 first), as diffusers' timesteps.
        self.timesteps = torch.tensor([kept(s / config.steps) for s in range(config.steps)], dtype=torch.float32)
        self.block_of: torch.Tensor | None = None
        self._rows: list[_RowState] = []

    def set_timesteps(self, block_of: torch.Tensor, batch_size: int) -> None:
        """Start a generation of ``batch_size`` rows: ``block_of`` (L,) or (B, L) is each position's block
        (:func:`slot_blocks`; :data:`NO_BLOCK` where no token is ever drawn); every row starts at step 0."""
        if block_of.dim() == 1:
            block_of = block_of.expand(batch_size, -1)
        if block_of.dim() != 2 or block_of.shape[0] != batch_size:
            raise InputError(f"block_of must be (L,) or ({batch_size}, L) block indices, got {tuple(block_of.shape)}")
        self.block_of = block_of
        self._rows = [_RowState() for _ in range(batch_size)]

    def step(self, logits: torch.Tensor, sample: torch.Tensor, allowed: torch.Tensor,
             generators: Sequence[torch.Generator | None], rows: torch.Tensor | None = None) -> UnmaskingStepOutput:
        """Draw a token at every position of ``sample`` (b, L) from ``logits`` (b, L, V) (guidance applied;
        ``allowed`` (L, V) or (b, L, V) bool restricts them) and commit the masked slots the rule picks.
        ``rows`` (b,): which rows of the generation these are (None: all, in order); ``generators``: one per
        row given."""
        if self.block_of is None:
            raise InputError("call set_timesteps before step: the scheduler needs the blocks of the slots")
        rows = torch.arange(len(self._rows)) if rows is None else rows
        states = [self._rows[r] for r in rows.tolist()]
        block_of = self.block_of[rows.to(self.block_of.device)].to(sample.device)  # (b, L)
        window = self._open_windows((sample == MASK) & (block_of != NO_BLOCK), block_of, states)  # (b, L)
        chosen, prob = draw_tokens(logits, allowed, generators, self.config)  # (b, L) x2
        confident = (window & (prob >= self.config.tau)).sum(1).tolist()
        counts = [self._commit_count(n, c, state) for n, c, state in zip(window.sum(1).tolist(), confident, states)]
        order = self._commit_order(prob, states, generators)  # (b, L)
        committed = _most_confident(window, order, torch.tensor(counts, device=sample.device))  # (b, L)
        step_index = torch.tensor([state.steps_taken for state in states], device=sample.device)  # (b,)
        for state in states:
            state.steps_taken += 1
        return UnmaskingStepOutput(torch.where(committed, chosen, sample), committed, prob, step_index)

    @staticmethod
    def _open_windows(masked: torch.Tensor, block_of: torch.Tensor, states: list[_RowState]) -> torch.Tensor:
        """(b, L) masked slots each row may commit now (its first block with a masked slot); opens blocks."""
        current = torch.where(masked, block_of, NO_BLOCK).min(dim=1).values  # (b,)
        window = masked & (block_of == current[:, None])  # (b, L)
        for state, block, size in zip(states, current.tolist(), window.sum(1).tolist()):
            if block != state.block:
                state.block, state.block_step, state.block_size = block, 0, size
        return window

    def _commit_count(self, available: int, n_confident: int, state: _RowState) -> int:
        """Slots to commit this step out of ``available`` masked ones in the window; advances the block step."""
        config = self.config
        if available == 0:  # a finished row in a hand-written loop
            return 0
        if self.rule == "threshold":
            last = state.block_step >= config.steps - 1
            state.block_step += 1
            return available if last else max(1, n_confident)
        # Skip steps that would commit nothing (more steps than slots, or slots already filled with PAD).
        while masked_after_step(state.block_size, state.block_step, config.steps, config.schedule) >= available:
            state.block_step += 1
        remaining = masked_after_step(state.block_size, state.block_step, config.steps, config.schedule)
        state.block_step += 1
        return available - remaining

    def _commit_order(self, prob: torch.Tensor, states: list[_RowState],
                      generators: Sequence[torch.Generator | None]) -> torch.Tensor:
        """(b, L) score deciding which slots are committed first: the probability, or with
        ``choice_temperature`` (MaskGIT) log-probability + Gumbel noise scaled by ``choice_temperature *
        (1 - step / steps)``, so early steps pick slots nearly at random (as masked diffusion's own reverse
        process does) and late ones by confidence. Without it a greedy order lets the likeliest tokens
        everywhere (an image's background) win first, and the rest of the picture follows them."""
        config = self.config
        if config.choice_temperature == 0:
            return prob
        anneal = torch.tensor([max(0.0, 1.0 - state.steps_taken / config.steps) for state in states],
                              device=prob.device)  # (b,)
        noise = torch.stack([_gumbel(prob.shape[1:], g, prob.device) for g in generators]).to(prob.dtype)  # (b, L)
        return prob.clamp_min(1e-30).log() + config.choice_temperature * anneal.to(prob.dtype)[:, None] * noise


def _most_confident(window: torch.Tensor, score: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(b, L) bool: the ``counts[i]`` best-scored window slots of each row (ties: leftmost first)."""
    score = torch.where(window, score, -math.inf)  # (b, L)
    order = score.argsort(dim=1, descending=True, stable=True)  # (b, L)
    places = torch.arange(order.shape[1], device=order.device).expand_as(order)  # (b, L)
    rank = torch.empty_like(order).scatter_(1, order, places)  # (b, L) rank of each slot
    return window & (rank < counts[:, None])


__all__ = ["BLOCK_MODES", "KEPT_FRACTION", "MODES", "NO_BLOCK", "SAMPLER_SETTINGS", "SCHEDULES", "TOKEN_SETTINGS",
           "SamplerConfig", "UnmaskingScheduler", "UnmaskingStepOutput", "draw_tokens", "masked_after_step",
           "pad_after_end", "slot_blocks"]
