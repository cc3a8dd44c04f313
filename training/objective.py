"""The single training objective: mask target tokens at a random ratio, predict them.

One loss for every modality and every direction: cross-entropy on the masked positions, weighted by
``1 / t`` and averaged over each sample's maskable positions (a per-token ELBO, as in MDLM and LLaDA).

The autoregressive twin (``unimodal train --objective ar``), the baseline the diffusion model is measured
against, uses :func:`next_token_loss` instead: the same targets, each predicted from the tokens before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tokenizers_mm.layout import MASK
from training.schedule import MaskSchedule


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


def masked_diffusion_loss(logits: torch.Tensor, batch: MaskedBatch) -> torch.Tensor:
    """Per-sample ELBO: sum over masked positions of CE / t, divided by the sample's maskable count; mean over
    the batch. ``logits`` (B, L, V)."""
    ce = F.cross_entropy(logits.float().transpose(1, 2), batch.targets, reduction="none")  # (B, L)
    per_sample = (ce * batch.masked).sum(dim=1) * MaskSchedule.weight(batch.t)  # (B,)
    return (per_sample / batch.maskable.sum(dim=1).clamp_min(1)).mean()


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
