"""Which code wrote a report: the package version and, in a git checkout, the commit and whether tracked files
differed from it. Reports carry it so a figure can be traced to the code that measured it (a long bench started
before a change keeps judging with the code it started with)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def code_version(where: str | os.PathLike | None = None) -> dict:
    """``{"version": ..., "commit": ... or None, "modified": bool or None}``: the installed version (None when the
    code runs uninstalled); ``commit`` and ``modified`` (tracked files changed since the commit) when ``where``
    (default: the package's folder) is inside a git work tree and git answers within a few seconds, else None (an
    installed wheel, no git)."""
    from importlib import metadata

    try:  # the installed distribution's version (the leaf does not import the package's face for it)
        version = metadata.version("unimodal")
    except metadata.PackageNotFoundError:
        version = None
    folder = Path(where) if where is not None else Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"version": version, "commit": commit, "modified": None if status is None else bool(status)}
