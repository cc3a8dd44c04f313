"""`unimodal generate` and `unimodal serve --stdio` on a tiny untrained model folder: files written, --json
machine-readable, clear errors, and a server that survives bad requests."""

import json
import os
import select
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from conftest import assert_output_file, write_tiny_model  # noqa: E402
from unimodal.cli import main

FAST = ["--steps", "3", "--quiet"]


@pytest.fixture(scope="module")
def model_dir(tiny_codec_dir, tmp_path_factory):
    return write_tiny_model(tiny_codec_dir, tmp_path_factory.mktemp("cli-model") / "model")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_writes_the_image(model_dir, tmp_path, capsys):
    code, out, _ = run(capsys, "generate", "--model", model_dir, "--text", "a small red circle on the left",
                       "--to", "image", "--out", tmp_path / "red.png", *FAST)
    assert code == 0 and out.strip() == f"image: {tmp_path / 'red.png'}"
    assert Image.open(tmp_path / "red.png").size == (64, 64)


def test_generate_candidates_keeps_the_best_read_back(model_dir, tmp_path, capsys):
    code, out, err = run(capsys, "generate", "--model", model_dir, "--text", "a red circle", "--to", "image",
                         "--steps", "2", "--candidates", "2", "--out", tmp_path / "best.png", "--json", "--quiet")
    assert code == 0, err
    chosen = json.loads(out)["settings"]["candidates"]
    assert chosen["n"] == 2 and chosen["kept"] in (0, 1) and (tmp_path / "best.png").is_file()
    code, _, err = run(capsys, "generate", "--model", model_dir, "--text", "a red circle", "--candidates", "0",
                       "--out", tmp_path / "x.png")
    assert code == 2 and "candidates must be an int from 1 to 64" in err
    code, out, err = run(capsys, "generate", "--model", model_dir, "--text", "a red circle", "--to", "image",
                         "--steps", "2", "--candidates", "2", "--accept-confidence", "-1000", "--out",
                         tmp_path / "sure.png", "--json", "--quiet")
    assert code == 0, err
    assert json.loads(out)["settings"]["candidates"]["drawn"] == 1 and (tmp_path / "sure.png").is_file()
    code, _, err = run(capsys, "generate", "--model", model_dir, "--text", "a red circle", "--accept-confidence",
                       "0.5", "--candidates", "2", "--out", tmp_path / "y.png")
    assert code == 2 and "accept_confidence must be a number <= 0" in err and not (tmp_path / "y.png").exists()
    code, out, err = run(capsys, "generate", "--model", model_dir, "--text", "a red circle", "--to", "image",
                         "--steps", "2", "--candidates", "3", "--accept-agreement", "-1000", "--out",
                         tmp_path / "agreed.png", "--json", "--quiet")
    assert code == 0, err
    agreed = json.loads(out)["settings"]["candidates"]
    assert (agreed["drawn"], agreed["kept"], agreed["accepted"]) == (1, 0, True) and (tmp_path / "agreed.png").is_file()
    code, _, err = run(capsys, "generate", "--model", model_dir, "--text", "a red circle", "--accept-agreement",
                       "-0.3", "--accept-confidence", "-0.1", "--candidates", "2", "--out", tmp_path / "z.png")
    assert code == 2 and "give one or the other" in err and not (tmp_path / "z.png").exists()
    code, out, err = run(capsys, "generate", "--model", model_dir, "--text", "a red circle", "--to", "image",
                         "--steps", "2", "--candidates", "2", "--agreement", "each", "--out", tmp_path / "each.png",
                         "--json", "--quiet")
    assert code == 0, err
    assert json.loads(out)["settings"]["candidates"]["reading"] == "each" and (tmp_path / "each.png").is_file()
    code, _, err = run(capsys, "generate", "--model", model_dir, "--text", "a red circle", "--agreement", "each",
                       "--out", tmp_path / "z.png")
    assert code == 2 and "needs candidates > 1" in err and not (tmp_path / "z.png").exists()


