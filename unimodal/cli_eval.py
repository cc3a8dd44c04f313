"""``unimodal eval`` and ``unimodal bench versus-ar``: judged quality per direction, and the AR comparison."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from unimodal.checks import AGREEMENTS, PLANS, SETTING_KEYS, check_settings
from unimodal.checks_refine import CRITICS
from unimodal.core.errors import InputError
from unimodal.core.provenance import code_version

def _settings(args) -> dict:
    """The sampler settings given on the command line (the seed is the evaluation's own, per request; ``--repair``
    is the evaluation's own step, run after each draw of the directions it applies to), checked as a generate
    request's are (before any model loads)."""
    return check_settings({key: getattr(args, key) for key in SETTING_KEYS
                           if key not in ("seed", "repair") and getattr(args, key, None) is not None})


def _directions(text: str, known) -> list[str]:
    directions = [d.strip() for d in text.split(",") if d.strip()]
    unknown = [d for d in directions if d not in known]
    if unknown or not directions:
        raise InputError(f"unknown direction(s) {unknown or 'none'}; known: {', '.join(known)}")
    return directions


def _cmd_eval(args) -> int:
    from unimodal.inference.evaluate import (DIRECTIONS, check_every_draw, check_repair, evaluate, format_table,
                                             model_hash, save_report)
    from unimodal.checks import check_twin_settings
    from unimodal.eval_cases import check_case_request, load_cases
    from unimodal.serve import check_model, load_pipeline

    directions = _directions(args.directions, DIRECTIONS)
    settings = _settings(args)
    if args.refine_critic is not None and args.refine_rounds == 0:
        raise InputError(f"--refine-critic {args.refine_critic} names the critic of the refine rounds; "
                         f"--refine-rounds 0 runs none (give one or the other)")
    check_every_draw(args.every_draw, args.candidates, args.accept_confidence,  # before the model loads
                     args.accept_agreement)
    check_repair(args.repair, directions)
    needs_speech = any("audio" in d or d == "joint" for d in directions)
    # the voice set, the split, the count and each data entry (a built folder's voices among it), before the model
    check_case_request(args.data, args.split, args.n, voices=args.voices)
    if args.voices != "varied" and not needs_speech:
        raise InputError(f"--voices {args.voices} speaks the test captions; no direction asked ({', '.join(directions)}) "
                         f"hears or speaks speech")
    model_dir = check_model(args.model, args.device)
    check_twin_settings(model_dir, {**settings, "refine": args.refine_rounds, "repair": args.repair,
                                    "rivals": args.rivals})
    pipe = load_pipeline(model_dir, args.device)
    if args.refine_critic is not None:  # a head the model never trained: refused before anything is drawn
        from unimodal.refine import require_trained_critic

        require_trained_critic(pipe, args.refine_critic)
    cases, notes = load_cases(args.data, args.split, args.n, speech=needs_speech, voices=args.voices)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    report = evaluate(pipe, cases, directions, settings, seed=args.seed, batch_size=args.batch_size,
                      on_direction=lambda d, f: print(f"done: {d}", file=sys.stderr, flush=True),
                      joint_n=args.joint_n, refine_rounds=args.refine_rounds, every_draw=args.every_draw,
                      repair=args.repair, refine_critic=args.refine_critic)
    report.update(model=str(model_dir), model_hash=model_hash(model_dir), data=args.data, split=args.split,
                  n_per_data_set=args.n, joint_n=args.joint_n, notes=notes, voices=args.voices, code=code_version())
    print(format_table(report))
    spoken = f", spoken in the {args.voices} voices" if needs_speech else ""
    print(f"model {model_dir} (hash {report['model_hash']}), data {args.data}, split {args.split}{spoken}")
    for path in save_report(report, args.out):
        print(path)
    return 0


def _add_sampling_flags(parser, temperature_default) -> None:
    from unimodal.cli_common import parse_cfg

    parser.add_argument("--steps", type=int, default=None, help="model calls (the cap in threshold mode)")
    parser.add_argument("--mode", default=None, choices=["confidence", "threshold", "semi_ar"])
    parser.add_argument("--tau", type=float, default=None)
    parser.add_argument("--temperature", type=float, default=temperature_default,
                        help=f"0 = greedy (default {temperature_default})")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--cfg", type=parse_cfg, default=None, help="guidance scale (3) or per input (text=3)")
    parser.add_argument("--choice-temperature", type=float, default=None,
                        help="Gumbel noise on which slots are committed first, annealed to 0 (MaskGIT)")
    parser.add_argument("--block-length", type=int, default=None,
                        help="--mode semi_ar: slots per left-to-right block (--steps is then per block)")
    parser.add_argument("--rivals", action=argparse.BooleanOptionalAction, default=None,
                        help="a caption read from a picture that names two objects is checked against the same words "
                             "with the relation turned around (default on; --no-rivals: as read)")
    parser.add_argument("--rephrase", action=argparse.BooleanOptionalAction, default=None,
                        help="speech made from a plan in words that is no output (image->audio) says the scene in "
                             "the form the model speaks most clearly (default on; --no-rephrase: as read)")
    parser.add_argument("--plan", default=None, choices=PLANS,
                        help="without a text input, the model writes its plan in words first, then the rest guided "
                             "by it and the inputs (text) or by it alone, one output at a time (text-only, the "
                             "default); or generates from the inputs alone (none)")


def add_eval_command(sub) -> None:
    from unimodal.inference.evaluate import DIRECTIONS
    from unimodal.cli_common import EVAL_HELP, add_model_arguments, refine_rounds
    from unimodal.eval_cases import EVAL_SPLITS

    ev = sub.add_parser("eval", help=EVAL_HELP,
                        description="Judged quality per direction (text->image attribute accuracy, caption "
                                    "accuracy, speech WER, joint consistency), with the judges' figures on the "
                                    "real data beside them. Writes eval.json, one PNG grid per direction and "
                                    "a few WAVs.")
    add_model_arguments(ev)
    ev.add_argument("--data", default="scenes,digits", help="scenes, digits or built data folders, comma-separated")
    ev.add_argument("--split", default="test", choices=EVAL_SPLITS)
    ev.add_argument("--n", type=int, default=100, help="cases per data set")
    ev.add_argument("--directions", default=",".join(DIRECTIONS), help="comma-separated, e.g. text->image,joint")
    ev.add_argument("--seed", type=int, default=0, help="request i is sampled with seed + i")
    ev.add_argument("--batch-size", type=int, default=16)
    ev.add_argument("--joint-n", type=int, default=64, help="samples of joint generation (from nothing)")
    ev.add_argument("--out", default="eval", help="folder for eval.json, the grids and WAVs")
    ev.add_argument("--candidates", type=int, default=None, help="draw this many per case and keep the one the "
                    "model reads back best (generate --candidates); joint, and directions sampled greedily "
                    "(captions by default), are sampled once")
    ev.add_argument("--accept-confidence", type=float, default=None, help="with --candidates: keep a case's first "
                    "draw when its confidence score (mean log-probability, e.g. -0.1) reaches this, else draw them all")
    ev.add_argument("--accept-agreement", type=float, default=None, help="with --candidates: draw a case's "
                    "candidates one at a time and keep the first whose agreement score (mean log-probability of the "
                    "input read back, e.g. -0.3) reaches this, else the best of them all")
    ev.add_argument("--agreement", default=None, choices=AGREEMENTS, help="with --candidates: how each draw is read "
                    "back to choose one (generate --agreement): joint (default) or each")
    ev.add_argument("--every-draw", action="store_true", help="with --candidates N: judge every draw, not only "
                    "the kept one, and print what best-of-k reaches for each k up to N, chosen by each reading "
                    "(--agreement joint and each; one run, N draws a case)")
    ev.add_argument("--refine-rounds", type=refine_rounds, default=None, metavar="ROUNDS",
                    help="then refine each output against its input for up to this many rounds, with refine's "
                    "defaults for that output (a caption read from a picture: doubtful words redrawn and kept by "
                    "agreement), and judge it as refined; joint is not refined. "
                    "Default: as generate refines by default (speech alone, 2 rounds, when the model's critic head "
                    "is trained; nothing else); 0: every output as drawn")
    ev.add_argument("--refine-critic", default=None, choices=CRITICS, help="the critic the refine rounds read "
                    "(default: refine's own for each output: content+learned for speech when the model's critic head "
                    "is trained, confidence otherwise); refused with --refine-rounds 0")
    ev.add_argument("--voices", default="varied", help="the eSpeak voices the test captions are spoken in: varied (the "
                    "default, the voices audio->text learns to understand) or clear (the same captions in the few "
                    "voices the speech judge hears best); refused when no direction asked hears or speaks speech")
    ev.add_argument("--repair", action="store_true", help="text->image and audio->image: read each picture back "
                    "with the model and change each colour, size or place the reading gets otherwise than the "
                    "request (the caption, or the model's transcript of the speech) by an instructed edit from the "
                    "object's own pixels, before any --refine-rounds (UniModal.refine(repair=True))")
    _add_sampling_flags(ev, temperature_default=None)
    ev.set_defaults(func=_cmd_eval)


def _cmd_versus_ar(args) -> int:
    from unimodal.core.paths import report_json
    from unimodal.inference.evaluate import model_hash
    from unimodal.inference.versus import DEFAULT_DIRECTIONS, format_table, plot, versus_ar
    from unimodal.eval_cases import load_cases
    from unimodal.serve import load_pipeline, resolve_model_dir

    directions = _directions(args.directions, DEFAULT_DIRECTIONS + ("audio->text", "image->audio", "audio->image"))
    model_dir, ar_dir = resolve_model_dir(args.model), resolve_model_dir(args.ar_model)
    diffusion, twin = load_pipeline(model_dir, args.device), load_pipeline(ar_dir, args.device)
    if diffusion.autoregressive or not twin.autoregressive:
        raise InputError(f"--model must be a diffusion model and --ar-model its autoregressive twin (trained with "
                         f"--objective ar); got {model_dir} (autoregressive={diffusion.autoregressive}) and "
                         f"{ar_dir} (autoregressive={twin.autoregressive})")
    cases, notes = load_cases(args.data, "test", args.n, speech=any("audio" in d for d in directions))
    report = versus_ar(diffusion, twin, cases, directions, temperature=args.temperature, seed=args.seed,
                       batch_size=args.batch_size)
    report.update(model=str(model_dir), model_hash=model_hash(model_dir), code=code_version(), ar_model=str(ar_dir),
                  ar_model_hash=model_hash(ar_dir), data=args.data, notes=notes)
    print(format_table(report))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "versus_ar.json").write_text(report_json(report))
    print(out / "versus_ar.json")
    print(plot(report, out / "versus_ar.png"))
    return 0


