"""``unimodal bench startup``: how long a fresh ``unimodal`` process takes to answer ``--help``, ``--version`` and
requests it refuses (a missing file, a bad extension, a setting out of range, a damaged model folder, ...).

Each case runs ``python -m unimodal.cli ...`` as a new process ``repeats`` times; the median wall time is
reported with the exit status and whether stderr held a traceback. Nothing here loads a model: a refused
request must be answered before the model loads, which is what this measures.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from unimodal.core.paths import PACKAGE_DIR


def _cases(scratch: Path) -> dict[str, list[str]]:
    """Case name -> the CLI arguments (``import unimodal`` is timed as a Python one-liner)."""
    damaged = _damaged_model(scratch)
    return {
        "import unimodal": ["-c", "import unimodal"],
        "--help": ["--help"],
        "--version": ["--version"],
        "generate --help": ["generate", "--help"],
        "refused: missing input file": ["generate", "--image", str(scratch / "missing.png"), "--to", "text"],
        "refused: --out with an unknown extension": ["generate", "--text", "a red circle", "--out", "x.mp4"],
        "refused: --steps 0": ["generate", "--text", "a red circle", "--out", "x.png", "--steps", "0"],
        "refused: non-UTF-8 text": ["generate", "--text", "a red \udcff circle", "--out", "x.png"],
        "refused: --out under /proc": ["generate", "--text", "a red circle", "--out", "/proc/x.png"],
        "refused: --device cuda without a GPU": ["generate", "--text", "a red circle", "--out", "x.png",
                                                 "--device", "cuda"],
        "refused: truncated weights file": ["generate", "--model", str(damaged), "--text", "a red circle",
                                            "--out", "x.png"],
    }


def _damaged_model(scratch: Path) -> Path:
    """The shipped model's folder with its backbone weights cut to 1 KiB (only small files are copied)."""
    source, target = PACKAGE_DIR / "default_model", scratch / "damaged-model"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors"))
    weights = source / "backbone" / "diffusion_pytorch_model.safetensors"
    (target / "backbone" / weights.name).write_bytes(weights.read_bytes()[:1024])
    return target


def _time_once(args: list[str]) -> tuple[float, int, bool]:
    command = [sys.executable] + (args if args[0] == "-c" else ["-m", "unimodal.cli", *args])
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, errors="surrogateescape")
    seconds = time.perf_counter() - start
    return seconds, done.returncode, "Traceback" in done.stderr


def bench_startup(repeats: int = 5) -> dict:
    """{case: {"median_s", "max_s", "exit_status", "traceback"}} plus the Python running them."""
    with tempfile.TemporaryDirectory() as scratch:
        rows = {}
        for name, args in _cases(Path(scratch)).items():
            runs = [_time_once(args) for _ in range(repeats)]
            times = [seconds for seconds, _, _ in runs]
            rows[name] = {"median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3),
                          "exit_status": runs[-1][1], "traceback": any(trace for _, _, trace in runs)}
    return {"python": sys.version.split()[0], "repeats": repeats, "cases": rows}


def format_table(report: dict) -> str:
    lines = [f"{'case':45s} {'median s':>9s} {'max s':>7s} {'exit':>5s}  traceback",
             "-" * 80]
    for name, row in report["cases"].items():
        lines.append(f"{name:45s} {row['median_s']:9.3f} {row['max_s']:7.3f} {row['exit_status']:5d}  "
                     f"{'YES' if row['traceback'] else 'no'}")
    lines.append(f"(fresh processes, median of {report['repeats']}, Python {report['python']})")
    return "\n".join(lines)
