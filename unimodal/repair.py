"""Repair by the model's own reading: read a picture back, and change what the reading and the request disagree on
with instructed edits (:mod:`unimodal.instructed`), one attribute at a time.

The plan is the cross-modal check (:func:`unimodal.refine.cross_modal_check`): the picture is captioned by the same
model and both captions are parsed by the caption grammar. The objects of the reading are matched to the request's
(a pair may be read in the other order) and placed by the request's relation. Each read object's colour is then
measured from its pixels (the palette word most of them are nearest to): the model reads a colour it drew between
two words (a yellow square drawn orange-yellow) as the one it was asked for, and the pixels say otherwise; and its
size from its extent (the model reads some small objects as large, and shrinking those broke them). Each
colour, size or place of a matched object that differs from the request becomes an instruction ("make the small
yellow circle green") executed on the picture as it stands, on the object the matching names (two objects read
alike are told apart by their places). Those three changes keep the object's silhouette, so they start from its
own pixels (the pixel draft, no model call); an edit whose object is not found by the pixels of the colour it was
read as is not kept: the reading, not the picture, was wrong there. A shape and a pair's relation are left as
drawn: the model reads the shapes it draws wrong as right on the test scenes, and reads a held-out colour+shape
pair's shape by the colour it saw it with (docs/critique.md, "Repair by reading back").

    fixed, trace = pipe.refine(result, text="a small green circle on the left", repair=True, rounds=0)

:func:`refine_with_repair` is ``UniModal.refine(..., repair=True)``: the repair, then refine's rounds on the repaired
picture (this module imports :mod:`unimodal.refine`, never the other way round).
"""

from __future__ import annotations

from itertools import permutations

import numpy as np

from unimodal.core.errors import InputError
from unimodal.core.grammar import parse_scene_caption, scene_caption

# What a repair changes, and the instruction that changes it (the instruction language's forms).
REPAIRED = {"color": "make the {name} {value}", "size": "make the {name} {value}",
            "position": "move the {name} to the {value}"}
COMPARED = ("shape", "color", "size")  # the attributes that tell which read object is which asked one
INVERSE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}


def matched(asked: dict, heard: dict) -> list[int]:
    """For each asked object, the index of the read object it is: the pairing on which most attributes agree,
    counting the relation as one more when the reading's, seen from that pairing, is the request's (a pair read
    in the other order reads the inverse relation); the order as read when pairings tie."""
    n = len(asked["objects"])

    def agreeing(order) -> int:
        same = sum(asked["objects"][i].get(key) == heard["objects"][j].get(key)
                   for i, j in enumerate(order) for key in COMPARED)
        relation = heard.get("relation") if list(order) == sorted(order) else INVERSE.get(heard.get("relation"))
        return same + (asked.get("relation") is not None and relation == asked.get("relation"))

    return list(max(permutations(range(n)), key=lambda order: (agreeing(order), order == tuple(range(n)))))


def as_read(asked: dict, heard: dict) -> dict:
    """The scene the picture shows by the reading, its objects in the request's order and placed by the request's
    relation: the model reads a pair's relation wrong far more often than it draws it wrong, and an edit of a pair
    finds its object in the half the relation gives it."""
    order = matched(asked, heard)
    return {"objects": [dict(heard["objects"][j]) for j in order], "relation": asked.get("relation")}


def repairs(asked: dict, shown: dict) -> list[tuple[int, str, str]]:
    """(object's index, attribute, asked value) for each colour, size or place that ``shown`` (:func:`as_read`:
    the reading in the request's order) gets otherwise than the request."""
    return [(i, key, want[key]) for i, (want, seen) in enumerate(zip(asked["objects"], shown["objects"]))
            for key in REPAIRED if want.get(key) is not None and want[key] != seen.get(key)]


