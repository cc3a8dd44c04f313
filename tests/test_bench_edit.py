"""``unimodal bench edit`` at toy size: the instructions it gives, the summary it counts, the command on a tiny
random model (the table printed with its settings, the JSON with every case's row and the summary), and the
refusals that come before any model loads. (The random model will not make the edits right: only the
plumbing is tested.)"""

import json

import pytest

from unimodal.bench_edit import edit_instruction, summarise

ONE = {"objects": [{"shape": "circle", "color": "red", "size": "small", "position": "left"}], "relation": None}
PAIR = {"objects": [{"shape": "circle", "color": "red", "size": "small"},
                    {"shape": "square", "color": "blue", "size": "large"}], "relation": "left of"}


def test_the_instruction_names_the_first_object_and_a_colour_no_object_has():
    from unimodal.core.grammar import COLORS

    free = [c for c in COLORS if c != "red"]
    assert [edit_instruction(ONE, k) for k in (0, 1)] == [f"make the circle {free[0]}", f"make the circle {free[1]}"]
    assert edit_instruction(ONE, len(free)) == edit_instruction(ONE, 0)  # cyclic over the free colours
    pair = [edit_instruction(PAIR, k) for k in range(len(COLORS))]
    assert all(p.startswith("make the red circle ") and p.split()[-1] not in ("red", "blue") for p in pair)


def test_a_picture_edit_may_ask_for_another_size_shape_or_place():
    from unimodal.bench_edit import edit_cases

    assert edit_instruction(ONE, 0, change="size") == "make the circle large"
    assert edit_instruction(PAIR, 0, change="size") == "make the red circle large"
    shapes = {edit_instruction(PAIR, k, change="shape") for k in range(4)}
    assert shapes == {"turn the red circle into a triangle", "turn the red circle into a cross"}  # none it has
    places = [edit_instruction(ONE, k, change="position") for k in range(4)]
    assert len(set(places)) == 4 and "move the circle to the left" not in places  # it is on the left
    cases = [type("Case", (), {"truth": t})() for t in (ONE, PAIR, ONE)]
    assert len(edit_cases(cases, "position")) == 2 and len(edit_cases(cases, "shape")) == 3  # moves: one object
    with pytest.raises(Exception, match="changes one of"):
        edit_cases(cases, "mood")


def test_speech_and_caption_instructions_replace_the_first_objects_colour_word():
    from unimodal.core.grammar import COLORS

    new = [c for c in COLORS if c != "red"][0]
    assert edit_instruction(ONE, 0, "audio") == f"say '{new}' instead of 'red'"
    assert edit_instruction(ONE, 0, "text") == f"replace 'red' by '{new}'"


def test_caption_edits_are_spliced_and_judged_by_the_grammar(tiny_caption_model_dir, tmp_path, capsys):
    """A caption edit needs no model call: the word is spliced in, every other token kept, and the edited caption
    states the target scene (on any model, the tiny random one included)."""
    report, out = bench_edit(capsys, tiny_caption_model_dir, tmp_path / "bench", "--n", "3", "--modality", "text")
    assert report["modality"] == "text" and report["sampler"] == {}
    summary = report["summary"]["all"]
    assert summary["judged_right"] == summary["source_judged_right"] == 3 and summary["outside_changed"] == 0
    assert summary["mean_forward_passes"] == 0 and "replace '<colour>' by '<new colour>'" in out
    assert all(r["regions"][0][1] > r["regions"][0][0] for r in report["rows"])  # the word's characters


