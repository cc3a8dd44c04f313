"""Sampling: fill the target segments of a request by iterative unmasking (MaskGIT / LLaDA / Fast-dLLM).

:func:`generate` is a pure function of (model, layout, requests, :class:`SamplerConfig`): it never mutates the
model, reads no global state and, given a seed, returns the same tokens every time. A :class:`Request` holds
its conditions (plain segments, local ids) and its targets (``layout.target_segment(...)`` or a modality name).

Every target slot starts as MASK (or as given in ``Request.start_ids``, for edits). A step is one model call
(:func:`_generate_group` is the loop, on one screen):

1. the targets go through ``model.forward_targets`` against the condition cache, which ``encode_condition``
   built once for the whole batch (``use_cache=False`` runs ``model.forward`` on [conditions; targets] instead,
   same tokens); ``t`` is each sample's fraction of still-masked target slots, as in training;
2. classifier-free guidance, conditional and unconditional rows in that same call (see :class:`SamplerConfig`);
3. logits of a slot are restricted to ``layout.allowed_ids`` of its segment (codes; text/audio also END, PAD);
4. ``scheduler.step`` (:class:`unimodal.inference.unmasking.UnmaskingScheduler`, the one commit rule) draws a
   token per slot (argmax, or Gumbel-max with temperature / top-k / top-p from the request's own seeded
   generator; its confidence is its probability under the restricted, untempered distribution) and commits
   some masked slots, by mode: ``confidence`` (fixed schedule, most confident first), ``threshold`` (every
   slot with confidence >= tau, at least one) or ``semi_ar`` (blocks left to right, one of those rules inside
   each block);
5. text/audio stay well formed: after the first END (or PAD) of a segment every later slot becomes PAD at once,
   costing no model call; in ``semi_ar`` that is what stops further blocks from opening.

Requests with the same target structure and the same guidance terms run as one batch; each request draws its
noise from its own generator (seed ``config.seed + index``, wrapped below 2**62 by ``derived_seed``, unless
``Request.seed`` is set), so batching never changes a request's tokens (up to floating-point ties).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Real

import torch

from unimodal.inference.unmasking import (BLOCK_MODES, MODES, SAMPLER_SETTINGS, SCHEDULES, SamplerConfig,
                                          UnmaskingScheduler, UnmaskingStepOutput, masked_after_step,
                                          pad_after_end, slot_blocks)
from unimodal.tokenizers_mm.layout import MARKERS, MASK, MODALITIES, Batch, Layout, Packed, Segment, collate
from unimodal.core.errors import InputError
from unimodal.core.seeds import check_seed, derived_seed, fresh_seed

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
class PreparedRequest:
    """A validated request: packed targets, start ids, condition segments, guidance terms, seed (what
    :func:`prepare_requests` returns, for any decoding loop)."""

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
    for group in group_requests(prepared, config.max_batch_size):
        for item, result in zip(group, _generate_group(model, layout, group, config)):
            results[item.index] = result
    return results


def prepare_requests(model, layout: Layout, requests, config: SamplerConfig | None,
                     caller: str) -> tuple[SamplerConfig, list[PreparedRequest]]:
    """The config (default if None) and the validated requests, seeded; shared by every decoding loop."""
    config = SamplerConfig() if config is None else config
    if not isinstance(config, SamplerConfig):
        raise InputError(f"config must be a SamplerConfig, got {type(config).__name__}")
    requests = [requests] if isinstance(requests, Request) else list(requests)
    if not requests:
        raise InputError(f"{caller} needs at least one Request")
    _check_model(model, layout)
    base_seed = fresh_seed() if config.seed is None else config.seed
    return config, [_prepare(layout, request, index, config, base_seed) for index, request in enumerate(requests)]


def _check_model(model, layout: Layout) -> None:
    if model.config.vocab_size != layout.vocab_size:
        raise InputError(f"the model's vocabulary ({model.config.vocab_size}) is not the layout's "
                         f"({layout.vocab_size}); load them from the same model folder")
    if model.training and getattr(model.config, "dropout", 0.0) > 0:
        raise InputError("the model is in training mode with dropout; call model.eval() before sampling")


def group_requests(prepared: list[PreparedRequest], max_batch_size: int) -> list[list[PreparedRequest]]:
    """The batches a decoding loop runs: requests with the same target structure and guidance scales, in
    chunks of ``max_batch_size``."""
    by_key: dict[tuple, list[PreparedRequest]] = {}
    for item in prepared:
        by_key.setdefault(item.group_key, []).append(item)
    return [items[i:i + max_batch_size] for items in by_key.values() for i in range(0, len(items), max_batch_size)]


# ---- validating a request -----------------------------------------------------------------------------------------


def _prepare(layout: Layout, request: Request, index: int, config: SamplerConfig, base_seed: int) -> PreparedRequest:
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
        check_seed(request.seed, f"{where}: Request.seed")
    seed = derived_seed(base_seed, index) if request.seed is None else request.seed
    return PreparedRequest(index, conditions, target, start_ids,
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
    block_of: torch.Tensor  # (L,) long: block of each slot (unmasking.slot_blocks); NO_BLOCK elsewhere
    allowed: torch.Tensor  # (L, V) bool: ids each slot may take (all ids at non-slots, never sampled there)
    sequences: list[tuple[torch.Tensor, int]] = field(default_factory=list)  # text/audio: (slot indices, END id)

    @property
    def n_slots(self) -> int:
        return int(self.slots.sum())


def _target_info(layout: Layout, target: Packed, config: SamplerConfig, device) -> _TargetInfo:
    allowed = torch.ones(len(target), layout.vocab_size, dtype=torch.bool)
    segments, sequences = [], []
    for span in target.spans:
        slots = torch.tensor(list(span.slots), dtype=torch.long)
        allowed[slots] = layout.allowed_ids(span.modality)
        segments.append(slots)
        if span.modality != "image":
            sequences.append((slots.to(device), MARKERS[span.modality][1]))
    return _TargetInfo(target.segment_ids.to(device), target.positions.to(device), _slot_mask(target).to(device),
                       slot_blocks(segments, len(target), config).to(device), allowed.to(device), sequences)


# ---- one model call per step: conditions, guidance rows, cache ----------------------------------------------------


def _condition_rows(layout: Layout, group: list[PreparedRequest]) -> Batch:
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


# ---- the loop -----------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Tokens:
    """A group's targets as they are filled: ids (B, L), and per slot its confidence and step when committed."""

    ids: torch.Tensor
    confidence: torch.Tensor  # float, NaN until sampled
    committed_at: torch.Tensor  # long, -1 until sampled (given and structural PAD slots stay -1)

    @classmethod
    def start(cls, group: list[PreparedRequest], device) -> "_Tokens":
        ids = torch.stack([item.start_ids for item in group]).to(device)  # (B, L)
        return cls(ids, torch.full(ids.shape, math.nan, device=device), torch.full_like(ids, -1))

    def rows(self, rows: torch.Tensor) -> "_Tokens":
        return _Tokens(self.ids[rows], self.confidence[rows], self.committed_at[rows])

    def write(self, rows: torch.Tensor, part: "_Tokens") -> None:
        self.ids[rows], self.confidence[rows], self.committed_at[rows] = part.ids, part.confidence, part.committed_at

    def masked(self, info: _TargetInfo) -> torch.Tensor:
        return (self.ids == MASK) & info.slots  # (B, L)

    def commit(self, out: UnmaskingStepOutput) -> list[int]:
        """Takes a scheduler step's tokens, with their confidence and step; returns the slots committed per row."""
        self.ids = out.prev_sample
        self.confidence = torch.where(out.committed, out.confidence, self.confidence)
        self.committed_at = torch.where(out.committed, out.step_index[:, None], self.committed_at)
        return out.committed.sum(1).tolist()

    def pad_after_end(self, info: _TargetInfo) -> list[int]:
        """Keeps text/audio well formed (see :func:`pad_after_end`); returns masked slots filled per row."""
        was_masked = self.ids == MASK
        changed = pad_after_end(self.ids, info.sequences)
        self.confidence = self.confidence.masked_fill(changed, math.nan)
        self.committed_at = self.committed_at.masked_fill(changed, -1)
        return (changed & was_masked).sum(1).tolist()


