"""The page ``unimodal demo`` writes: the files (pictures, speech, captions) and ``index.html`` that shows them.

Every file is written whole or not at all (a temporary file, then a rename), the page last, so an
``index.html`` on disk only ever links files that exist. Pictures are saved at the model's 64x64 and shown
4x larger with pixelated scaling, so each 8x8 code the critic scores stays visible.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from unimodal.core.media import SAMPLE_RATE
from unimodal.core.paths import atomic_write

SCALE = 4
INPUTS_OF = {"text->image": ("text",), "image->text": ("image",), "text->audio": ("text",),
             "audio->text": ("audio",), "image->audio": ("image",), "audio->image": ("audio",), "joint": ()}
OUTPUTS_OF = {"text->image": ("image",), "image->text": ("text",), "text->audio": ("audio",),
              "audio->text": ("text",), "image->audio": ("audio",), "audio->image": ("image",),
              "joint": ("text", "image", "audio")}


def slug(direction: str) -> str:
    """``text->image`` -> ``text-to-image``: the section id and the output files' stem."""
    return direction.replace("->", "-to-")


# ---- files --------------------------------------------------------------------------------------------------


def save_png(image, path: Path) -> str:
    picture = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image, dtype=np.uint8))
    atomic_write(path, lambda temporary: picture.save(temporary, format="PNG"))
    return path.name


def save_wav(wave, sample_rate: int, path: Path) -> str:
    import soundfile

    data = np.clip(np.asarray(wave, dtype=np.float32).reshape(-1), -1.0, 1.0)
    atomic_write(path, lambda temporary: soundfile.write(temporary, data, sample_rate, format="WAV", subtype="PCM_16"))
    return path.name


def save_text(text: str, path: Path) -> str:
    atomic_write(path, lambda temporary: temporary.write_text((text or "") + "\n"))
    return path.name


def flagged_picture(image, regions: list[dict]) -> Image.Image:
    """The picture at 4x with each region the critic flagged outlined in yellow."""
    picture = Image.fromarray(np.asarray(image, dtype=np.uint8)).convert("RGB")
    big = picture.resize((picture.width * SCALE, picture.height * SCALE), Image.NEAREST)
    draw = ImageDraw.Draw(big)
    for region in regions:
        x0, y0, x1, y1 = (float(v) * SCALE for v in region["box"])
        draw.rectangle([x0, y0, x1 - 1, y1 - 1], outline=(255, 230, 0), width=2)
    return big


def write_inputs(folder: Path, case, sample_rate: int = SAMPLE_RATE) -> dict:
    """The input scene's caption, picture and speech; {modality: path relative to the page}."""
    return {"text": "inputs/" + save_text(case.text, folder / "inputs" / "caption.txt"),
            "image": "inputs/" + save_png(case.image, folder / "inputs" / "picture.png"),
            "audio": "inputs/" + save_wav(case.audio, sample_rate, folder / "inputs" / "speech.wav")}


def write_outputs(folder: Path, direction: str, result) -> dict:
    """One direction's outputs; {modality: path relative to the page}."""
    stem, files = folder / "outputs" / slug(direction), {}
    for modality in OUTPUTS_OF[direction]:
        if modality == "image":
            files["image"] = "outputs/" + save_png(result.image, stem.with_suffix(".png"))
        elif modality == "audio":
            files["audio"] = "outputs/" + save_wav(result.audio, result.sample_rate, stem.with_suffix(".wav"))
        else:
            files["text"] = "outputs/" + save_text(result.text, stem.with_suffix(".txt"))
    return files


def write_rounds(folder: Path, rounds: list[dict]) -> list[dict]:
    """Per refine round: the flagged picture before and the repaired picture after; paths relative to the page."""
    written = []
    for record in rounds:
        r = record["round"]
        flagged = save_png(flagged_picture(record["before"], record["regions"]), folder / "refine" / f"round{r}-flagged.png")
        after = save_png(record["after"], folder / "refine" / f"round{r}-after.png")
        written.append({key: value for key, value in record.items() if key not in ("before", "after")}
                       | {"flagged": f"refine/{flagged}", "after": f"refine/{after}"})
    return written