def test_speech_edits_run_through_the_speech_judge(tiny_caption_model_dir, tmp_path, capsys):
    pytest.importorskip("faster_whisper")
    report, out = bench_edit(capsys, tiny_caption_model_dir, tmp_path / "bench", "--n", "1", "--modality", "audio",
                             "--speech-margin", "0.25")
    row = report["rows"][0]
    assert report["modality"] == "audio" and set(report["sampler"]) == {"regeneration", "read_back"}
    assert report["speech_margin"] == 0.25 and "0.25 s redone either side of the word" in out
    assert report["refine_rounds"] == 0 and row.get("refine") is None  # none unless asked
    assert row.get("refused") or row["regions"][0][1] - row["regions"][0][0] <= 0.5 + 1e-9
    assert row.get("refused") or (row["outside_changed"] == 0 and len(row["regions"][0]) == 2)
    assert isinstance(row["source_heard"], str) and (row.get("refused") or isinstance(row["heard"], str))
    assert "transcribed by the speech judge" in out and "spoken in the varied voices" in out
    clear, out = bench_edit(capsys, tiny_caption_model_dir, tmp_path / "clear", "--n", "1", "--modality", "audio",
                            "--speech-margin", "0.25", "--voices", "clear")
    assert clear["voices"] == "clear" and "spoken in the clear voices" in out
    assert clear["rows"][0]["caption"] == row["caption"]  # the same scene and caption, another voice
    rounds, out = bench_edit(capsys, tiny_caption_model_dir, tmp_path / "rounds", "--n", "1", "--modality", "audio",
                             "--refine-rounds", "1")
    assert rounds["refine_rounds"] == 1 and "refined inside it for up to 1 round(s)" in out
    assert rounds["rows"][0].get("refused") or rounds["rows"][0]["refine"]["critic"] == "confidence"
    assert rounds["rows"][0].get("refused") or "refined inside it for up to 1 round(s) by the confidence critic" in out
    code, _, err = run(capsys, "bench", "compare", tmp_path / "bench", tmp_path / "clear")
    assert code == 2 and "share no direction" in err  # other voices: other cases, not paired


def test_a_library_caller_s_bad_setting_is_raised_before_any_case():
    """bench_edit() from Python: attempts, candidates and the rounds out of range raise (a SettingError) before a
    case runs, not recorded as every case refused by the plan."""
    from unimodal.bench_edit import bench_edit as run_bench
    from unimodal.core.errors import SettingError

    class NoModel:
        def edit(self, *args, **kwargs):
            pytest.fail("an edit ran")

    for settings, message in (({"attempts": 99}, "attempts must be an int from 1 to 16"),
                              ({"candidates": 0}, "candidates must be an int from 1 to 64"),
                              ({"modality": "audio", "refine": 40}, "--refine-rounds must be a whole number")):
        with pytest.raises(SettingError, match=message):
            run_bench(NoModel(), [object()], judge=object(), progress=False, **settings)


def test_the_summary_counts_each_group():
    row = dict(judged_right=False, asked_right=True, verdict=False, source_judged_right=True, outside_changed=0,
               passes=10)
    rows = [{**row, "objects": 1, "judged_right": True}, {**row, "objects": 1}, {**row, "objects": 2, "passes": 20,
                                                                                  "refused": "ambiguous"}]
    summary = summarise(rows)
    assert summary["all"]["n"] == 3 and summary["one object"]["judged_right"] == 1
    assert summary["one object"]["judged_right_share"] == 0.5 and summary["pairs"]["asked_right"] == 1
    assert summary["all"]["refused"] == 1 and summary["all"]["mean_forward_passes"] == pytest.approx(40 / 3)
    # the self-check agrees with the judge where both say right or both say wrong: rows 2 and 3 (neither right)
    assert summary["all"]["verdict_agrees"] == 2 and summary["one object"]["verdict_agrees_share"] == 0.5


def test_bench_compare_pairs_two_edit_reports_case_by_case(tmp_path, capsys):
    from unimodal.bench_edit import save_report

    def report(rights, captions=("a red circle", "a blue square", "a red cross")):
        rows = [dict(caption=c, objects=1, judged_right=r, asked_right=r, verdict=True, source_judged_right=True,
                     outside_changed=0, passes=10) for c, r in zip(captions, rights)]
        return {"n": len(rows), "seed": 0, "modality": "audio", "split": "test", "model_hash": "h",
                "summary": summarise(rows), "rows": rows}

    save_report(report([True, False, False]), tmp_path / "old")
    save_report(report([True, True, True]), tmp_path / "new")
    (tmp_path / "new" / "bench_edit.json").rename(tmp_path / "new" / "renamed_n3.json")  # a copy kept in docs/
    code, out, err = run(capsys, "bench", "compare", tmp_path / "old", tmp_path / "new" / "renamed_n3.json",
                         "--out", tmp_path / "cmp.json")
    assert code == 0, err
    row = json.loads((tmp_path / "cmp.json").read_text())["directions"]["edit audio: judged right"]
    assert (row["reference"], row["candidate"]) == (pytest.approx(1 / 3), 1.0)
    assert row["difference"]["mean"] == pytest.approx(2 / 3) and "edit audio: judged right" in out
    agrees = json.loads((tmp_path / "cmp.json").read_text())["directions"]["edit audio: verdict agrees"]
    assert (agrees["reference"], agrees["candidate"]) == (pytest.approx(1 / 3), 1.0)  # verdict True on every row
    save_report(report([True, True, True], ("a red circle", "a green square", "a red cross")), tmp_path / "other")
    code, _, err = run(capsys, "bench", "compare", tmp_path / "old", tmp_path / "other")
    assert code == 2 and "captions differ" in err  # other cases: refused, not paired
    picture = {**report([True, True, True]), "modality": "image", "change": "colour"}
    save_report(picture, tmp_path / "picture")
    code, _, err = run(capsys, "bench", "compare", tmp_path / "old", tmp_path / "picture")
    assert code == 2 and "share no direction" in err  # a picture edit is not a speech edit