@dataclass(eq=False)
class _History:
    """What one row did: slots committed at each of its steps, and masked slots filled with PAD after an END."""

    commits: list[int] = field(default_factory=list)
    structural_pads: int = 0


def _generate_group(model, layout: Layout, group: list[PreparedRequest], config: SamplerConfig) -> list[SampleResult]:
    """The sampling loop for requests sharing a target structure: encode, timesteps, {model, guidance, step}
    until no slot is masked, then the results."""
    device = model.device
    # Encode: the conditions once (the cache), the targets' structure, and every row's own generator.
    info = _target_info(layout, group[0].target, config, device)
    scales = [scale for _, scale in group[0].terms]
    make_forward = _cached_forward if config.use_cache else _full_forward
    forward = make_forward(model, _condition_rows(layout, group).to(device), info, 1 + len(scales), len(group))
    generators = [torch.Generator(device=device).manual_seed(item.seed) for item in group]
    tokens = _Tokens.start(group, device)
    history = [_History(structural_pads=pads) for pads in tokens.pad_after_end(info)]
    # Timesteps: the scheduler learns the slots' blocks and starts every row at step 0.
    scheduler = UnmaskingScheduler(config)
    scheduler.set_timesteps(info.block_of, len(group))
    while True:
        rows = tokens.masked(info).any(dim=1).nonzero().flatten()  # (b,) rows with a slot still masked
        if len(rows) == 0:
            break
        part = tokens.rows(rows)
        t = part.masked(info).sum(1).float() / info.n_slots  # (b,) fraction still masked: the model's t
        logits = _guided(forward(rows, part.ids, t), scales)  # (b, L, V)
        out = scheduler.step(logits, part.ids, info.allowed, [generators[r] for r in rows.tolist()], rows)
        commits, pads = part.commit(out), part.pad_after_end(info)
        for row, count, n_pads in zip(rows.tolist(), commits, pads):
            history[row].commits.append(count)
            history[row].structural_pads += n_pads
        tokens.write(rows, part)
    return [_result(layout, item, tokens.rows(torch.tensor([row], device=device)), history[row], len(scales))
            for row, item in enumerate(group)]


def _result(layout: Layout, item: PreparedRequest, final: _Tokens, history: _History, n_terms: int) -> SampleResult:
    ids, confidence, committed_at = final.ids[0].cpu(), final.confidence[0].cpu(), final.committed_at[0].cpu()
    target = Packed(ids, item.target.segment_ids, item.target.positions, item.target.spans)
    tokens = layout.unpack(ids, item.target.segment_ids)
    content = {span.modality: slice(span.content_start, span.content_start + len(tokens[span.modality]))
               for span in item.target.spans}
    passes = len(history.commits)
    return SampleResult(tokens, {m: confidence[c] for m, c in content.items()},
                        {m: committed_at[c] for m, c in content.items()}, target, history.commits, passes,
                        passes * n_terms, history.structural_pads, item.seed)


__all__ = ["BLOCK_MODES", "MODES", "SAMPLER_SETTINGS", "SCHEDULES", "PreparedRequest", "Request", "SampleResult",
           "SamplerConfig", "generate", "group_requests", "masked_after_step", "prepare_requests"]
