"""Instructed edits: the instruction language (every form, every refusal), the plan on hand-made scenes (target
caption, the named object's box, found by its colour), and the plumbing on a tiny untrained model: tokens outside
the planned region never change, the trace is JSON, bad requests are refused before the edit runs, and the CLI's
``--instruction``. (The random model will not make the edit right: the verdict is reported, not tested.)"""

import json

import numpy as np
import pytest

from unimodal.core.errors import InputError, SettingError
from unimodal.core.grammar import scene_caption
from unimodal.core.instructions import apply_instruction, parse_instruction, replace_word, require_fits

PROMPT = "a small red circle on the left"
FAST = dict(steps=4, attempts=1)  # one execution: the counts of passes below are of one
ONE = {"objects": [{"shape": "circle", "color": "red", "size": "small", "position": "left"}], "relation": None}
PAIR = {"objects": [{"shape": "circle", "color": "red", "size": "small"},
                    {"shape": "square", "color": "blue", "size": "large"}], "relation": "left of"}


# ---- the language -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("said, expected", [
    ("make the circle blue", {"kind": "attribute", "object": "circle", "change": {"color": "blue"}}),
    ("Make the small red circle LARGE.", {"kind": "attribute", "object": "small red circle",
                                          "change": {"size": "large"}}),
    ("make it purple", {"kind": "attribute", "object": "it", "change": {"color": "purple"}}),
    ("turn the red cross into a triangle", {"kind": "attribute", "object": "red cross",
                                            "change": {"shape": "triangle"}}),
    ("change it into a square", {"kind": "attribute", "object": "it", "change": {"shape": "square"}}),
    ("move the square to the centre", {"kind": "attribute", "object": "square", "change": {"position": "center"}}),
    ("replace 'small' by 'large'", {"kind": "word", "old": "small", "new": "large"}),
    ('replace "on the left" with "at the top"', {"kind": "word", "old": "on the left", "new": "at the top"}),
    ("say 'green' instead of 'red'", {"kind": "word", "old": "red", "new": "green"}),
])
def test_every_form_is_understood(said, expected):
    parsed = parse_instruction(said).to_dict()
    assert {k: v for k, v in parsed.items() if k != "instruction"} == expected


@pytest.mark.parametrize("said, match", [
    ("paint it black", "(?s)not in the instruction language;.*make the <object>"),
    ("make the circle happy", "'happy' is not a color"),
    ("make the circle to the left", r"(?s)\['to', 'the'\] name no object.*move the <object>"),
    ("turn the circle into a blue", "'blue' is not a shape"),
    ("move the circle to the moon", "'moon' is not a position"),
    ("make the big circle blue", r"\['big'\] name no object"),
    ("replace 'red' by 'RED'", "by itself"),
    ("", "non-empty string"),
])
def test_anything_else_is_refused_with_the_forms_or_the_word_expected(said, match):
    with pytest.raises(InputError, match=match):
        parse_instruction(said)


def test_each_kind_fits_its_content():
    require_fits(parse_instruction("make the circle blue"), "image")
    require_fits(parse_instruction("say 'a' instead of 'b'"), "audio")
    with pytest.raises(InputError, match="edits a picture .* but the content is text"):
        require_fits(parse_instruction("make the circle blue"), "text")
    with pytest.raises(InputError, match="edits a caption or speech .* but the content is image"):
        require_fits(parse_instruction("replace 'a' by 'b'"), "image")


# ---- the plan on hand-made scenes ---------------------------------------------------------------------------------


def test_the_target_changes_the_named_attribute_only():
    target, index = apply_instruction(ONE, parse_instruction("make the circle blue"))
    assert index == 0 and scene_caption(target, 0) == "a small blue circle on the left"
    target, index = apply_instruction(PAIR, parse_instruction("turn the blue square into a cross"))
    assert index == 1 and scene_caption(target, 0) == "a small red circle to the left of a large blue cross"
    assert PAIR["objects"][1]["shape"] == "square"  # the source is not touched


@pytest.mark.parametrize("scene, said, match", [
    (ONE, "make the triangle blue", "names the triangle, but the picture shows a small red circle"),
    (PAIR, "make it blue", "says 'it', but the picture shows"),
    ({**PAIR, "objects": [PAIR["objects"][0], {**PAIR["objects"][1], "shape": "circle"}]}, "make the circle green",
     "fits both"),
    (PAIR, "move the circle to the top", "'move' applies to a picture of one object"),
    (ONE, "make the circle red", "already red; nothing to change"),
])
def test_an_instruction_the_scene_cannot_take_is_refused(scene, said, match):
    with pytest.raises(InputError, match=match):
        apply_instruction(scene, parse_instruction(said))


