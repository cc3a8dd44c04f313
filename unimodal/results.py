"""What a generation returns: the outputs in native form, their token ids, confidences and costs."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from unimodal.core.errors import InputError, OutputPathError
from unimodal.core.paths import OUTPUT_SUFFIXES, atomic_write, user_path

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
        """Save by extension: ``.png`` / ``.jpg`` the image, ``.wav`` / ``.flac`` the audio, ``.txt`` the text,
        ``.json`` the summary. An existing folder or a path without an extension is a folder that receives every
        output; any other extension is refused. Each file is written whole or not at all (a temporary file,
        then a rename), so a reader never sees half a file. Returns the files."""
        from unimodal.checks import output_kind

        path = user_path(path, "path", OutputPathError)
        kind = output_kind(path)
        if kind is not None:
            self._write(path)
            return [path]
        files = [path / f"{m}{ext}" for m, ext in (("text", ".txt"), ("image", ".png"), ("audio", ".wav"))
                 if getattr(self, m) is not None] + [path / "result.json"]
        for file in files:
            self._write(file)
        return files

    def _write(self, path: Path) -> None:
        kind, suffix = OUTPUT_SUFFIXES[path.suffix.lower()], path.suffix.lower()
        write = {"image": self._save_image, "audio": self._save_audio, "text": self._save_text,
                 "json": self._save_json}[kind]
        if kind != "json":
            self._need(kind)  # before any folder is made
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda temporary: write(temporary, suffix))
        except OSError as error:
            raise OutputPathError(f"cannot write {str(path)!r}: {error.strerror or error}") from None

    def _need(self, modality: str):
        value = getattr(self, modality)
        if value is None:
            raise InputError(f"this result has no {modality} (it holds {list(self.modalities) or 'nothing'}); "
                             f"ask for to='{modality}' or save another file type")
        return value

    # The writers take the format from the final name's suffix: the temporary file they write has another.

    def _save_image(self, path: Path, suffix: str) -> None:
        image = self._need("image")
        image.convert("RGB").save(path, format="JPEG" if suffix in (".jpg", ".jpeg") else "PNG")

    def _save_audio(self, path: Path, suffix: str) -> None:
        import soundfile as sf

        sf.write(str(path), np.asarray(self._need("audio"), dtype=np.float32), self.sample_rate,
                 format="FLAC" if suffix == ".flac" else "WAV")

    def _save_text(self, path: Path, suffix: str) -> None:
        path.write_text(self._need("text") + "\n", encoding="utf-8")

    def _save_json(self, path: Path, suffix: str) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")


def save_outputs(result, outputs) -> dict[str, str]:
    """Save ``result`` where :func:`unimodal.checks.plan_outputs` planned (``{kind: file}`` or
    ``{"folder": folder}``); a raw ``out`` (None, a path, a list of paths) is planned first. Every image/audio
    output needs a place once ``out`` is given; text is also in the result itself."""
    from collections.abc import Mapping

    from unimodal.checks import plan_outputs

    if not isinstance(outputs, Mapping):
        outputs = plan_outputs(outputs, list(result.modalities))
    if "folder" in outputs:
        saved = result.save(outputs["folder"])
        return {path.stem if path.stem != "result" else "json": str(path.resolve()) for path in saved}
    for path in outputs.values():
        result.save(path)
    return {kind: str(path.resolve()) for kind, path in outputs.items()}

