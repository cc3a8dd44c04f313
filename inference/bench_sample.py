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
them from a data set is the caller's business (``unimodal/cli.py``), since ``inference/`` must not import
``training/``.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from unimodal.inference.evaluate import Judges, caption_correct, judge_image, paired_difference, shell_hint, verdicts_of
from unimodal.inference.sampler import Request, SampleResult, SamplerConfig, generate
from unimodal.tokenizers_mm.layout import MODALITIES
from unimodal.core.errors import InputError

DEFAULT_DIRECTIONS = ("text->image", "image->text", "text->audio", "audio->text", "audio->image", "image->audio")
DEFAULT_TAUS = (0.5, 0.7, 0.9)
DEFAULT_STEPS = (4, 8, 16, 64)
REFERENCE = "all-steps"
SWEPT_FIELDS = ("steps", "mode", "schedule", "tau", "seed", "use_cache")  # what each Setting decides itself


def shared_settings(sampling: dict | None) -> dict:
    """The settings every row shares: greedy unless ``sampling`` says otherwise, plus ``sampling``."""
    return {"temperature": 0.0, **(sampling or {})}


@dataclass(frozen=True)
class Setting:
    """One sampler setting of the sweep; ``steps`` None means "as many as target slots"."""

    name: str
    mode: str
    schedule: str = "cosine"
    steps: int | None = None
    tau: float | None = None

    def config(self, n_slots: int, use_cache: bool, seed: int, sampling: dict | None = None) -> SamplerConfig:
        """``sampling``: the settings shared by the whole sweep (temperature, cfg, choice_temperature, ...)."""
        return SamplerConfig(mode=self.mode, schedule=self.schedule, steps=self.steps or n_slots,
                             tau=self.tau if self.tau is not None else 0.9, use_cache=use_cache, seed=seed,
                             **shared_settings(sampling))


def sweep(taus, steps) -> list[Setting]:
    """The reference first, then the tau sweep (threshold mode), then the step counts (confidence mode)."""
    return ([Setting(REFERENCE, "confidence", schedule="linear")]
            + [Setting(f"tau={tau:g}", "threshold", tau=float(tau)) for tau in taus]
            + [Setting(f"steps={n}", "confidence", steps=int(n)) for n in steps])


def parse_direction(text: str) -> tuple[str, str]:
    """``"text->image"`` -> ("text", "image"), with a clear error for anything else."""
    condition, arrow, target = (part.strip() for part in text.partition("->"))
    if not arrow or condition not in MODALITIES or target not in MODALITIES or condition == target:
        raise InputError(f"a direction is CONDITION->TARGET with two different modalities among {MODALITIES}, "
                         f"e.g. text->image; got {text!r}{shell_hint(text)}")
    return condition, target


# ---- conditions ---------------------------------------------------------------------------------------------------


@torch.no_grad()
def encode_conditions(pipe, modality: str, values: list) -> list[torch.Tensor]:
    """Local ids of each condition, cut to what the layout holds (as training cut them)."""
    longest = pipe.layout.max_content_len(modality)
    return [torch.as_tensor(ids)[:longest].cpu() for ids in pipe.codecs[modality].encode(list(values))]


def target_slots(layout, modality: str) -> int:
    """Slots of a full-size target of ``modality`` (what the sampler fills)."""
    return len(layout.pack([layout.target_segment(modality)]).spans[0].slots)


# ---- measuring ----------------------------------------------------------------------------------------------------


def _peak_memory_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, what the figure is): see the module docstring."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_memory_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024), "process_rss_high_water_mark"


def _slot_ids(result: SampleResult) -> torch.Tensor:
    """The packed target at its slots (content, END, PAD): fixed length, so two results compare slot by slot."""
    return torch.cat([result.target.ids[list(span.slots)] for span in result.target.spans])


def agreement(results: list[SampleResult], reference: list[SampleResult]) -> float:
    """Fraction of target slots equal to the reference's, over all samples."""
    same = sum(int((_slot_ids(a) == _slot_ids(b)).sum()) for a, b in zip(results, reference))
    return same / sum(len(_slot_ids(b)) for b in reference)


def timed_generate(model, layout, requests: list[Request], config: SamplerConfig):
    """(results, wall seconds, peak memory bytes, memory kind) of one batched :func:`generate` call."""
    device = model.device
    _peak_memory_reset(device)
    start = time.perf_counter()
    results = generate(model, layout, requests, config)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - start
    return (results, wall, *_peak_memory(device))


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
            tokens[use_cache] = [_slot_ids(r) for r in results]
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
            "memory_kind": _peak_memory(device)[1], "rows": rows, "targets": target_checks(rows),
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
    same = all(torch.equal(_slot_ids(a), _slot_ids(b)) for a, b in zip(outputs["eager"], outputs["compiled"]))
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


# ---- reporting ----------------------------------------------------------------------------------------------------