def test_replace_word_finds_the_one_whole_word():
    assert replace_word(PROMPT, "Red", "blue") == ("a small blue circle on the left", (8, 11))
    with pytest.raises(InputError, match="has no word 'green'"):
        replace_word(PROMPT, "green", "blue")
    with pytest.raises(InputError, match="has 2 of the word 'the'"):
        replace_word("the red circle above the square", "the", "a")
    with pytest.raises(InputError, match="has no word 'mall'"):
        replace_word(PROMPT, "mall", "big")  # a part of a word is not a word


def _scene(attrs, seed=0):
    from unimodal.training.data.scenes import render_scene

    return render_scene(attrs, np.random.default_rng(seed))


def test_the_named_object_is_found_by_its_colour():
    from unimodal.instructed import picture_boxes

    rgb, (centre,) = _scene(ONE)
    target, index = apply_instruction(ONE, parse_instruction("make the circle blue"))
    (box,), located_by = picture_boxes(rgb, ONE, target, index)
    assert located_by == "pixels of its colour"
    assert box[0] < centre[0] < box[2] and box[1] < centre[1] < box[3]
    assert 18 <= box[2] - box[0] <= 22 and 18 <= box[3] - box[1] <= 22  # a small object: 18 px and a margin


def test_a_pair_of_one_colour_is_told_apart_by_its_relation_and_a_move_adds_the_destination():
    from unimodal.instructed import picture_boxes

    same = {"objects": [{"shape": "circle", "color": "red", "size": "small"},
                        {"shape": "square", "color": "red", "size": "large"}], "relation": "left of"}
    rgb, centres = _scene(same)
    target, index = apply_instruction(same, parse_instruction("make the square green"))
    (box,), _ = picture_boxes(rgb, same, target, index)
    assert box[0] >= 32 - 1 and box[0] < centres[1][0] < box[2]  # the right one, not both
    rgb, _ = _scene(ONE)
    target, index = apply_instruction(ONE, parse_instruction("move the circle to the right"))
    (here, there), _ = picture_boxes(rgb, ONE, target, index)
    assert here[2] <= 32 and there[0] > 32  # the old place on the left, the new one on the right


def test_a_caller_that_knows_the_object_names_one_of_two_alike_by_its_index():
    alike = {"objects": [{"shape": "circle", "color": "red", "size": "small"},
                         {"shape": "circle", "color": "red", "size": "small"}], "relation": "left of"}
    with pytest.raises(InputError, match="fits both"):
        apply_instruction(alike, parse_instruction("make the small red circle blue"))
    target, index = apply_instruction(alike, parse_instruction("make the small red circle blue"), index=1)
    assert index == 1 and [o["color"] for o in target["objects"]] == ["red", "blue"]
    with pytest.raises(InputError, match="object 0 of"):  # the words must still fit the object meant
        apply_instruction(alike, parse_instruction("make the square blue"), index=0)
    with pytest.raises(InputError, match="object 2 of a picture of 2"):
        apply_instruction(alike, parse_instruction("make the circle blue"), index=2)


def test_no_pixels_of_the_colour_falls_back_to_the_grammars_anchor():
    from unimodal.instructed import picture_boxes

    grey = np.full((64, 64, 3), 30, np.uint8)
    target, index = apply_instruction(ONE, parse_instruction("make it large"))
    (box,), located_by = picture_boxes(grey, ONE, target, index)
    assert "anchor" in located_by and box == [1.0, 17.0, 31.0, 47.0]  # large (28 px) around (16, 32)


# ---- the plumbing on a tiny model ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipe(tiny_caption_model_dir):
    from unimodal import UniModal

    return UniModal.from_pretrained(tiny_caption_model_dir)


def _outside(before, after, indices):
    return [k for k, (a, b) in enumerate(zip(before, after)) if a != b and k not in indices]


