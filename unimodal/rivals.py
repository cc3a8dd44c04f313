"""A caption read from a picture, checked against its rivals: the same words with the relation turned around, or
one object's size or colour changed.

Reading a picture of two objects, the model names both right far more often than it says which stands where: of
the 39 test pictures soupc (shipped until 2026-12-06) read wrong greedily, 30 named both objects right and put them the
other way round, and re-masking the relation word with the picture in view kept its word every time. Drawing is
its strong direction (0.96 of test scenes judged right), and drawing knows where each object goes. So the
check asks the drawing direction: the picture is read back from the caption and from its rival (every picture
code masked, the caption in view: :func:`unimodal.inference.critique.agreement_score`, one pass each), and the
caption under which the picture is likelier is kept. On the 200 test pictures: 0.805 -> 0.955, 30 captions
fixed and none broken, at two passes a caption that names two objects, three when the rival is kept
(docs/results.md, "Reading pairs: the caption against its rival"). The other error of a reader of pairs is
binding: one object given the other's colour or size ("a small purple square below a small purple square" for a
red one below it). Since 2026-12-07 the check is a search (:func:`best_rival`): every caption one attribute away
(the relation turned around, each object's size or colour changed; shapes are left as read) is scored the same
way and the likeliest kept when it beats the caption, two rounds at most. On dig40's 200 validation pictures it
read 0.965 against 0.925 with the relation alone (8 fixed, none broken), at 13.8 passes a caption against 8.4
(docs/results.md, "Reading pairs: rivals one attribute apart"). It checks a caption asked for alone
(``to="text"``) and the plan in words a request's other outputs are made from; a caption drawn together with
speech in one loop (``plan="none"``) is not checked, since the speech was made with it.

The rivals come from the scene language (:func:`unimodal.core.grammar.attribute_rivals`): a caption that does
not state a two-object scene has none and is left as read. The confidence of a word the check put in is the
model's probability of it with it re-masked, the picture and the rest of the caption in view (one more pass),
not the sampler's: the sampler never committed it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from unimodal.checks import TWIN_REFUSALS, check_rivals
from unimodal.core.errors import InputError, SettingError
from unimodal.core.grammar import attribute_rivals, inverse_relation
from unimodal.results import GenerationResult
from unimodal.tokenizers_mm.layout import MODALITIES

RIVALS_DEFAULT = True  # the masked-diffusion model checks the captions it reads from pictures
# Rounds of the search over captions one attribute apart (best_rival); 0: the relation turned around alone
ATTRIBUTE_ROUNDS = 2


def resolve_rivals(rivals: bool | None, autoregressive: bool) -> bool:
    """The setting that runs (``rivals`` True, False or None: the default), checked: the twin has no reading back,
    so asking it for the check is refused and the default is off for it."""
    if rivals is not None:
        check_rivals(rivals)
    if rivals and autoregressive:
        raise SettingError(TWIN_REFUSALS["rivals"])
    return (RIVALS_DEFAULT and not autoregressive) if rivals is None else rivals


def applies(conditions: Mapping) -> bool:
    """Whether a caption made from these conditions (modality -> ids) can be checked: it was read from a
    picture."""
    return "image" in conditions


def compare_captions(pipe, conditions: Mapping[str, torch.Tensor], read: str, rival: str) -> tuple[dict, list, list]:
    """Which of two captions the picture among ``conditions`` is likelier under, asked of the drawing direction:
    each caption given as the picture's prompt, every picture code masked (the agreement score, one pass each).
    Returns the trace (``read``, ``rival``, both scores, ``kept``: "rival" only when the rival is likelier, and
    the passes; ``skipped`` and no scores where a caption has more tokens than the text slots), the two captions'
    ids and their two drafts (no drafts when skipped). Both captions are read in the text codec's own split of the
    words, so neither is favoured by how it was split."""
    from unimodal.inference.critique import agreement_score

    ids = [pipe.text_codec.encode_one(text).to(torch.long) for text in (read, rival)]
    try:
        drafts = [_drafted(pipe, conditions, one) for one in ids]
    except InputError as error:  # more tokens than the text slots: nothing to compare, said in the trace
        return {"read": read, "rival": rival, "skipped": str(error), "forward_passes": 0}, ids, []
    scores = [agreement_score(pipe.backbone, pipe.layout, draft) for draft in drafts]
    trace = {"read": read, "rival": rival, "agreement": [round(s, 6) for s, _ in scores],
             "kept": "rival" if scores[1][0] > scores[0][0] else "read",
             "forward_passes": sum(calls for _, calls in scores)}
    return trace, ids, drafts


def _drafted(pipe, conditions: Mapping[str, torch.Tensor], caption_ids: torch.Tensor):
    """The draft that reads the picture among ``conditions`` back from a caption: the conditions shown, the
    caption's ids as its text (InputError when they are more than the text slots)."""
    from unimodal.inference.critique import make_draft

    shown = [(m, conditions[m]) for m in MODALITIES if m in conditions]
    return make_draft(pipe.layout, shown, {"text": caption_ids})


