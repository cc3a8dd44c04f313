"""``unimodal bench versus-ar``: the diffusion model against its autoregressive twin, same prompts, one run.

For each direction the same cases go to the autoregressive twin (KV-cache decoding, one model call per
token) and to the diffusion model under a sweep of sampler settings. The batches are interleaved: every
chunk of prompts is run by every contender before the next chunk, in an order that rotates, so a slow patch
of the machine hits everyone alike. Each contender's outputs are then judged exactly as ``unimodal eval``
judges them. Reported per contender: wall seconds and forward passes per sample and judged quality; per
direction: the speed ratio (AR wall / diffusion wall) of the fastest diffusion setting whose quality
matches or beats the twin's ("at matched quality"), or None when no setting does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from unimodal.inference.evaluate import (EvalCase, Judges, eval_requests, paired_difference, parse_direction,
                                score_direction, summarize, verdicts_of)
from unimodal.core.errors import InputError
from unimodal.core.figures import pyplot, save_figure

DEFAULT_DIRECTIONS = ("text->image", "image->text", "text->audio")
DEFAULT_SWEEP = ({"mode": "confidence", "steps": 4}, {"mode": "confidence", "steps": 8},
                 {"mode": "confidence", "steps": 16}, {"mode": "confidence", "steps": 32},
                 {"mode": "threshold", "tau": 0.7, "steps": 64}, {"mode": "threshold", "tau": 0.9, "steps": 64},
                 {"mode": "threshold", "tau": 0.95, "steps": 64})
AR = "ar"


# The two models side by side, each as it reads: the caption check against a rival (the pipeline's default for the
# diffusion model, unimodal.rivals) is a second read the twin has no way to make, so it is left out of both; so is
# the refine the pipeline runs on speech by default (unimodal.refine.SPEECH_REFINE_ROUNDS), which the twin cannot run.
AS_READ = {"rivals": False, "refine": 0}


def setting_name(setting: dict) -> str:
    if setting.get("mode") == "threshold":
        return f"tau{setting['tau']:g}"
    return f"{setting.get('mode', 'confidence')}{setting.get('steps', '')}"


def quality(figures: dict, direction: str) -> float:
    """One number per contender, higher is better: judged accuracy (the speech judge's for ->audio)."""
    return figures.get("accuracy", float("nan"))


def _timed_chunks(contenders: dict, direction: str, cases: Sequence[EvalCase], seed: int, batch_size: int,
                  progress: bool) -> tuple[dict, dict]:
    from tqdm.auto import tqdm

    requests = eval_requests(direction, cases, seed)
    results = {name: [] for name in contenders}
    seconds = {name: 0.0 for name in contenders}
    names = list(contenders)
    chunks = range(0, len(requests), batch_size)
    for turn, first in enumerate(tqdm(chunks, desc=direction, disable=not progress, leave=False)):
        for name in names[turn % len(names):] + names[:turn % len(names)]:  # rotate who goes first
            pipe, settings = contenders[name]
            start = time.perf_counter()
            results[name] += pipe.generate_batch(requests[first:first + batch_size], **{**AS_READ, **settings})
            seconds[name] += time.perf_counter() - start
    return results, {name: s / len(requests) for name, s in seconds.items()}


def _warm_up(contenders: dict, direction: str, case: EvalCase) -> None:
    for pipe, settings in contenders.values():  # first calls pay for lazy initialisation: untimed
        pipe.generate_batch(eval_requests(direction, [case], 0), **{**AS_READ, **settings})


def versus_ar(diffusion, autoregressive, cases: Sequence[EvalCase], directions: Sequence[str] = DEFAULT_DIRECTIONS,
              sweep: Sequence[dict] = DEFAULT_SWEEP, temperature: float | None = None, seed: int = 0,
              batch_size: int = 16, judges: Judges | None = None, progress: bool = True) -> dict:
    """The whole comparison; returns a JSON-ready report with one row per (direction, contender).

    ``temperature`` None (default): each model samples each output with its own per-output defaults (the
    pipelines' ``target_settings``: the diffusion model draws images and speech at temperature 1 with guidance
    and decodes captions greedily; the twin takes the temperature / top-k / top-p of the same table), i.e. as a
    user gets them; a number applies to both models in every direction. Each row records the settings the
    sampler actually used (``effective_settings``)."""
    judges = judges or Judges()
    shared = {} if temperature is None else {"temperature": temperature}
    contenders = {AR: (autoregressive, dict(shared))}
    contenders |= {setting_name(s): (diffusion, {**s, **shared}) for s in sweep}
    rows, summary = [], {}
    for direction in directions:
        conditions, _ = parse_direction(direction)
        usable = [c for c in cases if all(getattr(c, m) is not None for m in conditions)]
        if not usable:
            raise InputError(f"no case has the {conditions[0]} that {direction} reads; choose other --directions "
                             f"or --data")
        _warm_up(contenders, direction, usable[0])
        results, walls = _timed_chunks(contenders, direction, usable, seed, batch_size, progress)
        for name, outputs in results.items():
            scores = score_direction(direction, usable, outputs, judges)
            figures = summarize(direction, usable, outputs, scores, walls[name])
            rows.append({"direction": direction, "contender": name, "settings": contenders[name][1],
                         "effective_settings": outputs[0].settings, "quality": quality(figures, direction),
                         **figures, "verdicts": verdicts_of(s.get("correct") for s in scores)})
        summary[direction] = matched_speedup([r for r in rows if r["direction"] == direction])
    return {"directions": list(directions), "temperature": temperature, "seed": seed, "batch_size": batch_size,
            "n": len(cases), "rows": rows, "summary": summary}


def matched_speedup(rows: Sequence[dict]) -> dict:
    """AR wall / diffusion wall for the fastest diffusion setting at least as good as the twin (and overall).

    Both models judged the same prompts, so next to each setting's accuracy goes the paired difference
    (diffusion - AR) over the cases with its 95% bootstrap interval: "matched" on 32 prompts can be luck,
    and the interval says how much."""
    ar = next(r for r in rows if r["contender"] == AR)
    diffusion = [r for r in rows if r["contender"] != AR]
    matched = [r for r in diffusion if r["quality"] >= ar["quality"]]
    best = min(matched, key=lambda r: r["wall_s_per_sample"]) if matched else None
    fastest = min(diffusion, key=lambda r: r["wall_s_per_sample"])
    return {"ar_quality": ar["quality"], "ar_wall_s": ar["wall_s_per_sample"],
            "matched_setting": best["contender"] if best else None,
            "matched_quality": best["quality"] if best else None,
            "speedup_at_matched_quality": ar["wall_s_per_sample"] / best["wall_s_per_sample"] if best else None,
            "fastest_setting": fastest["contender"], "fastest_quality": fastest["quality"],
            "speedup_fastest": ar["wall_s_per_sample"] / fastest["wall_s_per_sample"],
            "matched_minus_ar": paired_difference(best.get("verdicts"), ar.get("verdicts")) if best else None,
            "fastest_minus_ar": paired_difference(fastest.get("verdicts"), ar.get("verdicts"))}


def format_table(report: dict) -> str:
    lines = [f"{'direction':<13} {'contender':<13} {'passes':>7} {'s/sample':>9} {'quality':>8} {'WER':>6}"]
    for row in report["rows"]:
        wer = row.get("wer")
        lines.append(f"{row['direction']:<13} {row['contender']:<13} {row['forward_passes']:>7.1f} "
                     f"{row['wall_s_per_sample']:>9.4f} {row['quality']:>8.3f} "
                     f"{'-' if wer is None else f'{wer:.3f}':>6}")
    for direction, s in report["summary"].items():
        matched = "no diffusion setting matches the twin's quality" if s["matched_setting"] is None else \
            f"{s['speedup_at_matched_quality']:.2f}x at matched quality ({s['matched_setting']}: " \
            f"{s['matched_quality']:.3f} vs AR {s['ar_quality']:.3f})"
        lines.append(f"{direction}: diffusion vs AR twin: {matched}{_interval(s.get('matched_minus_ar'))}; "
                     f"fastest setting {s['fastest_setting']} {s['speedup_fastest']:.2f}x at quality "
                     f"{s['fastest_quality']:.3f}{_interval(s.get('fastest_minus_ar'))}")
    lines.append(f"quality: judged accuracy (caption/transcript attributes equal the truth for ->text/->audio); "
                 f"{_temperature_words(report['temperature'])}, seed {report['seed']}, batch {report['batch_size']}")
    return "\n".join(lines)


def plot(report: dict, path) -> str:
    """Quality vs forward passes per sample: the diffusion sweep as a line per direction, the twin as a star."""
    plt = pyplot()

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for index, direction in enumerate(report["directions"]):
        color = f"C{index}"
        rows = [r for r in report["rows"] if r["direction"] == direction]
        points = sorted((r["forward_passes"], r["quality"]) for r in rows if r["contender"] != AR)
        axis.plot(*zip(*points), marker="o", color=color, label=f"{direction} diffusion")
        ar = next(r for r in rows if r["contender"] == AR)
        axis.scatter([ar["forward_passes"]], [ar["quality"]], marker="*", s=180, color=color, edgecolor="black",
                     label=f"{direction} AR twin", zorder=3)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("forward passes per sample")
    axis.set_ylabel("judged quality")
    axis.set_ylim(-0.02, 1.02)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    axis.set_title(f"diffusion sampler sweep vs autoregressive twin\n({_temperature_words(report['temperature'])}, "
                   f"batch {report['batch_size']}, {report['n']} cases)", fontsize=10)
    return str(save_figure(figure, path, dpi=120))


def _interval(difference: dict | None) -> str:
    if not difference:
        return ""
    low, high = difference["ci95"]
    return f" [paired diff {difference['mean']:+.3f}, 95% CI {low:+.3f}..{high:+.3f}, {difference['cases']} cases]"


def _temperature_words(temperature: float | None) -> str:
    return "each model's per-output sampling defaults" if temperature is None else f"temperature {temperature:g}"


__all__ = ["DEFAULT_DIRECTIONS", "DEFAULT_SWEEP", "format_table", "matched_speedup", "plot", "setting_name",
           "versus_ar"]