def write_repair(folder: Path, record: dict) -> dict:
    """The repaired request: the drawn picture with the changed regions outlined, and the repaired picture."""
    if not record:
        return {}
    drawn = save_png(flagged_picture(record["before"], record["regions"]), folder / "repair" / "drawn.png")
    after = save_png(record["after"], folder / "repair" / "repaired.png")
    return ({key: value for key, value in record.items() if key not in ("before", "after")}
            | {"drawn": f"repair/{drawn}", "repaired": f"repair/{after}"})


def write_edits(folder: Path, edits: list[dict]) -> list[dict]:
    """Per instructed edit: the input picture with the planned regions outlined, and the edited picture."""
    written = []
    for k, record in enumerate(edits, 1):
        if "refused" in record:
            written.append(dict(record))
            continue
        regions = [r for r in record["regions"] if r.get("modality") == "image"]
        planned = save_png(flagged_picture(record["before"], regions), folder / "edits" / f"edit{k}-planned.png")
        after = save_png(record["after"], folder / "edits" / f"edit{k}-after.png")
        written.append({key: value for key, value in record.items() if key not in ("before", "after")}
                       | {"planned": f"edits/{planned}", "after": f"edits/{after}"})
    return written


# ---- summary ------------------------------------------------------------------------------------------------