def add_versus_ar_command(bench) -> None:
    from unimodal.inference.versus import DEFAULT_DIRECTIONS
    from unimodal.cli_common import add_model_arguments

    vs = bench.add_parser("versus-ar", help="diffusion model vs its autoregressive twin: speed and judged quality "
                                            "on the same prompts, interleaved in one run")
    add_model_arguments(vs)
    vs.add_argument("--ar-model", required=True, help="the autoregressive twin's model folder")
    vs.add_argument("--data", default="scenes", help="scenes, digits or built data folders (test split)")
    vs.add_argument("--n", type=int, default=32, help="prompts per data set")
    vs.add_argument("--directions", default=",".join(DEFAULT_DIRECTIONS))
    vs.add_argument("--temperature", type=float, default=None,
                    help="one sampling temperature for both models in every direction (default: each model's "
                         "per-output defaults, as `generate` uses them; 0 = greedy)")
    vs.add_argument("--seed", type=int, default=0)
    vs.add_argument("--batch-size", type=int, default=16, help="prompts per batched call, for both models")
    vs.add_argument("--out", default="bench-versus-ar", help="folder for versus_ar.json and versus_ar.png")
    vs.set_defaults(func=_cmd_versus_ar)


def _cmd_data_efficiency(args) -> int:
    from unimodal.data_efficiency import EfficiencyConfig, format_report, run_data_efficiency
    from unimodal.core.paths import default_codecs_dir

    try:
        epochs = tuple(sorted({int(e) for e in args.epochs.split(",") if e.strip()}))
    except ValueError:
        epochs = ()
    if not epochs or epochs[0] < 1:
        raise InputError(f"--epochs takes positive epoch counts, e.g. 1,2,4,8; got {args.epochs!r}")
    cfg = EfficiencyConfig(data=args.data, subset=args.subset, epochs=epochs, preset=args.preset,
                           batch_size=args.batch_size, eval_n=args.eval_n)
    report = run_data_efficiency(cfg, args.codecs or default_codecs_dir(), args.out)
    print(format_report(report))
    print(Path(args.out) / "data_efficiency.json")
    print(Path(args.out) / "data_efficiency.png")
    return 0