def test_generate_refine_refines_the_output_against_its_input(model_dir, tmp_path, capsys):
    """--refine N: the caption of a picture file, then N rounds of refine against it (the summary says what ran
    and counts its passes); bad rounds refused before the model loads, nothing written."""
    Image.new("RGB", (64, 64), (200, 30, 30)).save(tmp_path / "photo.png")
    flags = ("generate", "--model", model_dir, "--image", tmp_path / "photo.png", "--to", "text", "--steps", "2",
             "--json", "--quiet")
    code, out, err = run(capsys, *flags)
    assert code == 0, err
    plain = json.loads(out)
    code, out, err = run(capsys, *flags, "--refine", "2", "--out", tmp_path / "caption.txt")
    assert code == 0, err
    refined = json.loads(out)
    assert refined["settings"]["refine"]["critic"] == "confidence"
    assert refined["forward_passes"] == plain["forward_passes"] + refined["settings"]["refine"]["forward_passes"]
    assert (tmp_path / "caption.txt").read_text().strip() == refined["text"].strip()
    code, out, err = run(capsys, *[f for f in flags if f != "--json"], "--refine", "2")  # a person is told too
    summary = refined["settings"]["refine"]
    assert code == 0, err
    assert (f"refined by the confidence critic: {summary['rounds_kept']} of {summary['rounds_run']} round(s) kept, "
            f"{summary['forward_passes']} forward passes, stopped: {summary['stopped']}") in out
    for bad in ("-1", "33", "2.5"):  # refused by the parser, named by its flag
        with pytest.raises(SystemExit) as stop:  # argparse: the message on stderr, exit status 2
            run(capsys, "generate", "--model", model_dir, "--text", "a red circle", "--refine", bad,
                "--out", tmp_path / "z.png")
        err = capsys.readouterr().err
        assert stop.value.code == 2 and f"--refine must be a whole number from 0 (none) to 32, got '{bad}'" in err
        assert not (tmp_path / "z.png").exists()


def test_generate_json_from_files_and_to_several_outputs(model_dir, tmp_path, capsys):
    Image.new("RGB", (64, 64), (200, 30, 30)).save(tmp_path / "photo.png")
    code, out, _ = run(capsys, "generate", "--model", model_dir, "--image", tmp_path / "photo.png", "--to", "text",
                       "--json", "--seed", "4", *FAST)
    result = json.loads(out)
    assert code == 0 and result["modalities"] == ["text"] and isinstance(result["text"], str)
    assert result["settings"]["seed"] == 4 and result["settings"]["steps"] == 3 and result["files"] == {}

    sf.write(tmp_path / "clip.wav", (0.2 * np.sin(np.arange(16000) / 8)).astype(np.float32), 16000)
    code, out, _ = run(capsys, "generate", "--model", model_dir, "--audio", tmp_path / "clip.wav", "--to",
                       "image,text", "--out", tmp_path / "both", "--json", "--cfg", "2", *FAST)
    result = json.loads(out)
    assert code == 0 and result["modalities"] == ["text", "image"]
    assert set(result["files"]) == {"text", "image", "json"}
    assert all(os.path.isfile(path) for path in result["files"].values())
    stage = result["settings"]["text_stage"]  # planned: the text first, unguided (text's defaults), then the picture
    assert stage["guidance_passes"] == 0 and result["settings"]["cfg"] == 2
    # its steps setting (in threshold mode a cap) beside the model calls it took; each call one pass, unguided
    assert 1 <= stage["model_calls"] <= stage["steps"] and stage["forward_passes"] == stage["model_calls"]
    assert result["settings"]["guidance_passes"] == result["forward_passes"] - stage["forward_passes"]

    code, out, _ = run(capsys, "generate", "--model", model_dir, "--text", "a blue square", "--to", "image,audio",
                       "--out", tmp_path / "a.png", tmp_path / "a.wav", "--cfg", "text=2", *FAST)
    assert code == 0 and (tmp_path / "a.png").is_file() and (tmp_path / "a.wav").is_file()

    for plan in ("text", "text-only", "none"):  # --plan reaches the pipeline and the summary says which ran
        code, out, _ = run(capsys, "generate", "--model", model_dir, "--to", "text,image", "--plan", plan,
                           "--out", tmp_path / plan, "--json", *FAST)
        assert code == 0 and json.loads(out)["settings"]["plan"] == plan