def repair_by_reading(pipe, result, request: str, seed: int = 0, colours: bool = True,
                      sizes: bool = True) -> tuple[object, dict]:
    """The picture with each attribute its reading gets wrong changed by an instructed edit's pixel draft
    (:func:`unimodal.instructed.drafted_edit`: no model call; the reading already said what to change), and the
    trace: ``check`` (the reading, :func:`unimodal.refine.cross_modal_check`), ``colours`` (each object whose
    pixels show another colour than it was read as), ``sizes`` (each whose extent names another size than it was
    read as), ``edits`` (each instruction, the object it means, whether it
    was kept and why not, its regions and codes drafted), ``forward_passes`` (the reading's). ``colours``: measure
    each read object's colour from its pixels (:func:`unimodal.instructed.object_measures`, the palette word most of
    them are nearest to) and take that over the reading where they differ: the model reads a colour it drew
    between two words (an orange-yellow square) as the one it was asked for. ``sizes``: likewise each read
    object's size from its extent (the same measure; the trace's ``sizes``): the model
    reads some small objects as large, and shrinking a small object breaks it. Nothing changes when the reading
    states another number of objects or no scene, or when only a shape or relation differs (or a colour read
    otherwise that the pixels show as asked)."""
    from unimodal.instructed import drafted_edit, object_measures
    from unimodal.refine import cross_modal_check

    check = cross_modal_check(pipe, result, request, seed)
    trace = {"check": check, "colours": [], "sizes": [], "edits": [], "forward_passes": check.get("forward_passes", 0)}
    asked = parse_scene_caption(request) if check.get("ran") else None
    heard = parse_scene_caption(check.get("read_back") or "") if asked is not None else None
    if asked is None or heard is None or len(heard["objects"]) != len(asked["objects"]):
        trace["why"] = ("the request states no scene" if asked is None else
                        "the reading states no scene" if heard is None else
                        "the reading states another number of objects")
        return result, trace
    current = as_read(asked, heard)
    if colours or sizes:  # each object found once, by the colour it was read as (as its edit will find it)
        rgb = np.asarray(result.image.convert("RGB"))
        for index, obj in enumerate(current["objects"]):
            colour, counts, size, extent = object_measures(rgb, current, index)
            if colours and colour is not None and counts[colour] > counts[obj["color"]]:
                trace["colours"].append({"object": index, "read": obj["color"], "pixels": colour,
                                         "counts": {k: v for k, v in counts.items() if v}})
            if sizes and size is not None and size != obj.get("size"):
                trace["sizes"].append({"object": index, "read": obj.get("size"), "pixels": size, "extent": extent})
    for seen in trace["colours"]:
        current["objects"][seen["object"]]["color"] = seen["pixels"]
    for seen in trace["sizes"]:
        current["objects"][seen["object"]]["size"] = seen["pixels"]
    asked_for = repairs(asked, current)
    if not asked_for:
        trace["why"] = ("the reading agrees with the request" if check["agrees"] and not trace["colours"]
                        and not trace["sizes"] else
                        "what differs is a shape or relation, or a colour or size the pixels show as asked")
        return result, trace
    for index, key, value in asked_for:
        obj = current["objects"][index]
        instruction = REPAIRED[key].format(name=f"{obj['size']} {obj['color']} {obj['shape']}", value=value)
        try:
            edited, plan = drafted_edit(pipe, result, instruction, scene_caption(current, 0), index)
        except InputError as refused:  # a move in a pair
            trace["edits"].append({"instruction": instruction, "object": index, "kept": False, "why": str(refused)})
            continue
        if edited is None:
            trace["edits"].append({"instruction": instruction, "object": index, "kept": False,
                                   "why": f"no pixel draft ({plan['draft']['why']}): the reading is not trusted"})
            continue
        result, current = edited, plan["target_attributes"]
        trace["edits"].append({"instruction": instruction, "object": index, "kept": True, "regions": plan["regions"],
                               "codes_drafted": plan["draft"]["codes_drafted"]})
    return result, trace


def refine_with_repair(pipe, result, text=None, audio=None, seed: int = 0, rounds: int = 0,
                       **kwargs) -> tuple[object, dict]:
    """``UniModal.refine(result, ..., repair=True)``: :func:`repair_by_reading` against the request (``text=``,
    or what the model hears in ``audio=``, the speech the picture was drawn from: the trace's ``repair.request``),
    then :func:`unimodal.refine.refine` with ``rounds`` and ``kwargs`` on the repaired picture (``rounds=0``, the
    default: the repair alone, no critic pass). The rounds after a repair keep what it edited (``keep``: no
    critic re-masks the regions of its kept edits); they still redraw what the critic doubts elsewhere, and one
    confidence round after the repair took the held-out pairs from 0.870 to 0.835 (docs/critique.md), so none is
    the default. The trace gains ``repair`` and its passes, and a ``budget`` counts them. The refine settings are
    checked before the repair reads anything."""
    from dataclasses import replace

    from unimodal.inference.refine import RefineConfig
    from unimodal.refine import _check_model_caption, as_result, refine, require_trained_critic

    fields = set(RefineConfig.__dataclass_fields__)
    RefineConfig(**{k: v for k, v in kwargs.items() if k in fields and v is not None}, rounds=rounds, seed=seed)
    require_trained_critic(pipe, kwargs.get("critic", "confidence"))  # each refused here, before any pass
    _check_model_caption(kwargs.get("model_caption"))
    result = as_result(pipe, result)
    if result.image is None or (text is None and audio is None) or (text is not None and (
            not isinstance(text, str) or not text.strip())):
        raise InputError("repair reads a picture back and compares it with the request it was drawn from: give a "
                         "picture and its request as text= (or the speech it was drawn from as audio=)")
    heard = None
    if text is None:
        with pipe._lock:
            transcript = pipe.generate(audio=audio, to="text", seed=seed)
        heard = {"text": transcript.text, "from": "audio", "forward_passes": transcript.forward_passes}
    if heard is not None and not (heard["text"] or "").strip():  # nothing heard: nothing to compare with
        fixed, repaired = result, {"edits": [], "why": "the speech was heard as no words", "forward_passes": 0}
    else:
        fixed, repaired = repair_by_reading(pipe, result, text if heard is None else heard["text"], seed)
    if heard is not None:
        repaired = {"request": heard, **repaired,
                    "forward_passes": repaired["forward_passes"] + heard["forward_passes"]}
    spent = repaired["forward_passes"]
    fixed = replace(fixed, forward_passes=result.forward_passes, settings=result.settings)
    if rounds == 0 and not kwargs.get("check"):  # the repair alone: no critic pass
        trace = {"critic": None, "evaluator": None, "rounds": [], "rounds_kept": 0, "score_initial": None,
                 "score_final": None, "forward_passes": 0, "stopped": "rounds"}
        refined = fixed
    else:
        if kwargs.get("budget") is not None:
            kwargs["budget"] = max(kwargs["budget"] - spent, 1)
        edited = [region for e in repaired["edits"] if e["kept"] for region in e.get("regions", [])]
        kwargs["keep"] = list(kwargs.get("keep") or []) + edited
        refined, trace = refine(pipe, fixed, text=text, audio=audio, seed=seed, rounds=rounds, **kwargs)
    trace["repair"] = repaired
    trace["forward_passes"] += spent
    return replace(refined, forward_passes=refined.forward_passes + spent), trace


__all__ = ["REPAIRED", "as_read", "matched", "refine_with_repair", "repair_by_reading", "repairs"]
