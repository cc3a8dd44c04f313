"""Self-critique: score every generated token, and turn low scores into regions in native units.

Pure functions of (model, layout, draft, settings); nothing here trains or mutates the model. A
:class:`Draft` is a filled target (the packed target ids a sampler returned, ``SampleResult.target``) with
the conditions it was generated from. Critics give each content token of the draft a score in [0, 1],
higher meaning "more likely right":

- ``confidence`` (training-free): the model's own probability of the token when it is re-masked. The
  tokens are re-masked in a few interleaved groups, one model call each, so every token is scored with
  most of its context present (a 2x2 checkerboard on images, every G-th token on text and audio);
- ``content`` (training-free): the model's probability that the token's *content* is right: the mass of the
  codes that decode like it where it stands (:mod:`unimodal.inference.content`; needs the codecs, so a
  :class:`~unimodal.inference.content.ContentCritic` is passed, which the pipeline makes from the name);
- ``random``: uniform noise, the ReMDM-style baseline (no model call);
- ``learned``: the backbone's critic head, ``DiTOutput.critic``, the logit of "this token is wrong" (trained by
  ``unimodal train --critic-weight``), read on the filled draft (t = 0: nothing is masked) in one call; score
  ``sigmoid(-logit)``;
- a callable ``critic(tokens) -> scores``: local ids per modality in, one score per token out.

Regions are what a person or an agent reads and writes: image boxes in pixels ``(x0, y0, x1, y1)``, audio
spans in seconds ``(start, end)``, text spans in characters ``(start, end)`` of the decoded text. Low-score
tokens are grouped into connected areas (4-neighbour components on the image grid, runs on text and
audio) and each area becomes one region; :func:`region_indices` maps any region back to token indices
through the layout's helpers, so a region from a critic and one from a caller are handled alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from unimodal.tokenizers_mm.layout import MASK, MODALITIES, Layout, Packed, Segment, collate
from unimodal.inference.content import ContentCritic
from unimodal.core.errors import InputError
from unimodal.core.readings import AGREEMENTS, check_agreement
from unimodal.core.seeds import derived_seed

CRITICS = ("learned", "confidence", "content", "content+learned", "random")
CONTENT_CRITICS = ("content", "content+learned")  # the names made into a ContentCritic (they decode codes)
HEAD_CRITICS = ("learned", "content+learned")  # the names that read the critic head (a trained one)
AGREEMENT_READINGS = AGREEMENTS  # agreement_score: all at once (the default), word by word (unimodal.core.readings)
EACH_MAX_GROUPS = 32  # "each" reading: one pass per request token up to this many (a caption has fewer)
DEFAULT_GROUPS = 4  # re-masking a quarter at a time keeps 3/4 of the context for each scored token
DEFAULT_FRACTION = 0.25  # at most this share of a modality's tokens is flagged per critique
DEFAULT_THRESHOLD = 0.5  # and only tokens scored below this: a confident critic flags nothing
# The confidence score's own default, per modality: a score that at most ~5% of *real* test tokens fall below
# on the shipped model (pictures 5.2%, speech 4.7%, captions 0.2%; `unimodal bench refine --corrupt` prints
# the quantiles), so a correct sample is mostly left alone. A real picture's codes are often unlikely one by
# one (many codes decode alike: 70% of real image codes score below 0.5), so a threshold of 0.5 flagged a
# quarter of every picture and later rounds redrew right codes; a random wrong code scores below these in
# 94-100% of cases (docs/results.md, "Each critic's own threshold"). They were read off the shipped model at
# 4 scoring groups: another model, or fewer groups, may want its own (`--threshold`; the bench prints them).
CONFIDENCE_THRESHOLDS = {"image": 0.01, "text": 0.05, "audio": 0.001}
# The content score's default, per modality: it is the model's probability that a code's content is right, so
# a code is flagged when it is more likely wrong than right (0.5, as for the learned head); a caption's words are
# scored as by confidence and keep its threshold.
CONTENT_THRESHOLDS = {"image": DEFAULT_THRESHOLD, "text": CONFIDENCE_THRESHOLDS["text"], "audio": DEFAULT_THRESHOLD}


# ---- the thing being critiqued ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Draft:
    """Filled targets (``target``: packed, shared ids, as ``layout.pack`` of the target segments) and the
    condition segments they were generated from (``(modality, local_ids)`` pairs)."""

    conditions: tuple[tuple[str, torch.Tensor], ...]
    target: Packed

    def tokens(self, layout: Layout) -> dict[str, torch.Tensor]:
        """Local content ids of every target modality (text/audio: up to END)."""
        return layout.unpack(self.target.ids, self.target.segment_ids)

    def content_positions(self, layout: Layout) -> dict[str, torch.Tensor]:
        """Per modality, the target indices of its content tokens (index k of ``tokens()[m]`` is at [k])."""
        tokens = self.tokens(layout)
        return {span.modality: torch.arange(len(tokens[span.modality])) + span.content_start
                for span in self.target.spans}

    def with_ids(self, ids: torch.Tensor) -> "Draft":
        target = Packed(ids, self.target.segment_ids, self.target.positions, self.target.spans)
        return Draft(self.conditions, target)

    def target_segments(self) -> list[Segment]:
        """Masked target segments of the same structure (for the sampler)."""
        return [Segment(s.modality, None, slots=None if s.modality == "image" else s.end - s.start - 1)
                for s in self.target.spans]


def make_draft(layout: Layout, conditions: Sequence[tuple[str, torch.Tensor]],
               tokens: Mapping[str, torch.Tensor]) -> Draft:
    """A draft from local content ids per target modality (text/audio padded to full size, as generated)."""
    segments = [layout.padded_segment(m, torch.as_tensor(tokens[m])) for m in MODALITIES if m in tokens]
    if not segments:
        raise InputError("a draft needs at least one target modality")
    return Draft(tuple((m, torch.as_tensor(ids)) for m, ids in conditions), layout.pack(segments))


# ---- one model call over a draft's targets ----------------------------------------------------------------


def _guidance_terms(cfg, present: set[str]) -> list[tuple[frozenset[str], float]]:
    """As the sampler guides: (condition modalities dropped, scale) per extra row; scale 1 adds no row."""
    if cfg is None or not present:
        return []
    if not isinstance(cfg, Mapping):
        return [] if cfg == 1 else [(frozenset(present), float(cfg))]
    return [(frozenset([m]), float(cfg[m])) for m in MODALITIES if m in cfg and m in present and cfg[m] != 1]


class TargetForward:
    """The model over one draft's targets, rows of variants at once: guided logits restricted to each slot's
    modality, and the critic logits. The conditions' keys/values are computed once (exact, see the DiT)."""

    def __init__(self, model, layout: Layout, draft: Draft, cfg=None):
        self.model, self.target = model, draft.target
        present = {m for m, _ in draft.conditions}
        self.terms = _guidance_terms(cfg, present)
        rows = [list(draft.conditions)] + [[c for c in draft.conditions if c[0] not in dropped]
                                            for dropped, _ in self.terms]
        device = model.device
        if present:
            empty = Packed(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                           torch.zeros(0, 2, dtype=torch.long), ())
            batch = collate([layout.pack(r) if r else empty for r in rows]).to(device)
            self.cache = model.encode_condition(batch.ids, batch.segment_ids, batch.positions, batch.attention_mask)
        else:
            self.cache = model.empty_condition(len(rows), device=device)
        self.allowed = torch.zeros(len(self.target), layout.vocab_size, dtype=torch.bool, device=device)
        for span in self.target.spans:
            self.allowed[list(span.slots)] = layout.allowed_ids(span.modality).to(device)
        self.n_slots = sum(len(span.slots) for span in self.target.spans)

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (B, L) target variants, t (B,) -> log-probabilities (B, L, V) and critic logits (B, L)."""
        device, batch, passes = self.model.device, ids.shape[0], 1 + len(self.terms)
        ids, t = ids.to(device), t.to(device)
        rows = torch.arange(passes, device=device).repeat_interleave(batch)  # (P * B,) pass-major
        length = ids.shape[1]
        out = self.model.forward_targets(ids.repeat(passes, 1), t.repeat(passes),
                                         self.target.segment_ids.to(device).expand(passes * batch, length),
                                         self.target.positions.to(device).expand(passes * batch, length, 2),
                                         self.cache.index_select(rows))
        logits = out.logits.unflatten(0, (passes, batch))  # (P, B, L, V)
        guided = logits[0]
        for k, (_, scale) in enumerate(self.terms, start=1):
            guided = guided + (scale - 1.0) * (logits[0] - logits[k])
        guided = guided.masked_fill(~self.allowed, -math.inf)  # (B, L, V)
        return guided.log_softmax(-1), out.critic[:batch]  # (B, L, V), (B, L)


# ---- critics: one score in [0, 1] per content token, and the model calls it took --------------------------


def score_groups(layout: Layout, modality: str, n_tokens: int, groups: int) -> torch.Tensor:
    """(n_tokens,) group of each content token. Images with 4 groups: a 2x2 checkerboard, so no token is
    re-masked together with a 4-neighbour; otherwise every ``groups``-th token."""
    index = torch.arange(n_tokens)
    if modality == "image" and groups == 4:
        cols = layout.image_grid[1]
        return (index // cols % 2) * 2 + index % cols % 2
    return index % groups


def confidence_scores(model, layout: Layout, draft: Draft, groups: int = DEFAULT_GROUPS,
                      cfg=None) -> tuple[dict[str, torch.Tensor], int]:
    """Each content token's probability under the model when it (and its group) is re-masked; ``groups``
    model calls, batched into one."""
    log_probs, positions = _remasked_log_probs(model, layout, draft, groups, cfg)
    ids = draft.target.ids
    return {m: log_probs[m].gather(1, ids[where][:, None].to(log_probs[m].device))[:, 0].float().exp().cpu()
            for m, where in positions.items()}, groups


def remasked_probabilities(model, layout: Layout, draft: Draft, modality: str, indices: Sequence[int],
                           cfg=None) -> tuple[torch.Tensor, int]:
    """The probability the model gives each of the draft's ``modality`` tokens at ``indices`` (into
    ``draft.tokens(layout)[modality]``) with those tokens re-masked together, everything else in view; one model
    call. What a token the sampler did not commit (a word put in by a check) is given as its confidence."""
    where = draft.content_positions(layout).get(modality)
    if where is None:
        raise InputError(f"the draft has no {modality} target")
    index = torch.as_tensor(list(indices), dtype=torch.long)
    if len(index) == 0 or int(index.min()) < 0 or int(index.max()) >= len(where):
        raise InputError(f"indices must be 1 to {len(where)} positions among the draft's {modality} tokens, "
                         f"got {list(indices)}")
    forward = TargetForward(model, layout, draft, cfg)
    positions = where[index]
    ids = draft.target.ids.clone()
    ids[positions] = MASK
    t = torch.tensor([len(positions) / max(forward.n_slots, 1)])  # (1,)
    log_probs, _ = forward(ids[None], t)  # (1, L, V)
    picked = log_probs[0, positions.to(log_probs.device)]  # (n, V)
    own = draft.target.ids[positions].to(picked.device)
    return picked.gather(1, own[:, None])[:, 0].float().exp().cpu(), 1


def content_scores(model, layout: Layout, draft: Draft, critic, groups: int = DEFAULT_GROUPS,
                   cfg=None) -> tuple[dict[str, torch.Tensor], int]:
    """Each content token's probability that its content is right (``critic``: a
    :class:`~unimodal.inference.content.ContentCritic`): the re-masked distribution of :func:`confidence_scores`,
    summed over the codes that decode like the token where it stands; the same ``groups`` model calls."""
    log_probs, positions = _remasked_log_probs(model, layout, draft, groups, cfg)
    scores = {}
    for modality, where in positions.items():
        low, size = layout.offset(modality), layout.codebook_size(modality)
        probs = log_probs[modality][:, low:low + size].float().exp().cpu()  # (n, K) over the modality's codes
        own = draft.target.ids[where] - low
        scores[modality] = critic.near_mass(modality, own, probs)
    return scores, groups


def content_with_head_scores(model, layout: Layout, draft: Draft, critic, groups: int = DEFAULT_GROUPS,
                             cfg=None) -> tuple[dict[str, torch.Tensor], int]:
    """``critic="content+learned"``: :func:`content_scores` times the learned head's :func:`learned_scores` for
    picture and speech codes (right only when both say so), captions by their content score alone (the head reads
    words worse than confidence does); ``groups`` + 1 model calls. Needs a trained head."""
    scores, calls = content_scores(model, layout, draft, critic, groups, cfg)
    head, head_calls = learned_scores(model, layout, draft, cfg)
    return {m: s * head[m].to(s.dtype).cpu() if m in ("image", "audio") and m in head else s
            for m, s in scores.items()}, calls + head_calls


def _remasked_log_probs(model, layout: Layout, draft: Draft, groups: int,
                        cfg=None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Per modality, (n, V) log-probabilities at each content position with it (and its group) re-masked, and
    the positions; ``groups`` model calls, batched into one."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise InputError(f"groups must be a positive int, got {groups!r}")
    positions = draft.content_positions(layout)
    forward = TargetForward(model, layout, draft, cfg)
    masks = torch.zeros(groups, len(draft.target), dtype=torch.bool)  # (G, L)
    group_of = {}
    for modality, where in positions.items():
        group_of[modality] = score_groups(layout, modality, len(where), groups)
        masks[group_of[modality], where] = True
    ids = draft.target.ids.expand(groups, -1).masked_fill(masks, MASK)  # (G, L)
    t = masks.sum(1).float() / forward.n_slots  # (G,) as the sampler would see this many masked slots
    log_probs, _ = forward(ids, t)  # (G, L, V)
    rows = {m: log_probs[group_of[m].to(log_probs.device), where.to(log_probs.device)]  # each in its group's row
            for m, where in positions.items()}
    return rows, positions


def learned_scores(model, layout: Layout, draft: Draft, cfg=None) -> tuple[dict[str, torch.Tensor], int]:
    """The critic head on the draft: ``sigmoid(-critic)`` ("not wrong"); one model call at the draft's own mask
    ratio (0 for a committed draft: how ``unimodal.training.critic`` trains the head on full fills). Guidance
    does not apply to the critic head (it is read on the conditional row). A model whose head was never trained
    must be refused before this (``unimodal.refine.require_trained_critic``): its scores are 0.5 everywhere."""
    forward = TargetForward(model, layout, draft, None)
    t = (draft.target.ids == MASK).sum().float().reshape(1) / max(forward.n_slots, 1)  # (1,)
    _, critic = forward(draft.target.ids[None], t)  # (1, L)
    scores = torch.sigmoid(-critic[0].float()).cpu()
    return {m: scores[where] for m, where in draft.content_positions(layout).items()}, 1


def random_scores(layout: Layout, draft: Draft, seed: int = 0) -> tuple[dict[str, torch.Tensor], int]:
    """Uniform scores from a seeded generator (ReMDM-style re-masking at random); no model call."""
    generator = torch.Generator().manual_seed(seed)
    tokens = draft.tokens(layout)
    return {m: torch.rand(len(tokens[m]), generator=generator) for m in tokens}, 0


def callable_scores(critic: Callable, layout: Layout, draft: Draft) -> tuple[dict[str, torch.Tensor], int]:
    """A caller's critic: ``critic(tokens)`` with local ids per modality, returning one score per token in
    [0, 1] per modality (1: right). Counted as no model call (the caller pays for its own)."""
    tokens = draft.tokens(layout)
    scores = critic({m: ids.clone() for m, ids in tokens.items()})
    if not isinstance(scores, Mapping):
        raise InputError(f"a critic callable must return {{modality: scores}}, got {type(scores).__name__}")
    checked = {}
    for modality, ids in tokens.items():
        values = torch.as_tensor(scores.get(modality, torch.ones(len(ids))), dtype=torch.float32).reshape(-1)
        if len(values) != len(ids) or not bool(((values >= 0) & (values <= 1)).all()):
            raise InputError(f"the critic's {modality} scores must be {len(ids)} numbers in [0, 1], got "
                             f"{values.tolist()[:8]}")
        checked[modality] = values
    return checked, 0


def agreement_score(model, layout: Layout, draft: Draft, cfg=None, reading: str = "joint") -> tuple[float, int]:
    """How well the draft says what it was asked for, read back by the same model: the draft's content becomes
    the condition and its conditions (the request) the target; the score is the mean log-probability the model
    gives the request's tokens. A picture that shows "a red circle" makes "red" and "circle" likely; one that
    shows a red blob does not. Needs a draft with conditions. Returns (score, forward passes).

    ``reading``: ``"joint"``: every request token masked at once (one pass): the model reads the whole request
    from the draft alone, its wording included ("the number ... written by hand"), so the score also says how
    likely that wording is for the picture. ``"each"``: each word token of the request masked alone, the rest of
    it (and any other input) in view, a pass per token, at most :data:`EACH_MAX_GROUPS` (beyond that every G-th
    token together): the template words are then near certain and the score is decided by the words that name
    the content ("seven", "red" beside "circle"), a check of each word against the draft. A request with no text
    (a picture or speech) is read in at most :data:`EACH_MAX_GROUPS` interleaved groups of its codes.

    Why not the confidence score to compare two drafts of one request: it says how sure the model was of its
    own tokens, not whether they show what was asked; on 64 test scenes with 4 pictures each (shipped model),
    it ranked a judged-right picture above a judged-wrong one of the same request in 46% of pairs, the joint
    reading in 72% (docs/results.md, "Keeping a round by agreement")."""
    check_agreement(reading, error=InputError, name="reading")
    if not draft.conditions:
        raise InputError("the agreement score reads the request back from the draft; this draft was generated "
                         "from no input (nothing to agree with)")
    tokens, request = draft.tokens(layout), dict(draft.conditions)
    shown = [(m, tokens[m]) for m in MODALITIES if m in tokens]  # the draft's content: what the request is read from
    groups = 1
    if reading == "each" and "text" in request:  # the words alone are read, the other inputs in view beside them
        beside = {m: ids for m, ids in request.items() if m != "text" and m not in tokens}
        shown = sorted(shown + list(beside.items()), key=lambda item: MODALITIES.index(item[0]))
        request = {m: ids for m, ids in request.items() if m not in beside}
    reading_draft = make_draft(layout, shown, request)
    if reading == "each":
        longest = max(len(where) for where in reading_draft.content_positions(layout).values())
        groups = max(1, min(longest, EACH_MAX_GROUPS))
    scores, calls = confidence_scores(model, layout, reading_draft, groups, cfg)
    return sample_score(scores), calls


def make_critic(critic, model, layout: Layout, cfg=None, groups: int = DEFAULT_GROUPS, seed: int = 0):
    """``critic`` ("learned", "confidence", "random" or a callable) as ``score(draft, round) -> (scores,
    model calls)``; ``round`` reseeds the random critic so each round draws fresh positions."""
    if isinstance(critic, ContentCritic):
        if critic.with_head:
            return lambda draft, round_=0: content_with_head_scores(model, layout, draft, critic, groups, cfg)
        return lambda draft, round_=0: content_scores(model, layout, draft, critic, groups, cfg)
    if critic in CONTENT_CRITICS:
        raise InputError(f"critic={critic!r} decodes codes with the codecs: pass a ContentCritic "
                         "(UniModal.critique / refine make one from the name)")
    if callable(critic):
        return lambda draft, round_=0: callable_scores(critic, layout, draft)
    makers = {"learned": lambda draft, round_=0: learned_scores(model, layout, draft, cfg),
              "confidence": lambda draft, round_=0: confidence_scores(model, layout, draft, groups, cfg),
              "random": lambda draft, round_=0: random_scores(layout, draft, derived_seed(seed, round_))}
    if critic not in makers:
        raise InputError(f"critic must be one of {CRITICS} or a callable tokens -> scores, got {critic!r}")
    return makers[critic]


def sample_score(scores: Mapping[str, torch.Tensor]) -> float:
    """One number per draft: the mean log-score of its tokens (so one very bad token weighs in)."""
    values = torch.cat([s.reshape(-1) for s in scores.values()]) if scores else torch.zeros(0)
    return float(values.clamp_min(1e-6).log().mean()) if len(values) else 0.0


# ---- low scores -> flagged tokens -> regions ----------------------------------------------------------------


def thresholds_for(critic, threshold: float | None = None) -> dict[str, float]:
    """Per modality, the score a token must fall below to be flagged: ``threshold`` for every modality when
    given; else the critic's default (:data:`CONFIDENCE_THRESHOLDS` for the confidence score, whose scale is
    the model's probability of each token; :data:`DEFAULT_THRESHOLD` for the learned head, whose 0.5 means
    "as likely wrong as right", for random re-masking, which then flags its ``fraction``, and for callables)."""
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
            raise InputError(f"threshold must be a number in (0, 1] or None (the critic's default), got {threshold!r}")
        return {m: float(threshold) for m in MODALITIES}
    if isinstance(critic, str) and critic == "confidence":
        return dict(CONFIDENCE_THRESHOLDS)
    if critic in CONTENT_CRITICS or isinstance(critic, ContentCritic):
        return dict(CONTENT_THRESHOLDS)
    return {m: DEFAULT_THRESHOLD for m in MODALITIES}


def flags_of(scores: Mapping[str, torch.Tensor], critic, fraction: float = DEFAULT_FRACTION,
             threshold: float | None = None) -> dict[str, torch.Tensor]:
    """:func:`flagged` per modality, each at its threshold (:func:`thresholds_for`)."""
    thresholds = thresholds_for(critic, threshold)
    return {m: flagged(s, fraction, thresholds[m]) for m, s in scores.items()}


def flagged(scores: torch.Tensor, fraction: float = DEFAULT_FRACTION,
            threshold: float = DEFAULT_THRESHOLD) -> torch.Tensor:
    """Bool per token: among the lowest ``fraction`` (at least one) and scored below ``threshold``."""
    if not 0 < fraction <= 1 or not 0 < threshold <= 1:
        raise InputError(f"fraction and threshold must lie in (0, 1], got {fraction} and {threshold}")
    count = max(1, math.floor(len(scores) * fraction)) if len(scores) else 0
    lowest = torch.zeros(len(scores), dtype=torch.bool)
    lowest[scores.argsort(stable=True)[:count]] = True
    return lowest & (scores < threshold)


def _grid_components(mask: torch.Tensor, rows: int, cols: int) -> list[list[int]]:
    """4-neighbour connected components of the flagged cells of a row-major grid."""
    flags, seen, components = mask.tolist(), set(), []
    for start in (i for i, f in enumerate(flags) if f):
        if start in seen:
            continue
        stack, component = [start], []
        seen.add(start)
        while stack:
            cell = stack.pop()
            component.append(cell)
            r, c = divmod(cell, cols)
            for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                near = nr * cols + nc
                if 0 <= nr < rows and 0 <= nc < cols and flags[near] and near not in seen:
                    seen.add(near)
                    stack.append(near)
        components.append(sorted(component))
    return components


def _runs(mask: torch.Tensor) -> list[list[int]]:
    """Maximal runs of consecutive flagged indices."""
    runs: list[list[int]] = []
    for i in mask.nonzero().flatten().tolist():
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def text_offsets(codec, ids: Sequence[int]) -> list[tuple[int, int]]:
    """Per generated token, its (start, end) characters in the decoded text. From the tokens as generated,
    not from re-encoding the text: a sampler may write a text in tokens the tokenizer would not choose."""
    ids = [int(i) for i in ids]
    ends = [len(codec.decode_one(ids[:k + 1])) for k in range(len(ids))]
    return [(0 if k == 0 else ends[k - 1], end) for k, end in enumerate(ends)]


class _AsGenerated:
    """A text codec stand-in whose ``encode_with_offsets`` returns the generated tokens, so the layout's
    character -> token mapping (:meth:`Layout.text_span_to_positions`) refers to the tokens of the draft."""

    def __init__(self, codec, ids):
        self.ids, self.offsets = torch.as_tensor(ids, dtype=torch.long), text_offsets(codec, ids)

    def encode_with_offsets(self, text: str):
        return self.ids, self.offsets


def image_region(layout: Layout, cells: Sequence[int]) -> dict:
    """The pixel box around grid cells."""
    cols, patch = layout.image_grid[1], layout.image_patch
    rows_of, cols_of = [c // cols for c in cells], [c % cols for c in cells]
    box = [min(cols_of) * patch, min(rows_of) * patch, (max(cols_of) + 1) * patch, (max(rows_of) + 1) * patch]
    return {"modality": "image", "box": box}


def audio_region(layout: Layout, codes: Sequence[int]) -> dict:
    rate = layout.audio_frame_rate
    return {"modality": "audio", "seconds": [round(min(codes) / rate, 6), round((max(codes) + 1) / rate, 6)]}


def text_region(offsets: Sequence[tuple[int, int]], tokens: Sequence[int], text: str) -> dict:
    start, end = offsets[min(tokens)][0], offsets[max(tokens)][1]
    return {"modality": "text", "chars": [start, end], "text": text[start:end]}


def regions_from_flags(layout: Layout, flags: Mapping[str, torch.Tensor], scores: Mapping[str, torch.Tensor],
                       draft: Draft, text_codec=None) -> list[dict]:
    """Connected flagged areas as regions in native units, each with its token ``indices`` and mean score."""
    tokens, regions = draft.tokens(layout), []
    for modality in MODALITIES:
        if modality not in flags or not bool(flags[modality].any()):
            continue
        if modality == "image":
            groups = _grid_components(flags[modality], *layout.image_grid)
            made = [image_region(layout, g) for g in groups]
        elif modality == "audio":
            groups = _runs(flags[modality])
            made = [audio_region(layout, g) for g in groups]
        else:
            text_ids = tokens["text"].tolist()
            offsets, text = text_offsets(text_codec, text_ids), text_codec.decode_one(text_ids)
            groups = _runs(flags[modality])
            made = [text_region(offsets, g, text) for g in groups]
        for region, group in zip(made, groups):
            if modality == "text" and region["chars"][0] >= region["chars"][1]:
                indices = sorted(int(i) for i in group)  # tokens that decode to no character of their own
            else:
                indices = region_indices(layout, region, draft, text_codec).tolist()
            regions.append({**region, "indices": indices,
                            "score": round(float(scores[modality][indices].mean()), 4)})
    return regions


def region_indices(layout: Layout, region: Mapping, draft: Draft, text_codec=None) -> torch.Tensor:
    """Content indices of a region of the draft (``box`` px, ``seconds`` or ``chars``), by the layout."""
    modality = region.get("modality")
    tokens = draft.tokens(layout)
    if modality not in tokens:
        raise InputError(f"the region names {modality!r}, but the draft holds {sorted(tokens)}; a region is "
                         f"{{'modality': 'image', 'box': [x0, y0, x1, y1]}} (pixels), {{'modality': 'audio', "
                         f"'seconds': [start, end]}} or {{'modality': 'text', 'chars': [start, end]}}")
    if modality == "image":
        return layout.image_box_to_positions(_pair_or_box(region, "box", 4))
    if modality == "audio":
        return layout.audio_span_to_positions(*_pair_or_box(region, "seconds", 2), n_codes=len(tokens["audio"]))
    if text_codec is None:
        raise InputError("mapping a text region needs the text codec")
    ids = tokens["text"].tolist()
    start, end = _pair_or_box(region, "chars", 2)
    return layout.text_span_to_positions(text_codec.decode_one(ids), int(start), int(end), _AsGenerated(text_codec, ids))


def _pair_or_box(region: Mapping, key: str, size: int) -> list[float]:
    value = region.get(key)
    if not isinstance(value, Sequence) or len(value) != size or isinstance(value, str):
        raise InputError(f"a {region.get('modality')} region needs {key!r}: {size} numbers, got {value!r}")
    return [float(v) for v in value]


def selection_of(layout: Layout, regions: Sequence[Mapping], draft: Draft, text_codec=None) -> dict[str, torch.Tensor]:
    """Bool mask per target modality over its content tokens: the union of the regions (a region that carries
    its token ``indices``, as the critic's and a planned caller's do, selects exactly those)."""
    tokens = draft.tokens(layout)
    chosen = {m: torch.zeros(len(ids), dtype=torch.bool) for m, ids in tokens.items()}
    for region in regions:
        given, modality = region.get("indices"), region.get("modality")
        if given is None or modality not in chosen:
            where = region_indices(layout, region, draft, text_codec)  # names the region's problem, if any
        else:
            where = torch.as_tensor(given, dtype=torch.long).reshape(-1)
            if len(where) and not (0 <= int(where.min()) and int(where.max()) < len(chosen[modality])):
                raise InputError(f"a {modality} region's indices must lie in 0..{len(chosen[modality]) - 1}, "
                                 f"got {given}")
        chosen[modality][where] = True
    return chosen


def remasked(layout: Layout, draft: Draft, selection: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The draft's target ids with MASK at the selected content tokens: the sampler's ``start_ids``."""
    ids = draft.target.ids.clone()
    positions = draft.content_positions(layout)
    for modality, chosen in selection.items():
        ids[positions[modality][chosen]] = MASK
    return ids


__all__ = ["AGREEMENT_READINGS", "CONFIDENCE_THRESHOLDS", "CONTENT_CRITICS", "CRITICS", "HEAD_CRITICS", "Draft", "EACH_MAX_GROUPS", "TargetForward", "agreement_score", "confidence_scores", "remasked_probabilities", "content_with_head_scores", "flagged", "flags_of", "learned_scores", "make_critic",
           "make_draft", "random_scores", "region_indices", "regions_from_flags", "remasked", "sample_score",
           "selection_of", "text_offsets", "thresholds_for"]
