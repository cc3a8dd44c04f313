"""The sampling benchmark (inference/bench_setup, bench_measure, bench_sample, bench_compile, bench_report; `unimodal bench sample`) on the tiny untrained model."""

import json

import numpy as np
import pytest

from unimodal.inference.bench_report import format_table, save_report
from unimodal.inference.bench_sample import bench_sample
from unimodal.inference.bench_setup import REFERENCE, parse_direction
from unimodal.core.errors import InputError


@pytest.fixture(scope="module")
def pipe(tiny_model_dir):
    from unimodal.pipeline import UniModal

    return UniModal.from_pretrained(tiny_model_dir)


def _conditions(pipe, n=2):
    rng = np.random.default_rng(0)
    size = pipe.image_codec.image_size
    return {"text": ["a small red circle on the left", "a big blue square"][:n],
            "image": [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)],
            "audio": [(0.1 * rng.standard_normal(8000)).astype(np.float32) for _ in range(n)]}


@pytest.fixture(scope="module")
def report(pipe, tiny_model_dir):
    directions = ["text->image", "image->text", "audio->text", "text->audio"]
    return bench_sample(pipe, _conditions(pipe), directions, taus=[0.5, 0.9], steps=[2, 4], seed=0,
                        model_path=str(tiny_model_dir))


def test_every_setting_with_and_without_cache(report):
    names = {(row["direction"], row["setting"], row["use_cache"]) for row in report["rows"]}
    settings = [REFERENCE, "tau=0.5", "tau=0.9", "steps=2", "steps=4"]
    assert names == {(d, s, c) for d in report["directions"] for s in settings for c in (True, False)}
    assert len(report["rows"]) == len(names)


def test_tpf_times_passes_is_generated_slots(report):
    for row in report["rows"]:
        assert row["tpf"] * row["forward_passes"] == pytest.approx(row["generated_slots"])
        assert row["forward_passes"] >= 1 and row["wall_s_per_sample"] > 0 and row["peak_memory_bytes"] > 0


def test_confidence_mode_passes_follow_the_step_count(report):
    for row in report["rows"]:
        if row["direction"] == "text->image" and row["setting"].startswith("steps="):
            assert row["forward_passes"] == row["steps"]  # images have no END: every step is a model call
        if row["direction"] == "text->image" and row["setting"] == REFERENCE:
            assert row["tpf"] == 1.0  # one token per pass


def test_cache_does_not_change_tokens(report):
    for row in report["rows"]:
        assert row["cache_tokens_identical"] is True
        assert row["cache_speedup"] > 0


def test_reference_agrees_with_itself(report):
    for row in report["rows"]:
        if row["setting"] == REFERENCE:
            assert row["agreement"] == 1.0
        assert 0.0 <= row["agreement"] <= 1.0


def test_json_png_and_table(report, tmp_path):
    json_path, png_path = save_report(report, tmp_path / "out")
    saved = json.loads(json_path.read_text())
    assert saved["rows"] == report["rows"] and saved["seed"] == 0 and saved["model"] == report["model"]
    assert saved["memory_kind"] in ("process_rss_high_water_mark", "cuda_max_memory_allocated")
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = format_table(report)
    assert len(table.splitlines()) == len(report["rows"]) + 3 + len(report["targets"]) and "agree" in table
    assert "shared sampler settings: {\"temperature\": 0.0}" in table
    assert all(row["quality"] is None for row in report["rows"])  # no truth given: agreement only


def test_shared_settings_cannot_override_the_sweep(pipe):
    with pytest.raises(InputError, match="cannot set \\['steps'\\]"):
        bench_sample(pipe, {"text": ["a red circle"]}, ["text->image"], taus=[0.9], steps=[2], sampling={"steps": 3})


def test_bad_direction_is_a_clear_error(pipe):
    with pytest.raises(InputError, match="CONDITION->TARGET"):
        parse_direction("text=>image")
    with pytest.raises(InputError, match="quote it"):  # `--directions text->image` unquoted in a shell
        parse_direction("text-")
    with pytest.raises(InputError, match="needs audio conditions"):
        bench_sample(pipe, {"text": ["a red circle"]}, ["audio->image"], taus=[0.9], steps=[2])


