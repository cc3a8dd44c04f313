"""The ``content`` critic: how likely the model thinks a code's *content* is right, not its id.

The confidence score is the model's probability of the committed code when it is re-masked. An image or audio
codec spends many codes on what a person cannot tell apart (a background's shade, a vowel's jitter), so a code
the model finds unlikely as an id can still be one whose content the model expects: its probability is spread
over codes that all decode alike. Scored that way, confidence calls right content wrong (on the shipped model,
AUROC at finding codes wrong by decoded content: pictures 0.61, speech 0.65).

This critic scores a code by the probability mass of the codes that would decode like it *where it stands*:
for each position, the model's ``top_k`` most likely codes are substituted one at a time into a window of the
draft around that position, decoded by the codec, and compared with the committed code's decoding over the
position's own patch (pictures) or frames (speech). The mass of those within the threshold that defines a
wrong code (:mod:`unimodal.training.critic_labels`: 0.05 of the pixel range, 0.5 mel standard deviations),
plus the committed code's own probability, is the score: the model's probability that the content here is
right, by the same definition the critic's labels and benchmarks use. Captions are scored as by confidence
(a word is its content). The cost over confidence is decoding ``top_k`` small windows per position, batched.
"""

from __future__ import annotations

import torch

from unimodal.training.critic_labels import AUDIO_THRESHOLD, IMAGE_THRESHOLD

DEFAULT_TOP_K = 32  # alternatives checked per position: on the shipped model they hold most of the mass
AUDIO_HALF_WINDOW = 4  # codes each side of a speech position decoded with it (the decoder's reach)
IMAGE_HALF_WINDOW = 1  # cells each side of a picture position: a 3x3 window of codes
BATCH = 512  # windows decoded at once


class ContentCritic:
    """``critic="content"`` bound to the codecs' VQ models (``decode_indices``). ``image_model`` /
    ``audio_model``: None scores that modality by confidence."""

    name = "content"

    def __init__(self, image_model=None, audio_model=None, top_k: int = DEFAULT_TOP_K,
                 image_threshold: float = IMAGE_THRESHOLD, audio_threshold: float = AUDIO_THRESHOLD):
        self.image_model, self.audio_model, self.top_k = image_model, audio_model, top_k
        self.thresholds = {"image": image_threshold, "audio": audio_threshold}

    @torch.no_grad()
    def near_mass(self, modality: str, own: torch.Tensor, probs: torch.Tensor, grid: tuple[int, int] | None = None
                  ) -> torch.Tensor:
        """(n,) local ids committed, (n, K) the model's probabilities over the modality's codes at each position
        (re-masked) -> (n,) mass of the codes that decode like the committed one there."""
        own_p = probs.gather(1, own[:, None].long())[:, 0]
        model = self.image_model if modality == "image" else self.audio_model if modality == "audio" else None
        if model is None or not len(own):
            return own_p
        top_p, top_i = probs.topk(min(self.top_k, probs.shape[1]), dim=1)  # (n, k)
        if modality == "image":
            distance = _image_distances(model, own, top_i, grid)
        else:
            distance = _audio_distances(model, own, top_i)
        near = (distance < self.thresholds[modality]) & (top_i != own[:, None])  # the own code counted once
        return (own_p + (top_p * near).sum(1)).clamp(max=1.0)


