"""What every demo script shares: the ``--model`` / ``--out`` arguments and loading the model they name.

Only the public face is used here: ``UniModal`` and the packaged default model's folder.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from unimodal import UniModal
from unimodal.core.errors import InputError
from unimodal.core.seeds import check_seed
from unimodal.serve import resolve_model_dir


def parser_for(doc: str, out: str) -> argparse.ArgumentParser:
    """A parser with ``--model`` (default: the shipped model) and ``--out``; the first docstring line as help."""
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    parser.add_argument("--model", default=None,
                        help="model folder (default: $UNIMODAL_MODEL, else the model shipped in the package)")
    parser.add_argument("--out", default=out, help=f"folder for the outputs (default {out})")
    parser.add_argument("--seed", type=seed_argument, default=0,
                        help="seed of the first output (an int in [0, 2**62); the later ones derive from it)")
    return parser


def seed_argument(text: str) -> int:
    """``--seed``: refused by argparse (usage, exit 2) unless it is an int the library accepts as a seed, so a
    demo never wraps a bad seed into a valid one when it derives the seeds of its later outputs."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an int: {text!r}") from None
    try:
        return check_seed(value, "--seed")
    except InputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def load(model: str | None) -> tuple[UniModal, Path]:
    """The model ``--model`` names (None: ``$UNIMODAL_MODEL``, else the shipped default) and its folder."""
    folder = resolve_model_dir(model)
    return UniModal.from_pretrained(folder), folder


def out_folder(path: str | Path) -> Path:
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_json(path: Path, value) -> Path:
    """Write ``value`` as indented JSON and say where."""
    path.write_text(json.dumps(value, indent=2, default=str) + "\n")
    print(path)
    return path