def test_generate_errors_are_one_line(model_dir, tmp_path, capsys, monkeypatch):
    cases = [(["--text", "a", "--to", "video", "--out", tmp_path / "x.png"], "unknown output 'video'"),
             (["--text", "a", "--to", "image"], "give --out"),
             (["--text", "a", "--to", "image,audio", "--out", tmp_path / "x.png"], "no out path for the audio"),
             (["--text", "a", "--to", "image", "--out", tmp_path / "x.mp4"], "no known extension"),
             (["--image", tmp_path / "missing.png", "--to", "text"], "no such file"),
             (["--text", "a", "--to", "text", "--steps", "0"], "steps must be an int >= 1")]
    for args, message in cases:
        code, _, err = run(capsys, "generate", "--model", model_dir, *args, "--quiet")
        assert code == 2 and err.startswith("error: ") and message in err and "Traceback" not in err, (args, err)


def test_model_comes_from_the_environment_or_a_clear_error(model_dir, capsys, monkeypatch, tmp_path):
    import unimodal.core.paths as paths

    monkeypatch.setattr(paths, "default_model_dir", lambda: tmp_path / "no-default-model")
    monkeypatch.delenv("UNIMODAL_MODEL", raising=False)
    code, _, err = run(capsys, "generate", "--image", tmp_path / "any.png", "--to", "text", "--quiet")
    assert code == 2 and "--model DIR" in err and "unimodal train" in err
    monkeypatch.setenv("UNIMODAL_MODEL", str(model_dir))
    code, out, err = run(capsys, "generate", "--text", "a", "--to", "image,audio", "--out", tmp_path / "o", "--json",
                         *FAST)
    assert code == 0, err
    assert json.loads(out)["modalities"] == ["image", "audio"]


