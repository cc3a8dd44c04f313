"""The single training objective: mask target tokens at a random ratio, predict them.

One loss for every modality and every direction: cross-entropy on the masked positions, each counting once
(``flat``, the recipe default: it drew and read better in ``bench recipe`` than ``1 / t``, the ELBO of MDLM and
LLaDA; :data:`WEIGHTINGS` has the alternatives a recipe can choose) and
divided by each sample's real target tokens (:data:`NORMALISERS`).

:func:`sparse_diffusion_loss` is what training runs: logits only at the masked slots, and each slot's only
over the ids its modality may hold (``Layout.allowed_ids``, what the sampler draws from), so an image or
audio slot costs 514 logits instead of the whole shared vocabulary.

The autoregressive twin (``unimodal train --objective ar``), the baseline the diffusion model is measured
against, uses :func:`next_token_loss` instead: the same targets, each predicted from the tokens before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from unimodal.tokenizers_mm.layout import MARKERS, MASK, MODALITIES, NUM_SPECIAL, PAD, SEGMENT_IDS, Layout
from unimodal.training.schedule import MaskSchedule

# Per-token weight of a masked token's cross-entropy at mask ratio t.
# "text-flat": 1 for text targets, 1/t for image and audio codes (reading alone read 2.5x as many captions
# flat as under 1/t, docs/results.md "Reading alone"; a caption's few content words make 1/t's variance worst)
WEIGHTINGS = ("elbo", "clipped", "flat", "text-flat")  # 1/t; 1/max(t, CLIP_RATIO) (bounded variance); 1
CLIP_RATIO = 0.1
# What each sample's weighted sum is divided by: its real target tokens (content and END: a caption of 6 words
# counts 7, not its 33 slots, so short targets get as much gradient per token as in the AR twin), or every
# maskable slot (PAD filler included: the first recipe).
NORMALISERS = ("real", "maskable")


def token_weight(t: torch.Tensor, weighting: str, segment: int | None = None) -> torch.Tensor:
    """(B,) weight of each sample's masked-token cross-entropy, for tokens of segment id ``segment``
    (``SEGMENT_IDS``; only "text-flat" depends on it, and needs it)."""
    if weighting == "text-flat":
        if segment is None:
            raise ValueError("the text-flat weighting depends on the target's modality: give its segment id")
        return token_weight(t, "flat" if segment == SEGMENT_IDS["text"] else "elbo")
    if weighting == "elbo":
        return MaskSchedule.weight(t)
    if weighting == "clipped":
        return 1.0 / t.clamp_min(CLIP_RATIO)
    if weighting == "flat":
        return torch.ones_like(t)
    raise ValueError(f"loss weighting must be one of {WEIGHTINGS}, got {weighting!r}")


@dataclass
class MaskedBatch:
    """What the model sees (``noisy_ids``) and what the loss needs."""

    noisy_ids: torch.Tensor  # (B, L) with MASK at masked positions
    targets: torch.Tensor  # (B, L) the clean ids
    masked: torch.Tensor  # (B, L) bool, positions replaced by MASK
    maskable: torch.Tensor  # (B, L) bool, positions the model may have to generate
    t: torch.Tensor  # (B,) mask ratios


def mask_targets(ids: torch.Tensor, maskable: torch.Tensor, t: torch.Tensor,
                 generator: torch.Generator | None = None) -> MaskedBatch:
    """Replace each maskable token by MASK with probability ``t`` of its sample."""
    draws = torch.rand(ids.shape, generator=generator)  # (B, L)
    masked = maskable & (draws < t[:, None])
    noisy = torch.where(masked, torch.full_like(ids, MASK), ids)
    return MaskedBatch(noisy, ids, masked, maskable, t)


def complementary_masks(ids: torch.Tensor, maskable: torch.Tensor, t: torch.Tensor,
                        generator: torch.Generator | None = None) -> MaskedBatch:
    """Each sample twice (2B rows): masked at ratio ``t`` as :func:`mask_targets` does, then with the
    complementary mask at ratio ``1 - t``, so every target token is predicted exactly once per step. LaViDa
    (2025) introduced it for vision-language diffusion: with one independent mask, the few words that carry a
    caption's content (a colour, a shape) go unmasked, and untrained, about half the time."""
    return complementary_of(mask_targets(ids, maskable, t, generator))


