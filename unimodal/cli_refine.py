"""``unimodal critique``, ``unimodal refine``, ``unimodal edit`` and ``unimodal bench refine``.

    unimodal critique --in gen.png --prompt "a small red circle on the left" --out heat.png --json
    unimodal refine --in gen.png --prompt "a small red circle on the left" --rounds 3 --out fixed.png --trace trace.json
    unimodal refine --in caption.txt --source scene.png --rounds 3 --out fixed.txt
    unimodal edit --in gen.png --box 0,16,32,48 --prompt "a small blue circle on the left" --out edited.png
    unimodal edit --in gen.png --instruction "make the circle blue" --out blue.png --trace edit.json
    unimodal bench refine --n 64 --out bench-refine/
    unimodal bench refine --n 64 --corrupt 0.25 --out bench-repair/
    unimodal bench refine --n 64 --mistakes 0.5 --critics confidence,learned,random --out bench-mistakes/
    unimodal bench edit --n 64 --out bench-edit/
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path

from unimodal.core.errors import InputError, OutputPathError
from unimodal.core.paths import atomic_write, report_json, user_path
from unimodal.checks_refine import EVALUATORS
from unimodal.cli_common import refine_rounds

# A request key of :func:`unimodal.checks_refine.check_refine_request` -> the flag that gives it here.
FLAGS = {"input": "--in", "prompt": "--prompt", "out": "--out", "seed": "--seed", "critic": "--critic",
         "fraction": "--fraction", "threshold": "--threshold", "rounds": "--rounds", "budget": "--budget",
         "trace": "--trace", "patience": "--patience", "candidates": "--candidates", "attempts": "--attempts",
         "draft": "--no-draft", "source": "--source", "model_caption": "--model-caption", "box": "--box",
         "seconds": "--seconds", "chars": "--chars", "instruction": "--instruction", "speech_margin": "--speech-margin",
         "repair": "--repair", "refine": "--refine-rounds"}


def _checked(op: str, args, **keys):
    """The op's request from the flags, checked as ``serve`` and the MCP server check theirs (the input read,
    every setting, ``--out`` and ``--trace`` writable and of the right kind) before the model loads; a refusal
    names the flag."""
    from unimodal.checks_refine import check_refine_request
    from unimodal.core.errors import UnimodalError

    request = {"input": args.input, "prompt": args.prompt, "out": args.out, "seed": args.seed, **keys}
    try:
        return check_refine_request(op, {k: v for k, v in request.items() if v is not None})
    except UnimodalError as error:
        first, _, rest = str(error).partition(" ")  # the checker's messages start with the key they refuse
        key = first.rstrip(":")
        message = f"{FLAGS[key]}{first[len(key):]} {rest}" if key in FLAGS else str(error)
        raise type(error)(message) from None


def _printed_files(files: dict) -> None:
    for path in files.values():
        print(path)


def _numbers(count: int, flag: str):
    def parse(value: str) -> list[float]:
        try:
            numbers = [float(v) for v in value.split(",")]
        except ValueError:
            numbers = []
        if len(numbers) != count:
            raise argparse.ArgumentTypeError(f"{flag} takes {count} comma-separated numbers, got {value!r}")
        return numbers
    return parse


def _critic(value: str):
    from unimodal.inference.critique import CRITICS

    if value not in CRITICS:
        raise InputError(f"--critic must be one of {', '.join(CRITICS)}, got {value!r}")
    return value


def _cmd_critique(args) -> int:
    from unimodal.serve import load_pipeline
    from unimodal.serve_refine import run_critique

    checked = _checked("critique", args, critic=args.critic, fraction=args.fraction, threshold=args.threshold,
                       check=args.check, source=args.source, model_caption=args.model_caption)
    pipe = load_pipeline(args.model, args.device)
    report, files = run_critique(pipe, checked)
    if args.json:
        print(json.dumps({**report.to_dict(), "files": list(files.values())}, indent=2))
        return 0
    print(f"score {report.score:.4f} ({report.critic}, {report.forward_passes} forward passes), "
          f"{len(report.regions)} region(s)")
    for region in report.regions:
        print(f"  {region['modality']} {_where(region)}: score {region['score']:.3f}")
    if report.check:
        print(f"check: read back {report.check.get('read_back')!r}, agrees: {report.check.get('agrees')}")
    _printed_files(files)
    return 0


def repair_line(repair: Mapping) -> str:
    """One line for a person: what the read-back repair of a picture saw and changed."""
    if not repair.get("check"):  # nothing was read (the speech was heard as no words)
        return f"repair: nothing changed ({repair.get('why') or 'nothing read'})"
    kept = [e["instruction"] for e in repair["edits"] if e["kept"]]
    measured = "".join(f" (its pixels show the {c['read']} object {c['pixels']})" for c in repair.get("colours", []))
    return (f"repair: read back as {repair['check'].get('read_back')!r}{measured}; "
            + (f"{len(kept)} edit(s) made: {'; '.join(kept)}" if kept else
               f"nothing changed ({repair.get('why') or 'no edit kept'})"))


def refine_line(summary: Mapping) -> str:
    """One line for a person: what ``generate``'s refine did (``settings["refine"]`` of the result)."""
    return (f"refined by the {summary['critic']} critic: {summary['rounds_kept']} of {summary['rounds_run']} round(s) "
            f"kept, {summary['forward_passes']} forward passes, stopped: {summary['stopped']}")


