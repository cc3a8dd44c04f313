"""Check a ``critique`` / ``refine`` / ``edit`` request (``serve --stdio``, the MCP server) before the model is
touched, with the error types :mod:`unimodal.checks` uses for ``generate``.

A request names the content to work on by file (``input``: a picture, a clip or a ``.txt`` caption), the text it
was made from (``prompt``) or, for critique and refine, the picture or clip it was made from (``source``: a
caption's picture, a picture's speech) and, per op, the plan settings, the region to edit (or, for an instructed
edit, the ``instruction``, understood here by :mod:`unimodal.core.instructions`) and where to write. Like
:mod:`unimodal.checks` this is a leaf: the critic names mirror :data:`unimodal.inference.critique.CRITICS` (a test keeps
them in step) because importing that module means importing torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path

from unimodal.checks import (_SETTING_CHECKS, _bool_setting, _int_setting, _readable_file, _real_setting,
                             check_attempts, check_audio_file, check_candidates, check_image_file, check_refine_rounds,
                             check_speech_margin, check_text, check_writable)
from unimodal.core.errors import EmptyInputError, InputError, InputFileError, OutputPathError, SettingError
from unimodal.core.instructions import parse_instruction, require_fits
from unimodal.core.paths import OUTPUT_SUFFIXES, user_path

CRITICS = ("learned", "confidence", "content", "content+learned", "random")
REFINE_OPS = ("critique", "refine", "edit")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
# A region's key names its modality and its unit: pixels, seconds, characters.
REGION_KEYS = {"box": "image", "seconds": "audio", "chars": "text"}
COMMON_KEYS = ("input", "prompt", "out", "seed")
PLAN_KEYS = ("critic", "fraction", "threshold", "check", "source", "model_caption")
OP_KEYS = {"critique": COMMON_KEYS + PLAN_KEYS,
           "refine": COMMON_KEYS + PLAN_KEYS + ("rounds", "budget", "regions", "trace", "evaluator", "patience",
                                                "repair"),
           "edit": COMMON_KEYS + tuple(REGION_KEYS) + ("instruction", "trace", "candidates", "attempts", "draft",
                                                                   "speech_margin", "refine")}
EVALUATORS = ("critic", "agreement", "agreement-each")  # mirrors unimodal.inference.refine.EVALUATORS


@dataclass
class CheckedRefine:
    """A critique / refine / edit request that passed every check. ``content``: the file path of a picture or
    clip, or a caption's text; ``options``: keywords of ``UniModal.<op>``; ``out`` / ``trace``: files to write."""

    op: str
    content: str
    modality: str
    options: dict = field(default_factory=dict)
    out: Path | None = None
    trace: Path | None = None


def check_refine_request(op: str, request: Mapping, default_folder: Path | None = None) -> CheckedRefine:
    """Check ``request`` for ``op``; ``default_folder``: where ``out`` goes when the request names none (the MCP
    server always writes a file a person can open)."""
    request = dict(request)
    if "in" in request and "input" not in request:  # the CLI's flag is --in
        request["input"] = request.pop("in")
    unknown = sorted(set(request) - set(OP_KEYS[op]))
    if unknown:
        raise InputError(f"unknown key(s) {unknown} in a {op} request; accepted: {', '.join(OP_KEYS[op])}")
    modality, content = check_content(request.get("input"))
    checked = CheckedRefine(op, content, modality, _options(op, request, modality))
    checked.out = _check_out(op, request.get("out"), modality, default_folder)
    if request.get("trace") is not None:
        checked.trace = _check_json_path(request["trace"], "trace")
    return checked


