"""A caption read from a picture checked against its rival (``UniModal.generate(rivals=...)``, :mod:`unimodal.rivals`):
the rival is the same words with the relation turned around; the one the picture reads back better from is kept,
with its passes counted, its trace in the settings, a plan checked before anything is made from it, and nothing
checked where there is no picture or no rival. The tiny model is random, so which caption the picture "reads back
better from" is the test's: the agreement score is replaced by one that prefers a caption of the test's choosing."""

import json

import numpy as np
import pytest

from unimodal.core.errors import SettingError
from unimodal.core.grammar import attribute_rivals, inverse_relation, parse_scene_caption

PAIR = "a small red circle above a large blue cross"
RIVAL = "a small red circle below a large blue cross"


def test_the_rival_turns_the_relation_around_and_keeps_every_other_character():
    assert inverse_relation(PAIR) == RIVAL
    assert inverse_relation("The picture shows a small red square to the LEFT of a large blue cross.") == \
        "The picture shows a small red square to the RIGHT of a large blue cross."
    assert inverse_relation("a large green triangle is to the right of a small purple circle") == \
        "a large green triangle is to the left of a small purple circle"
    for text in (PAIR, "there is a small yellow cross to the left of a large orange square"):
        read, rival = parse_scene_caption(text), parse_scene_caption(inverse_relation(text))
        assert rival["objects"] == read["objects"] and rival["relation"] != read["relation"]
        assert inverse_relation(inverse_relation(text)) == text
    for text in ("a small red circle on the left", "above", "a red circle above a cross", ""):
        assert inverse_relation(text) is None  # one object, or no whole scene: no rival


def test_rivals_one_attribute_away_change_each_objects_size_and_colour_apart():
    blend = "a small green cross above a small green cross"  # the two objects read alike
    rivals = attribute_rivals(blend)
    assert "a small yellow cross above a small green cross" in rivals  # the first object's colour alone
    assert "a small green cross above a small yellow cross" in rivals  # the second's alone
    assert "a large green cross above a small green cross" in rivals
    assert not any("circle" in r or "square" in r for r in rivals)  # shapes are left as read
    scenes = [json.dumps(parse_scene_caption(r), sort_keys=True) for r in rivals]
    assert len(set(scenes)) == len(rivals) and parse_scene_caption(blend) not in map(parse_scene_caption, rivals)
    assert len(rivals) == 2 * (1 + 5)  # the relation turned around is the same scene for two alike objects
    assert inverse_relation(PAIR) in attribute_rivals(PAIR) and len(attribute_rivals(PAIR)) == 1 + 2 * (1 + 5)
    assert attribute_rivals("The picture shows a small RED square to the left of a large blue cross")[0] == \
        "The picture shows a small RED square to the right of a large blue cross"
    assert "A Large red circle above a large blue cross" in attribute_rivals("A Small red circle above a large blue cross")
    for text in ("a small red circle on the left", "above", ""):
        assert attribute_rivals(text) == []  # one object, or no scene: no rivals


def test_a_search_reaches_a_caption_two_attributes_away_one_round_each(pipe, picture, monkeypatch):
    import unimodal.inference.critique as critique
    import unimodal.instructed  # noqa: F401  (imported before the score is replaced: it keeps its own reference)

    target = "a small yellow circle above a large blue cross"  # PAIR's first object: another colour, and size kept
    read = "a small red circle above a small blue cross"  # two changes from it: a colour and a size
    truth = parse_scene_caption(target)

    def score(model, layout, draft, cfg=None, reading="joint"):  # the closer to the target, the likelier
        scene = parse_scene_caption(pipe.text_codec.decode_one(draft.tokens(layout)["text"]))
        return -float(sum(a != b for o, t in zip(scene["objects"], truth["objects"]) for a, b in
                          ((o[k], t[k]) for k in ("size", "color")))), 1

    monkeypatch.setattr(critique, "agreement_score", score)
    _reads_as(monkeypatch, pipe, read)
    result = pipe.generate(image=picture, to="text", steps=3)
    check = result.settings["rival_check"]
    assert result.text == target and check["rounds"] == 2 and check["agreement"] == [-2.0, 0.0]


