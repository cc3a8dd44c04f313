"""The independent judges: scenes, digits and speech read right on ground truth, wrong answers rejected."""

import sys

import numpy as np
import pytest

from unimodal.judges import (DigitJudge, SceneJudge, SpeechJudge, calibrate, digit_split_indices, normalize_text,
                              render_digits, word_error_rate)
from unimodal.training.data.scenes import make_sample
from unimodal.core.errors import InputError, MissingDependencyError
from unimodal.core.grammar import COLORS, SIZES, canonical_scene, scenes_equal

cv2 = pytest.importorskip("cv2")

N_SCENES = 60
TEST_SPLIT = 2


@pytest.fixture(scope="module")
def judge():
    return SceneJudge()


@pytest.fixture(scope="module")
def test_scenes():
    return [make_sample(0, TEST_SPLIT, i, heldout=False, speech=False) for i in range(N_SCENES)]


def _pair_sample(samples, relation):
    return next(s for s in samples if s.meta["attributes"]["relation"] == relation)


def _draw(objects) -> np.ndarray:
    """A gray canvas with flat palette shapes: (shape, colour, centre, side) each, independent of the renderer."""
    image = np.full((64, 64, 3), 32, np.uint8)
    for shape, color, (cx, cy), side in objects:
        h, fill = side // 2, tuple(int(c) for c in COLORS[color])
        if shape == "square":
            cv2.rectangle(image, (cx - h, cy - h), (cx + h - 1, cy + h - 1), fill, -1)
        elif shape == "circle":
            cv2.circle(image, (cx, cy), h, fill, -1)
    return image


# ----------------------------------------------------------------------------------------------- scenes

@pytest.mark.parametrize("blur_sigma", [0.0, 1.0])
def test_scene_judge_reads_rendered_test_scenes(test_scenes, blur_sigma):
    samples = test_scenes
    if blur_sigma:
        samples = [type(s)(image=cv2.GaussianBlur(s.image, (0, 0), blur_sigma), meta=s.meta) for s in samples]
    report = calibrate(samples, digit_split=None)["scene"]
    assert report["scenes"] == N_SCENES and report["objects"] > N_SCENES
    assert report["object_accuracy"] >= 0.98
    assert report["scene_accuracy"] >= 0.95


def test_attributes_compare_equal_to_the_caption_attributes(judge, test_scenes):
    agree = [scenes_equal(judge.attributes(s.image), s.meta["attributes"]) for s in test_scenes]
    assert np.mean(agree) >= 0.95


def test_judge_reports_geometry(judge, test_scenes):
    sample = next(s for s in test_scenes if len(s.meta["attributes"]["objects"]) == 1)
    (found,) = judge.judge(sample.image)
    expected = sample.meta["attributes"]["objects"][0]
    x, y, w, h = found["bbox"]
    assert abs(max(w, h) - SIZES[expected["size"]]) <= 1
    assert np.allclose(found["center"], sample.meta["centers"][0], atol=1.0)
    assert found["position"] == expected["position"] and found["area"] > 100


def test_wrong_colour_is_not_correct(judge, test_scenes):
    sample = test_scenes[0]
    attrs = sample.meta["attributes"]
    assert judge.score(sample.image, attrs)["correct"]
    wrong = {**attrs, "objects": [dict(o) for o in attrs["objects"]]}
    used = {o["color"] for o in attrs["objects"]}
    wrong["objects"][0]["color"] = next(c for c in COLORS if c not in used)
    score = judge.score(sample.image, wrong)
    assert not score["correct"] and not score["color"]
    assert score["shape"] and score["size"]  # matched by shape once the colour fails
    assert score["objects_right"] == len(attrs["objects"]) - 1
    assert score["per_object"]["color"] == [False] + [True] * (len(attrs["objects"]) - 1)  # only the first
    assert all(score["per_object"]["shape"]) and len(score["per_object"]["size"]) == len(attrs["objects"])


def test_missing_or_extra_object_is_not_correct(judge):
    two = _draw([("square", "red", (16, 32), 18), ("circle", "blue", (48, 32), 28)])
    one = {"objects": [{"shape": "square", "color": "red", "size": "small", "position": "left"}], "relation": None}
    extra = judge.score(two, one)
    assert not extra["correct"] and extra["n_detected"] == 2 and extra["objects_right"] == 1
    pair = {"objects": [{"shape": "square", "color": "red", "size": "small"},
                        {"shape": "circle", "color": "blue", "size": "large"}], "relation": "left of"}
    missing = judge.score(_draw([("square", "red", (16, 32), 18)]), pair)
    assert not missing["correct"] and missing["relation"] is False and missing["objects_right"] == 1


def test_blank_image_has_no_objects(judge):
    blank = np.full((64, 64, 3), 40, np.uint8)
    assert judge.judge(blank) == []
    assert judge.attributes(blank) is None
    score = judge.score(blank, make_sample(0, TEST_SPLIT, 0, heldout=False, speech=False).meta["attributes"])
    assert not score["correct"] and score["n_detected"] == 0


