"""Sampling benchmark: speed, memory and agreement of sampler settings, per direction (``unimodal bench sample``).

For each direction (one condition modality -> one target modality) the same N conditions are sampled under:

- ``threshold`` mode at each tau (the step cap is the number of target slots, so tau alone decides);
- ``confidence`` mode at each step count (cosine schedule);
- the reference ``all-steps``: ``confidence`` mode, linear schedule, steps = target slots, which commits exactly
  one token per model call (the slowest, most careful decoding);

each once with the condition cache (``SamplerConfig.use_cache``) and once without; the N requests of a setting
run as one batched :func:`~unimodal.inference.sampler.generate` call, so wall time per sample is that call's time / N
(after an untimed warm-up; on a tiny model it is noise-dominated). Per setting it reports TPF
(generated target slots / forward passes, where generated slots are those the model sampled, not the PAD filled
in after an END), forward passes and wall time per sample, peak memory, and *agreement*: the fraction of target
slots (packed, so END/PAD positions count too) equal to the reference's, and, when the conditions come with
their truth, the *judged quality* (``unimodal eval``'s judges) of every setting. Agreement says how far parallel
decoding drifts from one-token-per-step decoding, not whether either is right; it is meaningful with
``temperature=0`` (the default here); with sampling noise two settings disagree even when both are fine.
``sampling`` holds the settings every row shares (temperature, cfg, choice_temperature): images from a model
that needs guidance and a randomised commit order are benchmarked with them, as they are generated.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` (reset before each setting, so per setting); on the
CPU the process's resident-set high-water mark (``ru_maxrss``) after the setting, which never goes down: it
bounds the setting's peak from above and includes the model and everything loaded before.

The conditions arrive ready-made (strings, uint8 images of the codec's size, 16 kHz float32 audio): building
them from a data set is the caller's business (``unimodal/cli_bench.py``), since ``inference/`` must not import
``training/``.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import torch

from unimodal.inference.bench_compile import compile_speedup
from unimodal.inference.bench_measure import agreement, peak_memory, slot_ids, timed_generate
from unimodal.inference.bench_setup import (DEFAULT_DIRECTIONS, DEFAULT_STEPS, DEFAULT_TAUS, REFERENCE, SWEPT_FIELDS,
                                            Setting, encode_conditions, parse_direction, shared_settings, sweep,
                                            target_slots)
from unimodal.inference.evaluate import Judges, caption_correct, judge_image, paired_difference, verdicts_of
from unimodal.inference.sampler import Request, SampleResult, SamplerConfig, generate
from unimodal.core.errors import InputError


def _row(direction: str, setting: Setting, config: SamplerConfig, results: list[SampleResult], wall: float,
         memory: tuple[int, str]) -> dict:
    generated = sum(sum(r.commits_per_step) for r in results)
    passes = sum(r.forward_passes for r in results)
    return {"direction": direction, "setting": setting.name, "mode": config.mode, "schedule": config.schedule,
            "steps": config.steps, "tau": config.tau if config.mode == "threshold" else None,
            "use_cache": config.use_cache, "samples": len(results),
            "generated_slots": generated / len(results), "forward_passes": passes / len(results),
            "tpf": generated / passes, "wall_s_per_sample": wall / len(results),
            "peak_memory_bytes": memory[0], "memory_kind": memory[1]}


def _mean_verdict(verdicts: list | None) -> float | None:
    judged = [v for v in verdicts or [] if v is not None]
    return float(np.mean(judged)) if judged else None


def judged_verdicts(pipe, target: str, results: list[SampleResult], cases, judges) -> list | None:
    """The outputs judged by ``unimodal eval``'s judges when the cases carry the truth (attributes of images,
    captions of text), per case: 1 (right), 0 (wrong) or None (the judge abstained). None for audio targets
    (transcribing every setting costs minutes) and without cases."""
    if cases is None or target == "audio":
        return None
    if target == "image":
        images = pipe.image_codec.decode(torch.stack([r.tokens["image"] for r in results]))
        verdicts = [judge_image(c, im, judges.scene if c.kind == "scene" else None,
                                judges.digit if c.kind == "digit" else None).get("correct")
                    for c, im in zip(cases, images)]
    else:
        verdicts = [caption_correct(c, pipe.text_codec.decode_one(r.tokens["text"])) for c, r in zip(cases, results)]
    return verdicts_of(verdicts)


def bench_direction(pipe, direction: str, values: list, settings: list[Setting], seed: int = 0,
                    sampling: dict | None = None, cases=None, judges=None, cache_check: bool = True) -> list[dict]:
    """One row per (setting, cache on/off) for ``values`` (the raw conditions) in ``direction``; with ``cases``
    (the truth behind each value) every row also gets its judged ``quality``. ``cache_check=False`` runs each
    setting with the cache only (half the time, for quality sweeps over many prompts); the cache figures of
    those rows are then None."""
    modes = (True, False) if cache_check else (True,)
    condition, target = parse_direction(direction)
    model, layout = pipe.backbone, pipe.layout
    requests = [Request([(condition, ids)], [target]) for ids in encode_conditions(pipe, condition, values)]
    n_slots = target_slots(layout, target)
    for use_cache in modes:  # warm-up of the timed paths (guided rows too), untimed
        generate(model, layout, requests[:1],
                 SamplerConfig(steps=1, seed=seed, use_cache=use_cache, **shared_settings(sampling)))
    rows, reference, tokens, outputs = [], None, {}, {}
    for setting in settings:
        for use_cache in modes:
            config = setting.config(n_slots, use_cache, seed, sampling)
            results, wall, *memory = timed_generate(model, layout, requests, config)
            reference = reference if reference is not None else results  # the first setting is the reference
            tokens[use_cache] = [slot_ids(r) for r in results]
            outputs[use_cache] = results
            verdicts = judged_verdicts(pipe, target, results, cases, judges) if use_cache else None
            rows.append(_row(direction, setting, config, results, wall, memory)
                        | {"agreement": agreement(results, reference), "quality": _mean_verdict(verdicts),
                           "verdicts": verdicts})
        if not cache_check:
            rows[-1] |= {"cache_speedup": None, "cache_tokens_identical": None}
            continue
        same = all(torch.equal(a, b) for a, b in zip(tokens[True], tokens[False]))
        cached, uncached = rows[-2], rows[-1]
        # identical tokens, identical verdicts; otherwise the uncached outputs are judged on their own
        uncached["verdicts"] = cached["verdicts"] if same else \
            judged_verdicts(pipe, target, outputs[False], cases, judges)
        uncached["quality"] = _mean_verdict(uncached["verdicts"])
        for row in (cached, uncached):
            row["cache_speedup"] = uncached["wall_s_per_sample"] / cached["wall_s_per_sample"]
            row["cache_tokens_identical"] = same
    return rows


def bench_sample(pipe, conditions: dict[str, list], directions=DEFAULT_DIRECTIONS, taus=DEFAULT_TAUS,
                 steps=DEFAULT_STEPS, seed: int = 0, sampling: dict | None = None, model_path: str | None = None,
                 progress=None, cases=None, compile_direction: str | None = None, cache_check: bool = True) -> dict:
    """The whole sweep. ``conditions``: raw condition values per modality (the same N for every direction that
    reads that modality); ``cases``: optionally the truth behind them (:class:`unimodal.inference.evaluate.EvalCase`,
    in the same order), for judged quality. ``compile_direction``: also time that direction with the denoising
    step under ``torch.compile``; ``cache_check=False``: skip the uncached repeat of every setting (the cache
    figure is then not measured). Returns a JSON-ready report: settings, device, memory kind, one row per
    measure and the issue's target checks."""
    swept = set(SWEPT_FIELDS) & set(sampling or {})
    if swept:
        raise InputError(f"sampling settings shared by the sweep cannot set {sorted(swept)}: the sweep sets "
                         f"{', '.join(SWEPT_FIELDS)} itself (use taus / steps)")
    settings, judges = sweep(taus, steps), Judges()
    rows = []
    for direction in directions:
        condition, _ = parse_direction(direction)
        if not conditions.get(condition):
            raise InputError(f"direction {direction} needs {condition} conditions; none were given")
        rows += bench_direction(pipe, direction, conditions[condition], settings, seed, sampling, cases, judges,
                                cache_check)
        if progress is not None:
            progress(direction)
    device = pipe.backbone.device
    sampling = shared_settings(sampling)
    return {"model": None if model_path is None else str(model_path), "seed": seed,
            "temperature": sampling["temperature"], "sampling": sampling,
            "device": str(device), "torch_threads": torch.get_num_threads(),
            "samples": {m: len(v) for m, v in conditions.items()}, "directions": list(directions),
            "taus": [float(t) for t in taus], "steps": [int(n) for n in steps], "cache_check": cache_check,
            "settings": [asdict(s) for s in settings], "reference": REFERENCE,
            "memory_kind": peak_memory(device)[1], "rows": rows, "targets": target_checks(rows),
            "compile": None if compile_direction is None else
            compile_speedup(pipe, compile_direction, conditions[parse_direction(compile_direction)[0]], seed,
                            sampling=sampling)}


