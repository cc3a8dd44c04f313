"""``UniModal.critique`` / ``refine`` / ``edit``: the pipeline's side of the self-critique loop.

The math is in :mod:`unimodal.inference.critique` (scores, regions) and :mod:`unimodal.inference.refine` (plan / execute /
evaluate); this module turns a :class:`GenerationResult` (or a picture, clip or caption on disk) and the
inputs it was made from into a :class:`~unimodal.inference.critique.Draft`, and the refined draft back into a result,
with pictures a person can read (a heat map over the image, a score curve under the audio).

    result = pipe.generate(text="a small red circle on the left", to="image", seed=0)
    report = pipe.critique(result, text="a small red circle on the left")       # scores, regions, heat map
    fixed, trace = pipe.refine(result, text="a small red circle on the left", rounds=3, critic="confidence")
    edited = pipe.edit("red.png", region={"modality": "image", "box": [0, 16, 32, 48]},
                       text="a small blue circle on the left")
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from unimodal.inference.critique import (CONTENT_CRITICS, HEAD_CRITICS, Draft, agreement_score, flags_of, make_critic,
                                         make_draft, regions_from_flags, sample_score, selection_of, thresholds_for)
from unimodal.inference.refine import RefineConfig, critic_name, regenerate
from unimodal.inference.refine import refine as refine_draft
from unimodal.tokenizers_mm.layout import MODALITIES
from unimodal.checks import check_candidates, check_draws_differ
from unimodal.core.errors import InputError, SettingError
from unimodal.core.grammar import POSITIONS, SIZES, parse_scene_caption, scenes_equal
from unimodal.inputs import as_audio, as_image, as_text
from unimodal.core.paths import atomic_write
from unimodal.core.seeds import check_seed, derived_seed
from unimodal.results import GenerationResult

HEAT_SCALE = 4  # the heat map is drawn at 4x the picture's size, so 8-pixel codes are easy to see
# Refining a caption the model wrote from an input (a picture it read, speech it heard), unless the caller says
# otherwise: the confidence critic flags the words the model gave less than 0.9 (its own default, 0.05, is set
# for corrupted words and flags nothing in a caption the model wrote itself), they are sampled again at
# temperature 1.0 (a greedy redraw writes the same words back), a round is kept when the input read back from
# the caption (the picture drawn from it) became likelier, and the loop retries until ``rounds`` rounds in a row
# were not kept. Measured on r10 (docs/critique.md, "Reading pictures, refined"): reading 200 test pictures
# 0.695 -> 0.760 at 17 forward passes against 8.5 (3 rounds), no right caption broken; the critic's own defaults
# change no caption at all. A caption from elsewhere (a file, a corrupted one) keeps those defaults: on 64
# captions with 25% of their words corrupted they repair 0.859 right, this recipe 0.781.
CAPTION_REFINE = {"threshold": 0.9, "temperature": 1.0, "evaluator": "agreement"}
# Speech made alone (``to="audio"``) on a model whose critic head is trained: refine reads it with the content
# critic and the head together (the best speech critic: AUROC 0.890 / 0.905 in the varied / clear voices against
# 0.860 / 0.884 for the content critic alone on the model's own fills, docs/critique.md), and ``generate`` refines
# it this many rounds unless told otherwise. Measured on soupc, image->audio, 200 validation scenes (docs/results.md,
# "Speech refined by its critic" and "The speech critic's stricter ear"): 0.715 -> 0.815 at 1.5x the passes (0.780
# with the critic's ear at 0.5; the confidence critic 0.755).
SPEECH_CRITIC = "content+learned"
SPEECH_REFINE_ROUNDS = 2


def speech_alone(targets: Sequence[str]) -> bool:
    """Whether a request's (or a result's) outputs are speech alone: what :data:`SPEECH_CRITIC` and
    :data:`SPEECH_REFINE_ROUNDS` apply to."""
    return list(targets) == ["audio"]


def default_critic(pipe, targets: Sequence[str]) -> str:
    """The critic :func:`refine` and :func:`critique` read when the caller names none: :data:`SPEECH_CRITIC` for
    speech alone on a model whose critic head is trained, else ``"confidence"`` (training-free)."""
    if speech_alone(targets) and getattr(pipe.config, "critic_trained", False):
        return SPEECH_CRITIC
    return "confidence"


def default_refine_rounds(pipe, targets: Sequence[str]) -> int:
    """The rounds of refine ``generate`` runs after sampling when the caller gives none (``refine=None``):
    :data:`SPEECH_REFINE_ROUNDS` for speech alone on a model whose critic head is trained (not the
    autoregressive twin, which cannot refine), else 0."""
    if getattr(pipe, "autoregressive", False) or default_critic(pipe, targets) != SPEECH_CRITIC:
        return 0
    return SPEECH_REFINE_ROUNDS


@dataclass
class Critique:
    """What :meth:`UniModal.critique` found. ``scores``: per generated modality, one score in [0, 1] per
    token (1: looks right); ``regions``: the flagged areas in native units, each with its token ``indices``
    and mean ``score``; ``score``: the draft's mean log-score; ``check``: the cross-modal check (None if
    not run); ``picture``: the heat map over the image, or the score curve under the audio (None for text);
    ``thresholds``: per modality, the score a token had to fall below to be flagged."""

    critic: str
    scores: dict[str, list[float]]
    regions: list[dict]
    score: float
    forward_passes: int
    check: dict | None = None
    picture: Image.Image | None = field(default=None, repr=False)
    thresholds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"critic": self.critic, "score": round(self.score, 6), "forward_passes": self.forward_passes,
                "scores": {m: [round(s, 4) for s in v] for m, v in self.scores.items()},
                "thresholds": dict(self.thresholds),
                "regions": self.regions, "check": self.check}

    def save(self, path) -> Path:
        """``.png``: the heat map / score curve; ``.json``: :meth:`to_dict`. Written whole or not at all (a
        temporary file, then a rename), as results are."""
        path = Path(path)
        if path.suffix.lower() == ".json":
            write = lambda temporary: temporary.write_text(json.dumps(self.to_dict(), indent=2) + "\n")  # noqa: E731
        elif path.suffix.lower() == ".png":
            if self.picture is None:
                raise InputError("a text critique has no picture; save it as .json")
            write = lambda temporary: self.picture.save(temporary, format="PNG")  # noqa: E731
        else:
            raise InputError(f"save a critique as .png (the heat map) or .json, got {str(path)!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        return atomic_write(path, write)


# ---- results <-> drafts -------------------------------------------------------------------------------------


def as_result(pipe, content, modality: str | None = None) -> GenerationResult:
    """A picture, clip or caption (object or file path) as a result whose tokens are its codec's codes, so
    a file on disk can be critiqued and refined like a fresh generation."""
    if isinstance(content, GenerationResult):
        return content
    modality = modality or _modality_of(content)
    tokens = {}
    if modality == "image":
        tokens["image"] = pipe.image_codec.encode(as_image(content, pipe.image_codec.image_size)[None])[0].cpu()
    elif modality == "audio":
        wave = torch.tensor(as_audio(content), dtype=torch.float32)
        tokens["audio"] = pipe.audio_codec.encode([wave])[0][:pipe.layout.max_audio_len]
    else:
        tokens["text"] = pipe.text_codec.encode_one(as_text(content))[:pipe.layout.max_text_len]
    return _decoded(pipe, {m: ids.tolist() for m, ids in tokens.items()}, {}, 0, {})


def _modality_of(content) -> str:
    if isinstance(content, Image.Image):
        return "image"
    if isinstance(content, (str, Path)) and Path(str(content)).suffix.lower() in (".png", ".jpg", ".jpeg", ".bmp"):
        return "image"
    if isinstance(content, (str, Path)) and Path(str(content)).suffix.lower() in (".wav", ".flac", ".ogg", ".mp3"):
        return "audio"
    if isinstance(content, (tuple, np.ndarray)):
        return "image" if np.asarray(content if not isinstance(content, tuple) else content[0]).ndim == 3 else "audio"
    return "text"


def is_model_caption(draft: Draft, result: GenerationResult, declared: bool | None = None) -> bool:
    """Whether :data:`CAPTION_REFINE` applies: the draft is text alone, read against an input (a picture or
    speech), and the result came from the model's sampler (``generate``, or ``refine`` of such a result: its
    settings name the sampler's mode), not from a file or from tokens given as they are. ``declared``: the
    caller's word on the last point (a caption file ``generate`` wrote is the model's, which its tokens cannot
    tell); None decides from the result."""
    caption = bool(draft.conditions) and [s.modality for s in draft.target.spans] == ["text"]
    if declared and not caption:
        raise InputError("model_caption is for a caption read against the picture or speech it was made from: "
                         "give that input (image= or audio=) with a text result")
    made_by_model = declared if declared is not None else bool((result.settings or {}).get("mode"))
    return caption and made_by_model


def _check_model_caption(value) -> None:
    if value is not None and not isinstance(value, bool):
        raise SettingError(f"model_caption must be True, False or None, got {value!r}")


def _flag_threshold(critic, threshold: float | None, caption: bool) -> float | None:
    """The threshold a critique or refine flags below: the caller's, else a model caption's for the confidence
    critic, else None (the critic's own default, :func:`thresholds_for`)."""
    if threshold is None and caption and (critic == "confidence" or critic in CONTENT_CRITICS):  # words: confidence
        return CAPTION_REFINE["threshold"]
    return threshold


def draft_of(pipe, result: GenerationResult, inputs: Mapping) -> Draft:
    """The result's tokens as a draft, with the inputs (text / image / audio) encoded as its conditions. A result
    the model planned in words (``plan="text"`` without a text output) also reads those words, as its outputs
    were generated with them, unless the caller gives a text."""
    targets = _targets(result)
    if not targets:
        raise InputError("this result holds no generated tokens to critique")
    given = {m: v for m, v in inputs.items() if v is not None}
    used = (result.settings or {}).get("inputs")
    if used and not given:
        raise InputError(f"this result was generated from {used}; pass the same input(s) (e.g. text=...) so "
                         f"the critique reads it in context")
    item = pipe._prepare({**given, "to": targets}, 0, False)
    pipe._read_inputs(item)  # the inputs read (text tokenized, image resized, audio resampled) ...
    item = pipe._encode_inputs([item])[0]  # ... then encoded: they are the draft's conditions
    stage = (result.settings or {}).get("text_stage") or {}
    if stage.get("conditioned") and "text" not in given and "text" not in targets:  # the words it was made with
        words = torch.tensor(stage["token_ids"], dtype=torch.long)
        alone = result.settings.get("plan") == "text-only"  # then the outputs were made from the words alone
        item.conditions = {"text": words} if alone else {**item.conditions, "text": words}
    conditions = [(m, item.conditions[m]) for m in MODALITIES if m in item.conditions]
    return make_draft(pipe.layout, conditions, {m: torch.tensor(result.token_ids[m], dtype=torch.long) for m in targets})


def _decoded(pipe, token_ids: Mapping[str, list[int]], confidence: Mapping, passes: int,
             settings: Mapping) -> GenerationResult:
    image = audio = text = None
    if "image" in token_ids:
        image = Image.fromarray(pipe.image_codec.decode(torch.tensor([token_ids["image"]]))[0])
    if "audio" in token_ids:
        audio = pipe.audio_codec.decode([torch.tensor(token_ids["audio"], dtype=torch.long)])[0]
    if "text" in token_ids:
        text = pipe.text_codec.decode_one(token_ids["text"])
    return GenerationResult(text=text, image=image, audio=audio, sample_rate=pipe.audio_codec.sample_rate,
                            token_ids={m: list(v) for m, v in token_ids.items()},
                            confidence={m: [float(c) for c in v] for m, v in confidence.items()},
                            forward_passes=passes, steps=passes, settings=dict(settings))


def _scoring_cfg(pipe, draft: Draft, cfg):
    """The guidance the confidence score reads logits with: the caller's, else the sampler's default for
    these targets (the distribution the tokens were drawn from)."""
    if cfg is not None:
        return cfg
    kind = pipe.scheduler.target_kind([s.modality for s in draft.target.spans])
    return pipe._sampler_config({}, kind).cfg


# ---- critique -----------------------------------------------------------------------------------------------


def require_trained_critic(pipe, critic) -> None:
    """Refuse ``critic="learned"`` on a model whose critic head was never trained: its scores would be noise
    (an untrained head says 0.5 everywhere), not a judgement."""
    if critic in HEAD_CRITICS and not getattr(pipe.config, "critic_trained", False):
        raise SettingError(f"critic={critic!r} reads the backbone's critic head, and this model's was never trained "
                           "(its training_config.json has no \"critic_trained\": true). Train it by fine-tuning "
                           "with the critic objective: unimodal train --init-from MODEL_FOLDER --critic-weight 0.1 "
                           "--data ... --out RUN, or the head alone: --critic-only --critic-share 1 (docs/critique.md); "
                           "or use critic='confidence' (training-free). A model fine-tuned without the critic "
                           "objective from one whose head was trained carries that head, untrained for the moved "
                           "backbone: to read it anyway, unimodal merge-models --models MODEL_FOLDER PARENT "
                           "--weights 1 0 --critic-from 1 --out NEW")


def scoring_critic(pipe, critic):
    """The critic as the scoring functions take it: ``"content"`` bound to the pipeline's codecs (it decodes
    codes, :mod:`unimodal.inference.content`), any other name or callable as it is. Made once per pipeline."""
    if not (isinstance(critic, str) and critic in CONTENT_CRITICS):
        return critic
    made = getattr(pipe, "_content_critics", None)
    if made is None:
        made = pipe._content_critics = {}
    if critic not in made:
        from unimodal.inference.content import ContentCritic

        made[critic] = ContentCritic(getattr(pipe.image_codec, "model", None), getattr(pipe.audio_codec, "model", None),
                                     with_head=critic == "content+learned")
    return made[critic]


def critique(pipe, result, text=None, image=None, audio=None, critic=None, fraction: float = 0.25,
             threshold: float | None = None, groups: int = 4, cfg=None, check: bool = False, seed: int = 0,
             model_caption: bool | None = None) -> Critique:
    """Per-token scores, flagged regions and a picture of them; ``check`` also reads the output back. A caption
    the model wrote from an input is flagged, by default, where :func:`refine` would redo it
    (:data:`CAPTION_REFINE`; ``model_caption`` as :func:`refine` takes it). ``critic`` None: :func:`default_critic`."""
    require_trained_critic(pipe, critic)
    _check_model_caption(model_caption)
    result = as_result(pipe, result)
    critic = default_critic(pipe, _targets(result)) if critic is None else critic
    with pipe._lock:
        draft = draft_of(pipe, result, {"text": text, "image": image, "audio": audio})
        caption = is_model_caption(draft, result, model_caption)
        threshold = _flag_threshold(critic, threshold, caption)  # the words refine redoes
        config = RefineConfig(fraction=fraction, threshold=threshold, groups=groups, seed=seed)
        score = make_critic(scoring_critic(pipe, critic), pipe.backbone, pipe.layout, _scoring_cfg(pipe, draft, cfg),
                            config.groups, seed)
        scores, passes = score(draft)
        flags = flags_of(scores, critic, fraction, threshold)
        regions = regions_from_flags(pipe.layout, flags, scores, draft, pipe.text_codec)
    report = cross_modal_check(pipe, result, text, seed) if check else None
    if report is not None:
        passes += report["forward_passes"]
    return Critique(critic_name(critic),
                    {m: [float(v) for v in s] for m, s in scores.items()}, regions, sample_score(scores), passes,
                    report, _picture(pipe, result, scores, regions),
                    {m: v for m, v in thresholds_for(critic, threshold).items() if m in scores})


# ---- the cross-modal check ----------------------------------------------------------------------------------


def cross_modal_check(pipe, result: GenerationResult, request: str | None, seed: int = 0) -> dict:
    """Read the output back with the same model (caption the picture, transcribe the speech), parse both
    that and the request with the caption grammar and compare. A disagreement names the attributes that
    differ and, where the request says where the object is, the region to redo."""
    modality = "image" if result.image is not None else "audio" if result.audio is not None else None
    if modality is None or not request:
        return {"ran": False, "why": "the check reads back a picture or speech made from a text request"}
    with pipe._lock:
        read = pipe.generate(**{modality: result.image if modality == "image" else (result.audio, result.sample_rate)},
                             to="text", seed=seed)
    asked, heard = parse_scene_caption(request), parse_scene_caption(read.text or "")
    report = {"ran": True, "read_back": read.text, "forward_passes": read.forward_passes,
              "agrees": scenes_equal(asked, heard) if asked is not None else None,
              "differences": _differences(asked, heard), "regions": []}
    if asked is not None and not report["agrees"]:
        report["regions"] = _check_regions(pipe, result, modality, asked, request, report["differences"])
    return report


def _differences(asked: dict | None, heard: dict | None) -> list[str]:
    if asked is None:
        return []
    if heard is None:
        return ["read-back states no complete scene"]
    if len(asked["objects"]) != len(heard["objects"]):
        return [f"objects: asked {len(asked['objects'])}, read {len(heard['objects'])}"]
    out = []
    for index, (a, h) in enumerate(zip(asked["objects"], heard["objects"])):
        out += [f"object {index + 1} {key}: asked {a[key]}, read {h.get(key)}" for key in a if a[key] != h.get(key)]
    if asked.get("relation") != heard.get("relation"):
        out.append(f"relation: asked {asked.get('relation')}, read {heard.get('relation')}")
    return out


def _check_regions(pipe, result, modality: str, asked: dict, request: str, differences: list[str]) -> list[dict]:
    """Where to redo: in a picture, the box the request puts its single object in; in speech, the stretch
    where the first differing word of the request falls (assuming an even speaking rate)."""
    if modality == "image":
        if len(asked["objects"]) != 1:
            return []
        obj, patch = asked["objects"][0], pipe.layout.image_patch
        (cx, cy), half = POSITIONS[obj["position"]], SIZES["large"] / 2 + patch / 2
        size = pipe.layout.image_grid[0] * patch
        box = [max(0, cx - half), max(0, cy - half), min(size, cx + half), min(size, cy + half)]
        return [{"modality": "image", "box": [float(v) for v in box]}]
    words = [d.split(": asked ")[1].split(",")[0] for d in differences if ": asked " in d]
    at = next((request.lower().find(w) for w in words if request.lower().find(w) >= 0), -1)
    duration = len(result.token_ids["audio"]) / pipe.layout.audio_frame_rate
    if at < 0 or duration <= 0:
        return []
    return [{"modality": "audio", "seconds": speech_span(duration, request, at, len(words[0]))}]


SPEECH_MARGIN = 0.4  # seconds either side of a word's middle that a speech edit or repair redoes


def speech_span(duration: float, text: str, start: int, length: int, half: float = SPEECH_MARGIN) -> list[float]:
    """Seconds where characters ``start : start + length`` of ``text`` are spoken in a clip of ``duration``,
    assuming an even speaking rate: ``half`` seconds either side of the word's middle, within the clip."""
    middle = duration * (start + 0.5 * length) / max(len(text), 1)
    return [round(max(0.0, middle - half), 3), round(min(duration, middle + half), 3)]


REFINE_SUMMARY = ("critic", "forward_passes", "stopped", "rounds_kept")  # what a refined result's settings keep


def refine_summary(trace: Mapping) -> dict:
    """What a refined result's ``settings["refine"]`` keeps of its trace: the critic, the passes refine spent,
    why it stopped, the rounds it ran (``rounds_run``) and kept."""
    return {**{k: trace[k] for k in REFINE_SUMMARY}, "rounds_run": len(trace["rounds"])}


# ---- refine and edit ----------------------------------------------------------------------------------------


def refine(pipe, result, text=None, image=None, audio=None, rounds: int = 3, budget: int | None = None,
           critic=None, fraction: float = 0.25, threshold: float | None = None, groups: int = 4,
           regen_steps: int | None = None, regions: Sequence[Mapping] | None = None, check: bool = False,
           cfg=None, seed: int = 0, evaluator: str | None = None, patience: int | None = None, on_round=None,
           model_caption: bool | None = None, keep: Sequence[Mapping] | None = None,
           **settings) -> tuple[GenerationResult, dict]:
    """Re-mask flagged regions and regenerate them, round by round; the refined result and the trace.

    ``regions``: the caller's plan for the first round (native units); ``check``: plan the first round from
    the cross-modal check when it disagrees; ``evaluator``: what keeps a round, ``"critic"`` (its mean
    log-score rose) or ``"agreement"`` (the request read back from the result by the same model became more
    likely; needs ``text=`` / the input the result was made from; ``"agreement-each"``: read token by token, the
    rest of the request in view, a pass per token); ``patience``: rounds in a row not kept before
    the loop stops (each retry re-plans and samples anew); ``settings``: sampler settings of the regenerations (as
    :meth:`UniModal.generate` takes them; their steps are set per round unless ``regen_steps``);
    ``on_round(r, result)``: called after each round that ran with the result as it stands (for benchmarks).
    ``keep``: regions (native units, as ``regions``) no round re-masks, whoever planned it (the critic, the check,
    ``regions``): what a repair made right; the trace's ``keep`` lists them.
    Defaults: ``evaluator`` "critic" and ``patience`` 1, except for a caption the model wrote from an input,
    which is refined by :data:`CAPTION_REFINE` (each of its settings only where the caller gives none) with
    ``patience`` equal to ``rounds``; the trace's ``config``, ``regen_temperature`` and ``caption_recipe`` say
    what ran. ``model_caption``: whether a caption read against its input is the model's own (True: a caption
    file ``generate`` wrote; False: a person's, or corrupted data), where the result cannot tell (None: a
    result of ``generate`` is, a file is not). ``critic`` None: :func:`default_critic` (speech alone on a trained
    head: :data:`SPEECH_CRITIC`; otherwise ``"confidence"``).
    """
    require_trained_critic(pipe, critic)
    _check_model_caption(model_caption)
    config = RefineConfig(rounds=rounds, budget=budget, fraction=fraction, threshold=threshold, groups=groups,
                          regen_steps=regen_steps, seed=seed, evaluator="critic" if evaluator is None else evaluator,
                          patience=1 if patience is None else patience)  # refused before any work, as given
    if keep is not None and (isinstance(keep, (Mapping, str)) or not isinstance(keep, Sequence)):
        raise InputError(f"keep must be a list of regions (each like {{'modality': 'image', 'box': [x0, y0, x1, "
                         f"y1]}}), got {type(keep).__name__}")
    result = as_result(pipe, result)
    critic = default_critic(pipe, _targets(result)) if critic is None else critic
    report = cross_modal_check(pipe, result, text, seed) if check else None
    if report is not None and report.get("regions") and regions is None:
        regions = report["regions"]
    with pipe._lock:
        draft = draft_of(pipe, result, {"text": text, "image": image, "audio": audio})
        caption = is_model_caption(draft, result, model_caption)
        if caption:  # its recipe, only where the caller gave none
            config = replace(config, threshold=_flag_threshold(critic, threshold, True),
                             evaluator=evaluator or CAPTION_REFINE["evaluator"],
                             patience=patience or max(rounds, 1))
            if settings.get("temperature") is None:
                settings["temperature"] = CAPTION_REFINE["temperature"]
        sampler = pipe._sampler_config(settings, pipe.scheduler.target_kind([s.modality for s in draft.target.spans]))
        kept = selection_of(pipe.layout, keep, draft, pipe.text_codec) if keep else None
        final, confidence, trace = refine_draft(pipe.backbone, pipe.layout, draft, sampler,
                                                scoring_critic(pipe, critic), config,
                                                _scoring_cfg(pipe, draft, cfg), pipe.text_codec, regions,
                                                {m: torch.tensor(v) for m, v in result.confidence.items()},
                                                _round_hook(pipe, on_round), kept)
    trace["regen_temperature"], trace["caption_recipe"] = sampler.temperature, caption
    if keep:
        trace["keep"] = [dict(r) for r in keep]
    if report is not None:
        trace["check"] = report
        trace["forward_passes"] += report.get("forward_passes", 0)
    tokens = {m: ids.tolist() for m, ids in final.tokens(pipe.layout).items()}
    refined = _decoded(pipe, tokens, confidence, result.forward_passes + trace["forward_passes"],
                       {**result.settings, "refine": refine_summary(trace)})
    return refined, trace


def _targets(result: GenerationResult) -> list[str]:
    """The modalities a result holds generated tokens of, in canonical order."""
    return [m for m in MODALITIES if m in (result.token_ids or {})]


def _round_hook(pipe, on_round):
    if on_round is None:
        return None
    return lambda r, draft: on_round(r, _decoded(pipe, {m: ids.tolist() for m, ids in draft.tokens(pipe.layout).items()},
                                                 {}, 0, {}))


def edit(pipe, content, region: Mapping | Sequence[Mapping], text=None, image=None, audio=None,
         modality: str | None = None, seed: int = 0, candidates: int = 1, **settings) -> GenerationResult:
    """Described edit: re-mask ``region`` (or a list of regions) of ``content`` and regenerate it from the
    new description (``text``, or another input) with the rest of the content as context.

    ``candidates`` > 1: regenerate that many times (seeds ``seed``, ``seed + 1``, ...) and keep the one that
    agrees best with the description, read back by the same model
    (:func:`unimodal.inference.critique.agreement_score`, one model call each); the result's settings say
    which was kept and every candidate's score."""
    check_candidates(candidates)
    check_seed(seed, error=SettingError)  # before its candidates' seeds are derived from it
    result = as_result(pipe, content, modality)
    regions = [region] if isinstance(region, Mapping) else list(region)
    with pipe._lock:
        draft = draft_of(pipe, replace(result, settings={}), {"text": text, "image": image, "audio": audio})
        if candidates > 1 and not draft.conditions:
            raise InputError("candidates > 1 chooses the regeneration that agrees best with the new description; "
                             "give one (text=...)")
        selection = selection_of(pipe.layout, regions, draft, pipe.text_codec)
        kind = pipe.scheduler.target_kind([s.modality for s in draft.target.spans])
        check_draws_differ(candidates, pipe._sampler_config(settings, kind).random)
        tried, passes = [], 0
        for k in range(candidates):
            sampler = pipe._sampler_config({**settings, "seed": derived_seed(seed, k)}, kind)
            edited, sampled = regenerate(pipe.backbone, pipe.layout, draft, selection, sampler, derived_seed(seed, k))
            score, calls = agreement_score(pipe.backbone, pipe.layout, edited) if candidates > 1 else (None, 0)
            passes += sampled.forward_passes + calls
            tried.append((score, edited, sampled))
        kept = max(range(candidates), key=lambda k: tried[k][0]) if candidates > 1 else 0
        _, edited, sampled = tried[kept]
    tokens = {m: ids.tolist() for m, ids in edited.tokens(pipe.layout).items()}
    changed = {m: int(s.sum()) for m, s in selection.items()}
    record = {"regions": regions, "tokens_remasked": changed}
    if candidates > 1:
        record.update(candidates=candidates, kept=kept, agreement=[round(t[0], 6) for t in tried])
    return _decoded(pipe, tokens, sampled.confidence, passes, {"edit": record, "seed": derived_seed(seed, kept)})


# ---- pictures for a person ----------------------------------------------------------------------------------


def _picture(pipe, result: GenerationResult, scores: Mapping, regions: Sequence[Mapping]) -> Image.Image | None:
    if "image" in scores and result.image is not None:
        return heat_map(result.image, scores["image"], pipe.layout.image_grid, regions)
    if "audio" in scores and result.audio is not None:
        return score_curve(result.audio, scores["audio"], pipe.layout.audio_frame_rate, result.sample_rate, regions)
    return None


def heat_map(picture: Image.Image, scores, grid: tuple[int, int], regions: Sequence[Mapping] = ()) -> Image.Image:
    """The picture at 4x beside a copy with each code tinted red by its doubt and the regions outlined.

    Doubt is ``1 - score`` stretched to this picture's own range: a weak model gives low probabilities to
    most codes (many codes draw the same background), and an absolute scale would paint it all red."""
    size = (picture.width * HEAT_SCALE, picture.height * HEAT_SCALE)
    base = picture.convert("RGB").resize(size, Image.NEAREST)
    doubt = 1.0 - np.asarray(scores, dtype=np.float32).reshape(grid)  # (rows, cols)
    doubt = (doubt - doubt.min()) / max(float(doubt.max() - doubt.min()), 1e-6)
    alpha = Image.fromarray((doubt * 190).astype(np.uint8)).resize(size, Image.NEAREST)
    tinted = Image.composite(Image.new("RGB", size, (255, 0, 0)), base, alpha)
    draw = ImageDraw.Draw(tinted)
    for region in regions:
        if region.get("modality") == "image":
            x0, y0, x1, y1 = (v * HEAT_SCALE for v in region["box"])
            draw.rectangle([x0, y0, x1 - 1, y1 - 1], outline=(255, 255, 0), width=2)
    both = Image.new("RGB", (2 * size[0], size[1]))
    both.paste(base, (0, 0))
    both.paste(tinted, (size[0], 0))
    return both


def score_curve(wave, scores, frame_rate: float, sample_rate: int, regions: Sequence[Mapping] = (),
                width: int = 640, height: int = 120) -> Image.Image:
    """The waveform's envelope on top and, under it, each audio code's score (0 at the bottom, 1 at the
    top) on the same time axis; flagged spans shaded."""
    wave = np.asarray(wave, dtype=np.float32).reshape(-1)
    seconds = max(len(wave) / sample_rate, len(scores) / frame_rate, 1e-3)
    image = Image.new("RGB", (width, 2 * height), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    x_of = lambda s: min(width - 1, int(s / seconds * width))  # noqa: E731 - one-line mapping
    for region in regions:
        if region.get("modality") == "audio":
            draw.rectangle([x_of(region["seconds"][0]), 0, x_of(region["seconds"][1]), 2 * height - 1],
                           fill=(255, 220, 220))
    peak = float(np.abs(wave).max()) or 1.0
    for x in range(width):
        chunk = wave[int(x / width * len(wave)):int((x + 1) / width * len(wave)) + 1]
        amp = float(np.abs(chunk).max()) / peak if len(chunk) else 0.0
        draw.line([x, height / 2 * (1 - amp), x, height / 2 * (1 + amp)], fill=(60, 60, 160))
    points = []
    for k, score in enumerate(scores):
        y = 2 * height - 4 - float(score) * (height - 8)
        points += [(x_of(k / frame_rate), y), (x_of((k + 1) / frame_rate), y)]
    if len(points) > 1:
        draw.line(points, fill=(200, 0, 0), width=2)
    draw.line([0, height, width, height], fill=(0, 0, 0))
    return image


__all__ = ["SPEECH_MARGIN", "Critique", "as_result", "critique", "cross_modal_check", "edit", "heat_map", "refine",
           "score_curve", "speech_span"]