def _cmd_refine(args) -> int:
    from unimodal.serve import load_pipeline
    from unimodal.serve_refine import run_refine

    checked = _checked("refine", args, critic=args.critic, fraction=args.fraction, threshold=args.threshold,
                       check=args.check, source=args.source, model_caption=args.model_caption,
                       rounds=args.rounds, budget=args.budget, trace=args.trace,
                       evaluator=args.evaluator, patience=args.patience, repair=args.repair or None)
    pipe = load_pipeline(args.model, args.device)
    _, files, trace = run_refine(pipe, checked)
    if "repair" in trace:
        print(repair_line(trace["repair"]))
    score = "" if trace["score_initial"] is None else \
        f", score {trace['score_initial']:.4f} -> {trace['score_final']:.4f}"
    print(f"{trace['rounds_kept']} of {len(trace['rounds'])} round(s) kept{score}, {trace['forward_passes']} forward "
          f"passes, stopped: {trace['stopped']}")
    _printed_files(files)
    return 0


def _cmd_edit(args) -> int:
    from unimodal.serve import load_pipeline
    from unimodal.serve_refine import run_edit

    checked = _checked("edit", args, box=args.box, seconds=args.seconds, chars=args.chars,
                       instruction=args.instruction, trace=args.trace, candidates=args.candidates,
                       attempts=args.attempts,
                       draft=None if args.draft else False,  # only a refusal of the default travels
                       speech_margin=args.speech_margin, refine=args.refine_rounds)
    if checked.out is None:
        raise InputError("--out is required: where the edited output goes (.png, .wav or .txt, as --in)")
    pipe = load_pipeline(args.model, args.device)
    _, files, trace = run_edit(pipe, checked)
    if trace is not None:
        plan, check = trace["plan"], trace["check"]
        print(f"target {plan['target']!r}; regions {[_where(r) for r in plan['regions']]}; read back "
              f"{check['read_back']!r}: {'done' if check['parses_to_target'] else 'not done'}; "
              f"{trace['forward_passes']} forward passes")
        if plan.get("refine"):  # a speech edit refined as asked (--refine-rounds): say what it did
            print(refine_line(plan["refine"]))
    _printed_files(files)
    return 0


def _where(region: dict):
    return region.get("box") or region.get("seconds") or region.get("chars")


