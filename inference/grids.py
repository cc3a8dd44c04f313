"""Picture grids of generated samples, for people: each cell shows the input, the output and the verdict.

Images are drawn as they are (upscaled, nearest neighbour, so codes stay visible), text as wrapped words,
audio as a log-magnitude spectrogram. A green or red bar under each cell says what the judge decided.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

PANEL = 96  # pixels per side of one panel
CAPTION_LINES = 3
LINE = 11
COLUMNS = 4
GOOD, BAD, UNKNOWN = (60, 170, 80), (200, 60, 60), (150, 150, 150)


def image_panel(image) -> Image.Image:
    return Image.fromarray(np.asarray(image, np.uint8)).convert("RGB").resize((PANEL, PANEL), Image.NEAREST)


def text_panel(text: str | None) -> Image.Image:
    panel = Image.new("RGB", (PANEL, PANEL), (250, 250, 245))
    lines = textwrap.wrap(text or "(empty)", width=15)[: PANEL // LINE]
    ImageDraw.Draw(panel).multiline_text((3, 2), "\n".join(lines), fill=(20, 20, 20), spacing=1)
    return panel


def audio_panel(audio, n_fft: int = 256, hop: int = 128) -> Image.Image:
    """Log-magnitude spectrogram (low frequencies at the bottom), time stretched to the panel."""
    clip = np.asarray(audio if audio is not None else [], np.float32)
    if clip.size < n_fft:
        return text_panel("(no audio)")
    frames = np.lib.stride_tricks.sliding_window_view(clip, n_fft)[::hop] * np.hanning(n_fft)
    power = np.log1p(np.abs(np.fft.rfft(frames, axis=1)) * 10).T[::-1]  # (freq, time)
    scaled = (255 * power / max(power.max(), 1e-6)).astype(np.uint8)
    heat = np.stack([scaled, (scaled * 0.6).astype(np.uint8), 255 - scaled], axis=-1)
    return Image.fromarray(heat).resize((PANEL, PANEL), Image.BILINEAR)


def panel(modality: str, value) -> Image.Image:
    return {"image": image_panel, "text": text_panel, "audio": audio_panel}[modality](value)


def _verdict(score: dict) -> tuple[int, int, int]:
    value = score.get("correct", score.get("consistent"))
    return UNKNOWN if value is None else (GOOD if value else BAD)


def _cell(direction: str, case, result, score: dict) -> Image.Image:
    if direction == "joint":
        panels = [panel("text", result.text), panel("image", result.image), panel("audio", result.audio)]
        words = f"heard: {score.get('transcript') or ''}"
    else:
        condition, target = direction.split("->")
        inputs = {"text": case.text, "image": case.image, "audio": case.audio}
        outputs = {"text": result.text, "image": result.image, "audio": result.audio}
        panels = [panel(condition, inputs[condition]), panel(target, outputs[target])]
        heard = score.get("transcript")
        words = (case.text or "") + (f" | heard: {heard}" if heard is not None else "")
    width = len(panels) * PANEL + (len(panels) - 1) * 4
    cell = Image.new("RGB", (width, PANEL + 6 + CAPTION_LINES * LINE), (255, 255, 255))
    for i, picture in enumerate(panels):
        cell.paste(picture, (i * (PANEL + 4), 0))
    ImageDraw.Draw(cell).rectangle([0, PANEL + 1, width, PANEL + 4], fill=_verdict(score))
    lines = textwrap.wrap(words, width=width // 6)[:CAPTION_LINES]
    ImageDraw.Draw(cell).multiline_text((1, PANEL + 6), "\n".join(lines), fill=(30, 30, 30), spacing=1)
    return cell


def sample_grid(direction: str, cases: Sequence, results: Sequence, scores: Sequence[dict], path: str | Path) -> Path:
    """A PNG of up to ``len(results)`` cells, ``COLUMNS`` per row, titled with the direction."""
    cells = [_cell(direction, c, r, s) for c, r, s in zip(cases, results, scores)]
    if not cells:
        cells = [text_panel("no samples")]
    width, height = cells[0].size
    rows = -(-len(cells) // COLUMNS)
    title = 16
    grid = Image.new("RGB", (COLUMNS * (width + 8), title + rows * (height + 8)), (255, 255, 255))
    ImageDraw.Draw(grid).text((4, 2), f"{direction}  (green: judged right, red: wrong)", fill=(0, 0, 0))
    for i, cell in enumerate(cells):
        grid.paste(cell, ((i % COLUMNS) * (width + 8), title + (i // COLUMNS) * (height + 8)))
    grid.save(path)
    return Path(path)


__all__ = ["audio_panel", "image_panel", "panel", "sample_grid", "text_panel"]