def complementary_of(first: MaskedBatch) -> MaskedBatch:
    """``first``'s rows followed by the same samples masked with the complement of each one's mask."""
    ids, maskable, t = first.targets, first.maskable, first.t
    second = maskable & ~first.masked
    both = torch.cat([first.masked, second])
    ids2 = torch.cat([ids, ids])
    t2 = (1.0 - t).clamp_min(COMPLEMENT_FLOOR)  # what the complement masks in expectation
    return MaskedBatch(torch.where(both, torch.full_like(ids2, MASK), ids2), ids2, both,
                       torch.cat([maskable, maskable]), torch.cat([t, t2]))


def partition_of(first: MaskedBatch, rows: int, generator: torch.Generator | None = None) -> MaskedBatch:
    """``first``'s rows, then the complement of each one's mask split at random into ``rows - 1`` more rows
    (``rows`` x B in all): every target token is still predicted exactly once per step, as with
    :func:`complementary_of` (``rows`` = 2), but more of them with most of their target in view (with 4 rows, in
    expectation 0.56 of them with at least two thirds of it, against 0.11 with one complement). A slot outside
    ``first``'s mask goes to one of the extra rows uniformly at random, so each masks about ``(1 - t) / (rows -
    1)`` of the target. With one complement a caption's content words are mostly predicted in the row that hides
    most of the caption, where a masked slot may hold a colour in one phrasing and a shape in another; the
    partition's rows show the words around each one (a step's condition tokens are computed once however many
    rows, ``DiT.forward(copies=)``)."""
    if rows < 2:
        raise ValueError(f"a partition needs at least 2 rows, got {rows}")
    ids, maskable, t = first.targets, first.maskable, first.t
    rest = maskable & ~first.masked
    part = torch.randint(rows - 1, ids.shape, generator=generator)
    masks = [first.masked] + [rest & (part == k) for k in range(rows - 1)]
    share = ((1.0 - t) / (rows - 1)).clamp_min(COMPLEMENT_FLOOR)  # what each extra row masks in expectation
    ratios = [t] + [share] * (rows - 1)
    both = torch.cat(masks)
    ids_k = ids.repeat(rows, 1)
    return MaskedBatch(torch.where(both, torch.full_like(ids_k, MASK), ids_k), ids_k, both, maskable.repeat(rows, 1),
                       torch.cat(ratios))


COMPLEMENT_FLOOR = 1e-3  # the schedule's smallest ratio (MaskSchedule.min_ratio): bounds the 1/t weight
# One mask per sample at ratio t; the mask and its complement; the mask and its complement split into
# PARTITION_ROWS - 1 rows (partition_of)
MASKINGS = ("independent", "complementary", "partition")
PARTITION_ROWS = 4


def rows_per_sample(masking: str) -> int:
    """How many masked rows a step trains per sample under ``masking`` (:data:`MASKINGS`)."""
    return {"independent": 1, "complementary": 2, "partition": PARTITION_ROWS}[masking]


def suffix_text_masks(batch: MaskedBatch, segment_ids: torch.Tensor, share: float,
                      generator: torch.Generator | None = None) -> MaskedBatch:
    """With probability ``share`` per sample, its text target masked as a suffix instead of at random: the
    first ``floor((1 - t) * n)`` of its ``n`` real text tokens stay visible and every text slot after them
    (the rest of the words, the END, the PAD filler) is masked. That is the state a left-to-right decoder is
    in, where each masked word is predicted from clean words before it, as in the AR twin; the other samples
    keep their random masks, so the model still fills holes anywhere (what critique and edits re-mask).
    Image and audio targets are left as they were. Block and semi-autoregressive diffusion (BD3-LM, 2025)
    train the same prefix-conditioned state."""
    if share <= 0:
        return batch
    text = batch.maskable & (segment_ids == SEGMENT_IDS["text"])  # (B, L)
    real = text & (batch.targets != PAD)
    keep = torch.floor((1.0 - batch.t) * real.sum(dim=1)).long()  # (B,) real text tokens left visible
    rank = torch.cumsum(text.long(), dim=1) - 1  # each text slot's index among its sample's text slots
    suffix = text & (rank >= keep[:, None])
    chosen = (torch.rand(batch.t.shape, generator=generator) < share)[:, None] & text.any(dim=1, keepdim=True)
    masked = torch.where(chosen, (batch.masked & ~text) | suffix, batch.masked)
    noisy = torch.where(masked, torch.full_like(batch.targets, MASK), batch.targets)
    return MaskedBatch(noisy, batch.targets, masked, batch.maskable, batch.t)