def test_serve_stdio_answers_each_line_and_survives_bad_requests(model_dir, tmp_path):
    requests = [{"id": 1, "op": "ping"},
                {"id": 2, "op": "generate", "text": "a red circle", "to": "image", "out": str(tmp_path / "s.png"),
                 "steps": 3},
                {"id": 3, "op": "generate", "text": "a red circle", "to": "video"},
                "this line is not JSON",
                {"id": 4, "op": "refine"},
                {"id": 5, "op": "generate", "to": "text", "steps": 2, "seed": 1},
                {"id": 6, "op": "shutdown"},
                {"id": 7, "op": "ping"}]
    lines = [(r if isinstance(r, str) else json.dumps(r)) + "\n" for r in requests]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen([sys.executable, "-m", "unimodal.cli", "serve", "--stdio", "--model", str(model_dir)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)
    try:  # the first answer arrives while stdin stays open: an agent can talk to it line by line
        server.stdin.write(lines[0])
        server.stdin.flush()
        assert select.select([server.stdout], [], [], 120)[0], "no answer to the first request"
        first = server.stdout.readline()
        out, err = server.communicate("".join(lines[1:]), timeout=120)
    finally:
        server.kill()
    assert server.returncode == 0, err
    responses = [json.loads(line) for line in (first + out).splitlines()]
    assert [r["id"] for r in responses] == [1, 2, 3, None, 4, 5, 6]  # nothing after shutdown
    assert [r["ok"] for r in responses] == [True, True, False, False, False, True, True]
    assert responses[0]["result"]["pong"] is True
    assert responses[1]["result"]["files"] == {"image": str((tmp_path / "s.png").resolve())}
    assert Image.open(tmp_path / "s.png").size == (64, 64)
    assert responses[2]["error"]["type"] == "InputError" and "video" in responses[2]["error"]["message"]
    assert responses[3]["error"]["type"] == "InputError"
    assert "input is required" in responses[4]["error"]["message"]  # a refine request without its file
    assert responses[5]["result"]["modalities"] == ["text"] and responses[5]["result"]["settings"]["seed"] == 1


def test_every_direction_demo_writes_its_files(tiny_model_dir, tmp_path):
    from unimodal.demos.every_direction import main as demo

    demo(["--model", str(tiny_model_dir), "--out", str(tmp_path / "demo"), "--caption", "a red circle"])
    for name in ("text_to_image.png", "text_to_audio.wav", "image_to_text.txt", "audio_to_image.png",
                 "joint/image.png", "joint/audio.wav", "joint/text.txt", "summary.json"):
        assert_output_file(tmp_path / "demo" / name, empty_audio=name == "joint/audio.wav")


def test_codec_train_refuses_options_of_another_codec(tmp_path, capsys):
    cases = [(["image", "--decoder-channels", "64"], "audio codec options, not image"),
             (["text", "--init-from", tmp_path], "not the text codec"),
             (["vocoder", "--decoder-dilations", "1,3"], "audio codec options, not vocoder"),
             (["image", "--codec-mel-fraction", "0.5"], "vocoder option, not image"),
             (["text", "--lr", "1e-3"], "does not apply to the text codec"),
             (["vocoder", "--codec-mel-fraction", "1.5"], "must be in [0, 1]"),
             (["audio", "--lr", "0"], "--lr must be > 0")]
    for args, message in cases:
        code, _, err = run(capsys, "codec", "train", *args, "--out", tmp_path / "run")
        assert code == 2 and message in err and "Traceback" not in err, (args, err)
    assert not (tmp_path / "run").exists()


def test_vocoder_fine_tuning_gets_its_own_defaults_and_flags_win(tmp_path, capsys, monkeypatch):
    import unimodal.training.vocoder

    seen = []
    monkeypatch.setattr(unimodal.training.vocoder, "train_vocoder", lambda codec, out, cfg, resume: seen.append(cfg))
    run(capsys, "codec", "train", "vocoder", "--codec", tmp_path, "--out", tmp_path / "a")
    run(capsys, "codec", "train", "vocoder", "--codec", tmp_path, "--out", tmp_path / "b", "--init-from", tmp_path)
    run(capsys, "codec", "train", "vocoder", "--codec", tmp_path, "--out", tmp_path / "c", "--init-from", tmp_path,
        "--lr", "2e-4", "--codec-mel-fraction", "0.7")
    scratch, fine_tune, flagged = seen
    assert (scratch.lr, scratch.warmup, scratch.codec_mel_fraction, scratch.init_from) == (1e-3, 100, 0.5, None)
    assert (fine_tune.lr, fine_tune.warmup, fine_tune.codec_mel_fraction) == (5e-4, 50, 0.9)
    assert fine_tune.init_from == str(tmp_path)
    assert (flagged.lr, flagged.warmup, flagged.codec_mel_fraction) == (2e-4, 50, 0.7)


def test_train_tasks_flag_sets_the_mixture_and_refuses_bad_pairs(tmp_path, capsys, monkeypatch):
    import unimodal.training.train

    seen = []
    monkeypatch.setattr(unimodal.training.train, "train", lambda out, data, codecs, cfg, resume, options=None: seen.append(cfg) or out)
    run(capsys, "train", "--out", tmp_path / "a", "--tasks", "text->image=3, image->text=2")
    run(capsys, "train", "--out", tmp_path / "b")
    assert seen[0].task_weights == {"text->image": 3.0, "image->text": 2.0}
    assert seen[1].task_weights == unimodal.training.train.TrainConfig().task_weights
    for bad, message in (("text->image", "TASK=WEIGHT"), ("text->picture=1", "text->picture"),
                         ("text->image=-1", ">= 0")):
        with pytest.raises(SystemExit) as exit_info:  # argparse: usage line and the message, exit status 2
            run(capsys, "train", "--out", tmp_path / "c", "--tasks", bad)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and "Traceback" not in err, (bad, err)
    assert len(seen) == 2
