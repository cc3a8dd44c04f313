"""Train the audio codec's vocoder (``unimodal.tokenizers_mm.vocoder.MelVocoder``): log-mel -> waveform.

``unimodal codec train vocoder --codec DIR`` speaks a pool of phonetically diverse text (the audio codec's
own mixture: Faker sentences, frequent-word lines, grammar captions) with random eSpeak voices, and keeps for
every clip its waveform, its true log-mel and the log-mel the codec gives back after encoding and decoding it.
Each batch takes random one-second windows; half of them use the codec's mel as input, so the vocoder learns
both to vocode and to undo some of the codec's smoothing; the target is always the real waveform.

Loss, no discriminator: multi-resolution STFT (spectral convergence + log-magnitude L1 at three window sizes)
and an L1 on the log-mel of the output. The frozen codec is only read. Checkpoints are atomic and the run
resumes; every batch is a pure function of (seed, step).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from unimodal.tokenizers_mm.audio import LOG_FLOOR, AudioCodec
from unimodal.tokenizers_mm.vocoder import MelVocoder, check_vocoder_fits
from unimodal.training.hardware import cpu_autocast_bf16
from unimodal.training.checkpoint import load_checkpoint, restore, resumed_config, save_atomic
from unimodal.training.optim import warmup_cosine
from unimodal.core.errors import DataError

RESOLUTIONS = ((512, 128), (1024, 256), (2048, 512))  # (n_fft, hop) of the multi-resolution STFT loss


@dataclass
class VocoderTrainConfig:
    steps: int = 3000
    batch_size: int = 16
    segment_frames: int = 64  # ~1 s of mel frames
    lr: float = 1e-3
    warmup: int = 100
    pool_size: int = 1500
    codec_mel_fraction: float = 0.5  # share of windows whose input is the codec's decoded mel
    seed: int = 0
    checkpoint_every: int = 200
    bf16: bool | None = None  # None: bf16 autocast where the CPU has bf16 matrix units (training.hardware)
    model: dict = field(default_factory=dict)
    init_from: str | None = None  # a trained vocoder folder to start from (fine-tuning), instead of random weights


# Fine-tuning a trained vocoder onto a (new) codec's mels: a gentler rate, a short warm-up and mostly codec mels,
# since the vocoder already knows true mels. These were the settings of the shipped vocoder's fine-tuning run.
FINETUNE_DEFAULTS = {"lr": 5e-4, "warmup": 50, "codec_mel_fraction": 0.9}


@dataclass
class _Clip:
    wave: torch.Tensor  # (samples,) float16, length (T - 1) * hop
    true_mel: torch.Tensor  # (n_mels, T) float16
    codec_mel: torch.Tensor  # (n_mels, T) float16


def build_pool(cfg: VocoderTrainConfig, codec: AudioCodec, progress: bool = True) -> list[_Clip]:
    """Speak ``pool_size`` texts; keep waveform, true mel and codec mel of each, frame-aligned."""
    from unimodal.training.codec_audio import AudioCodecTrainConfig, pool_texts
    from unimodal.training.data.speech import Voice, synthesize
    from unimodal.core.errors import SpeechSynthesisError

    hop, per_code = codec.model.config.hop_length, codec.model.frames_per_code
    texts = pool_texts(AudioCodecTrainConfig(seed=cfg.seed + 7, pool_size=cfg.pool_size))
    pool = []
    for i, text in enumerate(tqdm(texts, desc="speaking the vocoder pool", disable=not progress, mininterval=10)):
        try:
            wave = torch.from_numpy(synthesize(text, Voice.random(np.random.default_rng([cfg.seed, 3, i]))))
        except SpeechSynthesisError:
            continue
        frames = -(-(1 + len(wave) // hop) // per_code) * per_code  # whole codes
        wave = F.pad(wave, (0, (frames - 1) * hop - len(wave))) if (frames - 1) * hop > len(wave) else wave
        true_mel = codec.frontend.log_mel(wave)[:, :frames]
        with torch.no_grad():
            codec_mel = codec.model.decode_indices(codec.model.encode_indices(true_mel[None]))[0].float()
        pool.append(_Clip(wave[:(frames - 1) * hop].half(), true_mel.half(), codec_mel.half()))
    if not pool:
        raise DataError("eSpeak produced no speech for the vocoder pool")
    return pool


def training_batch(cfg: VocoderTrainConfig, step: int, pool: list[_Clip], hop: int):
    """(B, n_mels, F) input mels and (B, (F - 1) * hop) target waveforms: random windows of random clips."""
    rng = np.random.default_rng([cfg.seed, step])
    frames = cfg.segment_frames
    mels, waves = [], []
    for index in rng.integers(len(pool), size=cfg.batch_size):
        clip = pool[index]
        start = int(rng.integers(max(1, clip.true_mel.shape[1] - frames + 1)))
        source = clip.codec_mel if rng.random() < cfg.codec_mel_fraction else clip.true_mel
        mel = source[:, start:start + frames].float()
        wave = clip.wave[start * hop:(start + frames - 1) * hop].float()
        mels.append(F.pad(mel, (0, frames - mel.shape[1]), value=math.log(LOG_FLOOR)))
        waves.append(F.pad(wave, (0, (frames - 1) * hop - len(wave))))
    return torch.stack(mels), torch.stack(waves)


def stft_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Multi-resolution STFT loss: spectral convergence + log-magnitude L1, averaged over :data:`RESOLUTIONS`."""
    total = prediction.new_zeros(())
    for n_fft, hop in RESOLUTIONS:
        window = torch.hann_window(n_fft, device=prediction.device)
        mags = [torch.stft(x, n_fft, hop, window=window, return_complex=True).abs().clamp_min(1e-7)
                for x in (prediction, target)]
        convergence = torch.linalg.norm(mags[1] - mags[0]) / torch.linalg.norm(mags[1]).clamp_min(1e-7)
        total = total + convergence + F.l1_loss(mags[0].log(), mags[1].log())
    return total / len(RESOLUTIONS)


