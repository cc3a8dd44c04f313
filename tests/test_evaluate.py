"""unimodal eval and bench versus-ar: the metric functions on hand-made cases, then the commands end to end."""

import dataclasses
import json
from pathlib import Path
import re

import numpy as np
import pytest

from unimodal.inference.evaluate import (EvalCase, Judges, caption_correct, evaluate, format_table,
                                         joint_consistency, judge_image, model_hash, objects_alike,
                                         summarize)
from unimodal.judges import word_error_rate, word_errors
from unimodal.training.data.scenes import make_sample
from unimodal.cli import main
from unimodal.core.errors import InputError
from unimodal.eval_cases import load_cases
from unimodal.core.grammar import COLORS


@pytest.fixture(scope="module")
def judges():
    return Judges()


@pytest.fixture(scope="module")
def caption_model(tiny_codec_dir, tmp_path_factory):
    """A random tiny model whose text segment holds whole captions (the shared tiny model reads 12 tokens)."""
    from conftest import write_tiny_model

    return write_tiny_model(tiny_codec_dir, tmp_path_factory.mktemp("caption-model") / "model", max_text_len=40)


def _scene_case(index=0):
    sample = make_sample(0, 2, index, False, speech=False)
    return EvalCase("scene", sample.text, sample.image, None, sample.meta["attributes"])


def _single_object_case():
    return next(c for c in map(_scene_case, range(40)) if len(c.truth["objects"]) == 1)


def test_a_judged_correct_image_counts_and_a_wrong_colour_does_not(judges):
    case = _single_object_case()
    right = judge_image(case, case.image, judges.scene)
    assert right["correct"] and right["color"] and right["shape"] and right["position"]
    color = case.truth["objects"][0]["color"]
    other = next(name for name in COLORS if name != color)
    recolored = case.image.copy()
    object_pixels = np.abs(recolored.astype(int) - np.array(COLORS[color])).sum(-1) < 60
    recolored[object_pixels] = COLORS[other]
    wrong = judge_image(case, recolored, judges.scene)
    assert not wrong["correct"] and not wrong["color"] and wrong["shape"]


def test_digit_and_caption_judgements(judges):
    digits, _ = load_cases("digits", "test", 3, speech=False)
    for case in digits:
        # the judge reads the test split's own digits right (these three among them), and the same picture
        # under another digit's truth as wrong
        assert judge_image(case, case.image, digit_judge=judges.digit) == {"correct": True}
        other = dataclasses.replace(case, truth=(case.truth + 1) % 10)
        assert judge_image(other, case.image, digit_judge=judges.digit) == {"correct": False}
        assert caption_correct(case, case.text) is True
        assert caption_correct(case, "the digit " + ("one" if case.truth != 1 else "two")) is False
    scene = _single_object_case()
    assert caption_correct(scene, scene.text) is True
    assert caption_correct(scene, "") is False and caption_correct(scene, "a purple elephant") is False
    assert caption_correct(EvalCase("other", "hi", None, None, None), "hi") is None


def test_word_error_rate_of_known_strings():
    assert word_error_rate("a red circle", "a red circle") == 0.0
    assert word_error_rate("a red circle", "a blue circle") == pytest.approx(1 / 3)
    assert word_error_rate(["a red circle", "the digit seven"], ["a red", "the digit 7"]) == pytest.approx(1 / 6)


def test_word_errors_per_pair_sum_to_the_corpus_wer():
    refs, hyps = ["a red circle", "the digit seven", "a large blue square"], ["a red", "the digit 7", ""]
    rows = word_errors(refs, hyps)
    assert rows == [[1, 3], [0, 3], [4, 4]]
    assert sum(e for e, _ in rows) / sum(n for _, n in rows) == pytest.approx(word_error_rate(refs, hyps))
    with pytest.raises(InputError, match="as many hypotheses"):
        word_errors(refs, hyps[:2])


def test_paired_wer_difference_resamples_cases_together():
    from unimodal.inference.evaluate import paired_wer_difference

    reference = [[1, 4], [2, 4], [0, 4], [4, 4]] * 25  # WER 0.4375
    better = [[0, 4], [1, 4], [0, 4], [3, 4]] * 25     # each case one error fewer or none: WER 0.25
    diff = paired_wer_difference(better, reference)
    assert diff["mean"] == pytest.approx(0.25 - 0.4375) and diff["cases"] == 100
    assert diff["ci95"][0] <= diff["mean"] <= diff["ci95"][1] < 0  # lower beyond the interval
    same = paired_wer_difference(reference, reference)
    assert same["mean"] == 0 and same["ci95"] == [0.0, 0.0]
    assert paired_wer_difference(None, reference) is None and paired_wer_difference(better[:3], reference) is None


def test_joint_consistency_needs_all_three_to_agree(judges):
    case = _single_object_case()
    agree = joint_consistency(case.text, case.image, case.text, judges.scene, judges.digit)
    assert agree["consistent"] and agree["kind"] == "scene"
    other_words = "a large purple cross at the top"
    assert other_words != case.text
    mismatch = joint_consistency(case.text, case.image, other_words, judges.scene, judges.digit)
    assert mismatch["image_matches_text"] and not mismatch["audio_matches_text"] and not mismatch["consistent"]
    nonsense = joint_consistency("zzz", case.image, case.text, judges.scene, judges.digit)
    assert not nonsense["text_parses"] and not nonsense["consistent"]


