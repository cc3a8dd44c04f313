"""The sampling benchmark's report as a person reads it: a fixed-width table, a plot of quality against
forward passes, and both written to a folder."""

from __future__ import annotations

import json
from pathlib import Path

from unimodal.core.figures import pyplot, save_figure

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
    plt = pyplot()
    import matplotlib.ticker

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
    return save_figure(figure, path, dpi=120)


def save_report(report: dict, out: str | Path) -> tuple[Path, Path]:
    """``out/bench_sample.json`` and ``out/bench_sample.png``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "bench_sample.json"
    json_path.write_text(json.dumps(report, indent=2))
    return json_path, plot(report, out / "bench_sample.png")


__all__ = ["format_table", "plot", "save_report"]