def test_a_picture_edit_changes_only_the_planned_region_and_reports_its_plan(pipe):
    picture = _scene(ONE)[0]
    edited, trace = pipe.edit(picture, instruction="make the circle blue", text=PROMPT, draft=False, **FAST)
    assert json.loads(json.dumps(trace)) == trace
    plan = trace["plan"]
    assert plan["target"] == "a small blue circle on the left" and plan["read_by"] == "caller"
    (region,) = plan["regions"]
    inside = set(pipe.layout.image_box_to_positions(region["box"]).tolist())
    assert 4 <= len(inside) <= 16 and region["box"][0] < 16 < region["box"][2]
    from unimodal.refine import as_result

    before = as_result(pipe, picture).token_ids["image"]
    assert _outside(before, edited.token_ids["image"], inside) == []
    assert trace["tokens_changed"]["outside"] == 0
    assert trace["passes"]["plan"] == 0 and trace["passes"]["execute"] == 4 and trace["passes"]["check"] > 0
    assert trace["forward_passes"] == sum(trace["passes"].values()) == edited.forward_passes
    assert isinstance(trace["check"]["parses_to_target"], bool) and "read_back" in trace["check"]


def test_an_instructed_edit_with_candidates_keeps_the_one_the_target_agrees_with_best(pipe):
    picture = _scene(ONE)[0]
    edited, trace = pipe.edit(picture, instruction="make the circle blue", text=PROMPT, candidates=2, draft=False,
                              **FAST)
    chosen = trace["plan"]["candidates"]
    assert chosen["candidates"] == 2 and chosen["agreement"][chosen["kept"]] == max(chosen["agreement"])
    assert trace["passes"]["execute"] == 2 * (4 + 1)  # two regenerations, each read back once
    assert trace["tokens_changed"]["outside"] == 0 and json.loads(json.dumps(trace)) == trace


def _drafted_codes(pipe, picture, plan):
    """The codes the pixel draft of ``plan`` gives inside its regions (what the edit starts from)."""
    from unimodal.inference.picture_draft import draft_picture
    from unimodal.instructed import _half, _side, colour_mask

    source, target, k = plan["source"], plan["target_attributes"], plan["object"]
    core = _half(colour_mask(picture, source["objects"][k]["color"]), _side(source, k))
    drafted = draft_picture(picture, core, source["objects"][k], target["objects"][k])
    return pipe.image_codec.encode(drafted[None])[0].tolist()


@pytest.mark.parametrize("said", ["make the circle blue", "make it large", "move the circle to the right"])
def test_a_colour_size_or_place_change_is_the_objects_pixels_moved(pipe, said):
    from unimodal.refine import as_result

    picture = _scene(ONE)[0]
    edited, trace = pipe.edit(picture, instruction=said, text=PROMPT, **FAST)
    plan = trace["plan"]
    assert plan["draft"]["used"] is True and "touch_up" not in plan and json.loads(json.dumps(trace)) == trace
    inside = set().union(*(pipe.layout.image_box_to_positions(r["box"]).tolist() for r in plan["regions"]))
    before, after, drafted = (as_result(pipe, picture).token_ids["image"], edited.token_ids["image"],
                              _drafted_codes(pipe, picture, plan))
    assert [after[k] for k in sorted(inside)] == [drafted[k] for k in sorted(inside)]  # the draft's codes ...
    assert _outside(before, after, inside) == [] and trace["tokens_changed"]["outside"] == 0  # ... only there
    assert plan["draft"]["codes_drafted"] == sum(before[k] != after[k] for k in inside) > 0
    assert trace["passes"]["execute"] == 0 and trace["passes"]["check"] > 0  # the model reads the result back
    assert trace["forward_passes"] == sum(trace["passes"].values()) == edited.forward_passes


def test_candidates_on_a_drafted_change_are_said_to_be_unused(pipe):
    _, trace = pipe.edit(_scene(ONE)[0], instruction="make the circle blue", text=PROMPT, candidates=3, **FAST)
    assert trace["plan"]["draft"]["candidates"] == "3 asked, not used: a drafted change regenerates nothing"
    assert trace["passes"]["execute"] == 0


def test_with_touch_up_the_model_redraws_only_drafted_codes_it_doubts(pipe):
    picture = _scene(ONE)[0]
    edited, trace = pipe.edit(picture, instruction="make the circle blue", text=PROMPT, touch_up=True, **FAST)
    plan, after = trace["plan"], edited.token_ids["image"]
    inside = set(pipe.layout.image_box_to_positions(plan["regions"][0]["box"]).tolist())
    redrawn = [k for k in inside if after[k] != _drafted_codes(pipe, picture, plan)[k]]
    touch = plan["touch_up"]
    if touch["kept"]:  # the model redrew some of the codes it doubted, and the target read back no worse
        assert 0 < touch["codes_doubted"] and len(redrawn) <= touch["codes_doubted"]
        assert touch["agreement"][1] >= touch["agreement"][0]
    else:  # the draft's codes stand inside the region
        assert redrawn == []
    assert trace["passes"]["execute"] >= 1 and trace["tokens_changed"]["outside"] == 0  # the review is the model's
    assert trace["forward_passes"] == sum(trace["passes"].values()) == edited.forward_passes


