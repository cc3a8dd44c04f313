"""Audio codec: 16 kHz speech <-> 31.25 (shipped) or 15.625 codes per second.

Pipeline: waveform -> 80-bin log-mel (n_fft 1024, hop 256: 62.5 frames/s) -> a small 1-D convolutional
encoder that halves time ``num_down`` times (1: one code per 2 mel frames, 32 ms; 2: per 4 frames, 64 ms) ->
codes from a cosine/EMA codebook (the image codec's :class:`~unimodal.tokenizers_mm.image.CosineEMAQuantizer`) -> a
convolutional decoder back to log-mel -> waveform by a trained vocoder (:mod:`unimodal.tokenizers_mm.vocoder`, attached
to the codec folder) or, without one, torchaudio's ``InverseMelScale`` + ``GriffinLim``, which needs no
training: on an 80-bin mel it keeps Whisper's word error rate near the original's (64 bins lose a lot).

Variable length. Leading and trailing silence is trimmed before encoding, so a clip's code count follows its
speech: 1 s of sound gives ``ceil(63 / 2) = 32`` codes at 31.25 codes/s. Inside a clip, every window whose mel
frames are all silent gets the reserved code :data:`SILENCE_CODE` (0); the encoder never picks it for sound.
The same code marks padding in training crops, so the decoder learns one clean representation of silence.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import torchaudio
from diffusers import ModelMixin
from diffusers.configuration_utils import ConfigMixin, register_to_config
from torch import nn

from unimodal.tokenizers_mm.image import CosineEMAQuantizer
from unimodal.core.errors import DataError, InputError
from unimodal.core.int8 import load_pretrained

SAMPLE_RATE = 16_000
SILENCE_CODE = 0
LOG_FLOOR = 1e-5  # log(mel + LOG_FLOOR): digital silence sits at log(1e-5) = -11.5


class MelFrontend(nn.Module):
    """Waveform <-> log-mel, both ways without learned weights (mel filterbank; InverseMelScale + GriffinLim).

    Griffin-Lim starts from a fixed random phase (seeded), so decoding is deterministic.
    """

    def __init__(self, sample_rate: int = SAMPLE_RATE, n_fft: int = 1024, hop_length: int = 256,
                 n_mels: int = 80, f_max: float = 8000.0, griffin_lim_iters: int = 32):
        super().__init__()
        self.hop_length = hop_length
        mel_args = dict(sample_rate=sample_rate, f_min=0.0, f_max=f_max, norm=None, mel_scale="htk")
        self.mel = torchaudio.transforms.MelSpectrogram(n_fft=n_fft, hop_length=hop_length, n_mels=n_mels,
                                                        power=2.0, center=True, **mel_args)
        self.inverse_mel = torchaudio.transforms.InverseMelScale(n_stft=n_fft // 2 + 1, n_mels=n_mels, **mel_args)
        self.griffin_lim = torchaudio.transforms.GriffinLim(n_fft=n_fft, hop_length=hop_length, power=2.0,
                                                            n_iter=griffin_lim_iters, momentum=0.99)

    def log_mel(self, wave: torch.Tensor) -> torch.Tensor:
        """(..., samples) float -> (..., n_mels, 1 + samples // hop) natural-log mel power."""
        return torch.log(self.mel(wave.float()) + LOG_FLOOR)

    @torch.no_grad()
    def waveform(self, log_mel: torch.Tensor) -> torch.Tensor:
        """(..., n_mels, frames) log-mel -> (..., (frames - 1) * hop) waveform in about [-1, 1]."""
        power = (log_mel.float().exp() - LOG_FLOOR).clamp_min(0.0)
        spec = self.inverse_mel(power).clamp_min(0.0)  # least squares may dip below zero
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            wave = self.griffin_lim(spec)
        return wave.clamp(-1.0, 1.0)


class ResBlock1d(nn.Module):
    """x + conv1x1(silu(dilated conv3(silu(x)))); no normalisation, so padding never leaks into statistics."""

    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, 3, padding=dilation, dilation=dilation)
        self.proj = nn.Conv1d(channels, channels, 1)
        nn.init.normal_(self.proj.weight, std=0.1 / math.sqrt(channels))  # start close to identity
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(F.silu(self.conv(F.silu(x))))  # (B, C, T)