_COLUMNS = (("direction", "{:<13}"), ("setting", "{:<10}"), ("use_cache", "{!s:<5}"), ("forward_passes", "{:>7.1f}"),
            ("tpf", "{:>6.2f}"), ("wall_s_per_sample", "{:>9.4f}"), ("peak_memory_bytes", "{:>8.1f}"),
            ("agreement", "{:>6.3f}"), ("quality", "{:>7}"), ("cache_speedup", "{:>6.2f}"),
            ("cache_tokens_identical", "{!s:<5}"))
_HEADERS = ("direction", "setting", "cache", "passes", "TPF", "s/sample", "peak MiB", "agree", "quality", "speedup",
            "same")


def format_table(report: dict) -> str:
    """A fixed-width table, one line per row of the report."""
    widths = [len(fmt.format(_example(key))) for key, fmt in _COLUMNS]
    lines = ["  ".join(h.ljust(w) for h, w in zip(_HEADERS, widths))]
    for row in report["rows"]:
        values = [row[key] / 2**20 if key == "peak_memory_bytes" else row[key] for key, _ in _COLUMNS]
        values = [None if v is None else f"{v:.3f}" if k == "quality" else v for (k, _), v in zip(_COLUMNS, values)]
        lines.append("  ".join("-".rjust(w) if v is None else fmt.format(v)
                               for (_, fmt), v, w in zip(_COLUMNS, values, widths)))
    lines.append(f"shared sampler settings: {json.dumps(report.get('sampling', {}))}; seed {report['seed']}")
    lines.append(f"peak memory: {report['memory_kind']}; agreement: with {report['reference']} "
                 f"(confidence mode, one token per forward pass); quality: judged accuracy (images: every "
                 f"attribute right; text: caption parses to the truth); speedup: wall(no cache) / wall(cache)")
    lines += [_target_line(direction, check) for direction, check in report.get("targets", {}).items()]
    if report.get("compile"):
        c = report["compile"]
        lines.append(f"torch.compile ({c['direction']}, {c['steps']} steps, {c['samples']} samples): eager "
                     f"{c['eager_s']:.3f} s, compiled {c['compiled_s']:.3f} s -> {c['speedup']:.2f}x (first call "
                     f"{c['first_call_s']:.1f} s incl. compiling; identical tokens: {c['identical_tokens']})")
    return "\n".join(lines)


def _target_line(direction: str, check: dict) -> str:
    cache = check["cache"]
    line = f"target {direction}: " + ("cache not measured (cache_check off)" if cache is None else
                                      f"cache {cache['median_speedup']:.2f}x (identical: {cache['identical']})")
    if "rule" in check:
        best = "none" if check["best_setting"] is None else \
            f"{check['best_setting']} {check['measure']} {check['best']:.3f} at {check['best_passes']:.1f} passes, " \
            f"TPF {check['best_tpf']:.2f}"
        line += (f"; {check['rule']}: best {best} vs all-steps {check['reference']:.3f} -> "
                 f"{'met' if check['met'] else 'NOT met'}")
        if check.get("difference"):
            d = check["difference"]
            line += (f" (paired difference {d['mean']:+.3f}, 95% interval {d['ci95'][0]:+.3f} to "
                     f"{d['ci95'][1]:+.3f}, {d['cases']} cases)")
    return line


def _example(key: str):
    return {"direction": "", "setting": "", "use_cache": False, "cache_tokens_identical": False,
            "quality": "0.000"}.get(key, 0.0)


def plot(report: dict, path: str | Path) -> Path:
    """Quality vs forward passes per sample (cached rows), one line per direction; log2 x axis. Judged quality
    (solid) where the direction has it, agreement with the all-steps output (dashed) otherwise."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for direction in report["directions"]:
        mine = [r for r in report["rows"] if r["direction"] == direction and r["use_cache"]]
        judged = all(r.get("quality") is not None for r in mine)
        key = "quality" if judged else "agreement"
        points = sorted((r["forward_passes"], r[key]) for r in mine)
        axis.plot(*zip(*points), marker="o", linestyle="-" if judged else "--",
                  label=f"{direction} ({'judged quality' if judged else 'agreement'})")
    axis.set_xscale("log", base=2)
    axis.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axis.set_xlabel("forward passes per sample")
    axis.set_ylabel(f"judged quality, or agreement with {report['reference']} (dashed)")
    axis.set_ylim(-0.02, 1.02)
    shared = ", ".join(f"{k} {v}" for k, v in report.get("sampling", {"temperature": report["temperature"]}).items())
    axis.set_title(f"sampler settings (seed {report['seed']}, {shared})", fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return Path(path)


def save_report(report: dict, out: str | Path) -> tuple[Path, Path]:
    """``out/bench_sample.json`` and ``out/bench_sample.png``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "bench_sample.json"
    json_path.write_text(json.dumps(report, indent=2))
    return json_path, plot(report, out / "bench_sample.png")


__all__ = ["DEFAULT_DIRECTIONS", "DEFAULT_STEPS", "DEFAULT_TAUS", "REFERENCE", "Setting", "agreement",
           "bench_direction", "bench_sample", "encode_conditions", "format_table", "parse_direction", "plot",
           "save_report", "sweep", "target_slots"]