def add_data_efficiency_command(bench) -> None:
    de = bench.add_parser("data-efficiency", help="diffusion vs AR twin trained for many epochs on one small "
                                                  "subset: held-out loss and judged accuracy per epoch")
    de.add_argument("--data", default="scenes")
    de.add_argument("--subset", type=int, default=1000, help="training samples, repeated every epoch")
    de.add_argument("--epochs", default="1,2,4,8,16,32,64", help="epoch milestones to keep and judge")
    de.add_argument("--preset", default="mini")
    de.add_argument("--batch-size", type=int, default=32)
    de.add_argument("--eval-n", type=int, default=64, help="test cases judged per snapshot")
    de.add_argument("--codecs", default=None, help="codec folder (default: the packaged codecs)")
    de.add_argument("--out", required=True, help="folder for both runs, judged.json, data_efficiency.json/.png")
    de.set_defaults(func=_cmd_data_efficiency)


def _cmd_compare(args) -> int:
    """Two eval reports of the same cases, direction by direction, paired."""
    from unimodal.core.paths import atomic_write, report_json
    from unimodal.inference.evaluate import compare_reports, format_comparison

    mistakes = [_mistakes_report(name) for name in (args.reference, args.candidate)]
    if any(report is not None for report in mistakes):
        comparison = _compare_mistakes(args, mistakes)
    else:
        reports = [_compared_report(name) for name in (args.reference, args.candidate)]
        comparison = compare_reports(*reports)
        print(format_comparison(comparison))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, lambda temporary: temporary.write_text(report_json(comparison)))
        print(out)
    return 0


