"""What the sampling benchmark measures of one batched sampler call: wall time, peak memory, and agreement of
its target slots with a reference's."""

from __future__ import annotations

import resource
import sys
import time

import torch

from unimodal.inference.sampler import Request, SampleResult, SamplerConfig, generate


def peak_memory_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, what the figure is): on CUDA ``torch.cuda.max_memory_allocated`` since the last
    :func:`peak_memory_reset`; on the CPU the process's resident-set high-water mark, which never goes down."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_memory_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024), "process_rss_high_water_mark"


def slot_ids(result: SampleResult) -> torch.Tensor:
    """The packed target at its slots (content, END, PAD): fixed length, so two results compare slot by slot."""
    return torch.cat([result.target.ids[list(span.slots)] for span in result.target.spans])


def agreement(results: list[SampleResult], reference: list[SampleResult]) -> float:
    """Fraction of target slots equal to the reference's, over all samples."""
    same = sum(int((slot_ids(a) == slot_ids(b)).sum()) for a, b in zip(results, reference))
    return same / sum(len(slot_ids(b)) for b in reference)


def timed_generate(model, layout, requests: list[Request], config: SamplerConfig):
    """(results, wall seconds, peak memory bytes, memory kind) of one batched :func:`generate` call."""
    device = model.device
    peak_memory_reset(device)
    start = time.perf_counter()
    results = generate(model, layout, requests, config)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - start
    return (results, wall, *peak_memory(device))


__all__ = ["agreement", "peak_memory", "peak_memory_reset", "slot_ids", "timed_generate"]
