"""Every bad input of issue 16 answered by its own error type, before the model loads, without a traceback; plus
the property that request checking agrees with the sampler's own validation."""

import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from conftest import write_tiny_model
from unimodal import checks
from unimodal.core.errors import (DeviceError, EmptyInputError, InputError, InputFileError, ModelFolderError,
                             OutputPathError, SampleRateError, SettingError, StepsCappedWarning, TextEncodingError,
                             UnimodalError, UnknownWordsWarning)
from unimodal.core.grammar import known_vocabulary
from unimodal.core.paths import atomic_write
from unimodal.results import GenerationResult

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def pipe(tiny_model_dir):
    from unimodal import UniModal

    return UniModal.from_pretrained(tiny_model_dir)


def cli(*argv, stdin=None):
    """The CLI in a fresh process (as a user runs it): exit status and stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    done = subprocess.run([sys.executable, "-m", "unimodal.cli", *map(os.fsencode, argv)], input=stdin,
                          capture_output=True, env=env, cwd=REPO)
    return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")


# ---- the CLI: refused before the model loads, one line, no traceback ------------------------------------------


def test_cli_refusals_name_the_cause_and_never_show_a_traceback(tiny_model_dir, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_model_dir, damaged)
    weights = damaged / "backbone" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    model = ["--model", str(tiny_model_dir)]
    cases = [
        ([*model, "--text", b"a red \xff\xfe circle", "--to", "image", "--out", tmp_path / "a.png"],
         "not valid Unicode"),
        ([*model, "--text", "a red circle", "--out", tmp_path / "a.png", "--device", "cuda:7"], "device"),
        (["--model", damaged, "--text", "a red circle", "--out", tmp_path / "a.png"], "truncated"),
        ([*model, "--text", "a red circle", "--out", "/proc/unimodal.png"], "cannot write '/proc/unimodal.png'"),
        ([*model, "--text", "a red circle", "--out", tmp_path / "a.mp4"], "no known extension"),
        ([*model, "--text", "a red circle", "--out", tmp_path / "a.png", "--tau", "1.5"], "tau must be"),
    ]
    for argv, message in cases:
        code, out, err = cli("generate", *argv)
        assert code == 2 and err.startswith("error: ") and message in err, (argv, err)
        assert "Traceback" not in err and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "a.png").exists()


def test_debug_shows_the_traceback(tmp_path):
    code, _, err = cli("--debug", "generate", "--image", tmp_path / "missing.png", "--to", "text")
    assert code != 0 and "Traceback" in err and "InputFileError" in err


def test_help_and_version_do_not_import_torch():
    code = ("import sys; from unimodal.cli import build_parser; build_parser(['--help']); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    assert cli("--version")[0] == 0 and "unimodal" in cli("--version")[1]


def test_a_closed_output_pipe_ends_quietly():
    """`unimodal bench compare A B | head -1`: the reader goes away before the table is written."""
    reports = [os.path.join(REPO, "docs", "results", name) for name in ("eval_shipped_int8_n200.json",
                                                            "eval_shipped_r5_int8_n200.json")]
    proc = subprocess.Popen([sys.executable, "-m", "unimodal.cli", "bench", "compare", *reports], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the command has printed anything
    err = proc.stderr.read().decode()
    assert proc.wait() == 141 and err == "", err


def test_a_broken_pipe_that_is_not_stdout_is_still_reported(monkeypatch, capsys):
    """Only a reader of stdout going away is quiet: a worker's broken pipe is a bug and says so."""
    import unimodal.cli as cli_module

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    parser = type("Parser", (), {"parse_args": lambda self, argv: type("Args", (), {"func": staticmethod(broken)})()})
    monkeypatch.setattr(cli_module, "build_parser", lambda argv: parser())
    monkeypatch.setattr(cli_module, "_stdout_closed", lambda: False)
    assert cli_module.main(["anything"]) == 1
    assert "internal error BrokenPipeError" in capsys.readouterr().err


def test_every_command_renders_its_help():
    """argparse formats help strings with %: a bare % in one crashed `unimodal train --help` and `bench --help`."""
    import argparse

    from unimodal.cli import build_parser

    parsers, seen = [build_parser(None)], 0  # None: every command, the heavy ones included
    while parsers:
        parser = parsers.pop()
        assert parser.format_help(), parser.prog
        seen += 1
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    assert seen > 20


