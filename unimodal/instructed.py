"""Instructed edits: ``UniModal.edit(content, instruction="make the circle blue")``, plan -> execute -> check.

Training-free, on the machinery that exists:

1. **understand**: :func:`unimodal.core.instructions.parse_instruction` (a small explicit language; anything else
   is refused with the forms listed);
2. **plan**: read the content back with the same model (caption the picture, transcribe the speech) or take the
   caller's ``text=``; apply the instruction to what was read (the caption grammar's attributes, or one word) to
   get the target description; localise the region to redo: a picture's object by the pixels of its colour as
   read back (the grammar's anchor for it when none are found), a word of speech by its place in the transcript
   (the cross-modal check's even-rate rule), a caption's word by its characters;
3. **execute**: the described edit (:func:`unimodal.refine.edit`: re-mask the region, regenerate it from the
   target description with the rest as context); a caption's word is spliced in as tokens, exactly (the
   instruction spells it out; there is nothing for a model to guess);
4. **check**: read the result back and say whether it parses to the target: a verdict, not a promise.

Why pixels rather than the critic or the cross-modal check's box to localise a picture's object: the check's box
is the grammar's anchor for a single object (it ignores where the object really is, and a pair gets none), and
a critic scores how sure the model is of each code, not which object the instruction names. The read-back says
which colour the named object has; the object is where that colour is.
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import partial

import numpy as np
import torch

from unimodal.checks import EDIT_ATTEMPTS, check_attempts, check_refine_rounds, check_speech_margin
from unimodal.core.errors import InputError, SettingError
from unimodal.core.grammar import COLORS, IMAGE_SIZE, POSITIONS, SIZES, parse_scene_caption, scene_caption, scenes_equal
from unimodal.core.instructions import apply_instruction, parse_instruction, replace_word, require_fits
from unimodal.core.seeds import check_seed, derived_seed
from unimodal.inference.critique import agreement_score, image_region, text_offsets
from unimodal.inference.picture_draft import dilated, draft_picture
from unimodal.inputs import as_image
from unimodal.refine import (SPEECH_MARGIN, _decoded, _differences, as_result, critique, draft_of, edit,
                             refine as refine_result, speech_span)
from unimodal.results import GenerationResult
from unimodal.rivals import compare_captions

SATURATION = 60  # the scenes' background is grey (saturation 0); every colour word is far above this
DRAFT_NOISE = 4  # a pixel the draft moved by at most this much (rounding) is not a change
MIN_PIXELS = 6  # fewer pixels of the colour than this: the object was not found (codec noise, a bad picture)
# Where each object of a pair stands, by its relation to the other: the grammar's anchor on that side.
_PAIR_SIDES = {"left of": ("left", "right"), "right of": ("right", "left"), "above": ("top", "bottom"),
               "below": ("bottom", "top")}


def instructed_edit(pipe, content, instruction: str, region=None, text: str | None = None, image=None, audio=None,
                    modality: str | None = None, seed: int = 0, candidates: int = 1, attempts: int | None = None,
                    draft: bool = True, touch_up: bool = False, speech_margin: float | None = None,
                    refine: int | None = None, **settings):
    """Edit ``content`` as ``instruction`` asks; returns (the edited result, a JSON-ready trace).

    ``text``: what the content says (the caption a picture was made from, the words a clip speaks), used instead
    of reading it back; ``candidates``: regenerations of a picture's or a clip's region, the one that agrees best
    with the target description kept (see :func:`unimodal.refine.edit`; they apply to what the model redraws: a
    new shape, speech, ``draft=False`` or the touch-up, not to a drafted change, which draws nothing);
    ``attempts``: when the check does not read the target back from what the model redrew, execute again
    (the next seeds) and check again, up to this many executions in all; the first that reads back as the
    target is kept, and when none does, the one whose read-back agrees best with the target (the agreement
    score, one pass each; None: :data:`unimodal.checks.EDIT_ATTEMPTS`); like ``candidates`` it applies only to
    what the model redraws;
    ``draft``: a picture's change of colour, size or place starts from the object's own pixels moved
    (:mod:`unimodal.inference.picture_draft`) and encoded by the image codec; False: the model redraws the
    whole region from the target description; ``touch_up``: the model then reviews the drafted codes and
    redraws the ones it doubts (off by default: on 64 test scenes it broke more edits than it fixed,
    docs/critique.md); ``speech_margin``: seconds either side of the word's middle that a speech edit redoes
    (:data:`unimodal.refine.SPEECH_MARGIN`, 0.4, when None; speech only); ``refine``: rounds of refine after each
    execution of a speech edit, inside the stretch it redid (the codes refine's default critic flags there, the
    speech critic on a trained head, said again with the target words in view, a round kept only when the critic's
    score rises; nothing outside the stretch is re-masked; refine's own sampler defaults), before the check reads it
    back (None or 0: none; speech only; measured on the shipped model, 96 test clips in each voice set: 2 rounds
    moved 1 verdict in the varied voices and 5 in the clear ones, as many fixed as broken, at 1.3x the passes,
    docs/critique.md, "Speech edits refined inside their stretch");
    ``settings``: sampler settings of the read-backs and the regeneration."""
    parsed = parse_instruction(instruction)
    asked_attempts = None if attempts is None else check_attempts(attempts)
    check_seed(seed, error=SettingError)  # before its attempts' seeds are derived from it
    attempts = EDIT_ATTEMPTS if attempts is None else attempts
    if speech_margin is not None:
        speech_margin = check_speech_margin(speech_margin)
    if refine is not None:
        refine = check_refine_rounds(refine)
    if touch_up and not draft:
        raise InputError("touch_up reviews a pixel draft; with draft=False the model redraws the region itself")
    if region is not None:
        raise InputError("edit takes region= (with text=, the new description) or instruction=, not both: an "
                         "instructed edit plans its own region")
    if image is not None or audio is not None:
        raise InputError("an instructed edit reads only its content and the instruction (and text=, what the content "
                         "says); image= / audio= conditions belong to a described edit (region= and text=)")
    result = as_result(pipe, content, modality)
    kind = _content_modality(result)
    require_fits(parsed, kind)
    if speech_margin is not None and kind != "audio":
        raise InputError(f"speech_margin widens the stretch a speech edit redoes; this content is {kind}")
    if refine is not None and kind != "audio":
        raise InputError(f"refine rounds after an edit review the stretch of speech it redid; this content is "
                         f"{kind} (pictures and captions are checked by reading them back)")
    rounds = refine or 0  # a value other than None was refused above unless the content is speech
    rgb = _pixels(pipe, content, result, kind)
    planner = _PLANNERS[kind]
    if kind == "audio":
        planner = partial(plan_speech, margin=SPEECH_MARGIN if speech_margin is None else speech_margin)
    plan = planner(pipe, result, parsed, text, seed, settings, rgb)
    drafted = _pixel_draft(pipe, result, plan, rgb) if draft and kind == "image" else None
    if drafted is None and touch_up and kind == "image":
        plan["touch_up"] = {"applied": False, "why": "no pixel draft to review"}
    if drafted is None and kind != "text":
        if attempts > 1 and not pipe._sampler_config(settings, pipe.scheduler.target_kind([kind])).random:
            plan["attempts"] = f"{attempts} asked, one made: this sampler draws the same region every time (greedy)"
            attempts = 1
        edited, check, execute_passes, check_passes = _attempt(pipe, result, plan, kind, seed, settings,
                                                               candidates, attempts, rounds)
    else:
        if drafted is None:
            edited, execute_passes = _execute(pipe, result, plan, kind, seed, settings, candidates)
        elif touch_up:
            edited, execute_passes = _touch_up(pipe, drafted, plan, seed, settings, candidates)
        else:
            edited, execute_passes = drafted, 0
        if candidates > 1 and drafted is not None and not touch_up:  # said, not silently dropped
            plan["draft"]["candidates"] = f"{candidates} asked, not used: a drafted change regenerates nothing"
        if (asked_attempts or 1) > 1 and drafted is not None:
            plan["draft"]["attempts"] = f"{attempts} asked, not used: a drafted change is executed once"
        if (asked_attempts or 1) > 1 and drafted is None:
            plan["attempts"] = f"{attempts} asked, not used: a caption's splice is exact"
        # a drafted change was painted from the object's own pixels, not drawn by the model from the target: the
        # drawing direction may judge it (it favours a picture the model drew from that very caption)
        check = _check(pipe, edited, kind, plan["target"], seed, settings,
                       drawing=drafted is not None and not touch_up)
        check_passes = check.pop("forward_passes")
    passes = {"plan": plan.pop("forward_passes"), "execute": execute_passes, "check": check_passes}
    if kind == "audio":  # what the kept execution's refine did (None: no rounds asked)
        plan["refine"] = edited.settings.get("refine")
    trace = {"instruction": parsed.to_dict(), "modality": kind, "plan": plan,
             "tokens_changed": _tokens_changed(pipe, result, edited, kind, plan), "check": check,
             "forward_passes": sum(passes.values()), "passes": passes}
    edited.forward_passes = trace["forward_passes"]
    edited.settings = {**edited.settings, "instruction": trace["instruction"], "verdict": check["parses_to_target"]}
    return edited, trace


def drafted_edit(pipe, result, instruction: str, text: str, index: int | None = None) -> tuple[object | None, dict]:
    """The pixel draft of an instructed picture edit alone, no model call: (the drafted result, or None when the
    change has no draft (a new shape, an object not found by its colour's pixels); the plan). ``text``: what the
    picture shows; ``index``: the object of it the instruction means, when the caller knows (two objects that
    read alike are told apart by the half of the canvas the relation gives each). For a caller that checks the
    result its own way (:mod:`unimodal.repair`)."""
    parsed = parse_instruction(instruction)
    require_fits(parsed, "image")
    rgb = np.asarray(result.image.convert("RGB"))
    plan = plan_picture(pipe, result, parsed, text, 0, {}, rgb, index)
    return _pixel_draft(pipe, result, plan, rgb), plan


def _pixels(pipe, content, result, kind: str) -> np.ndarray | None:
    """The picture to find objects in: as given (the codec is lossy; the caller's pixels are the truth), or the
    result's own picture when the content is a result."""
    if kind != "image":
        return None
    if isinstance(content, GenerationResult):
        return np.asarray(result.image.convert("RGB"))
    return as_image(content, pipe.image_codec.image_size)


def _content_modality(result) -> str:
    modalities = [m for m in ("image", "audio", "text") if m in result.token_ids]
    if len(modalities) != 1:
        raise InputError(f"an instructed edit works on one picture, clip or caption; this result holds {modalities}")
    return modalities[0]


# ---- plan ---------------------------------------------------------------------------------------------------------


def _read_back(pipe, result, kind: str, seed: int, settings) -> tuple[str, int]:
    """What the same model says the content shows or speaks, and the forward passes that took."""
    given = {"image": result.image} if kind == "image" else {"audio": (result.audio, result.sample_rate)}
    read = pipe.generate(**given, to="text", seed=seed, **settings)
    return read.text or "", read.forward_passes


def _what_it_says(pipe, result, kind, text, seed, settings) -> tuple[str, str, int]:
    if text is not None:
        return text, "caller", 0
    read, passes = _read_back(pipe, result, kind, seed, settings)
    return read, "model", passes


def plan_picture(pipe, result, parsed, text, seed, settings, rgb, index: int | None = None) -> dict:
    """Target caption and the box(es) to redo: the named object's (found by its colour) and, for a move, the
    place it goes to. ``index``: the object meant, when the caller knows it (:func:`drafted_edit`)."""
    read, read_by, passes = _what_it_says(pipe, result, "image", text, seed, settings)
    source = parse_scene_caption(read)
    if source is None:
        raise InputError(f"the picture reads back as {read!r}, which states no complete scene in the caption "
                         f"grammar; pass text= (--prompt) with the caption it was made from")
    target, index = apply_instruction(source, parsed, index)
    _require_readable(pipe, scene_caption(target, 0))
    boxes, located_by = picture_boxes(rgb, source, target, index)
    regions = [image_region(pipe.layout, pipe.layout.image_box_to_positions(box).tolist()) for box in boxes]
    return {"read_back": read, "read_by": read_by, "source": source, "target": scene_caption(target, 0),
            "target_attributes": target, "object": index, "located_by": located_by, "regions": regions,
            "forward_passes": passes}


def plan_speech(pipe, result, parsed, text, seed, settings, _rgb=None, margin: float = SPEECH_MARGIN) -> dict:
    """Target transcript and the stretch of seconds where the old word is spoken (at an even rate), ``margin``
    seconds either side of its middle."""
    read, read_by, passes = _what_it_says(pipe, result, "audio", text, seed, settings)
    target, (start, end) = replace_word(read, parsed.old, parsed.new)
    _require_readable(pipe, target)
    duration = len(result.token_ids["audio"]) / pipe.layout.audio_frame_rate
    region = {"modality": "audio", "seconds": speech_span(duration, read, start, end - start, half=margin)}
    return {"read_back": read, "read_by": read_by, "target": target, "located_by": "the word's place in the "
            "transcript at an even speaking rate", "speech_margin": margin, "regions": [region],
            "forward_passes": passes}


def plan_caption(pipe, result, parsed, text, seed, settings, _rgb=None) -> dict:
    """Target caption and the characters of the old word."""
    if text is not None:
        raise InputError("a caption says what it says: text= has no meaning for an instructed caption edit")
    target, (start, end) = replace_word(result.text, parsed.old, parsed.new)
    return {"read_back": result.text, "read_by": "the caption itself", "target": target,
            "located_by": "the word's characters", "regions": [{"modality": "text", "chars": [start, end]}],
            "forward_passes": 0}


def _require_readable(pipe, target: str) -> None:
    """Refuse a target the model cannot read as its condition before the edit runs."""
    tokens = len(pipe.text_codec.encode_one(target))
    if tokens > pipe.layout.max_text_len:
        raise InputError(f"the target description {target!r} is {tokens} tokens; this model reads at most "
                         f"{pipe.layout.max_text_len}, so it cannot regenerate from it")


_PLANNERS = {"image": plan_picture, "audio": plan_speech, "text": plan_caption}


# ---- where an object is -------------------------------------------------------------------------------------------


def _palette_index(rgb: np.ndarray) -> np.ndarray:
    """(H, W) int: the index in ``COLORS`` of each saturated pixel's nearest colour word, -1 for the grey
    background."""
    pixels = rgb.astype(np.float32)
    saturated = pixels.max(-1) - pixels.min(-1) > SATURATION
    canon = np.array(list(COLORS.values()), dtype=np.float32)  # (C, 3)
    nearest = ((pixels[..., None, :] - canon) ** 2).sum(-1).argmin(-1)  # (H, W)
    return np.where(saturated, nearest, -1)


def colour_mask(rgb: np.ndarray, colour: str) -> np.ndarray:
    """(H, W) bool: saturated pixels whose nearest colour word is ``colour``."""
    return _palette_index(rgb) == list(COLORS).index(colour)


def _side(source: dict, index: int) -> str | None:
    """The half of the canvas an object of a pair stands in (None for a single object)."""
    if len(source["objects"]) == 1:
        return None
    return _PAIR_SIDES[source["relation"]][index]


def _half(mask: np.ndarray, side: str | None) -> np.ndarray:
    if side is None:
        return mask
    half, kept = mask.shape[0] // 2, np.zeros_like(mask)
    cut = {"left": np.s_[:, :half], "right": np.s_[:, half:], "top": np.s_[:half, :], "bottom": np.s_[half:, :]}[side]
    kept[cut] = mask[cut]
    return kept


def _object_mask(rgb: np.ndarray, source: dict, index: int) -> np.ndarray:
    """(H, W) bool: the pixels of object ``index``'s colour (in its half of the canvas, for a pair)."""
    return _half(colour_mask(rgb, source["objects"][index]["color"]), _side(source, index))


def object_box(rgb: np.ndarray, source: dict, index: int) -> tuple[list[float] | None, str]:
    """The pixel box of object ``index`` of the scene read back: its colour's pixels (in its half of the canvas,
    for a pair), ignoring rows and columns with a single stray pixel. None when too few pixels are found."""
    mask = _object_mask(rgb, source, index)
    if mask.sum() < MIN_PIXELS:
        return None, "the grammar's anchor (no pixels of its colour found)"
    rows, cols = np.flatnonzero(mask.sum(1) >= 2), np.flatnonzero(mask.sum(0) >= 2)
    if not len(rows) or not len(cols):
        return None, "the grammar's anchor (no pixels of its colour found)"
    return [float(cols[0]), float(rows[0]), float(cols[-1] + 1), float(rows[-1] + 1)], "pixels of its colour"


def _object_pixels(rgb: np.ndarray, source: dict, index: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Object ``index``'s pixels taken whole, and each pixel's nearest palette colour (-1: background). The object is
    found by the colour it was read as (:func:`object_box`; in its half of the canvas, for a pair); then every
    saturated pixel connected to that box belongs to it, whatever its colour. None when it is not found."""
    from skimage.measure import label

    box, _ = object_box(rgb, source, index)
    if box is None:
        return None
    nearest = _palette_index(rgb)
    parts = label(_half(nearest >= 0, _side(source, index)), connectivity=2)
    touching = np.unique(parts[int(box[1]):int(box[3]), int(box[0]):int(box[2])])
    return np.isin(parts, touching[touching > 0]), nearest


# An object's extent (its longer side, pixels) that names its size: the grammar draws small objects 18 pixels across
# and large ones 28; between these two bounds the extent says neither, and the reading stands.
SMALL_AT_MOST, LARGE_AT_LEAST = SIZES["small"] + 3, SIZES["large"] - 3


def object_measures(rgb: np.ndarray, source: dict, index: int) -> tuple[str | None, dict[str, int], str | None,
                                                                         int | None]:
    """Object ``index`` found once and taken whole (:func:`_object_pixels`), measured twice: the colour word most of
    its pixels are nearest to and the count per colour word (an object drawn between two colour words holds pixels
    of both), and the size word its extent names (its longer side over rows and columns holding at least two of
    its pixels; None between :data:`SMALL_AT_MOST` and :data:`LARGE_AT_LEAST`) and the extent.
    (None, {}, None, None) when it is not found by the colour it was read as."""
    found = _object_pixels(rgb, source, index)
    if found is None:
        return None, {}, None, None
    whole, nearest = found
    tally = np.bincount(nearest[whole], minlength=len(COLORS))
    counts = {colour: int(tally[k]) for k, colour in enumerate(COLORS)}
    rows, cols = np.flatnonzero(whole.sum(1) >= 2), np.flatnonzero(whole.sum(0) >= 2)
    if not len(rows) or not len(cols):
        return max(counts, key=counts.get), counts, None, None
    extent = int(max(rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1))
    size = "small" if extent <= SMALL_AT_MOST else "large" if extent >= LARGE_AT_LEAST else None
    return max(counts, key=counts.get), counts, size, extent


def anchor_box(source: dict, index: int) -> list[float]:
    """Where the grammar draws the object: its position (one object) or its side of the pair, at its size."""
    obj = source["objects"][index]
    cx, cy = POSITIONS[obj.get("position") or _side(source, index)]
    return _square(cx, cy, SIZES[obj["size"]])


def _square(cx: float, cy: float, side: float) -> list[float]:
    half = side / 2 + 1  # a pixel of margin: anti-aliased edges
    return [max(0.0, cx - half), max(0.0, cy - half), min(IMAGE_SIZE, cx + half), min(IMAGE_SIZE, cy + half)]


def picture_boxes(rgb: np.ndarray, source: dict, target: dict, index: int) -> tuple[list[list[float]], str]:
    """The boxes to redo: the object where it is, grown to its target size around its centre; and for a move,
    the place the grammar puts it."""
    box, located_by = object_box(rgb, source, index)
    box = box or anchor_box(source, index)
    before, after = source["objects"][index], target["objects"][index]
    side = max(box[2] - box[0], box[3] - box[1], SIZES[after["size"]])
    boxes = [_square((box[0] + box[2]) / 2, (box[1] + box[3]) / 2, side)]
    if after.get("position") != before.get("position"):
        boxes.append(_square(*POSITIONS[after["position"]], SIZES[after["size"]]))
    return boxes, located_by


# ---- execute and check --------------------------------------------------------------------------------------------


def _execute(pipe, result, plan: dict, kind: str, seed: int, settings, candidates: int = 1, rounds: int = 0):
    """The edited result and its forward passes: the described edit, or a caption's exact splice; a speech edit
    then refined ``rounds`` rounds inside its stretch (:func:`_refine_stretch`)."""
    if kind == "text":
        return splice_caption(pipe, result, plan), 0
    edited = edit(pipe, result, plan["regions"], text=plan["target"], seed=seed, candidates=candidates, **settings)
    if "candidates" in edited.settings["edit"]:
        plan["candidates"] = {k: edited.settings["edit"][k] for k in ("candidates", "kept", "agreement")}
    passes = edited.forward_passes
    if kind == "audio" and rounds > 0:
        edited, refine_passes = _refine_stretch(pipe, edited, plan, seed, rounds)
        passes += refine_passes
    return edited, passes


def _refine_stretch(pipe, edited, plan: dict, seed: int, rounds: int):
    """A speech edit's result refined inside the stretch it redid by refine's default critic (the speech critic
    on a trained head, else confidence) and refine's own sampler defaults (not the edit's ``settings``): every code
    outside the codes the edit re-masked is kept (``refine(keep=...)``, by index, so the codes the stretch only
    partly covers may be redone too, as the edit redid them), the target words are the condition. A word said
    anew is where an edited clip's garbled sounds are (the model's own read-back hears it as the target where a
    listener does not), the flaw ``generate``'s speech refine reduces in a clip drawn whole. The refined result
    (its ``settings["refine"]``: what ran) and the passes refine spent."""
    n_codes = len(edited.token_ids["audio"])
    inside = _speech_positions(pipe, plan["regions"], n_codes)
    outside = [k for k in range(n_codes) if k not in inside]
    keep = [{"modality": "audio", "indices": outside}] if outside else []
    refined, trace = refine_result(pipe, edited, text=plan["target"], rounds=rounds, seed=seed, keep=keep)
    return refined, trace["forward_passes"]


def _attempt(pipe, result, plan: dict, kind: str, seed: int, settings, candidates: int, attempts: int,
             rounds: int = 0):
    """Execute and check until the check reads the target back, at most ``attempts`` times (attempt ``a`` draws
    from seed ``seed + a * candidates``, so no two draws share a seed); when none reads back as the target, the
    attempt whose read-back agrees best with it (the agreement score) is kept. The kept result, its check,
    and the execute and check passes of all the attempts; ``plan["attempts"]`` records each attempt."""
    tried, execute_passes, check_passes = [], 0, 0
    for a in range(attempts):
        edited, passes = _execute(pipe, result, plan, kind, derived_seed(seed, a * candidates), settings, candidates,
                                  rounds)
        check = _check(pipe, edited, kind, plan["target"], seed, settings)
        execute_passes, check_passes = execute_passes + passes, check_passes + check.pop("forward_passes")
        tried.append((edited, check, plan.pop("candidates", None)))
        if check["parses_to_target"]:
            break
    kept, agreement = len(tried) - 1, None
    if not tried[kept][1]["parses_to_target"] and len(tried) > 1:
        scored = [_agreement(pipe, edited, plan["target"]) for edited, _, _ in tried]
        check_passes += sum(calls for _, calls in scored)
        agreement = [round(score, 6) for score, _ in scored]
        kept = max(range(len(tried)), key=lambda k: scored[k][0])
    edited, check, chosen = tried[kept]
    if chosen is not None:
        plan["candidates"] = chosen
    if attempts > 1:
        plan["attempts"] = {"asked": attempts, "made": len(tried), "kept": kept,
                            "read_back": [c["read_back"] for _, c, _ in tried],
                            "parses_to_target": [c["parses_to_target"] for _, c, _ in tried],
                            "agreement": agreement}
    return edited, check, execute_passes, check_passes


def _pixel_draft(pipe, result, plan: dict, rgb: np.ndarray):
    """The result with the region's codes taken from the pixel draft of the target (every code outside the
    regions kept); None, with the reason in ``plan["draft"]``, when there is no draft (a new shape, an object
    not found by its colour)."""
    source, target, index = plan["source"], plan["target_attributes"], plan["object"]
    if plan["located_by"] != "pixels of its colour":
        plan["draft"] = {"used": False, "why": "the object was not found by its colour's pixels"}
        return None
    if target["objects"][index]["shape"] != source["objects"][index]["shape"]:
        plan["draft"] = {"used": False, "why": "a new shape has no silhouette to keep: the model draws it"}
        return None
    box, _ = object_box(rgb, source, index)  # stray pixels of the colour elsewhere are not the object
    core = _object_mask(rgb, source, index)
    inside_box = np.zeros_like(core)
    inside_box[max(0, int(box[1]) - 1):int(box[3]) + 1, max(0, int(box[0]) - 1):int(box[2]) + 1] = True
    picture = draft_picture(rgb, core & inside_box, source["objects"][index], target["objects"][index])
    if picture is None:
        plan["draft"] = {"used": False, "why": "the object's pixels are too faint to lift: the model redraws it"}
        return None
    codes = list(result.token_ids["image"])
    drafted = pipe.image_codec.encode(picture[None])[0].tolist()
    inside = _region_positions(pipe, plan["regions"])
    grown = sorted(_cells_changed(pipe.layout, rgb, picture) - inside)
    plan["regions"] += [image_region(pipe.layout, [k]) for k in grown]  # the draft's faint edges beyond the boxes
    spliced = [drafted[k] if k in inside or k in grown else code for k, code in enumerate(codes)]
    plan["draft"] = {"used": True, "codes_drafted": sum(a != b for a, b in zip(codes, spliced)),
                     "cells_added": len(grown)}
    return _decoded(pipe, {"image": spliced}, {}, 0, {})


def _cells_changed(layout, before: np.ndarray, after: np.ndarray) -> set[int]:
    """Grid cells holding a pixel the draft changed by more than :data:`DRAFT_NOISE` (one pixel around it
    included, so a splice's seam falls on pixels that did not change)."""
    changed = np.abs(after.astype(np.int16) - before.astype(np.int16)).max(-1) > DRAFT_NOISE
    rows, cols = np.nonzero(dilated(changed, 1))
    patch, (n_rows, n_cols) = layout.image_patch, layout.image_grid
    cells = np.minimum(rows // patch, n_rows - 1) * n_cols + np.minimum(cols // patch, n_cols - 1)
    return set(cells.tolist())


def _region_positions(pipe, regions) -> set[int]:
    return {int(k) for region in regions for k in pipe.layout.image_box_to_positions(region["box"]).tolist()}


def _speech_positions(pipe, regions, n_codes: int) -> set[int]:
    """The audio codes of a clip of ``n_codes`` that its regions (seconds) cover, in part or whole."""
    return {int(k) for region in regions
            for k in pipe.layout.audio_span_to_positions(*region["seconds"], n_codes=n_codes).tolist()}


def _touch_up(pipe, drafted, plan: dict, seed: int, settings, candidates: int = 1):
    """Review the drafted codes inside the regions with the model (the confidence score under the target
    description, at its own threshold), redraw the doubted ones with the rest as context, and keep the redraw
    only if the target reads back from it at least as well (the agreement score). The chosen result and its
    forward passes; ``plan["touch_up"]`` records what happened."""
    review = critique(pipe, drafted, text=plan["target"], critic="confidence")
    inside, threshold = _region_positions(pipe, plan["regions"]), review.thresholds["image"]
    doubted = sorted(k for k in inside if review.scores["image"][k] < threshold)
    plan["touch_up"] = {"threshold": threshold, "codes_doubted": len(doubted), "kept": False}
    passes = review.forward_passes
    if not doubted:
        return drafted, passes
    cells = [image_region(pipe.layout, [k]) for k in doubted]
    redrawn = edit(pipe, drafted, cells, text=plan["target"], seed=seed, candidates=candidates, **settings)
    before, calls_before = _agreement(pipe, drafted, plan["target"])
    after, calls_after = _agreement(pipe, redrawn, plan["target"])
    passes += redrawn.forward_passes + calls_before + calls_after
    plan["touch_up"].update(agreement=[round(before, 6), round(after, 6)], kept=after >= before)
    return (redrawn if after >= before else drafted), passes


def _agreement(pipe, result, target: str) -> tuple[float, int]:
    with pipe._lock:
        return agreement_score(pipe.backbone, pipe.layout, draft_of(pipe, replace(result, settings={}),
                                                                    {"text": target}))


def splice_caption(pipe, result, plan: dict):
    """The caption with the tokens that cover the old word replaced by the tokens of its replacement; every
    token before and after is kept as it was."""
    ids, codec = list(result.token_ids["text"]), pipe.text_codec
    offsets = text_offsets(codec, ids)
    start, end = plan["regions"][0]["chars"]
    covering = [k for k, (a, b) in enumerate(offsets) if b > start and a < end]
    first, last = covering[0], covering[-1]
    text, target = result.text, plan["target"]
    word = target[start:len(target) - (len(text) - end)]  # the replacement, as it stands in the target
    piece = text[offsets[first][0]:start] + word + text[end:offsets[last][1]]
    spliced = ids[:first] + codec.encode_one(piece).tolist() + ids[last + 1:]
    if len(spliced) > pipe.layout.max_text_len:
        raise InputError(f"the edited caption {plan['target']!r} takes {len(spliced)} tokens; this model writes at "
                         f"most {pipe.layout.max_text_len}")
    plan["regions"][0]["indices"] = list(range(first, last + 1))
    return _decoded(pipe, {"text": spliced}, {}, 0, {"edit": {"regions": plan["regions"], "tokens_remasked":
                                                              {"text": last + 1 - first}}})


def verdict(read: str, target: str) -> tuple[bool, list[str]]:
    """Whether ``read`` says ``target``: the same scene by the caption grammar when the target states one,
    else the same words; and the differences found."""
    asked = parse_scene_caption(target)
    if asked is not None:
        heard = parse_scene_caption(read)
        return scenes_equal(asked, heard), _differences(asked, heard)
    words = lambda s: re.findall(r"\w+", s.lower())  # noqa: E731 - one-line normaliser
    same = words(read) == words(target)
    return same, [] if same else [f"read {read!r}, asked {target!r}"]


def _check(pipe, edited, kind: str, target: str, seed: int, settings, drawing: bool = False) -> dict:
    """Read the edited content back (the model for a picture or speech; a caption reads as itself). With
    ``drawing`` (a picture whose change was drafted from its own pixels, not drawn by the model from the target),
    a picture read as another scene than the target is then asked of the drawing direction, as a caption is
    checked against its rival (:func:`unimodal.rivals.compare_captions`; the masked-diffusion model only): the
    target counts as read when the picture is likelier under it than under what was read (``rival_check`` in the
    check; two passes). On 64 colour edits the reading called 14 right edits wrong, the drawing direction none;
    on a region the model redrew from the target it favours the target (11 wrong shape edits called right
    against 4), so redrawn regions are judged by reading alone (docs/critique.md, "The check asks the drawing
    direction too")."""
    read, passes = (edited.text, 0) if kind == "text" else _read_back(pipe, edited, kind, seed, settings)
    same, differences = verdict(read, target)
    check = {"read_back": read, "parses_to_target": same, "differences": differences}
    if (drawing and not same and kind == "image" and not pipe.autoregressive
            and parse_scene_caption(read) is not None and parse_scene_caption(target) is not None):
        image = torch.as_tensor(edited.token_ids["image"], dtype=torch.long)
        with pipe._lock:
            trace, _, _ = compare_captions(pipe, {"image": image}, read, target)
        check["rival_check"], passes = trace, passes + trace["forward_passes"]
        if trace.get("kept") == "rival":
            check.update(parses_to_target=True, differences=[])
    return {**check, "forward_passes": passes}


def _tokens_changed(pipe, before, after, kind: str, plan: dict) -> dict:
    """Tokens changed inside the planned regions and outside them (outside should be 0: the edit's contract)."""
    old, new = before.token_ids[kind], after.token_ids[kind]
    if kind == "text":
        return _caption_tokens_changed(old, new, plan["regions"][0]["indices"])
    if kind == "image":
        inside = _region_positions(pipe, plan["regions"])
    else:
        inside = _speech_positions(pipe, plan["regions"], len(old))
    changed = [k for k in range(max(len(old), len(new))) if k >= min(len(old), len(new)) or old[k] != new[k]]
    return {"inside": sum(k in inside for k in changed), "outside": sum(k not in inside for k in changed)}


def _caption_tokens_changed(old: list, new: list, spliced: list[int]) -> dict:
    """A splice may change the caption's length: the tokens before the splice are compared in place, the
    tokens after it from the end."""
    head, tail = old[:spliced[0]], old[spliced[-1] + 1:]
    new_head, new_tail = new[:len(head)], new[len(new) - len(tail):] if tail else []
    outside = sum(a != b for a, b in zip(head, new_head)) + sum(a != b for a, b in zip(tail, new_tail))
    return {"inside": len(new) - len(head) - len(tail), "outside": outside}


__all__ = ["anchor_box", "colour_mask", "instructed_edit", "object_box", "object_measures", "picture_boxes", "plan_caption",
           "plan_picture", "plan_speech", "splice_caption", "verdict"]
