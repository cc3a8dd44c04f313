"""Judged accuracy against training compute: ``bench recipe`` runs of one mixture at several budgets, the
diffusion model and its autoregressive twin on one figure (``unimodal bench recipe-curve``).

Issue 13 asks, of a goal not met, what compute the curve says would reach it. A recipe run's compute is
counted, not timed: torch's FLOP counter over the run's own training step as it executes (a complementary mask
trains each sample twice a step, its condition computed once; diffusion computes logits only at masked slots over
their modality's ids; the twin over the whole vocabulary at every slot), times its steps. Minutes on a shared CPU
say little; counted FLOPs are the same on any machine.

Each direction's points are read per objective, in log compute: where a twin point falls inside the diffusion
runs' range, the diffusion accuracy at the same FLOPs is interpolated between the two runs around it; a least-
squares line of accuracy on log10 FLOPs per objective (two points or more) gives the gain per tenfold compute, and
the diffusion compute that line needs to reach each twin point's accuracy, flagged as extrapolated when it lies
beyond the largest diffusion run. Two or three budgets make a rough line, not a scaling law: the report says how
many points each line rests on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from unimodal.core.errors import InputError
from unimodal.core.figures import pyplot, save_figure

CURVE_FILE, FIGURE_FILE = "curve.json", "curve.png"
Z95 = 1.959964
FLOP_SAMPLES = 4  # batches of a run whose step the FLOP counter reads (spread over the run)


def wilson_interval(right: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a proportion ``right / n`` (sound at 0 and n, unlike the normal one)."""
    if n <= 0:
        return (float("nan"), float("nan"))
    p, z2 = right / n, Z95 ** 2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def training_flops(run: str | Path, data: str, samples: int = FLOP_SAMPLES) -> dict:
    """Model FLOPs a ``unimodal train`` run spent: the forward and backward of its own training step, counted by
    torch's FLOP counter (``torch.utils.flop_counter``: every matmul and attention as executed, so the sparse
    head, the unpadded layers and the condition computed once for a sample's complementary rows count as they
    ran) on ``samples`` of its batches spread over the run (rebuilt from ``data`` and its config, the same
    batches it trained on), times the steps its ``history.json`` records (a step recorded twice, by a resumed
    run, counts once). The weights are a fresh initialisation of its architecture: FLOPs do not depend on them."""
    from dataclasses import fields

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from unimodal.backbone.dit import DiT
    from unimodal.training.data.sources import resolve_weighted
    from unimodal.training.schedule import MaskSchedule
    from unimodal.training.tokens import CodecStack
    from unimodal.training.train import StepBatches, TrainConfig, objective_loss, weighted_train_tokens

    run = Path(run)
    model_dir = run / "model"
    try:
        history = json.loads((run / "history.json").read_text())
        config = json.loads((model_dir / "training_config.json").read_text())
        backbone = json.loads((model_dir / "backbone" / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise InputError(f"{run} is not a finished training run with its history.json and model folder (the "
                         f"compute of a recipe variant is counted from them): {error}") from None
    steps = len({record["step"] for record in history if "step" in record})
    cfg = TrainConfig(**{f.name: config[f.name] for f in fields(TrainConfig) if f.name in config})
    stack = CodecStack.load(model_dir)
    tokens, _ = weighted_train_tokens(stack, model_dir, resolve_weighted([d for d in data.split(",") if d]))
    torch.manual_seed(0)
    model = DiT(**{k: v for k, v in backbone.items() if not k.startswith("_")}).train()
    spec = cfg.loss_spec(stack.layout)
    batches = StepBatches(stack.layout, tokens, cfg, 0, cfg.steps, rank=0, world=1)
    counted = []
    for step in np.linspace(0, cfg.steps - 1, samples).round().astype(int):
        _, seed, chunks = batches.batches(int(step))
        with FlopCounterMode(display=False, custom_mapping=_cpu_attention_flops()) as counter:
            for chunk in chunks:
                loss, _ = objective_loss(model, chunk, cfg, MaskSchedule(), torch.Generator().manual_seed(seed), spec)
                loss.backward()
        counted.append(counter.get_total_flops())
        model.zero_grad(set_to_none=True)
    per_step = float(np.mean(counted))
    return {"flops": per_step * steps, "flops_per_step": per_step, "steps": steps, "sampled_steps": samples,
            "objective": "ar" if cfg.autoregressive else "diffusion",
            "masking": None if cfg.autoregressive else cfg.masking}


def _cpu_attention_flops() -> dict:
    """torch's attention FLOP formulas for the CPU's fused attention kernel, which its counter (as of torch 2.11)
    registers for the GPU kernels only: without them a CPU count leaves attention out."""
    import torch
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    def forward(query, key, value, *args, out_shape=None, **kwargs):
        return sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs):
        return sdpa_backward_flop_count(grad_out, query, key, value)

    aten = torch.ops.aten
    return {aten._scaled_dot_product_flash_attention_for_cpu: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}


def curve_point(spec: str) -> dict:
    """One point: ``RECIPE:VARIANT`` (a variant of a recipe.json, or of the folder holding it), judged as its
    recipe judged it, or ``RECIPE:VARIANT=EVAL``: judged by an ``unimodal eval`` report of that variant's model
    (more cases, say), refused unless the report names the model's hash."""
    from unimodal.cli_common import read_report
    from unimodal.core.paths import model_hash

    spec_part, _, eval_part = spec.partition("=")
    path, _, name = spec_part.rpartition(":")
    if not path or not name:
        raise InputError(f"a curve point is RECIPE:VARIANT or RECIPE:VARIANT=EVAL, got {spec!r}")
    report = read_report(path, "a recipe.json of unimodal bench recipe (or a folder holding one)", ("variants",),
                         "recipe.json")
    variants = report["variants"]
    if name not in variants:
        raise InputError(f"{path} has no variant {name!r}; it holds {sorted(variants) or 'none'}")
    variant, budget = variants[name], report["budget"]
    folder = Path(path).expanduser()
    source = (folder / "recipe.json" if folder.is_dir() else folder).resolve()
    folder = source.parent
    run = folder / Path(variant["run"]).name  # recipe runs live beside their recipe.json
    if variant.get("train_flops"):  # counted by bench recipe when it trained: not counted again
        from unimodal.training.train import TrainConfig

        ar = variant["overrides"].get("objective") == "ar"
        compute = {"flops": variant["train_flops"], "objective": "ar" if ar else "diffusion",
                   "masking": None if ar else variant["overrides"].get("masking", TrainConfig.masking)}
    else:  # a report written before bench recipe recorded the count: count it from the run
        compute = training_flops(run, budget["data"])
    judged = _judged(variant.get("judged", {}))
    judged_by = "recipe"
    if eval_part:
        ev = read_report(eval_part, "an eval.json of unimodal eval (or a folder holding one)", ("figures",),
                         "eval.json")
        own = model_hash(run / "model") if (run / "model").is_dir() else variant.get("model_hash")
        if own is None:
            raise InputError(f"{spec}: neither {run / 'model'} nor a model hash recorded in {path} says which model "
                             f"{eval_part} must have judged")
        if ev.get("model_hash") != own:
            raise InputError(f"{eval_part} judged the model {ev.get('model_hash')}, not {name}'s ({own}, "
                             f"{run / 'model'})")
        judged = _judged({d: f for d, f in ev["figures"].items() if d in judged})
        judged_by = eval_part
    for figure in judged.values():
        verdicts = [v for v in figure.pop("verdicts") or [] if v is not None]
        figure["n"], figure["right"] = len(verdicts), int(sum(verdicts))
        figure["ci95"] = list(wilson_interval(figure["right"], figure["n"]))
    probe = variant.get("probe") or {}
    return {"spec": spec, "source": f"{source}:{name}", "variant": name, "objective": compute["objective"],
            "masking": compute["masking"],
            "steps": budget["steps"], "batch_size": budget["batch_size"], "data": budget["data"],
            "tasks": variant["overrides"].get("task_weights", budget["tasks"]), "flops": compute["flops"],
            "minutes": (variant.get("step_seconds") or variant.get("seconds") or 0) / 60 or None,
            "judged": judged, "judged_by": judged_by, "probe": probe.get("accuracy"),
            # the validation loss the run ended with, per judged direction (its objective's own loss)
            "val": {d: (variant.get("val") or {}).get(d) for d in judged},
            "probe_shape": probe.get("by_class", {}).get("shape", {}).get("accuracy")}


def _judged(figures: dict) -> dict:
    """Each direction's accuracy and verdicts, from a recipe variant's or an eval report's figures."""
    return {d: {"accuracy": f.get("accuracy"), "verdicts": f.get("verdicts")} for d, f in figures.items()}


def _fit(points: list[dict], direction: str):
    xs = [math.log10(p["flops"]) for p in points]
    ys = [p["judged"][direction]["accuracy"] for p in points]
    if len(set(xs)) < 2:
        return None
    slope, intercept = np.polyfit(xs, ys, 1)
    return {"per_tenfold": float(slope), "intercept": float(intercept), "points": len(points)}


def _interpolated(points: list[dict], direction: str, flops: float) -> float | None:
    """The accuracy at ``flops`` on the straight line (in log compute) between the two runs around it."""
    for low, high in zip(points, points[1:]):
        if low["flops"] <= flops <= high["flops"]:
            a, b = math.log10(low["flops"]), math.log10(high["flops"])
            w = 0.0 if b == a else (math.log10(flops) - a) / (b - a)
            return (1 - w) * low["judged"][direction]["accuracy"] + w * high["judged"][direction]["accuracy"]
    return None


def _crossing(fits: dict, points: list[dict]) -> dict | None:
    """Where the diffusion line meets the twin's (both fitted): the compute at which diffusion would read as well
    as its twin if both kept their measured slopes; None without two lines, ``never`` when the twin's line
    climbs as fast or faster (or they would meet only beyond 1e30 FLOP). Lines in log compute pass 1.0 somewhere:
    past the accuracy either saturates at, the crossing is a bound, not a forecast."""
    d, t = fits.get("diffusion"), fits.get("ar")
    if not d or not t:
        return None
    gain = d["per_tenfold"] - t["per_tenfold"]
    log_flops = (t["intercept"] - d["intercept"]) / gain if gain > 1e-6 else math.inf
    if log_flops > 30:  # as steep, or meeting beyond 1e30 FLOP: not within any reach
        return {"never": True}
    return {"never": False, "flops": 10 ** log_flops, "accuracy": d["intercept"] + d["per_tenfold"] * log_flops,
            "extrapolated": 10 ** log_flops > max(p["flops"] for p in points) * (1 + 1e-9)}


def _validation(by_objective: dict, direction: str) -> dict:
    """Per objective, the validation loss each run ended with, by compute, and whether a run that trained longer
    ended above one that trained less (``rises``: the repeated data is past what the model generalises from; each
    objective's loss is its own, so they compare within an objective, not across)."""
    out = {}
    for objective, points in by_objective.items():
        ended = [(p["steps"], p["val"].get(direction)) for p in points if p["val"].get(direction) is not None]
        if ended:
            out[objective] = {"ended": [list(e) for e in ended],
                              "rises": any(later[1] > earlier[1] for earlier, later in zip(ended, ended[1:]))}
    return out


def build_curve(specs: list[str]) -> dict:
    points = [curve_point(s) for s in specs]
    seen = {}
    for p in points:  # one run given twice would count twice in its objective's fit
        source = p.pop("source")  # an absolute path: not for the report
        if source in seen:
            raise InputError(f"{seen[source]} and {p['spec']} are the same run; give each run once")
        seen[source] = p["spec"]
    mixtures = {json.dumps(p["tasks"], sort_keys=True) for p in points}
    if len(mixtures) > 1 or len({p["data"] for p in points}) > 1:
        raise InputError("the points of one curve train the same task mixture on the same data; got "
                         + "; ".join(f"{p['spec']}: {p['tasks']} on {p['data']}" for p in points))
    directions = [d for d in points[0]["judged"] if all(d in p["judged"] for p in points)]
    if not directions:
        raise InputError("the points share no judged direction")
    by_objective = {o: sorted((p for p in points if p["objective"] == o), key=lambda p: p["flops"])
                    for o in ("diffusion", "ar")}
    diffusion, twin = by_objective["diffusion"], by_objective["ar"]
    analysis = {}
    for d in directions:
        fits = {o: _fit(ps, d) for o, ps in by_objective.items()}
        rows = []
        for t in twin:
            reached = t["judged"][d]["accuracy"]
            row = {"twin": t["variant"], "twin_flops": t["flops"], "twin_accuracy": reached,
                   "diffusion_at_same_flops": _interpolated(diffusion, d, t["flops"])}
            fit = fits["diffusion"]
            if fit and fit["per_tenfold"] > 0:
                needed = 10 ** ((reached - fit["intercept"]) / fit["per_tenfold"])
                row.update(diffusion_flops_to_match=needed, compute_ratio=needed / t["flops"],
                           extrapolated=needed > diffusion[-1]["flops"] * (1 + 1e-9))
            rows.append(row)
        analysis[d] = {"fits": fits, "against_twin": rows, "crossing": _crossing(fits, points),
                       "validation": _validation(by_objective, d)}
    return {"points": points, "directions": directions, "analysis": analysis,
            "counted": "training FLOPs: torch.utils.flop_counter over the forward and backward of the run's own "
                       f"step ({FLOP_SAMPLES} of its batches), x its steps"}


def format_curve(curve: dict) -> str:
    lines = [f"{'variant':<16} {'objective':<10} {'steps':>6} {'PFLOP':>8} {'min':>6} "
             + " ".join(f"{d + ' [95%]':>26}" for d in curve["directions"]) + f" {'probe':>6} {'shape':>6}"]
    for p in sorted(curve["points"], key=lambda p: (p["objective"], p["flops"])):
        cells = []
        for d in curve["directions"]:
            f = p["judged"][d]
            low, high = f["ci95"]
            cells.append(f"{f['accuracy']:.3f} [{low:.3f},{high:.3f}] n{f['n']}".rjust(26))
        minutes = f"{p['minutes']:6.1f}" if p["minutes"] else f"{'-':>6}"
        probe = f"{p['probe']:6.3f}" if p["probe"] is not None else f"{'-':>6}"
        shape = f"{p['probe_shape']:6.3f}" if p["probe_shape"] is not None else f"{'-':>6}"
        lines.append(f"{p['variant']:<16} {p['objective']:<10} {p['steps']:>6} {p['flops'] / 1e15:8.2f} {minutes} "
                     + " ".join(cells) + f" {probe} {shape}")
    for d in curve["directions"]:
        a = curve["analysis"][d]
        for objective, fit in a["fits"].items():
            if fit:
                lines.append(f"{d}: {objective} {fit['per_tenfold']:+.3f} a tenfold compute (a line through "
                             f"{fit['points']} points)")
        for objective, val in a.get("validation", {}).items():
            ended = ", ".join(f"{loss:.3f} ({steps})" for steps, loss in val["ended"])
            lines.append(f"{d}: {objective} validation loss at each run's end (steps): {ended}"
                         + ("; it rises with training: the runs repeat their data past what the model generalises "
                            "from" if val["rises"] else ""))
        crossing = a.get("crossing")
        if crossing and crossing["never"]:
            lines.append(f"{d}: the lines do not cross: the twin's climbs as fast as diffusion's or faster")
        elif crossing:
            lines.append(f"{d}: the lines cross at {crossing['flops'] / 1e15:.3g} PFLOP, accuracy "
                         f"{crossing['accuracy']:.3f}" + (" (extrapolated beyond the runs)"
                                                           if crossing["extrapolated"] else ""))
        for row in a["against_twin"]:
            same = row["diffusion_at_same_flops"]
            text = (f"{d}: twin {row['twin']} {row['twin_accuracy']:.3f} at {row['twin_flops'] / 1e15:.2f} PFLOP; "
                    f"diffusion at the same compute " + (f"{same:.3f}" if same is not None else "outside its runs"))
            if "compute_ratio" in row:
                text += (f"; the diffusion line reaches {row['twin_accuracy']:.3f} at {row['compute_ratio']:.1f}x "
                         f"the twin's compute" + (" (extrapolated beyond its largest run)" if row["extrapolated"]
                                                  else ""))
            elif a["fits"]["diffusion"]:
                text += "; the diffusion line does not rise with compute"
            lines.append(text)
    lines.append(f"compute: {curve['counted']}")
    return "\n".join(lines)


def plot_curve(curve: dict, path) -> Path:
    """Accuracy against model FLOPs (log scale), one panel per direction, each objective's runs with their 95%
    Wilson intervals and its least-squares line."""
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator

    directions = curve["directions"]
    figure, axes = plt.subplots(1, len(directions), figsize=(5.2 * len(directions), 4.2), squeeze=False)
    names = {"diffusion": "diffusion", "ar": "AR twin"}
    for axis, d in zip(axes[0], directions):
        for objective, style in (("diffusion", "o"), ("ar", "s")):
            ps = sorted((p for p in curve["points"] if p["objective"] == objective), key=lambda p: p["flops"])
            if not ps:
                continue
            x = [p["flops"] / 1e15 for p in ps]
            y = [p["judged"][d]["accuracy"] for p in ps]
            err = [[v - p["judged"][d]["ci95"][0] for v, p in zip(y, ps)],
                   [p["judged"][d]["ci95"][1] - v for v, p in zip(y, ps)]]
            shown = axis.errorbar(x, y, yerr=err, fmt=style, capsize=3, label=names[objective])
            for p, xi, yi in zip(ps, x, y):
                axis.annotate(f"{p['steps']}", (xi, yi), textcoords="offset points", xytext=(6, -3), fontsize=7,
                              color=shown[0].get_color())
            fit = curve["analysis"][d]["fits"][objective]
            if fit:
                span = np.logspace(math.log10(min(x)) - 0.1, math.log10(max(x)) + 0.1, 20)
                axis.plot(span, fit["intercept"] + fit["per_tenfold"] * np.log10(span * 1e15), "--",
                          color=shown[0].get_color(), alpha=0.6)
        axis.set_xscale("log")
        axis.xaxis.set_minor_locator(LogLocator(subs=(2, 3, 5)))
        for which in (axis.xaxis.set_major_formatter, axis.xaxis.set_minor_formatter):
            which(FuncFormatter(lambda value, _: f"{value:.2g}"))
        axis.tick_params(axis="x", which="minor", labelsize=7)
        axis.set_ylim(0, 1)
        axis.set_xlabel("training compute (PFLOP, counted; labels: steps)")
        axis.set_ylabel("judged accuracy (test)")
        axis.set_title(d)
        axis.grid(alpha=0.3)
        axis.legend(loc="best", fontsize=8)
    return save_figure(figure, path)


def _cmd_recipe_curve(args) -> int:
    from unimodal.core.paths import atomic_write, report_json

    curve = build_curve(args.points)
    print(format_curve(curve))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / CURVE_FILE, lambda temporary: temporary.write_text(report_json(curve)))
    print(out / CURVE_FILE)
    print(plot_curve(curve, out / FIGURE_FILE))
    return 0


def add_recipe_curve_command(bench) -> None:
    sub = bench.add_parser("recipe-curve", help="judged accuracy against training compute from bench recipe runs of "
                                                "one mixture at several budgets: diffusion and its AR twin (PNG)")
    sub.add_argument("points", nargs="+", metavar="RECIPE:VARIANT[=EVAL]",
                     help="a variant of a recipe.json (or its folder); =EVAL judges it by an unimodal eval report of "
                          "its model instead (more cases), refused unless the report names that model")
    sub.add_argument("--out", required=True, help="folder for curve.json and curve.png")
    sub.set_defaults(func=_cmd_recipe_curve)


__all__ = ["build_curve", "curve_point", "format_curve", "plot_curve", "training_flops", "wilson_interval"]