def best_rival(pipe, conditions: Mapping[str, torch.Tensor], read: str, rounds: int = ATTRIBUTE_ROUNDS
               ) -> tuple[dict, list, list]:
    """The caption the picture among ``conditions`` is likeliest under, searched from ``read`` one attribute at a
    time: each round scores every caption one attribute away from the best so far
    (:func:`unimodal.core.grammar.attribute_rivals`, the drawing direction's agreement, one pass each) and moves
    to the likeliest when it beats the best, at most ``rounds`` rounds. Returns the trace in
    :func:`compare_captions`' form (``rival``: the caption kept when it is not ``read``, else the likeliest
    rival; ``agreement``: the two scores; ``rivals``: captions scored; ``rounds``: rounds that moved), the two
    captions' ids and drafts. With ``rounds`` 0, the relation turned around alone (the check as it was first
    built)."""
    from unimodal.inference.critique import agreement_score

    if rounds == 0:
        rival = inverse_relation(read)
        return compare_captions(pipe, conditions, read, rival) if rival else ({}, [], [])
    if not attribute_rivals(read):
        return {}, [], []  # not two objects: nothing to compare, no pass spent

    def scored(text):
        ids = pipe.text_codec.encode_one(text).to(torch.long)
        draft = _drafted(pipe, conditions, ids)
        score, calls = agreement_score(pipe.backbone, pipe.layout, draft)
        return score, calls, ids, draft

    try:
        best = (read, *scored(read))
    except InputError as error:  # more tokens than the text slots
        return {"read": read, "rival": read, "skipped": str(error), "forward_passes": 0}, [], []
    first, passes, compared, moved, runner_up = best, best[2], {read}, 0, None
    for _ in range(rounds):
        challenger = None
        for rival in attribute_rivals(best[0]):
            if rival in compared:
                continue
            compared.add(rival)
            try:
                candidate = (rival, *scored(rival))
            except InputError:  # a rival longer than the text slots is not a candidate
                continue
            passes += candidate[2]
            if challenger is None or candidate[1] > challenger[1]:
                challenger = candidate
        if challenger is None:
            break
        if challenger[1] <= best[1]:
            runner_up = runner_up or challenger
            break
        best, moved = challenger, moved + 1
    if not moved and runner_up is None:  # every rival longer than the text slots: the read was scored alone
        skipped = "no rival fits the text slots"
        return {"read": read, "rival": read, "skipped": skipped, "forward_passes": passes}, [], []
    other = best if moved else runner_up
    trace = {"read": read, "rival": other[0], "agreement": [round(first[1], 6), round(other[1], 6)],
             "kept": "rival" if moved else "read", "rivals": len(compared) - 1, "rounds": moved,
             "forward_passes": passes}
    return trace, [first[3], other[3]], [first[4], other[4]]


def rival_checked(pipe, conditions: Mapping[str, torch.Tensor], caption: GenerationResult,
                  rounds: int = ATTRIBUTE_ROUNDS) -> GenerationResult:
    """``caption`` (a result holding text alone, read from the picture among ``conditions``) or the rival the
    picture reads back best from (:func:`best_rival`, ``rounds`` rounds); ``settings["rival_check"]`` says what
    was compared, the two scores and which was kept, and ``forward_passes`` counts the check. A caption with no
    rival is returned as it is."""
    from unimodal.inference.critique import remasked_probabilities

    read_ids = torch.tensor(caption.token_ids["text"], dtype=torch.long)
    trace, ids, drafts = best_rival(pipe, conditions, caption.text or "", rounds)
    if not trace:
        return caption
    if "skipped" in trace:
        return dataclasses.replace(caption, forward_passes=caption.forward_passes + trace["forward_passes"],
                                   settings={**caption.settings, "rival_check": trace})
    rival_ids = ids[1]
    kept, passes = trace["kept"], trace["forward_passes"]
    token_ids, confidence = caption.token_ids, caption.confidence
    if kept == "rival":
        changed = [k for k in range(len(rival_ids))
                   if k >= len(read_ids) or int(rival_ids[k]) != int(read_ids[k])]
        probs, calls = remasked_probabilities(pipe.backbone, pipe.layout, drafts[1], "text", changed)
        passes += calls
        trace["forward_passes"] = passes
        old = list(caption.confidence.get("text", []))
        new = [old[k] if k < len(old) else 0.0 for k in range(len(rival_ids))]
        for k, p in zip(changed, probs.tolist()):
            new[k] = p
        token_ids = {**caption.token_ids, "text": [int(i) for i in rival_ids]}
        confidence = {**caption.confidence, "text": new}
    return dataclasses.replace(caption, text=trace["rival"] if kept == "rival" else caption.text, token_ids=token_ids,
                               confidence=confidence, forward_passes=caption.forward_passes + passes,
                               settings={**caption.settings, "rival_check": trace})


__all__ = ["ATTRIBUTE_ROUNDS", "RIVALS_DEFAULT", "applies", "best_rival", "compare_captions", "resolve_rivals",
           "rival_checked"]
