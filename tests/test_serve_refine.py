"""`critique`, `refine` and `edit` through `unimodal serve --stdio` on a tiny untrained model (a subprocess, as a
client would run it): the scores, regions, trace and files come back; bad requests are refused by cause before
anything runs and the server goes on. Also the request checks alone: no torch, one error type per cause."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from unimodal.checks_refine import check_refine_request
from unimodal.core.errors import InputError, InputFileError, OutputPathError, SettingError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "a small red circle on the left"


def serve_stdio(model_dir, requests):
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.run([sys.executable, "-m", "unimodal.cli", "serve", "--stdio", "--model", str(model_dir)],
                            input=lines, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert server.returncode == 0 and "Traceback" not in server.stderr, server.stderr
    return {r["id"]: r for r in map(json.loads, server.stdout.splitlines())}


@pytest.fixture(scope="module")
def answers(tiny_caption_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-refine")
    Image.new("RGB", (64, 64), (220, 40, 40)).save(tmp / "red.png")
    (tmp / "caption.txt").write_text(PROMPT + "\n")
    t = np.arange(12_800) / 16_000
    sf.write(tmp / "clip.wav", (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16_000)
    red = str(tmp / "red.png")
    requests = [
        {"id": "critique", "op": "critique", "input": red, "prompt": PROMPT, "threshold": 1.0,
         "out": str(tmp / "heat.png")},
        {"id": "refine", "op": "refine", "in": red, "prompt": PROMPT, "rounds": 2, "out": str(tmp / "fixed.png"),
         "trace": str(tmp / "trace" / "trace.json")},
        {"id": "planned", "op": "refine", "input": red, "prompt": PROMPT, "rounds": 1,
         "regions": [{"box": [0, 0, 16, 16]}]},
        {"id": "caption", "op": "refine", "input": str(tmp / "caption.txt"), "source": red, "model_caption": True,
         "rounds": 1, "out": str(tmp / "fixed.txt")},
        {"id": "edit", "op": "edit", "input": red, "box": [0, 0, 16, 16], "prompt": "a small blue square",
         "out": str(tmp / "edited.png")},
        {"id": "speech", "op": "critique", "input": str(tmp / "clip.wav"), "prompt": PROMPT,
         "out": str(tmp / "c.json")},
        {"id": "instructed", "op": "edit", "input": red, "instruction": "make the square blue",
         "prompt": "a large red square in the center", "out": str(tmp / "blue.png"), "trace": str(tmp / "edit.json")},
        {"id": "instructed caption", "op": "edit", "input": str(tmp / "caption.txt"),
         "instruction": "replace 'small' by 'large'"},
        {"id": "bad instruction", "op": "edit", "input": red, "instruction": "make the triangle blue",
         "prompt": "a large red square in the center", "out": str(tmp / "never.png")},
        {"id": "bad critique", "op": "critique", "input": str(tmp / "nope.png")},
        {"id": "bad refine", "op": "refine", "input": red, "critic": "psychic"},
        {"id": "bad edit", "op": "edit", "input": red, "seconds": [0, 1], "out": str(tmp / "e.png")},
        {"id": "bad out", "op": "edit", "input": red, "box": [0, 0, 8, 8], "out": str(tmp / "e.wav")},
        {"id": "after", "op": "ping"}]
    return serve_stdio(tiny_caption_model_dir, requests), tmp


def test_critique_answers_scores_regions_and_its_heat_map(answers):
    responses, tmp = answers
    critique = responses["critique"]
    assert critique["ok"], critique
    result = critique["result"]
    assert len(result["scores"]["image"]) == 64 and all(0 <= s <= 1 for s in result["scores"]["image"])
    assert result["regions"] and all("box" in region for region in result["regions"])
    assert result["files"] == {"picture": str((tmp / "heat.png").resolve())}
    assert Image.open(tmp / "heat.png").size == (512, 256)  # the picture and its tinted copy at 4x
    speech = responses["speech"]["result"]
    assert speech["files"] == {"json": str((tmp / "c.json").resolve())}
    assert json.loads((tmp / "c.json").read_text())["scores"] == speech["scores"]


def test_refine_answers_the_result_its_trace_and_files(answers):
    responses, tmp = answers
    refine = responses["refine"]["result"]
    assert refine["modalities"] == ["image"] and len(refine["token_ids"]["image"]) == 64
    assert refine["files"] == {"image": str((tmp / "fixed.png").resolve()),
                               "trace": str((tmp / "trace" / "trace.json").resolve())}
    assert json.loads((tmp / "trace" / "trace.json").read_text()) == refine["trace"]
    assert refine["trace"]["critic"] == "confidence" and len(refine["trace"]["rounds"]) <= 2
    assert not list(tmp.glob(".*.tmp")) and not list((tmp / "trace").glob(".*.tmp"))  # renamed into place
    planned = responses["planned"]["result"]
    assert planned["files"] == {}  # no out: the answer alone
    assert planned["trace"]["rounds"][0]["regions"][0]["box"] == [0, 0, 16, 16]
    caption = responses["caption"]["result"]  # a caption, read against the picture it describes
    assert caption["modalities"] == ["text"] and caption["files"] == {"text": str((tmp / "fixed.txt").resolve())}
    assert caption["trace"]["caption_recipe"] is True and caption["trace"]["thresholds"] == {"text": 0.9}


def test_edit_changes_only_its_box(answers, tiny_caption_model_dir):
    from unimodal import UniModal
    from unimodal.core.media import load_image

    responses, tmp = answers
    edit = responses["edit"]["result"]
    assert edit["files"] == {"image": str((tmp / "edited.png").resolve())}
    assert edit["settings"]["edit"]["tokens_remasked"] == {"image": 4}  # 16x16 pixels: 2x2 codes of 8x8
    codec = UniModal.from_pretrained(tiny_caption_model_dir).image_codec
    source = codec.encode(load_image(tmp / "red.png")[None])[0].tolist()  # the codes the server read
    edited = edit["token_ids"]["image"]
    cols = codec.image_size // 8
    box = {r * cols + c for r in range(2) for c in range(2)}  # the top-left 2x2 codes
    assert len(edited) == len(source) == cols * cols
    assert [e for i, e in enumerate(edited) if i not in box] == [s for i, s in enumerate(source) if i not in box]


def test_an_instructed_edit_answers_its_result_plan_and_verdict(answers):
    responses, tmp = answers
    assert responses["instructed"]["ok"], responses["instructed"]
    edit = responses["instructed"]["result"]
    assert edit["files"] == {"image": str((tmp / "blue.png").resolve()), "trace": str((tmp / "edit.json").resolve())}
    assert json.loads((tmp / "edit.json").read_text()) == edit["trace"]
    plan = edit["trace"]["plan"]
    assert plan["target"] == "a large blue square in the center" and plan["located_by"] == "pixels of its colour"
    assert plan["regions"] == [{"modality": "image", "box": [0, 0, 64, 64]}]  # the picture is all red square
    caption = responses["instructed caption"]["result"]
    assert caption["text"] == "a large red circle on the left" and caption["trace"]["check"]["parses_to_target"]
    error = responses["bad instruction"]["error"]
    assert error["type"] == "InputError" and "names the triangle" in error["message"]
    assert not (tmp / "never.png").exists()


def test_bad_requests_are_refused_by_cause_and_the_server_goes_on(answers):
    responses, tmp = answers
    errors = {name: responses[name]["error"] for name in ("bad critique", "bad refine", "bad edit", "bad out")}
    assert errors["bad critique"]["type"] == "InputFileError" and "no such file" in errors["bad critique"]["message"]
    assert errors["bad refine"]["type"] == "SettingError" and "psychic" in errors["bad refine"]["message"]
    assert errors["bad edit"]["type"] == "InputError" and "audio" in errors["bad edit"]["message"]
    assert errors["bad out"]["type"] == "OutputPathError"
    assert not (tmp / "e.png").exists() and not (tmp / "e.wav").exists()
    assert responses["after"]["ok"] and responses["after"]["result"]["pong"]


# ---- the checks alone ---------------------------------------------------------------------------------------------


def test_checks_import_no_torch():
    code = ("import sys; from unimodal.checks_refine import check_refine_request; import unimodal.serve; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_the_critic_names_mirror_the_critics():
    from unimodal.inference.critique import CRITICS
    from unimodal.inference.refine import EVALUATORS
    from unimodal.checks_refine import CRITICS as CHECKED
    from unimodal.checks_refine import EVALUATORS as CHECKED_EVALUATORS

    assert set(CHECKED) == set(CRITICS) and set(CHECKED_EVALUATORS) == set(EVALUATORS)


@pytest.mark.parametrize("op, request_, error, match", [
    ("critique", {}, InputError, "input is required"),
    ("critique", {"input": "x.mp4"}, InputFileError, "unknown kind of file"),
    ("critique", {"input": "PIC", "steps": 3}, InputError, "unknown key"),
    ("critique", {"input": "PIC", "fraction": 0}, SettingError, "fraction"),
    ("critique", {"input": "PIC", "threshold": 0}, SettingError, r"threshold must be a number in \(0, 1\]"),
    ("critique", {"input": "PIC", "check": "yes"}, SettingError, "true or false"),
    ("critique", {"input": "PIC", "out": "heat.jpg"}, OutputPathError, ".png, .json"),
    ("critique", {"input": "CAPTION", "out": "heat.png"}, OutputPathError, ".json"),
    ("refine", {"input": "PIC", "rounds": 0}, SettingError, "rounds"),
    ("refine", {"input": "PIC", "budget": 1.5}, SettingError, "budget"),
    ("refine", {"input": "PIC", "regions": []}, InputError, "non-empty list"),
    ("refine", {"input": "PIC", "regions": [{"box": [0, 0, 8]}]}, InputError, "4 numbers"),
    ("refine", {"input": "PIC", "trace": "trace.txt"}, OutputPathError, ".json"),
    ("refine", {"input": "PIC", "evaluator": "vibes"}, SettingError, "evaluator must be one of"),
    ("refine", {"input": "PIC", "patience": 0}, SettingError, "patience"),
    ("edit", {"input": "PIC", "box": [0, 0, 8, 8], "candidates": 0}, SettingError, "candidates"),
    ("edit", {"input": "PIC", "box": [0, 0, 8, 8], "candidates": True}, SettingError, "candidates"),
    ("edit", {"input": "PIC", "box": [8, 0, 0, 8]}, InputError, "each end past its start"),
    ("edit", {"input": "PIC", "box": [0, 0, 8, 8], "chars": [0, 2]}, InputError, "exactly one region"),
    ("edit", {"input": "CAPTION", "chars": [0.5, 2]}, InputError, "whole numbers"),
    ("edit", {"input": "EMPTY", "chars": [0, 2]}, InputError, "empty caption"),
    ("edit", {"input": "PIC", "instruction": "paint it blue"}, InputError, "not in the instruction language"),
    ("edit", {"input": "PIC", "instruction": "make it blue", "box": [0, 0, 8, 8]}, InputError, "not both"),
    ("edit", {"input": "CAPTION", "instruction": "make it blue"}, InputError, "edits a picture"),
    ("edit", {"input": "PIC", "instruction": 3}, InputError, "non-empty string"),
    ("edit", {"input": "PIC", "box": [0, 0, 8, 8], "trace": "t.json"}, InputError, "instructed edit"),
    ("edit", {"input": "PIC", "box": [0, 0, 8, 8], "draft": False}, InputError, "only with instruction= on a picture"),
    ("edit", {"input": "CAPTION", "instruction": "replace 'a' by 'b'", "draft": False}, InputError,
     "only with instruction= on a picture"),
    ("edit", {"input": "PIC", "instruction": "make it blue", "draft": "no"}, SettingError,
     "draft must be true or false"),
    ("edit", {"input": "PIC", "instruction": "make it blue", "speech_margin": 0.6}, InputError,
     "only with instruction= on a clip"),
    ("edit", {"input": "CAPTION", "instruction": "replace 'a' by 'b'", "speech_margin": 0.6}, InputError,
     "only with instruction= on a clip"),
    ("edit", {"input": "PIC", "box": [0, 0, 8, 8], "attempts": 2}, InputError, "give it only with instruction="),
    ("edit", {"input": "PIC", "instruction": "make it blue", "refine": 1}, InputError,
     "reviews the stretch an instructed speech edit redid; give it only with instruction= on a clip"),
    ("edit", {"input": "CAPTION", "instruction": "replace 'a' by 'b'", "refine": 0}, InputError,
     "only with instruction= on a clip"),
    ("refine", {"input": "PIC", "repair": True}, InputError, "only with a picture input and its prompt"),
    ("refine", {"input": "PIC", "source": "PIC", "repair": True}, InputError, "is a picture, as is input"),
    ("refine", {"input": "CAPTION", "prompt": "a red circle", "repair": True}, InputError, "give that file as source"),
    ("refine", {"input": "PIC", "prompt": "a red circle", "repair": "yes"}, SettingError,
     "repair must be true or false"),
    ("refine", {"input": "PIC", "prompt": "a red circle", "rounds": 0}, SettingError, "rounds"),
    ("edit", {"input": "PIC", "instruction": "make it blue", "attempts": 0}, SettingError,
     "attempts must be an int from 1 to 16"),
    ("refine", {"input": "CAPTION", "prompt": "a red circle"}, InputError, "give that file as source"),
    ("critique", {"input": "CAPTION", "source": "x.mp4"}, InputFileError, "a picture .* or a clip"),
    ("refine", {"input": "CAPTION", "source": "EMPTY"}, InputFileError, "a picture .* or a clip"),
    ("refine", {"input": "PIC", "source": "PIC"}, InputError, "is a picture, as is input"),
    ("refine", {"input": "CAPTION", "source": 3}, InputError, "source must be a file path"),
    ("refine", {"input": "CAPTION", "source": "nowhere.png"}, InputFileError, "source"),
    ("refine", {"input": "PIC", "model_caption": True}, InputError, "only with both"),
    ("refine", {"input": "CAPTION", "model_caption": True}, InputError, "only with both"),
    ("refine", {"input": "CAPTION", "source": "PIC", "model_caption": "yes"}, SettingError,
     "model_caption must be true or false"),
    ("edit", {"input": "CAPTION", "chars": [0, 2], "source": "PIC"}, InputError, "unknown key"),
])
def test_each_bad_request_names_its_cause(tmp_path, op, request_, error, match):
    Image.new("RGB", (8, 8)).save(tmp_path / "pic.png")
    (tmp_path / "caption.txt").write_text(PROMPT)
    (tmp_path / "empty.txt").write_text(" \n")
    files = {"PIC": "pic.png", "CAPTION": "caption.txt", "EMPTY": "empty.txt"}
    request_ = {**request_, **{key: str(tmp_path / files[request_[key]]) for key in ("input", "source")
                               if isinstance(request_.get(key), str) and request_[key] in files}}
    request_ = {key: str(tmp_path / value) if key in ("out", "trace") else value for key, value in request_.items()}
    with pytest.raises(error, match=match):
        check_refine_request(op, request_)


def test_a_good_request_becomes_the_keywords_of_the_op(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "pic.png")
    checked = check_refine_request("edit", {"in": str(tmp_path / "pic.png"), "box": [0, 0, 8, 8], "prompt": "a"},
                                   default_folder=tmp_path / "calls")
    assert checked.modality == "image" and checked.content == str(tmp_path / "pic.png")
    assert checked.options == {"text": "a", "region": {"modality": "image", "box": [0.0, 0.0, 8.0, 8.0]}}
    assert checked.out == Path(tmp_path / "calls" / "edit.png")
    checked = check_refine_request("edit", {"in": str(tmp_path / "pic.png"), "instruction": "make it blue",
                                            "trace": str(tmp_path / "t.json")})
    assert checked.options == {"instruction": "make it blue"} and checked.trace == tmp_path / "t.json"
    checked = check_refine_request("edit", {"in": str(tmp_path / "pic.png"), "instruction": "make it blue",
                                            "candidates": 4})
    assert checked.options == {"instruction": "make it blue", "candidates": 4}
    checked = check_refine_request("edit", {"in": str(tmp_path / "pic.png"), "instruction": "make it blue",
                                            "draft": False})
    assert checked.options == {"instruction": "make it blue", "draft": False}
    checked = check_refine_request("refine", {"in": str(tmp_path / "pic.png"), "prompt": "a", "evaluator": "agreement"})
    assert checked.options == {"text": "a", "evaluator": "agreement"}
    (tmp_path / "caption.txt").write_text("a small red circle\n")
    checked = check_refine_request("refine", {"in": str(tmp_path / "caption.txt"), "source": str(tmp_path / "pic.png"),
                                              "model_caption": True})
    assert checked.modality == "text" and checked.content == "a small red circle"
    assert checked.options == {"image": str(tmp_path / "pic.png"), "model_caption": True}
