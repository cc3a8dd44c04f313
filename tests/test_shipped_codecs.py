"""The codecs shipped inside the package load offline and fit the default layout."""

import numpy as np
import torch

from unimodal.training.data.scenes import make_sample
from unimodal.training.tokens import CodecStack
from unimodal.core.paths import PACKAGE_DIR, default_codecs_dir


def test_new_models_train_with_the_default_models_codecs():
    """The shipped model (g1) was trained with the package's best codec set (the 31.25 codes/s audio codec), so
    its folder is the one codec set: a new model trains with what the default model reads."""
    assert default_codecs_dir() == PACKAGE_DIR / "default_model"


def test_shipped_codecs_load_and_round_trip():
    stack = CodecStack.load(PACKAGE_DIR / "default_model")
    layout = stack.layout
    assert (layout.text_vocab_size, layout.image_codebook_size, layout.audio_codebook_size) == (4096, 512, 512)
    assert layout.audio_frame_rate == 31.25 and layout.image_grid == (8, 8)
    assert stack.audio.vocoder is not None  # the trained vocoder ships with each audio codec
    sample = make_sample(0, 2, 0, heldout=False, speech=True)
    assert stack.text.decode(stack.text.encode([sample.text]))[0] == sample.text
    codes = stack.image.encode(sample.image[None])
    recon = stack.image.decode(codes)[0]
    mse = ((recon.astype(np.float64) - sample.image.astype(np.float64)) ** 2).mean()
    assert 10 * np.log10(255**2 / mse) > 24  # a trained codec, not random weights
    audio_ids = stack.audio.encode([sample.audio])[0]
    seconds = len(sample.audio) / 16_000
    assert abs(len(audio_ids) - seconds * layout.audio_frame_rate) <= 0.5 * layout.audio_frame_rate
    assert next(stack.image.model.parameters()).dtype == torch.float32  # stored float16, loaded float32


def test_packaged_default_model_loads_offline_and_generates(monkeypatch):
    from unimodal.pipeline import UniModal
    from unimodal.core.paths import default_model_dir, resolve_model_dir

    monkeypatch.delenv("UNIMODAL_MODEL", raising=False)
    assert resolve_model_dir(None) == default_model_dir()  # generate/serve/eval work without --model
    pipe = UniModal.from_pretrained()  # no folder: the packaged model, offline
    sample = make_sample(0, 2, 0, heldout=False, speech=False)
    caption = pipe.generate(image=sample.image, to="text", steps=8, seed=0)
    check = caption.settings.get("rival_check", {}).get("forward_passes", 0)  # a pair checked against its rival
    assert isinstance(caption.text, str) and caption.text.strip() and caption.forward_passes - check <= 8
    assert caption.settings["temperature"] == 0.0  # captions decode greedily by default
    picture = pipe.generate(text=sample.text, to="image", steps=4, seed=0)
    assert picture.image.size == (64, 64) and picture.settings["cfg"] == 3.0
    # the shipped model carries a trained critic head (trained alone, docs/critique.md): critic="learned" works
    assert pipe.config.critic_trained
    report = pipe.critique(picture, text=sample.text, critic="learned")
    scores = np.array(report.scores["image"])
    assert report.forward_passes == 1 and scores.shape == (64,) and 0 <= scores.min() and scores.max() <= 1
    assert scores.std() > 0.01  # a trained head tells codes apart; an untrained one says 0.5 everywhere


def test_each_shipped_codec_is_stored_once():
    """One shipped folder: the default model carries the codecs it was trained with, and no second codec set sits
    beside it (the old ``default_codecs`` went when g1, trained with its codecs, was shipped); no two shipped
    weight files are the same bytes, and every one is int8-stored."""
    import hashlib

    assert sorted(p.name for p in PACKAGE_DIR.glob("default_*")) == ["default_model"]
    weights = sorted(PACKAGE_DIR.glob("default_model/**/*.safetensors"))
    assert {p.parent.relative_to(PACKAGE_DIR / "default_model").parts[0] for p in weights} == {
        "audio", "backbone", "image"}
    digests = [hashlib.sha256(path.read_bytes()).hexdigest() for path in weights]
    assert len(set(digests)) == len(digests), [str(p) for p in weights]
    assert all(path.name == "int8.safetensors" for path in weights)  # every shipped weight file is int8-stored
