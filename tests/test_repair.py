"""Repair by reading back (``UniModal.refine(..., repair=True)``, ``unimodal eval --repair``): which attributes a
reading asks to change (pairs matched in either order; shapes and relations left alone), and the loop on a tiny
random model with its reading replaced, so each verdict is the test's: an edit kept where the read colour's pixels
are found, refused where they are not, nothing done when the reading agrees."""

import json

import numpy as np
import pytest

from unimodal.core.errors import InputError
from unimodal.core.grammar import parse_scene_caption
from unimodal.repair import as_read, matched, repair_by_reading, repairs

ONE = {"objects": [{"shape": "circle", "color": "red", "size": "small", "position": "left"}], "relation": None}
DRAWN = "a small red circle on the left"


def _parsed(*captions):
    return [parse_scene_caption(c) for c in captions]


def test_a_colour_size_or_place_read_otherwise_is_repaired_and_a_shape_is_not():
    asked, heard = _parsed("a large blue square at the top", "a small red circle on the left")
    assert repairs(asked, as_read(asked, heard)) == [(0, "color", "blue"), (0, "size", "large"),
                                                     (0, "position", "top")]
    asked, heard = _parsed("a small red square on the left", DRAWN)
    assert repairs(asked, as_read(asked, heard)) == []  # the shape is the model's to draw


def test_a_pair_read_in_the_other_order_is_matched_object_to_object():
    asked, heard = _parsed("a small blue triangle to the right of a large red cross",
                           "a large red cross to the left of a small green triangle")
    assert matched(asked, heard) == [1, 0]
    shown = as_read(asked, heard)
    assert shown["relation"] == "right of" and [o["shape"] for o in shown["objects"]] == ["triangle", "cross"]
    assert repairs(asked, shown) == [(0, "color", "blue")]  # the triangle, wherever the reading put it
    asked, heard = _parsed("a small blue triangle to the right of a large red cross",
                           "a large red cross to the right of a small blue triangle")
    assert repairs(asked, as_read(asked, heard)) == []  # only the relation differs: not repaired


def test_the_relation_breaks_a_tie_between_pairings():
    # each pairing agrees on three attributes; read in the other order, "below" is the request's "above"
    asked, heard = _parsed("a small red triangle above a large green cross",
                           "a small green cross below a large green triangle")
    assert matched(asked, heard) == [1, 0]
    assert repairs(asked, as_read(asked, heard)) == [(0, "color", "red"), (0, "size", "small"), (1, "size", "large")]


@pytest.fixture(scope="module")
def pipe(tiny_caption_model_dir):
    from unimodal import UniModal

    return UniModal.from_pretrained(tiny_caption_model_dir)


def _picture(pipe):
    """A result whose codes are the tiny codec's of a rendered scene and whose picture is the scene itself (the
    tiny codec is untrained: its decoded pictures have no objects to find)."""
    from dataclasses import replace

    from PIL import Image

    from unimodal.refine import as_result
    from unimodal.training.data.scenes import render_scene

    rgb = render_scene(ONE, np.random.default_rng(0))[0]
    return replace(as_result(pipe, rgb), image=Image.fromarray(rgb))


def _reads(pipe, monkeypatch, said):
    """Every read-back of the pipeline says ``said`` (the check's and each edit's)."""
    real = pipe.generate

    def reads(**kwargs):
        result = real(**kwargs)
        if "image" in kwargs and kwargs.get("to") == "text":
            result.text = said
        return result

    monkeypatch.setattr(pipe, "generate", reads)


def test_a_colour_read_otherwise_is_changed_from_the_objects_own_pixels(pipe, monkeypatch):
    _reads(pipe, monkeypatch, DRAWN)
    picture = _picture(pipe)
    fixed, trace = pipe.refine(picture, text="a small blue circle on the left", repair=True, rounds=0)
    repair = trace["repair"]
    assert repair["check"]["read_back"] == DRAWN and not repair["check"]["agrees"]
    (edit,) = repair["edits"]
    assert edit["instruction"] == "make the small red circle blue" and edit["kept"] is True
    inside = set().union(*(pipe.layout.image_box_to_positions(r["box"]).tolist() for r in edit["regions"]))
    changed = {k for k, (a, b) in enumerate(zip(picture.token_ids["image"], fixed.token_ids["image"])) if a != b}
    assert changed and changed <= inside  # the circle's box redrafted, nothing outside it
    assert edit["codes_drafted"] > 0 and trace["forward_passes"] >= repair["forward_passes"] > 0
    assert fixed.forward_passes == picture.forward_passes + trace["forward_passes"]
    assert json.loads(json.dumps(trace)) == trace


