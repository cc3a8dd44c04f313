"""The audio codec (log-mel -> conv VQ -> log-mel -> Griffin-Lim): lengths, silence, persistence, errors,
the Griffin-Lim path, and a tiny training run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from unimodal.tokenizers_mm import Codec, get_codec_class
from unimodal.tokenizers_mm.audio import SILENCE_CODE, AudioCodec, AudioVQModel
from unimodal.core.errors import InputError

SR = 16_000
TINY_MODEL = dict(encoder_channels=16, decoder_channels=16, embed_dim=8, num_codes=32)


def tone(seconds: float, freq: float = 220.0, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SR), np.float32)


@pytest.fixture(scope="module")
def codec() -> AudioCodec:
    torch.manual_seed(0)
    return AudioCodec(AudioVQModel(**TINY_MODEL))


def test_protocol_and_registry(codec):
    assert isinstance(codec, Codec)
    assert get_codec_class("audio") is AudioCodec
    assert codec.modality == "audio" and codec.sample_rate == SR
    assert codec.frame_rate == pytest.approx(16_000 / 1024)  # hop 256, four mel frames per code


def test_codes_follow_duration(codec):
    one, three = codec.encode([tone(1.0), tone(3.0)])
    assert one.dtype == torch.long and one.ndim == 1
    assert len(one) == 16  # 1 + 16000 // 256 = 63 mel frames -> ceil(63 / 4)
    assert abs(len(one) - codec.frame_rate) <= 1
    assert len(three) == 47
    assert ((three >= 0) & (three < codec.codebook_size)).all()


def test_leading_and_trailing_silence_is_trimmed(codec):
    plain, padded = codec.encode([tone(1.0), np.concatenate([silence(1.0), tone(1.0), silence(2.0)])])
    assert abs(len(padded) - len(plain)) <= 1
    (only_silence,) = codec.encode([silence(2.0)])
    assert only_silence.tolist() == [SILENCE_CODE]


def test_inner_silence_gets_the_silence_code_and_sound_never_does(codec):
    (ids,) = codec.encode([np.concatenate([tone(0.5), silence(0.5), tone(0.5)])])
    middle = ids[len(ids) // 2 - 2:len(ids) // 2 + 2]
    assert (middle == SILENCE_CODE).any()
    (sound,) = codec.encode([tone(2.0, freq=330.0)])
    assert (sound != SILENCE_CODE).all()


def test_decode_lengths_and_types(codec):
    ids = codec.encode([tone(1.0), tone(2.0)])
    waves = codec.decode(ids)
    for codes, wave in zip(ids, waves):
        assert wave.dtype == np.float32 and wave.ndim == 1
        assert len(wave) == (len(codes) * 4 - 1) * 256  # 1024 samples (64 ms) per code
        assert np.isfinite(wave).all() and np.abs(wave).max() <= 1.0
    assert codec.decode([torch.zeros(0, dtype=torch.long)])[0].shape == (0,)


def test_save_load_same_codes_and_audio(codec, tmp_path):
    clips = [tone(1.3, 180.0), tone(0.7, 400.0)]
    codec.save_pretrained(tmp_path / "audio")
    loaded = AudioCodec.from_pretrained(tmp_path / "audio")
    assert loaded.codebook_size == codec.codebook_size and loaded.frame_rate == codec.frame_rate
    for a, b in zip(codec.encode(clips), loaded.encode(clips)):
        assert torch.equal(a, b)
    ids = codec.encode(clips)
    for a, b in zip(codec.decode(ids), loaded.decode(ids)):
        np.testing.assert_allclose(a, b, atol=1e-5)  # Griffin-Lim starts from a seeded phase


def test_codes_do_not_depend_on_the_batch(codec):
    alone = codec.encode([tone(1.0)])[0]
    together = codec.encode([tone(3.0, 500.0), tone(1.0)])[1]
    assert torch.equal(alone, together)


@pytest.mark.parametrize("bad, says", [
    ([np.zeros(1000, np.int16)], r"clip 0 must hold floats .*divide int16"),  # integers, not floats
    ([np.zeros((2, 1000), np.float32)], "clip 0 must be 1-D"),  # not mono
    ([np.zeros(0, np.float32)], "clip 0 is empty"),
    ([np.full(1000, np.nan, np.float32)], "clip 0 holds NaN or infinite"),
    ([], "non-empty list .* got an empty list"),
    ("not audio", "non-empty list .* got str"),
    (["not audio"], "clip 0 must be a numpy array or tensor"),
])
def test_encode_rejects_bad_input(codec, bad, says):
    with pytest.raises(InputError, match=says):
        codec.encode(bad)


@pytest.mark.parametrize("bad, says", [
    ([torch.tensor([0, 1, 32])], r"must lie in \[0, 32\), got range \[0, 32\] in clip 0"),  # codebook of 32
    ([torch.tensor([-1])], r"must lie in \[0, 32\), got range \[-1, -1\]"),
    ([torch.tensor([0.5, 1.0])], "must be integers"),
    ([torch.zeros(2, 3, dtype=torch.long)], "must be 1-D"),
    ("ids", "must be a list of 1-D id tensors"),
])
def test_decode_rejects_bad_ids(codec, bad, says):
    with pytest.raises(InputError, match=says):
        codec.decode(bad)


def test_from_pretrained_on_a_wrong_folder(tmp_path):
    with pytest.raises(InputError, match="no audio codec"):
        AudioCodec.from_pretrained(tmp_path)


def _spectral_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of the magnitude spectrograms of two clips (1 = same spectra, ~0 = disjoint)."""
    n = min(len(a), len(b))
    window = torch.hann_window(1024)
    spec = [torch.stft(torch.from_numpy(x[:n]), 1024, 256, window=window, return_complex=True).abs().flatten()
            for x in (a, b)]
    return float(torch.nn.functional.cosine_similarity(spec[0], spec[1], dim=0))