def _res_stack(channels: int, dilations: tuple[int, ...]) -> list[nn.Module]:
    return [ResBlock1d(channels, d) for d in dilations]


class SilenceAwareQuantizer(CosineEMAQuantizer):
    """:class:`CosineEMAQuantizer` over time, with code ``SILENCE_CODE`` reserved for silent windows.

    Sound never maps to the silence code; silent windows always do. The code's vector is learned by EMA like
    the others (the mean encoding of silence) and is never restarted.
    """

    def forward(self, z: torch.Tensor, silent: torch.Tensor):
        """z (B, D, T), silent (B, T) bool -> (z_q (B, D, T) straight-through, commitment loss, ids (B, T))."""
        b, d, t = z.shape
        z_unit = F.normalize(z.float().permute(0, 2, 1).reshape(-1, d), dim=1)  # (N, D)
        similarity = z_unit @ self.codebook.t()  # (N, K)
        similarity[:, SILENCE_CODE] = -float("inf")
        indices = torch.where(silent.reshape(-1), SILENCE_CODE, similarity.argmax(dim=1))  # (N,)
        z_q = self.codebook[indices]
        if self.training:
            self._ema_update(z_unit.detach(), indices)
        loss = self.commitment * F.mse_loss(z_unit, z_q.detach())
        z_st = z_unit + (z_q - z_unit).detach()
        return z_st.reshape(b, t, d).permute(0, 2, 1).contiguous().to(z.dtype), loss, indices.reshape(b, t)

    @torch.no_grad()
    def _restart_dead(self, z_unit: torch.Tensor, indices: torch.Tensor | None = None) -> None:
        self.ema_count[SILENCE_CODE].clamp_(min=1.0)  # rare in a batch, but never dead
        super()._restart_dead(z_unit, indices)


