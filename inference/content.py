"""The ``content`` critic: how likely the model thinks a code's *content* is right, not its id.

The confidence score is the model's probability of the committed code when it is re-masked. An image or audio
codec spends many codes on what a person cannot tell apart (a background's shade, a vowel's jitter), so a code
the model finds unlikely as an id can still be one whose content the model expects: its probability is spread
over codes that all decode alike. Scored that way, confidence calls right content wrong (on the shipped model,
AUROC at finding codes wrong by decoded content: pictures 0.61, speech 0.65).

This critic scores a code by the model's probability mass on the codes that decode like it: for pictures within
the threshold that defines a wrong code (:mod:`unimodal.core.wrong`: 0.05 of the pixel range over the code's
patch), the model's probability that the content there is right by the definition the critic's labels and
benchmarks use; for speech within a stricter 0.3 mel standard deviations over the code's frames
(:data:`~unimodal.core.wrong.AUDIO_ALIKE`; a wrong code differs by more than 0.5), since mass on codes that sound
nearly but not quite alike is the model's doubt, not agreement (chosen on validation clips; docs/critique.md, "A
stricter ear for the speech critic"). Captions are scored as by confidence (a word is its content).

- speech, in context: each of the position's likeliest codes (those holding at least ``min_p``, at most
  ``top_k``) is substituted into the draft and decoded with the codes around it, out to the decoder's reach
  (:data:`AUDIO_HALF_WINDOW` codes each side: the same frames as decoding the whole clip), and compared with
  the committed code's decoding over the position's frames;
- pictures, by a table: the image decoder is too costly to run per alternative (about 70 ms a picture on one
  CPU thread, and its normalisation and attention make small windows inexact), so two codes are alike when
  their decoded textures (each code tiled over a 4x4 grid, the centre compared) differ by less than the
  threshold; the table is decoded once per critic (512 small pictures).
"""

from __future__ import annotations

import torch

from unimodal.core.errors import InputError
from unimodal.core.wrong import AUDIO_ALIKE, IMAGE_THRESHOLD

DEFAULT_TOP_K = 32  # speech: at most this many alternatives decoded per position
DEFAULT_MIN_P = 0.005  # ... and only those the model gives at least this probability (the rest count as unlike)
AUDIO_HALF_WINDOW = 13  # codes each side decoded with a speech position: the shipped decoder's reach, exact
IMAGE_TILE = 4  # a code tiled over a 4x4 grid for the table; its centre 2x2 cells are compared
BATCH = 256  # windows decoded at once