def _cmd_bench_refine(args) -> int:
    from unimodal.bench_refine import (bench_mistakes, bench_refine, bench_repair, format_mistakes, format_repair,
                                       format_table)
    from unimodal.refine import require_trained_critic
    from unimodal.inference.evaluate import model_hash
    from unimodal.eval_cases import load_cases
    from unimodal.serve import load_pipeline, resolve_model_dir

    critics = [c.strip() for c in args.critics.split(",") if c.strip()]
    for critic in critics:
        if critic != "oracle" or args.corrupt is None:  # the oracle knows the real tokens: only a repair bench has them
            _critic(critic)
    out = _check_bench_refine_args(args)
    model_dir = resolve_model_dir(args.model)
    pipe = load_pipeline(model_dir, args.device)
    for critic in critics:  # before any case is loaded or drawn
        require_trained_critic(pipe, critic)
    per_token = args.corrupt is not None or args.mistakes is not None
    cases, _ = load_cases("scenes", args.split, args.n, speech=per_token and args.modality == "audio",
                          voices=args.voices)
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.mistakes is not None:
        report = bench_mistakes(pipe, cases, critics, args.mistakes, args.seed, groups=args.groups,
                                modality=args.modality, progress=progress)
        table = format_mistakes(report)
    elif args.corrupt is not None:
        report = bench_repair(pipe, cases, critics, args.corrupt, args.rounds, args.seed, groups=args.groups,
                              progress=progress,
                              options=_refine_options(args), modality=args.modality, reread=args.reread)
        table = format_repair(report)
    else:
        report = bench_refine(pipe, cases, critics, args.rounds, args.best_of, args.seed, groups=args.groups,
                              batch_size=args.batch_size,
                              progress=progress, options=_refine_options(args), direction=args.direction,
                              best_of_temperature=args.best_of_temperature, repair=args.repair)
        table = format_table(report)
    report.update(model=str(model_dir), model_hash=model_hash(model_dir), split=args.split, voices=args.voices)
    print(table)
    print(f"model {model_dir} (hash {report['model_hash']}), scenes {args.split} split")
    out.mkdir(parents=True, exist_ok=True)
    print(atomic_write(out / "bench_refine.json", lambda temporary: temporary.write_text(report_json(report))))
    if args.corrupt is None and args.mistakes is None:
        from unimodal.bench_refine import plot_refine

        print(plot_refine([report], out / "bench_refine.png"))
    return 0


def _check_bench_refine_args(args) -> Path:
    """Every number and the output folder of ``bench refine`` refused, naming its flag, before the model loads;
    returns the output folder."""
    from unimodal.checks import check_writable
    from unimodal.core.seeds import check_seed
    from unimodal.inference.refine import RefineConfig

    for flag, value, what in (("--corrupt", args.corrupt, "codes to corrupt"),
                              ("--mistakes", args.mistakes, "tokens to re-mask")):
        if value is not None and not 0 < value < 1:
            raise InputError(f"{flag} is the share of {what}, in (0, 1); got {value}")
    if args.corrupt is not None and args.mistakes is not None:
        raise InputError("--corrupt and --mistakes are two different benches; give one")
    for flag, value in (("--temperature", args.temperature), ("--best-of-temperature", args.best_of_temperature)):
        if value is not None and not value >= 0:
            raise InputError(f"{flag} must be >= 0, got {value}")
    if args.direction != "text->image" and (args.corrupt is not None or args.mistakes is not None):
        raise InputError("--direction chooses what the generation bench makes; --corrupt and --mistakes take "
                         "real data of one --modality instead")
    if args.reread and not (args.reread > 0 and args.corrupt is not None and args.modality == "text"):
        raise InputError(f"--reread re-reads repaired captions: a number of rounds >= 0 with --corrupt and "
                         f"--modality text, got --reread {args.reread} with "
                         f"{'--corrupt' if args.corrupt is not None else 'no --corrupt'} --modality {args.modality}")
    if args.repair and (args.direction != "text->image" or args.corrupt is not None or args.mistakes is not None):
        raise InputError("--repair repairs pictures drawn from captions: it is a series of the text->image "
                         "generation bench, not of --direction image->text, --corrupt or --mistakes")
    check_seed(args.seed, "--seed")
    _check_voices(args.voices, args.modality == "audio" and (args.corrupt or args.mistakes) is not None,
                  "only the speech benches hear them (--corrupt or --mistakes with --modality audio)")
    options = {k: v for k, v in _refine_options(args).items() if k != "temperature"}
    try:  # the refine loop's own check (rounds, fraction, threshold, patience), named as flags
        RefineConfig(rounds=args.rounds, **options)
    except InputError as error:
        raise InputError(f"--{error}") from None
    out = user_path(args.out, "--out", OutputPathError)
    check_writable(out, is_folder=True)
    return out