def test_two_object_relation(judge, test_scenes):
    drawn = _draw([("circle", "blue", (32, 48), 28), ("square", "red", (30, 14), 18)])
    assert judge.attributes(drawn) == {
        "objects": [{"shape": "square", "color": "red", "size": "small"},
                    {"shape": "circle", "color": "blue", "size": "large"}],
        "relation": "above"}
    for relation in ("right of", "below"):  # the non-canonical directions, as rendered by the data builder
        sample = _pair_sample(test_scenes, relation)
        attrs = sample.meta["attributes"]
        assert judge.attributes(sample.image) == canonical_scene(attrs)
        assert judge.score(sample.image, attrs)["relation"]
        flipped = {**attrs, "relation": {"right of": "left of", "below": "above"}[relation]}
        assert judge.score(sample.image, flipped)["relation"] is False


def test_scene_judge_rejects_a_batch(judge, test_scenes):
    with pytest.raises(InputError, match="judge takes one image; got a batch of 5"):
        judge.judge(np.stack([s.image for s in test_scenes[:5]]))


# ----------------------------------------------------------------------------------------------- digits

def test_digit_splits_partition_the_digits():
    splits = [digit_split_indices(name) for name in ("train", "val", "test")]
    assert [len(s) for s in splits] == [1437, 179, 181]
    assert len(np.unique(np.concatenate(splits))) == 1797
    with pytest.raises(InputError, match="split must be one of .* got 'heldout'"):
        digit_split_indices("heldout")


def test_digit_judge_reads_the_test_split():
    from sklearn.datasets import load_digits

    judge = DigitJudge()
    assert judge.accuracy("test") >= 0.95
    digits = load_digits()
    index = digit_split_indices("test")[:20]
    images = render_digits(digits.images[index])  # (20, 64, 64, 3) uint8
    assert images.shape == (20, 64, 64, 3)
    assert (judge.predict(images) == digits.target[index]).mean() >= 0.95
    assert judge.predict(images[0, :, :, 0]).shape == (1,)  # one gray image


# ----------------------------------------------------------------------------------------------- speech

def test_normalize_text():
    assert normalize_text("The digit 7.") == "the digit seven"
    assert normalize_text("  A hand-drawn 3,  in the centre!") == "a hand drawn three in the center"
    assert normalize_text("12 o'clock") == "12 oclock"


def test_word_error_rate():
    pytest.importorskip("jiwer")
    assert word_error_rate("the digit seven", "The digit 7.") == 0.0
    assert word_error_rate(["a small red circle"], ["a small blue circle"]) == 0.25
    assert word_error_rate(["a b", "c d e f g h"], ["a b", "c d e f g x"]) == pytest.approx(1 / 8)
    with pytest.raises(InputError, match="as many hypotheses as references .* got 2 and 1"):
        word_error_rate(["one", "two"], ["one"])


def test_speech_judge_transcribes_espeak_clips():
    pytest.importorskip("faster_whisper")
    samples = [make_sample(0, TEST_SPLIT, i, heldout=False, speech=True) for i in range(3)]
    judge = SpeechJudge()
    hypotheses = judge.transcribe_many([s.audio for s in samples])
    assert all(isinstance(h, str) and h for h in hypotheses)
    assert judge.wer([s.text for s in samples], hypotheses) < 0.3
    assert judge.transcribe(np.zeros(0, np.float32)) == ""
    with pytest.raises(InputError, match="reads 16000 Hz audio; got 22050 Hz"):
        judge.transcribe(samples[0].audio, sample_rate=22_050)


def test_speech_calibration_says_how_often_the_real_clips_are_heard_as_their_scene():
    pytest.importorskip("faster_whisper")
    import dataclasses

    samples = [make_sample(0, TEST_SPLIT, i, heldout=False, speech=True) for i in range(3)]
    # the same clips said to show another colour: heard right can only mean "parses to the scene it shows"
    recoloured = []
    for sample in samples:
        attributes = {**sample.meta["attributes"], "objects": [
            {**o, "color": next(c for c in COLORS if c != o["color"])} for o in sample.meta["attributes"]["objects"]]}
        recoloured.append(dataclasses.replace(sample, meta={**sample.meta, "attributes": attributes}))
    report = calibrate(speech_samples=samples + recoloured, digit_split=None)["speech"]
    assert report["clips"] == 6 and report["heard_right"] <= 0.5
    for key in ("heard_right_by_objects", "heard_right_by_voice"):
        groups = report[key]
        assert sum(g["clips"] for g in groups.values()) == 6
        assert sum(g["clips"] * g["heard_right"] for g in groups.values()) == pytest.approx(6 * report["heard_right"])
    assert set(report["heard_right_by_voice"]) == {s.meta["voice"]["name"].split("+")[0] for s in samples}
    assert set(report["heard_right_by_objects"]) == {str(len(s.meta["attributes"]["objects"])) for s in samples}


# ----------------------------------------------------------------------------------------------- optional deps

@pytest.mark.parametrize("module, package, make", [
    ("cv2", "opencv-python-headless", SceneJudge),
    ("faster_whisper", "faster-whisper", SpeechJudge),
    ("jiwer", "jiwer", lambda: word_error_rate("a", "a")),
])
def test_missing_dependency_names_the_extra(monkeypatch, module, package, make):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    with pytest.raises(MissingDependencyError) as info:
        make()
    assert "unimodal[eval]" in str(info.value) and package in str(info.value)
    assert info.value.extra == "eval"