def run(capsys, *argv):
    from unimodal.cli import main

    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit:  # argparse refuses a flag's value itself: exit status 2, the message on stderr
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


def bench_edit(capsys, model, folder, *flags):
    """``unimodal bench edit`` that must succeed: its report (``folder/bench_edit.json``) and what it printed."""
    code, out, err = run(capsys, "bench", "edit", "--model", model, *flags, "--out", folder)
    assert code == 0, err
    return json.loads((folder / "bench_edit.json").read_text()), out


def test_bench_edit_command_prints_the_table_and_writes_every_row(tiny_caption_model_dir, tmp_path, capsys):
    pytest.importorskip("cv2")
    report, out = bench_edit(capsys, tiny_caption_model_dir, tmp_path / "bench", "--n", "2", "--seed", "3")
    assert report["n"] == 2 and report["seed"] == 3 and report["split"] == "test" and len(report["model_hash"]) == 16
    assert set(report["summary"]) == {"all", "one object", "pairs"}
    assert {"judged_right", "asked_right", "verdict", "source_judged_right", "outside_changed",
            "mean_forward_passes", "refused"} <= set(report["summary"]["all"])
    assert [r["seed"] for r in report["rows"]] == [3, 4] and all(r["instruction"].startswith("make the ")
                                                                 for r in report["rows"])
    # the plan reads the real picture and caption, not the model: none of these cases is refused, so the contract
    # below is measured on edits made (a refused row counts no code changed)
    assert report["summary"]["all"]["refused"] == 0
    assert report["summary"]["all"]["outside_changed"] == 0  # the edit's contract, on any model
    assert "judged right" in out and "all (2)" in out and "seed 3" in out and report["model_hash"] in out
    assert str(tmp_path / "bench" / "bench_edit.json") in out
    assert not [p for p in (tmp_path / "bench").iterdir() if p.name != "bench_edit.json"]  # no temporary left
    assert report["candidates"] == 1 and "1 candidate(s) per edit" in out
    assert report["change"] == "colour" and report["draft"] is True and "pixels drafted" in out
    assert all(r["draft"]["used"] for r in report["rows"])


def test_bench_edit_with_candidates_records_each_cases_choice(tiny_caption_model_dir, tmp_path, capsys):
    pytest.importorskip("cv2")
    report, out = bench_edit(capsys, tiny_caption_model_dir, tmp_path / "bench", "--n", "1", "--candidates", "2",
                             "--no-draft")
    assert report["candidates"] == 2 and "2 candidate(s) per edit" in out and report["draft"] is False
    assert "redrawn by the model from the target caption (no pixel draft)" in out
    row = report["rows"][0]
    assert not row.get("refused") and row["candidates"]["candidates"] == 2 and len(row["candidates"]["agreement"]) == 2
    code, _, err = run(capsys, "bench", "edit", "--model", tiny_caption_model_dir, "--candidates", "0",
                       "--out", tmp_path / "b2")
    assert code == 2 and "--candidates" in err
    code, _, err = run(capsys, "bench", "edit", "--model", tiny_caption_model_dir, "--candidates", "65",
                       "--out", tmp_path / "b3")
    assert code == 2 and "--candidates must be a whole number from 1 to 64" in err
    assert not (tmp_path / "b3").exists()  # refused before any case is edited