def test_cli_bench_sample(tiny_model_dir, tmp_path, capsys):
    from unimodal.cli import main

    out = tmp_path / "bench"
    assert main(["bench", "sample", "--model", str(tiny_model_dir), "--device", "cpu", "--n", "1",
                 "--directions", "text->image,image->text", "--taus", "0.9", "--steps", "2",
                 "--cfg", "2", "--choice-temperature", "3", "--out", str(out)]) == 0
    saved = json.loads((out / "bench_sample.json").read_text())
    assert saved["sampling"] == {"temperature": 0.0, "cfg": 2.0, "choice_temperature": 3.0}
    assert saved["directions"] == ["text->image", "image->text"] and saved["model"] == str(tiny_model_dir)
    assert (out / "bench_sample.png").is_file()
    assert "text->image" in capsys.readouterr().out
    assert all(0.0 <= row["quality"] <= 1.0 for row in saved["rows"])  # judged against the scenes' truth
    assert set(saved["targets"]) == {"text->image", "image->text"}
    capsys.readouterr()  # refused before the model (which does not exist) loads:
    assert main(["bench", "sample", "--model", str(tmp_path / "no-model"), "--choice-temperature", "-1"]) == 2
    assert "choice_temperature" in capsys.readouterr().err


def _row(direction, setting, passes, tpf, quality, speedup=3.0):
    return {"direction": direction, "setting": setting, "use_cache": True, "forward_passes": passes, "tpf": tpf,
            "quality": quality, "agreement": 1.0, "cache_speedup": speedup, "cache_tokens_identical": True}


def test_target_checks_read_the_issue_rules_off_the_rows():
    from unimodal.inference.bench_sample import target_checks

    rows = [_row("text->image", REFERENCE, 64, 1.0, 0.90), _row("text->image", "steps=8", 8, 8.0, 0.88),
            _row("text->image", "steps=4", 4, 16.0, 0.95), _row("image->text", REFERENCE, 20, 1.0, 0.80),
            _row("image->text", "tau=0.9", 8, 2.5, 0.80), _row("image->text", "tau=0.5", 5, 4.0, 0.70)]
    checks = target_checks(rows)
    assert checks["text->image"]["met"] and checks["text->image"]["best_setting"] == "steps=4"
    assert not checks["image->text"]["met"] and checks["image->text"]["best_setting"] == "tau=0.5"
    assert checks["image->text"]["cache"] == {"median_speedup": 3.0, "identical": True}


def test_cli_bench_sample_without_the_cache_check(tiny_model_dir, tmp_path, capsys):
    from unimodal.cli import main

    out = tmp_path / "bench"
    assert main(["bench", "sample", "--model", str(tiny_model_dir), "--device", "cpu", "--n", "2",
                 "--directions", "text->image", "--taus", "", "--steps", "2", "--no-cache-check",
                 "--out", str(out)]) == 0
    saved = json.loads((out / "bench_sample.json").read_text())
    assert saved["cache_check"] is False and saved["taus"] == []
    assert [(row["setting"], row["use_cache"]) for row in saved["rows"]] == [(REFERENCE, True), ("steps=2", True)]
    assert all(row["cache_speedup"] is None and row["cache_tokens_identical"] is None for row in saved["rows"])
    assert saved["targets"]["text->image"]["cache"] is None
    assert all(len(row["verdicts"]) == 2 for row in saved["rows"])  # per case, for paired comparisons
    printed = capsys.readouterr().out
    assert "cache not measured" in printed and "passes <= 8" in printed and "paired difference" in printed


def test_paired_difference_of_verdicts():
    from unimodal.inference.bench_sample import target_checks
    from unimodal.inference.evaluate import paired_difference

    reference = [1, 1, 0, 0, None] * 20
    same = paired_difference(reference, reference)
    assert same["mean"] == 0.0 and same["ci95"] == [0.0, 0.0] and same["cases"] == 80  # abstentions left out
    worse = paired_difference([0, 1, 0, 0, 1] * 20, reference)
    assert worse["mean"] == pytest.approx(-0.25) and worse["ci95"][0] < -0.25 < worse["ci95"][1] < 0
    assert paired_difference(None, reference) is None
    rows = [_row("text->image", REFERENCE, 64, 1.0, 0.5) | {"verdicts": reference},
            _row("text->image", "steps=8", 8, 8.0, 0.5) | {"verdicts": [1, 0, 1, 0, 1] * 20}]
    check = target_checks(rows)["text->image"]
    assert check["met"] and check["difference"]["mean"] == 0.0 and check["difference"]["ci95"][0] < 0
