"""``unimodal eval``: generate in every direction and score the outputs with the independent judges.

Each direction generates from the same cases (a caption, its picture, its speech and the attributes that
made them) with pinned sampler settings and seeds, then a judge that knows nothing of the model scores what
came out:

- ``->image`` (text->image, audio->image): scenes: the scene judge reads the objects back (GenEval-style:
  every object's shape, colour and size right, and its position, or the pair's relation) and per attribute;
  digits: the digit judge's class equals the digit;
- ``->text`` (image->text, audio->text): the caption parsed back into attributes equals the truth; WER
  against the reference caption (the template is free, so WER counts wording too);
- ``->audio`` (text->audio, image->audio): the speech judge transcribes it; its parsed attributes equal the
  truth and its WER against the caption, beside the judge's WER on the real eSpeak audio (the reference);
- ``joint`` (all three from nothing): consistency: the picture's judged attributes equal those parsed from
  the generated caption and from the transcript of the generated speech.

The report holds every figure, the model's hash, the sampler settings and seeds: the same command with the
same seed gives the same numbers. The cases arrive ready-made (``unimodal/eval_cases.py`` builds them from the
embedded data sets), since ``inference/`` does not import ``training/``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from unimodal.core.errors import InputError
from unimodal.core.figures import pyplot, save_figure
from unimodal.core.paths import model_hash, report_json  # noqa: F401  (model_hash re-exported: the reports' model hash)
from unimodal.core.ranking import auroc, auroc_within
from unimodal.core.readings import check_agreement
from unimodal.core.seeds import derived_seed
from unimodal.core.grammar import parse_digit_caption, parse_scene_caption, scenes_equal

DIRECTIONS = ("text->image", "image->text", "audio->text", "text->audio", "image->audio", "audio->image", "joint")
JOINT_TARGETS = ("text", "image", "audio")
SCENE_ATTRIBUTES = ("shape", "color", "size", "position", "relation")


@dataclass
class EvalCase:
    """One ground-truth sample: ``kind`` "scene" or "digit" (or "other": no attributes to judge), its caption,
    picture (H, W, 3 uint8), speech (float32 16 kHz or None) and ``truth`` (scene attributes or the digit)."""

    kind: str
    text: str
    image: np.ndarray | None
    audio: np.ndarray | None
    truth: dict | int | None


def shell_hint(direction: str) -> str:
    """For a direction cut short at ``-`` (``text->image`` unquoted in a shell became ``text-`` plus a file
    named ``image``): a hint to quote it; else empty."""
    return " (a shell reads an unquoted > as a redirection: quote it, 'text->image')" \
        if direction.rstrip().endswith("-") else ""


def parse_direction(direction: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``"text->image"`` -> (("text",), ("image",)); ``"joint"`` -> ((), all three)."""
    if direction == "joint":
        return (), JOINT_TARGETS
    if direction not in DIRECTIONS:
        raise InputError(f"unknown direction {direction!r}; known: {', '.join(DIRECTIONS)}{shell_hint(direction)}")
    condition, target = direction.split("->")
    return (condition,), (target,)


# ---- judging one output (pure functions of the judges and the truth) ------------------------------------------


def judge_image(case: EvalCase, image, scene_judge=None, digit_judge=None) -> dict:
    """``correct`` and, for scenes, each attribute (None where it does not apply)."""
    if case.kind == "scene":
        score = scene_judge.score(np.asarray(image), case.truth)
        return {"correct": score["correct"], **{key: score[key] for key in SCENE_ATTRIBUTES}}
    if case.kind == "digit":
        return {"correct": bool(int(digit_judge.predict(np.asarray(image)[None])[0]) == case.truth)}
    return {}


def caption_correct(case: EvalCase, text: str) -> bool | None:
    """Whether a caption (or transcript) says what the case shows; None when there is nothing to check."""
    if case.kind == "scene":
        return scenes_equal(parse_scene_caption(text or ""), case.truth)
    if case.kind == "digit":
        return parse_digit_caption(text or "") == case.truth
    return None


def judged_attributes(text: str | None, image, scene_judge, digit_judge) -> dict:
    """What a caption and a picture say, read the same way for joint consistency: the caption decides the kind."""
    scene = parse_scene_caption(text or "")
    if scene is not None:
        return {"kind": "scene", "text": scene, "image": scene_judge.attributes(np.asarray(image))}
    digit = parse_digit_caption(text or "")
    if digit is not None:
        return {"kind": "digit", "text": digit, "image": int(digit_judge.predict(np.asarray(image)[None])[0])}
    return {"kind": None, "text": None, "image": None}


def joint_consistency(text: str | None, image, transcript: str | None, scene_judge, digit_judge) -> dict:
    """``text_parses``, ``image_matches_text``, ``audio_matches_text`` and ``consistent`` (all three agree)."""
    read = judged_attributes(text, image, scene_judge, digit_judge)
    if read["kind"] == "scene":
        image_ok = scenes_equal(read["image"], read["text"])
        audio_ok = scenes_equal(parse_scene_caption(transcript or ""), read["text"])
    elif read["kind"] == "digit":
        image_ok = read["image"] == read["text"]
        audio_ok = parse_digit_caption(transcript or "") == read["text"]
    else:
        image_ok = audio_ok = False
    return {"kind": read["kind"], "text_parses": read["kind"] is not None, "image_matches_text": bool(image_ok),
            "audio_matches_text": bool(audio_ok), "consistent": bool(image_ok and audio_ok)}


# ---- running a direction ------------------------------------------------------------------------------------


