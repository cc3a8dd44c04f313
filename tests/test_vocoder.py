"""The audio codec's trained vocoder: shapes, the STFT loss, training/resume, attaching, decoding with it."""

import shutil

import numpy as np
import pytest
import torch

from unimodal.tokenizers_mm.audio import AudioCodec
from unimodal.tokenizers_mm.vocoder import MelVocoder
from unimodal.training.vocoder import VocoderTrainConfig, attach_vocoder, stft_loss, train_vocoder
from unimodal.core.errors import InputError

TINY = dict(channels=32, hidden=64, num_blocks=1)


def test_vocoder_gives_the_griffin_lim_length():
    model = MelVocoder(**TINY).eval()
    with torch.no_grad():
        wave = model(torch.randn(2, 80, 12) - 5)
    assert wave.shape == (2, 11 * 256) and wave.abs().max() <= 1.0


def test_stft_loss_is_zero_for_identical_signals_and_grows_with_noise():
    rng = torch.Generator().manual_seed(0)
    clean = torch.sin(torch.arange(8000) / 7.0)[None]
    noisy = clean + 0.3 * torch.randn(clean.shape, generator=rng)
    assert stft_loss(clean, clean).item() == pytest.approx(0.0, abs=1e-6)
    assert stft_loss(noisy, clean).item() > stft_loss(clean + 0.01 * (noisy - clean), clean).item() > 0


def test_train_resume_attach_and_decode(tiny_codec_dir, tmp_path, monkeypatch):
    import unimodal.training.vocoder as tv

    cfg = VocoderTrainConfig(steps=3, batch_size=2, segment_frames=16, pool_size=3, checkpoint_every=1, bf16=False,
                             model=dict(TINY))
    straight = train_vocoder(tiny_codec_dir / "audio", tmp_path / "straight", cfg, progress=False)
    real_batch = tv.training_batch

    def dies_at_step_2(c, step, *args):
        if step == 2:
            raise KeyboardInterrupt  # killed after the step-2 checkpoint
        return real_batch(c, step, *args)

    monkeypatch.setattr(tv, "training_batch", dies_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        train_vocoder(tiny_codec_dir / "audio", tmp_path / "run", cfg, progress=False)
    monkeypatch.undo()
    resumed = train_vocoder(tiny_codec_dir / "audio", tmp_path / "run", cfg, resume=True, progress=False)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name  # the killed run, resumed, is the run that was never stopped
    longer = train_vocoder(tiny_codec_dir / "audio", tmp_path / "run", VocoderTrainConfig(steps=4, **{
        k: v for k, v in cfg.__dict__.items() if k != "steps"}), resume=True, progress=False)
    assert not torch.equal(resumed.stem.weight, longer.stem.weight)  # a longer run resumes with one more step
    codec_dir = tmp_path / "audio"
    shutil.copytree(tiny_codec_dir / "audio", codec_dir)
    attach_vocoder(codec_dir, tmp_path / "run" / "vocoder")
    codec = AudioCodec.from_pretrained(codec_dir)
    assert codec.vocoder is not None
    ids = [torch.tensor([1, 2, 3])]
    with_vocoder, griffin_lim = codec.decode(ids)[0], codec.decode(ids, vocoder=False)[0]
    assert with_vocoder.shape == griffin_lim.shape and not np.allclose(with_vocoder, griffin_lim)
    with pytest.raises(InputError, match="no trained vocoder"):
        AudioCodec.from_pretrained(tiny_codec_dir / "audio").decode(ids, vocoder=True)


def test_the_pipeline_carries_the_vocoder(tiny_codec_dir, tmp_path):
    from conftest import write_tiny_model
    from unimodal.pipeline import UniModal

    codecs = tmp_path / "codecs"
    shutil.copytree(tiny_codec_dir, codecs)
    MelVocoder(**TINY).save_pretrained(codecs / "audio" / "vocoder")
    pipe = UniModal.from_pretrained(write_tiny_model(codecs, tmp_path / "model"))
    assert pipe.vocoder is not None and pipe.audio_codec.vocoder is pipe.vocoder
    result = pipe.generate(text="a red circle", to="audio", steps=2, seed=0)
    ids = [torch.tensor(result.token_ids["audio"])]
    vocoded, griffin_lim = pipe.audio_codec.decode(ids)[0], pipe.audio_codec.decode(ids, vocoder=False)[0]
    assert result.audio.ndim == 1 and np.allclose(result.audio, vocoded, atol=1e-5)  # spoken through the vocoder
    assert not np.allclose(vocoded, griffin_lim)
    pipe.save_pretrained(tmp_path / "saved")
    assert UniModal.from_pretrained(tmp_path / "saved").vocoder is not None


def test_a_vocoder_for_another_mel_geometry_is_refused(tiny_codec_dir, tmp_path):
    from unimodal.core.errors import DataError

    MelVocoder(n_mels=40, **TINY).save_pretrained(tmp_path / "other")
    codec_dir = tmp_path / "audio"
    shutil.copytree(tiny_codec_dir / "audio", codec_dir)
    with pytest.raises(DataError, match="n_mels=40"):
        attach_vocoder(codec_dir, tmp_path / "other")
    with pytest.raises(InputError, match="frames >= 2"):
        MelVocoder(**TINY)(torch.zeros(1, 80, 1))