def _windows(n: int, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Start of each position's window of ``2 * half + 1`` (fewer if ``n`` is smaller), shifted to stay inside
    ``[0, n)``, and the position's offset in it."""
    width = min(2 * half + 1, n)
    start = (torch.arange(n) - half).clamp(min=0).clamp(max=n - width)
    return start, torch.arange(n) - start


def _audio_distances(model, own: torch.Tensor, alternatives: torch.Tensor) -> torch.Tensor:
    """(n,) committed codes, (n, k) alternatives -> (n, k) mean |log-mel difference| over the position's frames,
    in mel standard deviations, each alternative decoded in its window of the committed codes."""
    n, k = alternatives.shape
    start, at = _windows(n, AUDIO_HALF_WINDOW)
    width = min(2 * AUDIO_HALF_WINDOW + 1, n)
    window = own[start[:, None] + torch.arange(width)[None, :]]  # (n, w)
    swapped = window[:, None, :].repeat(1, k, 1)  # (n, k, w)
    swapped[torch.arange(n)[:, None], torch.arange(k)[None, :], at[:, None]] = alternatives
    ref = _decode(model.decode_indices, window, model.device)  # (n, M, w * f)
    alt = _decode(model.decode_indices, swapped.reshape(n * k, width), model.device)  # (n k, M, w * f)
    frames = ref.shape[2] // width
    ref = _take_frames(ref, at, frames)  # (n, M, f)
    alt = _take_frames(alt, at.repeat_interleave(k), frames).reshape(n, k, *ref.shape[1:])
    return (alt - ref[:, None]).abs().mean(dim=(2, 3)) / float(model.config.mel_std)


def _take_frames(mel: torch.Tensor, at: torch.Tensor, frames: int) -> torch.Tensor:
    index = (at[:, None] * frames + torch.arange(frames)[None, :])  # (B, f)
    return mel.gather(2, index[:, None, :].expand(-1, mel.shape[1], -1))


def _image_distances(model, own: torch.Tensor, alternatives: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(h*w,) committed codes (raster order), (h*w, k) alternatives -> (h*w, k) mean |pixel difference| over the
    position's patch, in [0, 1] units, each alternative decoded in its window of the committed codes."""
    rows, cols = grid
    n, k = alternatives.shape
    cells = own.reshape(rows, cols)
    row_start, row_at = _windows(rows, IMAGE_HALF_WINDOW)
    col_start, col_at = _windows(cols, IMAGE_HALF_WINDOW)
    height, width = min(2 * IMAGE_HALF_WINDOW + 1, rows), min(2 * IMAGE_HALF_WINDOW + 1, cols)
    r, c = torch.arange(n) // cols, torch.arange(n) % cols
    ri = row_start[r][:, None] + torch.arange(height)[None, :]  # (n, hh)
    ci = col_start[c][:, None] + torch.arange(width)[None, :]  # (n, ww)
    window = cells[ri[:, :, None], ci[:, None, :]]  # (n, hh, ww)
    swapped = window[:, None].repeat(1, k, 1, 1)  # (n, k, hh, ww)
    swapped[torch.arange(n)[:, None], torch.arange(k)[None, :], row_at[r][:, None], col_at[c][:, None]] = alternatives
    decode = lambda ids: model.decode_indices(ids, (height, width)).float().clamp(-1, 1)  # noqa: E731
    ref = _decode(decode, window.reshape(n, height * width), model.device)  # (n, 3, H, W)
    alt = _decode(decode, swapped.reshape(n * k, height * width), model.device)
    patch_h, patch_w = ref.shape[2] // height, ref.shape[3] // width

    def patch(pixels, rr, cc):  # each window's own position's patch
        ys = (rr * patch_h)[:, None] + torch.arange(patch_h)[None, :]  # (B, ph)
        xs = (cc * patch_w)[:, None] + torch.arange(patch_w)[None, :]  # (B, pw)
        b = torch.arange(pixels.shape[0])[:, None, None]
        return pixels.permute(0, 2, 3, 1)[b, ys[:, :, None], xs[:, None, :]]  # (B, ph, pw, 3)

    ref = patch(ref, row_at[r], col_at[c])
    alt = patch(alt, row_at[r].repeat_interleave(k), col_at[c].repeat_interleave(k)).reshape(n, k, *ref.shape[1:])
    return (alt - ref[:, None]).abs().mean(dim=(2, 3, 4)) / 2


def _decode(decode, ids: torch.Tensor, device) -> torch.Tensor:
    return torch.cat([decode(chunk.to(device)).float().cpu() for chunk in ids.split(BATCH)])


__all__ = ["ContentCritic", "DEFAULT_TOP_K"]