def test_the_setting_is_checked_and_the_twin_has_no_reading_back():
    from unimodal.checks import check_settings
    from unimodal.rivals import resolve_rivals

    assert resolve_rivals(None, autoregressive=False) is True and resolve_rivals(None, autoregressive=True) is False
    assert resolve_rivals(False, autoregressive=True) is False
    with pytest.raises(SettingError, match="autoregressive twin"):
        resolve_rivals(True, autoregressive=True)
    for bad in ("yes", 1):
        with pytest.raises(SettingError, match="rivals must be true or false"):
            resolve_rivals(bad, autoregressive=False)
        with pytest.raises(SettingError, match="rivals must be true or false"):
            check_settings({"rivals": bad})
    assert check_settings({"rivals": False}) == {"rivals": False}


@pytest.fixture(scope="module")
def pipe(tiny_caption_model_dir):
    from unimodal import UniModal

    return UniModal.from_pretrained(tiny_caption_model_dir)


@pytest.fixture
def picture():
    from unimodal.training.data.scenes import render_scene

    return render_scene(parse_scene_caption("a small red circle below a large blue cross"), np.random.default_rng(0))[0]


def _prefer(monkeypatch, pipe, text):
    """The agreement score gives 0 to ``text`` read back and -1 to any other caption; the captions it was asked
    about are recorded."""
    import unimodal.inference.critique as critique

    asked = []

    def score(model, layout, draft, cfg=None, reading="joint"):
        caption = pipe.text_codec.decode_one(draft.tokens(layout)["text"])
        asked.append(caption)
        return (0.0 if caption == text else -1.0), 1

    monkeypatch.setattr(critique, "agreement_score", score)
    return asked


def _reads_as(monkeypatch, pipe, caption):
    """Every text the tiny model samples is ``caption``, as if it had written it (its tokens, confidence 0.9)."""
    from dataclasses import replace

    real = pipe._sample_prepared
    ids = pipe.text_codec.encode_one(caption).tolist()

    def sample(ready, settings, progress):
        return [replace(r, text=caption, token_ids={**r.token_ids, "text": ids},
                        confidence={**r.confidence, "text": [0.9] * len(ids)}) if "text" in r.token_ids else r
                for r in real(ready, settings, progress)]

    monkeypatch.setattr(pipe, "_sample_prepared", sample)


def test_the_rival_is_kept_when_the_picture_reads_back_better_from_it(pipe, picture, monkeypatch):
    _reads_as(monkeypatch, pipe, PAIR)
    plain = pipe.generate(image=picture, to="text", steps=3, rivals=False)
    assert plain.settings["rivals"] is False and "rival_check" not in plain.settings and plain.text == PAIR
    asked = _prefer(monkeypatch, pipe, RIVAL)
    result = pipe.generate(image=picture, to="text", steps=3)
    check = result.settings["rival_check"]
    first = attribute_rivals(PAIR)  # round 1: every caption one attribute away; round 2: those of the rival kept
    assert asked[0] == PAIR and set(asked[1:1 + len(first)]) == set(first) and RIVAL in first
    assert check["kept"] == "rival" and check["agreement"] == [-1.0, 0.0] and check["rounds"] == 1
    assert check["rival"] == RIVAL and check["rivals"] == len(asked) - 1 == len(set(asked)) - 1
    assert result.text == RIVAL and result.settings["rivals"] is True
    assert result.token_ids["text"] == pipe.text_codec.encode_one(RIVAL).tolist()
    confidence = result.confidence["text"]
    assert len(confidence) == len(result.token_ids["text"]) and all(0 <= c <= 1 for c in confidence)
    # a read a caption scored and the rival's re-masked word: the passes of the same caption drawn unchecked, plus
    assert check["forward_passes"] == len(asked) + 1 and result.forward_passes == plain.forward_passes + len(asked) + 1
    assert json.loads(json.dumps(result.settings["rival_check"])) == check


def test_the_caption_is_kept_when_it_reads_back_better(pipe, picture, monkeypatch):
    _reads_as(monkeypatch, pipe, PAIR)
    plain = pipe.generate(image=picture, to="text", steps=3, rivals=False)
    asked = _prefer(monkeypatch, pipe, PAIR)
    result = pipe.generate(image=picture, to="text", steps=3)
    assert result.settings["rival_check"]["kept"] == "read" and result.settings["rival_check"]["rounds"] == 0
    assert len(asked) == 1 + len(attribute_rivals(PAIR)) and result.forward_passes == plain.forward_passes + len(asked)
    assert result.text == plain.text and result.token_ids == plain.token_ids  # the model's own caption, untouched