def check_content(value) -> tuple[str, str]:
    """The input file as (modality, content): a picture or clip as its checked path, a caption as its text."""
    if value is None:
        raise InputError("input is required: the file to work on (a .png picture, a .wav clip or a .txt caption)")
    if not isinstance(value, str):
        raise InputError(f"input must be a file path, got {type(value).__name__}")
    media = _media_file(value, "input")
    if media is not None:
        return media
    if Path(value).suffix.lower() == ".txt":
        return "text", _caption(value)
    raise InputFileError(f"input {value!r}: unknown kind of file; give a picture ({', '.join(IMAGE_SUFFIXES)}), "
                         f"a clip ({', '.join(AUDIO_SUFFIXES)}) or a caption (.txt)")


def _source(value, modality: str) -> dict:
    """``source``: the picture or clip the input was made from, as the keyword ``UniModal.critique`` / ``refine``
    take it (``image=`` or ``audio=``, a checked path); of another kind than the input."""
    if not isinstance(value, str):
        raise InputError(f"source must be a file path, got {type(value).__name__}")
    media = _media_file(value, "source")
    if media is None:
        raise InputFileError(f"source {value!r}: the input the content was made from is a picture "
                             f"({', '.join(IMAGE_SUFFIXES)}) or a clip ({', '.join(AUDIO_SUFFIXES)})")
    kind, path = media
    if kind == modality:
        raise InputError(f"source {value!r} is {'a picture' if kind == 'image' else 'a clip'}, as is input: the "
                         f"source is what the input was made from, of another kind (a caption's picture or clip, "
                         f"a picture's speech)")
    return {kind: path}


def _media_file(value: str, name: str) -> tuple[str, str] | None:
    """A picture or clip file by its suffix, checked readable as one: (modality, path); None for another
    suffix."""
    suffix = Path(value).suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return "image", str(check_image_file(value, name))
    if suffix in AUDIO_SUFFIXES:
        return "audio", str(check_audio_file(value, name))
    return None


def _caption(value: str) -> str:
    text = check_text(_readable_file(value, "input").read_bytes(), "input").strip()
    if not text:
        raise EmptyInputError(f"input {value!r} is an empty caption: there is nothing to work on")
    return text


# ---- settings -----------------------------------------------------------------------------------------------------


def _options(op: str, request: Mapping, modality: str) -> dict:
    """The keywords ``UniModal.<op>`` takes, checked (a None value means the default)."""
    options = {"text": check_text(request["prompt"], "prompt")} if request.get("prompt") is not None else {}
    if op != "edit" and modality == "text" and "text" in options:
        raise InputError("prompt is the text a picture or clip was made from; a caption is made from a picture or "
                         "clip: give that file as source")
    if request.get("source") is not None:
        options.update(_source(request["source"], modality))
    if request.get("model_caption") is not None:
        if modality != "text" or request.get("source") is None:
            raise InputError("model_caption says a caption read against its source (a .txt input with source) is "
                             "the model's own; give it only with both")
        options["model_caption"] = _bool_setting("model_caption", request["model_caption"])
    checks = {"seed": _SETTING_CHECKS["seed"], "critic": _critic, "check": lambda v: _bool_setting("check", v),
              "fraction": lambda v: _real_setting("fraction", v, "in (0, 1]", lambda x: 0 < x <= 1),
              "threshold": lambda v: _real_setting("threshold", v, "in (0, 1]", lambda x: 0 < x <= 1),
              "rounds": lambda v: _int_setting("rounds", v, 0 if request.get("repair") is True else 1),
              "budget": lambda v: _int_setting("budget", v, 1),
              "candidates": check_candidates,
              "patience": lambda v: _int_setting("patience", v, 1),
              "evaluator": _evaluator,
              "regions": lambda v: check_regions(v, modality)}
    options.update({key: check(request[key]) for key, check in checks.items() if request.get(key) is not None})
    if request.get("repair") is not None:
        options["repair"] = _repair(request, modality, "audio" in options)
    if request.get("draft") is not None:
        options["draft"] = _draft(request, modality)
    if request.get("speech_margin") is not None:
        options["speech_margin"] = _speech_margin(request, modality)
    if request.get("attempts") is not None:
        options["attempts"] = _attempts(request)
    if op == "edit" and request.get("refine") is not None:
        options["refine"] = _edit_refine(request, modality)
    if op == "edit" and request.get("instruction") is not None:
        options["instruction"] = _instruction(request, modality)
    elif op == "edit":
        if request.get("trace") is not None:
            raise InputError("trace is written by an instructed edit (instruction=...); a described edit (a region "
                             "and prompt) has none")
        options["region"] = _edit_region(request, modality)
    return options