def _cmd_bench_refine_plot(args) -> int:
    """Several ``bench refine`` reports of the same cases on one figure."""
    from unimodal.bench_refine import plot_refine
    from unimodal.cli_common import read_report

    what = "a generation bench_refine.json (--corrupt and --mistakes reports have no curves)"
    reports = [read_report(name, what, ("refine", "best_of")) for name in args.reports]
    if len({(r["n"], r["seed"], r.get("split"), r.get("direction", "text->image")) for r in reports}) > 1:
        raise InputError("the reports measure different cases (n, seed, split or direction differ); one figure "
                         "compares methods on the same cases")
    out = user_path(args.out, "--out", OutputPathError)
    print(plot_refine(reports, out))
    return 0


def _cmd_bench_edit(args) -> int:
    """Every refusal (n, split, seed, --out, a missing judge) before the model loads or a case is drawn."""
    from unimodal.checks import check_writable
    from unimodal.core.seeds import check_seed

    from unimodal.bench_edit import bench_edit, check_edit_options, format_table, save_report

    check_seed(args.seed, "--seed")
    check_edit_options(args.modality, args.change, args.draft, args.touch_up, args.speech_margin, args.refine_rounds)
    _check_voices(args.voices, args.modality == "audio", "only speech edits (--modality audio) hear them")
    out = user_path(args.out, "--out", OutputPathError)
    check_writable(out, is_folder=True)  # a file, or a folder that takes no new file, is refused here
    from unimodal.eval_cases import load_cases
    from unimodal.inference.evaluate import model_hash
    from unimodal.judges import SceneJudge, SpeechJudge
    from unimodal.serve import check_model, load_pipeline

    # the judge needs unimodal[eval] (opencv; faster-whisper for speech): said before the model loads
    judge = SpeechJudge() if args.modality == "audio" else SceneJudge()
    model_dir = check_model(args.model, args.device)
    cases, _ = load_cases("scenes", args.split, args.n, speech=args.modality == "audio", voices=args.voices)
    pipe = load_pipeline(model_dir, args.device)
    report = bench_edit(pipe, cases, args.seed, judge, candidates=args.candidates, modality=args.modality,
                        change=args.change, draft=args.draft, touch_up=args.touch_up,
                        speech_margin=args.speech_margin, attempts=args.attempts, refine=args.refine_rounds)
    report.update(model=str(model_dir), model_hash=model_hash(model_dir), split=args.split, voices=args.voices)
    print(format_table(report))
    print(save_report(report, out))
    return 0


def _refine_options(args) -> dict:
    """Keywords of ``refine`` the bench passes on (only those given)."""
    options = {"temperature": args.temperature, "fraction": args.fraction, "threshold": args.threshold,
               "evaluator": args.evaluator, "patience": args.patience}
    return {k: v for k, v in options.items() if v is not None}


def _speech_margin(value: str) -> float:
    """An argparse type: ``--speech-margin`` as the library checks it, refused with the flag's name before the
    model loads."""
    from unimodal.checks import check_speech_margin
    from unimodal.core.errors import SettingError

    try:
        return check_speech_margin(float(value), "--speech-margin")
    except (ValueError, SettingError) as error:
        raise argparse.ArgumentTypeError(str(error) if isinstance(error, SettingError) else
                                         f"--speech-margin must be a number of seconds, got {value!r}") from None


def _checked_count(flag: str, check_name: str, maximum_name: str):
    """An argparse type for a whole-number flag the library checks (``--candidates``, ``--attempts``): refused
    with the flag's name before the model loads."""
    def parse(value: str) -> int:
        import unimodal.checks as checks
        from unimodal.core.errors import SettingError

        try:
            return getattr(checks, check_name)(int(value))
        except (ValueError, SettingError):
            raise argparse.ArgumentTypeError(f"{flag} must be a whole number from 1 to "
                                             f"{getattr(checks, maximum_name)}, got {value!r}") from None
    return parse


_candidates = _checked_count("--candidates", "check_candidates", "MAX_CANDIDATES")
_attempts = _checked_count("--attempts", "check_attempts", "MAX_ATTEMPTS")


def _positive(flag: str):
    """An argparse type: a positive int, refused with the flag's name."""
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive whole number, got {value!r}")
        return number
    return parse


def _add_common(parser, out_help: str) -> None:
    from unimodal.cli_common import add_model_arguments

    add_model_arguments(parser)
    parser.add_argument("--in", dest="input", required=True, help="the output to work on: a .png picture, a "
                                                                   ".wav clip or a .txt caption")
    parser.add_argument("--prompt", default=None, help="the text it was generated from (its condition)")
    parser.add_argument("--out", default=None, help=out_help)
    parser.add_argument("--seed", type=int, default=0)