def _compare_mistakes(args, reports: list) -> dict:
    """Two ``bench refine --mistakes`` reports, critic by critic (refused when only one of them is one)."""
    from unimodal.bench_refine import compare_mistakes, format_mistakes_comparison
    from unimodal.core.errors import InputFileError

    if any(report is None for report in reports):
        other = (args.reference, args.candidate)[[report is None for report in reports].index(True)]
        raise InputFileError(f"{other!r} is not a bench_refine.json of unimodal bench refine --mistakes, as the other "
                             f"report is: bench compare pairs two reports of the same kind")
    comparison = compare_mistakes(*reports)
    print(format_mistakes_comparison(comparison))
    return comparison


def _mistakes_report(name: str) -> dict | None:
    """The ``bench refine --mistakes`` report ``name`` holds (a bench_refine.json under any name, or its folder),
    else None (the other kinds of report are read, and refused, by :func:`_compared_report`)."""
    from unimodal.bench_refine import is_mistakes_report

    path = Path(name).expanduser()
    return _report_of_kind(path / "bench_refine.json" if path.is_dir() else path, is_mistakes_report)


def _report_of_kind(path: Path, is_kind) -> dict | None:
    """The report a JSON file holds, whatever its name, when ``is_kind`` says it is the kind looked for; else None
    (a file that cannot be read is refused later by ``read_report``, with the message of the kind expected)."""
    from unimodal.cli_common import load_json

    try:
        report = load_json(path) if path.is_file() else None
    except (OSError, ValueError, EOFError):
        return None
    return report if is_kind(report) else None


def _compared_report(name: str) -> dict:
    """An eval.json (or its folder), a bench_edit.json of ``bench edit`` (or its folder), or ``RECIPE:VARIANT``:
    one variant of a ``bench recipe`` report."""
    from unimodal.bench_edit import REPORT_FILE, as_eval_report, is_edit_report
    from unimodal.cli_common import read_report
    from unimodal.recipe import variant_report

    given = Path(name).expanduser()
    if (given / REPORT_FILE).is_file():
        return as_eval_report(read_report(name, "a bench_edit.json of unimodal bench edit (or a folder holding "
                                          "one)", ("rows", "summary"), REPORT_FILE))
    edit = _report_of_kind(given, is_edit_report)
    if edit is not None:  # a bench edit report under any name, read once
        return as_eval_report(edit)

    path, _, variant = name.rpartition(":")
    if path and not Path(name).expanduser().exists() and Path(path).expanduser().exists():
        recipe = read_report(path, "a recipe.json of unimodal bench recipe (or a folder holding one)", ("variants",),
                             "recipe.json")
        return variant_report(recipe, variant, path)
    return read_report(name, "an eval.json of unimodal eval (or a folder holding one), or RECIPE:VARIANT",
                       ("figures",), "eval.json")


def add_compare_command(bench) -> None:
    sub = bench.add_parser("compare", help="two unimodal eval reports of the same cases (e.g. the shipped model and "
                                           "a candidate), direction by direction: paired difference, 95%% interval")
    sub.add_argument("reference", help="eval.json (or its folder) of the reference, e.g. the shipped model; or "
                                       "RECIPE:VARIANT, a variant of a bench recipe report (recipe.json or its folder)")
    sub.add_argument("candidate", help="eval.json (or its folder) of the model to compare with it, or RECIPE:VARIANT; "
                                       "two bench_edit.json reports of bench edit (or their folders) pair the same way, "
                                       "and two bench_refine.json reports of bench refine --mistakes critic by critic")
    sub.add_argument("--out", default=None, help="also write the comparison here (.json)")
    sub.set_defaults(func=_cmd_compare)


__all__ = ["add_compare_command", "add_data_efficiency_command", "add_eval_command", "add_versus_ar_command"]
