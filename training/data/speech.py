"""Speech synthesis with eSpeak NG, loaded from the ``espeakng-loader`` wheel through its C API.

eSpeak answers at its own rate (22050 Hz); we resample to 16 kHz mono float32 in [-1, 1]. Synthesis is
deterministic for a given text and :class:`Voice`, so data sets built from it rebuild byte-identically.

Why ctypes and not a wrapper package: the wheel ships only the shared library and its voice data; the C API
is six calls, and going through it directly keeps the dependency to that one wheel.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torchaudio.functional as AF

from unimodal.errors import InputError, SpeechSynthesisError

SAMPLE_RATE = 16_000

# eSpeak NG C API constants (speak_lib.h).
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_EE_OK = 0
_NOISE_SEED = 1  # fixed seed of eSpeak's noise generator, so the same input always sounds the same
_PARAM_RATE, _PARAM_VOLUME, _PARAM_PITCH, _PARAM_RANGE = 1, 2, 3, 4

_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)

# Base voices and variants that sound clearly different and stay intelligible.
BASE_VOICES = ("en-us", "en", "en-gb-x-rp", "en-gb-scotland")
VARIANTS = ("m1", "m2", "m3", "m4", "m7", "f1", "f2", "f3", "f4")


@dataclass(frozen=True)
class Voice:
    """How a sentence is spoken: an eSpeak voice name with variant, words per minute, pitch and pitch range."""

    name: str = "en-us"
    rate: int = 165
    pitch: int = 50
    pitch_range: int = 50

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def random(rng: np.random.Generator) -> "Voice":
        base = BASE_VOICES[rng.integers(len(BASE_VOICES))]
        variant = VARIANTS[rng.integers(len(VARIANTS))]
        return Voice(
            name=f"{base}+{variant}",
            rate=int(rng.integers(140, 196)),
            pitch=int(rng.integers(30, 71)),
            pitch_range=int(rng.integers(30, 71)),
        )


class _ESpeak:
    """The process-wide eSpeak engine (the C library keeps global state, so calls are serialised)."""

    def __init__(self):
        try:
            import espeakng_loader
        except ImportError as exc:  # pragma: no cover - core dependency
            raise SpeechSynthesisError("eSpeak NG needs the package 'espeakng-loader'") from exc
        try:
            self.lib = ctypes.CDLL(espeakng_loader.get_library_path())
        except OSError as exc:
            raise SpeechSynthesisError(f"could not load libespeak-ng: {exc}") from exc
        self.lib.espeak_Initialize.restype = ctypes.c_int
        self.lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self.lib.espeak_Synth.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint, ctypes.c_uint,
            ctypes.c_void_p, ctypes.c_void_p,
        ]
        data_path = espeakng_loader.get_data_path().encode()
        self.native_rate = self.lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path, 0)
        if self.native_rate <= 0:
            raise SpeechSynthesisError(f"espeak_Initialize failed (returned {self.native_rate})")
        self._chunks: list[np.ndarray] = []
        self._callback = _CALLBACK(self._collect)  # keep a reference: C holds only the pointer
        self.lib.espeak_SetSynthCallback(self._callback)
        self.lock = threading.Lock()

    def _collect(self, wav, num_samples, _events) -> int:
        if num_samples > 0 and wav:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(num_samples,)).copy())
        return 0  # 0 = keep going

    def synth(self, text: str, voice: Voice) -> np.ndarray:
        """Synthesise in a forked child when the platform can fork, else here.

        eSpeak keeps state between utterances (pitch flutter and filter phases in static variables that even
        espeak_Terminate does not reset), so the same text and voice sound slightly different each call. A
        child forked from the freshly initialised engine always starts from the same state: the samples are a
        pure function of text and voice. A fork costs about a millisecond.
        """
        if not hasattr(os, "fork"):
            return self._synth_here(text, voice)
        with self.lock:
            return _run_in_child(lambda: self._synth_here(text, voice, locked=True))

    def _synth_here(self, text: str, voice: Voice, locked: bool = False) -> np.ndarray:
        with contextlib.nullcontext() if locked else self.lock:
            if self.lib.espeak_SetVoiceByName(voice.name.encode()) != _EE_OK:
                raise InputError(f"eSpeak has no voice named {voice.name!r}; try one of {BASE_VOICES}")
            for param, value in ((_PARAM_RATE, voice.rate), (_PARAM_PITCH, voice.pitch),
                                 (_PARAM_RANGE, voice.pitch_range), (_PARAM_VOLUME, 100)):
                self.lib.espeak_SetParameter(param, int(value), 0)
            self.lib.espeak_ng_SetRandSeed(ctypes.c_long(_NOISE_SEED))  # eSpeak seeds its noise from the clock
            self._chunks = []
            data = text.encode("utf-8") + b"\0"
            status = self.lib.espeak_Synth(data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
            if status != _EE_OK:
                raise SpeechSynthesisError(f"espeak_Synth failed with status {status} for text {text!r}")
            chunks, self._chunks = self._chunks, []
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)


def _run_in_child(make_pcm) -> np.ndarray:
    """Run ``make_pcm`` (returning int16 samples) in a forked child and return what it produced.

    The child sends one status byte and then the samples, or the error message of what it raised, which
    is raised again here as the same kind of error.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: compute, send, exit without running any of the parent's clean-up
        try:
            os.close(read_fd)
            try:
                payload = b"\0" + np.ascontiguousarray(make_pcm(), dtype=np.int16).tobytes()
            except Exception as exc:  # noqa: BLE001 - forwarded to the parent
                kind = b"\1" if isinstance(exc, InputError) else b"\2"
                payload = kind + str(exc).encode()
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(payload)
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        payload = pipe.read()
    os.waitpid(pid, 0)
    if payload[:1] == b"\0":
        return np.frombuffer(payload[1:], dtype=np.int16).copy()
    message = payload[1:].decode(errors="replace") or "the eSpeak synthesis process died"
    raise (InputError if payload[:1] == b"\1" else SpeechSynthesisError)(message)