class Judges:
    """The three judges, each loaded on first use (Whisper and OpenCV cost time to import)."""

    def __init__(self, digit_seed: int = 0):
        self._digit_seed, self._scene, self._digit, self._speech = digit_seed, None, None, None

    @property
    def scene(self):
        from unimodal.judges import SceneJudge

        self._scene = self._scene or SceneJudge()
        return self._scene

    @property
    def digit(self):
        from unimodal.judges import DigitJudge

        self._digit = self._digit or DigitJudge(self._digit_seed)
        return self._digit

    @property
    def speech(self):
        from unimodal.judges import SpeechJudge

        self._speech = self._speech or SpeechJudge()
        return self._speech


def eval_requests(direction: str, cases: Sequence[EvalCase], seed: int) -> list[dict]:
    conditions, targets = parse_direction(direction)
    requests = []
    for index, case in enumerate(cases):
        inputs = {"text": case.text, "image": case.image, "audio": case.audio}
        requests.append({**{m: inputs[m] for m in conditions}, "to": list(targets), "seed": derived_seed(seed, index)})
    return requests


# how to choose among draws, not how to draw
# The directions ``repair`` applies to: a picture drawn from a request in words, or from speech (its transcript)
REPAIRED_DIRECTIONS = ("text->image", "audio->image")
CHOOSING_SETTINGS = ("candidates", "accept_confidence", "accept_agreement", "agreement")


def candidates_used(pipe, direction: str, settings: Mapping) -> int:
    """Draws per case for ``direction``: the ``candidates`` setting, except 1 for the joint direction (it reads no
    input to agree with) and for a direction sampled greedily (temperature 0 and no choice noise, the default
    for text: every draw would be the same)."""
    candidates = settings.get("candidates") or 1
    if candidates == 1 or direction == "joint":
        return 1
    sampling = {k: v for k, v in settings.items() if k not in CHOOSING_SETTINGS}
    return candidates if pipe.draws_differ(list(parse_direction(direction)[1]), **sampling) else 1


def generate_direction(pipe, direction: str, cases: Sequence[EvalCase], settings: dict, seed: int,
                       batch_size: int = 16, progress: bool = True, draws: list | None = None) -> tuple[list, float]:
    """The outputs for every case (request i seeded ``seed + i``) and the wall time per sample. A ``candidates``
    setting (> 1) draws that many per case (seeds ``seed + i``, ``seed + i + 1``, ...) and keeps the one the model
    reads back best (``UniModal.generate(candidates=)``), case by case (:func:`evaluate` passes what
    :func:`candidates_used` says). ``draws``: a list that gets, per case, every draw it chose from (seed order;
    :meth:`UniModal.best_of`), for judging each. The outputs are as drawn: :func:`evaluate` refines them
    (``generate``'s default refine of speech among them) after they are drawn, with :func:`refine_direction`."""
    from tqdm.auto import tqdm

    settings = dict(settings)
    candidates = settings.pop("candidates", None) or 1
    if candidates == 1:  # they choose among candidates: one draw has none to choose
        settings = {k: v for k, v in settings.items() if k not in CHOOSING_SETTINGS}
    requests = eval_requests(direction, cases, seed)
    results, start = [], time.perf_counter()
    if candidates > 1:
        for request in tqdm(requests, desc=f"{direction} (best of {candidates})", disable=not progress, leave=False):
            if draws is None:
                results.append(pipe.generate(**request, candidates=candidates, refine=0, **settings))
                continue
            kept, drawn = pipe.best_of(candidates=candidates, **request, **settings)
            results.append(kept)
            draws.append(drawn)
    else:
        for first in tqdm(range(0, len(requests), batch_size), desc=direction, disable=not progress, leave=False):
            results += pipe.generate_batch(requests[first:first + batch_size], refine=0, **settings)
    return results, (time.perf_counter() - start) / max(len(requests), 1)


def direction_refine_rounds(pipe, direction: str, refine_rounds: int | None) -> int:
    """The rounds a direction's outputs are refined: the caller's (``refine_rounds``), else what ``generate``
    runs by default for them (``UniModal.default_refine_rounds``; a pipeline without it: none); joint is never
    refined."""
    if direction == "joint":
        return 0
    if refine_rounds is not None:
        return refine_rounds
    default = getattr(pipe, "default_refine_rounds", None)
    return default(list(parse_direction(direction)[1])) if default is not None else 0


def refine_direction(pipe, direction: str, cases: Sequence[EvalCase], results: Sequence, rounds: int, seed: int,
                     progress: bool = True, repair: bool = False, critic: str | None = None) -> tuple[list, float]:
    """Each output refined (``UniModal.refine`` with its defaults for that output, ``rounds`` rounds, seed
    ``seed + i``; ``critic``: the one that flags, None: refine's default) against the input it was made from,
    first repaired by reading it back when ``repair`` (a picture drawn from words); the refined results (their
    ``forward_passes`` count the refine's too) and the wall time per sample."""
    from tqdm.auto import tqdm

    conditions, _ = parse_direction(direction)
    refined, start = [], time.perf_counter()
    for index, (case, result) in enumerate(tqdm(list(zip(cases, results)), desc=f"{direction} (refine)",
                                                disable=not progress, leave=False)):
        inputs = {m: getattr(case, m) for m in conditions}
        refined.append(pipe.refine(result, **inputs, rounds=rounds, seed=derived_seed(seed, index),
                                   **({"repair": True} if repair else {}),
                                   **({"critic": critic} if critic is not None else {}))[0])
    return refined, (time.perf_counter() - start) / max(len(results), 1)