def test_summaries_count_rates_and_wer():
    class Result:
        forward_passes = 4

    cases = [_scene_case(i) for i in range(2)]
    scores = [{"correct": True, "text": cases[0].text}, {"correct": False, "text": "a red circle"}]
    summary = summarize("image->text", cases, [Result(), Result()], scores, wall=0.5)
    assert summary["accuracy"] == 0.5 and summary["by_kind"]["scene"]["n"] == 2 and summary["forward_passes"] == 4
    assert 0 < summary["wer"] <= 1
    errors = summary["word_errors"]  # per case, in case order: the corpus WER from their sums
    assert len(errors) == 2 and errors[0][0] == 0 and errors[1][0] > 0
    assert sum(e for e, _ in errors) / sum(n for _, n in errors) == pytest.approx(summary["wer"])
    assert "word_errors" not in summary["by_kind"]["scene"]
    # scenes of one object and of two, told apart (the first test scene is a pair, the second one object)
    assert [len(c.truth["objects"]) for c in cases] == [2, 1]
    alike = summary["by_objects"]["2"].pop("alike")  # the pair read as its scene: as alike as the scene's objects
    assert alike["captions"] == 1 and alike["read"] == alike["truth"]
    assert summary["by_objects"] == {"1": {"n": 1, "accuracy": 0.0}, "2": {"n": 1, "accuracy": 1.0}}
    digit = EvalCase("digit", "the digit seven", None, None, 7)
    assert "by_objects" not in summarize("image->text", [digit], [Result()], scores[:1], wall=0.5)
    table = format_table({"figures": {"image->text": summary}, "reference": {}, "seed": 0, "settings": {}})
    assert "1 obj" in table and "2 obj" in table


def test_two_object_readings_say_how_alike_their_objects_are_against_the_scenes():
    """A reader that lets one object's attributes bleed onto the other names two objects more alike than the
    scenes show: the figure that tells that error from a relation read the wrong way round."""
    class Result:
        forward_passes = 4

    truth = {"objects": [{"shape": "circle", "color": "yellow", "size": "small"},
                         {"shape": "cross", "color": "green", "size": "small"}], "relation": "below"}
    case = EvalCase("scene", "a small yellow circle below a small green cross", None, None, truth)
    single = _single_object_case()
    readings = ["a small green cross above a small green cross",  # bled: the two objects the same, 3 of 3 shared
                "a small green cross above a small yellow circle",  # the relation turned around: 1 shared, as in truth
                "a small yellow circle"]  # not two objects: left out
    scores = [{"correct": False, "text": t} for t in readings]
    summary = summarize("image->text", [case, case, case, single], [Result()] * 4, scores + [{"correct": True,
                        "text": single.text}], wall=0.5)
    assert summary["by_objects"]["2"]["alike"] == {"captions": 2, "read": 2.0, "truth": 1.0}
    assert "alike" not in summary["by_objects"]["1"]
    table = format_table({"figures": {"image->text": summary}, "reference": {}, "seed": 0, "settings": {}})
    assert "alike=2.00 (scenes 1.00)" in table
    drawn = summarize("text->image", [case], [Result()], [{"correct": False}], wall=0.5)  # only captions read
    assert "alike" not in drawn["by_objects"]["2"]
    assert objects_alike([single], [{"text": single.text}]) is None


def test_joint_summary_says_what_the_captions_from_nothing_were():
    """A collapse of captions from nothing (one template for every seed) shows in the figures, not only in samples."""
    class Result:
        forward_passes = 9

    def joint(text, kind, consistent):
        return {"kind": kind, "text_parses": kind is not None, "image_matches_text": consistent,
                "audio_matches_text": consistent, "consistent": consistent, "text": text}

    scores = [joint("a small red circle on the left", "scene", True), joint("a handwritten 3", "digit", False),
              joint("a handwritten 3", "digit", True), joint("a large blue cross above a small red square", "scene",
                                                              False), joint("zzz", None, False)]
    summary = summarize("joint", [None] * 5, [Result()] * 5, scores, wall=1.0)
    assert summary["distinct_texts"] == 4 / 5 and summary["consistent"] == 2 / 5
    assert {k: v["n"] for k, v in summary["by_kind"].items()} == {"scene": 2, "digit": 2, "None": 1}
    assert summary["by_kind"]["digit"]["consistent"] == 0.5
    assert summary["by_objects"] == {"1": {"n": 1, **{k: 1.0 for k in ("text_parses", "image_matches_text",
                                                                        "audio_matches_text", "consistent")}},
                                     "2": {"n": 1, "text_parses": 1.0, "image_matches_text": 0.0,
                                           "audio_matches_text": 0.0, "consistent": 0.0}}
    table = format_table({"figures": {"joint": summary}, "reference": {}, "seed": 0, "settings": {}})
    assert "distinct_texts=0.800" in table and "digit" in table and "2 obj" in table


def test_load_cases_checks_its_input(tmp_path):
    with pytest.raises(InputError, match="--split"):
        load_cases("scenes", "train", 2)
    with pytest.raises(InputError, match="neither"):
        load_cases("/nonexistent/folder", "test", 2)
    (tmp_path / "mine.jsonl").write_text('{"text": "a red circle"}\n')
    with pytest.raises(InputError, match="is a manifest of your own data: eval judges scenes and digits.*validation "
                                         "loss"):
        load_cases(str(tmp_path / "mine.jsonl"), "test", 2)
    cases, notes = load_cases("scenes,digits", "heldout", 2, speech=False)
    assert len(cases) == 2 and notes and all(c.kind == "scene" for c in cases)
    with pytest.raises(InputError, match="--voices must be one of"):
        load_cases("scenes", "test", 2, voices="loud")
    with pytest.raises(InputError, match="built folder"):
        load_cases(str(Path(__file__).parent), "test", 2, voices="clear")


