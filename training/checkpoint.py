"""Atomic checkpoints: written to a temporary file beside the target and renamed into place, so a kill at
any moment leaves either the previous checkpoint or the new one, never a torn file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from unimodal.errors import DataError


def save_atomic(state: dict, path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a file that is not a checkpoint: say which
        raise DataError(f"{path} is not a readable checkpoint: {exc}") from exc
