"""Where built data sets, trained codecs and runs live: outside the repository, under one cache root."""

from __future__ import annotations

import os
from pathlib import Path

from unimodal.core.errors import InputError


def user_path(value, name: str = "path", error: type[InputError] = InputError) -> Path:
    """``value`` as a Path with ``~`` / ``~user`` expanded; a ``~user`` with no home directory (``~0``) is the
    caller's input error, named, not a RuntimeError from pathlib."""
    try:
        return Path(value).expanduser()
    except RuntimeError:
        raise error(f"{name}: cannot expand {os.fspath(value)!r}: no such user's home directory "
                    f"(write the path without '~', or as ./{os.fspath(value)} for a file so named)") from None


def cache_root() -> Path:
    """The cache root: ``$UNIMODAL_CACHE`` if set, else ``$XDG_CACHE_HOME/unimodal`` or ``~/.cache/unimodal``."""
    env = os.environ.get("UNIMODAL_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "unimodal"


def data_dir(name: str, n: int, seed: int) -> Path:
    """Default folder for a built embedded data set."""
    return cache_root() / "data" / f"{name}-n{n}-seed{seed}"


PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the unimodal package folder (this file is in unimodal/core)


def default_codecs_dir() -> Path:
    """The codecs a new model trains with: the package's best set (``unimodal/default_codecs``: the codecs that
    differ from the default model's, the others named in its ``codecs.json``), else those of the default model
    (``unimodal/default_model``), else the ones trained into the cache. The default model keeps the codecs it
    was trained with in its own folder, so a newer codec set here does not change it."""
    for shipped in (PACKAGE_DIR / "default_codecs", PACKAGE_DIR / "default_model"):
        if any((shipped / modality).is_dir() for modality in ("text", "image", "audio")):
            return shipped
    return cache_root() / "codecs"


# What a file path names by its extension, wherever outputs are saved (results, the CLI, the servers).
OUTPUT_SUFFIXES = {".png": "image", ".jpg": "image", ".jpeg": "image", ".wav": "audio", ".flac": "audio",
                   ".txt": "text", ".json": "json"}


def atomic_write(path: str | os.PathLike, write) -> Path:
    """Call ``write(temporary_path)``, then rename the temporary file onto ``path``. A reader sees the old file
    or the whole new one, never half of one; of two writers the last rename wins with a complete file. The
    temporary file sits beside ``path`` (a rename across file systems would not be atomic) and goes on failure."""
    import tempfile

    path = Path(path)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(temporary))
        os.chmod(temporary, 0o644)  # mkstemp makes 0600; an output is an ordinary file
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return path


MODEL_ENV = "UNIMODAL_MODEL"


def report_json(report, default=None) -> str:
    """A report as indented JSON that stays readable and small: a list of plain values (a case's thousands of
    scores, its words) on one line, a record (a mapping of such values or short ones: one case, one critic's
    figures) on one line, anything else on one line when it is short, and nested structure indented by 2.
    ``json.loads`` gives back exactly what ``json.dumps`` would; ``default`` as there (for values JSON lacks)."""
    import json

    def plain(value) -> bool:
        return value is None or isinstance(value, (bool, int, float, str))

    def flat(value) -> bool:
        return plain(value) or (isinstance(value, list) and all(plain(v) for v in value))

    def short(value) -> bool:
        return len(json.dumps(value)) <= 100

    def write(value, indent: int) -> str:
        if flat(value) or not value or short(value) or (
                isinstance(value, dict) and all(flat(v) or short(v) for v in value.values())):
            return json.dumps(value)
        pad, inner = " " * indent, " " * (indent + 2)
        if isinstance(value, dict):
            items = [f"{inner}{json.dumps(k)}: {write(v, indent + 2)}" for k, v in value.items()]
            return "{\n" + ",\n".join(items) + "\n" + pad + "}"
        return "[\n" + ",\n".join(inner + write(v, indent + 2) for v in value) + "\n" + pad + "]"

    # through json once: keys, tuples and ``default`` become exactly what json.dumps makes of them
    return write(json.loads(json.dumps(report, default=default)), 0) + "\n"


def default_model_dir() -> Path:
    """The model shipped inside the package."""
    return PACKAGE_DIR / "default_model"


def resolve_model_dir(model: str | os.PathLike | None) -> Path:
    """``model``, else ``$UNIMODAL_MODEL``, else the packaged default model; a clear error when there is none."""
    if model:
        return user_path(model, "model")
    if os.environ.get(MODEL_ENV):
        return user_path(os.environ[MODEL_ENV], MODEL_ENV)
    if default_model_dir().is_dir():
        return default_model_dir()
    raise InputError(f"no model given: pass --model DIR (a trained model folder such as OUT/model from "
                     f"`unimodal train --out OUT`, or a folder written by UniModal.save_pretrained) or set "
                     f"{MODEL_ENV}=DIR. To train one: unimodal codec train text|image|audio, then "
                     f"unimodal train --preset small --data scenes --out runs/small")


SCHEDULER_DIR = "scheduler"  # a model folder's own sampler defaults (scheduler_config.json), as in a saved pipeline


def model_hash(model_dir: str | os.PathLike) -> str:
    """SHA-256 (first 16 hex digits) of every weight and config file of a model folder, in path order: the
    name eval reports and training records give a model, whatever folder it lies in."""
    import hashlib

    digest = hashlib.sha256()
    root = Path(model_dir)
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".json", ".bin")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