def test_stdio_server_answers_undecodable_bytes_and_goes_on(tiny_model_dir):
    lines = (b'{"id": 1, "op": "generate", "text": "a red \xff circle", "to": "text", "steps": 1}\n'
             b'{"id": 2, "op": "generate", "text": "a red \\ud800 circle", "to": "image"}\n'
             b'{"id": 3, "op": "ping"}\n')
    code, out, err = cli("serve", "--stdio", "--model", tiny_model_dir, stdin=lines)
    responses = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and "Traceback" not in err
    assert [r["ok"] for r in responses] == [False, False, True]
    assert {r["error"]["type"] for r in responses[:2]} == {"TextEncodingError"}


# ---- the checks, one cause each ------------------------------------------------------------------------------


def test_an_agreement_reading_needs_candidates_to_choose_among():
    """Every front door (CLI, stdio, MCP, generate) checks a request with check_request: the reading is refused
    without candidates, or when it names no reading, before any model loads."""
    request = {"text": "a red circle", "to": "image"}
    with pytest.raises(SettingError, match="needs candidates > 1"):
        checks.check_request({**request, "agreement": "each"})
    with pytest.raises(SettingError, match="agreement must be one of"):
        checks.check_request({**request, "candidates": 2, "agreement": "word"})
    assert checks.check_request({**request, "candidates": 2, "agreement": "each"}).settings["agreement"] == "each"
    assert checks.check_request({**request, "agreement": "joint"}).settings["agreement"] == "joint"  # the default


def test_text_must_be_encodable():
    with pytest.raises(TextEncodingError, match="not valid Unicode at character 6"):
        checks.check_text("a red \udcff circle")
    with pytest.raises(TextEncodingError, match="not UTF-8"):
        checks.check_text(b"a red \xff circle")
    assert checks.check_text("un cercle rouge \u00e9") == "un cercle rouge \u00e9"
    assert checks.check_text("a red circle".encode()) == "a red circle"