def test_cases_in_clear_voices_are_the_same_scenes_spoken_otherwise():
    """--voices clear: the same scenes, pictures and captions as the default cases, only the speech differs."""
    varied, _ = load_cases("scenes,digits", "test", 2)
    clear, _ = load_cases("scenes,digits", "test", 2, voices="clear")
    assert [c.text for c in clear] == [c.text for c in varied] and [c.truth for c in clear] == [c.truth for c in varied]
    assert all(np.array_equal(a.image, b.image) for a, b in zip(clear, varied))
    assert all(a.audio is not None and b.audio is not None for a, b in zip(clear, varied))
    assert any(len(a.audio) != len(b.audio) or not np.allclose(a.audio, b.audio) for a, b in zip(clear, varied))


def test_eval_command_end_to_end_is_reproducible(caption_model, tmp_path, capsys):
    args = ["eval", "--model", str(caption_model), "--data", "scenes", "--n", "2", "--directions",
            "text->image,image->text,text->audio,joint", "--steps", "4"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    table = capsys.readouterr().out
    assert "text->image" in table and "joint" in table and "speech_judge_wer" in table
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    first = json.loads((tmp_path / "a" / "eval.json").read_text())
    second = json.loads((tmp_path / "b" / "eval.json").read_text())
    assert _same_but_time(first, second)
    assert first["model_hash"] == model_hash(caption_model) and first["settings"] == {"steps": 4}
    from unimodal.core.provenance import code_version
    assert first["code"] == code_version()  # which code measured it
    for name in ("grid_text_to_image.png", "grid_image_to_text.png", "grid_joint.png", "text_to_audio_0.wav"):
        assert (tmp_path / "a" / name).is_file(), name
    for direction, figure in first["figures"].items():  # per-case verdicts, for paired comparisons
        assert len(figure["verdicts"]) == figure["n"] and set(figure["verdicts"]) <= {0, 1, None}, direction
        assert len(first["samples"][direction]) == figure["n"], direction  # every case's scores, not a grid's
    assert all(s["caption"] and "transcript" in s for s in first["samples"]["text->audio"])
    assert all("text" in s for s in first["samples"]["image->text"])
    capsys.readouterr()
    assert main(["bench", "compare", str(tmp_path / "a"), str(tmp_path / "b" / "eval.json"),
                 "--out", str(tmp_path / "cmp.json")]) == 0
    out = capsys.readouterr().out
    comparison = json.loads((tmp_path / "cmp.json").read_text())
    assert set(comparison["directions"]) == set(first["figures"]) and "paired difference" in out
    assert all(r["difference"] is None or r["difference"]["mean"] == 0 for r in comparison["directions"].values())
    for direction in ("image->text", "text->audio"):  # the word error rate paired case by case too
        wer = comparison["directions"][direction]["wer"]
        assert wer["reference"] == first["figures"][direction]["wer"] and wer["difference"]["mean"] == 0
    assert "wer" not in comparison["directions"]["text->image"]
    assert re.search(r"^  WER .* within the noise$", out, re.M)


def test_sign_test_is_exact_and_two_sided():
    from unimodal.inference.evaluate import sign_test

    assert sign_test(7, 1) == pytest.approx(2 * 9 / 256) and sign_test(1, 7) == sign_test(7, 1)
    assert sign_test(0, 0) == 1.0 and sign_test(4, 4) == 1.0 and sign_test(10, 0) == pytest.approx(2 / 1024)


def test_compare_refuses_reports_of_different_cases(tmp_path, capsys):
    from unimodal.inference.evaluate import compare_reports, format_comparison

    figure = {"accuracy": 0.5, "verdicts": [1, 0]}
    base = {"figures": {"text->image": figure}, "data": "scenes", "split": "test", "n_per_data_set": 2, "seed": 0}
    better = {**base, "figures": {"text->image": {"accuracy": 1.0, "verdicts": [1, 1]}}}
    row = compare_reports(base, better)["directions"]["text->image"]
    assert row["difference"]["mean"] == 0.5 and (row["reference"], row["candidate"]) == (0.5, 1.0)
    assert (row["difference"]["up"], row["difference"]["down"], row["difference"]["sign_p"]) == (1, 0, 1.0)
    assert "1 vs 0 cases differ, sign test p 1.000" in format_comparison(compare_reports(base, better))
    with pytest.raises(InputError, match="seed differ"):
        compare_reports(base, {**better, "seed": 1})
    with pytest.raises(InputError, match="no per-case verdicts"):
        compare_reports(base, {**better, "figures": {"text->image": {"accuracy": 1.0}}})
    # a speech report written before per-case word errors were kept: its WER is shown, not paired
    old = {**base, "figures": {"text->audio": {"accuracy": 0.5, "verdicts": [1, 0], "wer": 0.3}}}
    new = {**base, "figures": {"text->audio": {"accuracy": 0.5, "verdicts": [1, 0], "wer": 0.2,
                                               "word_errors": [[0, 5], [2, 5]]}}}
    comparison = compare_reports(old, new)
    assert comparison["directions"]["text->audio"]["wer"] == {"reference": 0.3, "candidate": 0.2, "difference": None}
    assert "no per-case word errors" in format_comparison(comparison)
    (tmp_path / "x.json").write_text("[]")
    assert main(["bench", "compare", str(tmp_path / "x.json"), str(tmp_path / "x.json")]) == 2
    assert "not an eval.json" in capsys.readouterr().err


def test_compare_pairs_variants_of_two_recipe_reports(tmp_path, capsys):
    def recipe(lr, variants):
        budget = {"data": "scenes", "preset": "mini", "steps": 8, "batch_size": 4, "lr": lr, "tasks": {},
                  "eval_n": 4, "seed": 0}
        return {"budget": budget, "variants": {name: {"overrides": {}, "judged": {"image->text": {
            "accuracy": sum(v) / 4, "verdicts": v}}} for name, v in variants.items()}}

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "recipe.json").write_text(json.dumps(recipe(1e-3, {"base": [0, 1, 0, 0]})))
    (tmp_path / "b.json").write_text(json.dumps(recipe(2e-3, {"fast": [1, 1, 1, 0], "slow": [0, 0, 0, 0]})))
    assert main(["bench", "compare", f"{tmp_path / 'a'}:base", f"{tmp_path / 'b.json'}:fast",
                 "--out", str(tmp_path / "cmp.json")]) == 0
    row = json.loads((tmp_path / "cmp.json").read_text())["directions"]["image->text"]
    assert (row["reference"], row["candidate"], row["difference"]["mean"]) == (0.25, 0.75, 0.5)
    assert "fast (" in capsys.readouterr().out
    assert main(["bench", "compare", f"{tmp_path / 'a'}:base", f"{tmp_path / 'b.json'}:other"]) == 2
    err = capsys.readouterr().err
    assert "no variant 'other'" in err and "['fast', 'slow']" in err