class AudioVQModel(ModelMixin, ConfigMixin):
    """Normalised log-mel (B, n_mels, T) <-> codes (B, T / 2**num_down); T must be a multiple of 2**num_down."""

    @register_to_config
    def __init__(self, sample_rate: int = SAMPLE_RATE, n_fft: int = 1024, hop_length: int = 256, n_mels: int = 80,
                 f_max: float = 8000.0, griffin_lim_iters: int = 32, mel_mean: float = -2.0, mel_std: float = 4.0,
                 silence_log_mel: float = -4.0, encoder_channels: int = 192, decoder_channels: int = 256,
                 dilations: tuple[int, ...] = (1, 3), num_down: int = 2, embed_dim: int = 16,
                 num_codes: int = 512, codebook_decay: float = 0.99, commitment: float = 0.25,
                 restart_every: int = 100, dead_threshold: float = 0.03,
                 decoder_dilations: tuple[int, ...] | None = None):
        super().__init__()
        for name, value in (("encoder_channels", encoder_channels), ("decoder_channels", decoder_channels)):
            if not (isinstance(value, int) and value >= 1):
                raise InputError(f"audio codec {name} must be an int >= 1, got {value!r}")
        for name, value in (("dilations", dilations), ("decoder_dilations", decoder_dilations)):
            if value is not None and not (len(value) >= 1 and all(isinstance(d, int) and d >= 1 for d in value)):
                raise InputError(f"audio codec {name} must be a non-empty list of ints >= 1, got {value!r}")
        ce, cd, dil = encoder_channels, decoder_channels, tuple(dilations)
        encoder = [nn.Conv1d(n_mels, ce, 5, padding=2)]
        for _ in range(num_down):
            encoder += _res_stack(ce, dil) + [nn.Conv1d(ce, ce, 4, stride=2, padding=1)]
        encoder += _res_stack(ce, dil) + [nn.SiLU(), nn.Conv1d(ce, embed_dim, 1)]
        self.encoder = nn.Sequential(*encoder)
        self.quantize = SilenceAwareQuantizer(num_codes, embed_dim, decay=codebook_decay, commitment=commitment,
                                              restart_every=restart_every, dead_threshold=dead_threshold)
        # The decoder's first stack runs at the code rate; its dilations set how much context each decoded
        # frame sees (default: the encoder's dilations twice).
        code_rate_dil = tuple(decoder_dilations) if decoder_dilations else dil + dil
        decoder = [nn.Conv1d(embed_dim, cd, 3, padding=1)] + _res_stack(cd, code_rate_dil)
        for _ in range(num_down):
            decoder += [nn.ConvTranspose1d(cd, cd, 4, stride=2, padding=1)] + _res_stack(cd, dil)
        decoder += [nn.SiLU(), nn.Conv1d(cd, n_mels, 5, padding=2)]
        self.decoder = nn.Sequential(*decoder)

    @property
    def frames_per_code(self) -> int:
        return 2 ** self.config.num_down

    def normalize(self, log_mel: torch.Tensor) -> torch.Tensor:
        return (log_mel - self.config.mel_mean) / self.config.mel_std

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.config.mel_std + self.config.mel_mean

    def silent_windows(self, log_mel: torch.Tensor) -> torch.Tensor:
        """(B, n_mels, T) log-mel -> (B, T / frames_per_code) bool: every frame of the window is silent."""
        loud = log_mel.amax(dim=1) >= self.config.silence_log_mel  # (B, T)
        return ~loud.reshape(loud.shape[0], -1, self.frames_per_code).any(dim=2)

    def encode_indices(self, log_mel: torch.Tensor) -> torch.Tensor:
        """(B, n_mels, T) log-mel (not normalised) -> (B, T / frames_per_code) code ids."""
        return self.quantize(self.encoder(self.normalize(log_mel)), self.silent_windows(log_mel))[2]

    def decode_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """(B, L) code ids -> (B, n_mels, L * frames_per_code) log-mel."""
        quant = self.quantize.lookup(indices).permute(0, 2, 1)  # (B, D, L)
        return self.denormalize(self.decoder(quant))

    def reconstruct(self, log_mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training forward: (normalised log-mel reconstruction, commitment loss, code ids)."""
        quant, commit_loss, indices = self.quantize(self.encoder(self.normalize(log_mel)),
                                                    self.silent_windows(log_mel))
        return self.decoder(quant), commit_loss, indices

    def frontend(self) -> MelFrontend:
        c = self.config
        return MelFrontend(c.sample_rate, c.n_fft, c.hop_length, c.n_mels, c.f_max, c.griffin_lim_iters)


def check_clips(clips) -> list[torch.Tensor]:
    """A list of mono float clips (numpy arrays or tensors, 1-D, non-empty, finite) -> float32 tensors.

    One 1-D array alone is taken as a batch of one clip.
    """
    if isinstance(clips, (np.ndarray, torch.Tensor)) and clips.ndim == 1:
        clips = [clips]
    if not isinstance(clips, (list, tuple)) or not clips:
        got = "an empty list" if isinstance(clips, (list, tuple)) else type(clips).__name__
        raise InputError(f"audio must be a non-empty list of 1-D float arrays (16 kHz mono), got {got}")
    out = []
    for i, clip in enumerate(clips):
        if not isinstance(clip, (np.ndarray, torch.Tensor)):
            raise InputError(f"audio clip {i} must be a numpy array or tensor, got {type(clip).__name__}")
        wave = torch.as_tensor(clip)
        if not wave.is_floating_point():
            raise InputError(f"audio clip {i} must hold floats in [-1, 1], got dtype {wave.dtype} "
                             "(divide int16 samples by 32768)")
        if wave.ndim != 1:
            raise InputError(f"audio clip {i} must be 1-D (mono samples), got shape {tuple(wave.shape)}")
        if wave.numel() == 0:
            raise InputError(f"audio clip {i} is empty")
        if not torch.isfinite(wave).all():
            raise InputError(f"audio clip {i} holds NaN or infinite samples")
        out.append(wave.float())
    return out


def trim_silence(log_mel: torch.Tensor, silence_log_mel: float, margin: int = 1) -> torch.Tensor:
    """(n_mels, T) -> the frames from the first to the last loud one (plus ``margin`` frames each side).

    An all-silent clip keeps one frame, so it still encodes to one (silence) code.
    """
    loud = (log_mel.amax(dim=0) >= silence_log_mel).nonzero().flatten()
    if len(loud) == 0:
        return log_mel[:, :1]
    start, end = max(0, int(loud[0]) - margin), min(log_mel.shape[1], int(loud[-1]) + 1 + margin)
    return log_mel[:, start:end]


def pad_frames(log_mel: torch.Tensor, multiple: int) -> torch.Tensor:
    """Pad (..., n_mels, T) on the right with digital silence to a multiple of ``multiple`` frames."""
    extra = -log_mel.shape[-1] % multiple
    return F.pad(log_mel, (0, extra), value=math.log(LOG_FLOOR))


class AudioCodec:
    """16 kHz mono speech <-> ragged lists of local code ids in ``[0, codebook_size)``; see the module doc."""

    modality = "audio"
    pipeline_parts = {"audio_vq": "model", "vocoder": "vocoder"}
    WEIGHTS = "vq"
    silence_code = SILENCE_CODE

    VOCODER = "vocoder"

    def __init__(self, model: AudioVQModel, vocoder=None):
        """``vocoder``: a trained :class:`unimodal.tokenizers_mm.vocoder.MelVocoder` to turn mels into waveforms;
        None: Griffin-Lim."""
        self.model = model.eval()
        self.frontend = model.frontend()
        self.vocoder = vocoder.eval() if vocoder is not None else None

    @property
    def codebook_size(self) -> int:
        return int(self.model.config.num_codes)

    @property
    def sample_rate(self) -> int:
        return int(self.model.config.sample_rate)

    @property
    def frame_rate(self) -> float:
        """Codes per second of audio."""
        c = self.model.config
        return c.sample_rate / (c.hop_length * self.model.frames_per_code)

    def log_mel(self, clip: torch.Tensor) -> torch.Tensor:
        """(samples,) -> (n_mels, T) log-mel with leading/trailing silence trimmed, padded to whole codes."""
        log_mel = trim_silence(self.frontend.log_mel(clip), self.model.config.silence_log_mel)
        return pad_frames(log_mel, self.model.frames_per_code)

    @torch.no_grad()
    def encode(self, clips) -> list[torch.Tensor]:
        """Clips (see :func:`check_clips`) -> one 1-D LongTensor of codes per clip, ~``frame_rate`` per second.

        Clips are encoded one at a time, so a clip's codes never depend on the rest of the batch. The log-mel is
        computed on the CPU and then moved to the VQ's device, so the codec also encodes after ``model.to("cuda")``.
        """
        model = self.model
        return [model.encode_indices(self.log_mel(wave)[None].to(model.device, model.dtype))[0].cpu()
                for wave in check_clips(clips)]

    def _check_ids(self, ids, index: int) -> torch.Tensor:
        if isinstance(ids, torch.Tensor) and ids.is_floating_point():
            raise InputError(f"audio codes {index} must be integers, got dtype {ids.dtype}")
        ids = torch.as_tensor(ids, dtype=torch.long)
        if ids.ndim != 1:
            raise InputError(f"audio codes {index} must be 1-D, got shape {tuple(ids.shape)}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.codebook_size):
            raise InputError(f"audio codes must lie in [0, {self.codebook_size}), got range "
                             f"[{int(ids.min())}, {int(ids.max())}] in clip {index}")
        return ids

    @torch.no_grad()
    def decode_log_mel(self, ids) -> list[torch.Tensor]:
        """Code ids (one 1-D tensor per clip) -> one (n_mels, len * frames_per_code) log-mel per clip."""
        if isinstance(ids, torch.Tensor) and ids.ndim == 1:
            ids = [ids]
        if not isinstance(ids, (list, tuple)) and not (isinstance(ids, torch.Tensor) and ids.ndim == 2):
            raise InputError(f"audio codes must be a list of 1-D id tensors, got {type(ids).__name__}")
        checked = [self._check_ids(x, i) for i, x in enumerate(ids)]
        n_mels = self.model.config.n_mels
        return [self.model.decode_indices(x[None].to(self.model.device))[0].float().cpu() if len(x) else
                torch.zeros(n_mels, 0) for x in checked]

    def decode(self, ids, vocoder: bool | None = None) -> list[np.ndarray]:
        """Code ids -> one float32 waveform at ``sample_rate`` per clip, 1024 samples (64 ms) per code.

        ``vocoder``: True / False forces the trained vocoder / Griffin-Lim; None uses the vocoder when the codec
        has one. No codes give an empty clip.
        """
        return [self.waveform(log_mel, vocoder) if log_mel.shape[-1] else np.zeros(0, np.float32)
                for log_mel in self.decode_log_mel(ids)]

    @torch.no_grad()
    def waveform(self, log_mel: torch.Tensor, vocoder: bool | None = None) -> np.ndarray:
        """One (n_mels, T) log-mel -> float32 waveform, by the vocoder or by Griffin-Lim (see :meth:`decode`)."""
        if vocoder and self.vocoder is None:
            raise InputError("this audio codec has no trained vocoder; decode with vocoder=False (Griffin-Lim)")
        if self.vocoder is not None and vocoder is not False:
            wave = self.vocoder(log_mel[None].to(self.vocoder.device))[0].float().cpu()
        else:
            wave = self.frontend.waveform(log_mel)
        return wave.numpy().astype(np.float32)

    def griffin_lim_only(self, clips) -> list[np.ndarray]:
        """The codec's mel -> Griffin-Lim path without the VQ: the ceiling the codec can reach."""
        return [self.waveform(self.log_mel(wave), vocoder=False) for wave in check_clips(clips)]

    def vocoder_only(self, clips) -> list[np.ndarray]:
        """The codec's mel -> trained vocoder path without the VQ."""
        return [self.waveform(self.log_mel(wave), vocoder=True) for wave in check_clips(clips)]

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        self.model.save_pretrained(directory / self.WEIGHTS)
        if self.vocoder is not None:
            self.vocoder.save_pretrained(directory / self.VOCODER)
        with open(directory / "codec.json", "w") as f:
            json.dump({"modality": self.modality, "class": type(self).__name__, "sample_rate": self.sample_rate,
                       "frame_rate": self.frame_rate, "codebook_size": self.codebook_size,
                       "silence_code": self.silence_code}, f, indent=2)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> "AudioCodec":
        directory = Path(directory)
        if not (directory / cls.WEIGHTS).is_dir():
            raise InputError(f"{directory} holds no audio codec (expected a {cls.WEIGHTS}/ folder)")
        vocoder = None
        if (directory / cls.VOCODER).is_dir():
            from unimodal.tokenizers_mm.vocoder import MelVocoder, check_vocoder_fits

            vocoder = load_pretrained(MelVocoder, directory / cls.VOCODER)
        model = load_pretrained(AudioVQModel, directory / cls.WEIGHTS)
        if vocoder is not None:
            check_vocoder_fits(model, vocoder, str(directory / cls.VOCODER))
        codec = cls(model, vocoder)
        config_path = directory / "codec.json"
        if config_path.is_file():
            saved = json.loads(config_path.read_text())
            if saved.get("codebook_size") not in (None, codec.codebook_size):
                raise DataError(f"{directory}: weights have {codec.codebook_size} codes, codec.json says "
                                f"{saved['codebook_size']}")
        return codec