def target_checks(rows: list[dict]) -> dict:
    """The sampling figures asked of the model, read off the rows (cached rows; quality where judged):
    images within 3 points of the all-steps quality in <= 8 passes; text at TPF >= 3 within 2 points; the
    cache >= 2x faster, with identical tokens, where the condition is at least as long as the target."""
    checks = {}
    for direction in dict.fromkeys(r["direction"] for r in rows):
        mine = [r for r in rows if r["direction"] == direction and r["use_cache"]]
        reference = next(r for r in mine if r["setting"] == REFERENCE)
        key = "quality" if reference.get("quality") is not None else "agreement"
        target = direction.split("->")[1]
        if target in ("image", "text"):
            fast = [r for r in mine if (r["forward_passes"] <= 8 if target == "image" else r["tpf"] >= 3)]
            best = max(fast, key=lambda r: r[key], default=None)
            margin = 0.03 if target == "image" else 0.02
            checks[direction] = {"measure": key, "reference": reference[key],
                                 "rule": "passes <= 8" if target == "image" else "TPF >= 3",
                                 "best_setting": best and best["setting"], "best": best and best[key],
                                 "best_passes": best and best["forward_passes"], "best_tpf": best and best["tpf"],
                                 "met": bool(best and best[key] >= reference[key] - margin),
                                 "difference": best and paired_difference(best.get("verdicts"),
                                                                          reference.get("verdicts"))}
        speedups = [r["cache_speedup"] for r in mine if r["cache_speedup"] is not None]
        checks.setdefault(direction, {})["cache"] = None if not speedups else {
            "median_speedup": float(np.median(speedups)), "identical": all(r["cache_tokens_identical"] for r in mine)}
    return checks


__all__ = ["bench_direction", "bench_sample", "judged_verdicts", "target_checks"]