def test_eval_semi_ar_flags_reach_the_sampler(caption_model, tmp_path, capsys):
    args = ["eval", "--model", str(caption_model), "--data", "scenes", "--n", "2", "--directions", "image->text",
            "--mode", "semi_ar", "--block-length", "4", "--steps", "2", "--out", str(tmp_path / "e")]
    assert main(args) == 0
    report = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert report["settings"] == {"mode": "semi_ar", "block_length": 4, "steps": 2}
    used = report["figures"]["image->text"]["sampler"]
    assert (used["mode"], used["block_length"]) == ("semi_ar", 4)


def test_eval_hears_the_captions_in_the_voices_asked_and_refuses_voices_without_speech(caption_model, tmp_path, capsys):
    from unimodal.eval_cases import load_cases

    args = ["eval", "--model", str(caption_model), "--data", "scenes", "--n", "2", "--directions", "audio->text",
            "--steps", "2", "--voices", "clear", "--out", str(tmp_path / "e")]
    assert main(args) == 0
    assert "spoken in the clear voices" in capsys.readouterr().out
    assert json.loads((tmp_path / "e" / "eval.json").read_text())["voices"] == "clear"
    clear, _ = load_cases("scenes", "test", 1, voices="clear")
    varied, _ = load_cases("scenes", "test", 1)
    assert clear[0].text == varied[0].text and not np.array_equal(clear[0].audio, varied[0].audio)
    for voices, directions, expected in (("clear", "image->text", "no direction asked"),
                                         ("loud", "audio->text", "--voices must be one of")):
        code = main(["eval", "--model", str(caption_model), "--data", "scenes", "--n", "2", "--directions", directions,
                     "--voices", voices, "--out", str(tmp_path / "x")])
        assert code != 0 and expected in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_eval_and_generate_refuse_what_the_twin_cannot_do_before_the_model_loads(caption_model, tmp_path, capsys,
                                                                                   monkeypatch):
    """A setting the autoregressive twin cannot run (rivals, repair, refine, candidates), and another voice set for
    a built folder, are refused from the folder's JSON and the flags, before any model is loaded."""
    import shutil

    import unimodal.serve
    from unimodal.checks import check_twin_settings, folder_is_twin, twin_refuses

    twin = tmp_path / "twin"
    shutil.copytree(caption_model, twin)
    config = twin / "backbone" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "causal": True}))
    assert folder_is_twin(twin) and not folder_is_twin(caption_model) and not folder_is_twin(tmp_path / "none")
    assert twin_refuses({"rivals": None, "candidates": 1, "refine": 0, "repair": False}) == []
    assert twin_refuses({"rivals": True, "candidates": 2, "refine": 1, "repair": True}) == \
        ["refine", "repair", "rivals", "candidates"]
    check_twin_settings(caption_model, {"rivals": True})  # the masked-diffusion model may

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the request was refused")

    monkeypatch.setattr(unimodal.serve, "load_pipeline", no_load)
    base = ["eval", "--model", str(twin), "--data", "scenes", "--n", "2", "--out", str(tmp_path / "x")]
    for extra, expected in ((["--directions", "image->text", "--rivals"], "use rivals=False"),
                            (["--directions", "text->image", "--candidates", "2"], "use candidates=1"),
                            (["--directions", "text->image", "--refine-rounds", "1"], "use refine=0"),
                            (["--directions", "text->image", "--repair"], "use repair=False")):
        assert main(base + extra) != 0
        err = capsys.readouterr().err
        assert "autoregressive twin" in err and expected in err and "Traceback" not in err
    out = tmp_path / "g.png"
    assert main(["generate", "--model", str(twin), "--text", "a small red circle", "--to", "image", "--repair",
                 "--out", str(out)]) != 0
    assert "use repair=False" in capsys.readouterr().err and not out.exists()
    built = Path(__file__).parent  # not a built folder with clear voices: refused by the flags alone
    assert main(["eval", "--model", str(caption_model), "--data", str(built), "--n", "2", "--directions",
                 "audio->text", "--voices", "clear", "--out", str(tmp_path / "y")]) != 0
    assert "built folder" in capsys.readouterr().err and not (tmp_path / "y").exists()