_ENGINE: _ESpeak | None = None
_ENGINE_LOCK = threading.Lock()


def _engine() -> _ESpeak:
    global _ENGINE
    with _ENGINE_LOCK:
        if _ENGINE is None:
            _ENGINE = _ESpeak()
        return _ENGINE


def resample(audio: np.ndarray, orig_rate: int, new_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Band-limited resampling of a mono float signal (torchaudio's windowed sinc)."""
    if orig_rate == new_rate:
        return audio.astype(np.float32)
    wave = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
    return AF.resample(wave, orig_rate, new_rate).numpy()


def is_speech(audio: np.ndarray, sample_rate: int = SAMPLE_RATE, min_seconds: float = 0.2) -> bool:
    """A cheap check that a clip holds voiced sound: long enough, loud enough, and not a constant tone.

    Speech alternates loud and quiet 20 ms frames; silence, clipping garbage or a pure hum do not.
    """
    if audio.ndim != 1 or len(audio) < min_seconds * sample_rate or not np.all(np.isfinite(audio)):
        return False
    frame = sample_rate // 50
    frames = audio[: len(audio) // frame * frame].reshape(-1, frame)
    energy = np.sqrt((frames**2).mean(axis=1))
    loud = energy > 0.02
    return bool(loud.mean() > 0.2 and energy.max() < 1.0 and energy.std() > 0.01)


def synthesize(text: str, voice: Voice | None = None, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Speak ``text`` with eSpeak NG; returns mono float32 samples in [-1, 1] at ``sample_rate``.

    Raises :class:`SpeechSynthesisError` when the result is not speech (e.g. empty text).
    """
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"text to speak must be a non-empty string, got {text!r}")
    engine = _engine()
    pcm = engine.synth(text, voice or Voice())
    audio = resample(pcm.astype(np.float32) / 32768.0, engine.native_rate, sample_rate)
    audio = np.clip(audio, -1.0, 1.0).astype(np.float32)
    if not is_speech(audio, sample_rate):
        raise SpeechSynthesisError(f"eSpeak produced no speech for {text!r} with voice {voice}")
    return audio