def test_a_stray_pixel_of_the_colour_is_not_lifted_with_the_object(pipe):
    picture = _scene(ONE)[0].copy()
    picture[60, 60] = (200, 50, 50)  # one speck of red far from the circle
    _, trace = pipe.edit(picture, instruction="make it large", text=PROMPT, **FAST)
    draft = trace["plan"]["draft"]
    assert draft["used"] is True and draft["cells_added"] <= 4  # the large circle, not a canvas-wide one
    assert trace["tokens_changed"]["outside"] == 0


def test_touch_up_without_a_draft_is_refused_and_without_a_draft_to_review_said(pipe):
    picture = _scene(ONE)[0]
    with pytest.raises(InputError, match="touch_up reviews a pixel draft"):
        pipe.edit(picture, instruction="make the circle blue", text=PROMPT, draft=False, touch_up=True)
    _, trace = pipe.edit(picture, instruction="turn the circle into a square", text=PROMPT, touch_up=True, **FAST)
    assert trace["plan"]["touch_up"] == {"applied": False, "why": "no pixel draft to review"}


def test_a_new_shape_is_drawn_by_the_model(pipe):
    _, trace = pipe.edit(_scene(ONE)[0], instruction="turn the circle into a square", text=PROMPT, **FAST)
    assert trace["plan"]["draft"] == {"used": False, "why": "a new shape has no silhouette to keep: the model "
                                                             "draws it"}
    assert "touch_up" not in trace["plan"] and trace["passes"]["execute"] == 4


def _reading(pipe, monkeypatch, said, drawn=("read",)):
    """pipe.generate with its read-backs replaced by ``said`` in turn (the last one again when they run out); the
    forward passes of each read-back are recorded. The drawing direction's check of a read-back that is not the
    target (:func:`unimodal.rivals.compare_captions`) keeps ``drawn`` in turn ("read" or "rival": the target), two
    passes each (the tiny model is random: which caption it prefers is the test's)."""
    from unimodal import instructed

    calls, real, compared = [], pipe.generate, []

    def compare(pipe_, conditions, read, rival):
        compared.append((read, rival))
        kept = drawn[min(len(compared), len(drawn)) - 1]
        return {"read": read, "rival": rival, "agreement": [-1.0, -2.0], "kept": kept, "forward_passes": 2}, [], []

    monkeypatch.setattr(instructed, "compare_captions", compare)

    def reads(**kwargs):
        result = real(**kwargs)
        calls.append(result.forward_passes)
        result.text = said[min(len(calls), len(said)) - 1]
        return result

    monkeypatch.setattr(pipe, "generate", reads)
    return calls


def test_attempts_redo_a_redrawn_edit_until_it_reads_back_as_the_target(pipe, monkeypatch):
    target = "a small red square on the left"
    calls = _reading(pipe, monkeypatch, ["a small red circle on the left", target])
    edited, trace = pipe.edit(_scene(ONE)[0], instruction="turn the circle into a square", text=PROMPT, attempts=3,
                              steps=4)
    attempts = trace["plan"]["attempts"]
    assert attempts == {"asked": 3, "made": 2, "kept": 1, "read_back": [PROMPT, target],
                        "parses_to_target": [False, True], "agreement": None}
    assert trace["check"]["parses_to_target"] is True and edited.settings["verdict"] is True
    assert trace["passes"]["execute"] == 2 * 4 and len(calls) == 2  # two regenerations, each read back once
    assert trace["tokens_changed"]["outside"] == 0 and json.loads(json.dumps(trace)) == trace
    assert trace["forward_passes"] == sum(trace["passes"].values()) == edited.forward_passes