def test_eval_with_candidates_judges_the_kept_draw(caption_model, tmp_path, capsys, monkeypatch):
    """--candidates reaches generate for every case of a direction with an input; joint is sampled as usual."""
    from unimodal.pipeline import UniModal

    seen = []
    original = UniModal.generate

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("candidates", 1))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(UniModal, "generate", spy)
    args = ["eval", "--model", str(caption_model), "--data", "scenes", "--n", "2", "--directions", "text->image",
            "--steps", "2", "--candidates", "2", "--out", str(tmp_path / "e")]
    assert main(args) == 0
    report = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert report["settings"] == {"steps": 2, "candidates": 2} and seen == [2, 2]
    assert report["figures"]["text->image"]["candidates"] == 2
    seen.clear()  # captions are greedy by default: every draw would be the same, so one draw per case
    assert main(args[:8] + ["image->text"] + args[9:-1] + [str(tmp_path / "c")]) == 0
    assert seen == [] and json.loads((tmp_path / "c" / "eval.json").read_text())["figures"]["image->text"]["candidates"] == 1
    seen.clear()
    assert main(args[:8] + ["image->text", "--temperature", "0.7"] + args[9:-1] + [str(tmp_path / "d")]) == 0
    assert seen == [2, 2]
    seen.clear()
    assert main(args[:8] + ["joint", "--joint-n", "2"] + args[9:]) == 0
    assert seen == []  # joint reads no input: sampled in batches as usual, not through generate(candidates)
    seen.clear()
    assert main(args[:-2] + ["--accept-confidence", "-1000", "--out", str(tmp_path / "a")]) == 0
    sure = json.loads((tmp_path / "a" / "eval.json").read_text())
    assert sure["settings"]["accept_confidence"] == -1000 and seen == [2, 2]
    assert sure["figures"]["text->image"]["drawn_per_case"] == 1  # every first draw was sure enough: none drawn more
    seen.clear()
    assert main(args[:-2] + ["--accept-agreement", "-1000", "--out", str(tmp_path / "g")]) == 0
    agreed = json.loads((tmp_path / "g" / "eval.json").read_text())
    assert agreed["settings"]["accept_agreement"] == -1000 and seen == [2, 2]
    assert agreed["figures"]["text->image"]["drawn_per_case"] == 1  # every first draw read back well enough
    assert main(args[:-2] + ["--accept-agreement", "0", "--out", str(tmp_path / "h")]) == 0
    assert json.loads((tmp_path / "h" / "eval.json").read_text())["figures"]["text->image"]["drawn_per_case"] > 1
    seen.clear()
    bad = args[:-2] + ["--candidates", "0", "--out", str(tmp_path / "bad")]
    assert main(bad) == 2 and seen == [] and not (tmp_path / "bad").exists()  # refused before any case is drawn
    assert "candidates must be an int from 1 to 64" in capsys.readouterr().err
    alone = args[:-4] + ["--accept-confidence", "-0.1", "--out", str(tmp_path / "alone")]  # without --candidates
    assert main(alone) == 2 and not (tmp_path / "alone").exists()
    assert "needs candidates > 1" in capsys.readouterr().err


def test_best_of_curve_keeps_the_draw_read_back_best_among_the_first_k():
    from unimodal.inference.evaluate import best_of_curve

    verdicts = [[0, 1, 1], [1, 0, 0], [None, 0, 1]]  # per case, per draw
    agreements = [[-2.0, -1.0, -3.0], [-1.0, -0.5, -2.0], [-1.0, -2.0, -0.1]]
    curve = best_of_curve(verdicts, agreements, [16, 16, 16])
    assert [row["k"] for row in curve] == [1, 2, 3]
    assert curve[0]["accuracy"] == 0.5  # case 3's first draw was not judged: 1 right of 2 judged
    assert curve[1]["accuracy"] == 0.5  # case 1 keeps draw 2 (right), case 2 draw 2 (wrong), case 3 draw 1 (unjudged)
    assert curve[2]["accuracy"] == pytest.approx(2 / 3)  # case 3 now keeps draw 3, right
    assert [row["any_right"] for row in curve] == [0.5, pytest.approx(2 / 3), 1.0]
    assert [row["forward_passes"] for row in curve] == [16, 34, 51]  # k draws, and k reads once there is a choice


