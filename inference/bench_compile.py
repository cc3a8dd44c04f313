"""The denoising step eager vs under ``torch.compile``: the compile figure of ``unimodal bench sample
--compile``."""

from __future__ import annotations

import time

import torch

from unimodal.inference.bench_measure import slot_ids
from unimodal.inference.bench_setup import encode_conditions, parse_direction, shared_settings
from unimodal.inference.sampler import Request, SamplerConfig, generate


def compile_speedup(pipe, direction: str, values: list, seed: int = 0, steps: int = 16, repeats: int = 3,
                    sampling: dict | None = None) -> dict:
    """Wall time of one setting (confidence, ``steps``) with the cached denoising step eager vs under
    ``torch.compile`` (dynamic shapes: the batch shrinks as samples finish); compile time reported apart."""
    condition, target = parse_direction(direction)
    model, layout = pipe.backbone, pipe.layout
    requests = [Request([(condition, ids)], [target]) for ids in encode_conditions(pipe, condition, values)]
    config = SamplerConfig(steps=steps, seed=seed, **shared_settings(sampling))
    compiled = _CompiledStep(model)
    start = time.perf_counter()
    generate(compiled, layout, requests, config)  # first call compiles
    compile_s = time.perf_counter() - start
    walls = {"eager": [], "compiled": []}
    outputs = {}
    for _ in range(repeats):
        for name, runner in (("eager", model), ("compiled", compiled)):
            start = time.perf_counter()
            outputs[name] = generate(runner, layout, requests, config)
            walls[name].append(time.perf_counter() - start)
    eager, fast = min(walls["eager"]), min(walls["compiled"])
    same = all(torch.equal(slot_ids(a), slot_ids(b)) for a, b in zip(outputs["eager"], outputs["compiled"]))
    return {"direction": direction, "steps": steps, "samples": len(requests), "eager_s": eager, "compiled_s": fast,
            "speedup": eager / fast, "first_call_s": compile_s, "identical_tokens": same}


class _CompiledStep:
    """The backbone as the sampler sees it, with ``forward_targets`` (the per-step call) compiled."""

    def __init__(self, model):
        self._model = model
        self._compiled = torch.compile(model.forward_targets_unchecked, dynamic=True)

    def forward_targets(self, ids, t, segment_ids, positions, cache, attention_mask=None):
        attention_mask = self._model.check_target_inputs(ids, t, segment_ids, positions, cache, attention_mask)
        return self._compiled(ids, t, segment_ids, positions, cache, attention_mask)

    def __getattr__(self, name):
        return getattr(self._model, name)


__all__ = ["compile_speedup"]