def test_when_no_attempt_reads_back_as_the_target_the_one_it_agrees_with_best_is_kept(pipe, monkeypatch):
    from unimodal import instructed

    calls = _reading(pipe, monkeypatch, [PROMPT])  # every attempt reads back as the old shape
    scores = iter([-3.0, -1.0, -2.0])
    monkeypatch.setattr(instructed, "_agreement", lambda *a: (next(scores), 1))
    edited, trace = pipe.edit(_scene(ONE)[0], instruction="turn the circle into a square", text=PROMPT, attempts=3,
                              steps=4)
    attempts = trace["plan"]["attempts"]
    assert attempts["made"] == 3 and attempts["parses_to_target"] == [False] * 3
    assert attempts["agreement"] == [-3.0, -1.0, -2.0] and attempts["kept"] == 1
    assert trace["passes"]["execute"] == 3 * 4 and trace["passes"]["check"] == sum(calls) + 3  # + 3 agreements
    assert trace["check"]["parses_to_target"] is False and trace["tokens_changed"]["outside"] == 0


def test_a_drafted_picture_read_as_another_scene_is_asked_of_the_drawing_direction(pipe, monkeypatch):
    """A colour change is drafted from the object's pixels; its read-back names another scene than the target; the
    picture is likelier under the target than under what was read: the edit counts as done, the comparison in
    the check. Where drawing agrees with the reading, or the reading is no scene, it is not done. A region the
    model redrew from the target (a new shape), a touched-up draft and a caption are judged by reading alone."""
    from unimodal import instructed

    target = "a small blue circle on the left"
    calls = _reading(pipe, monkeypatch, [PROMPT], drawn=("rival",))
    edited, trace = pipe.edit(_scene(ONE)[0], instruction="make the circle blue", text=PROMPT, steps=4)
    check = trace["check"]
    assert check["parses_to_target"] is True and check["differences"] == [] and edited.settings["verdict"] is True
    assert check["read_back"] == PROMPT and check["rival_check"]["rival"] == target
    assert check["rival_check"]["kept"] == "rival" and trace["passes"]["check"] == sum(calls) + 2
    assert json.loads(json.dumps(trace)) == trace and trace["forward_passes"] == edited.forward_passes
    _reading(pipe, monkeypatch, [PROMPT], drawn=("read",))
    _, trace = pipe.edit(_scene(ONE)[0], instruction="make the circle blue", text=PROMPT, steps=4)
    assert trace["check"]["parses_to_target"] is False and trace["check"]["rival_check"]["kept"] == "read"
    assert trace["check"]["differences"]
    _reading(pipe, monkeypatch, ["garbled words"], drawn=("rival",))  # a reading that is no scene: not compared
    _, trace = pipe.edit(_scene(ONE)[0], instruction="make the circle blue", text=PROMPT, steps=4)
    assert trace["check"]["parses_to_target"] is False and "rival_check" not in trace["check"]
    _reading(pipe, monkeypatch, [PROMPT], drawn=("rival",))
    monkeypatch.setattr(instructed, "compare_captions", lambda *a: pytest.fail("a redrawn region was compared"))
    for said, extra in (("turn the circle into a square", {"attempts": 1}), ("make the circle blue",
                                                                              {"touch_up": True})):
        _, trace = pipe.edit(_scene(ONE)[0], instruction=said, text=PROMPT, steps=4, **extra)
        assert trace["check"]["parses_to_target"] is False and "rival_check" not in trace["check"]
    _, trace = pipe.edit(PROMPT, instruction="replace 'red' by 'blue'", modality="text")
    assert "rival_check" not in trace["check"]


def test_attempts_draw_from_seeds_no_other_attempt_or_candidate_uses(pipe, monkeypatch):
    from unimodal import instructed

    seeds, real = [], instructed.edit
    monkeypatch.setattr(instructed, "edit", lambda *a, seed, **k: seeds.append(seed) or real(*a, seed=seed, **k))
    _reading(pipe, monkeypatch, [PROMPT])
    _, trace = pipe.edit(_scene(ONE)[0], instruction="turn the circle into a square", text=PROMPT, attempts=2,
                         candidates=2, seed=5, steps=4)
    assert seeds == [5, 7] and trace["plan"]["attempts"]["made"] == 2
    assert trace["plan"]["candidates"]["candidates"] == 2  # the kept attempt's own choice among its candidates


def test_attempts_on_a_drafted_change_or_a_caption_are_said_to_be_unused(pipe):
    _, trace = pipe.edit(_scene(ONE)[0], instruction="make the circle blue", text=PROMPT, attempts=3, steps=4)
    assert trace["plan"]["draft"]["attempts"] == "3 asked, not used: a drafted change is executed once"
    _, trace = pipe.edit(PROMPT, instruction="replace 'red' by 'blue'", modality="text", attempts=2)
    assert trace["plan"]["attempts"] == "2 asked, not used: a caption's splice is exact"