def _add_plan_flags(parser) -> None:
    parser.add_argument("--critic", default=None, help="confidence, content (the mass of the codes that decode "
                        "alike: right content rather than right id), learned, content+learned (both: right only "
                        "when both say so) or random; default: content+learned for speech when the model's critic "
                        "head is trained, confidence otherwise")
    parser.add_argument("--fraction", type=float, default=0.25, help="most tokens flagged, as a share (0.25)")
    parser.add_argument("--threshold", type=float, default=None,
                        help="flag only tokens scored below this (default: the critic's own; for confidence per "
                             "modality, image 0.01, caption 0.05, speech 0.001; 0.5 for the others)")
    parser.add_argument("--check", action="store_true", help="also read the output back with the model "
                                                             "(caption / transcribe) and compare with --prompt")
    parser.add_argument("--source", default=None, help="the picture or clip the output was made from (its "
                                                       "condition): a caption's picture (.png) or speech (.wav), "
                                                       "a picture's speech")
    parser.add_argument("--model-caption", action="store_true", default=None,
                        help="--in is a caption the model wrote from --source (e.g. generate wrote it): use the "
                             "caption recipe (unimodal.refine.CAPTION_REFINE: words below 0.9 redone at "
                             "temperature 1.0, a round kept when --source read back became likelier)")


def add_refine_commands(sub) -> None:
    critique = sub.add_parser("critique", help="score each token of an output, find flawed regions (heat map)")
    _add_common(critique, "heat map over the picture / score curve under the audio (.png), or .json")
    _add_plan_flags(critique)
    critique.add_argument("--json", action="store_true", help="print scores and regions as JSON")
    critique.set_defaults(func=_cmd_critique)
    refine = sub.add_parser("refine", help="re-mask flawed regions and regenerate them, round by round")
    _add_common(refine, "the refined output (.png, .wav or .txt)")
    _add_plan_flags(refine)
    refine.add_argument("--rounds", type=int, default=None, help="most rounds of critique -> re-mask -> regenerate "
                        "(3; with --repair 0, the repair alone, which measured best; 0 only with --repair)")
    refine.add_argument("--budget", type=int, default=None, help="most forward passes in all")
    refine.add_argument("--trace", default=None, help="write the JSON trace of every round here")
    refine.add_argument("--evaluator", default=None, choices=EVALUATORS, help="what keeps a "
                        "round: the critic's own score (default), or agreement: --prompt read back from the output "
                        "by the model became likelier (agreement-each: read word by word, a pass a word)")
    refine.add_argument("--repair", action="store_true", help="a picture and its --prompt (or the clip it was drawn "
                        "from as --source): first read the picture back with the model and change each colour, size "
                        "or place the reading gets otherwise than the request by an instructed edit from the "
                        "object's own pixels (the trace's repair)")
    refine.add_argument("--patience", type=_positive("--patience"), default=None, help="rounds in a row not kept "
                        "before it stops; each retry re-plans and samples anew (1)")
    refine.set_defaults(func=_cmd_refine)
    edit = sub.add_parser("edit", help="regenerate one region of an output from a new description, or follow an "
                                       "instruction (\"make the circle blue\")")
    _add_common(edit, "the edited output (.png, .wav or .txt)")
    edit.add_argument("--box", type=_numbers(4, "--box"), default=None, help="pixels X0,Y0,X1,Y1")
    edit.add_argument("--seconds", type=_numbers(2, "--seconds"), default=None, help="audio START,END")
    edit.add_argument("--chars", type=_numbers(2, "--chars"), default=None, help="text START,END")
    edit.add_argument("--instruction", default=None, help="instead of a region: what to change, e.g. \"make the "
                      "circle blue\", \"replace 'small' by 'large'\" (docs/critique.md); --prompt then says what "
                      "--in shows (else the model reads it back)")
    edit.add_argument("--trace", default=None, help="--instruction: write the plan and verdict here (.json)")
    edit.add_argument("--candidates", type=_candidates, default=1, help="regenerate the region this "
                      "many times and keep the one that agrees best with the description, read back by the model")
    edit.add_argument("--attempts", type=_attempts, default=None, help="--instruction, a change the model "
                      "redraws (a new shape, speech): redo it until the model reads the target back from it, at "
                      "most this many times, else keep the one that agrees best (4)")
    edit.add_argument("--no-draft", dest="draft", action="store_false", help="--instruction on a picture: the "
                      "model redraws the object's box from the target caption, instead of starting a change of "
                      "colour, size or place from the object's own pixels")
    edit.add_argument("--speech-margin", type=_speech_margin, default=None, metavar="SECONDS", help="--instruction "
                      "on a clip: seconds either side of the word's middle that the edit redoes (0.4)")
    edit.add_argument("--refine-rounds", type=refine_rounds, default=None, metavar="ROUNDS", help="--instruction on "
                      "a clip: up to this many rounds of refine inside the stretch the edit redid, before the check, "
                      "by refine's default critic (the speech critic when the model's critic head is trained, else "
                      "confidence; default 0: none; measured, no gain on test clips, docs/critique.md)")
    edit.set_defaults(func=_cmd_edit)


