"""The learned critic's objective: fill masked slots with the model's own guesses, add cheap negatives, feed the
draft back and teach the critic head which tokens are wrong.

Token-Critic (Lezama et al., ECCV 2022) trains a second network to tell a generator's tokens from real ones;
PRISM (2025) reads a per-token quality head on the generator itself. Ours is the backbone's critic head
(``DiTOutput.critic``: one logit per token that it is wrong), trained in the same step as the denoising loss:

1. a share of the step's masked rows is filled from the logits of the denoising forward (no gradient, no extra
   model call), at the sampler's default temperature per modality (:data:`FILL_TEMPERATURES`); each row commits
   its most confident draws, as the confidence sampler does: all of them (a one-step full fill, the state
   ``refine`` critiques, t = 0) or a random share (a partial fill, a state part-way through sampling);
2. cheap negatives on top, at committed and never-masked slots: random code swaps in image and audio slots, and
   attribute swaps in captions (a colour, shape or size word replaced by another of its kind, from
   :mod:`unimodal.core.grammar`);
3. the draft runs through the model again at its own mask ratio, and the critic logit of every committed target
   slot is trained with binary cross-entropy against "this token is wrong" (below).

"Wrong" for captions is token inequality; for image and audio codes it is decoded content differing beyond a
threshold (:mod:`unimodal.training.critic_labels`: most codes that differ from the real one decode to nearly the
same patch or frames), when the run has the codecs to decode them. A run from a pack has none and falls back to
token inequality (near-identical codes also count as wrong: the critic errs on the strict side), and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from unimodal.core.grammar import COLORS, SHAPES, SIZES
from unimodal.tokenizers_mm.layout import MASK, SEGMENT_IDS, Layout
from unimodal.training.objective import MaskedBatch, TargetVocab

# The sampler's default temperature per target kind (inference/schedulers.py: captions greedy, codes at 1.0),
# so the critic learns from the kind of draws it will read at inference.
FILL_TEMPERATURES = {"text": 0.0, "image": 1.0, "audio": 1.0}
FULL_FILL_SHARE = 0.5  # of the critic rows, those whose every masked slot is filled (the others: a random share)
ATTRIBUTE_KINDS = (tuple(COLORS), SHAPES, tuple(SIZES))  # words that may stand in for each other in a caption


@dataclass(frozen=True)
class AttributeSwaps:
    """Caption tokens that may stand in for each other (one BPE token per word, with its leading space). Per
    shared id: ``kind`` (V,) its kind (-1: not an attribute) and ``index`` (V,) its place in the kind; per kind:
    ``members`` (K, M) its ids (padded with 0) and ``sizes`` (K,)."""

    kind: torch.Tensor
    index: torch.Tensor
    members: torch.Tensor
    sizes: torch.Tensor

    @classmethod
    def of(cls, text_codec, layout: Layout, kinds: Sequence[Sequence[str]] = ATTRIBUTE_KINDS) -> "AttributeSwaps | None":
        """From the text codec: each word that encodes as one token after ``"a "``; kinds with fewer than two
        such words are left out. None when no kind is left."""
        prefix = text_codec.encode_one("a").tolist()
        groups = []
        for words in kinds:
            ids = []
            for word in words:
                encoded = text_codec.encode_one(f"a {word}").tolist()
                if len(encoded) == len(prefix) + 1 and encoded[:len(prefix)] == prefix:
                    ids.append(layout.offset("text") + encoded[-1])
            if len(set(ids)) >= 2:
                groups.append(sorted(set(ids)))
        if not groups:
            return None
        kind = torch.full((layout.vocab_size,), -1, dtype=torch.long)
        index = torch.zeros(layout.vocab_size, dtype=torch.long)
        members = torch.zeros(len(groups), max(map(len, groups)), dtype=torch.long)
        for k, ids in enumerate(groups):
            kind[ids], index[ids] = k, torch.arange(len(ids))
            members[k, :len(ids)] = torch.tensor(ids)
        return cls(kind, index, members, torch.tensor([len(g) for g in groups]))

    def to(self, device) -> "AttributeSwaps":
        return AttributeSwaps(self.kind.to(device), self.index.to(device), self.members.to(device),
                              self.sizes.to(device))

    def swap(self, ids: torch.Tensor, free: torch.Tensor, rates: torch.Tensor,
             generator: torch.Generator) -> torch.Tensor:
        """ids (k, L) with each attribute token at a ``free`` slot replaced, with its row's probability
        ``rates`` (k,), by another word of its kind (never itself)."""
        kind = self.kind[ids]  # (k, L)
        pick = free & (kind >= 0) & (_uniform(ids.shape, generator, ids.device) < rates[:, None])
        size = self.sizes[kind.clamp_min(0)]  # (k, L)
        step = 1 + (_uniform(ids.shape, generator, ids.device) * (size - 1)).long()  # in [1, size - 1]
        other = self.members[kind.clamp_min(0), (self.index[ids] + step) % size]  # (k, L)
        return torch.where(pick, other, ids)


@dataclass(frozen=True)
class CriticSpec:
    """How a step trains the critic: ``weight`` of its loss beside the denoising loss; ``share`` of the step's
    rows filled and critiqued; ``swap_rate``: each row swaps up to this share of its codes and attribute words
    (its rate drawn uniformly in [0, swap_rate]); ``code_ranges``: image and audio segment id -> (first id,
    codebook size); ``temperatures``: segment id -> fill temperature; ``attributes``: caption swaps (None: the
    run has no text codec, e.g. it trains from a pack)."""

    vocab: TargetVocab
    code_ranges: dict[int, tuple[int, int]]
    temperatures: dict[int, float]
    weight: float = 0.1
    share: float = 0.25
    swap_rate: float = 0.1
    attributes: AttributeSwaps | None = None
    labels: object | None = None  # critic_labels.DecodedLabels: wrong by decoded content (None: token inequality)

    @classmethod
    def of(cls, layout: Layout, weight: float, share: float, swap_rate: float,
           attributes: AttributeSwaps | None = None, labels=None) -> "CriticSpec":
        ranges = {SEGMENT_IDS[m]: (layout.offset(m), layout.codebook_size(m)) for m in ("image", "audio")}
        temperatures = {SEGMENT_IDS[m]: value for m, value in FILL_TEMPERATURES.items()}
        return cls(TargetVocab.of(layout), ranges, temperatures, weight, share, swap_rate, attributes, labels)

    def to(self, device) -> "CriticSpec":
        return replace(self, vocab=self.vocab.to(device), attributes=self.attributes and self.attributes.to(device))


@dataclass
class CriticDraft:
    """What the critic reads and what it must say: ``ids`` (k, L) the filled rows (MASK where still masked),
    ``t`` (k,) their mask ratios, ``scored`` (k, L) the committed target slots, ``wrong`` (k, L) those that
    differ from the truth."""

    ids: torch.Tensor
    t: torch.Tensor
    scored: torch.Tensor
    wrong: torch.Tensor


def _uniform(shape, generator: torch.Generator, device) -> torch.Tensor:
    """Uniform draws from the step's (CPU) generator, so a step stays a pure function of its seed."""
    return torch.rand(shape, generator=generator).to(device)