def test_a_redrawn_edit_makes_up_to_the_default_attempts(pipe, monkeypatch):
    from unimodal.checks import EDIT_ATTEMPTS

    _reading(pipe, monkeypatch, [PROMPT])  # never the target: every attempt is made
    _, trace = pipe.edit(_scene(ONE)[0], instruction="turn the circle into a square", text=PROMPT, steps=4)
    assert trace["plan"]["attempts"]["asked"] == trace["plan"]["attempts"]["made"] == EDIT_ATTEMPTS == 4
    _, drafted = pipe.edit(_scene(ONE)[0], instruction="make the circle blue", text=PROMPT, steps=4)
    assert "attempts" not in drafted["plan"]["draft"]  # the default is not reported unused


def test_a_greedy_sampler_makes_one_attempt_and_says_so(pipe, monkeypatch):
    _reading(pipe, monkeypatch, [PROMPT])
    _, trace = pipe.edit(_scene(ONE)[0], instruction="turn the circle into a square", text=PROMPT, attempts=3,
                         steps=4, temperature=0.0, choice_temperature=0.0)
    assert trace["plan"]["attempts"] == "3 asked, one made: this sampler draws the same region every time (greedy)"
    assert trace["passes"]["execute"] == 4


@pytest.mark.parametrize("attempts", [0, 17, True, 2.0])
def test_attempts_out_of_range_are_refused(pipe, attempts):
    with pytest.raises(SettingError, match="attempts must be an int from 1 to 16"):
        pipe.edit(_scene(ONE)[0], instruction="turn the circle into a square", text=PROMPT, attempts=attempts)


def test_without_text_the_picture_is_read_back_by_the_model(pipe, monkeypatch):
    calls = []
    real = pipe.generate

    def reads(**kwargs):
        calls.append(kwargs)
        result = real(**kwargs)
        result.text = PROMPT if len(calls) == 1 else "a small blue circle on the left"
        return result

    monkeypatch.setattr(pipe, "generate", reads)
    _, trace = pipe.edit(_scene(ONE)[0], instruction="make the circle blue", **FAST)
    assert trace["plan"]["read_by"] == "model" and trace["plan"]["read_back"] == PROMPT
    assert trace["passes"]["plan"] > 0 and "image" in calls[0]
    assert trace["check"] == {"read_back": "a small blue circle on the left", "parses_to_target": True,
                              "differences": []}


def test_bad_instructed_edits_are_refused_before_the_edit_runs(pipe, monkeypatch):
    from unimodal import instructed

    monkeypatch.setattr(instructed, "edit", lambda *a, **k: pytest.fail("the edit ran"))
    picture = _scene(ONE)[0]
    with pytest.raises(InputError, match="names the triangle, but the picture shows a small red circle"):
        pipe.edit(picture, instruction="make the triangle blue", text=PROMPT)
    with pytest.raises(InputError, match="not both"):
        pipe.edit(picture, region={"modality": "image", "box": [0, 0, 8, 8]}, instruction="make it blue")
    with pytest.raises(InputError, match="not in the instruction language"):
        pipe.edit(picture, instruction="paint it blue")
    with pytest.raises(InputError, match="edits a caption or speech"):
        pipe.edit(picture, instruction="replace 'red' by 'blue'")
    with pytest.raises(InputError, match="region= .* or instruction="):
        pipe.edit(picture)
    monkeypatch.setattr(pipe, "generate", lambda **k: type("Read", (), {"text": "a red", "forward_passes": 1})())
    with pytest.raises(InputError, match="reads back as 'a red', which states no complete scene"):
        pipe.edit(picture, instruction="make it blue")


def test_a_target_the_model_cannot_read_is_refused_before_the_edit(tiny_model_dir, monkeypatch):
    from unimodal import UniModal, instructed

    short = UniModal.from_pretrained(tiny_model_dir)  # reads at most 12 caption tokens
    monkeypatch.setattr(instructed, "edit", lambda *a, **k: pytest.fail("the edit ran"))
    with pytest.raises(InputError, match="target description 'a small blue circle on the left' is .* at most 12"):
        short.edit(_scene(ONE)[0], instruction="make the circle blue", text=PROMPT)