def test_bench_edit_with_attempts_records_each_cases_attempts(tiny_caption_model_dir, tmp_path, capsys):
    pytest.importorskip("cv2")
    report, out = bench_edit(capsys, tiny_caption_model_dir, tmp_path / "bench", "--n", "1", "--change", "shape",
                             "--attempts", "2")
    assert report["attempts"] == 2 and "at most 2 attempt(s) until it reads back as asked" in out
    row = report["rows"][0]
    assert not row.get("refused") and row["attempts"]["asked"] == 2 and 1 <= row["attempts"]["made"] <= 2
    assert row["verdict"] == row["attempts"]["parses_to_target"][row["attempts"]["kept"]]


def test_bench_edit_refuses_bad_input_before_the_model_loads(tiny_caption_model_dir, tmp_path, capsys, monkeypatch):
    import unimodal.serve

    monkeypatch.setattr(unimodal.serve, "load_pipeline", lambda *a, **k: pytest.fail("the model was loaded"))
    model = ["--model", tiny_caption_model_dir]
    code, _, err = run(capsys, "bench", "edit", *model, "--n", "0", "--out", tmp_path / "a")
    assert code == 2 and "--n must be a positive whole number" in err and not (tmp_path / "a").exists()
    (tmp_path / "file").write_text("x")
    code, _, err = run(capsys, "bench", "edit", *model, "--n", "2", "--out", tmp_path / "file")
    assert code == 2 and "is a file" in err
    code, _, err = run(capsys, "bench", "edit", *model, "--n", "2", "--out", tmp_path / "file" / "sub")
    assert code == 2 and "is a file" in err
    code, _, err = run(capsys, "bench", "edit", *model, "--n", "2", "--seed", "-1", "--out", tmp_path / "b")
    assert code == 2 and "--seed" in err
    code, _, err = run(capsys, "bench", "edit", "--model", tmp_path / "nothing", "--n", "2", "--out", tmp_path / "c")
    assert code == 2 and "does not exist" in err and not (tmp_path / "c").exists()
    code, _, err = run(capsys, "bench", "edit", *model, "--modality", "text", "--change", "size",
                       "--out", tmp_path / "d")
    assert code == 2 and "--change size edits pictures" in err and not (tmp_path / "d").exists()
    code, _, err = run(capsys, "bench", "edit", *model, "--modality", "audio", "--no-draft", "--out", tmp_path / "e")
    assert code == 2 and "--no-draft edits pictures" in err
    code, _, err = run(capsys, "bench", "edit", *model, "--no-draft", "--touch-up", "--out", tmp_path / "f")
    assert code == 2 and "--touch-up reviews a pixel draft" in err and not (tmp_path / "f").exists()
    code, _, err = run(capsys, "bench", "edit", *model, "--speech-margin", "0.6", "--out", tmp_path / "g")
    assert code == 2 and "--speech-margin widens the stretch a speech edit redoes; image edits" in err
    code, _, err = run(capsys, "bench", "edit", *model, "--refine-rounds", "2", "--out", tmp_path / "g")
    assert code == 2 and "--refine-rounds reviews the stretch a speech edit redid; image edits" in err
    for bad in ("-1", "33", "two"):
        code, _, err = run(capsys, "bench", "edit", *model, "--modality", "audio", "--refine-rounds", bad,
                           "--out", tmp_path / "g")
        assert code == 2 and "--refine-rounds must be a whole number from 0 (none) to 32" in err
    for bad in ("0", "17", "two"):
        code, _, err = run(capsys, "bench", "edit", *model, "--attempts", bad, "--out", tmp_path / "h")
        assert code == 2 and "--attempts must be a whole number from 1 to 16" in err and not (tmp_path / "h").exists()
    for bad in ("0", "2.5", "nan", "soon"):
        code, _, err = run(capsys, "bench", "edit", *model, "--modality", "audio", "--speech-margin", bad,
                           "--out", tmp_path / "h")
        assert code == 2 and "--speech-margin must be a number" in err and not (tmp_path / "h").exists()
    code, _, err = run(capsys, "bench", "edit", *model, "--voices", "clear", "--out", tmp_path / "i")
    assert code == 2 and "only speech edits" in err and not (tmp_path / "i").exists()
    code, _, err = run(capsys, "bench", "edit", *model, "--modality", "audio", "--voices", "loud",
                       "--out", tmp_path / "j")
    assert code == 2 and "--voices must be one of" in err and not (tmp_path / "j").exists()
