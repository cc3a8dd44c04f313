"""``unimodal serve --stdio``: the model loaded once, one JSON request per line in, one JSON response per line out.

Requests (one JSON object per line on stdin)::

    {"id": 1, "op": "ping"}
    {"id": 2, "op": "generate", "text": "a small red circle on the left", "to": "image", "out": "red.png",
     "steps": 16, "seed": 0}
    {"id": 3, "op": "generate", "audio": "clip.wav", "to": ["text", "image"], "out": "outdir"}
    {"id": 4, "op": "shutdown"}

``op`` defaults to ``generate``. Inputs: ``text`` (a string), ``image`` / ``audio`` (file paths). ``to``: a
modality, a list or ``"image,audio"``. ``out`` (optional): a file whose extension names the output
(``.png`` image, ``.wav`` audio, ``.txt`` text, ``.json`` the summary), a list of such files, or a folder that
receives every output. Settings: ``steps``, ``mode``, ``tau``, ``temperature``, ``top_k``, ``top_p``, ``cfg``,
``seed``, ``max_text_tokens``, ``max_audio_seconds``, ``schedule``, ``block_length``, ``block_mode``.

Responses (one JSON object per line on stdout, in request order)::

    {"id": 2, "ok": true, "result": {"text": null, "modalities": ["image"], "token_ids": {...}, "confidence":
     {...}, "forward_passes": 16, "steps": 16, "settings": {...}, "files": {"image": "/abs/red.png"}}}
    {"id": 5, "ok": false, "error": {"type": "InputError", "message": "unknown output 'video' ..."}}

A bad request gets an error response and the server goes on. Nothing else is written to stdout (logs,
warnings and progress go to stderr). ``edit`` / ``refine`` / ``critique`` are not supported yet.
The same request handling backs ``unimodal generate`` (:func:`run_generate`, :func:`save_outputs`).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path

from unimodal.errors import InputError, UnimodalError

INPUT_KEYS = ("text", "image", "audio")
SETTING_KEYS = ("steps", "mode", "tau", "temperature", "top_k", "top_p", "cfg", "seed", "max_text_tokens",
                "max_audio_seconds", "schedule", "block_length", "block_mode", "choice_temperature")
GENERATE_KEYS = INPUT_KEYS + ("to", "out") + SETTING_KEYS
OPS = ("generate", "ping", "shutdown")
LATER_OPS = ("edit", "refine", "critique")  # arrive with the edit / refine issue
OUTPUT_OF_SUFFIX = {".png": "image", ".wav": "audio", ".txt": "text", ".json": "json"}
MODEL_ENV = "UNIMODAL_MODEL"


def default_model_dir() -> Path:
    return Path(__file__).resolve().parent / "default_model"


def resolve_model_dir(model: str | os.PathLike | None) -> Path:
    """``model``, else ``$UNIMODAL_MODEL``, else the packaged default model; a clear error when there is none."""
    if model:
        return Path(model).expanduser()
    if os.environ.get(MODEL_ENV):
        return Path(os.environ[MODEL_ENV]).expanduser()
    if default_model_dir().is_dir():
        return default_model_dir()
    raise InputError(f"no model given: pass --model DIR (a trained model folder such as OUT/model from "
                     f"`unimodal train --out OUT`, or a folder written by UniModal.save_pretrained) or set "
                     f"{MODEL_ENV}=DIR. To train one: unimodal codec train text|image|audio, then "
                     f"unimodal train --preset small --data scenes --out runs/small")


def load_pipeline(model: str | os.PathLike | None, device: str | None = None):
    import torch

    from unimodal.pipeline import UniModal

    pipe = UniModal.from_pretrained(resolve_model_dir(model))
    pipe.set_progress_bar_config(disable=True)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return pipe.to(device)


# ---- one generate request (CLI and server) ------------------------------------------------------------------


def run_generate(pipe, request: Mapping, progress: bool = False) -> dict:
    """Generate what ``request`` asks (keys: :data:`GENERATE_KEYS`), save it to ``out``; the JSON-ready result
    with ``files``: {output: absolute path}."""
    unknown = sorted(set(request) - set(GENERATE_KEYS))
    if unknown:
        raise InputError(f"unknown key(s) {unknown} in a generate request; accepted: {', '.join(GENERATE_KEYS)}")
    settings = {key: request[key] for key in SETTING_KEYS if request.get(key) is not None}
    inputs = {key: request[key] for key in INPUT_KEYS if request.get(key) is not None}
    result = pipe.generate(**inputs, to=request.get("to", "image"), progress=progress, **settings)
    files = save_outputs(result, request.get("out"))
    return {**result.to_dict(), "files": files}


def save_outputs(result, out) -> dict[str, str]:
    """Save ``result`` to ``out``: None (nothing), one file, a list of files (by extension) or a folder.

    Every image/audio output needs a place once ``out`` is given; text is also in the result itself.
    """
    if out is None:
        return {}
    paths = [out] if isinstance(out, (str, os.PathLike)) else out
    if not isinstance(paths, (list, tuple)) or not paths or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        raise InputError(f"out must be a file path, a list of file paths or a folder, got {out!r}")
    paths = [Path(p).expanduser() for p in paths]
    if len(paths) == 1 and (paths[0].is_dir() or not paths[0].suffix):  # a folder gets everything
        return {path.stem if path.stem != "result" else "json": str(path.resolve()) for path in result.save(paths[0])}
    by_output = {}
    for path in paths:
        kind = OUTPUT_OF_SUFFIX.get(path.suffix.lower())
        if kind is None or kind in by_output:
            why = "has no known extension" if kind is None else f"is a second {kind} file"
            raise InputError(f"out path {str(path)!r} {why}; give one file per output ({', '.join(OUTPUT_OF_SUFFIX)}) "
                             f"or one folder")
        by_output[kind] = path
    missing = [m for m in result.modalities if m != "text" and m not in by_output]
    if missing:
        raise InputError(f"no out path for the {', '.join(missing)} output; give one file per output "
                         f"(e.g. image.png audio.wav) or one folder")
    for kind, path in by_output.items():
        result.save(path)
    return {kind: str(path.resolve()) for kind, path in by_output.items()}


# ---- the stdio server ---------------------------------------------------------------------------------------


def handle(pipe, request, model_dir: str = "") -> tuple[dict, bool]:
    """The response to one parsed request, and whether to stop."""
    if not isinstance(request, dict):
        raise InputError(f"a request must be a JSON object, got {type(request).__name__}")
    op = request.get("op", "generate")
    if op == "ping":
        return {"pong": True, "model": model_dir}, False
    if op == "shutdown":
        return {"shutdown": True}, True
    if op in LATER_OPS:
        raise NotImplementedError(f"op {op!r} is not supported yet (edit/refine come in a later version); "
                                  f"supported ops: {', '.join(OPS)}")
    if op != "generate":
        raise InputError(f"unknown op {op!r}; supported ops: {', '.join(OPS)}")
    return run_generate(pipe, {k: v for k, v in request.items() if k not in ("id", "op")}), False


def _error(error: BaseException) -> dict:
    if not isinstance(error, (UnimodalError, NotImplementedError)) or os.environ.get("UNIMODAL_DEBUG"):
        traceback.print_exception(error, file=sys.stderr)
    return {"type": type(error).__name__, "message": str(error)}


def serve_stdio(pipe, stdin=None, stdout=None, model_dir: str = "") -> int:
    """Answer requests line by line until ``shutdown`` or the end of ``stdin``; 0 on a clean end."""
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    real_stdout, sys.stdout = sys.stdout, sys.stderr  # stray prints must not corrupt the protocol
    try:
        for line in stdin:
            if not line.strip():
                continue
            request_id, stop = None, False
            try:
                request = json.loads(line)
                request_id = request.get("id") if isinstance(request, dict) else None
                result, stop = handle(pipe, request, model_dir)
                response = {"id": request_id, "ok": True, "result": result}
            except json.JSONDecodeError as error:
                response = {"id": None, "ok": False, "error": {"type": "InputError",
                                                               "message": f"not a JSON object: {error}"}}
            except Exception as error:  # noqa: BLE001 - a bad request must never kill the server
                response = {"id": request_id, "ok": False, "error": _error(error)}
            stdout.write(json.dumps(response) + "\n")
            stdout.flush()
            if stop:
                break
    finally:
        sys.stdout = real_stdout
    return 0


__all__ = ["load_pipeline", "resolve_model_dir", "run_generate", "save_outputs", "serve_stdio"]
