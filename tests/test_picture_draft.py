"""Pixel drafts of instructed picture edits (``unimodal.inference.picture_draft``) on rendered scenes: a colour,
size or place change moves the object's own pixels and nothing else; a new shape has no draft. Checked by pixels
against the renderer's own drawing of the target scene, and by the scene judge where it is installed."""

import copy

import numpy as np
import pytest

from unimodal.core.grammar import COLORS, SIZES
from unimodal.inference.picture_draft import background_colour, coverage_box, draft_picture, object_coverage

ONE = {"objects": [{"shape": "triangle", "color": "red", "size": "small", "position": "left"}], "relation": None}
PAIR = {"objects": [{"shape": "circle", "color": "red", "size": "small"},
                    {"shape": "square", "color": "blue", "size": "large"}], "relation": "left of"}


def _scene(attrs, seed=0):
    from unimodal.training.data.scenes import render_scene

    return render_scene(attrs, np.random.default_rng(seed))


def _core(rgb, attrs, index=0):
    from unimodal.instructed import _half, _side, colour_mask

    return _half(colour_mask(rgb, attrs["objects"][index]["color"]), _side(attrs, index))


def _changed(attrs, **change):
    target = copy.deepcopy(attrs)
    target["objects"][0].update(change)
    return target


def _object_box(rgb, colour):
    """The box of the pixels nearest ``colour`` among the saturated ones (as a judge would find it)."""
    background = background_colour(rgb)
    core = np.abs(rgb.astype(int) - np.array(COLORS[colour])).sum(-1) < 60
    return coverage_box(object_coverage(rgb, core, background)[0])


def test_the_background_is_the_grey_of_the_scene():
    rgb, _ = _scene(ONE)
    grey = background_colour(rgb)
    assert np.ptp(grey) == 0 and 16 <= grey[0] <= 48  # the renderer's background: one grey level in 16..48


def test_a_colour_change_keeps_every_pixel_of_the_silhouette_and_the_rest_of_the_picture():
    rgb, _ = _scene(ONE)
    drafted = draft_picture(rgb, _core(rgb, ONE), ONE["objects"][0], _changed(ONE, color="blue")["objects"][0])
    before, after = (np.abs(x.astype(int) - np.array(COLORS[c])).sum(-1) < 60 for x, c in ((rgb, "red"),
                                                                                       (drafted, "blue")))
    assert before.sum() > 100 and (before == after).all()  # the same solid pixels, now blue
    far = ~np.pad(before, 3)[3:-3, 3:-3]  # well away from the object (edges may blend differently)
    assert np.array_equal(drafted[far & (np.abs(rgb.astype(int) - background_colour(rgb)).sum(-1) == 0)],
                          rgb[far & (np.abs(rgb.astype(int) - background_colour(rgb)).sum(-1) == 0)])


def test_a_size_change_scales_the_object_about_its_centre():
    rgb, _ = _scene(ONE)
    x0, y0, x1, y1 = _object_box(rgb, "red")
    drafted = draft_picture(rgb, _core(rgb, ONE), ONE["objects"][0], _changed(ONE, size="large")["objects"][0])
    a0, b0, a1, b1 = _object_box(drafted, "red")
    scale = SIZES["large"] / SIZES["small"]
    assert abs((a1 - a0) - (x1 - x0) * scale) <= 2 and abs((b1 - b0) - (y1 - y0) * scale) <= 2
    assert abs((a0 + a1) / 2 - (x0 + x1) / 2) <= 1.5 and abs((b0 + b1) / 2 - (y0 + y1) / 2) <= 1.5  # same centre


def test_a_move_puts_the_object_at_the_new_place_and_clears_the_old_one():
    rgb, _ = _scene(ONE)
    drafted = draft_picture(rgb, _core(rgb, ONE), ONE["objects"][0], _changed(ONE, position="right")["objects"][0])
    a0, _, a1, _ = _object_box(drafted, "red")
    assert abs((a0 + a1) / 2 - 48) <= 1.5  # the grammar's right: x = 48
    assert (drafted[:, :28].astype(int).max(-1) - drafted[:, :28].astype(int).min(-1)).max() < 10  # left: grey


def test_in_a_pair_only_the_named_object_changes():
    rgb, _ = _scene(PAIR)
    target = _changed(PAIR, color="green")
    drafted = draft_picture(rgb, _core(rgb, PAIR, 0), PAIR["objects"][0], target["objects"][0])
    blue = lambda x: np.abs(x.astype(int) - np.array(COLORS["blue"])).sum(-1) < 60  # noqa: E731
    assert (blue(rgb) == blue(drafted)).all() and blue(rgb).sum() > 300  # the square untouched


def test_a_new_shape_or_a_missing_object_has_no_draft():
    rgb, _ = _scene(ONE)
    assert draft_picture(rgb, _core(rgb, ONE), ONE["objects"][0], _changed(ONE, shape="circle")["objects"][0]) is None
    nothing = np.zeros((64, 64), bool)
    assert draft_picture(rgb, nothing, ONE["objects"][0], _changed(ONE, color="blue")["objects"][0]) is None


@pytest.mark.parametrize("change", [{"color": "purple"}, {"size": "large"}, {"position": "top"},
                                    {"position": "center"}])
def test_the_scene_judge_reads_the_target_in_every_draft(change):
    judges = pytest.importorskip("unimodal.judges")
    pytest.importorskip("cv2")
    judge = judges.SceneJudge()
    for seed in range(6):
        rgb, _ = _scene(ONE, seed)
        target = _changed(ONE, **change)
        drafted = draft_picture(rgb, _core(rgb, ONE), ONE["objects"][0], target["objects"][0])
        assert judge.score(drafted, target)["correct"], (seed, change)


def test_a_recolour_at_the_canvas_edge_stays_in_place():
    rgb = np.full((64, 64, 3), 30, np.uint8)
    rgb[20:40, 0:19] = COLORS["red"]  # a square cut by the left edge (a picture the renderer would not draw)
    before = {"shape": "square", "color": "red", "size": "small", "position": "left"}
    core = np.abs(rgb.astype(int) - np.array(COLORS["red"])).sum(-1) < 60
    drafted = draft_picture(rgb, core, before, {**before, "color": "blue"})
    assert (drafted[20:40, 0:19] == COLORS["blue"]).all() and (drafted[core == 0] == 30).all()


def test_a_resize_reaches_the_grammars_side_whatever_the_object_measured():
    rgb = np.full((64, 64, 3), 30, np.uint8)
    rgb[22:44, 21:43] = COLORS["red"]  # 22 px: between the grammar's small (18) and large (28)
    before = {"shape": "square", "color": "red", "size": "small", "position": "center"}
    core = np.abs(rgb.astype(int) - np.array(COLORS["red"])).sum(-1) < 60
    drafted = draft_picture(rgb, core, before, {**before, "size": "large"})
    x0, y0, x1, y1 = _object_box(drafted, "red")
    assert abs((x1 - x0) - SIZES["large"]) <= 1 and abs((y1 - y0) - SIZES["large"]) <= 1
