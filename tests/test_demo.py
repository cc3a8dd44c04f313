"""``unimodal demo`` on a tiny random model: the page links only files that exist, every direction has its
section, the refine loop is shown round by round, the instructed edits with their regions and verdicts, and a
bad ``--out`` is refused before any model loads."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from unimodal.cli import main
from unimodal.demo import DIRECTIONS, EDITS, REFINE_ROUNDS, REPAIR_INDEX, REPAIR_SPLIT, run_demo, summary_line
from unimodal.demo_page import slug


class _Links(HTMLParser):
    """Every src / href and every element id of a page."""

    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.links += [attrs[key] for key in ("src", "href") if attrs.get(key)]
        if attrs.get("id"):
            self.ids.add(attrs["id"])


@pytest.fixture(scope="module")
def demo_page(tiny_caption_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "page"
    # the tiny model reads 1 s of speech: the demo's spoken caption (1.7 s) is cut, and the user is told
    with pytest.warns(UserWarning, match=r"audio is 1\.\d s; the model reads its first 1\.0 s"):
        page, summary = run_demo(out, model=tiny_caption_model_dir, judge_speech=False, quiet=True)
    return page, summary


def test_every_linked_file_exists_and_every_direction_has_its_section(demo_page):
    page, _ = demo_page
    parser = _Links()
    parser.feed(page.read_text(encoding="utf-8"))
    assert parser.links, "the page links no files"
    missing = [link for link in parser.links if not (page.parent / link).is_file()]
    assert not missing, f"linked but not written: {missing}"
    assert {slug(d) for d in DIRECTIONS} | {"refine", "repair", "edits"} <= parser.ids
    kinds = {Path(link).suffix for link in parser.links}
    assert {".png", ".wav", ".txt", ".json"} <= kinds  # pictures, speech players, captions, the summary


def test_summary_counts_the_verdicts_and_names_what_was_not_judged(demo_page):
    page, summary = demo_page
    assert json.loads((page.parent / "summary.json").read_text()) == summary
    assert set(summary["directions"]) == set(DIRECTIONS)
    counts = summary["counts"]
    assert counts["judged"] + counts["not_judged"] == len(DIRECTIONS)
    assert counts["not_judged"] >= 2  # text->audio and image->audio: speech judging was switched off
    assert any("speech was not judged" in note for note in summary["notes"])
    # the loop ran, never past its rounds (it stops early when a round is not kept), or said why it ran none
    refine = summary["refine"]
    assert len(refine["trace"]) <= REFINE_ROUNDS and refine["stopped"] in ("rounds", "nothing flagged", "no improvement")
    assert refine["trace"] or (refine["stopped"] == "nothing flagged" and "No round ran (nothing flagged)"
                                                                          in page.read_text(encoding="utf-8"))
    assert refine["trace"] or f"refine: no round ({refine['stopped']})" in summary_line(summary)
    assert f"{counts['right']} of {counts['judged']} judged outputs right" in summary_line(summary)


def test_the_instructed_edits_of_the_input_picture_are_shown_and_judged(demo_page):
    page, summary = demo_page
    edits = summary["edits"]
    assert edits["n"] == len(EDITS) == len(edits["trace"]) and [e["instruction"] for e in edits["trace"]] == list(EDITS)
    for record in edits["trace"]:  # the tiny model reads nothing right, but the plan takes the caption as given
        assert record["drafted"] is True and record["outside_changed"] == 0
        assert record["target"] in ("a large red square in the center", "a large blue square on the left")
        assert (page.parent / record["after"]).is_file() and (page.parent / record["planned"]).is_file()
    from unimodal.demo import scene_judge_status

    judged = scene_judge_status() is None  # the tiny model's untrained codec blurs the draft: verdicts vary
    assert edits["judged"] == (len(EDITS) if judged else 0) and edits["right"] <= edits["judged"]
    expected = f"edits: {edits['right']} of {len(EDITS)} judged right" if judged else f"edits: {len(EDITS)} not judged"
    assert expected in summary_line(summary)
    assert "make the square red" in page.read_text(encoding="utf-8")


def test_cli_demo_refuses_an_out_that_is_a_file(tmp_path, capsys):
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder")
    assert main(["demo", "--out", str(blocker), "--quiet"]) == 2
    assert "is a file" in capsys.readouterr().err


def test_cli_demo_refuses_an_out_it_cannot_create(tmp_path, capsys):
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder")
    assert main(["demo", "--out", str(blocker / "below"), "--quiet"]) == 2
    assert "cannot write the demo" in capsys.readouterr().err


def test_the_held_out_request_is_drawn_read_back_and_repaired(demo_page):
    from unimodal.eval_cases import load_cases

    page, summary = demo_page
    repair = summary["repair"]
    request = load_cases("scenes", split=REPAIR_SPLIT, n=REPAIR_INDEX + 1, speech=False)[0][REPAIR_INDEX].text
    assert repair["request"] == request and request in page.read_text(encoding="utf-8")
    assert (page.parent / repair["drawn"]).is_file() and (page.parent / repair["repaired"]).is_file()
    # the tiny model reads nothing as a scene: nothing is changed, and the page says why
    assert repair["edits"] or repair["why"] in page.read_text(encoding="utf-8")
    assert all(set(e) >= {"instruction", "kept"} for e in repair["edits"]) and repair["forward_passes"] > 0
    kept = sum(e["kept"] for e in repair["edits"])
    assert f"repair: {kept} edit{'s' if kept != 1 else ''}, drawn " in summary_line(summary)
