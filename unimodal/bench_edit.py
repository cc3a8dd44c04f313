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

import json
import time
from collections.abc import Sequence
from pathlib import Path

from unimodal.core.errors import InputError, OutputPathError
from unimodal.core.grammar import COLORS
from unimodal.core.paths import atomic_write, user_path

REPORT_FILE = "bench_edit.json"
GROUPS = {"all": lambda row: True, "one object": lambda row: row["objects"] == 1, "pairs": lambda row: row["objects"] == 2}
# (summary key, what the table calls it); each counts the rows where the key is true
COUNTED = (("judged_right", "judged right: the asked colour, the rest the same"),
           ("colour_right", "the asked colour judged right (rest may differ)"),
           ("verdict", "self-check verdict \"parses to the target\""),
           ("source_judged_right", "source pictures judged right"))
SAMPLER_KEYS = ("mode", "steps", "cfg", "temperature", "choice_temperature")


def edit_instruction(truth: dict, k: int) -> str:
    """Case ``k``'s instruction: its first object to the ``k``-th (cyclically) colour no object of it has."""
    obj = truth["objects"][0]
    used = {o["color"] for o in truth["objects"]}
    colours = [c for c in COLORS if c not in used]
    ref = obj["shape"] if len(truth["objects"]) == 1 else f"{obj['color']} {obj['shape']}"
    return f"make the {ref} {colours[k % len(colours)]}"


def edit_case(pipe, case, k: int, seed: int, judge, candidates: int = 1) -> dict:
    """One case's row: the instruction, the judge's and the self-check's verdicts, codes changed, passes."""
    instruction = edit_instruction(case.truth, k)
    row = {"case": k, "caption": case.text, "objects": len(case.truth["objects"]), "instruction": instruction,
           "seed": seed + k, "source_judged_right": bool(judge.score(case.image, case.truth)["correct"])}
    start = time.perf_counter()
    try:
        edited, trace = pipe.edit(case.image, instruction=instruction, text=case.text, seed=seed + k,
                                  candidates=candidates)
    except InputError as error:  # the plan refused it: counted as not right, said why
        return {**row, "refused": str(error), "judged_right": False, "colour_right": False, "verdict": False,
                "outside_changed": 0, "inside": 0, "regions": [], "located_by": None, "passes": 0,
                "seconds": round(time.perf_counter() - start, 2)}
    plan = trace["plan"]
    score = judge.score(edited.image, plan["target_attributes"])
    return {**row, "target": plan["target"], "judged_right": bool(score["correct"]),
            "colour_right": bool(score["color"]), "verdict": bool(trace["check"]["parses_to_target"]),
            "read_back": trace["check"]["read_back"], "outside_changed": trace["tokens_changed"]["outside"],
            "inside": trace["tokens_changed"]["inside"], "regions": [r["box"] for r in plan["regions"]],
            "located_by": plan["located_by"], "passes": trace["forward_passes"],
            "candidates": plan.get("candidates"),
            "seconds": round(time.perf_counter() - start, 2)}


def summarise(rows: Sequence[dict]) -> dict:
    """Per group (all, one object, pairs): n, the counts and shares of each verdict, codes changed outside the
    regions (summed), refusals and mean forward passes."""
    summary = {}
    for group, member in GROUPS.items():
        picked = [r for r in rows if member(r)]
        part = {"n": len(picked)}
        for key, _ in COUNTED:
            count = sum(bool(r[key]) for r in picked)
            part[key] = count
            part[f"{key}_share"] = count / len(picked) if picked else None
        part["outside_changed"] = sum(r["outside_changed"] for r in picked)
        part["refused"] = sum("refused" in r for r in picked)
        part["mean_forward_passes"] = sum(r["passes"] for r in picked) / len(picked) if picked else None
        summary[group] = part
    return summary


def bench_edit(pipe, cases: Sequence, seed: int = 0, judge=None, progress: bool = True, candidates: int = 1) -> dict:
    """The report: settings, one row per case, and the summary (see :func:`summarise`); ``candidates``:
    regenerations per edit, the one that agrees best with the target kept."""
    from tqdm.auto import tqdm

    if not cases:
        raise InputError("bench edit needs at least one case")
    if judge is None:
        from unimodal.judges import SceneJudge

        judge = SceneJudge()
    start, rows = time.perf_counter(), []
    for k, case in enumerate(tqdm(cases, desc="edits", unit="case", disable=not progress, leave=False)):
        rows.append(edit_case(pipe, case, k, seed, judge, candidates))
    seconds = round(time.perf_counter() - start, 1)
    sampler = {kind: {k: v for k, v in pipe._sampler_config({}, kind).__dict__.items() if k in SAMPLER_KEYS}
               for kind in ("image", "text")}  # the regeneration's and the read-back's defaults
    return {"n": len(rows), "seed": seed, "candidates": candidates, "sampler": sampler, "seconds": seconds,
            "summary": summarise(rows), "rows": rows}


def format_table(report: dict) -> str:
    """A fixed-width table: one line per verdict, a column per group ("count / n share")."""
    summary = report["summary"]
    heads = [f"{group} ({summary[group]['n']})" for group in GROUPS]
    width = max(len(label) for _, label in COUNTED)
    lines = [f"{'':<{width}}  " + "  ".join(f"{h:>15}" for h in heads)]

    def cell(part, key):
        share = part[f"{key}_share"]
        return f"{part[key]:>3} / {part['n']:<3} {'-' if share is None else format(share, '.2f'):>4}"

    for key, label in COUNTED:
        lines.append(f"{label:<{width}}  " + "  ".join(f"{cell(summary[g], key):>15}" for g in GROUPS))
    lines.append(f"{'codes changed outside the regions':<{width}}  "
                 + "  ".join(f"{summary[g]['outside_changed']:>15}" for g in GROUPS))
    lines.append(f"{'mean forward passes':<{width}}  " + "  ".join(
        f"{'-' if summary[g]['mean_forward_passes'] is None else format(summary[g]['mean_forward_passes'], '.1f'):>15}"
        for g in GROUPS))
    refused = summary["all"]["refused"]
    lines.append(f"n={report['n']} scenes {report.get('split', 'test')} cases, seed {report['seed']} (case k: "
                 f"seed + k), instruction 'make the <shape> <new colour>' (pairs: the first object by colour and "
                 f"shape), caption given as text=, {report.get('candidates', 1)} candidate(s) per edit; "
                 f"{report['seconds']} s"
                 + (f"; {refused} refused by the plan (counted not right)" if refused else ""))
    lines.append(f"sampler defaults: regeneration {report['sampler']['image']}, read-back {report['sampler']['text']}")
    if report.get("model_hash"):
        lines.append(f"model {report['model']} (hash {report['model_hash']})")
    return "\n".join(lines)


def save_report(report: dict, out: str | Path) -> Path:
    """``out/bench_edit.json``, written atomically (a reader never sees half a file)."""
    folder = user_path(out, "--out", OutputPathError)
    folder.mkdir(parents=True, exist_ok=True)
    return atomic_write(folder / REPORT_FILE, lambda temporary: temporary.write_text(json.dumps(report, indent=2)
                                                                                      + "\n"))


__all__ = ["bench_edit", "edit_case", "edit_instruction", "format_table", "save_report", "summarise"]