def train_vocoder(codec_dir: str | Path, out_dir: str | Path, cfg: VocoderTrainConfig | None = None,
                  resume: bool = False, progress: bool = True) -> MelVocoder:
    """Train a vocoder for the codec in ``codec_dir``; the result is saved in ``out_dir/vocoder``."""
    out_dir = Path(out_dir)
    ckpt_path = out_dir / "checkpoint.pt"
    cfg, state = resumed_config(VocoderTrainConfig, cfg, ckpt_path, resume)
    bf16 = cpu_autocast_bf16(cfg.bf16, "vocoder training", progress)
    codec = AudioCodec.from_pretrained(codec_dir)
    hop = codec.model.config.hop_length
    torch.manual_seed(cfg.seed)
    model = MelVocoder(n_mels=codec.model.config.n_mels, n_fft=codec.model.config.n_fft, hop_length=hop,
                       **cfg.model)
    pool = _load_or_build_pool(cfg, codec, _codec_key(codec_dir), out_dir / "pool.pt", progress)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.8, 0.99), weight_decay=0.01)
    if state is None and cfg.init_from:
        model.load_state_dict(MelVocoder.from_pretrained(cfg.init_from).state_dict())
    start = restore(state, model, optimizer)
    model.train()
    bar = tqdm(range(start, cfg.steps), desc="vocoder", disable=not progress, initial=start, total=cfg.steps,
               mininterval=15)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * warmup_cosine(step, cfg.steps, cfg.warmup, min_ratio=0.05)
        mels, waves = training_batch(cfg, step, pool, hop)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            prediction = model(mels)
        prediction = prediction.float()
        spectral = stft_loss(prediction, waves)
        mel_l1 = F.l1_loss(codec.frontend.log_mel(prediction), codec.frontend.log_mel(waves))
        loss = spectral + 0.5 * mel_l1
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", mel_l1=f"{mel_l1.item():.3f}",
                        sec_s=f"{waves.numel() / 16000 / (time.perf_counter() - t0):.0f}")
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            save_atomic({"config": asdict(cfg), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "step": step + 1}, ckpt_path)
    model.eval().save_pretrained(out_dir / "vocoder")
    return model


def _codec_key(codec_dir: str | Path) -> str:
    """The codec's VQ weights, hashed: a pool of decoded mels belongs to one codec."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted((Path(codec_dir) / AudioCodec.WEIGHTS).rglob("*")):
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _load_or_build_pool(cfg: VocoderTrainConfig, codec: AudioCodec, codec_key: str, path: Path,
                        progress: bool) -> list[_Clip]:
    key = [cfg.seed, cfg.pool_size, codec_key]
    if path.exists():
        state = load_checkpoint(path)
        if state.get("key") == key:
            return [_Clip(*clip) for clip in state["pool"]]
    pool = build_pool(cfg, codec, progress)
    save_atomic({"key": key, "pool": [(c.wave, c.true_mel, c.codec_mel) for c in pool]}, path)
    return pool


def attach_vocoder(codec_dir: str | Path, vocoder_dir: str | Path) -> Path:
    """Copy a trained vocoder into an audio codec folder (``codec_dir/vocoder``), where the codec loads it."""
    import shutil

    codec_dir, vocoder_dir = Path(codec_dir), Path(vocoder_dir)
    vocoder = MelVocoder.from_pretrained(vocoder_dir)  # refuse anything else before touching the codec
    check_vocoder_fits(AudioCodec.from_pretrained(codec_dir).model, vocoder, str(vocoder_dir))
    target = codec_dir / AudioCodec.VOCODER
    staging = codec_dir / ".vocoder.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(vocoder_dir, staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


__all__ = ["VocoderTrainConfig", "attach_vocoder", "build_pool", "stft_loss", "train_vocoder", "training_batch"]