class ContentCritic:
    """``critic="content"`` bound to the codecs' VQ models (``decode_indices``); ``image_model`` /
    ``audio_model`` None scores that modality by confidence."""

    def __init__(self, image_model=None, audio_model=None, top_k: int = DEFAULT_TOP_K, min_p: float = DEFAULT_MIN_P,
                 image_threshold: float = IMAGE_THRESHOLD, audio_threshold: float = AUDIO_ALIKE,
                 with_head: bool = False):
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1 or not 0 <= min_p < 1:
            raise InputError(f"the content critic needs top_k an int >= 1 and min_p in [0, 1), got {top_k!r} and "
                             f"{min_p!r}")
        self.image_model, self.audio_model, self.top_k, self.min_p = image_model, audio_model, top_k, min_p
        # ``critic="content+learned"``: each picture and speech code's content score times the learned head's (a
        # code counts as right when both say so; one more model call); captions keep the content (confidence) score
        self.with_head = bool(with_head)
        self.name = "content+learned" if self.with_head else "content"
        self.thresholds = {"image": image_threshold, "audio": audio_threshold}
        self._image_alike = None  # (K, K) bool, decoded on first use

    @torch.no_grad()
    def near_mass(self, modality: str, own: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """(n,) local ids committed, (n, K) the model's probabilities over the modality's codes at each position
        (re-masked) -> (n,) the mass of the codes that decode like the committed one there."""
        own = own.long()
        own_p = probs.gather(1, own[:, None])[:, 0]
        if modality == "image" and self.image_model is not None and len(own):
            return (probs * self.image_alike(probs.shape[1])[own].to(probs.dtype)).sum(1).clamp(max=1.0)
        if modality == "audio" and self.audio_model is not None and len(own):
            return (own_p + self._audio_alike_mass(own, probs)).clamp(max=1.0)
        return own_p

    def image_alike(self, size: int) -> torch.Tensor:
        """(K, K) bool for the ``size`` codes: codes whose decoded textures differ by at most the image threshold
        (the diagonal true)."""
        if self._image_alike is None or len(self._image_alike) != size:
            model = self.image_model
            codes = torch.arange(size)[:, None].expand(-1, IMAGE_TILE * IMAGE_TILE)
            pixels = _decode(lambda ids: model.decode_indices(ids, (IMAGE_TILE, IMAGE_TILE)).float().clamp(-1, 1),
                             codes, model.device)  # (K, 3, H, W)
            h, w = pixels.shape[2], pixels.shape[3]
            centre = pixels[:, :, h // 4: 3 * h // 4, w // 4: 3 * w // 4].reshape(size, -1)
            distance = torch.cdist(centre, centre, p=1) / centre.shape[1] / 2  # mean |difference|, [0, 1] units
            self._image_alike = distance <= self.thresholds["image"]
        return self._image_alike

    def _audio_alike_mass(self, own: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """(n,) the mass of the other likely codes that decode, in the draft's context, like the committed one."""
        model, n = self.audio_model, len(own)
        top_p, top_i = probs.topk(min(self.top_k, probs.shape[1]), dim=1)  # (n, k)
        pairs = ((top_p >= self.min_p) & (top_i != own[:, None])).nonzero()  # (P, 2): position, rank
        mass = torch.zeros(n, dtype=probs.dtype)
        if not len(pairs):
            return mass
        at_pos, alternatives, pair_p = pairs[:, 0], top_i[pairs[:, 0], pairs[:, 1]], top_p[pairs[:, 0], pairs[:, 1]]
        start, at = _windows(n, AUDIO_HALF_WINDOW)
        width = min(2 * AUDIO_HALF_WINDOW + 1, n)
        window = own[start[:, None] + torch.arange(width)[None, :]]  # (n, w): each position's window
        swapped = window[at_pos].clone()  # (P, w)
        swapped[torch.arange(len(pairs)), at[at_pos]] = alternatives
        decode = model.decode_indices
        ref = _take_frames(_decode(decode, window, model.device), at, width)  # (n, M, f)
        alt = _take_frames(_decode(decode, swapped, model.device), at[at_pos], width)  # (P, M, f)
        distance = (alt - ref[at_pos]).abs().mean(dim=(1, 2)) / float(model.config.mel_std)  # (P,)
        alike = distance <= self.thresholds["audio"]
        return mass.index_add_(0, at_pos[alike], pair_p[alike])


def _windows(n: int, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Start of each position's window of ``2 * half + 1`` codes (fewer if ``n`` is smaller), shifted to stay
    inside ``[0, n)``, and the position's offset in it."""
    width = min(2 * half + 1, n)
    start = (torch.arange(n) - half).clamp(min=0).clamp(max=n - width)
    return start, torch.arange(n) - start


def _take_frames(mel: torch.Tensor, at: torch.Tensor, width: int) -> torch.Tensor:
    """(B, M, width * f) decoded windows -> (B, M, f): the frames of the code at offset ``at`` of each."""
    frames = mel.shape[2] // width
    index = at[:, None] * frames + torch.arange(frames)[None, :]  # (B, f)
    return mel.gather(2, index[:, None, :].expand(-1, mel.shape[1], -1))


def _decode(decode, ids: torch.Tensor, device) -> torch.Tensor:
    return torch.cat([decode(chunk.to(device)).float().cpu() for chunk in ids.split(BATCH)])


__all__ = ["ContentCritic", "DEFAULT_MIN_P", "DEFAULT_TOP_K"]