def test_eval_every_draw_judges_each_candidate_and_prints_the_curve(caption_model, tmp_path, capsys):
    args = ["eval", "--model", str(caption_model), "--data", "scenes", "--n", "3", "--directions", "text->image",
            "--steps", "2", "--candidates", "3", "--every-draw", "--out", str(tmp_path / "e")]
    assert main(args) == 0
    out = capsys.readouterr().out
    figure = json.loads((tmp_path / "e" / "eval.json").read_text())["figures"]["text->image"]
    curve = figure["best_of"]
    assert [row["k"] for row in curve] == [1, 2, 3] and "every draw judged" in out
    assert curve[-1]["accuracy"] == figure["accuracy"]  # best of all 3 is what candidates=3 kept and judged
    assert all(row["any_right"] >= row["accuracy"] for row in curve)
    assert curve[0]["forward_passes"] < curve[1]["forward_passes"] < curve[2]["forward_passes"]
    assert [len(case["verdicts"]) for case in figure["draws"]] == [3, 3, 3]
    assert (tmp_path / "e" / "best_of_text_to_image.png").stat().st_size > 0 and "best_of_text_to_image.png" in out
    assert all(len(case["agreement"]) == 3 for case in figure["draws"])
    assert figure["reading"] == "joint" and figure["best_of_by_reading"]["joint"] == curve  # the reading that chose
    each = figure["best_of_by_reading"]["each"]  # the same draws had each word been read alone to choose
    assert [row["any_right"] for row in each] == [row["any_right"] for row in curve]
    assert each[1]["forward_passes"] > curve[1]["forward_passes"]  # a read per word against one
    assert all(set(case["by_reading"]) == {"joint", "each"} for case in figure["draws"])
    for case in figure["draws"]:  # the curve keeps, among the first k, the draw each reading scores highest
        assert case["by_reading"]["joint"] == case["agreement"]
    kept_each = [case["verdicts"][max(range(3), key=case["by_reading"]["each"].__getitem__)] for case in figure["draws"]]
    judged = [v for v in kept_each if v is not None]
    assert each[2]["accuracy"] == pytest.approx(sum(judged) / len(judged))
    assert re.search(r"^\s+k\s+joint\s+passes\s+each\s+passes\s+any right$", out, re.M)
    for reading, found in figure["detection"].items():  # the readings as detectors of a wrong draw, from the draws
        scored = [(a, not v) for case in figure["draws"] for v, a in zip(case["verdicts"], case["by_reading"][reading])
                  if v is not None]
        wrong = [a for a, w in scored if w]
        right = [a for a, w in scored if not w]
        expected = (sum((a < b) + 0.5 * (a == b) for a in wrong for b in right) / (len(wrong) * len(right))
                    if wrong and right else None)
        assert found["auroc"] == (pytest.approx(expected) if expected is not None else None)
        assert found["within"] is None or 0 <= found["within"] <= 1
    assert "a judged-wrong draw scored below a right one" in out
    one = json.loads(_eval_once(caption_model, tmp_path / "one"))["figures"]["text->image"]
    assert curve[0]["accuracy"] == one["accuracy"]  # the first draw is the case's own seed, drawn alone
    for bad, message in ((args[:-5] + ["--every-draw", "--out", str(tmp_path / "b")], "give --candidates N"),
                         (args[:-2] + ["--accept-confidence", "-1", "--out", str(tmp_path / "c")], "one or the other"),
                         (args[:-2] + ["--accept-agreement", "-1", "--out", str(tmp_path / "d")], "one or the other")):
        assert main(bad) == 2 and message in capsys.readouterr().err and not (tmp_path / bad[-1]).exists()


def test_eval_chooses_by_the_reading_asked_and_refuses_it_where_nothing_is_chosen(caption_model, tmp_path, capsys):
    """--agreement each: the kept draw is the one read best word by word (the run's best_of is that curve); on a
    direction sampled greedily (one draw) the setting is set aside like the candidates; alone, it is refused."""
    args = ["eval", "--model", str(caption_model), "--data", "scenes", "--n", "2", "--directions",
            "text->image,image->text", "--steps", "2", "--candidates", "2", "--every-draw", "--agreement", "each",
            "--out", str(tmp_path / "e")]
    assert main(args) == 0, capsys.readouterr().err
    figures = json.loads((tmp_path / "e" / "eval.json").read_text())["figures"]
    assert figures["text->image"]["reading"] == "each"
    assert figures["text->image"]["best_of"] == figures["text->image"]["best_of_by_reading"]["each"]
    assert figures["text->image"]["best_of"][-1]["accuracy"] == figures["text->image"]["accuracy"]
    assert "best_of" not in figures["image->text"] and figures["image->text"]["candidates"] == 1  # greedy: one draw
    bad = ["eval", "--model", str(caption_model), "--data", "scenes", "--n", "2", "--directions", "text->image",
           "--agreement", "each", "--out", str(tmp_path / "b")]
    assert main(bad) == 2 and "needs candidates > 1" in capsys.readouterr().err and not (tmp_path / "b").exists()
    from unimodal.inference.evaluate import evaluate

    with pytest.raises(InputError, match="give candidates > 1"):
        evaluate(None, [], ["text->image"], {"agreement": "each"})


def _eval_once(model, out) -> str:
    assert main(["eval", "--model", str(model), "--data", "scenes", "--n", "3", "--directions", "text->image",
                 "--steps", "2", "--out", str(out)]) == 0
    return (out / "eval.json").read_text()


def _spied_refine(monkeypatch) -> list:
    """UniModal.refine, recording the keywords of each call."""
    from unimodal.pipeline import UniModal

    calls, original = [], UniModal.refine

    def spy(self, result, **kwargs):
        calls.append(kwargs)
        return original(self, result, **kwargs)

    monkeypatch.setattr(UniModal, "refine", spy)
    return calls


def test_eval_refine_rounds_judges_each_output_as_refined(caption_model, tmp_path, capsys, monkeypatch):
    """--refine-rounds refines every case's output against its own input (seeded as its request), with refine's
    defaults, and the figures count the refine's passes; joint (no input) is not refined."""
    calls = _spied_refine(monkeypatch)
    base = ["eval", "--model", str(caption_model), "--data", "scenes", "--n", "2", "--directions", "image->text",
            "--steps", "2"]
    assert main(base + ["--out", str(tmp_path / "plain")]) == 0 and calls == []
    assert main(base + ["--refine-rounds", "2", "--out", str(tmp_path / "refined")]) == 0
    cases, _ = load_cases("scenes", "test", 2, speech=False)
    assert [sorted(k) for k in calls] == [["image", "rounds", "seed"]] * 2
    assert [k["seed"] for k in calls] == [0, 1] and all(k["rounds"] == 2 for k in calls)
    assert all(np.array_equal(k["image"], c.image) for k, c in zip(calls, cases))
    plain = json.loads((tmp_path / "plain" / "eval.json").read_text())
    refined = json.loads((tmp_path / "refined" / "eval.json").read_text())
    assert refined["refine_rounds"] == 2 and refined["figures"]["image->text"]["refine_rounds"] == 2
    assert "refine_rounds" not in plain["figures"]["image->text"]
    assert refined["figures"]["image->text"]["forward_passes"] > plain["figures"]["image->text"]["forward_passes"]
    assert "refined against its input, 2 rounds" in capsys.readouterr().out
    calls.clear()
    assert main(base[:8] + ["joint", "--joint-n", "2", "--steps", "2", "--refine-rounds", "1",
                            "--out", str(tmp_path / "joint")]) == 0
    assert calls == []
    for bad in ("-1", "33", "two"):  # refused by the argument parser, as generate's refine is refused
        with pytest.raises(SystemExit) as stop:
            main(base + ["--refine-rounds", bad, "--out", str(tmp_path / "bad")])
        assert stop.value.code == 2
        assert f"--refine-rounds must be a whole number from 0 (none) to 32, got '{bad}'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    with pytest.raises(InputError, match="refine_rounds must be an int >= 0"):
        evaluate(object(), cases, refine_rounds=-1)