def _scene_bench(bench, name: str, help: str):
    """A ``bench`` subcommand over scene cases: the model arguments, ``--n`` and ``--split``."""
    from unimodal.cli_common import add_model_arguments

    sub = bench.add_parser(name, help=help)
    add_model_arguments(sub)
    sub.add_argument("--n", type=_positive("--n"), default=64, help="scene cases of the split")
    sub.add_argument("--split", default="test")
    return sub


def _add_voices_argument(sub) -> None:
    sub.add_argument("--voices", default="varied", help="the eSpeak voices the test captions are spoken in: varied "
                     "(the default, the voices audio->text learns to understand) or clear (the same captions in the "
                     "few voices the speech judge hears best); refused in another case than speech")


def _check_voices(voices: str, speech: bool, who_hears: str) -> None:
    """``--voices``: a voice set's name, and another set than the default only where speech is loaded."""
    from unimodal.training.data.speech import check_voices

    check_voices(voices)
    if voices != "varied" and not speech:
        raise InputError(f"--voices {voices} speaks the test captions; {who_hears}")


def add_bench_refine_command(bench) -> None:
    sub = _scene_bench(bench, "refine", "text->image (or image->text) judged accuracy: no refine vs refine (per "
                                        "critic, per round) vs best-of-N, with forward passes (needs unimodal[eval])")
    sub.add_argument("--direction", default="text->image", choices=["text->image", "image->text"],
                     help="what the generation bench makes: pictures from captions (default) or captions of "
                          "pictures (quote it: '>' redirects in a shell)")
    sub.add_argument("--best-of-temperature", type=float, default=None,
                     help="sampling temperature of the best-of-N draws after the first (default: 1.0 for captions, "
                          "whose greedy draws are all the same; the model's own for pictures)")
    sub.add_argument("--rounds", type=int, default=3)
    sub.add_argument("--best-of", type=_positive("--best-of"), default=4)
    sub.add_argument("--critics", default="confidence,random",
                     help="comma-separated: confidence, random, learned; with --corrupt also oracle (flags exactly "
                          "the corrupted tokens: the bound of the regeneration)")
    sub.add_argument("--seed", type=int, default=0)
    sub.add_argument("--batch-size", type=_positive("--batch-size"), default=16)
    sub.add_argument("--groups", type=_positive("--groups"), default=4,
                     help="the content and confidence critics re-mask the scored tokens in this many interleaved "
                          "groups, one forward pass each (default 4, as critique and refine)")
    sub.add_argument("--temperature", type=float, default=None, help="sampling temperature of the regenerations "
                     "(default: the model's for the output: greedy for captions, so a caption re-masked where the "
                     "critic flags it comes back the same; 1.0 lets refine try other words)")
    sub.add_argument("--fraction", type=float, default=None, help="most tokens a round flags, as a share (0.25)")
    sub.add_argument("--threshold", type=float, default=None,
                     help="flag only tokens scored below this (default: the critic's own, as in refine)")
    sub.add_argument("--evaluator", default=None, choices=EVALUATORS, help="what keeps a refine round: "
                     "the critic's own score (default) or the input read back from the output (agreement: the "
                     "caption from the picture, or the picture from the caption; agreement-each: the input read "
                     "token by token, the rest of it in view)")
    sub.add_argument("--patience", type=int, default=None, help="refine rounds in a row not kept before it stops (1)")
    sub.add_argument("--corrupt", type=float, default=None, help="instead: corrupt this share of the codes of the "
                     "real test pictures and measure how much refine restores (and each critic's AUROC)")
    sub.add_argument("--mistakes", type=float, default=None, help="instead: re-mask this share of the real test "
                     "tokens, let the model regenerate them, and measure each critic's AUROC on the ones it got wrong "
                     "(the learned critic against the confidence score: --critics confidence,learned,random)")
    sub.add_argument("--modality", default="image", choices=["image", "text", "audio"],
                     help="--corrupt / --mistakes: whose tokens (image codes, caption tokens, speech codes)")
    _add_voices_argument(sub)
    sub.add_argument("--reread", type=int, default=0, metavar="ROUNDS",
                     help="--corrupt --modality text: then refine each repaired caption this many rounds more as the "
                          "model's own reading of the picture, with the caption recipe's own settings (--temperature, "
                          "--threshold, ... set the first call only; default 0)")
    sub.add_argument("--repair", action="store_true", help="text->image: one more series, each picture repaired "
                     "by reading it back (refine(repair=True)), then refined --rounds rounds with the first of "
                     "--critics (an empty --critics '': the repair alone)")
    sub.add_argument("--out", default="bench-refine", help="folder for bench_refine.json")
    sub.set_defaults(func=_cmd_bench_refine)