def test_a_speech_edit_redoes_the_seconds_of_the_word(pipe):
    clip = pipe.generate(text=PROMPT, to="audio", seed=0, max_audio_seconds=1.0, temperature=1.0, steps=4)  # not empty
    edited, trace = pipe.edit(clip, instruction="say 'blue' instead of 'red'", text=PROMPT, **FAST)
    (region,) = trace["plan"]["regions"]
    duration = len(clip.token_ids["audio"]) / pipe.layout.audio_frame_rate
    middle = duration * (PROMPT.index("red") + 1.5) / len(PROMPT)
    assert trace["plan"]["target"] == "a small blue circle on the left"
    assert region["seconds"][0] < middle < region["seconds"][1]
    inside = set(pipe.layout.audio_span_to_positions(*region["seconds"], n_codes=len(clip.token_ids["audio"])).tolist())
    assert _outside(clip.token_ids["audio"], edited.token_ids["audio"], inside) == []
    assert trace["tokens_changed"]["outside"] == 0 and json.loads(json.dumps(trace)) == trace
    assert trace["plan"]["speech_margin"] == 0.4
    _, wider = pipe.edit(clip, instruction="say 'blue' instead of 'red'", text=PROMPT, speech_margin=0.2, **FAST)
    (narrow,) = wider["plan"]["regions"]
    assert wider["plan"]["speech_margin"] == 0.2 and narrow["seconds"][1] - narrow["seconds"][0] <= 0.4 + 1e-9
    assert region["seconds"][0] <= narrow["seconds"][0] and narrow["seconds"][1] <= region["seconds"][1]


def test_a_speech_edit_is_refined_inside_its_stretch_only(pipe, monkeypatch):
    """``refine=N``: the critic's rounds after the edit re-mask codes of the redone stretch alone (none by default).
    The tiny model's confidence critic flags nothing, so the rounds here re-mask at random (ReMDM's baseline),
    which would touch every part of the clip if let."""
    from unimodal import instructed

    clip = pipe.generate(text=PROMPT, to="audio", seed=0, max_audio_seconds=1.0, temperature=1.0, steps=4)
    said = "say 'blue' instead of 'red'"
    unrefined, plain = pipe.edit(clip, instruction=said, text=PROMPT, **FAST)
    assert plain["plan"]["refine"] is None  # no rounds unless asked
    real = instructed.refine_result
    monkeypatch.setattr(instructed, "refine_result", lambda *a, **k: real(*a, critic="random", fraction=0.5, **k))
    edited, trace = pipe.edit(clip, instruction=said, text=PROMPT, refine=2, **FAST)
    summary = trace["plan"]["refine"]
    assert summary["critic"] == "random" and 1 <= summary["rounds_run"] <= 2, summary["stopped"]
    # a round was kept (seeded): the stretch differs from the same edit unrefined, and nothing outside it
    assert summary["rounds_kept"] >= 1 and edited.token_ids["audio"] != unrefined.token_ids["audio"]
    (region,) = trace["plan"]["regions"]
    inside = set(pipe.layout.audio_span_to_positions(*region["seconds"], n_codes=len(clip.token_ids["audio"])).tolist())
    assert _outside(clip.token_ids["audio"], edited.token_ids["audio"], inside) == []
    assert trace["tokens_changed"]["outside"] == 0 and json.loads(json.dumps(trace)) == trace
    assert trace["passes"]["execute"] > plain["passes"]["execute"]  # the rounds' passes are counted
    assert edited.forward_passes == trace["forward_passes"]


def test_refine_after_an_edit_is_checked_and_belongs_to_speech(pipe, monkeypatch):
    from unimodal import instructed

    monkeypatch.setattr(instructed, "edit", lambda *a, **k: pytest.fail("the edit ran"))
    for bad in (-1, 1.5, "two", True):
        with pytest.raises(SettingError, match="refine must be a whole number of rounds"):
            pipe.edit(PROMPT, instruction="say 'blue' instead of 'red'", refine=bad)
    with pytest.raises(InputError, match="refine rounds after an edit review the stretch of speech it redid; this "
                                         "content is image"):
        pipe.edit(_scene(ONE)[0], instruction="make the circle blue", text=PROMPT, refine=1)
    with pytest.raises(InputError, match="this content is text"):  # 0 too: the setting belongs to speech
        pipe.edit(PROMPT, instruction="replace 'small' by 'large'", refine=0)