def test_refine_rounds_after_a_repair_keep_what_it_edited(pipe, monkeypatch):
    """A critic that doubts every code, one round after the repair: it redraws the rest of the picture, never
    the circle's box the repair redrafted (before, rounds after a repair undid repairs)."""
    import torch

    _reads(pipe, monkeypatch, DRAWN)
    picture = _picture(pipe)
    repaired, first = pipe.refine(picture, text="a small blue circle on the left", repair=True, rounds=0)

    def doubts_all(tokens):
        return {"image": torch.zeros(len(tokens["image"]))}

    fixed, trace = pipe.refine(picture, text="a small blue circle on the left", repair=True, rounds=1,
                               critic=doubts_all, fraction=1.0, steps=2)
    (edit,) = trace["repair"]["edits"]
    inside = sorted(set().union(*(pipe.layout.image_box_to_positions(r["box"]).tolist() for r in edit["regions"])))
    assert trace["rounds"] and trace["rounds"][0]["tokens_remasked"] == len(picture.token_ids["image"]) - len(inside)
    assert [fixed.token_ids["image"][k] for k in inside] == [repaired.token_ids["image"][k] for k in inside]


def test_a_pair_read_alike_is_repaired_object_by_object_in_the_half_its_relation_gives_it(pipe, monkeypatch):
    from dataclasses import replace

    from PIL import Image

    from unimodal.refine import as_result
    from unimodal.training.data.scenes import render_scene

    alike = "a small red circle to the left of a small red circle"
    rgb = render_scene(parse_scene_caption(alike), np.random.default_rng(0))[0]
    picture = replace(as_result(pipe, rgb), image=Image.fromarray(rgb))
    _reads(pipe, monkeypatch, alike)  # the instruction's words fit both circles
    fixed, trace = pipe.refine(picture, text="a small red circle to the left of a small blue circle", repair=True,
                               rounds=0)
    (edit,) = trace["repair"]["edits"]
    assert edit["instruction"] == "make the small red circle blue" and edit["object"] == 1 and edit["kept"] is True
    changed = [k for k, (a, b) in enumerate(zip(picture.token_ids["image"], fixed.token_ids["image"])) if a != b]
    columns = pipe.layout.image_grid[1]
    assert changed and all(k % columns >= columns // 2 - 1 for k in changed)  # the right circle's cells only


def test_a_colour_read_as_asked_that_the_pixels_show_otherwise_is_repaired_by_the_pixels(pipe, monkeypatch):
    from dataclasses import replace

    from PIL import Image

    from unimodal.instructed import colour_mask
    from unimodal.refine import as_result
    from unimodal.training.data.scenes import render_scene

    asked = "a large yellow circle on the left"
    rgb = render_scene(parse_scene_caption(asked), np.random.default_rng(0))[0].copy()
    yellow = colour_mask(rgb, "yellow")
    rows = np.flatnonzero(yellow.any(1))
    yellow[:rows[0] + (rows[-1] - rows[0]) // 3] = False
    rgb[yellow] = (245, 140, 20)  # two thirds of the circle orange: drawn between the two words
    picture = replace(as_result(pipe, rgb), image=Image.fromarray(rgb))
    _reads(pipe, monkeypatch, asked)  # the model reads it as asked
    fixed, trace = repair_by_reading(pipe, picture, asked)
    (seen,) = trace["colours"]
    assert (seen["object"], seen["read"], seen["pixels"]) == (0, "yellow", "orange")
    assert seen["counts"]["orange"] > seen["counts"]["yellow"] > 0
    (edit,) = trace["edits"]
    assert edit["instruction"] == "make the large orange circle yellow" and edit["kept"] is True
    assert fixed.token_ids["image"] != picture.token_ids["image"]
    same, trace = repair_by_reading(pipe, picture, asked, colours=False)  # the reading alone: nothing to change
    assert trace["why"] == "the reading agrees with the request" and same is picture


def test_a_size_read_otherwise_than_the_object_measures_is_taken_from_its_extent(pipe, monkeypatch):
    """The model reads some small objects as large; shrinking them broke right pictures (two of 200 held-out
    pairs): the object's extent names its size, and only a size it names otherwise than the request is edited."""
    from unimodal.core.grammar import SIZES
    from unimodal.instructed import LARGE_AT_LEAST, SMALL_AT_MOST, object_measures

    picture = _picture(pipe)  # a small red circle on the left, drawn at the grammar's small size
    rgb = np.asarray(picture.image.convert("RGB"))
    *_, size, extent = object_measures(rgb, parse_scene_caption("a large red circle on the left"), 0)
    assert size == "small" and extent <= SMALL_AT_MOST and abs(extent - SIZES["small"]) <= 2
    assert SMALL_AT_MOST < (SIZES["small"] + SIZES["large"]) / 2 < LARGE_AT_LEAST
    assert object_measures(rgb, parse_scene_caption("a large green circle on the left"), 0)[2:] == (None, None)
    _reads(pipe, monkeypatch, "a large red circle on the left")  # read as large: it is not
    fixed, trace = pipe.refine(picture, text=DRAWN, repair=True, rounds=0)
    repair = trace["repair"]
    (seen,) = repair["sizes"]
    assert (seen["object"], seen["read"], seen["pixels"], seen["extent"]) == (0, "large", "small", extent)
    assert repair["edits"] == [] and fixed.token_ids["image"] == picture.token_ids["image"]
    assert repair["why"] == "what differs is a shape or relation, or a colour or size the pixels show as asked"
    _, trace = pipe.refine(picture, text="a large red circle on the left", repair=True, rounds=0)
    (edit,) = trace["repair"]["edits"]  # asked large, measured small: made large
    assert edit["instruction"] == "make the small red circle large" and edit["kept"] is True
    same, trace = repair_by_reading(pipe, picture, DRAWN, sizes=False)  # the reading alone: shrink it
    assert [e["instruction"] for e in trace["edits"]] == ["make the large red circle small"]


def test_a_colour_the_picture_does_not_show_is_not_trusted(pipe, monkeypatch):
    _reads(pipe, monkeypatch, "a small green circle on the left")  # there is no green in the picture
    picture = _picture(pipe)
    fixed, trace = pipe.refine(picture, text="a small blue circle on the left", repair=True, rounds=0)
    (edit,) = trace["repair"]["edits"]
    assert edit["kept"] is False and edit["why"] == ("no pixel draft (the object was not found by its colour's "
                                                     "pixels): the reading is not trusted")
    assert fixed.token_ids["image"] == picture.token_ids["image"]


def test_a_reading_that_agrees_changes_nothing(pipe, monkeypatch):
    _reads(pipe, monkeypatch, DRAWN)
    picture = _picture(pipe)
    fixed, trace = pipe.refine(picture, text=DRAWN, repair=True, rounds=0)
    assert trace["repair"]["edits"] == [] and trace["repair"]["why"] == "the reading agrees with the request"
    assert fixed.token_ids["image"] == picture.token_ids["image"]


def test_nothing_is_repaired_without_a_scene_on_both_sides(pipe, monkeypatch):
    _reads(pipe, monkeypatch, "a small red circle to the left of a large blue square")
    _, trace = pipe.refine(_picture(pipe), text="a small blue circle on the left", repair=True, rounds=0)
    assert trace["repair"]["why"] == "the reading states another number of objects" and not trace["repair"]["edits"]
    _, trace = pipe.refine(_picture(pipe), text="a drawing of a boat", repair=True, rounds=0)
    assert trace["repair"]["why"] == "the request states no scene"


def test_a_picture_drawn_from_speech_is_repaired_against_what_the_model_hears(pipe, monkeypatch):
    real = pipe.generate

    def hears(**kwargs):  # the model transcribes the clip as the request; reads the picture as drawn
        result = real(**kwargs)
        if kwargs.get("to") == "text":
            result.text = "a small blue circle on the left" if "audio" in kwargs else DRAWN
        return result

    monkeypatch.setattr(pipe, "generate", hears)
    clip = np.zeros(16000, np.float32)
    picture = _picture(pipe)
    fixed, trace = pipe.refine(picture, audio=clip, repair=True, rounds=0)
    repair = trace["repair"]
    assert repair["request"]["text"] == "a small blue circle on the left" and repair["request"]["from"] == "audio"
    assert [e["instruction"] for e in repair["edits"]] == ["make the small red circle blue"]
    assert repair["forward_passes"] >= repair["request"]["forward_passes"] + repair["check"]["forward_passes"]
    assert fixed.token_ids["image"] != picture.token_ids["image"]


def test_the_repair_line_says_when_nothing_was_read():
    from unimodal.cli_refine import repair_line

    assert repair_line({"edits": [], "why": "the speech was heard as no words", "forward_passes": 0}) == \
        "repair: nothing changed (the speech was heard as no words)"


def test_repair_needs_a_picture_and_its_request(pipe):
    picture = pipe.generate(text=DRAWN, to="image", steps=1)
    with pytest.raises(InputError, match=r"give a picture and its request as text= \(or the speech"):
        pipe.refine(picture, repair=True, rounds=0)
    caption = pipe.generate(image=_picture(pipe).image, to="text", steps=1)
    with pytest.raises(InputError, match="give a picture and its request as text="):
        pipe.refine(caption, text=DRAWN, repair=True, rounds=0)


def test_bad_refine_settings_are_refused_before_the_repair_reads_anything(pipe, monkeypatch):
    from unimodal.core.errors import SettingError

    monkeypatch.setattr(pipe, "generate", lambda **k: pytest.fail("the picture was read"))
    with pytest.raises((InputError, SettingError), match="rounds"):
        pipe.refine(_picture(pipe), text=DRAWN, repair=True, rounds=-1)
    with pytest.raises((InputError, SettingError), match="evaluator"):
        pipe.refine(_picture(pipe), text=DRAWN, repair=True, evaluator="bogus")
    with pytest.raises(SettingError, match="repair must be true or false"):
        pipe.refine(_picture(pipe), text=DRAWN, repair="yes")


def test_repair_alone_spends_no_critic_pass_and_speech_heard_as_nothing_changes_nothing(pipe, monkeypatch):
    _reads(pipe, monkeypatch, DRAWN)
    picture = _picture(pipe)
    fixed, trace = pipe.refine(picture, text=DRAWN, repair=True, rounds=0)
    assert trace["rounds"] == [] and trace["score_initial"] is None
    _, by_default = pipe.refine(picture, text=DRAWN, repair=True)  # the repair alone unless rounds are asked
    assert by_default["rounds"] == [] and by_default["critic"] is None
    assert trace["forward_passes"] == trace["repair"]["forward_passes"] == trace["repair"]["check"]["forward_passes"]
    real = pipe.generate

    def silent(**kwargs):
        result = real(**kwargs)
        result.text = ""
        return result

    monkeypatch.setattr(pipe, "generate", silent)
    fixed, trace = pipe.refine(picture, audio=np.zeros(16000, np.float32), repair=True, rounds=0)
    assert trace["repair"]["why"] == "the speech was heard as no words" and trace["repair"]["request"]["text"] == ""
    assert fixed.token_ids["image"] == picture.token_ids["image"]


def test_generate_repair_reads_the_picture_back_and_counts_the_reading(pipe, monkeypatch):
    _reads(pipe, monkeypatch, DRAWN)
    plain = pipe.generate(text="a small blue circle on the left", to="image", steps=2, seed=3)
    repaired = pipe.generate(text="a small blue circle on the left", to="image", steps=2, seed=3, repair=True)
    trace = repaired.settings["repair"]
    assert trace["check"]["read_back"] == DRAWN and not trace["check"]["agrees"]
    assert repaired.forward_passes == plain.forward_passes + trace["forward_passes"] > plain.forward_passes
    assert json.loads(json.dumps(trace)) == trace and "repair" not in plain.settings


@pytest.mark.parametrize("request_, message", [
    ({"text": DRAWN, "to": "audio"}, "this request makes audio from text"),  # speech, not a picture
    ({"to": "image"}, "this request makes image from no input"),
    ({"text": DRAWN, "to": ["image", "audio"]}, "this request makes image, audio from text"),
])
def test_generate_repair_is_refused_where_no_picture_is_drawn_from_words_or_speech(pipe, monkeypatch, request_,
                                                                                    message):
    from unimodal.checks import check_request
    from unimodal.core.errors import SettingError

    monkeypatch.setattr(pipe, "_generate_once", lambda *a, **k: pytest.fail("something was drawn"))
    with pytest.raises(SettingError, match=message):
        pipe.generate(**request_, repair=True)
    with pytest.raises(SettingError, match=message):
        check_request({**request_, "repair": True})
    with pytest.raises(SettingError, match="repair must be true or false"):
        pipe.generate(text=DRAWN, repair=1)


def test_generate_command_repair(tiny_caption_model_dir, tmp_path, capsys):
    from unimodal.cli import main

    code = main(["generate", "--model", str(tiny_caption_model_dir), "--text", DRAWN, "--steps", "2", "--repair",
                 "--out", str(tmp_path / "x.png"), "--json", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert "check" in result["settings"]["repair"] and (tmp_path / "x.png").is_file()
    code = main(["generate", "--model", str(tiny_caption_model_dir), "--text", DRAWN, "--steps", "2", "--repair",
                 "--out", str(tmp_path / "y.png"), "--quiet"])  # a person is told what the repair read and did
    out, err = capsys.readouterr()
    assert code == 0 and f"repair: read back as {result['settings']['repair']['check'].get('read_back')!r}" in out, err
    code = main(["generate", "--model", str(tiny_caption_model_dir), "--text", DRAWN, "--to", "audio", "--repair",
                 "--out", str(tmp_path / "x.wav")])
    out, err = capsys.readouterr()
    assert code == 2 and "repair reads a picture back" in err and not (tmp_path / "x.wav").exists(), err