def add_bench_refine_plot_command(bench) -> None:
    sub = bench.add_parser("refine-plot", help="judged accuracy against forward passes from one or more bench "
                                               "refine reports of the same cases (PNG)")
    sub.add_argument("reports", nargs="+", help="bench_refine.json files")
    sub.add_argument("--out", default="bench_refine.png")
    sub.set_defaults(func=_cmd_bench_refine_plot)


def add_bench_edit_command(bench) -> None:
    sub = _scene_bench(bench, "edit", "instructed picture edits (\"make the circle blue\") on real test scenes, "
                                      "judged by the scene judge, with forward passes (needs unimodal[eval])")
    sub.add_argument("--seed", type=int, default=0, help="case k's edit uses seed + k")
    sub.add_argument("--candidates", type=_candidates, default=1, help="regenerations per edit, the "
                     "one whose picture makes the target caption likeliest (read back by the model) kept (1)")
    sub.add_argument("--attempts", type=_attempts, default=None, help="a change the model redraws (a new shape, "
                     "speech, --no-draft): redo it until the model reads the target back from it, at most this many "
                     "times (4)")
    sub.add_argument("--modality", default="image", choices=["image", "audio", "text"], help="edit the pictures "
                     "(default), the spoken captions (\"say 'blue' instead of 'red'\", judged through Whisper) or "
                     "the captions (\"replace 'red' by 'blue'\")")
    _add_voices_argument(sub)
    sub.add_argument("--change", default="colour", choices=["colour", "size", "shape", "position"],
                     help="what a picture edit asks of the first object (position: one-object scenes only)")
    sub.add_argument("--no-draft", dest="draft", action="store_false", help="picture edits: the model redraws "
                     "the object's box from the target caption instead of starting from its pixels moved")
    sub.add_argument("--speech-margin", type=_speech_margin, default=None, metavar="SECONDS", help="speech edits: "
                     "seconds either side of the word's middle that each edit redoes (0.4)")
    sub.add_argument("--refine-rounds", type=refine_rounds, default=None, metavar="ROUNDS", help="speech edits: "
                     "up to this many rounds of refine inside the stretch each edit redid, by refine's default "
                     "critic (the speech critic when the model's critic head is trained, else confidence; default "
                     "0: none)")
    sub.add_argument("--touch-up", action="store_true", help="picture edits from a draft: the model then reviews "
                     "the drafted codes and redraws the ones it doubts (default: they stay as encoded)")
    sub.add_argument("--out", default="bench-edit", help="folder for bench_edit.json (every case's row and the "
                                                         "summary)")
    sub.set_defaults(func=_cmd_bench_edit)


__all__ = ["add_bench_edit_command", "add_bench_refine_command", "add_bench_refine_plot_command",
           "add_refine_commands"]
