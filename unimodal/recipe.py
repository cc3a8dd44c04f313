"""``unimodal bench recipe``: score training-recipe variants by judged accuracy, at one fixed budget.

Every variant trains the same backbone preset on the same data for the same number of steps and examples
(a budget in examples, so a variant whose step is cheaper is not given more data), then its EMA model is judged
by ``unimodal eval``'s judges on the same test cases, text->image and image->text. A variant is a name and
TrainConfig overrides (``loss_norm=maskable sparse_head=false``); ``objective=ar`` trains the autoregressive
twin with the same budget, the bar the diffusion recipe must reach on reading pictures; ``codecs=FOLDER`` trains
it on other codecs (a codec variant is judged on the same test cases, decoded through its own codecs).

Each run and each verdict is cached in the output folder, so a killed job resumes where it stopped; a variant
name already judged with other settings is refused.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from unimodal.core.errors import InputError
from unimodal.core.paths import report_json
from unimodal.core.provenance import code_version

DIRECTIONS = ("text->image", "image->text")  # what a budget trains by default, and the table's first columns
# What a variant may train and be judged on: the two above, and hearing speech (issue 13's second reading bar: the
# twin's against diffusion's at equal compute), judged when a variant trains it
JUDGED = DIRECTIONS + ("audio->text",)


@dataclass
class RecipeBudget:
    data: str = "scenes"
    preset: str = "mini"
    steps: int = 600
    batch_size: int = 32
    lr: float = 1e-3
    tasks: dict = field(default_factory=lambda: {d: 1.0 for d in DIRECTIONS})
    eval_n: int = 64
    seed: int = 0


def parse_variant(words: list[str]) -> tuple[str, dict]:
    """``["real", "loss_norm=real", "lr=2e-3"]`` -> ("real", {"loss_norm": "real", "lr": 0.002}); values typed
    from TrainConfig's field defaults."""
    from unimodal.training.train import TrainConfig

    name, *pairs = words
    types = {f.name: type(f.default) for f in fields(TrainConfig) if not isinstance(f.default, type(field()))}
    types[CODECS_KEY] = str
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in types:
            raise InputError(f"variant {name!r}: {pair!r} is not KEY=VALUE with KEY a training setting "
                             f"({', '.join(sorted(types))})")
        overrides[key] = _typed(value, types[key], f"variant {name!r}: {key}")
    try:  # a value the trainer refuses is refused now, not after the variants before it have trained
        TrainConfig(**{k: v for k, v in overrides.items() if k != CODECS_KEY})
    except (InputError, TypeError) as error:
        raise InputError(f"variant {name!r}: {error}") from None
    if CODECS_KEY in overrides:
        folder = Path(overrides[CODECS_KEY]).expanduser()
        if not folder.is_dir():
            raise InputError(f"variant {name!r}: codecs={overrides[CODECS_KEY]!r} is not a folder (expected a codec "
                             f"folder with text/, image/ and audio/, or a codecs.json naming them)")
        overrides[CODECS_KEY] = str(folder.resolve())
    return name, overrides


# A variant may train with its own codec folder (``codecs=PATH``), e.g. an image codec with fewer codes: its
# data is tokenised with those codecs and its model judged through them, beside variants on the budget's codecs.
CODECS_KEY = "codecs"


def _typed(value: str, kind: type, what: str):
    if kind is bool:
        if value.lower() not in ("true", "false"):
            raise InputError(f"{what} must be true or false, got {value!r}")
        return value.lower() == "true"
    if kind is type(None):  # a setting whose default is None (e.g. audio_position_rate): a number, JSON or a word
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value  # TrainConfig says whether the word is one it takes
    try:
        return kind(value) if kind in (int, float, str) else json.loads(value)
    except (ValueError, json.JSONDecodeError):
        raise InputError(f"{what}: cannot read {value!r} as {kind.__name__}") from None