def score_direction(direction: str, cases: Sequence[EvalCase], results: Sequence, judges: Judges) -> list[dict]:
    """One score dict per case (the transcripts of generated speech are kept in them)."""
    _, targets = parse_direction(direction)
    transcripts = [None] * len(results)
    if "audio" in targets:
        transcripts = judges.speech.transcribe_many([r.audio for r in results])
    scores = []
    for case, result, transcript in zip(cases, results, transcripts):
        if direction == "joint":
            scores.append(joint_consistency(result.text, result.image, transcript, judges.scene, judges.digit)
                          | {"text": result.text, "transcript": transcript})
        elif targets == ("image",):
            scores.append(judge_image(case, result.image, judges.scene if case.kind == "scene" else None,
                                      judges.digit if case.kind == "digit" else None))
        elif targets == ("text",):
            scores.append({"correct": caption_correct(case, result.text), "text": result.text})
        else:
            scores.append({"correct": caption_correct(case, transcript), "transcript": transcript})
    return scores


def verdicts_of(values) -> list:
    """Judge outcomes as per-case verdicts for paired comparisons: 1 (right), 0 (wrong), None (abstained)."""
    return [None if v is None else int(bool(v)) for v in values]


def paired_wer_difference(word_errors: list, reference: list, resamples: int = 2000, seed: int = 0) -> dict | None:
    """Corpus WER of ``word_errors`` minus that of ``reference`` (per case ``[errors, reference words]``, the same
    cases in the same order) and its 95% bootstrap interval, cases resampled together in both runs (a ratio of
    sums each time, as the corpus WER is); None without them."""
    if not word_errors or not reference or len(word_errors) != len(reference):
        return None
    a, b = np.asarray(word_errors, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    draws = np.random.default_rng(seed).integers(0, len(a), (resamples, len(a)))
    diffs = a[draws, 0].sum(1) / a[draws, 1].sum(1) - b[draws, 0].sum(1) / b[draws, 1].sum(1)
    low, high = np.percentile(diffs, [2.5, 97.5])
    return {"mean": float(a[:, 0].sum() / a[:, 1].sum() - b[:, 0].sum() / b[:, 1].sum()),
            "ci95": [float(low), float(high)], "cases": int(len(a))}


def paired_difference(verdicts: list, reference: list, resamples: int = 2000, seed: int = 0) -> dict | None:
    """Mean of ``verdicts - reference`` over the cases both judged (the same prompts, so the difference is
    paired and far less noisy than two separate accuracies) and its 95% bootstrap interval; for right/wrong
    verdicts also the discordant cases (``up``: right only in ``verdicts``, ``down``: only in ``reference``) and
    the exact two-sided sign test over them (``sign_p``), which stays honest where a handful of discordant cases
    makes the bootstrap interval too narrow; None without verdicts."""
    pairs = np.array([(a, b) for a, b in zip(verdicts or [], reference or []) if a is not None and b is not None],
                     dtype=np.float64).reshape(-1, 2)
    if not len(pairs):
        return None
    diff = pairs[:, 0] - pairs[:, 1]
    draws = np.random.default_rng(seed).integers(0, len(diff), (resamples, len(diff)))
    low, high = np.percentile(diff[draws].mean(axis=1), [2.5, 97.5])
    result = {"mean": float(diff.mean()), "ci95": [float(low), float(high)], "cases": int(len(diff))}
    if set(np.unique(pairs)) <= {0.0, 1.0}:
        up, down = int((diff > 0).sum()), int((diff < 0).sum())
        result.update(up=up, down=down, sign_p=sign_test(up, down))
    return result


def sign_test(up: int, down: int) -> float:
    """Exact two-sided sign test: the chance of a split of ``up + down`` discordant cases at least this uneven
    when each goes either way with probability 1/2."""
    from math import comb

    n = up + down
    if n == 0:
        return 1.0
    tail = sum(comb(n, k) for k in range(min(up, down) + 1)) / 2 ** n
    return float(min(1.0, 2 * tail))


SAMPLER_FIELDS = ("mode", "schedule", "steps", "tau", "temperature", "top_k", "top_p", "cfg", "choice_temperature",
                  "block_length", "block_mode")


def effective_settings(results: Sequence) -> dict:
    """The sampler settings the outputs were generated with (the caller's, over the model's per-target
    defaults), as the results report them; the same for every result of a direction; with whether the model
    planned in words first (``plan``) and, if so, the text stage's own settings (``text_stage``)."""
    settings = (getattr(results[0], "settings", None) or {}) if results else {}
    found = {k: settings[k] for k in ("decoding", *SAMPLER_FIELDS, "plan", "rivals", "rephrase") if k in settings}
    if "text_stage" in settings:
        found["text_stage"] = {k: v for k, v in settings["text_stage"].items()
                               if k in (*SAMPLER_FIELDS, "rivals", "rephrase")}
    return found


def rival_counts(results: Sequence) -> dict | None:
    """How many captions read from a picture (asked for, or a plan) were checked against their rival
    (:mod:`unimodal.rivals`) and how often the rival was kept; None when none was checked."""
    checks = [settings.get("rival_check") or (settings.get("text_stage") or {}).get("rival_check")
              for settings in (getattr(r, "settings", None) or {} for r in results)]
    skipped = sum(bool(c and "skipped" in c) for c in checks)  # a rival longer than the text slots
    checks = [c for c in checks if c and "kept" in c]
    if not checks and not skipped:
        return None
    return {"checked": len(checks), "rival_kept": sum(c["kept"] == "rival" for c in checks), "skipped": skipped,
            "forward_passes": float(np.mean([c["forward_passes"] for c in checks])) if checks else 0.0}


def rephrase_counts(results: Sequence) -> dict | None:
    """How many plans in words speech was made from were said in the spoken form (:mod:`unimodal.phrasing`) and
    how many of them that reworded; None when no plan was (``rephrase`` off, or no speech made from a plan)."""
    said = [(settings.get("text_stage") or {}).get("rephrased")
            for settings in (getattr(r, "settings", None) or {} for r in results)]
    said = [s for s in said if s and "skipped" not in s]
    if not said:
        return None
    return {"said": len(said), "reworded": sum(s["read"] != s["said"] for s in said)}


def summarize(direction: str, cases: Sequence[EvalCase], results: Sequence, scores: Sequence[dict],
              wall: float) -> dict:
    """Figures of one direction, overall and per kind of case: rates, WER, forward passes, seconds per sample."""
    from unimodal.judges import word_errors

    _, targets = parse_direction(direction)
    summary = {"n": len(scores), "forward_passes": float(np.mean([r.forward_passes for r in results])),
               "wall_s_per_sample": wall, "sampler": effective_settings(results),
               **({"rival_check": rivals} if (rivals := rival_counts(results)) else {}),
               **({"rephrased": said} if (said := rephrase_counts(results)) else {}),
               # per case, in case order: 1 right, 0 wrong, None not judged (for paired comparisons of two runs)
               "verdicts": verdicts_of([s.get("correct", s.get("consistent")) for s in scores])}
    errors = None  # per case, in case order: [errors, reference words]; each WER below is a ratio of their sums
    if targets in (("text",), ("audio",)) and cases:
        said = [s.get("text" if targets == ("text",) else "transcript") or "" for s in scores]
        errors = word_errors([c.text for c in cases], said)
    kinds = sorted({c.kind for c in cases}) if direction != "joint" else []
    for kind in [None, *kinds]:
        chosen = [i for i, c in enumerate(cases) if kind is None or c.kind == kind]
        part = _rates([scores[i] for i in chosen])
        if errors is not None and chosen:
            part["wer"] = sum(errors[i][0] for i in chosen) / sum(errors[i][1] for i in chosen)
        if kind is None:
            summary.update(part)
            if errors is not None:  # kept for paired WER comparisons of two runs (compare_reports)
                summary["word_errors"] = errors
        else:
            summary.setdefault("by_kind", {})[kind] = {"n": len(chosen), **part}
    if direction != "joint":  # scenes of one object and of two: where a model's errors are, told apart
        for count in sorted({objects_in(c) for c in cases} - {None}):
            chosen = [scores[i] for i, c in enumerate(cases) if objects_in(c) == count]
            summary.setdefault("by_objects", {})[str(count)] = {"n": len(chosen), **_rates(chosen)}
        if targets == ("text",) and (alike := objects_alike(cases, scores)):
            summary["by_objects"]["2"]["alike"] = alike
    else:  # what the captions from nothing were: how varied, of which kind, of how many objects
        summary["distinct_texts"] = len({s.get("text") for s in scores}) / max(len(scores), 1)
        for kind in sorted({str(s.get("kind")) for s in scores}):
            chosen = [s for s in scores if str(s.get("kind")) == kind]
            summary.setdefault("by_kind", {})[kind] = {"n": len(chosen), **_rates(chosen)}
        counts = [len(scene["objects"]) if scene else None
                  for scene in (parse_scene_caption(s.get("text") or "") for s in scores)]
        for count in sorted(set(counts) - {None}):
            chosen = [s for s, c in zip(scores, counts) if c == count]
            summary.setdefault("by_objects", {})[str(count)] = {"n": len(chosen), **_rates(chosen)}
    return summary


BOUND_ATTRIBUTES = ("size", "color", "shape")  # what a caption binds to each of two objects


def objects_alike(cases: Sequence[EvalCase], scores: Sequence[dict]) -> dict | None:
    """How alike the two objects of the captions read from two-object scenes are, against the truth: the mean
    count of :data:`BOUND_ATTRIBUTES` the first and second object share (0 to 3), over the captions that parse
    as two objects, beside the same count in their scenes. A reader that binds each attribute to its object
    shares what the scenes share; one that lets them bleed from one object to the other (a small green cross
    above a small green cross, for a yellow circle below a green cross) shares more. None without such a
    caption."""
    read, truth = [], []
    for case, score in zip(cases, scores):
        if objects_in(case) != 2:
            continue
        scene = parse_scene_caption(score.get("text") or "")
        if scene is None or len(scene["objects"]) != 2:
            continue
        read.append(_shared(*scene["objects"]))
        truth.append(_shared(*case.truth["objects"]))
    if not read:
        return None
    return {"captions": len(read), "read": float(np.mean(read)), "truth": float(np.mean(truth))}


def _shared(first: Mapping, second: Mapping) -> int:
    return sum(first.get(key) == second.get(key) for key in BOUND_ATTRIBUTES)


def objects_in(case: EvalCase) -> int | None:
    """How many objects a scene case shows (None for other cases)."""
    truth = case.truth if case.kind == "scene" else None
    return len(truth["objects"]) if isinstance(truth, Mapping) and "objects" in truth else None


def _rates(scores: Sequence[dict]) -> dict:
    """Mean of every boolean field (None entries left out), named ``accuracy`` for ``correct``."""
    rates = {}
    for key in dict.fromkeys(k for s in scores for k, v in s.items() if isinstance(v, bool) or v is None):
        values = [s[key] for s in scores if isinstance(s.get(key), bool)]
        if values:
            rates["accuracy" if key == "correct" else key] = float(np.mean(values))
    return rates


def reference_figures(cases: Sequence[EvalCase], judges: Judges, progress: bool = True) -> dict:
    """The judges on the ground truth: the ceiling each direction's figure should be read against."""
    report = {}
    pictured = [c for c in cases if c.image is not None and c.kind in ("scene", "digit")]
    if pictured:
        scores = [judge_image(c, c.image, judges.scene if c.kind == "scene" else None,
                              judges.digit if c.kind == "digit" else None) for c in pictured]
        report["image_judge_accuracy"] = _rates(scores).get("accuracy")
    spoken = [c for c in cases if c.audio is not None]
    if spoken:
        from unimodal.judges import word_error_rate

        heard = judges.speech.transcribe_many([c.audio for c in spoken], progress=progress)
        report["speech_judge_wer"] = word_error_rate([c.text for c in spoken], heard)
        correct = [caption_correct(c, h) for c, h in zip(spoken, heard)]
        report["speech_judge_accuracy"] = float(np.mean([x for x in correct if x is not None] or [float("nan")]))
    return report


def best_of_curve(draw_verdicts: Sequence[Sequence], agreements: Sequence[Sequence[float]],
                  draw_passes: Sequence[float], read_passes: float = 1) -> list[dict]:
    """What a best-of-k would have judged, for every k up to the draws made, from one run that judged every draw:
    per k, ``accuracy`` (per case the draw with the highest agreement among the first k kept, as
    ``generate(candidates=k)`` keeps it: the same seeds, the same scores), ``any_right`` (some draw of the first k
    judged right: what a perfect chooser would reach) and the mean ``forward_passes`` (k draws and k reads).
    ``draw_verdicts``/``agreements``: per case, per draw (1 right, 0 wrong, None not judged); ``draw_passes``:
    per case, the passes of one draw; ``read_passes``: the passes of one read (the agreement reading's)."""
    draws = min(len(v) for v in draw_verdicts) if draw_verdicts else 0
    curve = []
    for k in range(1, draws + 1):
        kept = [v[max(range(k), key=list(a).__getitem__)] for v, a in zip(draw_verdicts, agreements)]
        judged = [x for x in kept if x is not None]
        anyone = [max(x for x in v[:k] if x is not None) for v in draw_verdicts
                  if any(x is not None for x in v[:k])]
        curve.append({"k": k, "accuracy": float(np.mean(judged)) if judged else None,
                      "any_right": float(np.mean(anyone)) if anyone else None,
                      "forward_passes": float(np.mean(draw_passes)) * k + (read_passes * k if k > 1 else 0)})
    return curve


def every_draw_figures(by_draw: Sequence[Sequence[dict]], meta: Sequence[Mapping]) -> dict:
    """A direction's ``--every-draw`` figures from every draw's scores (``by_draw[k][i]``: draw k of case i) and
    each kept result's ``settings["candidates"]`` (``meta``, from :meth:`UniModal.best_of`): ``best_of``, the
    curve of the reading that chose (``reading``); ``best_of_by_reading``, the curve had each reading chosen;
    ``draws``, per case each draw's verdict and scores, enough to replay another rule of keeping; ``detection``,
    per reading, how well its score tells a judged-wrong draw from a right one (AUROC over every draw, and
    ``within`` a case: over the pairs it chooses between)."""
    per_draw = [verdicts_of([score.get("correct") for score in judged]) for judged in by_draw]
    by_case = [[per_draw[k][i] for k in range(len(by_draw))] for i in range(len(meta))]
    draw_passes = [float(np.mean(m["draw_passes"])) for m in meta]
    readings = list(meta[0]["by_reading"])  # best_of reads every draw in every reading
    curves = {r: best_of_curve(by_case, [m["by_reading"][r]["agreement"] for m in meta], draw_passes,
                               float(np.mean([m["by_reading"][r]["read_passes"] for m in meta]))) for r in readings}
    detection = {}
    for r in readings:
        groups = [([s for s, v in zip(m["by_reading"][r]["agreement"], verdicts) if v is not None],
                   [not v for v in verdicts if v is not None]) for m, verdicts in zip(meta, by_case)]
        detection[r] = {"auroc": auroc([s for g in groups for s in g[0]], [w for g in groups for w in g[1]]),
                        "within": auroc_within(groups)}
    return {"reading": meta[0]["reading"], "best_of": curves[meta[0]["reading"]], "best_of_by_reading": curves,
            "detection": detection, "draws": [{"verdicts": v, "agreement": m["agreement"],
                       "by_reading": {r: m["by_reading"][r]["agreement"] for r in readings}}
                      for v, m in zip(by_case, meta)]}


def check_every_draw(every_draw: bool, candidates: int | None, accept_confidence: float | None,
                     accept_agreement: float | None = None) -> None:
    """Refuse ``every_draw`` (``--every-draw``) without candidates to judge, or beside ``accept_confidence`` or
    ``accept_agreement``, which stop drawing early; the CLI calls it before the model loads, :func:`evaluate` for
    Python callers."""
    if not every_draw:
        return
    if (candidates or 1) < 2:
        raise InputError("every_draw (--every-draw) judges each of a case's candidates: give --candidates N "
                         "(candidates=N) with N >= 2")
    if accept_confidence is not None:
        raise InputError("every_draw (--every-draw) judges all the candidates; accept_confidence "
                         "(--accept-confidence) stops after the first: give one or the other")
    if accept_agreement is not None:
        raise InputError("every_draw (--every-draw) judges all the candidates; accept_agreement "
                         "(--accept-agreement) stops at the first that reads back as asked: give one or the other")


def check_repair(repair: bool, directions: Sequence[str]) -> None:
    """``repair`` (``--repair``) repairs pictures drawn from words or speech: refused when no direction asked is
    one of :data:`REPAIRED_DIRECTIONS` (it would be reported but change nothing)."""
    if repair and not set(directions) & set(REPAIRED_DIRECTIONS):
        raise InputError(f"--repair repairs the pictures of {' and '.join(REPAIRED_DIRECTIONS)}; none of the "
                         f"directions asked ({', '.join(directions)}) draws one")


def evaluate(pipe, cases: Sequence[EvalCase], directions: Sequence[str] = DIRECTIONS, settings: dict | None = None,
             seed: int = 0, judges: Judges | None = None, batch_size: int = 16, progress: bool = True,
             on_direction: Callable[[str, dict], None] | None = None, joint_n: int | None = None,
             refine_rounds: int | None = None, every_draw: bool = False, repair: bool = False,
             refine_critic: str | None = None) -> dict:
    """Generate and judge every direction; returns the report (figures, settings, samples for the grids).
    ``joint_n``: samples of joint generation (it reads no case, so it needs no more than a sample size);
    ``refine_rounds`` > 0: each output is then refined against its input (:func:`refine_direction`; joint, which
    has no input, is not), and judged as refined; None (the default): each direction's outputs are refined as
    ``generate`` refines them by default (:func:`unimodal.refine.default_refine_rounds`: speech alone on a model
    whose critic head is trained); 0: none; ``refine_critic``: the critic those rounds read (None: refine's
    default for each output); ``every_draw`` (with a ``candidates`` setting > 1): judge every
    draw, not only the kept one, and report the best-of-k curve (:func:`best_of_curve`) as the direction's
    ``best_of``: what each k from 1 to the candidates would have reached, from this one run; ``repair``: each
    picture drawn from words or speech (:data:`REPAIRED_DIRECTIONS`) is read back and what the reading gets
    otherwise than the request changed by instructed edits (``UniModal.refine(..., repair=True)``) before its
    ``refine_rounds`` rounds."""
    if refine_rounds is not None and (isinstance(refine_rounds, bool) or not isinstance(refine_rounds, int)
                                      or refine_rounds < 0):
        raise InputError(f"refine_rounds must be an int >= 0 or None (generate's default), got {refine_rounds!r}")
    check_every_draw(every_draw, (settings or {}).get("candidates"), (settings or {}).get("accept_confidence"),
                     (settings or {}).get("accept_agreement"))
    # what the CLI's checks refuse before the model loads, for Python callers (one draw drops it unread)
    check_agreement((settings or {}).get("agreement"), (settings or {}).get("candidates") or 1)
    if not cases:
        raise InputError("unimodal eval needs at least one case")
    check_repair(repair, directions)
    judges, settings = judges or Judges(), dict(settings or {})
    figures, samples = {}, {}
    for direction in directions:
        conditions, _ = parse_direction(direction)
        usable = [c for c in cases if all(getattr(c, m) is not None for m in conditions)]
        if direction == "joint" and joint_n is not None:
            usable = usable[:joint_n]
        if not usable:
            continue
        candidates = candidates_used(pipe, direction, settings)
        draws = [] if every_draw and candidates > 1 else None
        results, wall = generate_direction(pipe, direction, usable, {**settings, "candidates": candidates}, seed,
                                           batch_size, progress, draws)
        repaired = repair and direction in REPAIRED_DIRECTIONS
        rounds = direction_refine_rounds(pipe, direction, refine_rounds)
        refined = rounds > 0 or repaired  # joint: no rounds, and never repaired
        if refined:
            results, refine_wall = refine_direction(pipe, direction, usable, results, rounds, seed, progress,
                                                    repaired, refine_critic)
            wall += refine_wall
        by_draw = []  # every draw's scores: [draw k][case i]
        if draws:  # judged together per draw index (the judges batch)
            by_draw = [score_direction(direction, usable, [drawn[k] for drawn in draws], judges)
                       for k in range(candidates)]
        if by_draw and not refined:  # the kept draw's scores are among them: not judged twice
            scores = [by_draw[r.settings["candidates"]["kept"]][i] for i, r in enumerate(results)]
        else:
            scores = score_direction(direction, usable, results, judges)
        figures[direction] = summarize(direction, usable, results, scores, wall)
        if refined:
            figures[direction]["refine_rounds"] = rounds
            if refine_rounds is None:  # generate's default, not the caller's
                figures[direction]["refine_default"] = True
            if refine_critic is not None:
                figures[direction]["refine_critic"] = refine_critic
        if repaired:
            figures[direction]["repair"] = True
        if (settings.get("candidates") or 1) > 1:
            figures[direction]["candidates"] = candidates
            drawn = [(r.settings.get("candidates") or {}).get("drawn", 1) for r in results]
            figures[direction]["drawn_per_case"] = sum(drawn) / max(len(drawn), 1)
        if by_draw:
            figures[direction].update(every_draw_figures(by_draw, [r.settings["candidates"] for r in results]))
        samples[direction] = (usable, results, scores)
        if on_direction is not None:
            on_direction(direction, figures[direction])
    return {"figures": figures, "reference": reference_figures(cases, judges, progress), "seed": seed,
            "settings": settings, "refine_rounds": refine_rounds, "refine_critic": refine_critic, "repair": repair,
            "autoregressive": bool(getattr(pipe, "autoregressive", False)),
            "cases": {kind: sum(c.kind == kind for c in cases) for kind in sorted({c.kind for c in cases})},
            "_samples": samples}


def compare_reports(reference: dict, candidate: dict) -> dict:
    """Per direction both ``eval.json`` reports hold: each accuracy and the paired difference (candidate minus
    reference, 95% bootstrap interval) over the same cases. Refused when the reports did not judge the same cases
    (data, split, cases per data set, seed) or predate per-case verdicts."""
    same = ("data", "split", "n_per_data_set", "seed")
    differ = [k for k in same if reference.get(k) != candidate.get(k)]
    if differ:
        raise InputError(f"the reports judged different cases ({', '.join(differ)} differ: "
                         f"{[reference.get(k) for k in differ]} vs {[candidate.get(k) for k in differ]}); "
                         f"run both with the same --data, --split, --n and --seed")
    if reference.get("captions") and candidate.get("captions") and reference["captions"] != candidate["captions"]:
        raise InputError("the reports judged different cases (their captions differ case by case)")
    rows = {}
    for direction in [d for d in reference.get("figures", {}) if d in candidate.get("figures", {})]:
        a, b = reference["figures"][direction], candidate["figures"][direction]
        if "verdicts" not in a or "verdicts" not in b:
            raise InputError(f"{direction}: a report has no per-case verdicts (written before they were kept); "
                             f"run its eval again")
        if len(a["verdicts"]) != len(b["verdicts"]):
            raise InputError(f"{direction}: {len(a['verdicts'])} vs {len(b['verdicts'])} cases judged")
        rows[direction] = {"reference": a.get("accuracy", a.get("consistent")),
                           "candidate": b.get("accuracy", b.get("consistent")),
                           "difference": paired_difference(b["verdicts"], a["verdicts"])}
        if "wer" in a and "wer" in b:  # the paired WER only where both runs kept each case's word errors
            rows[direction]["wer"] = {"reference": a["wer"], "candidate": b["wer"],
                                      "difference": paired_wer_difference(b.get("word_errors"),
                                                                          a.get("word_errors"))}
    if not rows:
        raise InputError("the reports share no direction")
    return {"directions": rows, "reference_model": reference.get("model_hash"),
            "candidate_model": candidate.get("model_hash"), **{k: reference.get(k) for k in same}}


def _comparison_line(name: str, row: dict, missing: str, up: str, down: str, width: int = 13) -> str:
    """One row of :func:`format_comparison`: both figures, the paired difference with its interval and what it
    says (``up`` when the interval lies above 0, ``down`` below), or ``missing`` where nothing was paired."""
    head = f"{name:<{width}} {_fmt(row['reference']):>9} {_fmt(row['candidate']):>9} "
    diff = row["difference"]
    if diff is None:
        return head + f"{'-':>34}  {missing}"
    low, high = diff["ci95"]
    verdict = up if low > 0 else down if high < 0 else "within the noise"
    if "sign_p" in diff:  # how many cases the difference rests on
        verdict += f"; {diff['up']} vs {diff['down']} cases differ, sign test p {diff['sign_p']:.3f}"
    return head + f"{diff['mean']:>+12.3f} [{low:+.3f}, {high:+.3f}] ({diff['cases']:>4})  {verdict}"


def format_comparison(comparison: dict) -> str:
    width = max([13, *map(len, comparison["directions"])])
    lines = [f"{'direction':<{width}} {'reference':>9} {'candidate':>9} {'paired difference (95% CI)':>34}  verdict"]
    for direction, row in comparison["directions"].items():
        lines.append(_comparison_line(direction, row, "no verdicts", "better", "worse", width))
        if row.get("wer") is not None:  # unpaired in a report written before per-case word errors were kept
            lines.append(_comparison_line("  WER", row["wer"], "no per-case word errors", "higher (worse)",
                                          "lower (better)", width))
    lines.append(f"reference model {comparison['reference_model']}, candidate model {comparison['candidate_model']}; "
                 f"data {comparison['data']}, split {comparison['split']}, n {comparison['n_per_data_set']} per "
                 f"data set, seed {comparison['seed']}; better / worse: the interval excludes 0")
    return "\n".join(lines)


# ---- reporting ----------------------------------------------------------------------------------------------


def format_table(report: dict) -> str:
    lines = [f"{'direction':<13} {'kind':<6} {'n':>4} {'accuracy':>8} {'WER':>6} {'passes':>7} {'s/sample':>9}  "
             f"per attribute"]
    for direction, fig in report["figures"].items():
        rows = [("all", fig)] + list(fig.get("by_kind", {}).items()) + [
            (f"{count} obj", row) for count, row in fig.get("by_objects", {}).items()]
        for kind, row in rows:
            extra = " ".join(f"{k}={row[k]:.3f}" for k in (*SCENE_ATTRIBUTES, "text_parses", "image_matches_text",
                                                             "audio_matches_text", "distinct_texts") if k in row)
            if "alike" in row:  # two-object captions: attributes the two objects share, read and in the scenes
                extra += f" alike={row['alike']['read']:.2f} (scenes {row['alike']['truth']:.2f})"
            accuracy = row.get("accuracy", row.get("consistent"))
            passes, wall = (f"{fig['forward_passes']:.1f}", f"{fig['wall_s_per_sample']:.3f}") if kind == "all" \
                else ("-", "-")  # costs are per direction
            lines.append(f"{direction if kind == 'all' else '':<13} {kind:<6} {row.get('n', fig['n']):>4} "
                         f"{_fmt(accuracy):>8} {_fmt(row.get('wer')):>6} {passes:>7} {wall:>9}  {extra}".rstrip())
    ref = report.get("reference", {})
    lines.append("reference (judges on the real data): " + ", ".join(f"{k}={_fmt(v)}" for k, v in ref.items()))
    lines.append(f"accuracy: judged correct (joint: image, caption and speech agree); seed {report['seed']}; "
                 f"settings given {json.dumps(report['settings'])}")
    if report.get("refine_rounds"):
        critic = f" (critic {report['refine_critic']})" if report.get("refine_critic") else ""
        lines.append(f"every output but joint refined against its input, {report['refine_rounds']} rounds with "
                     f"refine's defaults for it{critic}; passes and s/sample include the refine")
    for direction, fig in report["figures"].items():
        if fig.get("refine_default"):
            critic = f" (critic {fig['refine_critic']})" if fig.get("refine_critic") else ""
            lines.append(f"{direction}: refined {fig['refine_rounds']} rounds by refine's defaults{critic}, as "
                         f"generate refines speech by default (--refine-rounds 0: as drawn); passes and s/sample "
                         f"include it")
    if report.get("repair"):
        lines.append(f"{', '.join(REPAIRED_DIRECTIONS)}: each picture read back by the model and each colour, size "
                     f"or place the reading gets otherwise than the request (the caption, or the model's transcript "
                     f"of the speech) changed by an instructed edit (repair=True); passes and s/sample include it")
    for direction, fig in report["figures"].items():
        if fig.get("sampler"):
            lines.append(f"  {direction} sampled with {json.dumps(fig['sampler'])}")
        if fig.get("rival_check"):
            rivals = fig["rival_check"]
            lines.append(f"  {direction}: {rivals['checked']} captions read from a picture checked against their "
                         f"rivals (the relation turned around, each size and colour changed), a rival kept "
                         f"{rivals['rival_kept']} times "
                         f"({rivals['forward_passes']:.1f} passes a check, in the passes above)")
        if fig.get("rephrased"):
            said = fig["rephrased"]
            lines.append(f"  {direction}: {said['said']} plans said in the form the model speaks best ('there is "
                         f"a ...', rephrase), {said['reworded']} of them reworded")
    for direction, fig in report["figures"].items():
        if fig.get("best_of"):
            curves = fig["best_of_by_reading"]
            before = ", the draws before refine" if fig.get("refine_rounds") or report.get("repair") else ""
            lines.append(f"{direction}, every draw judged{before}: best of k, kept by agreement read each way (as "
                         f"candidates=k, agreement=... keeps it; the run chose by {fig['reading']}), "
                         f"and some draw of the k right (s/sample above includes reading every draw each way)")
            lines.append(f"  {'k':>3} " + " ".join(f"{r:>8} {'passes':>7}" for r in curves) + f" {'any right':>9}")
            for k, row in enumerate(fig["best_of"]):
                lines.append(f"  {row['k']:>3} " + " ".join(f"{_fmt(c[k]['accuracy']):>8} {c[k]['forward_passes']:>7.1f}"
                                                            for c in curves.values()) + f" {_fmt(row['any_right']):>9}")
            if fig.get("detection"):
                lines.append("  a judged-wrong draw scored below a right one (AUROC; within a case): " + ", ".join(
                    f"{r} {_fmt(d['auroc'])} ({_fmt(d['within'])})" for r, d in fig["detection"].items()))
    return "\n".join(lines)


def _fmt(value) -> str:
    return "-" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{value:.3f}"


def save_report(report: dict, out: str | Path, grid_size: int = 16) -> list[Path]:
    """``out/eval.json`` (everything but the raw samples; ``samples[direction]`` holds every case's scores, its
    generated caption or transcript where there is one, and the case's own caption), one
    ``out/grid_<direction>.png`` of the first ``grid_size`` cases per direction and the first generated clips as
    WAV files."""
    from unimodal.inference.grids import sample_grid

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "eval.json"]
    public = {k: v for k, v in report.items() if not k.startswith("_")}
    public["samples"] = {d: [{"caption": case.text, **score} for case, score in zip(cases, scores)]
                         for d, (cases, _, scores) in report["_samples"].items()}
    written[0].write_text(report_json(public, default=_json_default))
    for direction, (cases, results, scores) in report["_samples"].items():
        name = direction.replace("->", "_to_")
        written.append(sample_grid(direction, cases[:grid_size], results[:grid_size], scores[:grid_size],
                                   out / f"grid_{name}.png"))
        written += _save_clips(results[:2], out / f"{name}")
        fig = report["figures"].get(direction, {})
        if fig.get("best_of"):
            written.append(plot_best_of(direction, fig["best_of_by_reading"], out / f"best_of_{name}.png"))
    return written