def test_a_plan_read_from_a_picture_is_checked_before_it_is_spoken(pipe, picture, monkeypatch):
    _reads_as(monkeypatch, pipe, PAIR)
    _prefer(monkeypatch, pipe, RIVAL)
    result = pipe.generate(image=picture, to="audio", steps=3, rephrase=False)  # the plan said as checked
    stage = result.settings["text_stage"]
    assert stage["text"] == RIVAL and stage["rival_check"]["kept"] == "rival" and stage["rivals"] is True
    assert stage["token_ids"] == pipe.text_codec.encode_one(RIVAL).tolist()  # the words the speech was made from
    assert stage["forward_passes"] >= 3 and stage["rephrase"] is False and "rephrased" not in stage
    said = pipe.generate(image=picture, to="audio", steps=3).settings["text_stage"]  # the default: checked, then
    assert said["rephrased"] == {"read": RIVAL, "said": "there is " + RIVAL}  # said in the spoken form
    assert said["text"] == "there is " + RIVAL and said["rival_check"]["kept"] == "rival"


# ---- the plan said in the form the model speaks best (unimodal.phrasing) --------------------------------------


def test_a_scene_is_said_in_the_spoken_form_and_anything_else_as_read(pipe):
    from unimodal.core.grammar import parse_scene_caption as parse
    from unimodal.phrasing import SPOKEN_TEMPLATE, rephrased
    from unimodal.results import GenerationResult

    def plan(text, confidence=(0.9, 0.4)):
        ids = pipe.text_codec.encode_one(text).tolist()
        return GenerationResult(text=text, token_ids={"text": ids}, confidence={"text": list(confidence)},
                                forward_passes=3, steps=3, settings={})

    for read, said in (("a small square in red on the left", "there is a small red square on the left"),
                       ("on the right, a large blue cross", "there is a large blue cross on the right"),
                       (PAIR, "there is " + PAIR), ("a large green circle is above a small red cross",
                                                    "there is a large green circle above a small red cross")):
        out = rephrased(pipe, plan(read))
        assert out.text == said and parse(said) == parse(read) and SPOKEN_TEMPLATE == 1
        assert out.token_ids["text"] == pipe.text_codec.encode_one(said).tolist()
        assert out.confidence["text"] == [0.4] * len(out.token_ids["text"])  # the plan's lowest, every word
        assert out.settings["rephrased"] == {"read": read, "said": said} and out.forward_passes == 3
    for text in ("a handwritten seven", "a red", ""):
        assert rephrased(pipe, plan(text)) == plan(text)  # no scene: said as read, no trace


def test_only_speech_made_from_words_that_are_no_output_is_rephrased(pipe, picture, monkeypatch):
    _reads_as(monkeypatch, pipe, "a small square in red on the left")
    asked = _prefer(monkeypatch, pipe, "nothing")  # one object: no rival to compare
    stage = pipe.generate(image=picture, to="audio", steps=3).settings["text_stage"]
    assert stage["text"] == "there is a small red square on the left" and stage["rephrase"] is True
    assert stage["token_ids"] == pipe.text_codec.encode_one(stage["text"]).tolist() and asked == []
    joint = pipe.generate(to=["text", "image", "audio"], steps=3)  # the caption is an output: as written
    assert joint.text == "a small square in red on the left" and "rephrased" not in joint.settings["text_stage"]
    both = pipe.generate(image=picture, to=["text", "audio"], steps=3)  # shown: the words stay the model's
    assert both.text == "a small square in red on the left"
    caption = pipe.generate(image=picture, to="text", steps=3)  # a caption asked for: never rephrased
    assert caption.text == "a small square in red on the left" and "rephrased" not in caption.settings
    with pytest.raises(SettingError, match="rephrase must be true or false"):
        pipe.generate(image=picture, to="audio", steps=3, rephrase="yes")