def test_input_files_must_be_readable_and_decodable(tmp_path):
    (tmp_path / "not-an-image.png").write_bytes(b"this is text, not a PNG")
    Image.new("RGB", (64, 64)).save(tmp_path / "ok.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "ok.png").read_bytes()[:60])
    (tmp_path / "silence.wav").write_bytes(b"RIFF....WAVE")
    for path, error in ((tmp_path / "missing.png", "no such file"), (tmp_path, "is a folder"),
                        (tmp_path / "not-an-image.png", "not a readable image"),
                        (tmp_path / "cut.png", "not a readable image")):
        with pytest.raises(InputFileError, match=error):
            checks.check_image_file(path)
    with pytest.raises(InputFileError, match="not a readable audio file"):
        checks.check_audio_file(tmp_path / "silence.wav")
    assert checks.check_image_file(tmp_path / "ok.png") == tmp_path / "ok.png"


def test_an_empty_image_is_refused_not_read_as_black(pipe):
    for empty in (np.zeros((0, 0, 3), np.uint8), np.zeros((0, 64, 3), np.uint8), Image.new("RGB", (0, 0))):
        with pytest.raises(EmptyInputError, match="empty image"):
            pipe.generate(image=empty, to="text", steps=1)


def test_audio_needs_a_positive_sample_rate(pipe):
    wave = np.zeros(1600, np.float32)
    for rate in (0, -16000, 0.5, float("nan"), "16k"):
        with pytest.raises(SampleRateError, match="sample rate"):
            pipe.generate(audio=(wave, rate), to="text", steps=1)
    with pytest.raises(EmptyInputError):
        pipe.generate(audio=(np.zeros(0, np.float32), 16000), to="text", steps=1)


def test_outputs_are_checked_writable_before_anything_runs(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    for out, message in (("/proc/x.png", "cannot write"), (tmp_path / "file" / "x.png", "is a file"),
                         (tmp_path / "x.jpg2", "no known extension"), ([tmp_path / "a.png", tmp_path / "b.png"],
                                                                        "second image")):
        with pytest.raises(OutputPathError, match=message):
            checks.plan_outputs(out, ["image"])

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(checks.tempfile, "mkstemp", read_only)
    with pytest.raises(OutputPathError, match="Read-only file system"):
        checks.plan_outputs(tmp_path / "x.png", ["image"])


def test_device_that_does_not_exist(monkeypatch):
    with pytest.raises(DeviceError, match="unknown device"):
        checks.check_device("banana")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(DeviceError, match="no GPU"):
        checks.check_device("cuda")
    assert checks.check_device("cpu") == "cpu" and checks.check_device(None) is None


def test_model_folder_damage_is_named(tiny_model_dir, tmp_path):
    from unimodal import UniModal

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    checks.check_model_folder(folder)
    (folder / "layout.json").write_text("{not json")
    with pytest.raises(ModelFolderError, match="layout.json is damaged"):
        UniModal.from_pretrained(folder)
    shutil.copy(tiny_model_dir / "layout.json", folder / "layout.json")
    weights = next(folder.rglob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1])
    with pytest.raises(ModelFolderError, match="truncated"):
        UniModal.from_pretrained(folder)
    weights.write_bytes(b"\x01")
    with pytest.raises(ModelFolderError, match="damaged"):
        UniModal.from_pretrained(folder)
    weights.write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00[]")  # a header, but not a safetensors one
    with pytest.raises(ModelFolderError, match="not a JSON object"):
        UniModal.from_pretrained(folder)


def test_a_model_folder_missing_a_part_or_a_config_value_is_named(tiny_model_dir, tmp_path):
    from unimodal import UniModal

    damages = {"layout.json": (lambda f: (f / "layout.json").unlink(), "not a unimodal model folder"),
               "image codec": (lambda f: shutil.rmtree(f / "image"), "no image codec"),
               "weights": (lambda f: next((f / "backbone").glob("*.safetensors")).unlink(), "cannot load the model"),
               "config": (lambda f: (f / "backbone" / "config.json").write_text('{"hidden_size": 8}'),
                          "cannot load the model"),
               "layout": (lambda f: (f / "layout.json").write_text("[]"), "malformed layout")}
    for name, (damage, message) in damages.items():
        folder = tmp_path / name
        shutil.copytree(tiny_model_dir, folder)
        damage(folder)
        with pytest.raises(UnimodalError, match=message):
            UniModal.from_pretrained(folder)


# ---- what the pipeline reports -------------------------------------------------------------------------------


def test_steps_beyond_the_slots_are_capped_and_reported(pipe):
    with pytest.warns(StepsCappedWarning, match="steps=100000 is more than the 64 slots"):
        result = pipe.generate(text="a red circle", to="image", steps=100000)
    assert result.settings["steps"] == 64 and result.settings["steps_requested"] == 100000
    assert result.forward_passes <= 64
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit in-range value is not warned about
        again = pipe.generate(text="a red circle", to="image", steps=64)
    assert again.token_ids == result.token_ids and "steps_requested" not in again.settings


def test_unknown_words_are_warned_naming_the_known_ones(tiny_codec_dir, tmp_path):
    from unimodal import UniModal

    folder = write_tiny_model(tiny_codec_dir, tmp_path / "model", max_text_len=32)
    (folder / "vocabulary.json").write_text(json.dumps(known_vocabulary()))
    pipe = UniModal.from_pretrained(folder)
    with pytest.warns(UnknownWordsWarning, match="'white', 'hexagon'.*colors red, orange"):
        result = pipe.generate(text="a white hexagon", to="image", steps=2)
    assert any("never saw" in note for note in result.settings["notes"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownWordsWarning)
        pipe.generate(text="a small red circle on the left", to="image", steps=2)


def test_generate_batch_can_return_errors_in_place(pipe):
    requests = [{"text": "a red circle", "to": "image"}, {"image": np.zeros((0, 0, 3), np.uint8), "to": "text"},
                {"image": "/no/such.png", "to": "text"}, {"text": "a blue square", "to": "image"}]
    with pytest.raises(EmptyInputError):
        pipe.generate_batch(requests, steps=2)
    results = pipe.generate_batch(requests, steps=2, errors="return")
    assert isinstance(results[1], EmptyInputError) and isinstance(results[2], InputFileError)
    alone = [pipe.generate(**requests[i], steps=2, seed=i) for i in (0, 3)]
    assert [results[0].token_ids, results[3].token_ids] == [r.token_ids for r in alone]
    with pytest.raises(InputError, match="'raise' or 'return'"):
        pipe.generate_batch(requests, errors="ignore")


# ---- saving ----------------------------------------------------------------------------------------------------


def result():
    return GenerationResult(text="a red circle", image=Image.new("RGB", (64, 64), (200, 0, 0)),
                            audio=np.zeros(1600, np.float32))


def test_save_by_extension_never_makes_a_folder_of_a_file_name(tmp_path):
    assert result().save(tmp_path / "x.jpg") == [tmp_path / "x.jpg"]
    assert Image.open(tmp_path / "x.jpg").format == "JPEG"
    assert Image.open(result().save(tmp_path / "x.png")[0]).format == "PNG"
    with pytest.raises(OutputPathError, match="no known extension"):
        result().save(tmp_path / "x.mp4")
    assert not (tmp_path / "x.mp4").exists()
    assert {p.name for p in result().save(tmp_path / "all")} == {"text.txt", "image.png", "audio.wav", "result.json"}


def test_writes_are_atomic(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")

    def half_then_fail(path):
        path.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(target, half_then_fail)
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]


def test_two_writers_never_leave_half_a_file(tmp_path):
    """Two threads save different pictures to one path while a reader opens it: always a whole PNG."""
    target, seen = tmp_path / "race.png", []
    pictures = [GenerationResult(image=Image.fromarray(np.full((256, 256, 3), v, np.uint8))) for v in (30, 220)]
    writers = [threading.Thread(target=lambda r=r: [r.save(target) for _ in range(25)]) for r in pictures]
    for writer in writers:
        writer.start()
    while any(w.is_alive() for w in writers) or not seen:
        if target.exists():
            with Image.open(target) as image:
                seen.append(int(np.asarray(image)[0, 0, 0]))
    assert set(seen) <= {30, 220} and [p.name for p in tmp_path.iterdir()] == ["race.png"]


# ---- property: request checking accepts exactly what the sampler accepts ---------------------------------------

SETTING_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 70), st.floats(allow_nan=True, width=32),
                           st.sampled_from(["confidence", "threshold", "semi_ar", "cosine", "linear", "fast", ""]),
                           st.dictionaries(st.sampled_from(["text", "image", "audio", "video"]),
                                           st.floats(-1, 5), max_size=2))