@dataclass(frozen=True)
class CaptionSurprisal:
    """How much a caption's word tells that its two neighbours do not: ``-log p(word | the word before, the word
    after)`` in nats, counted over a run's training captions (each as packed, between its BEGIN and END markers).
    The words that set a phrasing ("there is a", "on the", "the picture shows") are ~0 once their neighbours are
    known; the content words (a colour between "small" and "circle", one of the shapes) are not. A triple the
    training captions never held scores ``unseen`` (the highest seen); special ids (END) score 0. What
    :func:`content_first_masks` masks first. ``keys`` (sorted) and ``values``: each seen (before, word, after)
    triple as ``(before * V + after) * V + word`` and its surprisal."""

    keys: torch.Tensor  # (K,) int64, sorted
    values: torch.Tensor  # (K,) float32
    vocab_size: int
    unseen: float

    @classmethod
    def of(cls, layout: Layout, samples) -> "CaptionSurprisal":
        """From ``samples``: dicts of local ids per modality (a run's training set); those without text add nothing."""
        begin, end = MARKERS["text"]
        v = layout.vocab_size
        triples = []
        for sample in samples:
            text = sample.get("text")
            if text is None or not text.numel():
                continue
            words = layout.to_shared("text", text.reshape(-1).long())
            ids = torch.cat([torch.tensor([begin]), words, torch.tensor([end])])
            triples.append((ids[:-2] * v + ids[2:]) * v + ids[1:-1])
        if not triples:
            return cls(torch.zeros(0, dtype=torch.long), torch.zeros(0), v, 0.0)
        keys, counts = torch.unique(torch.cat(triples), return_counts=True)  # sorted
        context, first = torch.unique(keys // v, return_inverse=True)  # (before, after) pairs
        per_context = torch.zeros(context.numel(), dtype=torch.float64).index_add_(0, first, counts.double())
        values = (-torch.log(counts.double() / per_context[first])).clamp_min(0.0).float()
        return cls(keys, values, v, float(values.max()))

    def score(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, L) the surprisal of each slot's id between the ids beside it in ``ids`` (B, L); meaningful at a
        caption's words (other slots get a number the caller ignores), 0 at special ids."""
        out = torch.full(ids.shape, self.unseen, dtype=torch.float32, device=ids.device)
        if self.keys.numel():
            v = self.vocab_size
            before = F.pad(ids[:, :-1], (1, 0), value=PAD).long()
            after = F.pad(ids[:, 1:], (0, 1), value=PAD).long()
            keys = (before * v + after) * v + ids.long()
            seen, values = self.keys.to(ids.device), self.values.to(ids.device)
            where = torch.searchsorted(seen, keys).clamp_max(seen.numel() - 1)
            out = torch.where(seen[where] == keys, values[where], out)
        return out.masked_fill(ids < NUM_SPECIAL, 0.0)


def content_first_masks(batch: MaskedBatch, segment_ids: torch.Tensor, surprisal: CaptionSurprisal,
                        strength: float, generator: torch.Generator | None = None) -> MaskedBatch:
    """The same number of each sample's real caption words masked, but chosen informative first: each word
    scored ``strength`` x its :class:`CaptionSurprisal` (nats) plus Gumbel noise and the highest-scored masked,
    so at a middle ratio the words its neighbours do not give away (a colour, a shape) are hidden and the ones
    that set the phrasing ("there is a", "on the") are in view. A masked content word is then predicted in a
    known phrasing, what the AR twin has after its first words; its complement (:func:`complementary_of`)
    hides the phrasing with the content in view. ``strength`` 0 is the uniform choice; large, a fixed order.
    The PAD filler after END and image and audio targets keep their random masks. DiffusionBERT (2022) orders
    its forward process by token information the same way ("spindle" schedule); here the count masked stays the
    sample's draw at ratio t."""
    if strength <= 0:
        return batch
    text = batch.maskable & (segment_ids == SEGMENT_IDS["text"]) & (batch.targets != PAD)  # (B, L)
    count = (batch.masked & text).sum(dim=1)  # (B,) how many words the draw masked
    uniform = torch.rand(batch.targets.shape, generator=generator).clamp(1e-9, 1 - 1e-9)
    score = strength * surprisal.score(batch.targets) - torch.log(-torch.log(uniform))
    score = torch.where(text, score, torch.full_like(score, float("-inf")))
    rank = torch.argsort(torch.argsort(score, dim=1, descending=True), dim=1)  # each slot's place by score
    chosen = text & (rank < count[:, None])
    masked = (batch.masked & ~text) | chosen
    noisy = torch.where(masked, torch.full_like(batch.targets, MASK), batch.targets)
    return MaskedBatch(noisy, batch.targets, masked, batch.maskable, batch.t)


def normaliser(batch: MaskedBatch, normalise: str) -> torch.Tensor:
    """(B,) what each sample's weighted cross-entropy sum is divided by (see :data:`NORMALISERS`)."""
    if normalise == "real":
        return (batch.maskable & (batch.targets != PAD)).sum(dim=1).clamp_min(1)
    if normalise == "maskable":
        return batch.maskable.sum(dim=1).clamp_min(1)
    raise ValueError(f"loss normalisation must be one of {NORMALISERS}, got {normalise!r}")


def masked_diffusion_loss(logits: torch.Tensor, batch: MaskedBatch, weighting: str = "elbo",
                          normalise: str = "maskable", segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sample sum over masked positions of CE x weight(t), divided by the sample's normaliser; mean over
    the batch. ``logits`` (B, L, V) over the whole vocabulary (the reference form of the sparse loss);
    ``segment_ids`` (B, L): each slot's modality, needed by a weighting that depends on it ("text-flat")."""
    ce = F.cross_entropy(logits.float().transpose(1, 2), batch.targets, reduction="none")  # (B, L)
    if segment_ids is None:
        weights = token_weight(batch.t, weighting)[:, None]  # (B, 1)
    else:
        weights = torch.zeros_like(ce)
        for segment in SEGMENT_IDS.values():
            weights = torch.where(segment_ids == segment, token_weight(batch.t, weighting, segment)[:, None], weights)
    per_sample = (ce * batch.masked * weights).sum(dim=1)  # (B,)
    return (per_sample / normaliser(batch, normalise)).mean()


@dataclass(frozen=True)
class TargetVocab:
    """Per segment id, the ids its slots may hold (``ids``, from ``Layout.allowed_ids``) and each shared id's
    index among them (``index``: (V,), -1 where the modality cannot hold the id)."""

    ids: dict[int, torch.Tensor]
    index: dict[int, torch.Tensor]

    @classmethod
    def of(cls, layout: Layout) -> "TargetVocab":
        ids, index = {}, {}
        for modality in MODALITIES:
            allowed = layout.allowed_ids(modality)
            ids[SEGMENT_IDS[modality]] = allowed.nonzero().squeeze(1)  # (V_m,)
            index[SEGMENT_IDS[modality]] = torch.full((layout.vocab_size,), -1, dtype=torch.long)
            index[SEGMENT_IDS[modality]][allowed] = torch.arange(int(allowed.sum()))
        return cls(ids, index)

    def to(self, device) -> "TargetVocab":
        return TargetVocab({k: v.to(device) for k, v in self.ids.items()},
                           {k: v.to(device) for k, v in self.index.items()})


@dataclass(frozen=True)
class LossSpec:
    """How a step's diffusion loss is computed: the recipe's weighting and normalisation, and ``vocab`` for the
    sparse head (None: logits over the whole vocabulary at every position, the reference form). ``critic``: the
    learned critic's objective added to the step (``unimodal.training.critic.CriticSpec``; None: the critic head
    takes no part)."""

    vocab: TargetVocab | None = None
    weighting: str = "elbo"
    normalise: str = "real"
    masking: str = "independent"  # MASKINGS
    critic: object | None = None  # CriticSpec (critic.py imports this module, so it is not named here)
    critic_only: bool = False  # the critic's loss alone, the model frozen: the denoising forward only fills drafts
    # The forward's per-token layers run on the real tokens alone (unimodal.backbone.dit.Packing): the same
    # values with less work on padded batches (False: every padding slot too, the form before it)
    unpad: bool = True
    suffix_share: float = 0.0  # of the samples, those whose text target is masked as a suffix (suffix_text_masks)
    # Caption words masked informative first (content_first_masks): its strength per nat (0: off) and the
    # training captions' CaptionSurprisal it reads
    content_first: float = 0.0
    surprisal: CaptionSurprisal | None = None

    def __post_init__(self):
        if not (math.isfinite(self.content_first) and self.content_first >= 0):
            raise ValueError(f"content_first must be a finite number >= 0, got {self.content_first!r}")
        if self.content_first > 0 and self.surprisal is None:
            raise ValueError("content-first masking needs the training captions' CaptionSurprisal")
        if not 0 <= self.suffix_share <= 1:
            raise ValueError(f"suffix_share must lie in [0, 1], got {self.suffix_share!r}")
        if self.masking not in MASKINGS:
            raise ValueError(f"masking must be one of {MASKINGS}, got {self.masking!r}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"loss weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if self.normalise not in NORMALISERS:
            raise ValueError(f"loss normalisation must be one of {NORMALISERS}, got {self.normalise!r}")

    def to(self, device) -> "LossSpec":
        # the surprisal stays where it is: masking runs where the batch is built (the CPU), before the rows move
        return replace(self, vocab=self.vocab and self.vocab.to(device),
                       critic=self.critic and self.critic.to(device))

    def mask(self, ids: torch.Tensor, maskable: torch.Tensor, t: torch.Tensor,
             generator: torch.Generator | None = None, segment_ids: torch.Tensor | None = None) -> MaskedBatch:
        """The step's masked rows: B of them, 2B with complementary masking (the complement of a suffix-masked
        text is its prefix), ``PARTITION_ROWS`` x B with a partition. ``segment_ids`` (B, L): needed when
        ``suffix_share`` or ``content_first`` > 0."""
        first = mask_targets(ids, maskable, t, generator)
        if self.content_first > 0:
            if segment_ids is None:
                raise ValueError("content-first masking needs each slot's segment id to find the text targets")
            first = content_first_masks(first, segment_ids, self.surprisal, self.content_first, generator)
        if self.suffix_share > 0:
            if segment_ids is None:
                raise ValueError("suffix masking needs each slot's segment id to find the text targets")
            first = suffix_text_masks(first, segment_ids, self.suffix_share, generator)
        if self.masking == "partition":
            return partition_of(first, PARTITION_ROWS, generator)
        return complementary_of(first) if self.masking == "complementary" else first


def sparse_diffusion_loss(head, hidden: torch.Tensor, segment_ids: torch.Tensor, batch: MaskedBatch,
                          vocab: TargetVocab, weighting: str = "elbo",
                          normalise: str = "real") -> tuple[torch.Tensor, torch.Tensor]:
    """The diffusion loss from final hidden states (B, L, D): logits only at masked slots, over their
    modality's ids (``head(hidden_rows, vocab_ids) -> logits``, the model's tied output head).

    Returns (loss, masked-token accuracy). Equals :func:`masked_diffusion_loss` on logits restricted to each
    slot's allowed ids (the distribution the sampler draws from)."""
    per_sample = torch.zeros(hidden.shape[0], device=hidden.device)  # (B,)
    right, count = hidden.new_zeros((), dtype=torch.float32), 0
    for segment, vocab_ids in vocab.ids.items():
        rows, cols = (batch.masked & (segment_ids == segment)).nonzero(as_tuple=True)  # (N,) x2
        if rows.numel() == 0:
            continue
        logits = head(hidden[rows, cols], vocab_ids)  # (N, V_m)
        local = vocab.index[segment][batch.targets[rows, cols]]  # (N,)
        ce = F.cross_entropy(logits, local, reduction="none")  # (N,) float32
        per_sample = per_sample.index_add(0, rows, ce * token_weight(batch.t, weighting, segment)[rows])
        right = right + (logits.argmax(dim=-1) == local).sum()
        count += rows.numel()
    return (per_sample / normaliser(batch, normalise)).mean(), right / max(count, 1)


def masked_token_accuracy(logits: torch.Tensor, batch: MaskedBatch) -> torch.Tensor:
    """Fraction of masked positions whose argmax is the clean token (a readable training signal)."""
    right = (logits.argmax(dim=-1) == batch.targets) & batch.masked
    return right.sum() / batch.masked.sum().clamp_min(1)


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor, predict: torch.Tensor) -> torch.Tensor:
    """Autoregressive loss: token ``i`` is predicted from the logits at ``i - 1``, for the positions ``predict``
    (B, L) bool (the target slots). Cross-entropy averaged over each sample's predicted tokens, then over the
    batch, so every sample weighs the same as in :func:`masked_diffusion_loss`."""
    ce = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")  # (B, L-1)
    chosen = predict[:, 1:].to(ce.dtype)
    return ((ce * chosen).sum(dim=1) / chosen.sum(dim=1).clamp_min(1)).mean()


def next_token_accuracy(logits: torch.Tensor, ids: torch.Tensor, predict: torch.Tensor) -> torch.Tensor:
    """Fraction of predicted positions whose argmax (at the position before) is the right token."""
    right = (logits[:, :-1].argmax(dim=-1) == ids[:, 1:]) & predict[:, 1:]
    return right.sum() / predict[:, 1:].sum().clamp_min(1)