def critic_rows(n_rows: int, share: float, generator: torch.Generator) -> torch.Tensor:
    """(k,) sorted indices of the rows the critic trains on: ``share`` of them, at least one."""
    count = max(1, round(n_rows * share))
    return torch.randperm(n_rows, generator=generator)[:count].sort().values


@torch.no_grad()
def draw_fills(head, hidden: torch.Tensor, segment_ids: torch.Tensor, batch: MaskedBatch, spec: CriticSpec,
               generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Each masked slot drawn from the model, over its modality's ids at its temperature (0: argmax). Returns
    the ids (k, L) and the model's probability of each drawn token (k, L; 0 at slots not masked).
    ``head(hidden_rows, vocab_ids) -> logits`` is the model's tied output head; ``hidden`` (k, L, D)."""
    drawn = batch.noisy_ids.clone()
    confidence = torch.zeros(drawn.shape, device=drawn.device)
    for segment, vocab_ids in spec.vocab.ids.items():
        rows, cols = (batch.masked & (segment_ids == segment)).nonzero(as_tuple=True)  # (N,) x2
        if rows.numel() == 0:
            continue
        logits = head(hidden[rows, cols], vocab_ids)  # (N, V_m) float32
        temperature = spec.temperatures[segment]
        if temperature == 0:
            choice = logits.argmax(dim=-1)  # (N,)
        else:
            cdf = (logits / temperature).softmax(dim=-1).cumsum(dim=-1)  # (N, V_m)
            u = _uniform((rows.numel(), 1), generator, cdf.device) * cdf[:, -1:]
            choice = torch.searchsorted(cdf, u).squeeze(1).clamp_max(len(vocab_ids) - 1)  # (N,)
        drawn[rows, cols] = vocab_ids[choice]
        confidence[rows, cols] = logits.softmax(dim=-1).gather(1, choice[:, None]).squeeze(1)
    return drawn, confidence


def still_masked(masked: torch.Tensor, confidence: torch.Tensor, share: torch.Tensor) -> torch.Tensor:
    """(k, L) the masked slots left masked when each row commits its ``share`` (k,) most confident draws."""
    count = (masked.sum(dim=1) * share).round().long()  # (k,)
    order = torch.where(masked, confidence, -1.0).argsort(dim=1, descending=True, stable=True)  # (k, L)
    rank = order.argsort(dim=1)  # (k, L): 0 for the most confident draw of the row
    return masked & (rank >= count[:, None])


def fill_shares(count: int, generator: torch.Generator) -> torch.Tensor:
    """(count,) share of each row's masked slots to commit: 1 (a full fill) for about :data:`FULL_FILL_SHARE`
    of the rows, else uniform in [0, 1)."""
    full = torch.rand(count, generator=generator) < FULL_FILL_SHARE
    return torch.where(full, torch.ones(count), torch.rand(count, generator=generator))


def swap_codes(ids: torch.Tensor, segment_ids: torch.Tensor, free: torch.Tensor, rates: torch.Tensor,
               spec: CriticSpec, generator: torch.Generator) -> torch.Tensor:
    """ids (k, L) with each image or audio code at a ``free`` slot replaced, with its row's probability
    ``rates`` (k,), by another random code of the same codebook (never itself); END and PAD stay."""
    for segment, (low, size) in spec.code_ranges.items():
        codes = free & (segment_ids == segment) & (ids >= low) & (ids < low + size)
        pick = codes & (_uniform(ids.shape, generator, ids.device) < rates[:, None])
        shift = torch.randint(1, size, ids.shape, generator=generator).to(ids.device)
        ids = torch.where(pick, low + (ids - low + shift) % size, ids)
    return ids


def critic_drafts(head, hidden: torch.Tensor, segment_ids: torch.Tensor, batch: MaskedBatch, spec: CriticSpec,
                  generator: torch.Generator) -> tuple[torch.Tensor, CriticDraft]:
    """The rows the critic trains on (k,) and their drafts: model fills, partly committed, plus negatives."""
    rows = critic_rows(batch.noisy_ids.shape[0], spec.share, generator).to(hidden.device)
    sub = MaskedBatch(*(x[rows] for x in (batch.noisy_ids, batch.targets, batch.masked, batch.maskable, batch.t)))
    segments = segment_ids[rows]
    drawn, confidence = draw_fills(head, hidden[rows].detach(), segments, sub, spec, generator)
    left = still_masked(sub.masked, confidence, fill_shares(len(rows), generator).to(hidden.device))
    ids = torch.where(left, torch.full_like(drawn, MASK), drawn)
    free = sub.maskable & ~left  # committed fills and never-masked target slots
    rates = _uniform(len(rows), generator, ids.device) * spec.swap_rate  # (k,)
    ids = swap_codes(ids, segments, free, rates, spec, generator)
    if spec.attributes is not None:
        ids = spec.attributes.swap(ids, free & (segments == SEGMENT_IDS["text"]), rates, generator)
    t = left.sum(dim=1) / sub.maskable.sum(dim=1).clamp_min(1)  # (k,) the draft's own mask ratio
    differs = ids != sub.targets if spec.labels is None else spec.labels.wrong(ids, sub.targets, segments)
    return rows, CriticDraft(ids, t.float(), free, free & differs)


def critic_loss(logits: torch.Tensor, draft: CriticDraft) -> torch.Tensor:
    """Binary cross-entropy of the critic logits (k, L) against ``draft.wrong``, averaged over scored slots."""
    bce = F.binary_cross_entropy_with_logits(logits.float(), draft.wrong.float(), reduction="none")  # (k, L)
    return (bce * draft.scored).sum() / draft.scored.sum().clamp_min(1)


def critic_objective(model, head, hidden: torch.Tensor, batch: MaskedBatch, inputs: Sequence[torch.Tensor],
                     spec: CriticSpec, generator: torch.Generator, unpad: bool = True) -> torch.Tensor:
    """The critic's loss for one step: drafts from the denoising forward's ``hidden`` (rows, L, D), a second
    forward of ``model`` over them (the critic head only, no vocabulary logits), BCE. ``inputs``: the step's
    (segment_ids, positions, is_target, attention_mask) on the device, one row per masked row; ``unpad``: the
    second forward skips the padding slots (the critic scores real slots only)."""
    rows, draft = critic_drafts(head, hidden, inputs[0], batch, spec, generator)
    segment_ids, positions, is_target, attention_mask = (x[rows] for x in inputs)
    out = model(draft.ids, draft.t, segment_ids, positions, is_target, attention_mask, logits=False, critic=True,
                unpad=unpad)
    return critic_loss(out.critic, draft)
