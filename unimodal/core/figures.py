"""Saving the figures the benchmarks, evals and trainers draw: one way to get pyplot without a display, and one way
to write a figure (laid out, written atomically, closed), so a bench stopped mid-write never leaves half a PNG
where the last whole one was."""

from __future__ import annotations

import os
from pathlib import Path

from unimodal.core.paths import atomic_write


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display is needed, none is opened). ImportError when
    matplotlib is missing: a caller that can go on without a figure catches it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure, path: str | os.PathLike, dpi: float | None = 110) -> Path:
    """Lay ``figure`` out, write it to ``path`` atomically (the format from the path's suffix, PNG when it has
    none), close it, and return the path. ``dpi=None`` keeps the figure's own resolution."""
    path = Path(path)
    file_format = path.suffix.lstrip(".").lower() or "png"
    try:
        figure.tight_layout()
        atomic_write(path, lambda temporary: figure.savefig(temporary, dpi=dpi or "figure", format=file_format))
    finally:
        pyplot().close(figure)
    return path
