"""Sampling: fill the target segments of a request by iterative unmasking (MaskGIT / LLaDA / Fast-dLLM).

:func:`generate` is a pure function of (model, layout, requests, :class:`SamplerConfig`): it never mutates the
model, reads no global state and, given a seed, returns the same tokens every time. A :class:`Request` holds
its conditions (plain segments, local ids) and its targets (``layout.target_segment(...)`` or a modality name).

Every target slot starts as MASK (or as given in ``Request.start_ids``, for edits). A step is one model call:

1. the targets go through ``model.forward_targets`` against the condition cache, which ``encode_condition``
   built once for the whole batch (``use_cache=False`` runs ``model.forward`` on [conditions; targets] instead,
   same tokens); ``t`` is each sample's fraction of still-masked target slots, as in training;
2. classifier-free guidance, conditional and unconditional rows in that same call (see :class:`SamplerConfig`);
3. logits of a slot are restricted to ``layout.allowed_ids`` of its segment (codes; text/audio also END, PAD);
4. a token is drawn per slot (argmax, or Gumbel-max with temperature / top-k / top-p from the request's own
   seeded generator); its confidence is its probability under the restricted, untempered distribution;
5. some masked slots are committed, by mode: ``confidence`` (fixed schedule, most confident first),
   ``threshold`` (every slot with confidence >= tau, at least one) or ``semi_ar`` (blocks left to right, one of
   those rules inside each block);
6. text/audio stay well formed: after the first END (or PAD) of a segment every later slot becomes PAD at once,
   costing no model call; in ``semi_ar`` that is what stops further blocks from opening.

Requests with the same target structure and the same guidance terms run as one batch; each request draws its
noise from its own generator (seed ``config.seed + index`` unless ``Request.seed`` is set), so batching
never changes a request's tokens (up to floating-point ties).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real

import torch

from unimodal.tokenizers_mm.layout import EOS, MARKERS, MASK, MODALITIES, PAD, Batch, Layout, Packed, Segment, collate
from unimodal.core.errors import InputError

MODES = ("confidence", "threshold", "semi_ar")
BLOCK_MODES = ("confidence", "threshold")
# Fraction of the slots still masked once a fraction ``progress`` of the steps is done.
KEPT_FRACTION = {"cosine": lambda progress: math.cos(math.pi / 2 * progress), "linear": lambda progress: 1.0 - progress}
SCHEDULES = tuple(KEPT_FRACTION)
_NO_BLOCK = 2**62  # block index of non-slot positions: never the current block


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
    use_cache: bool = True
    max_batch_size: int = 64

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
        if self.seed is not None:
            _check_int("seed", self.seed, 0, "a non-negative int below 2**62 or None", high=2**62)
        if not isinstance(self.use_cache, bool):
            raise InputError(f"SamplerConfig.use_cache must be a bool, got {self.use_cache!r}")
        object.__setattr__(self, "cfg", _checked_cfg(self.cfg))


def _check_int(name: str, value, low: int, accepted: str | None = None, owner: str = "SamplerConfig",
               high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value >= high):
        raise InputError(f"{owner}.{name} must be {accepted or f'an int >= {low}'}, got {value!r}")


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


# ---- requests and results -----------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Request:
    """One generation: ``conditions`` (segments with content, or ``(modality, local_ids)``) and ``targets``
    (``layout.target_segment(...)`` or a modality name for a full-size target), packed in the order given.

    ``start_ids``: for edits, the packed target ids (shared vocabulary, as ``layout.pack(targets).ids``) with
    MASK at the slots to (re)generate; None: every slot masked. ``seed`` overrides ``config.seed + index``.
    """

    conditions: Sequence[Segment | tuple[str, torch.Tensor]] = ()
    targets: Sequence[Segment | str] = ()
    start_ids: torch.Tensor | None = None
    seed: int | None = None


@dataclass(eq=False)
class SampleResult:
    """What one request produced.

    ``tokens``: local ids per target modality (text/audio: the content before END, so its length is the
    model's choice; images: ``rows*cols`` codes, row-major). ``confidence``: per token of ``tokens``, its
    probability when committed (NaN for tokens given in ``start_ids``); ``committed_at``: the step that
    committed it (-1 if given). ``target``: the final packed targets (shared ids with markers, END and PAD;
    spans relative to the targets), e.g. for a critic. ``commits_per_step``: slots sampled and committed at
    each step; the masked slots filled with PAD after an END are counted in ``structural_pads`` instead.
    ``forward_passes``: batched model calls this request took part in (one per step, ``steps``);
    ``guidance_passes``: the extra guidance rows it had in those calls. ``seed``: its generator's seed.
    """

    tokens: dict[str, torch.Tensor]
    confidence: dict[str, torch.Tensor]
    committed_at: dict[str, torch.Tensor]
    target: Packed
    commits_per_step: list[int]
    forward_passes: int
    guidance_passes: int
    structural_pads: int
    seed: int

    @property
    def steps(self) -> int:
        return len(self.commits_per_step)


@dataclass(eq=False)
class _Prepared:
    """A validated request: packed targets, start ids, condition segments, guidance terms, seed."""

    index: int
    conditions: list[Segment]
    target: Packed
    start_ids: torch.Tensor  # (L_t,)
    terms: list[tuple[frozenset[str], float]]  # (condition modalities dropped, scale)
    seed: int

    @property
    def group_key(self) -> tuple:
        structure = tuple((span.modality, span.end - span.start) for span in self.target.spans)
        return structure, tuple(scale for _, scale in self.terms)


# ---- the entry point ----------------------------------------------------------------------------------------------


@torch.no_grad()
def generate(model, layout: Layout, requests: Request | Sequence[Request],
             config: SamplerConfig | None = None) -> list[SampleResult]:
    """Fill the targets of each request; one :class:`SampleResult` per request, in order."""
    config, prepared = prepare_requests(model, layout, requests, config, "generate")
    results: list[SampleResult | None] = [None] * len(prepared)
    for group in _groups(prepared, config.max_batch_size):
        for item, result in zip(group, _run_group(model, layout, group, config)):
            results[item.index] = result
    return results


def prepare_requests(model, layout: Layout, requests, config: SamplerConfig | None,
                     caller: str) -> tuple[SamplerConfig, list[_Prepared]]:
    """The config (default if None) and the validated requests, seeded; shared by every decoding loop."""
    config = SamplerConfig() if config is None else config
    if not isinstance(config, SamplerConfig):
        raise InputError(f"config must be a SamplerConfig, got {type(config).__name__}")
    requests = [requests] if isinstance(requests, Request) else list(requests)
    if not requests:
        raise InputError(f"{caller} needs at least one Request")
    _check_model(model, layout)
    base_seed = secrets.randbits(62) if config.seed is None else config.seed
    return config, [_prepare(layout, request, index, config, base_seed) for index, request in enumerate(requests)]


def _check_model(model, layout: Layout) -> None:
    if model.config.vocab_size != layout.vocab_size:
        raise InputError(f"the model's vocabulary ({model.config.vocab_size}) is not the layout's "
                         f"({layout.vocab_size}); load them from the same model folder")
    if model.training and getattr(model.config, "dropout", 0.0) > 0:
        raise InputError("the model is in training mode with dropout; call model.eval() before sampling")


def _groups(prepared: list[_Prepared], max_batch_size: int) -> list[list[_Prepared]]:
    """Requests with the same target structure and guidance scales, in chunks of ``max_batch_size``."""
    by_key: dict[tuple, list[_Prepared]] = {}
    for item in prepared:
        by_key.setdefault(item.group_key, []).append(item)
    return [items[i:i + max_batch_size] for items in by_key.values() for i in range(0, len(items), max_batch_size)]


# ---- validating a request -----------------------------------------------------------------------------------------


def _prepare(layout: Layout, request: Request, index: int, config: SamplerConfig, base_seed: int) -> _Prepared:
    where = f"request {index}"
    if not isinstance(request, Request):
        raise InputError(f"{where} must be a Request, got {type(request).__name__}")
    if not request.targets:
        raise InputError(f"{where} has no target: give at least one target segment or modality name")
    targets = [_target_segment(layout, target, where) for target in request.targets]
    conditions = [_condition_segment(condition, where) for condition in request.conditions]
    both = {s.modality for s in targets} & {s.modality for s in conditions}
    if both:
        raise InputError(f"{where}: {sorted(both)} cannot be both a condition and a target")
    if conditions:
        layout.pack(conditions)  # checks the ids now, so an error names the request
    target = layout.pack(targets)
    start_ids = _start_ids(layout, target, request.start_ids, where)
    if request.seed is not None:
        _check_int("seed", request.seed, 0, "a non-negative int below 2**63 or None", f"{where}: Request", 2**63)
    seed = base_seed + index if request.seed is None else request.seed
    return _Prepared(index, conditions, target, start_ids,
                     _guidance_terms(config.cfg, {s.modality for s in conditions}), seed)


def _target_segment(layout: Layout, target, where: str) -> Segment:
    if not isinstance(target, (str, Segment)) or (isinstance(target, Segment) and target.content is not None):
        raise InputError(f"{where}: a target must be a modality name or an empty Segment from "
                         f"layout.target_segment (to regenerate part of given content use Request.start_ids), "
                         f"got {target!r}")
    modality = target if isinstance(target, str) else target.modality
    if modality not in MODALITIES:
        raise InputError(f"{where}: target modality {modality!r} is not in the layout; known: {MODALITIES}")
    if isinstance(target, str):
        return layout.target_segment(target)
    if modality != "image" and (target.slots is None or target.slots < 1):
        raise InputError(f"{where}: a {modality} target needs at least one slot (for its END), got {target.slots}")
    return target


def _condition_segment(condition, where: str) -> Segment:
    if isinstance(condition, Segment):
        segment = condition
    elif isinstance(condition, tuple) and len(condition) == 2 and isinstance(condition[0], str):
        segment = Segment(*condition)
    else:
        raise InputError(f"{where}: a condition must be a Segment or a (modality, local_ids) pair, got {condition!r}")
    if segment.modality not in MODALITIES:
        raise InputError(f"{where}: condition modality {segment.modality!r} is not in the layout; known: {MODALITIES}")
    if segment.content is None:
        raise InputError(f"{where}: the {segment.modality} condition has no content")
    return segment


def _start_ids(layout: Layout, target: Packed, start_ids, where: str) -> torch.Tensor:
    """The given start ids, checked: same markers as the targets, slots MASK or allowed ids."""
    if start_ids is None:
        return target.ids.clone()
    start_ids = torch.as_tensor(start_ids)
    if start_ids.shape != target.ids.shape or start_ids.is_floating_point():
        raise InputError(f"{where}: start_ids must be {tuple(target.ids.shape)} integer ids (the packed "
                         f"targets), got {start_ids.dtype} {tuple(start_ids.shape)}")
    start_ids = start_ids.long()
    slots = _slot_mask(target)
    if not torch.equal(start_ids[~slots], target.ids[~slots]):
        raise InputError(f"{where}: start_ids must keep the targets' markers (BEGIN, an image's END) unchanged")
    for span in target.spans:
        body = start_ids[list(span.slots)]
        in_vocab = (body >= 0) & (body < layout.vocab_size)
        allowed = in_vocab & (layout.allowed_ids(span.modality)[body.clamp(0, layout.vocab_size - 1)] | (body == MASK))
        if not allowed.all():
            raise InputError(f"{where}: start_ids of the {span.modality} target hold ids that are neither MASK nor "
                             f"allowed there: {body[~allowed][:5].tolist()}")
    return start_ids


def _guidance_terms(cfg, present: set[str]) -> list[tuple[frozenset[str], float]]:
    """(modalities dropped, scale) per extra guidance row; terms with scale 1 or no such condition vanish."""
    if cfg is None or not present:
        return []
    if isinstance(cfg, Real):
        return [] if cfg == 1 else [(frozenset(present), float(cfg))]
    return [(frozenset([m]), float(cfg[m])) for m in MODALITIES if m in cfg and m in present and cfg[m] != 1]


# ---- the structure of a target ------------------------------------------------------------------------------------


def _slot_mask(target: Packed) -> torch.Tensor:
    slots = torch.zeros(len(target), dtype=torch.bool)
    for span in target.spans:
        slots[list(span.slots)] = True
    return slots


@dataclass(eq=False)
class _TargetInfo:
    """What the loop needs about a group's (shared) target structure, on the model's device."""

    segment_ids: torch.Tensor  # (L,)
    positions: torch.Tensor  # (L, 2)
    slots: torch.Tensor  # (L,) bool
    block_of: torch.Tensor  # (L,) long: semi_ar block of each slot; _NO_BLOCK elsewhere
    allowed: torch.Tensor  # (L, V) bool: ids each slot may take (all ids at non-slots, never sampled there)
    sequences: list[tuple[torch.Tensor, int]] = field(default_factory=list)  # text/audio: (slot indices, END id)

    @property
    def n_slots(self) -> int:
        return int(self.slots.sum())


def _target_info(layout: Layout, target: Packed, config: SamplerConfig, device) -> _TargetInfo:
    allowed = torch.ones(len(target), layout.vocab_size, dtype=torch.bool)
    block_of = torch.full((len(target),), _NO_BLOCK, dtype=torch.long)
    sequences, first_block = [], 0
    for span in target.spans:
        slots = torch.tensor(list(span.slots), dtype=torch.long)
        allowed[slots] = layout.allowed_ids(span.modality)
        if config.mode == "semi_ar":  # blocks never straddle two segments: each segment starts a new block
            block_of[slots] = first_block + torch.arange(len(slots)) // config.block_length
            first_block = int(block_of[slots].max()) + 1
        else:  # one window over every target slot
            block_of[slots] = 0
        if span.modality != "image":
            sequences.append((slots.to(device), MARKERS[span.modality][1]))
    return _TargetInfo(target.segment_ids.to(device), target.positions.to(device), _slot_mask(target).to(device),
                       block_of.to(device), allowed.to(device), sequences)


# ---- one model call per step: conditions, guidance rows, cache ----------------------------------------------------


def _condition_rows(layout: Layout, group: list[_Prepared]) -> Batch:
    """Conditions of every row, pass-major: the full conditions of each request, then one block per guidance
    term with that term's modalities dropped. Rows without conditions are all padding."""
    rows = [item.conditions for item in group]
    for term in range(len(group[0].terms)):
        rows += [[s for s in item.conditions if s.modality not in item.terms[term][0]] for item in group]
    empty = Packed(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                   torch.zeros(0, 2, dtype=torch.long), ())
    return collate([layout.pack(segments) if segments else empty for segments in rows])


def _pass_rows(rows: torch.Tensor, passes: int, batch: int) -> torch.Tensor:
    """Row indices of samples ``rows`` in each of the ``passes`` blocks of ``batch`` rows: (passes * b,)."""
    return torch.cat([rows + p * batch for p in range(passes)])


def _cached_forward(model, conditions: Batch, info: _TargetInfo, passes: int, batch: int):
    """Step function over the condition cache: encode_condition once, forward_targets every step."""
    if conditions.ids.shape[1] == 0:
        cache = model.empty_condition(conditions.ids.shape[0], device=info.slots.device)
    else:
        cache = model.encode_condition(conditions.ids, conditions.segment_ids, conditions.positions,
                                       conditions.attention_mask)
    selected: dict[tuple, object] = {}

    def forward(rows: torch.Tensor, ids: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        key = tuple(rows.tolist())
        if key not in selected:  # rows change only when a sample finishes
            selected.clear()
            selected[key] = cache.index_select(_pass_rows(rows, passes, batch))
        n, length = passes * len(rows), ids.shape[1]
        out = model.forward_targets(ids.repeat(passes, 1), t.repeat(passes), info.segment_ids.expand(n, length),
                                    info.positions.expand(n, length, 2), selected[key])
        return out.logits.unflatten(0, (passes, len(rows)))  # (P, b, L, V)

    return forward


def _full_forward(model, conditions: Batch, info: _TargetInfo, passes: int, batch: int):
    """Step function without a cache: model.forward on [conditions; targets], is_target on the targets."""
    cond_len = conditions.ids.shape[1]

    def forward(rows: torch.Tensor, ids: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        every = _pass_rows(rows, passes, batch)  # (n,)
        n, length = len(every), ids.shape[1]

        def joined(cond: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # (n, L_c + L, ...)
            return torch.cat([cond[every], target], dim=1)

        out = model(joined(conditions.ids, ids.repeat(passes, 1)),
                    t.repeat(passes),
                    joined(conditions.segment_ids, info.segment_ids.expand(n, length)),
                    joined(conditions.positions, info.positions.expand(n, length, 2)),
                    joined(torch.zeros_like(conditions.attention_mask), info.slots.new_ones(n, length)),
                    joined(conditions.attention_mask, info.slots.new_ones(n, length)))
        return out.logits[:, cond_len:].unflatten(0, (passes, len(rows)))  # (P, b, L, V)

    return forward


def _guided(logits: torch.Tensor, scales: Sequence[float]) -> torch.Tensor:
    """(P, b, L, V) -> (b, L, V): cond + sum_k (s_k - 1) (cond - cond_without_k)."""
    guided = logits[0]
    for k, scale in enumerate(scales, start=1):
        guided = guided + (scale - 1.0) * (logits[0] - logits[k])
    return guided


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


def _gumbel(shape, generator: torch.Generator, device) -> torch.Tensor:
    # float64: in float32 the Gumbel tail is coarse, which skews low-temperature sampling (noted by LLaDA).
    uniform = torch.rand(shape, generator=generator, device=device, dtype=torch.float64)
    return -torch.log(-torch.log(uniform.clamp_min(torch.finfo(torch.float64).tiny)))


def _draw(logits: torch.Tensor, allowed: torch.Tensor, generators: list[torch.Generator],
          config: SamplerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, L, V) logits -> chosen ids (b, L) and their probability (b, L) under the restricted distribution."""
    logits = logits.masked_fill(~allowed, -math.inf)  # (b, L, V)
    if config.temperature == 0:
        chosen = logits.argmax(-1)  # (b, L)
    else:
        scores = _filtered(logits / config.temperature, config.top_k, config.top_p).double()  # (b, L, V)
        noise = torch.stack([_gumbel(scores.shape[1:], g, scores.device) for g in generators])  # (b, L, V)
        chosen = (scores + noise).argmax(-1)  # (b, L)
    probs = logits.softmax(-1)  # (b, L, V)
    return chosen, probs.gather(-1, chosen[..., None]).squeeze(-1)


# ---- which slots to commit ----------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Progress:
    """Per sample of a group: its current block and step within it, and what it has done so far."""

    block: int = -1
    block_step: int = 0
    block_size: int = 0
    commits: list[int] = field(default_factory=list)
    structural_pads: int = 0


def _windows(info: _TargetInfo, masked: torch.Tensor, progress: list[_Progress]) -> torch.Tensor:
    """(b, L) masked slots each sample may commit now (its first block with a masked slot); opens blocks."""
    current = torch.where(masked, info.block_of, _NO_BLOCK).min(dim=1).values  # (b,)
    window = masked & (info.block_of == current[:, None])  # (b, L)
    for row, (block, size) in enumerate(zip(current.tolist(), window.sum(1).tolist())):
        if block != progress[row].block:
            progress[row].block, progress[row].block_step, progress[row].block_size = block, 0, size
    return window


def _commit_count(available: int, n_confident: int, state: _Progress, config: SamplerConfig) -> int:
    """Slots to commit this step out of ``available`` masked ones in the window; advances the block step."""
    rule = config.block_mode if config.mode == "semi_ar" else config.mode
    if rule == "threshold":
        last = state.block_step >= config.steps - 1
        state.block_step += 1
        return available if last else max(1, n_confident)
    # Skip steps that would commit nothing (more steps than slots, or slots already filled with PAD).
    while masked_after_step(state.block_size, state.block_step, config.steps, config.schedule) >= available:
        state.block_step += 1
    remaining = masked_after_step(state.block_size, state.block_step, config.steps, config.schedule)
    state.block_step += 1
    return available - remaining


def _commit_order(prob: torch.Tensor, progress: list[_Progress], generators: list[torch.Generator],
                  config: SamplerConfig) -> torch.Tensor:
    """(b, L) score deciding which slots are committed first: the probability, or with ``choice_temperature``
    (MaskGIT) log-probability + Gumbel noise scaled by ``choice_temperature * (1 - step / steps)``, so early
    steps pick slots nearly at random (as masked diffusion's own reverse process does) and late ones by
    confidence. Without it a greedy order lets the likeliest tokens everywhere (an image's background) win
    first, and the rest of the picture follows them."""
    if config.choice_temperature == 0:
        return prob
    anneal = torch.tensor([max(0.0, 1.0 - len(state.commits) / config.steps) for state in progress],
                          device=prob.device)  # (b,)
    return perturbed_order(prob, anneal, generators, config.choice_temperature)


def perturbed_order(prob: torch.Tensor, anneal: torch.Tensor, generators: list, choice_temperature: float):
    """(b, L) MaskGIT commit score: log-probability + ``choice_temperature * anneal`` (b,) times Gumbel noise
    drawn from each row's generator."""
    noise = torch.stack([_gumbel(prob.shape[1:], g, prob.device) for g in generators]).to(prob.dtype)  # (b, L)
    return prob.clamp_min(1e-30).log() + choice_temperature * anneal.to(prob.dtype)[:, None] * noise


def _most_confident(window: torch.Tensor, confidence: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(b, L) bool: the ``counts[i]`` best-scored window slots of each sample (ties: leftmost first)."""
    score = torch.where(window, confidence, -math.inf)  # (b, L)
    order = score.argsort(dim=1, descending=True, stable=True)  # (b, L)
    places = torch.arange(order.shape[1], device=order.device).expand_as(order)  # (b, L)
    rank = torch.empty_like(order).scatter_(1, order, places)  # (b, L) rank of each slot
    return window & (rank < counts[:, None])


def _pad_after_end(info: _TargetInfo, ids: torch.Tensor) -> torch.Tensor:
    """In place: every text/audio slot after the first END/PAD/EOS becomes PAD; returns the slots changed (b, L)."""
    changed = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)  # (b, L)
    for slots, end in info.sequences:
        body = ids[:, slots]  # (b, n)
        stop = (body == end) | (body == PAD) | (body == EOS)
        after = (stop.long().cumsum(1) - stop.long()) > 0  # strictly after the first stop
        changed[:, slots] = after & (body != PAD)
        ids[:, slots] = body.masked_fill(after, PAD)
    return changed


@dataclass(eq=False)
class _Tokens:
    """A group's targets as they are filled: ids (B, L), and per slot its confidence and step when committed."""

    ids: torch.Tensor
    confidence: torch.Tensor  # float, NaN until sampled
    committed_at: torch.Tensor  # long, -1 until sampled (given and structural PAD slots stay -1)

    def rows(self, rows: torch.Tensor) -> "_Tokens":
        return _Tokens(self.ids[rows], self.confidence[rows], self.committed_at[rows])

    def write(self, rows: torch.Tensor, part: "_Tokens") -> None:
        self.ids[rows], self.confidence[rows], self.committed_at[rows] = part.ids, part.confidence, part.committed_at

    def pad_after_end(self, info: _TargetInfo) -> list[int]:
        """Keeps text/audio well formed (see :func:`_pad_after_end`); returns masked slots filled per sample."""
        was_masked = self.ids == MASK
        changed = _pad_after_end(info, self.ids)
        self.confidence = self.confidence.masked_fill(changed, math.nan)
        self.committed_at = self.committed_at.masked_fill(changed, -1)
        return (changed & was_masked).sum(1).tolist()


# ---- the loop -----------------------------------------------------------------------------------------------------


def _run_group(model, layout: Layout, group: list[_Prepared], config: SamplerConfig) -> list[SampleResult]:
    device = model.device
    info = _target_info(layout, group[0].target, config, device)
    scales = [scale for _, scale in group[0].terms]
    conditions = _condition_rows(layout, group).to(device)
    make_forward = _cached_forward if config.use_cache else _full_forward
    forward = make_forward(model, conditions, info, 1 + len(scales), len(group))
    generators = [torch.Generator(device=device).manual_seed(item.seed) for item in group]
    ids = torch.stack([item.start_ids for item in group]).to(device)  # (B, L)
    tokens = _Tokens(ids, torch.full(ids.shape, math.nan, device=device), torch.full_like(ids, -1))
    progress = [_Progress(structural_pads=pads) for pads in tokens.pad_after_end(info)]
    while True:
        rows = ((tokens.ids == MASK) & info.slots).any(dim=1).nonzero().flatten()  # (b,) samples not finished
        if len(rows) == 0:
            break
        part = tokens.rows(rows)
        _step(forward, info, scales, rows, part, [progress[r] for r in rows.tolist()],
              [generators[r] for r in rows.tolist()], config)
        tokens.write(rows, part)
    return [_result(layout, item, tokens.rows(torch.tensor([row], device=device)), progress[row], len(scales))
            for row, item in enumerate(group)]


def _step(forward, info: _TargetInfo, scales, rows, part: _Tokens, progress, generators, config) -> None:
    """One model call for samples ``rows`` (their tokens: ``part``): draw, commit, keep text/audio well formed."""
    masked = (part.ids == MASK) & info.slots  # (b, L)
    window = _windows(info, masked, progress)  # (b, L)
    t = masked.sum(1).float() / info.n_slots  # (b,) fraction still masked: the model's t, as in training
    logits = _guided(forward(rows, part.ids, t), scales)  # (b, L, V)
    chosen, prob = _draw(logits, info.allowed, generators, config)  # (b, L) x2
    confident = (window & (prob >= config.tau)).sum(1).tolist()
    available = window.sum(1).tolist()
    counts = [_commit_count(n, c, state, config) for n, c, state in zip(available, confident, progress)]
    order = _commit_order(prob, progress, generators, config)  # (b, L)
    commit = _most_confident(window, order, torch.tensor(counts, device=part.ids.device))  # (b, L)
    part.ids = torch.where(commit, chosen, part.ids)
    part.confidence = torch.where(commit, prob, part.confidence)
    step_index = torch.tensor([len(state.commits) for state in progress], device=part.ids.device)  # (b,)
    part.committed_at = torch.where(commit, step_index[:, None], part.committed_at)
    for state, count, pads in zip(progress, counts, part.pad_after_end(info)):
        state.commits.append(count)
        state.structural_pads += pads


def _result(layout: Layout, item: _Prepared, final: _Tokens, progress: _Progress, n_terms: int) -> SampleResult:
    ids, confidence, committed_at = final.ids[0].cpu(), final.confidence[0].cpu(), final.committed_at[0].cpu()
    target = Packed(ids, item.target.segment_ids, item.target.positions, item.target.spans)
    tokens = layout.unpack(ids, item.target.segment_ids)
    content = {span.modality: slice(span.content_start, span.content_start + len(tokens[span.modality]))
               for span in item.target.spans}
    passes = len(progress.commits)
    return SampleResult(tokens, {m: confidence[c] for m, c in content.items()},
                        {m: committed_at[c] for m, c in content.items()}, target, progress.commits, passes,
                        passes * n_terms, progress.structural_pads, item.seed)


__all__ = ["BLOCK_MODES", "MODES", "SCHEDULES", "Request", "SampleResult", "SamplerConfig", "generate",
           "masked_after_step"]