def test_eval_refines_speech_as_generate_does_by_default(caption_model, tmp_path, capsys, monkeypatch):
    """Without --refine-rounds, eval refines each direction's outputs as generate does by default: speech alone on
    a model whose critic head is trained, 2 rounds, said under the table; --refine-rounds 0 judges them as
    drawn; a model without a trained head and every other output are not refined."""
    from test_pipeline import trained_head_copy

    trained = trained_head_copy(caption_model, tmp_path / "trained")
    calls = _spied_refine(monkeypatch)
    base = ["eval", "--data", "scenes", "--n", "2", "--directions", "text->audio,text->image", "--steps", "2"]
    assert main(base + ["--model", str(trained), "--out", str(tmp_path / "default")]) == 0
    assert [sorted(k) for k in calls] == [["rounds", "seed", "text"]] * 2 and all(k["rounds"] == 2 for k in calls)
    report = json.loads((tmp_path / "default" / "eval.json").read_text())
    assert report["refine_rounds"] is None
    assert report["figures"]["text->audio"]["refine_rounds"] == 2 and report["figures"]["text->audio"]["refine_default"]
    assert "refine_rounds" not in report["figures"]["text->image"]
    assert "text->audio: refined 2 rounds by refine's defaults" in capsys.readouterr().out
    calls.clear()
    assert main(base + ["--model", str(trained), "--refine-rounds", "0", "--out", str(tmp_path / "drawn")]) == 0
    assert calls == []
    assert "refine_rounds" not in json.loads((tmp_path / "drawn" / "eval.json").read_text())["figures"]["text->audio"]
    assert main(base + ["--model", str(caption_model), "--out", str(tmp_path / "untrained")]) == 0 and calls == []
    # --refine-critic: the rounds read that critic instead of refine's default
    assert main(base + ["--model", str(trained), "--refine-critic", "confidence", "--out", str(tmp_path / "c")]) == 0
    assert [k["critic"] for k in calls] == ["confidence"] * 2
    assert "refined 2 rounds by refine's defaults (critic confidence)" in capsys.readouterr().out
    calls.clear()
    for extra, expected in ((["--refine-rounds", "0", "--refine-critic", "confidence"], "--refine-rounds 0 runs none"),
                            (["--refine-critic", "learned"], "never trained")):
        assert main(base + ["--model", str(caption_model), *extra, "--out", str(tmp_path / "x")]) == 2
        assert expected in capsys.readouterr().err and calls == [] and not (tmp_path / "x").exists()


def test_eval_repair_reads_back_and_repairs_only_pictures_drawn_from_words(caption_model, tmp_path, capsys,
                                                                            monkeypatch):
    """--repair: each text->image picture goes through refine(repair=True) against its caption (no critic round
    unless --refine-rounds); other directions are not refined; the figures and the table say so."""
    calls = _spied_refine(monkeypatch)
    assert main(["eval", "--model", str(caption_model), "--data", "scenes", "--n", "2", "--directions",
                 "text->image,image->text", "--steps", "2", "--repair", "--out", str(tmp_path / "r")]) == 0
    cases, _ = load_cases("scenes", "test", 2, speech=False)
    assert [k["text"] for k in calls] == [c.text for c in cases]  # the two pictures, none of the captions
    assert all(k["repair"] is True and k["rounds"] == 0 for k in calls)
    report = json.loads((tmp_path / "r" / "eval.json").read_text())
    assert report["repair"] is True and report["figures"]["text->image"]["repair"] is True
    assert "repair" not in report["figures"]["image->text"]
    assert "changed by an instructed edit (repair=True)" in capsys.readouterr().out
    assert main(["eval", "--model", str(caption_model), "--data", "scenes", "--n", "2", "--directions", "image->text",
                 "--repair", "--out", str(tmp_path / "none")]) == 2
    assert "--repair repairs the pictures of text->image and audio->image" in capsys.readouterr().err


def _same_but_time(a, b):
    strip = lambda f: {d: {k: v for k, v in x.items() if k != "wall_s_per_sample"} for d, x in f.items()}  # noqa: E731
    return strip(a["figures"]) == strip(b["figures"])


def test_evaluate_refuses_no_cases():
    with pytest.raises(InputError, match="at least one case"):
        evaluate(object(), [])