def test_a_described_edit_refuses_the_instructed_edits_keywords_by_name(pipe, monkeypatch):
    from unimodal import refine

    monkeypatch.setattr(refine, "edit", lambda *a, **k: pytest.fail("the edit ran"))
    region = {"modality": "text", "chars": [2, 7]}
    for key, value in (("refine", 2), ("speech_margin", 0.6), ("attempts", 2), ("draft", False)):
        with pytest.raises(InputError, match=rf"^{key} belongs to an instructed edit \(instruction=...\)"):
            pipe.edit(PROMPT, region=region, text="a large red circle on the left", **{key: value})
    with pytest.raises(InputError, match=r"^attempts, refine belong to an instructed edit"):
        pipe.edit(PROMPT, region=region, text="a large red circle on the left", refine=1, attempts=2)
    # None is each keyword's default: a caller passing every keyword to either kind of edit is not refused
    calls = []
    monkeypatch.setattr(refine, "edit", lambda *a, **k: calls.append(k))
    pipe.edit(PROMPT, region=region, text="a large red circle on the left", refine=None, attempts=None,
              speech_margin=None, draft=None, touch_up=None, seed=3)
    assert calls == [{"text": "a large red circle on the left", "seed": 3}]


def test_speech_margin_is_checked_and_belongs_to_speech(pipe, monkeypatch):
    from unimodal import instructed

    monkeypatch.setattr(instructed, "edit", lambda *a, **k: pytest.fail("the edit ran"))
    for bad in (0, -1, 2.5, float("nan"), "wide", True):
        with pytest.raises(SettingError, match="speech_margin must be a number of seconds"):
            pipe.edit(PROMPT, instruction="say 'blue' instead of 'red'", speech_margin=bad)
    with pytest.raises(InputError, match="speech_margin widens the stretch a speech edit redoes; this content is "
                                         "image"):
        pipe.edit(_scene(ONE)[0], instruction="make the circle blue", text=PROMPT, speech_margin=0.6)


def test_a_caption_edit_splices_the_word_and_keeps_every_other_token(pipe):
    edited, trace = pipe.edit(PROMPT, instruction="replace 'small' by 'large'")
    assert edited.text == "a large red circle on the left"
    assert trace["check"]["parses_to_target"] is True and trace["forward_passes"] == 0
    before = pipe.text_codec.encode_one(PROMPT).tolist()
    (spliced,) = [trace["plan"]["regions"][0]["indices"]]
    after = edited.token_ids["text"]
    assert after[:spliced[0]] == before[:spliced[0]]
    assert after[len(after) - (len(before) - spliced[-1] - 1):] == before[spliced[-1] + 1:]
    assert trace["tokens_changed"]["outside"] == 0 and trace["plan"]["regions"][0]["chars"] == [2, 7]
    edited, _ = pipe.edit(PROMPT, instruction="say 'purple' instead of 'red'")
    assert edited.text == "a small purple circle on the left"


def test_the_edit_command_follows_an_instruction(tiny_caption_model_dir, tmp_path, capsys):
    from PIL import Image

    from unimodal.cli import main

    Image.fromarray(_scene(ONE)[0]).save(tmp_path / "red.png")
    argv = ["edit", "--model", str(tiny_caption_model_dir), "--in", str(tmp_path / "red.png"), "--prompt", PROMPT,
            "--instruction", "make the circle blue", "--out", str(tmp_path / "blue.png"),
            "--trace", str(tmp_path / "edit.json")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "target 'a small blue circle on the left'" in out and (tmp_path / "blue.png").is_file()
    trace = json.loads((tmp_path / "edit.json").read_text())
    assert trace["instruction"]["change"] == {"color": "blue"} and trace["tokens_changed"]["outside"] == 0
    assert trace["plan"]["draft"]["used"] is True
    assert main(argv + ["--no-draft"]) == 0
    assert json.loads((tmp_path / "edit.json").read_text())["plan"].get("draft") is None  # the model redrew it
    capsys.readouterr()
    assert main(argv[:-4] + ["--box", "0,0,8,8", "--out", str(tmp_path / "x.png")]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(argv[:7] + ["--box", "0,0,8,8", "--out", str(tmp_path / "z.png"), "--no-draft"]) == 2
    assert "--no-draft chooses how an instructed picture edit starts" in capsys.readouterr().err
    assert main(argv + ["--speech-margin", "0.6"]) == 2
    assert "--speech-margin widens the stretch an instructed speech edit redoes" in capsys.readouterr().err
    assert main(argv[:8] + ["paint it blue", "--out", str(tmp_path / "y.png")]) == 2
    assert "not in the instruction language" in capsys.readouterr().err and not (tmp_path / "y.png").exists()
