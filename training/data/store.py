"""On-disk format of a built data set, and the sample type every data set yields.

A built data set is a folder::

    info.json                  name, seed, counts, sample rate, image size, builder settings
    <split>/images.npy         (N, H, W, 3) uint8, or absent when the set has no images
    <split>/audio.npy          all clips of the split, int16, concatenated
    <split>/audio_index.npy    (N, 2) int64: start and length of each clip in audio.npy
    <split>/records.jsonl      one JSON object per sample: text, attributes, voice, ...

Plain numpy arrays (memory-mapped on load) keep a 10k-sample set loading in milliseconds, and the files are
a pure function of the builder's inputs, so a rebuild with the same seed is byte-identical.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from unimodal.core.errors import DataError, InputError

SPLITS = ("train", "val", "test", "heldout")
FORMAT_VERSION = 1


@dataclass
class Sample:
    """One multimodal sample: any subset of text, image (H, W, 3 uint8) and audio (mono float32)."""

    text: str | None = None
    image: np.ndarray | None = None
    audio: np.ndarray | None = None
    sample_rate: int = 16_000
    meta: dict = field(default_factory=dict)

    def modalities(self) -> tuple[str, ...]:
        return tuple(m for m in ("text", "image", "audio") if getattr(self, m) is not None)


def _json_line(obj: dict) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)


def write_split(out_dir: Path, split: str, samples: list[Sample]) -> None:
    """Write one split of samples in the built format."""
    split_dir = out_dir / split
    split_dir.mkdir(parents=True, exist_ok=True)
    if any(s.image is not None for s in samples):
        np.save(split_dir / "images.npy", np.stack([s.image for s in samples]).astype(np.uint8))
    if any(s.audio is not None for s in samples):
        clips = [np.round(np.clip(s.audio, -1, 1) * 32767).astype(np.int16) for s in samples]
        lengths = np.array([len(c) for c in clips], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        np.save(split_dir / "audio.npy", np.concatenate(clips))
        np.save(split_dir / "audio_index.npy", np.stack([starts, lengths], axis=1))
    with open(split_dir / "records.jsonl", "w", encoding="utf-8") as f:
        for s in samples:
            f.write(_json_line({"text": s.text, **s.meta}) + "\n")


def publish(tmp_dir: Path, out_dir: Path) -> None:
    """Move a finished build into place, replacing an older one only once the new one is complete."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        old = out_dir.with_name(out_dir.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out_dir, old)
        os.replace(tmp_dir, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp_dir, out_dir)


def staging_dir(out_dir: Path) -> Path:
    """A fresh temporary folder beside ``out_dir`` (same file system, so the final rename is atomic)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.building-", dir=out_dir.parent))


def write_info(out_dir: Path, info: dict) -> None:
    with open(Path(out_dir) / "info.json", "w", encoding="utf-8") as f:
        json.dump({"format_version": FORMAT_VERSION, **info}, f, indent=2, sort_keys=True)
        f.write("\n")


def read_info(data_dir: str | os.PathLike) -> dict:
    path = Path(data_dir) / "info.json"
    if not path.is_file():
        raise DataError(f"{data_dir} is not a built unimodal data set (no info.json); "
                        f"build one with: unimodal data build scenes --out {data_dir}")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class BuiltDataset:
    """A split of a built data set, indexable like a torch ``Dataset`` and yielding :class:`Sample`."""

    def __init__(self, data_dir: str | os.PathLike, split: str = "train"):
        self.data_dir = Path(data_dir)
        self.info = read_info(self.data_dir)
        if split not in self.info["splits"]:
            raise InputError(f"split {split!r} is not in {self.data_dir}; it has {sorted(self.info['splits'])}")
        self.split = split
        split_dir = self.data_dir / split
        with open(split_dir / "records.jsonl", encoding="utf-8") as f:
            self.records = [json.loads(line) for line in f]
        self.images = np.load(split_dir / "images.npy", mmap_mode="r") if (split_dir / "images.npy").exists() else None
        self.audio, self.audio_index = None, None
        if (split_dir / "audio.npy").exists():
            self.audio = np.load(split_dir / "audio.npy", mmap_mode="r")
            self.audio_index = np.load(split_dir / "audio_index.npy")
        self.sample_rate = int(self.info.get("sample_rate", 16_000))

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> Sample:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples in split {self.split!r}")
        record = dict(self.records[index])
        text = record.pop("text", None)
        image = np.array(self.images[index]) if self.images is not None else None
        audio = None
        if self.audio is not None:
            start, length = self.audio_index[index]
            audio = self.audio[start:start + length].astype(np.float32) / 32767.0
        return Sample(text=text, image=image, audio=audio, sample_rate=self.sample_rate, meta=record)
