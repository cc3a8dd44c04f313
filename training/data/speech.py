"""Speech synthesis with eSpeak NG, loaded from the ``espeakng-loader`` wheel through its C API.

eSpeak answers at its own rate (22050 Hz); we resample to 16 kHz mono float32 in [-1, 1]. Synthesis runs
in a small worker process (see ``_espeak_worker.py`` for why) and is deterministic for a given text and
:class:`Voice`, so data sets built from it rebuild byte-identically.

Why ctypes and not a wrapper package: the wheel ships only the shared library and its voice data; the C API
is six calls, and going through it directly keeps the dependency to that one wheel.
"""

from __future__ import annotations

import atexit
import json
import struct
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from unimodal.training.data._espeak_worker import STATUS_BAD_INPUT, STATUS_OK
from unimodal.core.errors import InputError, SpeechSynthesisError
from unimodal.core.media import SAMPLE_RATE, resample  # noqa: F401 (re-exported for the data builders)


# Base voices and variants that sound clearly different and stay intelligible.
BASE_VOICES = ("en-us", "en", "en-gb-x-rp", "en-gb-scotland")
VARIANTS = ("m1", "m2", "m3", "m4", "m7", "f1", "f2", "f3", "f4")


@dataclass(frozen=True)
class VoiceSet:
    """The voices a data set is spoken in: eSpeak names, and the ranges its rate, pitch and pitch range are drawn
    from (both ends included)."""

    names: tuple[str, ...]
    rate: tuple[int, int]
    pitch: tuple[int, int]
    pitch_range: tuple[int, int]


VOICE_SETS = {
    # Many voices: what audio->text and audio->image must understand. The speech judge (Whisper tiny.en) hears
    # these clips as their own scene about half the time (`unimodal judges`: 0.515 of 200 test captions).
    "varied": VoiceSet(tuple(f"{b}+{v}" for b in BASE_VOICES for v in VARIANTS), (140, 195), (30, 70), (30, 70)),
    # The voices the judge hears best, for speech the model should learn to produce: American English, a slow
    # rate, a middle pitch. Chosen on 60 validation captions per setting: en-us at 130 words a minute 0.87 heard
    # right (en-us+m1 0.87, en-us+f2 0.80, en-us at 145 0.82; en-us+f4 0.58, en-gb-x-rp 0.47, pitch 70 0.63).
    "clear": VoiceSet(("en-us", "en-us+m1", "en-us+f2"), (125, 145), (35, 55), (40, 55)),
}


def check_voices(voices) -> str:
    """A voice set's name as the data builders take it, or an :class:`InputError` naming the choices."""
    if voices not in VOICE_SETS:
        raise InputError(f"--voices must be one of {sorted(VOICE_SETS)} (the eSpeak voices a data set is spoken "
                         f"in), got {voices!r}")
    return voices


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
    def random(rng: np.random.Generator, voices: str = "varied") -> "Voice":
        """A voice drawn from the set ``voices`` (:data:`VOICE_SETS`)."""
        chosen = VOICE_SETS[check_voices(voices)]
        if voices == "varied":  # today's draws, in today's order: data sets built before voice sets rebuild the same
            base = BASE_VOICES[rng.integers(len(BASE_VOICES))]
            variant = VARIANTS[rng.integers(len(VARIANTS))]
            name = f"{base}+{variant}"
        else:
            name = chosen.names[rng.integers(len(chosen.names))]
        return Voice(
            name=name,
            rate=int(rng.integers(chosen.rate[0], chosen.rate[1] + 1)),
            pitch=int(rng.integers(chosen.pitch[0], chosen.pitch[1] + 1)),
            pitch_range=int(rng.integers(chosen.pitch_range[0], chosen.pitch_range[1] + 1)),
        )


class _SpeechWorker:
    """The eSpeak worker process (``training/data/_espeak_worker.py``), started on first use.

    Calls are serialised by a lock; a worker that died is started again on the next call.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.process: subprocess.Popen | None = None
        self.native_rate = 0

    def _start(self) -> None:
        try:
            import espeakng_loader  # noqa: F401  (fail here, clearly, rather than in the worker)
        except ImportError as exc:  # pragma: no cover - core dependency
            raise SpeechSynthesisError("speech synthesis needs the package 'espeakng-loader'") from exc
        worker = Path(__file__).with_name("_espeak_worker.py")  # run by path: it imports only numpy
        self.process = subprocess.Popen([sys.executable, str(worker)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE)
        header = self.process.stdout.read(4)
        if len(header) != 4:
            raise SpeechSynthesisError("the eSpeak worker failed to start (see its error output above)")
        self.native_rate = struct.unpack("<I", header)[0]

    def speak(self, text: str, voice: Voice) -> tuple[np.ndarray, int]:
        """int16 samples and their sample rate."""
        with self.lock:
            if self.process is None or self.process.poll() is not None:
                self._start()
            request = json.dumps({"text": text, "voice": voice.to_dict()}) + "\n"
            try:
                self.process.stdin.write(request.encode())
                self.process.stdin.flush()
                status, length = struct.unpack("<BI", self._read(5))
                payload = self._read(length)
            except (BrokenPipeError, EOFError) as exc:
                self.process = None
                raise SpeechSynthesisError(f"the eSpeak worker died while speaking {text!r}") from exc
        if status == STATUS_OK:
            return np.frombuffer(payload, dtype="<i2").astype(np.int16), self.native_rate
        message = payload.decode(errors="replace")
        if status == STATUS_BAD_INPUT:
            raise InputError(f"{message}; try one of {BASE_VOICES} with a variant such as '+f2'")
        raise SpeechSynthesisError(f"eSpeak failed on {text!r}: {message}")

    def _read(self, n: int) -> bytes:
        data = self.process.stdout.read(n)
        if len(data) != n:
            raise EOFError
        return data

    def close(self) -> None:
        """End the worker: its stdin closed, it leaves its loop; killed if it has not within 5 s. Run at exit, so a
        process that spoke leaves no worker or open pipe behind."""
        with self.lock:
            process, self.process = self.process, None
        if process is None:
            return
        for pipe in (process.stdin, process.stdout):
            try:
                pipe.close()
            except OSError:  # a worker that died: its pipe may be broken
                pass
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


_WORKER = _SpeechWorker()
atexit.register(_WORKER.close)


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
    pcm, native_rate = _WORKER.speak(text, voice or Voice())
    audio = resample(pcm.astype(np.float32) / 32768.0, native_rate, sample_rate)
    audio = np.clip(audio, -1.0, 1.0).astype(np.float32)
    if not is_speech(audio, sample_rate):
        raise SpeechSynthesisError(f"eSpeak produced no speech for {text!r} with voice {voice}")
    return audio
