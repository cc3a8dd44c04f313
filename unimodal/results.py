"""What a generation returns: the outputs in native form, their token ids, confidences and costs."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from unimodal.errors import InputError

SAMPLE_RATE = 16_000


@dataclass
class GenerationResult:
    """One request's outputs. ``text`` (str), ``image`` (PIL, 64x64), ``audio`` (float32 mono at
    ``sample_rate``) are set for the modalities generated; ``token_ids`` / ``confidence`` hold each generated
    modality's local ids and the probability each had when committed; ``forward_passes`` counts backbone
    calls (a batched classifier-free-guidance call counts once)."""

    text: str | None = None
    image: Image.Image | None = None
    audio: np.ndarray | None = None
    sample_rate: int = SAMPLE_RATE
    token_ids: dict[str, list[int]] = field(default_factory=dict)
    confidence: dict[str, list[float]] = field(default_factory=dict)
    forward_passes: int = 0
    steps: int = 0
    settings: dict = field(default_factory=dict)

    @property
    def modalities(self) -> tuple[str, ...]:
        return tuple(m for m in ("text", "image", "audio") if getattr(self, m) is not None)

    def to_dict(self) -> dict:
        """JSON-ready summary: text, ids, confidences, costs and settings (image and audio as file paths
        when saved, else omitted)."""
        return {"text": self.text, "modalities": list(self.modalities), "token_ids": self.token_ids,
                "confidence": {m: [round(c, 4) for c in v] for m, v in self.confidence.items()},
                "forward_passes": self.forward_passes, "steps": self.steps, "settings": self.settings}

    def save(self, path: str | os.PathLike) -> list[Path]:
        """Save by extension: ``.png`` the image, ``.wav`` the audio, ``.txt`` the text, ``.json`` the summary.
        A path without one of these extensions is a folder that receives every output. Returns the files."""
        path = Path(path)
        writers = {".png": self._save_image, ".wav": self._save_audio, ".txt": self._save_text, ".json": self._save_json}
        if path.suffix.lower() in writers:
            path.parent.mkdir(parents=True, exist_ok=True)
            writers[path.suffix.lower()](path)
            return [path]
        path.mkdir(parents=True, exist_ok=True)
        files = [path / f"{m}{ext}" for m, ext in (("text", ".txt"), ("image", ".png"), ("audio", ".wav"))
                 if getattr(self, m) is not None]
        for file in files:
            writers[file.suffix](file)
        files.append(path / "result.json")
        self._save_json(files[-1])
        return files

    def _need(self, modality: str):
        value = getattr(self, modality)
        if value is None:
            raise InputError(f"this result has no {modality} (it holds {list(self.modalities) or 'nothing'}); "
                             f"ask for to='{modality}' or save another file type")
        return value

    def _save_image(self, path: Path) -> None:
        self._need("image").save(path)

    def _save_audio(self, path: Path) -> None:
        import soundfile as sf

        sf.write(str(path), np.asarray(self._need("audio"), dtype=np.float32), self.sample_rate)

    def _save_text(self, path: Path) -> None:
        path.write_text(self._need("text") + "\n", encoding="utf-8")

    def _save_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
