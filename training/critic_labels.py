"""What counts as a wrong code: the decoded content differs beyond a threshold, not the code id.

Two image codes (or audio codes) may differ and still decode to the same patch: the codec spends many codes on a
background's shade or a colour's jitter. Token inequality calls every such code wrong, so a critic trained on it
learns to flag codes a person could not tell apart, and a benchmark scored on it counts them as mistakes. Here a
draft's code is wrong when what the draft decodes to differs, where that code sits, from what the real codes
decode to:

* image: the draft's codes and the real ones are decoded by the image codec (the draft's codes at the judged
  slots, the real ones elsewhere); a code's distance is the mean absolute difference of the two pictures over its
  patch, in [0, 1] pixel units (1 = black against white);
* audio: the same through the audio codec's decoder to log-mel; a code's distance is the mean absolute difference
  of the log-mels over its frames, in units of the codec's mel standard deviation. A code where the other holds an
  END or PAD (the draft ends early or late) is wrong whatever it decodes to.

The decoder's receptive field spans a few codes, so a right code next to a wrong one can see some of its
neighbour's difference: the label is about the content at that place, which is what a person sees and what
``refine`` should re-mask. Thresholds (:data:`IMAGE_THRESHOLD`, :data:`AUDIO_THRESHOLD`) were chosen from the
distances of the shipped model's own regenerated codes (docs/critique.md, "Wrong by decoded content").
"""

from __future__ import annotations

import torch

from unimodal.core.wrong import AUDIO_THRESHOLD, IMAGE_THRESHOLD
from unimodal.tokenizers_mm.layout import SEGMENT_IDS, Layout

DECODED_MODALITIES = ("image", "audio")


@torch.no_grad()
def image_code_distance(model, truth: torch.Tensor, draft: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(B, n) local code ids, real and drafted (n = grid cells, raster order) -> (B, n) distance per code:
    mean absolute pixel difference over its patch, in [0, 1] units. ``model``: the image codec's ImageVQModel."""
    both = torch.cat([truth, draft]).to(model.device)
    pixels = model.decode_indices(both, grid).float().clamp(-1, 1)  # (2B, 3, H, W) in [-1, 1]
    real, drawn = pixels.chunk(2)
    diff = (real - drawn).abs().mean(dim=1) / 2  # (B, H, W) in [0, 1]
    h, w = grid
    patch_h, patch_w = diff.shape[1] // h, diff.shape[2] // w
    per_code = diff.reshape(diff.shape[0], h, patch_h, w, patch_w).mean(dim=(2, 4))  # (B, h, w)
    return per_code.reshape(diff.shape[0], h * w).cpu()


@torch.no_grad()
def audio_code_distance(model, truth: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """(B, n) local code ids -> (B, n) distance per code: mean absolute log-mel difference over its frames, in
    units of the codec's mel standard deviation. ``model``: the audio codec's AudioVQModel."""
    both = torch.cat([truth, draft]).to(model.device)
    mel = model.decode_indices(both).float()  # (2B, n_mels, n * frames)
    real, drawn = mel.chunk(2)
    diff = (real - drawn).abs().mean(dim=1) / float(model.config.mel_std)  # (B, n * frames)
    return diff.reshape(diff.shape[0], truth.shape[1], -1).mean(dim=2).cpu()


class DecodedLabels:
    """Per-token "wrong" for critic drafts: token inequality for captions, decoded distance beyond a threshold
    for image and audio codes (the module's doc). ``image_model`` / ``audio_model``: the codecs' VQ models (None:
    that modality falls back to token inequality)."""

    def __init__(self, layout: Layout, image_model=None, audio_model=None,
                 image_threshold: float = IMAGE_THRESHOLD, audio_threshold: float = AUDIO_THRESHOLD):
        self.layout = layout
        self.models = {"image": image_model, "audio": audio_model}
        self.thresholds = {"image": image_threshold, "audio": audio_threshold}

    @classmethod
    def of(cls, stack) -> "DecodedLabels":
        """From a training run's CodecStack (``unimodal.training.tokens``)."""
        return cls(stack.layout, stack.image.model, stack.audio.model)

    def distance(self, modality: str, truth: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        """(B, n) local ids -> (B, n) decoded distance per code (the modality's units)."""
        model = self.models[modality]
        if modality == "image":
            return image_code_distance(model, truth, draft, tuple(self.layout.image_grid))
        return audio_code_distance(model, truth, draft)

    def wrong(self, ids: torch.Tensor, targets: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
        """(k, L) shared ids of drafts and the truth, segment ids -> (k, L) bool: wrong by decoded content at
        image and audio code slots (their other slots, and every other segment: by token inequality)."""
        wrong = ids != targets
        for modality in DECODED_MODALITIES:
            if self.models[modality] is None:
                continue
            low, size = self.layout.offset(modality), self.layout.codebook_size(modality)
            segment = segment_ids == SEGMENT_IDS[modality]
            both = segment & (targets >= low) & (targets < low + size) & (ids >= low) & (ids < low + size)
            rows = both.any(dim=1).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            slots = segment[rows] & (targets[rows] >= low) & (targets[rows] < low + size)  # real code slots
            counts = slots.sum(dim=1)
            cells = self.layout.image_grid[0] * self.layout.image_grid[1]
            if modality == "image" and bool((counts != cells).any()):
                continue  # not a whole picture (a truncated row): keep token inequality
            width = int(counts.max())
            truth = torch.zeros(len(rows), width, dtype=torch.long)
            draft = torch.zeros(len(rows), width, dtype=torch.long)
            keep = torch.zeros(len(rows), width, dtype=torch.bool)
            for r, row in enumerate(rows.tolist()):
                cols = slots[r].nonzero().squeeze(1)
                real = targets[row, cols] - low
                drawn = ids[row, cols] - low
                is_code = (drawn >= 0) & (drawn < size)
                truth[r, :len(cols)] = real.cpu()
                draft[r, :len(cols)] = torch.where(is_code, drawn, real).cpu()  # a non-code: decode the real one
                keep[r, :len(cols)] = is_code.cpu()
            far = self.distance(modality, truth, draft) > self.thresholds[modality]  # (R, width)
            for r, row in enumerate(rows.tolist()):
                cols = slots[r].nonzero().squeeze(1)
                n = len(cols)
                decided = keep[r, :n].to(wrong.device)
                wrong[row, cols] = torch.where(decided, far[r, :n].to(wrong.device), wrong[row, cols])
        return wrong


__all__ = ["AUDIO_THRESHOLD", "DecodedLabels", "IMAGE_THRESHOLD", "audio_code_distance", "image_code_distance"]