def plot_best_of(direction: str, curves: Mapping[str, Sequence[dict]], path: Path) -> Path:
    """``best_of_<direction>.png``: judged accuracy of best-of-k (kept by agreement, one line per reading in
    ``curves``: reading -> curve) and of a perfect chooser (some draw of the k right) against the forward passes
    each k costs."""
    plt = pyplot()

    figure, axis = plt.subplots(figsize=(5.5, 3.6), dpi=100)
    for reading, curve in curves.items():
        passes = [row["forward_passes"] for row in curve]
        axis.plot(passes, [row["accuracy"] for row in curve], "o-", label=f"best of k, kept by {reading} reading")
        for row, x in zip(curve, passes):
            axis.annotate(f"k={row['k']}", (x, row["accuracy"]), textcoords="offset points", xytext=(2, -12),
                          fontsize=7)
    curve = min(curves.values(), key=lambda c: c[-1]["forward_passes"])
    axis.plot([row["forward_passes"] for row in curve], [row["any_right"] for row in curve], "s--", color="grey",
              label="some draw of the k right")
    axis.set_xlabel("forward passes per case")
    axis.set_ylabel("judged right")
    axis.set_title(f"{direction}: every draw judged", fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="lower right")
    return save_figure(figure, path, dpi=None)


def _save_clips(results: Sequence, stem: Path) -> list[Path]:
    paths = []
    for i, result in enumerate(results):
        if result.audio is not None:
            paths += result.save(stem.with_name(f"{stem.name}_{i}.wav"))
    return paths


def _json_default(value):
    if isinstance(value, (np.bool_, np.integer, np.floating)):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


__all__ = ["CHOOSING_SETTINGS", "DIRECTIONS", "EvalCase", "Judges", "best_of_curve", "caption_correct", "check_every_draw",
           "compare_reports", "evaluate", "every_draw_figures", "format_comparison", "format_table", "joint_consistency", "plot_best_of",
           "judge_image", "model_hash", "paired_difference", "parse_direction", "reference_figures", "save_report",
           "score_direction", "shell_hint", "sign_test", "summarize", "verdicts_of"]