SAMPLER_FIELDS = ("steps", "mode", "schedule", "tau", "temperature", "top_k", "top_p", "choice_temperature", "cfg",
                  "seed", "block_length", "block_mode")


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(SAMPLER_FIELDS), SETTING_VALUES, max_size=4))
def test_checked_settings_are_exactly_what_the_sampler_accepts(values):
    from unimodal.inference.sampler import SamplerConfig

    given_values = {k: v for k, v in values.items() if v is not None}
    try:
        SamplerConfig(**given_values)
        sampler_ok = True
    except InputError:
        sampler_ok = False
    try:
        checks.check_settings(given_values)
        checked_ok = True
    except SettingError:
        checked_ok = False
    assert checked_ok == sampler_ok, given_values


def test_the_checks_mirror_the_samplers_choices():
    from unimodal.inference import sampler

    assert (checks.MODES, checks.SCHEDULES, checks.BLOCK_MODES) == (sampler.MODES, sampler.SCHEDULES,
                                                                    sampler.BLOCK_MODES)
    from unimodal.inference import critique

    assert checks.AGREEMENTS == critique.AGREEMENT_READINGS and checks.AGREEMENT_DEFAULT in checks.AGREEMENTS


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.binary(max_size=40))
def test_any_text_is_accepted_or_refused_by_cause(text, raw):
    assert checks.check_text(text) == text  # hypothesis's text has no lone surrogates: every one is accepted whole
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        with pytest.raises(TextEncodingError, match="not UTF-8"):
            checks.check_text(raw)
    else:
        assert checks.check_text(raw) == decoded


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(list(checks.GENERATE_KEYS) + ["op", "video"]),
                       st.one_of(st.none(), st.integers(-2, 3), st.text(max_size=8),
                                 st.lists(st.sampled_from(["text", "image", "audio", "x"]), max_size=3)),
                       max_size=5))
def test_any_request_is_checked_or_refused_with_a_unimodal_error(request):
    try:
        checked = checks.check_request(request)
    except UnimodalError as error:
        assert str(error)  # refused with a message, never a bare error
        return
    # accepted: only keys a generate request has, its targets canonical and none of them also an input
    assert not set(request) - set(checks.GENERATE_KEYS)
    assert checked.to and checked.to == [m for m in ("text", "image", "audio") if m in checked.to]
    assert not set(checked.to) & set(checked.inputs)


