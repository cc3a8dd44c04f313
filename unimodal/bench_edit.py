"""``unimodal bench edit``: instructed picture edits on real test scenes, judged by the independent scene judge.

For case ``k`` of the scenes split (its real picture and caption; the caption is passed as ``text=``, so the
plan reads the caption, not the model's read-back), the instruction is ``make the <shape> <colour>`` (pairs:
``make the <colour> <shape> <colour>``, the first object) to the ``k % len(colours)``-th colour of the grammar
that no object of the scene has, and ``UniModal.edit(picture, instruction=..., text=caption, seed=seed + k)``
runs at the model's default sampler settings. The scene judge scores the edited picture against the plan's
target scene and the source picture against the case's truth. Per case the row holds the judge's verdict, the
asked colour's verdict, the edit's own self-check verdict, the codes changed outside the planned regions (0
by the edit's contract), the forward passes, and the plan's regions; the summary counts them for all cases,
single objects and pairs. An instruction the edit refuses (e.g. a pair of two objects that the reference
cannot tell apart) is a row with ``refused`` and counts as not right.

This is the logic of the inline script that measured the table in docs/critique.md ("Instructed edits"),
made a command: the same cases, instructions, seeds and judge.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from unimodal.checks import (EDIT_ATTEMPTS, check_attempts, check_candidates, check_refine_rounds,
                             check_speech_margin)
from unimodal.checks_refine import REGION_KEYS
from unimodal.core.errors import InputError, OutputPathError, SettingError
from unimodal.core.grammar import COLORS, POSITIONS, SHAPES
from unimodal.core.media import SAMPLE_RATE
from unimodal.core.paths import atomic_write, report_json, user_path
from unimodal.core.seeds import derived_seed
from unimodal.refine import SPEECH_MARGIN

REPORT_FILE = "bench_edit.json"
GROUPS = {"all": lambda row: True, "one object": lambda row: row["objects"] == 1, "pairs": lambda row: row["objects"] == 2}
# (summary key, what the table calls it); each counts the rows where the key is true
COUNTED = (("judged_right", "judged right: the asked change, the rest the same"),
           ("asked_right", "the asked attribute judged right (rest may differ)"),
           ("verdict", "self-check verdict \"parses to the target\""),
           ("verdict_agrees", "self-check agrees with the judge"),
           ("source_judged_right", "sources judged right"))
# counted verdicts read off two others of the same row (reports written before they were counted have them too)
DERIVED = {"verdict_agrees": lambda row: bool(row.get("verdict")) == bool(row.get("judged_right"))}
SAMPLER_KEYS = ("mode", "steps", "cfg", "temperature", "choice_temperature")
MODALITIES = ("image", "audio", "text")
WHAT = {"image": "pictures, the first object's {change} changed (pairs: the object named by colour and shape), "
                 "caption given as text=, judged by the scene judge",
        "audio": "spoken captions, instruction \"say '<new colour>' instead of '<colour>'\", caption given as "
                 "text=, transcribed by the speech judge and parsed by the caption grammar",
        "text": "captions, instruction \"replace '<colour>' by '<new colour>'\", parsed by the caption grammar"}


CHANGES = ("colour", "size", "shape", "position")


def edit_instruction(truth: dict, k: int, modality: str = "image", change: str = "colour") -> str:
    """Case ``k``'s instruction for its first object. ``colour``: to the ``k``-th (cyclically) colour no object
    of it has (pictures by the object's name, speech and captions by the word); for pictures also ``size``
    (small <-> large), ``shape`` (the ``k``-th shape no object has) and ``position`` (the ``k``-th other place;
    one object only)."""
    obj = truth["objects"][0]
    used = {o["color"] for o in truth["objects"]}
    colours = [c for c in COLORS if c not in used]
    new = colours[k % len(colours)]
    if modality == "audio":
        return f"say '{new}' instead of '{obj['color']}'"
    if modality == "text":
        return f"replace '{obj['color']}' by '{new}'"
    ref = obj["shape"] if len(truth["objects"]) == 1 else f"{obj['color']} {obj['shape']}"
    if change == "size":
        return f"make the {ref} {'large' if obj['size'] == 'small' else 'small'}"
    if change == "shape":
        shapes = [s for s in SHAPES if s not in {o["shape"] for o in truth["objects"]}]
        return f"turn the {ref} into a {shapes[k % len(shapes)]}"
    if change == "position":
        places = [p for p in POSITIONS if p != obj.get("position")]
        return f"move the {ref} to the {places[k % len(places)]}"
    return f"make the {ref} {new}"


def check_edit_options(modality: str, change: str = "colour", draft: bool = True, touch_up: bool = False,
                       speech_margin: float | None = None, refine: int | None = None, attempts: int | None = None,
                       candidates: int = 1) -> None:
    """Refuse options that do not fit the content edited, named by their ``bench edit`` flags: a change other
    than colour, ``--no-draft`` and ``--touch-up`` are for pictures; a touch-up reviews a draft;
    ``--speech-margin`` and ``--refine-rounds`` are for speech; ``attempts`` and ``candidates`` in their ranges
    (a library caller's bad value raised here, not recorded as every case refused)."""
    if modality not in MODALITIES:
        raise InputError(f"bench edit edits one of {MODALITIES}, got {modality!r}")
    if change not in CHANGES:
        raise InputError(f"bench edit changes one of {CHANGES}, got {change!r}")
    if modality != "image" and (change != "colour" or not draft or touch_up):
        flag = f"--change {change}" if change != "colour" else "--no-draft" if not draft else "--touch-up"
        raise InputError(f"{flag} edits pictures; a {modality} edit changes a colour word")
    if touch_up and not draft:
        raise InputError("--touch-up reviews a pixel draft; with --no-draft the model redraws the region itself")
    if speech_margin is not None:
        if modality != "audio":
            raise InputError(f"--speech-margin widens the stretch a speech edit redoes; {modality} edits have none")
        check_speech_margin(speech_margin, "--speech-margin")
    if refine is not None:
        if modality != "audio":
            raise InputError(f"--refine-rounds reviews the stretch a speech edit redid; {modality} edits have none")
        check_refine_rounds(refine, "--refine-rounds")
    if attempts is not None:
        check_attempts(attempts)
    check_candidates(candidates)


def edit_cases(cases: Sequence, change: str) -> list:
    """The cases a change applies to: a move needs a picture of one object (a pair's places are a relation)."""
    if change not in CHANGES:
        raise InputError(f"bench edit changes one of {CHANGES}, got {change!r}")
    return [c for c in cases if change != "position" or len(c.truth["objects"]) == 1]


def _target_scene(truth: dict, instruction: str, modality: str) -> dict:
    """The scene the instruction asks for, from the case's truth (what the judges compare the edit with)."""
    from unimodal.core.instructions import apply_instruction, parse_instruction

    parsed = parse_instruction(instruction)
    if modality == "image":
        return apply_instruction(truth, parsed)[0]
    objects = [dict(o) for o in truth["objects"]]
    objects[0]["color"] = parsed.new
    return {**truth, "objects": objects}


ATTRIBUTE = {"colour": "color", "size": "size", "shape": "shape", "position": "position"}


def _judge(judge, modality: str, content, scene: dict, change: str = "colour",
           index: int = 0) -> tuple[bool, bool, dict]:
    """(every attribute right, the asked attribute right, extra row fields) of a picture, speech or caption against
    ``scene``: the scene judge for pictures (the asked attribute of object ``index`` only: the one the edit
    changed); speech is transcribed by the speech judge, and speech and captions are parsed by the caption grammar
    (their asked attribute: the first object's colour). The extra fields of speech: ``{"heard": transcript}``
    (what a reader of the report needs to see why a spoken edit failed)."""
    from unimodal.core.grammar import parse_scene_caption, scenes_equal

    if modality == "image":
        score = judge.score(content, scene)
        attribute = ATTRIBUTE[change]
        asked = score[attribute] if attribute == "position" else score["per_object"][attribute][index]
        return bool(score["correct"]), bool(asked), {}
    said = judge.transcribe(content) if modality == "audio" else content
    extra = {"heard": said} if modality == "audio" else {}
    heard = parse_scene_caption(said)
    if heard is None:
        return False, False, extra
    first = heard["objects"][0] if heard.get("objects") else {}
    return scenes_equal(scene, heard), first.get("color") == scene["objects"][0]["color"], extra


def edit_case(pipe, case, k: int, seed: int, judge, candidates: int = 1, modality: str = "image",
              change: str = "colour", draft: bool = True, touch_up: bool = False,
              speech_margin: float | None = None, attempts: int | None = None, refine: int | None = None) -> dict:
    """One case's row: the instruction, the judge's and the self-check's verdicts, codes changed, passes."""
    instruction = edit_instruction(case.truth, k, modality, change)
    source = getattr(case, modality)  # the case's picture, clip or caption
    source_right, _, source_extra = _judge(judge, modality, source, case.truth)
    row = {"case": k, "caption": case.text, "objects": len(case.truth["objects"]), "instruction": instruction,
           "seed": derived_seed(seed, k), "source_judged_right": source_right,
           **{f"source_{key}": value for key, value in source_extra.items()}}
    start = time.perf_counter()
    try:
        edited, trace = pipe.edit((source, SAMPLE_RATE) if modality == "audio" else source, instruction=instruction,
                                  text=None if modality == "text" else case.text, seed=derived_seed(seed, k),
                                  candidates=candidates, attempts=attempts, modality=modality,
                                  **({"draft": draft, "touch_up": touch_up} if modality == "image" else {}),
                                  **({"speech_margin": speech_margin} if speech_margin is not None else {}),
                                  **({"refine": refine} if refine is not None else {}))
    except SettingError:  # a setting out of range is the caller's, not the case's (checked before any case)
        raise
    except InputError as error:  # the plan refused it: counted as not right, said why
        return {**row, "refused": str(error), "judged_right": False, "asked_right": False, "verdict": False,
                "outside_changed": 0, "inside": 0, "regions": [], "located_by": None, "passes": 0,
                "seconds": round(time.perf_counter() - start, 2)}
    plan = trace["plan"]
    target = plan.get("target_attributes") or _target_scene(case.truth, instruction, modality)
    right, asked, extra = _judge(judge, modality, getattr(edited, modality), target, change, plan.get("object", 0))
    region_key = next(key for key, kind in REGION_KEYS.items() if kind == modality)
    return {**row, "target": plan["target"], "judged_right": right, "asked_right": asked,
            "verdict": bool(trace["check"]["parses_to_target"]), "read_back": trace["check"]["read_back"],
            "outside_changed": trace["tokens_changed"]["outside"], "inside": trace["tokens_changed"]["inside"],
            "regions": [r[region_key] for r in plan["regions"]], "located_by": plan["located_by"],
            "passes": trace["forward_passes"], "candidates": plan.get("candidates"), "attempts": plan.get("attempts"),
            "draft": plan.get("draft"),
            "touch_up": plan.get("touch_up"), "refine": plan.get("refine"),
            "seconds": round(time.perf_counter() - start, 2), **extra}


def counted(row: dict, key: str) -> bool:
    """One row's verdict ``key`` of :data:`COUNTED`."""
    return bool(DERIVED[key](row)) if key in DERIVED else bool(row.get(key))


def summarise(rows: Sequence[dict]) -> dict:
    """Per group (all, one object, pairs): n, the counts and shares of each verdict, codes changed outside the
    regions (summed), refusals and mean forward passes."""
    summary = {}
    for group, member in GROUPS.items():
        picked = [r for r in rows if member(r)]
        part = {"n": len(picked)}
        for key, _ in COUNTED:
            count = sum(counted(r, key) for r in picked)
            part[key] = count
            part[f"{key}_share"] = count / len(picked) if picked else None
        part["outside_changed"] = sum(r["outside_changed"] for r in picked)
        part["refused"] = sum("refused" in r for r in picked)
        part["mean_forward_passes"] = sum(r["passes"] for r in picked) / len(picked) if picked else None
        summary[group] = part
    return summary


def bench_edit(pipe, cases: Sequence, seed: int = 0, judge=None, progress: bool = True, candidates: int = 1,
               modality: str = "image", change: str = "colour", draft: bool = True, touch_up: bool = False,
               speech_margin: float | None = None, attempts: int | None = None, refine: int | None = None) -> dict:
    """The report: settings, one row per case, and the summary (see :func:`summarise`); ``candidates``:
    regenerations per edit, the one that agrees best with the target kept; ``attempts``: executions of an edit
    the model redraws until its check reads the target back (None: the library's default); ``modality``: edit
    the pictures (judged by the scene judge), the spoken captions (transcribed by the speech judge) or the
    captions;
    ``change``: what a picture edit asks for (:data:`CHANGES`; a move is asked of one-object scenes only);
    ``draft``: whether a picture edit may start from the object's own pixels, ``touch_up``: whether the model
    then redraws the drafted codes it doubts (see :func:`unimodal.instructed.instructed_edit`);
    ``speech_margin``: seconds either side of the word a speech edit redoes (None: the library's 0.4);
    ``refine``: rounds of refine inside that stretch, by refine's default critic (the speech critic when the
    model's critic head is trained, else confidence; None: the library's, none)."""
    from tqdm.auto import tqdm

    if not cases:
        raise InputError("bench edit needs at least one case")
    check_edit_options(modality, change, draft, touch_up, speech_margin, refine, attempts, candidates)
    cases = edit_cases(cases, change)
    if not cases:
        raise InputError(f"no case of this split takes a {change} edit")
    if judge is None:
        from unimodal.judges import SceneJudge, SpeechJudge

        judge = SpeechJudge() if modality == "audio" else SceneJudge()
    start, rows = time.perf_counter(), []
    for k, case in enumerate(tqdm(cases, desc="edits", unit="case", disable=not progress, leave=False)):
        rows.append(edit_case(pipe, case, k, seed, judge, candidates, modality, change, draft, touch_up,
                              speech_margin, attempts, refine))
    seconds = round(time.perf_counter() - start, 1)
    kinds = {"regeneration": modality, "read_back": "text"} if modality != "text" else {}  # a caption is spliced
    sampler = {role: {k: v for k, v in pipe._sampler_config({}, kind).__dict__.items() if k in SAMPLER_KEYS}
               for role, kind in kinds.items()}  # the model's defaults for each
    return {"n": len(rows), "seed": seed, "modality": modality, "candidates": candidates,
            "attempts": EDIT_ATTEMPTS if attempts is None else attempts,
            "sampler": sampler,
            "change": change if modality == "image" else "colour", "draft": draft if modality == "image" else None,
            "touch_up": touch_up if modality == "image" and draft else None,
            "speech_margin": (SPEECH_MARGIN if speech_margin is None else speech_margin) if modality == "audio" else None,
            "refine_rounds": (refine or 0) if modality == "audio" else None,
            "seconds": seconds, "summary": summarise(rows), "rows": rows}


def format_table(report: dict) -> str:
    """A fixed-width table: one line per verdict, a column per group ("count / n share")."""
    summary = report["summary"]
    if any(key not in summary["all"] for key, _ in COUNTED):  # a report from before a count was added
        summary = summarise(report["rows"])
    heads = [f"{group} ({summary[group]['n']})" for group in GROUPS]
    width = max(len(label) for _, label in COUNTED)
    lines = [f"{'':<{width}}  " + "  ".join(f"{h:>15}" for h in heads)]

    def cell(part, key):
        share = part[f"{key}_share"]
        return f"{part[key]:>3} / {part['n']:<3} {'-' if share is None else format(share, '.2f'):>4}"

    for key, label in COUNTED:
        lines.append(f"{label:<{width}}  " + "  ".join(f"{cell(summary[g], key):>15}" for g in GROUPS))
    lines.append(f"{'tokens changed outside the regions':<{width}}  "
                 + "  ".join(f"{summary[g]['outside_changed']:>15}" for g in GROUPS))
    lines.append(f"{'mean forward passes':<{width}}  " + "  ".join(
        f"{'-' if summary[g]['mean_forward_passes'] is None else format(summary[g]['mean_forward_passes'], '.1f'):>15}"
        for g in GROUPS))
    refused, modality = summary["all"]["refused"], report.get("modality", "image")
    what = WHAT[modality].format(change=report.get("change", "colour"))
    if modality == "image":
        what += ", " + ("the object's pixels drafted where its silhouette stays" if report.get("draft", True)
                        else "the region redrawn by the model from the target caption (no pixel draft)")
        if report.get("draft", True):
            what += (", the drafted codes the model doubts redrawn (touch-up)" if report.get("touch_up")
                     else ", the drafted codes kept as encoded")
    if modality == "audio" and report.get("speech_margin") is not None:
        what += f", {report['speech_margin']:g} s redone either side of the word"
        if report.get("refine_rounds"):  # none (0, or a report from before the option): nothing to say
            critics = sorted({row["refine"].get("critic") for row in report.get("rows", [])
                              if isinstance(row.get("refine"), dict) and row["refine"].get("critic")})
            by = f" by the {' / '.join(critics)} critic" if critics else ""
            what += f", then refined inside it for up to {report['refine_rounds']} round(s){by}"
    if modality == "audio":
        what += f", the sources spoken in the {report.get('voices', 'varied')} voices"
    lines.append(f"n={report['n']} scenes {report.get('split', 'test')} cases, {what}, seed "
                 f"{report['seed']} (case k: seed + k), {report.get('candidates', 1)} candidate(s) per edit, "
                 f"at most {report.get('attempts', 1)} attempt(s) until it reads back as asked; "
                 f"{report['seconds']} s" + (f"; {refused} refused by the plan (counted not right)" if refused else ""))
    if report["sampler"]:
        lines.append("sampler defaults: " + ", ".join(f"{role.replace('_', '-')} {values}"
                                                      for role, values in report["sampler"].items()))
    if report.get("model_hash"):
        lines.append(f"model {report['model']} (hash {report['model_hash']})")
    return "\n".join(lines)


def is_edit_report(report) -> bool:
    """Whether a parsed report is one of ``bench edit`` (rows and a summary, no figures)."""
    return isinstance(report, dict) and {"rows", "summary"} <= report.keys() and "figures" not in report


def as_eval_report(report: dict) -> dict:
    """A ``bench edit`` report in the shape ``unimodal bench compare`` pairs: one "direction" per counted
    verdict (named by the modality and the change asked, so reports of different edits share none), each with
    its share and per-case verdicts, and the keys that say which cases were judged."""
    if not isinstance(report.get("rows"), list) or not isinstance(report.get("summary"), dict):
        raise InputError("not a bench edit report (no 'rows' and 'summary')")
    modality = report.get("modality", "image")
    what = f"edit {modality}" + (f" {report.get('change', 'colour')}" if modality == "image" else "")
    if report.get("voices", "varied") != "varied":  # the same captions in other voices: other cases
        what += f" ({report['voices']} voices)"
    figures = {}
    for key, _ in COUNTED:
        verdicts = [int(counted(row, key)) for row in report["rows"]]
        figures[f"{what}: {key.replace('_', ' ')}"] = {
            "accuracy": sum(verdicts) / len(verdicts) if verdicts else None, "verdicts": verdicts}
    return {"figures": figures, "data": "scenes", "split": report.get("split", "test"),
            "n_per_data_set": report.get("n"), "seed": report.get("seed"), "model_hash": report.get("model_hash"),
            "captions": [row.get("caption") for row in report["rows"]]}


def save_report(report: dict, out: str | Path) -> Path:
    """``out/bench_edit.json``, written atomically (a reader never sees half a file)."""
    folder = user_path(out, "--out", OutputPathError)
    folder.mkdir(parents=True, exist_ok=True)
    return atomic_write(folder / REPORT_FILE, lambda temporary: temporary.write_text(report_json(report)))


__all__ = ["as_eval_report", "bench_edit", "check_edit_options", "edit_case", "edit_instruction", "format_table",
           "is_edit_report", "save_report", "summarise"]