def _repair(request: Mapping, modality: str, from_speech: bool) -> bool:
    """``repair``: read a picture back and change what the reading gets otherwise than its prompt (or than what
    the model hears in the clip it was drawn from, ``source``)."""
    repair = _bool_setting("repair", request["repair"])
    if repair and (modality != "image" or (request.get("prompt") is None and not from_speech)):
        raise InputError("repair reads a picture back and compares it with the request it was drawn from: give it "
                         "only with a picture input and its prompt (or the clip it was drawn from as source)")
    return repair


def _draft(request: Mapping, modality: str) -> bool:
    """``draft``: whether an instructed picture edit starts from the object's pixels (true, the default)."""
    if request.get("instruction") is None or modality != "image":
        raise InputError("draft chooses how an instructed picture edit starts (from the object's own pixels, or "
                         "redrawn by the model); give it only with instruction= on a picture")
    return _bool_setting("draft", request["draft"])


def _speech_margin(request: Mapping, modality: str) -> float:
    """``speech_margin``: seconds either side of the word an instructed speech edit redoes."""
    if request.get("instruction") is None or modality != "audio":
        raise InputError("speech_margin widens the stretch an instructed speech edit redoes; give it only with "
                         "instruction= on a clip")
    return check_speech_margin(request["speech_margin"])


def _edit_refine(request: Mapping, modality: str) -> int:
    """``refine`` of an edit: rounds of refine (its default critic) inside the stretch an instructed speech edit
    redid."""
    if request.get("instruction") is None or modality != "audio":
        raise InputError("refine (of an edit) reviews the stretch an instructed speech edit redid; give it only with "
                         "instruction= on a clip")
    return check_refine_rounds(request["refine"])


def _attempts(request: Mapping) -> int:
    """``attempts``: executions of an instructed edit until the model reads the target back from it."""
    if request.get("instruction") is None:
        raise InputError("attempts redoes an instructed edit until the model reads the target back from it; a "
                         "described edit (a region and prompt) has no target to check: give it only with "
                         "instruction=")
    return check_attempts(request["attempts"])


def _instruction(request: Mapping, modality: str) -> str:
    """An instructed edit's instruction, understood and fitting the input (the grammar alone, no model), with
    no region beside it: the edit plans its own."""
    given = [key for key in REGION_KEYS if request.get(key) is not None]
    if given:
        raise InputError(f"an edit takes instruction or a region ({', '.join(given)}), not both: an instructed "
                         f"edit plans its own region")
    require_fits(parse_instruction(request["instruction"]), modality)
    return request["instruction"]


def _critic(value) -> str:
    if value not in CRITICS:
        raise SettingError(f"critic must be one of {', '.join(CRITICS)}, got {value!r}")
    return value


def _evaluator(value) -> str:
    if value not in EVALUATORS:
        raise SettingError(f"evaluator must be one of {', '.join(EVALUATORS)}, got {value!r}")
    return value


# ---- regions ------------------------------------------------------------------------------------------------------


def _edit_region(request: Mapping, modality: str) -> dict:
    given = {key: request[key] for key in REGION_KEYS if request.get(key) is not None}
    if len(given) != 1:
        raise InputError("an edit takes exactly one region: box [x0, y0, x1, y1] (pixels, a picture), seconds "
                         "[start, end] (a clip) or chars [start, end] (a caption)")
    return check_region(given, modality)