def test_versus_ar_compares_both_models_on_the_same_prompts(tiny_codec_dir, caption_model, tmp_path, capsys):
    from unimodal.training.data.store import Sample, write_info, write_split
    from unimodal.training.train import TrainConfig, train

    cfg = TrainConfig(preset="tiny", steps=1, batch_size=2, warmup=1, val_every=1, val_samples=1, checkpoint_every=1,
                      bf16=False, objective="ar", task_weights={"text->image": 1.0, "image->text": 1.0})
    scenes, _ = load_cases("scenes", "test", 4, speech=False)
    data = tmp_path / "vs-scenes"
    for split in ("train", "val"):
        write_split(data, split, [Sample(c.text, c.image, None, meta={"attributes": c.truth}) for c in scenes])
    write_info(data, {"name": "mini", "splits": ["train", "val"], "sample_rate": 16000})
    ar_dir = train(tmp_path / "ar", [str(data)], tiny_codec_dir, cfg, progress=False)
    code = main(["bench", "versus-ar", "--model", str(caption_model), "--ar-model", str(ar_dir), "--n", "2",
                 "--directions", "text->image,image->text", "--batch-size", "2", "--out", str(tmp_path / "vs")])
    assert code == 0
    out = capsys.readouterr().out
    assert "diffusion vs AR twin" in out
    report = json.loads((tmp_path / "vs" / "versus_ar.json").read_text())
    contenders = {(r["direction"], r["contender"]) for r in report["rows"]}
    assert ("text->image", "ar") in contenders and ("image->text", "confidence4") in contenders
    ar_row = next(r for r in report["rows"] if r["contender"] == "ar" and r["direction"] == "text->image")
    assert ar_row["forward_passes"] == 64 and (tmp_path / "vs" / "versus_ar.png").is_file()
    assert all(len(r["verdicts"]) == r["n"] for r in report["rows"])
    assert report["summary"]["text->image"]["fastest_minus_ar"]["cases"] == ar_row["n"]
    # no --temperature: each model samples with its per-output defaults, and the rows say what was used
    assert report["temperature"] is None and "per-output sampling defaults" in out
    used = {(r["direction"], r["contender"]): r["effective_settings"] for r in report["rows"]}
    image = used[("text->image", "confidence8")]
    assert (image["temperature"], image["cfg"]) == (0.7, 3.0)
    assert used[("image->text", "confidence8")]["temperature"] == 0.0
    assert used[("image->text", "tau0.95")]["mode"] == "threshold"
    assert main(["bench", "versus-ar", "--model", str(ar_dir), "--ar-model", str(caption_model),
                 "--out", str(tmp_path / "bad")]) == 2


def test_matched_speedup_picks_the_fastest_setting_as_good_as_the_twin():
    from unimodal.inference.versus import matched_speedup

    def row(name, wall, verdicts):
        return {"contender": name, "wall_s_per_sample": wall, "quality": sum(verdicts) / len(verdicts),
                "verdicts": verdicts}

    rows = [row("ar", 2.0, [1, 1, 0, 0]), row("confidence4", 0.25, [0, 0, 0, 0]),
            row("confidence8", 0.5, [1, 1, 1, 0]), row("confidence16", 1.0, [1, 1, 1, 1])]
    summary = matched_speedup(rows)
    assert summary["matched_setting"] == "confidence8" and summary["speedup_at_matched_quality"] == 4.0
    assert summary["matched_minus_ar"]["mean"] == 0.25 and summary["matched_minus_ar"]["cases"] == 4
    assert summary["fastest_setting"] == "confidence4" and summary["speedup_fastest"] == 8.0
    assert summary["fastest_minus_ar"]["mean"] == -0.5
    low, high = summary["fastest_minus_ar"]["ci95"]
    assert low <= -0.5 <= high <= 0
    nothing = matched_speedup([row("ar", 2.0, [1, 1]), row("confidence4", 0.5, [0, 1])])
    assert nothing["matched_setting"] is None and nothing["matched_minus_ar"] is None


def test_data_efficiency_trains_both_objectives_and_judges_every_snapshot(tiny_codec_dir, tmp_path):
    from unimodal.data_efficiency import EfficiencyConfig, format_report, run_data_efficiency
    from unimodal.training.data.store import Sample, write_info, write_split

    scenes, _ = load_cases("scenes", "test", 6, speech=False)
    data = tmp_path / "de-scenes"
    for split in ("train", "val", "test"):
        write_split(data, split, [Sample(c.text, c.image, None, meta={"attributes": c.truth}) for c in scenes])
    write_info(data, {"name": "mini", "splits": ["train", "val", "test"], "sample_rate": 16000})
    cfg = EfficiencyConfig(data=str(data), subset=4, epochs=(1, 2), preset="tiny", batch_size=2, eval_n=2,
                           eval_steps=2)
    report = run_data_efficiency(cfg, tiny_codec_dir, tmp_path / "out", progress=False)
    assert set(report["judged"]) == {"diffusion/1", "diffusion/2", "ar/1", "ar/2"}
    assert all(0 <= v <= 1 for r in report["judged"].values() for v in r.values())
    losses = report["held_out_loss"]
    assert [e for e, _ in losses["ar"]["text->image"]] == [1.0, 2.0] and "diffusion" in losses
    assert (tmp_path / "out" / "data_efficiency.png").is_file() and "epochs" in format_report(report)
    again = run_data_efficiency(cfg, tiny_codec_dir, tmp_path / "out", progress=False)  # everything cached
    assert again["judged"] == report["judged"]


def test_directions_parse_and_a_bad_one_says_what_is_known():
    from unimodal.inference.evaluate import parse_direction

    assert parse_direction("audio->image") == (("audio",), ("image",))
    assert parse_direction("joint") == ((), ("text", "image", "audio"))
    with pytest.raises(InputError, match="known: text->image"):
        parse_direction("text->video")
    with pytest.raises(InputError, match="quote it"):
        parse_direction("text-")