def test_griffin_lim_path_reconstructs_a_tone(codec):
    chord = tone(1.0, 300.0) + tone(1.0, 1200.0, 0.1)
    (rebuilt,) = codec.griffin_lim_only([chord])
    assert abs(len(rebuilt) - len(chord)) <= 1024
    assert _spectral_similarity(chord, rebuilt) > 0.75  # measured 0.83
    assert _spectral_similarity(chord, tone(1.0, 2500.0)) < 0.1  # the measure does tell spectra apart


def test_griffin_lim_path_reconstructs_speech(codec):
    from unimodal.training.data.speech import synthesize

    speech = synthesize("the quick brown fox jumps over the lazy dog")
    (rebuilt,) = codec.griffin_lim_only([speech])
    assert _spectral_similarity(speech, rebuilt) > 0.8  # measured 0.89; another sentence scores 0.18
    n = min(len(speech), len(rebuilt))
    log_mels = [codec.frontend.log_mel(torch.from_numpy(x[:n])) for x in (speech, rebuilt)]
    assert (log_mels[0] - log_mels[1]).abs().mean() * 4.343 < 4.0  # mean log-mel error in dB (measured 2.3)


def test_tiny_training_run_and_resume(tmp_path):
    from unimodal.training.codec_audio import AudioCodecTrainConfig, train_audio_codec, training_batch

    cfg = AudioCodecTrainConfig(steps=2, batch_size=2, pool_size=6, crop_frames=32, checkpoint_every=1,
                                warmup=1, model=dict(TINY_MODEL))
    codec = train_audio_codec(tmp_path / "run", cfg, progress=False)
    assert (tmp_path / "run" / "codec" / "codec.json").is_file()
    assert codec.codebook_size == 32
    (ids,) = codec.encode([tone(1.0)])
    assert len(ids) == 16
    resumed = train_audio_codec(tmp_path / "run", cfg, resume=True, progress=False)  # already done: loads, saves
    assert torch.equal(resumed.encode([tone(1.0)])[0], ids)
    pool = [torch.randn(80, n).half() for n in (10, 50, 90)]
    first, again = training_batch(cfg, 5, pool), training_batch(cfg, 5, pool)
    assert first.shape == (2, 80, 32) and torch.equal(first, again)  # a pure function of (seed, step)


def test_decoder_upgrade_keeps_the_codes_and_trains_only_a_new_decoder(tmp_path):
    from unimodal.training.codec_audio import AudioCodecTrainConfig, train_audio_codec

    base = AudioCodecTrainConfig(steps=2, batch_size=2, pool_size=6, crop_frames=32, checkpoint_every=1,
                                 warmup=1, model=dict(TINY_MODEL))
    source = train_audio_codec(tmp_path / "source", base, progress=False)
    wider = dict(TINY_MODEL, decoder_channels=24, decoder_dilations=(1, 3, 9))
    cfg = AudioCodecTrainConfig(steps=3, batch_size=2, pool_size=6, crop_frames=32, checkpoint_every=1, warmup=1,
                                model=wider, init_from=str(tmp_path / "source" / "codec"))
    upgraded = train_audio_codec(tmp_path / "upgrade", cfg, progress=False)
    clip = [tone(1.0), tone(0.5, 660.0)]
    assert all(torch.equal(a, b) for a, b in zip(source.encode(clip), upgraded.encode(clip)))
    for name, value in source.model.state_dict().items():
        if name.startswith(("encoder.", "quantize.")):
            assert torch.equal(value, upgraded.model.state_dict()[name]), name
    assert upgraded.model.config.decoder_channels == 24 and list(upgraded.model.config.decoder_dilations) == [1, 3, 9]
    assert upgraded.model.config.encoder_channels == source.model.config.encoder_channels
    assert not torch.equal(source.decode_log_mel(source.encode(clip))[0][:, :4],
                           upgraded.decode_log_mel(upgraded.encode(clip))[0][:, :4])
    # resuming keeps the upgraded architecture (the run's config holds the merged model config)
    again = train_audio_codec(tmp_path / "upgrade", None, resume=True, progress=False)
    assert again.model.config.decoder_channels == 24
    assert torch.equal(again.encode(clip)[0], source.encode(clip)[0])


def test_bad_decoder_settings_are_clear_errors():
    from unimodal.tokenizers_mm.audio import AudioVQModel
    from unimodal.core.errors import InputError

    for bad in (dict(decoder_channels=0), dict(decoder_dilations=[]), dict(decoder_dilations=[1, 0]),
                dict(dilations=(1, -3))):
        with pytest.raises(InputError, match=next(iter(bad))):
            AudioVQModel(**TINY_MODEL | bad)


def test_decoder_upgrade_refuses_a_missing_codec(tmp_path):
    from unimodal.training.codec_audio import AudioCodecTrainConfig, train_audio_codec
    from unimodal.core.errors import UnimodalError

    cfg = AudioCodecTrainConfig(steps=1, batch_size=2, pool_size=6, crop_frames=32, model=dict(TINY_MODEL),
                                init_from=str(tmp_path / "nowhere"))
    with pytest.raises(UnimodalError, match="nowhere"):
        train_audio_codec(tmp_path / "run", cfg, progress=False)
