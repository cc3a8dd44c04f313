"""Where training data comes from: an embedded set by name (built into the cache on first use), a built data
set folder, or a JSONL manifest of the user's own files."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import NoReturn

from unimodal.core.errors import InputError


def split_weight(entry: str) -> tuple[str, float]:
    """``NAME:W`` -> (NAME, W): a ``--data`` entry whose training split is drawn W times per epoch (W > 0; a
    fraction draws a fixed share of it). A plain entry, or a path that holds a colon, weighs 1. A leading ``~`` is
    expanded (the shell does so only at the start of a word, not after the comma of ``--data a,~/b``)."""
    entry = os.path.expanduser(str(entry))
    name, sep, tail = entry.rpartition(":")
    if not sep or not name or Path(entry).exists():
        return entry, 1.0
    try:
        weight = float(tail)
    except ValueError:
        return entry, 1.0  # a colon that is part of a name
    if not math.isfinite(weight) or weight <= 0:
        raise InputError(f"--data entry {entry!r}: the weight after ':' must be a positive number (how many "
                         f"times an epoch its training samples are drawn, e.g. digits:4), got {tail!r}")
    return name, weight


def weighted(samples: list, weight: float, seed: int = 0, name: str = "") -> list:
    """``samples`` drawn ``weight`` times: whole copies, then a fixed seeded share for the fraction (references,
    no copies of the tensors). Refuses a weight that keeps no sample."""
    whole, extra = _parts(len(samples), weight)
    out = list(samples) * whole
    if extra:
        import numpy as np

        keep = np.random.default_rng([seed, len(samples)]).permutation(len(samples))[:extra]
        out += [samples[i] for i in sorted(keep.tolist())]
    if samples and not out:
        _keeps_none(name, weight, len(samples))
    return out


def _parts(n: int, weight: float) -> tuple[int, int]:
    """How ``weight`` draws ``n`` samples: whole copies, and the samples of the seeded share for its fraction."""
    whole, fraction = divmod(float(weight), 1.0)
    return int(whole), round(fraction * n)


def _keeps_none(name: str, weight: float, n: int) -> NoReturn:
    raise InputError(f"--data {name or 'entry'}:{weight:g} keeps none of its {n} training samples; "
                     f"give a weight of at least {1 / n:.2g}")


def check_keeps_some(folder: Path, weight: float, name: str = "") -> None:
    """Refuse, before any sample is read or encoded, a weight that keeps none of a built folder's training
    samples (its info.json counts them; :func:`weighted` checks the samples themselves for other sources)."""
    info = Path(folder) / "info.json"
    if weight >= 1 or not info.is_file():
        return
    try:
        n = int(json.loads(info.read_text()).get("splits", {}).get("train", 0))
    except (ValueError, TypeError, AttributeError):
        return  # an unreadable info.json is the data check's to report
    if n and not any(_parts(n, weight)):
        _keeps_none(name or str(folder), weight, n)


def data_kind(name: str) -> str:
    """``embedded``, ``built`` (a folder with info.json) or ``manifest`` (a .jsonl file), else an InputError; a
    ``--data`` entry's weight (``NAME:W``) is set aside first."""
    from unimodal.training.data.build import BUILDERS

    name = split_weight(name)[0]
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
    JSONL manifest of the user's own data (see ``unimodal.training.data.folder``). Weights (``NAME:W``) are
    dropped here: :func:`resolve_weighted` keeps them."""
    return [source for source, _ in resolve_weighted(names)]


def resolve_weighted(names: list[str] | tuple[str, ...]) -> list[tuple[Path, float]]:
    """:func:`resolve_data` with each entry's weight (``digits:4`` -> (the digits folder, 4.0))."""
    from unimodal.training.data.build import DEFAULT_N, build
    from unimodal.core.paths import data_dir

    out = []
    for entry in names:
        name, weight = split_weight(entry)
        if data_kind(entry) == "embedded":  # data_kind sets the entry's weight aside itself
            path = data_dir(name, DEFAULT_N[name], 0)
            out.append((path if (path / "info.json").exists() else build(name, out=path), weight))
        else:
            out.append((Path(name), weight))
        check_keeps_some(out[-1][0], weight, name)
    return out


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
