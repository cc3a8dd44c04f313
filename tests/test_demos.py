"""Each ``demos/`` script runs end to end at toy size (the tiny random model) and writes the files it promises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_output_file


@pytest.fixture
def model_args(tiny_caption_model_dir, tmp_path):
    return ["--model", str(tiny_caption_model_dir), "--out", str(tmp_path / "out")]


def test_every_direction_writes_each_output(model_args, tmp_path):
    from unimodal.demos.every_direction import main

    summary = main(model_args)
    out = tmp_path / "out"
    for name in ("text_to_image.png", "text_to_audio.wav", "image_to_text.txt", "audio_to_text.txt",
                 "image_to_audio.wav", "audio_to_image.png", "joint/image.png", "joint/audio.wav", "joint/text.txt"):
        assert_output_file(out / name, empty_audio=name == "joint/audio.wav")  # random joint speech may end at once
    assert set(summary["forward_passes"]) >= {"text_to_image", "audio_to_text", "joint"}


def test_batch_prompts_writes_the_sample_file_and_one_entry_per_prompt(model_args, tmp_path):
    from unimodal.demos.batch_prompts import SAMPLE, main

    index = main(model_args + ["--batch-size", "2"])
    out = tmp_path / "out"
    prompts = [line for line in SAMPLE.splitlines() if line and not line.startswith("#")]
    assert (out / "prompts.txt").read_text() == SAMPLE and len(index) == len(prompts)
    assert json.loads((out / "index.json").read_text()) == index
    assert all(entry["files"] for entry in index)  # the sample's every prompt is one the model takes
    kinds = set()
    for number, entry in enumerate(index):
        for name in entry["files"]:
            assert Path(name).parent == out and Path(name).stem == f"{number:03d}", name
            assert_output_file(name)
            kinds.add(Path(name).suffix)
    assert kinds == {".png", ".wav"}  # the sample asks for pictures and speech


def test_batch_prompts_reports_a_refused_request_and_runs_the_rest(model_args, tmp_path):
    from unimodal.demos.batch_prompts import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("image: a small red circle on the left\nvideo: a large blue square\n")
    index = main(model_args + ["--prompts", str(prompts)])
    assert "files" in index[0] and "error" in index[1]


def test_batch_prompts_takes_any_accepted_seed_and_refuses_a_bad_one(model_args, tmp_path, capsys):
    """Each chunk's seed derives from --seed and wraps at the limit (2**62 - 1 was refused for the second chunk);
    a seed the library would refuse is refused by the parser, named, before the model loads."""
    from unimodal.demos.batch_prompts import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("image: a small red circle on the left\naudio: a large blue square\n")
    index = main(model_args + ["--prompts", str(prompts), "--batch-size", "1", "--seed", str(2**62 - 1)])
    assert all("files" in entry for entry in index) and len(index) == 2
    for bad in ("-1", str(2**62), "seven"):
        with pytest.raises(SystemExit) as exit_:
            main(model_args + ["--prompts", str(prompts), "--seed", bad])
        assert exit_.value.code == 2 and "--seed" in capsys.readouterr().err


def test_agent_loop_writes_its_trace(model_args, tmp_path):
    from unimodal.demos.agent_loop import main

    trace = main(model_args + ["--rounds", "1"])
    actions = [step["action"] for step in trace]
    assert actions[:3] == ["plan", "execute", "check"]
    assert trace[0]["parsed"]["objects"][0]["color"] == "blue"
    assert json.loads((tmp_path / "out" / "trace.json").read_text())[-1]["step"] == trace[-1]["step"]
    assert (tmp_path / "out" / "step02-heat.png").is_file()


def test_edit_regions_edits_a_box_a_span_and_characters(model_args, tmp_path):
    from unimodal.demos.edit_regions import main

    edits = main(model_args)
    assert [e["edit"] for e in edits] == ["image", "audio", "caption"]
    for edit in edits:
        assert all(__import__("pathlib").Path(f).is_file() for f in edit["files"])
        assert sum(edit["tokens_remasked"].values()) > 0


def test_train_tiny_fine_tunes_on_a_folder_and_generates(model_args, tmp_path):
    from unimodal.demos.train_tiny import main

    report = main(model_args + ["--steps", "2", "--batch-size", "2"])
    out = tmp_path / "out"
    assert report["records"] == 4 and (out / "run" / "model" / "layout.json").is_file()
    assert (out / "generated.png").is_file()
