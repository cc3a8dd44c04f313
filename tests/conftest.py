import json
import os
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass

import pytest

# Tests never touch the user's cache: everything built goes under pytest's temporary folder.


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    os.environ["UNIMODAL_CACHE"] = str(tmp_path_factory.mktemp("unimodal-cache"))
    yield


@pytest.fixture(autouse=True)
def _one_thread():
    """Tests use tiny tensors: one thread is faster, and far faster on a CPU shared with another job."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str


def run_group(cmd, timeout: float, **popen) -> Finished:
    """Run ``cmd`` in a process group of its own, its output in files, and leave no process of it behind.

    ``subprocess.run(capture_output=True, timeout=...)`` can hang past its timeout: it kills the child it started,
    then reads the pipes to their end, which a grandchild (a torch.distributed worker, a training run started by
    a script) still holds open. Here the output goes to files and, on timeout or after a normal exit, the
    whole group is killed, so a hung worker fails the test with its log instead of stalling the suite."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True, **popen)
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # stragglers of a finished run, or the whole hung run
            except ProcessLookupError:
                pass
            proc.wait()
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
    if returncode is None:
        pytest.fail(f"{cmd[:4]} ran past {timeout} s and was killed with its workers; its output ends:\n"
                    f"{texts[0][-3000:]}\n{texts[1][-3000:]}")
    return Finished(returncode, *texts)


def free_port() -> int:
    """A TCP port no process listens on now (for a torch.distributed rendezvous of one test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_scenes(tmp_path_factory):
    """A 40-sample scenes build (train 32 / val 4 / test 4 / heldout 4), with speech."""
    from unimodal.training.data.build import build

    return build("scenes", n=40, seed=0, out=tmp_path_factory.mktemp("data") / "scenes", progress=False)


@pytest.fixture(scope="session")
def tiny_codec_dir(tmp_path_factory):
    """text/, image/, audio/ codecs small enough for tests: a BPE fitted on captions, untrained tiny VQs."""
    import torch

    from unimodal.tokenizers_mm.audio import AudioCodec, AudioVQModel
    from unimodal.tokenizers_mm.image import ImageCodec, ImageVQModel
    from unimodal.tokenizers_mm.text import TextCodec, caption_corpus

    root = tmp_path_factory.mktemp("codecs")
    torch.manual_seed(0)
    TextCodec.train(caption_corpus()[::20], vocab_size=300).save_pretrained(root / "text")
    ImageCodec(ImageVQModel(block_out_channels=(8, 8, 16, 16), norm_num_groups=4, latent_channels=8,
                            vq_embed_dim=4, num_vq_embeddings=32)).save_pretrained(root / "image")
    AudioCodec(AudioVQModel(encoder_channels=16, decoder_channels=16, embed_dim=8, num_codes=32)).save_pretrained(root / "audio")
    return root


TASKS = {"text->image": 3.0, "image->text": 2.0, "text->audio": 2.0, "audio->text": 2.0, "image->audio": 1.0,
         "audio->image": 1.0, "->text+image+audio": 1.0}


def random_tiny_dit(vocab_size: int):
    """Tiny DiT with random weights everywhere (at init adaLN-Zero makes every block the identity)."""
    import torch

    from unimodal.backbone.dit import DiT

    torch.manual_seed(0)
    model = DiT.from_preset("tiny", vocab_size).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model


def write_tiny_model(codec_dir, out, task_weights=TASKS, max_text_len=12):
    """A model folder exactly as training writes it (unimodal.training.train.write_model_folder), with a random DiT."""
    from unimodal.training.tokens import CodecStack
    from unimodal.training.train import EMA, TrainConfig, write_model_folder

    stack = CodecStack.load(codec_dir, max_text_len=max_text_len, max_audio_len=16)
    model = random_tiny_dit(stack.layout.vocab_size)
    cfg = TrainConfig(preset="tiny", task_weights=dict(task_weights))
    return write_model_folder(out, model, EMA(model, 0.999), stack.layout, codec_dir, cfg)


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_codec_dir, tmp_path_factory):
    return write_tiny_model(tiny_codec_dir, tmp_path_factory.mktemp("tiny-model") / "model")


@pytest.fixture(scope="session")
def tiny_caption_model_dir(tiny_codec_dir, tmp_path_factory):
    """The tiny random model with room for a whole scene caption (the tiny BPE spends up to ~20 tokens on one),
    for the demo and the demos/ scripts, which feed it real captions."""
    return write_tiny_model(tiny_codec_dir, tmp_path_factory.mktemp("tiny-caption-model") / "model", max_text_len=32)


def toy_layout():
    """A layout small enough to write tokens of every modality by hand."""
    from unimodal.tokenizers_mm.layout import Layout

    return Layout(text_vocab_size=40, image_codebook_size=16, audio_codebook_size=12, audio_frame_rate=10.0,
                  max_text_len=8, max_audio_len=10)


def mixed_batch(layout, seed=0):
    """One batch of four tasks (text->image, image->text, text->audio, joint) over random tokens of ``layout``."""
    import numpy as np
    import torch

    from unimodal.training.tasks import Task, build_example, collate_examples

    rng = np.random.default_rng(seed)
    tokens = {"text": torch.from_numpy(rng.integers(0, 40, 3)), "image": torch.from_numpy(rng.integers(0, 16, 64)),
              "audio": torch.from_numpy(rng.integers(0, 12, 5))}
    tasks = ["text->image", "image->text", "text->audio", "->text+image+audio"]
    return collate_examples([build_example(layout, tokens, Task.parse(t)) for t in tasks])


def assert_output_file(path, empty_audio: bool = False) -> None:
    """A written output is what its suffix says, whole: a 64x64 RGB picture, a finite mono 16 kHz clip (of some
    length unless ``empty_audio``: a random model may end a clip before it starts), UTF-8 text or JSON."""
    from pathlib import Path

    import numpy as np
    import soundfile as sf
    from PIL import Image

    path = Path(path)
    assert path.is_file(), path
    if path.suffix == ".png":
        with Image.open(path) as image:
            assert image.size == (64, 64) and image.mode == "RGB", (path, image.size, image.mode)
    elif path.suffix == ".wav":
        audio, rate = sf.read(path, dtype="float32")
        assert rate == 16_000 and audio.ndim == 1 and np.isfinite(audio).all(), path
        assert empty_audio or len(audio) > 0, f"{path} holds no sound"
    elif path.suffix in (".txt", ".json"):
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            json.loads(text)
    else:
        raise AssertionError(f"no check for {path}")