# ---- training data: `unimodal train --data` refuses what it cannot train on, in one line -----------------------


def train_cli(capsys, tmp_path, codec_dir, data):
    """`unimodal train` in this process on a tiny preset and one step (should a bad entry ever be accepted)."""
    from unimodal.cli import main

    code = main(["train", "--data", str(data), "--codecs", str(codec_dir), "--out", str(tmp_path / "run"),
                 "--preset", "tiny", "--steps", "1", "--batch-size", "2"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return code, err


def test_training_data_that_cannot_be_trained_on_is_refused(tiny_codec_dir, tiny_scenes, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("a red circle\n")
    (tmp_path / "fake.pack.safetensors").write_text("not a pack")
    weights = next(tiny_codec_dir.rglob("*.safetensors"))
    shutil.copy(weights, tmp_path / "weights.pack.safetensors")  # a safetensors file, but not a pack
    cases = [("imagenet", "neither an embedded set"), (tmp_path / "empty", "neither an embedded set"),
             (tmp_path / "notes.txt", "neither an embedded set"), ("", "--data"),
             (tmp_path / "gone.pack.safetensors", "no such pack file"),
             (tmp_path / "fake.pack.safetensors", "not a readable pack"),
             (tmp_path / "weights.pack.safetensors", "pack format"),
             (f"{tmp_path / 'weights.pack.safetensors'},{tiny_scenes}", "alone"),
             (f"{tiny_scenes}:0", "must be a positive number"), (f"{tiny_scenes}:-2", "must be a positive number"),
             (f"{tiny_scenes}:nan", "must be a positive number"), (f"{tiny_scenes}:0.001", "keeps none of its 32"),
             (f"{tmp_path / 'fake.pack.safetensors'}:2", "weights are set when it is packed"),
             ("imagenet:2", "neither an embedded set")]
    for data, message in cases:
        code, err = train_cli(capsys, tmp_path, tiny_codec_dir, data)
        assert code == 2 and err.startswith("error: ") and message in err, (data, err)
    assert not (tmp_path / "run" / "model").exists()


def test_a_bad_manifest_line_stops_training_naming_the_line(tiny_codec_dir, tmp_path, capsys):
    Image.new("RGB", (64, 64), (200, 0, 0)).save(tmp_path / "red.png")
    manifest = tmp_path / "data.jsonl"
    manifest.write_text(json.dumps({"text": "a red square", "image": "red.png"}) + "\n" +
                        json.dumps({"image": "missing.png"}) + "\n")
    code, err = train_cli(capsys, tmp_path, tiny_codec_dir, manifest)
    assert code == 2 and "line 2" in err and "cannot read image" in err, err


def test_a_pack_without_training_samples_is_refused(tiny_codec_dir, tmp_path, capsys):
    import torch

    from unimodal.training.pack import pack_tokens
    from unimodal.training.tokens import CodecStack

    layout = CodecStack.load(tiny_codec_dir).layout
    pack = pack_tokens({"train": [], "val": [{"text": torch.tensor([1, 2])}]}, layout,
                       tmp_path / "val-only.pack.safetensors", {"codec_fingerprint": "x"})
    code, err = train_cli(capsys, tmp_path, tiny_codec_dir, pack)
    assert code == 2 and "no training samples" in err, err


def test_data_pack_refuses_a_wrong_name_or_source_before_encoding(tiny_codec_dir, tmp_path, capsys):
    from unimodal.cli import main

    for data, out, message in (("scenes", tmp_path / "x.safetensors", "ends with '.pack.safetensors'"),
                               ("imagenet", tmp_path / "x.pack.safetensors", "neither an embedded set")):
        code = main(["data", "pack", "--data", data, "--codecs", str(tiny_codec_dir), "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and message in err and "Traceback" not in err, err
    assert not list(tmp_path.iterdir())


def test_a_home_directory_that_does_not_exist_is_an_input_error():
    """`~0` (no user 0 with a home) made pathlib raise RuntimeError; it is the caller's input, named."""
    from unimodal.core.errors import InputFileError, OutputPathError

    with pytest.raises(InputFileError, match="image: cannot expand '~0'"):
        checks.check_request({"image": "~0", "to": "text"})
    with pytest.raises(OutputPathError, match="out: cannot expand"):
        checks.check_request({"text": "a red circle", "to": "image", "out": "~0/red.png"})
