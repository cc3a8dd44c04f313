"""A small process that speaks with eSpeak NG: one request per line on stdin, samples back on stdout.

Why a separate process: eSpeak keeps state between utterances (pitch flutter and filter phases live in
static variables that even ``espeak_Terminate`` does not reset) and seeds its noise from the clock, so the
same text and voice sound slightly different on each call. This worker initialises the engine once, fixes
the noise seed, and forks a child per utterance from that clean state: every utterance starts from the same
state and the samples are a pure function of (text, voice). The worker imports only ctypes and numpy, so a
fork costs about a millisecond — forking the (large) calling process instead would not.

Request: one JSON line ``{"text": str, "voice": {"name", "rate", "pitch", "pitch_range"}}``.
Reply: one status byte (0 ok, 1 bad input, 2 failure), a 4-byte little-endian length, then the payload:
int16 samples at :data:`native_rate` for status 0, else a UTF-8 error message. The first reply, sent on
start, is the native sample rate as a 4-byte integer.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys

import numpy as np

AUDIO_OUTPUT_SYNCHRONOUS = 2
POS_CHARACTER = 1
CHARS_UTF8 = 1
EE_OK = 0
PARAM_RATE, PARAM_VOLUME, PARAM_PITCH, PARAM_RANGE = 1, 2, 3, 4
NOISE_SEED = 1
STATUS_OK, STATUS_BAD_INPUT, STATUS_FAILED = 0, 1, 2

_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class ESpeakEngine:
    """The eSpeak NG C API through ctypes: initialise once, then :meth:`speak`."""

    def __init__(self):
        import espeakng_loader

        self.lib = ctypes.CDLL(espeakng_loader.get_library_path())
        self.lib.espeak_Initialize.restype = ctypes.c_int
        self.lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self.lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        self.lib.espeak_Synth.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                          ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        self.native_rate = self.lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0,
                                                      espeakng_loader.get_data_path().encode(), 0)
        if self.native_rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed (returned {self.native_rate})")
        self.chunks: list[np.ndarray] = []
        self.callback = _CALLBACK(self._collect)  # keep a reference: C holds only the pointer
        self.lib.espeak_SetSynthCallback(self.callback)

    def _collect(self, wav, num_samples, _events) -> int:
        if num_samples > 0 and wav:
            self.chunks.append(np.ctypeslib.as_array(wav, shape=(num_samples,)).copy())
        return 0  # 0 = go on

    def speak(self, text: str, voice: dict) -> np.ndarray:
        """int16 samples at the native rate; raises ValueError for an unknown voice."""
        if self.lib.espeak_SetVoiceByName(voice["name"].encode()) != EE_OK:
            raise ValueError(f"eSpeak has no voice named {voice['name']!r}")
        for param, key in ((PARAM_RATE, "rate"), (PARAM_PITCH, "pitch"), (PARAM_RANGE, "pitch_range")):
            self.lib.espeak_SetParameter(param, int(voice[key]), 0)
        self.lib.espeak_SetParameter(PARAM_VOLUME, 100, 0)
        self.lib.espeak_ng_SetRandSeed(NOISE_SEED)
        self.chunks = []
        data = text.encode("utf-8") + b"\0"
        status = self.lib.espeak_Synth(data, len(data), 0, POS_CHARACTER, 0, CHARS_UTF8, None, None)
        if status != EE_OK:
            raise RuntimeError(f"espeak_Synth failed with status {status}")
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, dtype=np.int16)


def encode_reply(status: int, payload: bytes) -> bytes:
    return struct.pack("<BI", status, len(payload)) + payload


def _speak_reply(engine: ESpeakEngine, request: dict) -> bytes:
    try:
        pcm = engine.speak(request["text"], request["voice"])
        return encode_reply(STATUS_OK, np.ascontiguousarray(pcm, dtype="<i2").tobytes())
    except ValueError as exc:
        return encode_reply(STATUS_BAD_INPUT, str(exc).encode())
    except Exception as exc:  # noqa: BLE001 - reported to the caller, who raises it
        return encode_reply(STATUS_FAILED, f"{type(exc).__name__}: {exc}".encode())


def _reply_from_child(engine: ESpeakEngine, request: dict) -> bytes:
    """Speak in a child forked from the clean engine state; the parent's state never changes."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(_speak_reply(engine, request))
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        reply = pipe.read()
    os.waitpid(pid, 0)
    return reply or encode_reply(STATUS_FAILED, b"the eSpeak child process died")


def serve(stdin=sys.stdin.buffer, stdout=sys.stdout.buffer) -> None:
    engine = ESpeakEngine()
    stdout.write(struct.pack("<I", engine.native_rate))
    stdout.flush()
    for line in stdin:
        reply = _reply_from_child(engine, json.loads(line))
        stdout.write(reply)
        stdout.flush()


if __name__ == "__main__":
    serve()