def test_nothing_is_checked_without_a_picture_or_without_a_rival(pipe, picture, monkeypatch):
    asked = _prefer(monkeypatch, pipe, RIVAL)
    spoken = pipe.generate(text=PAIR, to="image", steps=3)  # no caption read from a picture
    assert "rivals" not in spoken.settings and "rival_check" not in spoken.settings
    _reads_as(monkeypatch, pipe, "a small red circle on the left")  # one object: no rival
    result = pipe.generate(image=picture, to="text", steps=3)
    assert result.settings["rivals"] is True and "rival_check" not in result.settings and asked == []


def test_the_cli_and_the_server_take_the_setting(pipe, picture, tmp_path, capsys, tiny_caption_model_dir):
    from PIL import Image

    from unimodal.checks import GENERATE_KEYS
    from unimodal.cli import main

    Image.fromarray(picture).save(tmp_path / "pair.png")
    assert "rivals" in GENERATE_KEYS and "rephrase" in GENERATE_KEYS
    for flag, expected in (("--no-rivals", False), ("--rivals", True)):
        code = main(["generate", "--model", str(tiny_caption_model_dir), "--image", str(tmp_path / "pair.png"),
                     "--to", "text", "--steps", "3", "--quiet", "--json", flag, "--out", str(tmp_path / "out")])
        out = json.loads(capsys.readouterr().out)
        assert code == 0 and out["settings"]["rivals"] is expected
    for flag, expected in (("--no-rephrase", False), ("--rephrase", True)):
        code = main(["generate", "--model", str(tiny_caption_model_dir), "--image", str(tmp_path / "pair.png"),
                     "--to", "audio", "--steps", "3", "--quiet", "--json", flag, "--out", str(tmp_path / "s.wav")])
        out = json.loads(capsys.readouterr().out)
        assert code == 0 and out["settings"]["text_stage"]["rephrase"] is expected


def test_a_caption_longer_than_the_text_slots_is_skipped_and_said(pipe, picture, monkeypatch):
    import unimodal.rivals as rivals

    long = "a small red circle above a large blue cross " + "very " * 40  # a reading the slots cannot hold
    _reads_as(monkeypatch, pipe, long)
    plain = pipe.generate(image=picture, to="text", steps=3, rivals=False)
    result = pipe.generate(image=picture, to="text", steps=3)
    check = result.settings["rival_check"]
    assert "skipped" in check and check["forward_passes"] == 0 and result.forward_passes == plain.forward_passes
    assert result.text == long and result.token_ids == plain.token_ids
    # rivals longer than the slots are left out of the search, the others compared
    monkeypatch.setattr(rivals, "attribute_rivals", lambda text: [text + " very" * 40] if text == PAIR else [])
    _reads_as(monkeypatch, pipe, PAIR)
    plain = pipe.generate(image=picture, to="text", steps=3, rivals=False)
    result = pipe.generate(image=picture, to="text", steps=3)
    check = result.settings["rival_check"]  # no rival that fits: the reading scored alone, kept as read
    assert check["skipped"] == "no rival fits the text slots" and result.text == PAIR
    assert check["forward_passes"] == 1 and result.forward_passes == plain.forward_passes + 1


def test_bench_refine_starts_from_the_caption_as_read(pipe, picture, monkeypatch):
    """bench refine measures refine from the model's own caption: its first draws are made without the check."""
    from types import SimpleNamespace

    from unimodal.bench_refine import _base, _Direction

    _reads_as(monkeypatch, pipe, PAIR)
    asked = _prefer(monkeypatch, pipe, RIVAL)
    (first,) = _base(pipe, [SimpleNamespace(image=picture)], seed=0, batch_size=4, direction=_Direction("image->text"))
    assert first.text == PAIR and first.settings["rivals"] is False and asked == []


def test_eval_counts_the_plans_said_in_the_spoken_form():
    from types import SimpleNamespace

    from unimodal.inference.evaluate import rephrase_counts

    def result(stage):
        return SimpleNamespace(settings={"text_stage": stage} if stage is not None else {})

    said = {"read": "a small square in red on the left", "said": "there is a small red square on the left"}
    same = {"read": "there is a small red square on the left", "said": "there is a small red square on the left"}
    results = [result({"rephrased": said}), result({"rephrased": same}), result({"rephrase": True}), result(None),
               result({"rephrased": {**said, "skipped": "too long"}})]
    assert rephrase_counts(results) == {"said": 2, "reworded": 1}
    assert rephrase_counts([result(None), result({"rephrase": False})]) is None
