"""Atomic checkpoints: written to a temporary file beside the target and renamed into place, so a kill at
any moment leaves either the previous checkpoint or the new one, never a torn file."""

from __future__ import annotations

import os
import tempfile
from dataclasses import fields
from pathlib import Path

import torch

from unimodal.core.errors import DataError


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


def resumed_config(config_cls, cfg, ckpt_path: str | os.PathLike, resume: bool):
    """``(config, state)`` at the start of a run. Resuming from an existing checkpoint: the run's own config,
    except, when ``cfg`` is given, the keys of ``config_cls.RESUME_OVERRIDES`` (default: ``steps``, to lengthen
    or shorten a run; settings that do not change what is trained, such as when to write snapshots), and the
    checkpoint's state; otherwise ``cfg`` (or the defaults) and None. Keys a newer config class no longer has are
    dropped, and keys it predates take ``config_cls.LEGACY_DEFAULTS``, so an old checkpoint resumes as it ran."""
    ckpt_path = Path(ckpt_path)
    if not (resume and ckpt_path.exists()):
        return (cfg if cfg is not None else config_cls()), None
    state = load_checkpoint(ckpt_path)
    known = {f.name for f in fields(config_cls)}
    # settings the checkpoint predates take the value the run was trained with, not today's default
    saved = {**getattr(config_cls, "LEGACY_DEFAULTS", {}), **state["config"]}
    saved = {k: v for k, v in saved.items() if k in known}
    if cfg is not None:
        for key in getattr(config_cls, "RESUME_OVERRIDES", ("steps",)):
            saved[key] = getattr(cfg, key)
    return config_cls(**saved), state


def cli_config(config_cls, out_dir: str | os.PathLike, resume: bool, steps: int | None, **values):
    """The config a ``--resume``-able command passes on: None when it resumes an existing run without a new
    ``--steps`` (so the run keeps its own), else ``config_cls`` built from the command's flags."""
    if resume and steps is None and (Path(out_dir) / "checkpoint.pt").exists():
        return None
    return config_cls(**values, **({} if steps is None else {"steps": steps}))


def restore(state: dict | None, model, optimizer) -> int:
    """Load a checkpoint's model and optimizer states (when resuming); returns the step to continue from."""
    if state is None:
        return 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])
