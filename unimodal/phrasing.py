"""The words a picture's speech is made from, said in the phrasing the model speaks most clearly.

A picture turned into speech is planned in words (``plan="text-only"``, the default): the model reads a caption from
the picture, then speaks that caption. The caption's words are the model's own, not the caller's, and the scene
language says one scene in several forms ("a small red circle on the left", "on the left, a small red circle", "a
small circle in red on the left", "there is a small red circle on the left", ...): any of them is a right answer,
but the model does not say them all equally clearly. Spoken by soupc (shipped until 2026-12-06) and heard by the speech
judge, 200 validation scenes each said as written and in the form "there is a ...", the second is heard right more
often (docs/results.md, "Speaking the plan in the form the model says best"). So before speech is made from a plan
that states a scene, the plan is rendered in that form (:data:`SPOKEN_TEMPLATE` of the scene grammar), the scene
unchanged; a plan that states no scene is spoken as read.

It applies only where the words are the model's plan and not an output the caller sees (image->audio, not joint,
whose caption is an output, nor text->audio, whose words are the caller's), after the caption's rival check
(:mod:`unimodal.rivals`). ``rephrase=False`` (``--no-rephrase``) speaks the caption as read. The trace is
``settings["text_stage"]["rephrased"]``: the caption as read and as said.
"""

from __future__ import annotations

import dataclasses

import torch

from unimodal.checks import check_rephrase
from unimodal.core.grammar import parse_scene_caption, scene_caption
from unimodal.results import GenerationResult

REPHRASE_DEFAULT = True
SPOKEN_TEMPLATE = 1  # "there is a {size} {color} {shape} {where}" / "there is a {a} {rel} a {b}"


def resolve_rephrase(rephrase: bool | None) -> bool:
    """The setting that runs: ``rephrase`` checked, None being the default (on)."""
    return REPHRASE_DEFAULT if rephrase is None else check_rephrase(rephrase)


def applies(targets, text_is_output: bool) -> bool:
    """Whether a plan in words is said in the spoken form: speech is made from it and the words are no output."""
    return "audio" in targets and not text_is_output


def rephrased(pipe, plan: GenerationResult) -> GenerationResult:
    """``plan`` (a caption result) in the spoken form when it states a scene; as it is otherwise, or when the spoken
    form would not fit the text slots. The words' confidence is the plan's lowest (the scene was read with it)."""
    scene = parse_scene_caption(plan.text or "")
    if scene is None:
        return plan
    said = scene_caption(scene, SPOKEN_TEMPLATE)
    trace = {"read": plan.text, "said": said}
    ids = pipe.text_codec.encode_one(said).to(torch.long)
    if len(ids) > pipe.layout.max_text_len:
        trace.update(said=plan.text, skipped=f"{len(ids)} tokens; the text slots hold {pipe.layout.max_text_len}")
        return dataclasses.replace(plan, settings={**plan.settings, "rephrased": trace})
    read = list(plan.confidence.get("text", []))
    lowest = min(read) if read else 1.0
    return dataclasses.replace(plan, text=said, token_ids={**plan.token_ids, "text": [int(i) for i in ids]},
                               confidence={**plan.confidence, "text": [lowest] * len(ids)},
                               settings={**plan.settings, "rephrased": trace})


__all__ = ["REPHRASE_DEFAULT", "SPOKEN_TEMPLATE", "applies", "rephrased", "resolve_rephrase"]
