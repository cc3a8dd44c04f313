"""What every command group of the CLI shares: the model arguments and the guidance-scale parser."""

from __future__ import annotations

import argparse
from pathlib import Path

EVAL_HELP = "generate in every direction and score with the independent judges"


def parse_cfg(value: str):
    """``--cfg 3`` (one scale) or ``--cfg text=3,audio=2`` (per input modality)."""
    try:
        if "=" not in value:
            return float(value)
        pairs = (item.split("=", 1) for item in value.split(",") if item.strip())
        return {name.strip(): float(scale) for name, scale in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cfg takes a scale (3) or modality=scale pairs (text=3,audio=2), "
                                         f"got {value!r}") from None


def add_model_arguments(parser) -> None:
    parser.add_argument("--model", default=None, help="model folder (default: $UNIMODAL_MODEL, else the packaged "
                                                      "default model)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")


def read_report(name: str, what: str, required: tuple[str, ...], default_file: str | None = None) -> dict:
    """A JSON report a bench wrote (``default_file`` inside ``name`` when it is a folder; gzip-compressed when its
    name ends in ``.gz``, as the repository keeps its largest per-case reports), refused with an
    ``InputFileError`` naming it when it cannot be read or lacks a ``required`` key."""
    from unimodal.core.errors import InputFileError
    from unimodal.core.paths import user_path

    path = user_path(name, "report", InputFileError)
    if default_file and path.is_dir():
        path = path / default_file
    try:
        report = load_json(path)
    except (OSError, ValueError, EOFError) as error:
        raise InputFileError(f"{name!r} cannot be read as {what}: {error}") from None
    missing = [key for key in required if not isinstance(report, dict) or key not in report]
    if missing:
        raise InputFileError(f"{name!r} is not {what} (no {' and '.join(repr(k) for k in missing)})")
    return report


def load_json(path) -> object:
    """A JSON file's content; gzip-compressed when its name ends in ``.gz`` (the repository keeps its largest
    per-case reports so). Raises OSError, ValueError or EOFError when it cannot be read."""
    import gzip
    import json

    path = Path(path)
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())


def number_list(kind):
    """An argparse type: comma-separated numbers of ``kind`` (``"4,8,16"`` -> ``[4, 8, 16]``)."""
    def parse(value: str):
        try:
            return [kind(item) for item in value.split(",") if item.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {value!r}") from None
    return parse


def set_threads(threads: int | None) -> None:
    """A command's ``--threads``: torch's thread count (None: torch's own choice); below 1 is refused."""
    from unimodal.core.errors import InputError

    if threads is None:
        return
    if threads < 1:
        raise InputError(f"--threads must be a positive number of threads, got {threads}")
    import torch

    torch.set_num_threads(threads)


def refine_rounds_type(flag: str = "--refine-rounds"):
    """An argparse type: rounds of refine after an operation (``generate --refine``, ``eval`` / ``edit`` / ``bench
    edit --refine-rounds``) as the library checks them (:func:`unimodal.checks.check_refine_rounds`), refused with
    the flag's name before the model loads."""
    def parse(value: str) -> int:
        from unimodal.checks import MAX_REFINE_ROUNDS, check_refine_rounds
        from unimodal.core.errors import SettingError

        try:
            return check_refine_rounds(int(value), flag)
        except (ValueError, SettingError):
            raise argparse.ArgumentTypeError(f"{flag} must be a whole number from 0 (none) to {MAX_REFINE_ROUNDS}, "
                                             f"got {value!r}") from None
    return parse


refine_rounds = refine_rounds_type()
