"""Check a request before anything heavy happens: before torch is imported, the model loads or a step runs.

Every front door (``unimodal generate``, ``serve --stdio``, the MCP server, ``UniModal.generate``) calls
:func:`check_request` first, so a wrong request is refused in well under a second with the error type of its
cause (see :mod:`unimodal.core.errors`). The checks read only what they must: an image file's header and pixels, an
audio file's header, a weights file's header; PIL and soundfile are imported only when a file is given.

This module is a leaf: it imports nothing of the project but errors, paths and the caption grammar. The setting
ranges mirror :class:`unimodal.inference.sampler.SamplerConfig` (a property test keeps the two in step), because
importing the sampler means importing torch.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path

from unimodal.core.errors import (DeviceError, EmptyInputError, InputError, InputFileError, ModelFolderError,
                             OutputPathError, SettingError, TextEncodingError)
from unimodal.core.paths import OUTPUT_SUFFIXES
from unimodal.core.seeds import check_seed

MODALITIES = ("text", "image", "audio")
MODES = ("confidence", "threshold", "semi_ar")
SCHEDULES = ("cosine", "linear")
BLOCK_MODES = ("confidence", "threshold")
INPUT_KEYS = MODALITIES
SETTING_KEYS = ("steps", "mode", "tau", "temperature", "top_k", "top_p", "cfg", "seed", "max_text_tokens",
                "max_audio_seconds", "schedule", "block_length", "block_mode", "choice_temperature")
GENERATE_KEYS = INPUT_KEYS + ("to", "out") + SETTING_KEYS
# Reading the first pixels of an image bigger than this is already slow; nothing this model reads is near it.
MAX_IMAGE_PIXELS = 64_000_000


@dataclass
class CheckedRequest:
    """A generate request that passed every check: inputs, outputs (by kind) and settings, ready to run."""

    inputs: dict = field(default_factory=dict)
    to: list[str] = field(default_factory=list)
    outputs: dict[str, Path] = field(default_factory=dict)  # kind ("image", "json", ...) -> file; or "folder"
    settings: dict = field(default_factory=dict)


def check_request(request: Mapping, needs_out: bool = False) -> CheckedRequest:
    """Check a generate request (keys: :data:`GENERATE_KEYS`; file paths for image/audio, as the CLI and the
    servers take them). ``needs_out``: image and audio outputs must have a place (the CLI has no other way to
    hand them back; its message names the CLI's --out)."""
    if not isinstance(request, Mapping):
        raise InputError(f"a request must be a JSON object / dict, got {type(request).__name__}")
    unknown = sorted(set(request) - set(GENERATE_KEYS))
    if unknown:
        raise InputError(f"unknown key(s) {unknown} in a generate request; accepted: {', '.join(GENERATE_KEYS)}")
    checked = CheckedRequest(to=check_to(request.get("to", "image")))
    checked.settings = check_settings({k: request[k] for k in SETTING_KEYS if request.get(k) is not None})
    if "seed" in request and request["seed"] is None:
        checked.settings["seed"] = None  # None asks for a fresh seed; every other None means "the default"
    checked.inputs = check_inputs({k: request[k] for k in INPUT_KEYS if request.get(k) is not None})
    both = [m for m in checked.to if m in checked.inputs]
    if both:
        raise InputError(f"{', '.join(both)} is both an input and an output; generate a modality from the others")
    checked.outputs = plan_outputs(request.get("out"), checked.to, needs_out)
    return checked


# ---- inputs -------------------------------------------------------------------------------------------------------


def check_to(to, where: str = "") -> list[str]:
    """``"image"``, ``"image,audio"`` or ``["image", "audio"]`` -> modalities in canonical order."""
    accepted = "'text', 'image', 'audio', or several as a list or comma-separated string (e.g. 'image,audio')"
    if isinstance(to, str):
        names = [name.strip() for name in to.split(",")]
    elif isinstance(to, Sequence) and all(isinstance(name, str) for name in to):
        names = [name.strip() for name in to]
    else:
        raise InputError(f"{where}to must be {accepted}; got {to!r}")
    unknown = [name for name in names if name not in MODALITIES]
    if unknown or not names:
        raise InputError(f"{where}unknown output {', '.join(map(repr, unknown)) or 'none'} in to={to!r}; "
                         f"accepted: {accepted}")
    return [m for m in MODALITIES if m in names]


def check_inputs(inputs: Mapping) -> dict:
    """Text checked and decoded; image and audio file paths checked readable and decodable."""
    checked = {}
    if "text" in inputs:
        checked["text"] = check_text(inputs["text"])
    for modality, check_file in (("image", check_image_file), ("audio", check_audio_file)):
        if modality in inputs:
            value = inputs[modality]
            if not isinstance(value, (str, os.PathLike)):
                raise InputError(f"{modality} must be a file path here, got {type(value).__name__}")
            checked[modality] = check_file(value, modality)
    return checked


def check_text(value, name: str = "text") -> str:
    """A prompt as a str that encodes as UTF-8. Bytes are decoded as UTF-8; anything undecodable is refused
    (the tokenizer would fail on it deep inside, or a lone surrogate would be silently dropped)."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as error:
            raise TextEncodingError(f"{name} holds bytes that are not UTF-8 (byte {error.start}: "
                                    f"{bytes(value)[error.start:error.start + 1]!r}); give UTF-8 text") from None
    if not isinstance(value, str):
        raise InputError(f"{name} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        # A shell argument with undecodable bytes reaches Python as lone surrogates (PEP 383): say so.
        raise TextEncodingError(f"{name} is not valid Unicode at character {error.start} "
                                f"({value[error.start]!r}): non-UTF-8 bytes or a lone surrogate; give UTF-8 "
                                f"text") from None
    return value


def _readable_file(value, name: str) -> Path:
    path = Path(value).expanduser()
    if path.is_dir():
        raise InputFileError(f"{name}: {str(path)!r} is a folder, not a file")
    if not path.is_file():
        raise InputFileError(f"{name}: no such file {str(path)!r}")
    if not os.access(path, os.R_OK):
        raise InputFileError(f"{name}: {str(path)!r} is not readable (permission denied)")
    return path


def check_image_file(value, name: str = "image") -> Path:
    """An image file PIL can decode, with at least one pixel."""
    from PIL import Image, UnidentifiedImageError

    path = _readable_file(value, name)
    try:
        with Image.open(path) as image:
            size = image.size
            if 0 < size[0] * size[1] <= MAX_IMAGE_PIXELS:
                image.load()  # a truncated file fails here, not at generation time
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as error:
        raise InputFileError(f"{name}: {str(path)!r} is not a readable image ({error})") from None
    check_image_size(size, name)
    return path


def check_image_size(size: tuple[int, int], name: str = "image") -> None:
    width, height = size
    if width == 0 or height == 0:
        raise EmptyInputError(f"{name} is {width}x{height} pixels: an empty image has nothing to read")
    if width * height > MAX_IMAGE_PIXELS:
        raise InputError(f"{name} is {width}x{height} pixels; at most {MAX_IMAGE_PIXELS:,} pixels are read "
                         f"(the model sees 64x64)")


def check_audio_file(value, name: str = "audio") -> Path:
    """An audio file soundfile can read (WAV, FLAC, OGG, ...), with at least one sample."""
    import soundfile as sf

    path = _readable_file(value, name)
    try:
        info = sf.info(str(path))
    except (RuntimeError, OSError) as error:  # soundfile's LibsndfileError is a RuntimeError
        raise InputFileError(f"{name}: {str(path)!r} is not a readable audio file ({error})") from None
    if info.frames <= 0 or info.samplerate <= 0:
        raise EmptyInputError(f"{name}: {str(path)!r} holds no samples")
    return path


# ---- settings -----------------------------------------------------------------------------------------------------


def _int_setting(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SettingError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def _real_setting(name: str, value, accepted: str, ok) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or not ok(value):
        raise SettingError(f"{name} must be a number {accepted}, got {value!r}")
    return value


def _choice_setting(name: str, value, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise SettingError(f"{name} must be one of {choices}, got {value!r}")
    return value


def _cfg_setting(value):
    if isinstance(value, Mapping):
        for modality, scale in value.items():
            if modality not in MODALITIES:
                raise SettingError(f"cfg keys must be input modalities {MODALITIES}, got {modality!r}")
            _real_setting(f"cfg[{modality!r}]", scale, ">= 0", lambda x: x >= 0)
        return dict(value)
    return _real_setting("cfg", value, ">= 0 (or a mapping modality -> scale)", lambda x: x >= 0)


_SETTING_CHECKS = {
    "steps": lambda v: _int_setting("steps", v, 1),
    "top_k": lambda v: _int_setting("top_k", v, 0),
    "block_length": lambda v: _int_setting("block_length", v, 1),
    "max_text_tokens": lambda v: _int_setting("max_text_tokens", v, 1),
    "seed": lambda v: check_seed(v, error=SettingError),
    "mode": lambda v: _choice_setting("mode", v, MODES),
    "schedule": lambda v: _choice_setting("schedule", v, SCHEDULES),
    "block_mode": lambda v: _choice_setting("block_mode", v, BLOCK_MODES),
    "tau": lambda v: _real_setting("tau", v, "in (0, 1]", lambda x: 0 < x <= 1),
    "top_p": lambda v: _real_setting("top_p", v, "in (0, 1]", lambda x: 0 < x <= 1),
    "temperature": lambda v: _real_setting("temperature", v, ">= 0", lambda x: x >= 0),
    "choice_temperature": lambda v: _real_setting("choice_temperature", v, ">= 0", lambda x: x >= 0),
    "max_audio_seconds": lambda v: _real_setting("max_audio_seconds", v, "> 0", lambda x: x > 0),
    "cfg": _cfg_setting,
}


def check_settings(settings: Mapping) -> dict:
    """Types and ranges of the sampling settings (None values mean "the default" and pass). Limits that depend
    on the model (max_text_tokens, max_audio_seconds, steps beyond the slots) are the pipeline's to check."""
    unknown = sorted(set(settings) - set(_SETTING_CHECKS))
    if unknown:
        raise SettingError(f"unknown setting(s) {unknown}; accepted: {', '.join(sorted(_SETTING_CHECKS))}")
    return {name: _SETTING_CHECKS[name](value) for name, value in settings.items() if value is not None}


# ---- outputs ------------------------------------------------------------------------------------------------------


def output_kind(path: Path) -> str | None:
    """The output a file path names by its extension ("image", "audio", "text", "json"), or None for a folder
    (an existing folder, or a path without an extension). An unknown extension is refused, so ``x.jpg2`` never
    silently becomes a folder."""
    if path.is_dir() or not path.suffix:
        return None
    kind = OUTPUT_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise OutputPathError(f"out path {str(path)!r} has no known extension; give a file ending in "
                              f"{', '.join(OUTPUT_SUFFIXES)}, or a folder (a path without an extension)")
    return kind


def plan_outputs(out, to: list[str], needs_out: bool = False) -> dict[str, Path]:
    """Where each output goes: {kind: file}, or {"folder": folder}; {} when ``out`` is None. Every folder that
    would be written is checked writable now, so a long generation never ends in a failed save."""
    if out is None:
        if needs_out and to != ["text"]:
            raise OutputPathError(f"--to {','.join(to)} writes files: give --out PATH (one per output, by "
                                  f"extension: .png image, .wav audio, .txt text) or --out FOLDER")
        return {}
    paths = [out] if isinstance(out, (str, os.PathLike)) else out
    if not isinstance(paths, (list, tuple)) or not paths or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        raise OutputPathError(f"out must be a file path, a list of file paths or a folder, got {out!r}")
    paths = [Path(check_text(os.fspath(p), "out")).expanduser() for p in paths]
    if len(paths) == 1 and output_kind(paths[0]) is None:
        check_writable(paths[0], is_folder=True)
        return {"folder": paths[0]}
    plan = {}
    for path in paths:
        kind = output_kind(path)
        if kind is None or kind in plan:
            why = "is a folder" if kind is None else f"is a second {kind} file"
            raise OutputPathError(f"out path {str(path)!r} {why}; give one file per output "
                                  f"({', '.join(OUTPUT_SUFFIXES)}) or one folder")
        if kind not in to and kind != "json":
            raise OutputPathError(f"out path {str(path)!r} is a {kind} file but to={','.join(to)} makes no {kind}")
        check_writable(path)
        plan[kind] = path
    missing = [m for m in to if m != "text" and m not in plan]
    if missing:
        raise OutputPathError(f"no out path for the {', '.join(missing)} output; give one file per output "
                              f"(e.g. image.png audio.wav) or one folder")
    return plan


def check_writable(path: Path, is_folder: bool = False) -> None:
    """Refuse a path that cannot be written: its nearest existing folder must take a new file (a probe file is
    created and removed, which catches read-only file systems and /proc, where permission bits say yes)."""
    if not is_folder and path.is_dir():
        raise OutputPathError(f"out path {str(path)!r} is an existing folder, not a file")
    folder = path if is_folder else path.parent
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputPathError(f"cannot write {str(path)!r}: {str(existing)!r} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".unimodal-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise OutputPathError(f"cannot write {str(path)!r}: {str(existing)!r} does not take new files "
                              f"({error.strerror or error})") from None


# ---- model folder and device --------------------------------------------------------------------------------------


def check_model_folder(folder) -> Path:
    """A model folder that looks loadable: the parts in place, every JSON parses and every safetensors file is
    as long as its header says (a truncated download or copy is named here instead of failing inside torch)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise InputError(f"model folder {str(folder)!r} does not exist; give a folder written by "
                         f"`unimodal train` (OUT/model) or by UniModal.save_pretrained")
    if not (folder / "model_index.json").is_file() and not (folder / "backbone").is_dir():
        raise ModelFolderError(f"{folder} is not a unimodal model folder: expected model_index.json (a saved "
                               f"pipeline) or backbone/ and layout.json (the model folder a training run writes)")
    for path in sorted(folder.rglob("*.json")):
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ModelFolderError(f"model file {path} is damaged: not valid JSON ({error})") from None
    for path in sorted(folder.rglob("*.safetensors")):
        check_safetensors(path)
    return folder


def check_safetensors(path: Path) -> None:
    """The file holds the 8-byte header length, the JSON header and every tensor's bytes."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as handle:
            (header_len,) = struct.unpack("<Q", handle.read(8))
            if header_len > size - 8:
                raise ValueError(f"its header claims {header_len} bytes but the file has {size}")
            header = json.loads(handle.read(header_len))
            if not isinstance(header, dict):
                raise ValueError("its header is not a JSON object")
            ends = [_tensor_end(entry) for key, entry in header.items() if key != "__metadata__"]
    except (OSError, struct.error, ValueError) as error:
        raise ModelFolderError(f"weights file {path} is damaged ({error}); copy or download it again") from None
    expected = 8 + header_len + max(ends, default=0)
    if size < expected:
        raise ModelFolderError(f"weights file {path} is truncated: {size:,} bytes of {expected:,}; copy or "
                               f"download it again")


def _tensor_end(entry) -> int:
    """Where a tensor's bytes end, from its header entry; ValueError when the entry is not one (a foreign file)."""
    try:
        return int(entry["data_offsets"][1])
    except (TypeError, KeyError, IndexError):
        raise ValueError(f"a header entry without data offsets: {str(entry)[:60]}") from None


def check_device(device: str | None) -> str | None:
    """``None`` (the best available), ``cpu``, or a ``cuda[:i]`` / ``mps`` device that exists here. Only a
    non-CPU device imports torch to look."""
    if device is None or device == "cpu":
        return device
    if not isinstance(device, str) or device.split(":")[0] not in ("cuda", "mps"):
        raise DeviceError(f"unknown device {device!r}; use cpu, cuda, cuda:INDEX or mps (or leave it out)")
    if device.startswith("cuda") and _surely_no_gpu():
        raise DeviceError(f"device {device!r} asked for, but this machine has no GPU (no NVIDIA or AMD device "
                          f"nodes under /dev); use --device cpu or leave --device out")
    import torch

    if device.startswith("mps"):
        if not torch.backends.mps.is_available():
            raise DeviceError("device mps is not available on this machine; use cpu (or leave --device out)")
        return device
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = device.partition(":")[2]
    if count == 0:
        raise DeviceError(f"device {device!r} asked for, but this machine has no usable CUDA GPU (torch "
                          f"{torch.__version__}); use --device cpu or leave --device out")
    if index and (not index.isdigit() or int(index) >= count):
        raise DeviceError(f"device {device!r} does not exist: this machine has {count} CUDA GPU(s), "
                          f"cuda:0..cuda:{count - 1}")
    return device


def _surely_no_gpu() -> bool:
    """True when a GPU is certainly absent, known without importing torch (seconds): on Linux a CUDA or ROCm
    GPU shows up as /dev/nvidia* or /dev/kfd; CUDA_VISIBLE_DEVICES="" or -1 hides every one. Otherwise False,
    and torch is asked."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return True
    if not sys.platform.startswith("linux"):
        return False
    nodes = os.listdir("/dev") if os.path.isdir("/dev") else []
    return not any(name.startswith("nvidia") or name == "kfd" for name in nodes)