def train_variant(budget: RecipeBudget, name: str, overrides: dict, codec_dir, out: Path, progress: bool) -> dict:
    """Train one variant (resumable); returns its run facts (folder, wall time of its steps)."""
    from unimodal.training.train import RunOptions, TrainConfig, train

    run = out / name
    settings = {k: v for k, v in overrides.items() if k != CODECS_KEY}
    codec_dir = overrides.get(CODECS_KEY, codec_dir)
    cfg = TrainConfig(**{"preset": budget.preset, "steps": budget.steps, "batch_size": budget.batch_size,
                         "lr": budget.lr, "warmup": min(100, budget.steps // 10), "task_weights": dict(budget.tasks),
                         "val_every": max(1, budget.steps // 4), "checkpoint_every": 100, "ema_decay": 0.99,
                         "seed": budget.seed, **settings})
    if not (run / "model").is_dir():
        start = time.perf_counter()
        train(run, [d for d in budget.data.split(",") if d], codec_dir, cfg, resume=True, progress=progress,
              options=RunOptions(device="cpu"))
        (run / "wall.json").write_text(json.dumps({"seconds": time.perf_counter() - start}))
    history = json.loads((run / "history.json").read_text())
    from unimodal.core.paths import model_hash
    from unimodal.recipe_curve import training_flops

    return {"run": str(run), "train_flops": training_flops(run, budget.data)["flops"],  # bench recipe-curve's x
            "model_hash": model_hash(run / "model"),  # what an eval of this variant's model must name
            "seconds": json.loads((run / "wall.json").read_text())["seconds"]
            if (run / "wall.json").is_file() else None,
            "step_seconds": step_seconds(history),
            "tokens_per_s_median": _median([h["tokens_per_s"] for h in history if "tokens_per_s" in h]),
            "val": history[-1].get("val", {})}


def step_seconds(history: list[dict]) -> float | None:
    """Seconds the run's optimizer steps took, summed over every process that trained it (a resumed run's history
    holds the steps of each); None when a step was logged without its time (a run trained before it was kept).
    ``seconds`` is the wall clock of the last process alone, validation and checkpoints included."""
    times = [h.get("step_s") for h in history if "train_loss" in h]
    return sum(times) if times and None not in times else None


def _median(values: list[float]) -> float | None:
    values = sorted(values)
    return values[len(values) // 2] if values else None


def trained_directions(budget: RecipeBudget, overrides: dict) -> list[str]:
    """The judged directions a variant trained (``task_weights={"text->image": 1}`` trains, and is judged on,
    drawing alone: a model refuses a direction it was never trained on)."""
    weights = overrides.get("task_weights", budget.tasks)
    return [d for d in JUDGED if weights.get(d, 0) > 0]


def _pairs(reading: dict) -> str:
    """A variant's reading of two-object scenes for its table: accuracy and, where its captions parsed as two
    objects, how alike their objects read against the scenes' own (``-`` for a run judged before it was kept)."""
    pair = (reading.get("by_objects") or {}).get("2")
    if not pair or pair.get("accuracy") is None:
        return "-"
    alike = pair.get("alike")
    return f"{pair['accuracy']:.3f}" + (f" ({alike['read']:.2f}/{alike['truth']:.2f})" if alike else "")


def judge_variant(budget: RecipeBudget, run: Path, progress: bool, directions: list[str] | None = None) -> dict:
    from unimodal.inference.evaluate import Judges, evaluate, verdicts_of
    from unimodal.eval_cases import load_cases
    from unimodal.pipeline import UniModal

    directions = list(DIRECTIONS if directions is None else directions)
    cases, _ = load_cases(budget.data, "test", budget.eval_n, speech="audio->text" in directions)
    pipe = UniModal.from_pretrained(run / "model")
    # a caption's rival check asks the drawing direction (unimodal.rivals): a variant that never learned to draw
    # would choose between the two captions at random, so it reads as read
    settings = {} if "text->image" in directions else {"rivals": False}
    report = evaluate(pipe, cases, directions, settings, seed=budget.seed, judges=Judges(), progress=progress)
    # by_objects: one-object and two-object scenes apart, with how alike the two objects of a caption read are
    return {d: {"accuracy": f.get("accuracy"), "sampler": f.get("sampler"),
                "verdicts": verdicts_of([s.get("correct") for s in report["_samples"][d][2]]),
                **({"by_objects": f["by_objects"]} if f.get("by_objects") else {})}
            for d, f in report["figures"].items()}


PROBE_CAPTIONS = 128  # validation captions the word probe reads (~600 attribute words)


def probe_source(directions: list[str]) -> str | None:
    """What the word probe reads a variant's captions from: its pictures when it learned to read them, else the
    spoken captions when it learned to hear them, else nothing (None: no probe)."""
    return "image" if "image->text" in directions else "audio" if "audio->text" in directions else None


def probe_variant(budget: RecipeBudget, run: Path, source: str = "image") -> dict:
    """The word probe (``unimodal.training.probe``) of a variant's model on the budget's validation captions,
    read from their pictures (``source`` "image") or heard (``"audio"``): a teacher-forced figure on ~600 words,
    far less noisy than 64 judged captions."""
    from unimodal.training.data.sources import resolve_data
    from unimodal.training.probe import word_probe
    from unimodal.training.tokens import CodecStack, tokenized_split

    model = run / "model"
    stack = CodecStack.load(model)
    tokens = [t for data in resolve_data([d for d in budget.data.split(",") if d])
              for t in tokenized_split(stack, model, data, "val", progress=False)]
    return word_probe(model, [t for t in tokens if source in t and "text" in t][:PROBE_CAPTIONS], stack.text,
                      source=source)


def run_recipe(budget: RecipeBudget, variants: list[tuple[str, dict]], codec_dir, out: str | Path,
               progress: bool = True) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "recipe.json"
    report = json.loads(cache.read_text()) if cache.is_file() else {"budget": asdict(budget), "variants": {}}
    if report["budget"] != json.loads(json.dumps(asdict(budget))):
        raise InputError(f"{out} holds a recipe experiment with another budget; use another --out")
    for name, overrides in variants:  # before anything trains: a variant that nothing could judge is refused
        if not trained_directions(budget, overrides):
            raise InputError(f"variant {name!r} trains none of the directions bench recipe judges "
                             f"({', '.join(JUDGED)}): give one of them a weight in task_weights")
    for name, overrides in variants:
        done = report["variants"].get(name)
        if done and done["overrides"] != overrides:
            raise InputError(f"variant {name!r} in {out} was run with {done['overrides']}, not {overrides}")
        directions = trained_directions(budget, overrides)
        source = probe_source(directions)
        if done and "judged" in done and "probe" in done and (done["probe"] or source is None):
            continue
        if done and "judged" in done:  # judged before the probe (or its hearing form) existed: add it
            done["probe"] = probe_variant(budget, Path(done["run"]), source)
        else:
            facts = train_variant(budget, name, overrides, codec_dir, out, progress)
            facts["judged"] = judge_variant(budget, Path(facts["run"]), progress, directions)
            # the probe reads captions: a variant that never learned to read or hear has none (an empty probe)
            facts["probe"] = probe_variant(budget, Path(facts["run"]), source) if source else {}
            facts["code"] = code_version()  # the code that judged it (a long run keeps the code it started with)
            report["variants"][name] = {"overrides": overrides, **facts}
        _save(report, cache)
    return report


def _save(report: dict, cache: Path) -> None:
    tmp = cache.with_name(cache.name + ".tmp")
    tmp.write_text(report_json(report))
    tmp.replace(cache)


def format_report(report: dict) -> str:
    """The variants' table; the last columns are each variant's paired difference from the first one listed
    (same test cases: far less noisy than two accuracies), with its 95% bootstrap interval."""
    from unimodal.inference.evaluate import paired_difference

    budget = report["budget"]
    heard = any("audio->text" in v.get("judged", {}) for v in report["variants"].values())
    width = max([14, *map(len, report["variants"])])  # the variant column fits the longest name
    columns = JUDGED if heard else DIRECTIONS
    lines = [f"probe: attribute words of {PROBE_CAPTIONS} validation captions chosen first, teacher-forced "
             f"(unimodal.training.probe; read from the pictures, or heard for a variant that learned only to hear); "
             f"shape: its shape words; pairs: the two-object scenes read right (alike: the size, colour and shape the two "
             f"objects of its captions share, 0 to 3, against the scenes' own)",
             f"budget: preset {budget['preset']}, {budget['steps']} steps x batch {budget['batch_size']}, lr "
             f"{budget['lr']}, data {budget['data']}, tasks {budget['tasks']}; judged on {budget['eval_n']} test "
             f"cases per direction (per-output sampling defaults)",
             f"{'variant':<{width}} {'train min':>9} {'tok/s':>7} " + " ".join(f"{d:>11}" for d in columns) + " "
             f"{'paired diff vs the first (95% CI)':>{26 * len(columns)}} {'probe':>6} {'shape':>6} "
             f"{'pairs (alike/scenes)':>20}  settings"]
    reference = next(iter(report["variants"].values()), {}).get("judged", {})
    for index, (name, v) in enumerate(report["variants"].items()):
        judged = v.get("judged", {})
        cells = [f"{judged.get(d, {}).get('accuracy', float('nan')):>11.3f}" for d in columns]
        if index == 0:  # the reference itself: no difference to show
            diffs = [f"{'(the reference)' if judged.get(d, {}).get('verdicts') else '-':>24}" for d in columns]
        else:
            diffs = [_diff(paired_difference(judged.get(d, {}).get("verdicts"), reference.get(d, {}).get("verdicts")))
                     for d in columns]
        cells.append(f"{'  '.join(diffs):>{26 * len(columns)}}")
        probe = v.get("probe") or {}
        shape = probe.get("by_class", {}).get("shape", {}).get("accuracy")
        cells.append(f"{probe['accuracy']:6.3f}" if probe else f"{'-':>6}")
        cells.append(f"{shape:6.3f}" if shape is not None else f"{'-':>6}")
        cells.append(f"{_pairs(judged.get('image->text', {})):>20}")
        seconds = v.get("step_seconds") or v.get("seconds")  # the steps of every process, where they were timed
        minutes = f"{seconds / 60:9.1f}" if seconds else f"{'-':>9}"
        speed = f"{v['tokens_per_s_median']:7.0f}" if v.get("tokens_per_s_median") else f"{'-':>7}"
        lines.append(f"{name:<{width}} {minutes} {speed} {' '.join(cells)}  {v['overrides'] or 'defaults'}")
    return "\n".join(lines)


def variant_report(report: dict, name: str, where: str) -> dict:
    """One variant of a ``recipe.json`` in the shape of an ``eval.json`` (its judged directions as figures, the
    budget's test cases), so ``unimodal bench compare`` pairs it with a variant of another experiment (another
    budget: another learning rate, say) or with an eval of the same cases."""
    variants = report.get("variants", {})
    if name not in variants:
        raise InputError(f"{where} has no variant {name!r}; it holds {sorted(variants) or 'none'}")
    budget = report["budget"]
    return {"figures": variants[name].get("judged", {}), "data": budget["data"], "split": "test",
            "n_per_data_set": budget["eval_n"], "seed": budget["seed"], "model_hash": f"{name} ({where})"}


def _diff(diff: dict | None) -> str:
    if diff is None:
        return f"{'-':>24}"
    low, high = diff["ci95"]
    return f"{diff['mean']:+.3f} [{low:+.3f},{high:+.3f}]".rjust(24)


def add_recipe_command(bench) -> None:
    recipe = bench.add_parser("recipe", help="score training-recipe variants by judged accuracy at one fixed budget")
    recipe.add_argument("--variant", nargs="+", action="append", required=True, metavar="NAME [KEY=VALUE ...]",
                        help="a variant: its name, then training settings it changes, e.g. --variant first "
                             "loss_norm=maskable sparse_head=false (repeat for more; objective=ar: the AR twin; "
                             "codecs=FOLDER: its own codec folder)")
    budget_help = {"data": "the data every variant trains on and is judged on: scenes, digits or a built folder",
                   "preset": "backbone size preset every variant trains (see `unimodal train --help`)",
                   "steps": "training steps of every variant (one that sets steps=... leaves the shared budget)",
                   "batch_size": "samples a step, every variant (one that sets batch_size=... leaves the shared "
                                 "budget)",
                   "eval_n": "test cases judged per direction (a Wilson interval of 64 cases is about +-0.12)",
                   "seed": "the seed of every variant's initialisation and batches, and of the sampling it is "
                           "judged by",
                   "lr": "peak learning rate, every variant (lr=... in a variant overrides it)"}
    for name in ("data", "preset"):
        recipe.add_argument(f"--{name}", default=getattr(RecipeBudget, name),
                            help=f"{budget_help[name]} (default {getattr(RecipeBudget, name)})")
    for name in ("steps", "batch_size", "eval_n", "seed"):
        recipe.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(RecipeBudget, name),
                            help=f"{budget_help[name]} (default {getattr(RecipeBudget, name)})")
    recipe.add_argument("--lr", type=float, default=RecipeBudget.lr,
                        help=f"{budget_help['lr']} (default {RecipeBudget.lr})")
    recipe.add_argument("--codecs", default=None, help="codec folder (default: the package's shipped codecs)")
    recipe.add_argument("--out", required=True,
                        help="folder for the runs and recipe.json; the same command again resumes: each variant from "
                             "its last checkpoint (every 100 steps), a judged one not again")
    recipe.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's choice, every core; give 1 to each of two runs "
                             "sharing two cores: with both on every core each step ran ~7x slower)")
    recipe.set_defaults(func=_cmd_recipe)


def _cmd_recipe(args) -> int:
    from unimodal.cli_common import set_threads
    from unimodal.core.paths import default_codecs_dir

    set_threads(args.threads)
    budget = RecipeBudget(data=args.data, preset=args.preset, steps=args.steps, batch_size=args.batch_size,
                          lr=args.lr, eval_n=args.eval_n, seed=args.seed)
    variants = [parse_variant(words) for words in args.variant]
    if len({name for name, _ in variants}) != len(variants):
        raise InputError("each --variant needs its own name")
    report = run_recipe(budget, variants, args.codecs or default_codecs_dir(), args.out)
    print(format_report(report))
    print(Path(args.out) / "recipe.json")
    return 0
