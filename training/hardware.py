"""Which device and which precision a training run uses, decided from the hardware and printed.

bf16 autocast pays only where the processor multiplies bf16 in hardware: on a CPU with AVX512-BF16 or AMX a
``small`` step ran 1.3x faster than in float32; on an AVX2-only CPU a 1024x1024 bf16 matmul ran at 0.9 GFLOP/s
against 162 in float32 and a ``mini`` step took 27.4 s instead of 1.26 s. So the default follows the hardware.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
import time
from pathlib import Path

import torch

from unimodal.core.errors import InputError

DEVICES = ("auto", "cpu", "cuda")
BF16_CPU_FLAGS = re.compile(r"\b(avx512_bf16|amx_bf16)\b")


def resolve_device(device: str) -> str:
    """``auto``: CUDA when a GPU is visible, else the CPU. ``cuda`` without a GPU is refused."""
    if device not in DEVICES:
        raise InputError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA GPU is visible to PyTorch on this machine "
                         "(torch.cuda.is_available() is False); use --device cpu or auto")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def cpu_has_bf16_units(cpuinfo: str | None = None) -> bool:
    """True when the CPU has bf16 matrix instructions (AVX512-BF16 or AMX-BF16). Read from /proc/cpuinfo's flags
    where there is one; elsewhere measured once (a bf16 matmul at least as fast as a float32 one)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return _bf16_matmul_is_faster()
    return bool(BF16_CPU_FLAGS.search(cpuinfo))


def _bf16_matmul_is_faster(size: int = 512, repeats: int = 3) -> bool:
    def best(dtype):
        a = torch.randn(size, size).to(dtype)
        a @ a
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ a
            times.append(time.perf_counter() - start)
        return min(times)

    return best(torch.bfloat16) <= best(torch.float32)


def use_bf16(requested: bool | None, device: str) -> tuple[bool, str]:
    """(bf16 or not, why) for a run on ``device`` (``cpu`` or ``cuda``); ``requested`` None means decide."""
    if requested is not None:
        return requested, "as requested"
    if device == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, "the GPU supports bf16" if ok else "this GPU has no bf16"
    if cpu_has_bf16_units():
        return True, "the CPU has bf16 matrix units (AVX512-BF16 / AMX)"
    return False, "the CPU has no bf16 matrix units: bf16 would be emulated, many times slower than float32"


def cpu_autocast_bf16(requested: bool | None, what: str, progress: bool = True) -> bool:
    """Whether a CPU training loop (the codecs', the vocoder's) runs under bf16 autocast: ``requested``, or
    (None) what the CPU multiplies natively; the choice and its reason printed once, as the model trainer does.
    On a CPU without bf16 units bf16 autocast made the image codec train ~25x slower than float32 (0.25 against
    6.3 images/s on one AVX2 thread)."""
    bf16, why = use_bf16(requested, "cpu")
    if progress:
        print(f"{what}: {'bf16 autocast' if bf16 else 'float32'} ({why})", flush=True)
    return bf16


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim`` where the C library is glibc, else None (musl, macOS, Windows)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Give the pages the C allocator holds free back to the system (glibc ``malloc_trim(0)``); False where there
    is no glibc. A CPU training step allocates tensors of a different size each step (a different number of
    masked slots, of packed tokens), and glibc keeps what they freed as scattered holes: a ``mini`` run's memory
    grew ~25 MB a step, to 8-9 GB by step 1,000 (training calls this every ``train.TRIM_EVERY`` steps on the CPU;
    docs/results.md, "Memory of a CPU run")."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def resident_mb() -> float | None:
    """This process's resident memory in MB (Linux's /proc/self/statm), None where it cannot be read."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6

