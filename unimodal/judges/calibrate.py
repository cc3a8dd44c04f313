"""How often the judges themselves are right, measured on ground truth."""

from __future__ import annotations

import time
from collections.abc import Sequence

from unimodal.core.grammar import parse_scene_caption, scenes_equal
from unimodal.judges.digits import DigitJudge
from unimodal.judges.scene import SceneJudge
from unimodal.judges.speech import SpeechJudge, word_error_rate

def _scene_accuracy(samples: Sequence) -> dict:
    judge = SceneJudge()
    scores = [judge.score(sample.image, sample.meta["attributes"]) for sample in samples]
    n_objects = sum(s["n_expected"] for s in scores)
    return {"scenes": len(scores), "objects": n_objects,
            "object_accuracy": sum(s["objects_right"] for s in scores) / max(n_objects, 1),
            "scene_accuracy": sum(s["correct"] for s in scores) / max(len(scores), 1)}


def _speech_accuracy(samples: Sequence) -> dict:
    """WER, and how often a transcript parses to the scene the clip describes (``heard_right``: the rule that
    judges text->audio, image->audio and joint speech), overall, by object count and by eSpeak base voice:
    the ceiling those directions are read against, since the model learned to speak from these clips."""
    judge = SpeechJudge()
    start = time.perf_counter()
    hypotheses = judge.transcribe_many([sample.audio for sample in samples])
    seconds = time.perf_counter() - start
    report = {"clips": len(samples), "wer": word_error_rate([s.text for s in samples], hypotheses),
              "seconds_per_clip": seconds / max(len(samples), 1)}
    verdicts = [(s, scenes_equal(parse_scene_caption(h), s.meta["attributes"]))
                for s, h in zip(samples, hypotheses) if (s.meta or {}).get("attributes")]
    if verdicts:
        report["heard_right"] = sum(v for _, v in verdicts) / len(verdicts)
        for key, group in (("heard_right_by_objects", lambda s: str(len(s.meta["attributes"]["objects"]))),
                           ("heard_right_by_voice", _base_voice)):
            groups: dict[str, list[bool]] = {}
            for sample, right in verdicts:
                groups.setdefault(group(sample), []).append(right)
            report[key] = {k: {"clips": len(v), "heard_right": sum(v) / len(v)} for k, v in sorted(groups.items())}
    return report


def _base_voice(sample) -> str:
    """The eSpeak base voice a clip was spoken with ("en-us" of "en-us+f2"), or "unknown"."""
    voice = (sample.meta or {}).get("voice") or {}
    return str(voice.get("name", "unknown")).split("+")[0]


def calibrate(scene_samples: Sequence = (), speech_samples: Sequence = (), digit_split: str | None = "test",
              seed: int = 0) -> dict:
    """How often the judges themselves are right, measured on ground truth.

    ``scene_samples`` need ``.image`` and ``.meta['attributes']``; ``speech_samples`` need ``.audio``
    (16 kHz) and ``.text``. They come from a built data set (the caller loads it: inference code does not
    import ``training``). ``digit_split`` picks the real digits split to score (None skips it); ``seed`` is
    the digits split seed. Returns ``{"scene": ..., "digit": ..., "speech": ...}`` for what was given.
    """
    report = {}
    if len(scene_samples):
        report["scene"] = _scene_accuracy(scene_samples)
    if digit_split is not None:
        report["digit"] = {"split": digit_split, "accuracy": DigitJudge(seed).accuracy(digit_split)}
    if len(speech_samples):
        report["speech"] = _speech_accuracy(speech_samples)
    return report