def check_regions(regions, modality: str) -> list[dict]:
    """The caller's plan for refine's first round: a list of regions (see :func:`check_region`)."""
    if not isinstance(regions, Sequence) or isinstance(regions, str) or not regions:
        raise InputError(f"regions must be a non-empty list of regions such as {{'box': [0, 0, 32, 32]}}, "
                         f"got {regions!r}")
    return [check_region(region, modality) for region in regions]


def check_region(region, modality: str) -> dict:
    """One region in native units, ``{"box": [x0, y0, x1, y1]}`` (pixels), ``{"seconds": [start, end]}`` or
    ``{"chars": [start, end]}``, of the input's modality; returned with its ``modality`` named."""
    if not isinstance(region, Mapping):
        raise InputError(f"a region must be an object such as {{'box': [0, 0, 32, 32]}}, got {region!r}")
    keys = [key for key in REGION_KEYS if key in region]
    if len(keys) != 1 or set(region) - {keys[0], "modality"}:
        raise InputError(f"a region has exactly one of box, seconds, chars (and optionally modality); got {region!r}")
    key = keys[0]
    if REGION_KEYS[key] != modality or region.get("modality", modality) != modality:
        raise InputError(f"a {key} region is for {REGION_KEYS[key]} content, but the input is {modality}")
    values = _ordered_numbers(key, region[key], 4 if key == "box" else 2)
    if key == "chars":
        if not all(float(v).is_integer() for v in values):
            raise InputError(f"chars are character offsets (whole numbers), got {region[key]!r}")
        values = [int(v) for v in values]
    return {"modality": modality, key: values}


def _ordered_numbers(key: str, value, count: int) -> list[float]:
    """``count`` finite numbers >= 0 where each end is past its start (x1 > x0, y1 > y0, end > start)."""
    shape = "[x0, y0, x1, y1]" if count == 4 else "[start, end]"
    if (not isinstance(value, Sequence) or isinstance(value, str) or len(value) != count
            or not all(isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
        raise InputError(f"{key} must be {count} numbers {shape}, got {value!r}")
    half = count // 2
    if min(value) < 0 or any(value[i + half] <= value[i] for i in range(half)):
        raise InputError(f"{key} {list(value)} is empty or negative: give {shape} with each end past its start")
    return [float(v) for v in value]


# ---- outputs ------------------------------------------------------------------------------------------------------


def _check_out(op: str, out, modality: str, default_folder: Path | None) -> Path | None:
    """Where the op writes: refine / edit a file of the input's kind; critique its heat map or score curve
    (.png, not for a caption) or its report (.json)."""
    if out is None:
        if default_folder is None or (op == "critique" and modality == "text"):
            return None
        out = str(default_folder / f"{op}{_out_suffixes(op, modality)[0]}")
    if not isinstance(out, str):
        raise OutputPathError(f"out must be a file path, got {out!r}")
    path = user_path(check_text(out, "out"), "out", OutputPathError)
    allowed = _out_suffixes(op, modality)
    if path.suffix.lower() not in allowed:
        what = "its heat map / score curve or its report" if op == "critique" else f"{modality}"
        raise OutputPathError(f"out {out!r}: a {op} of {modality} content writes {what}: a file ending in "
                              f"{', '.join(allowed)}")
    check_writable(path)
    return path


def _out_suffixes(op: str, modality: str) -> tuple[str, ...]:
    if op == "critique":
        return (".json",) if modality == "text" else (".png", ".json")
    return tuple(suffix for suffix, kind in OUTPUT_SUFFIXES.items() if kind == modality)


def _check_json_path(value, name: str) -> Path:
    if not isinstance(value, str) or Path(value).suffix.lower() != ".json":
        raise OutputPathError(f"{name} must be a .json file path, got {value!r}")
    path = user_path(check_text(value, name), name)
    check_writable(path)
    return path


__all__ = ["CRITICS", "CheckedRefine", "REFINE_OPS", "check_content", "check_refine_request", "check_region",
           "check_regions"]