def build_summary(run, inputs: dict, outputs: dict, rounds: list[dict], edits: list[dict],
                  repair: dict | None = None) -> dict:
    """What the page shows, as JSON: files, texts, verdicts, counts, refine rounds, timings and the machine."""
    import torch

    directions = {}
    for direction, result in run.results.items():
        directions[direction] = {"inputs": {m: inputs[m] for m in INPUTS_OF[direction]}, "outputs": outputs[direction],
                                 "text": result.text, "forward_passes": result.forward_passes,
                                 "verdict": _plain(run.verdicts.get(direction, {}))}
    verdicts = [v.get("correct") for v in run.verdicts.values()]
    judged = [v for v in verdicts if v is not None]
    return {"model": run.model, "input_caption": run.case.text, "directions": directions,
            "counts": {"judged": len(judged), "right": sum(bool(v) for v in judged),
                       "not_judged": len(verdicts) - len(judged)},
            "refine": {"rounds": len(rounds), "draft_right": rounds[0]["correct_before"] if rounds else None,
                       "final_right": rounds[-1]["correct_after"] if rounds else None,
                       "stopped": run.refine_stopped or None, "trace": _plain(rounds)},
            "repair": _plain(repair or {}),
            "edits": {"n": len(edits), "judged": sum(e.get("correct") is not None for e in edits),
                      "right": sum(bool(e.get("correct")) for e in edits), "trace": _plain(edits)},
            "notes": run.notes, "seconds": run.timings.get("total_s"), "timings": run.timings,
            "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                        "cpu_capability": torch.backends.cpu.get_cpu_capability()}}


def _plain(value):
    """JSON-ready copy: numpy scalars to Python, pictures dropped."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if not isinstance(v, (Image.Image, np.ndarray))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


# ---- HTML ---------------------------------------------------------------------------------------------------

STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:60em;color:#222}
img{image-rendering:pixelated;border:1px solid #ccc}
.row{display:flex;gap:2em;align-items:flex-start;flex-wrap:wrap}.box{min-width:12em}
.right{color:#070;font-weight:bold}.wrong{color:#b00;font-weight:bold}.none{color:#777}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em}code,.caption{background:#f4f4f4;padding:.1em .3em}
table{border-collapse:collapse}td,th{padding:.3em .8em;border-bottom:1px solid #eee;text-align:left}"""


def _media(modality: str, path: str, text: str | None = None) -> str:
    """A picture shown 3x, a speech player, or a caption, each linking its file."""
    if modality == "image":
        return f'<img src="{html.escape(path)}" width="192" height="192" alt="picture">'
    if modality == "audio":
        return f'<audio controls src="{html.escape(path)}"></audio>'
    return f'<p class="caption">{html.escape(text or "")}</p><a href="{html.escape(path)}">{html.escape(path)}</a>'


def _verdict(verdict: dict) -> str:
    correct = verdict.get("correct")
    if correct is None:
        return '<span class="none">not judged</span>'
    label = '<span class="right">judged right</span>' if correct else '<span class="wrong">judged wrong</span>'
    details = [f"{html.escape(str(k))}: {html.escape(str(v))}" for k, v in verdict.items()
               if k in ("shape", "color", "size", "position", "relation") and v is not None]
    if verdict.get("transcript") is not None:
        details.append(f"Whisper heard: “{html.escape(verdict['transcript'])}”")
    judge = f" <small>({html.escape(verdict['judge'])})</small>" if verdict.get("judge") else ""
    return label + judge + ("<br><small>" + "; ".join(details) + "</small>" if details else "")


def _direction_section(direction: str, entry: dict) -> str:
    inputs = "".join(_media(m, p, entry.get("input_text")) for m, p in entry["inputs"].items()) or \
        "<p>nothing: the model makes all three together, unconditioned</p>"
    outputs = "".join(_media(m, p, entry["text"]) for m, p in entry["outputs"].items())
    return (f'<section id="{slug(direction)}"><h2>{html.escape(direction)}</h2><div class="row">'
            f'<div class="box"><h3>input</h3>{inputs}</div><div class="box"><h3>output</h3>{outputs}</div>'
            f'<div class="box"><h3>verdict</h3>{_verdict(entry["verdict"])}'
            f'<br><small>{entry["forward_passes"]} model calls</small></div></div></section>')


def _refine_section(refine: dict, draft_path: str) -> str:
    rows = []
    for record in refine["trace"]:
        rows.append(f'<tr><td>{record["round"]}</td><td><img src="{html.escape(record["flagged"])}" width="192" '
                    f'height="192" alt="flagged"><br><small>{len(record["regions"])} regions, '
                    f'{record["tokens_remasked"]} codes re-masked</small></td>'
                    f'<td><img src="{html.escape(record["after"])}" width="192" height="192" alt="repaired"></td>'
                    f'<td>{record["score_before"]:.3f} → {record["score_after"]:.3f}'
                    f'{"" if record["kept"] else " (not kept: the draft stays)"}</td>'
                    f'<td>{_verdict({"correct": record["correct_after"]})}</td></tr>')
    return ('<section id="refine"><h2>Self-correcting loop (text->image, refined)</h2>'
            f'<p>The draft is the text->image picture above (<a href="{html.escape(draft_path)}">{html.escape(draft_path)}</a>, '
            f'{_verdict({"correct": refine["draft_right"]})}). Each round the critic scores every 8x8 code of the '
            'picture by the model\'s own confidence (2 masked passes), re-masks the doubtful ones (outlined in yellow) and regenerates '
            'them in 4 steps with the rest as context; a round is kept only when the critic\'s score rises.</p>'
            + (f'<p>No round ran ({html.escape(refine.get("stopped") or "stopped")})'
               + (': the critic doubted no code of this draft enough to re-mask it'
                  if refine.get("stopped") == "nothing flagged" else "")
               + ', so the picture stays as drawn.</p></section>' if not rows else
               '<table><tr><th>round</th><th>flagged on the picture so far</th><th>repaired</th>'
               '<th>critic score (mean log-prob)</th><th>scene judge</th></tr>' + "".join(rows) + "</table></section>"))


def _repair_section(repair: dict) -> str:
    if not repair:
        return ""
    steps = "".join(f'<li>“{html.escape(e["instruction"])}”: '
                    + ("done from the object's own pixels" if e["kept"] else "not kept: " + html.escape(e["why"]))
                    + "</li>" for e in repair["edits"])
    steps = steps or f'<li>nothing to change: {html.escape(repair["why"] or "")}</li>'
    return ('<section id="repair"><h2>Repair by reading back (a held-out request)</h2>'
            f'<p>Request: <span class="caption">{html.escape(repair["request"])}</span>, a colour and shape the '
            'model never saw together in training; it tends to draw such a shape in the colour it saw it with. The '
            'model reads its own picture back, compares the reading with the request, and changes each colour, '
            'size or place that reads otherwise by an instructed edit from the object\'s own pixels '
            '(<code>refine(repair=True)</code>).</p><div class="row">'
            f'<div class="box"><h3>drawn</h3><img src="{html.escape(repair["drawn"])}" width="256" height="256" '
            f'alt="drawn"><br>{_verdict({"correct": repair["correct_before"]})}</div>'
            f'<div class="box"><h3>read back as</h3><p>“{html.escape(repair["read_back"] or "")}”</p>'
            f'<ul>{steps}</ul></div>'
            f'<div class="box"><h3>repaired</h3><img src="{html.escape(repair["repaired"])}" width="256" '
            f'height="256" alt="repaired"><br>{_verdict({"correct": repair["correct_after"]})}<br>'
            f'<small>{repair["forward_passes"]} model calls in all</small></div></div></section>')


def _edits_section(edits: dict) -> str:
    rows = []
    for record in edits["trace"]:
        said = html.escape(record["instruction"])
        if "refused" in record:
            refused = html.escape(record["refused"])
            rows.append(f'<tr><td>“{said}”</td><td colspan="4">refused: {refused}</td></tr>')
            continue
        how = "the object's own pixels moved" if record["drafted"] else "redrawn by the model"
        rows.append(f'<tr><td>“{said}”<br><small>target: {html.escape(record["target"])}</small></td>'
                    f'<td><img src="{html.escape(record["planned"])}" width="192" height="192" alt="planned"></td>'
                    f'<td><img src="{html.escape(record["after"])}" width="192" height="192" alt="edited"><br>'
                    f'<small>{how}; {record["outside_changed"]} codes changed outside the region</small></td>'
                    f'<td>reads back as “{html.escape(record["read_back"])}”: '
                    f'{"the target" if record["self_check"] else "not the target"}<br>'
                    f'<small>{record["forward_passes"]} model calls</small></td>'
                    f'<td>{_verdict({"correct": record["correct"]})}</td></tr>')
    return ('<section id="edits"><h2>Instructed edits (the input picture)</h2><p>Plan: the instruction applied to '
            'the caption gives the target scene, and the named object is found by the pixels of its colour (its '
            'region outlined in yellow). Execute: a change of colour, size or place moves the object\'s own '
            'pixels, which the image codec encodes; a new shape is drawn by the model. Check: the model reads the '
            'result back; the scene judge compares it with the target.</p><table><tr><th>instruction</th>'
            '<th>planned region</th><th>edited</th><th>the model\'s check</th><th>scene judge</th></tr>'
            + "".join(rows) + "</table></section>")


def render_html(summary: dict) -> str:
    counts = summary["counts"]
    notes = "".join(f"<li>{html.escape(note)}</li>" for note in summary["notes"])
    sections = "".join(_direction_section(d, {**entry, "input_text": summary["input_caption"]})
                       for d, entry in summary["directions"].items())
    machine = summary["machine"]
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>unimodal demo</title>'
            f'<style>{STYLE}</style></head><body><h1>unimodal demo</h1>'
            f'<p>One model, every direction, from one input scene: <span class="caption">'
            f'{html.escape(summary["input_caption"])}</span> (a test-split scene, rendered and spoken on the fly). '
            f'{counts["right"]} of {counts["judged"]} judged outputs right'
            f'{", " + str(counts["not_judged"]) + " not judged" if counts["not_judged"] else ""}. '
            f'Model: <code>{html.escape(summary["model"])}</code>; {summary["seconds"]} s on {machine["cpus"]} CPUs '
            f'({machine["torch_threads"]} torch threads, {html.escape(str(machine["cpu_capability"]))}).</p>'
            + (f"<ul>{notes}</ul>" if notes else "") + sections
            + _refine_section(summary["refine"], summary["directions"]["text->image"]["outputs"]["image"])
            + _repair_section(summary.get("repair") or {})
            + (_edits_section(summary["edits"]) if summary["edits"]["n"] else "")
            + '<p><a href="summary.json">summary.json</a>: every file, caption, verdict and timing.</p></body></html>\n')


def write_page(folder: Path, run) -> tuple[Path, dict]:
    """Write every file, then ``summary.json``, then ``index.html`` (last, so it never links a missing file)."""
    inputs = write_inputs(folder, run.case)
    outputs = {direction: write_outputs(folder, direction, result) for direction, result in run.results.items()}
    rounds = write_rounds(folder, run.rounds)
    edits = write_edits(folder, run.edits)
    repair = write_repair(folder, run.repair)
    summary = build_summary(run, inputs, outputs, rounds, edits, repair)
    atomic_write(folder / "summary.json", lambda t: t.write_text(json.dumps(summary, indent=2) + "\n"))
    page = atomic_write(folder / "index.html", lambda t: t.write_text(render_html(summary), encoding="utf-8"))
    return page.resolve(), summary


__all__ = ["INPUTS_OF", "OUTPUTS_OF", "build_summary", "render_html", "slug", "write_page"]
