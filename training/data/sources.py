"""Where training data comes from: an embedded set by name (built into the cache on first use), a built data
set folder, or a JSONL manifest of the user's own files."""

from __future__ import annotations

import json
from pathlib import Path

from unimodal.core.errors import InputError


def data_kind(name: str) -> str:
    """``embedded``, ``built`` (a folder with info.json) or ``manifest`` (a .jsonl file), else an InputError."""
    from unimodal.training.data.build import BUILDERS

    if name in BUILDERS:
        return "embedded"
    if (Path(name) / "info.json").exists():
        return "built"
    if Path(name).is_file() and str(name).endswith(".jsonl"):
        return "manifest"
    raise InputError(f"--data entry {name!r} is neither an embedded set ({', '.join(BUILDERS)}), a built "
                     f"data set folder (one with info.json) nor a JSONL manifest of your own data")


def resolve_data(names: list[str] | tuple[str, ...]) -> list[Path]:
    """Each entry: an embedded set name (built into the cache on first use), a built data set folder, or a
    JSONL manifest of the user's own data (see ``unimodal.training.data.folder``)."""
    from unimodal.training.data.build import DEFAULT_N, build
    from unimodal.core.paths import data_dir

    dirs = []
    for name in names:
        if data_kind(name) == "embedded":
            path = data_dir(name, DEFAULT_N[name], 0)
            dirs.append(path if (path / "info.json").exists() else build(name, out=path))
        else:
            dirs.append(Path(name))
    return dirs


EMBEDDED_SETS = ("scenes", "digits")


def dataset_names(sources: list[Path]) -> list[str] | None:
    """The embedded set each built data folder holds (its info.json's name); None if any source is not one."""
    names = []
    for source in sources:
        info = source / "info.json"
        name = json.loads(info.read_text()).get("name") if info.is_file() else None
        if name not in EMBEDDED_SETS:
            return None
        names.append(name)
    return list(dict.fromkeys(names))
