"""``unimodal serve --stdio``: the model loaded once, one JSON request per line in, one JSON response per line out.

Requests (one JSON object per line on stdin)::

    {"id": 1, "op": "ping"}
    {"id": 2, "op": "generate", "text": "a small red circle on the left", "to": "image", "out": "red.png",
     "steps": 16, "seed": 0}
    {"id": 3, "op": "generate", "audio": "clip.wav", "to": ["text", "image"], "out": "outdir"}
    {"id": 4, "op": "shutdown"}

``op`` defaults to ``generate``. Inputs: ``text`` (a string), ``image`` / ``audio`` (file paths). ``to``: a
modality, a list or ``"image,audio"``. ``out`` (optional): a file whose extension names the output
(``.png`` / ``.jpg`` image, ``.wav`` / ``.flac`` audio, ``.txt`` text, ``.json`` the summary), a list of such files,
or a folder that receives every output. Each request is checked (:func:`unimodal.checks.check_request`) before
anything runs; the error ``type`` names the cause (``InputFileError``, ``TextEncodingError``, ...). Settings: ``steps``, ``mode``, ``tau``, ``temperature``, ``top_k``, ``top_p``, ``cfg``,
``seed``, ``max_text_tokens``, ``max_audio_seconds``, ``schedule``, ``block_length``, ``block_mode``, ``candidates``
(draw that many, keep the one that agrees best with the input), ``accept_confidence`` (with ``candidates``: keep
the first draw when the model's confidence score of it reaches this), ``accept_agreement`` (with ``candidates``:
draw one at a time, keep the first whose agreement score reaches this), ``agreement`` (with ``candidates``: how each
draw is read back, ``joint`` or ``each``), ``refine`` (then that many rounds of refine
against the inputs), ``repair`` (a picture drawn from text or speech: read back and repaired, before any refine
rounds), ``plan`` (``text``, ``text-only`` or ``none``: see :meth:`unimodal.UniModal.generate`), ``rivals`` (a caption
read from a picture checked against the relation turned around; on unless false), ``rephrase`` (speech made from
words read from a picture says the scene in the form the model speaks most clearly; on unless false).

Responses (one JSON object per line on stdout, in request order)::

    {"id": 2, "ok": true, "result": {"text": null, "modalities": ["image"], "token_ids": {...}, "confidence":
     {...}, "forward_passes": 16, "steps": 16, "settings": {...}, "files": {"image": "/abs/red.png"}}}
    {"id": 5, "ok": false, "error": {"type": "InputError", "message": "unknown output 'video' ..."}}

The self-critique ops take a file to work on (``input``, or ``in`` as the CLI spells it: a picture, a clip or
a ``.txt`` caption) and the text it was made from (``prompt``), as ``unimodal critique / refine / edit`` do::

    {"id": 5, "op": "critique", "input": "red.png", "prompt": "a small red circle on the left",
     "critic": "confidence", "fraction": 0.25, "threshold": 0.01, "check": false, "out": "heat.png"}
    {"id": 6, "op": "refine", "input": "red.png", "prompt": "...", "rounds": 3, "budget": 200,
     "critic": "confidence", "regions": [{"box": [0, 16, 32, 48]}], "out": "fixed.png", "trace": "trace.json"}
    {"id": 7, "op": "edit", "input": "red.png", "box": [0, 16, 32, 48], "prompt": "a small blue circle on the
     left", "out": "edited.png"}
    {"id": 8, "op": "edit", "input": "red.png", "instruction": "make the circle blue", "prompt": "a small red
     circle on the left", "out": "blue.png", "trace": "edit.json"}

``critique`` answers its ``scores`` (per token), ``regions`` (native units), ``score``, ``check`` and ``files``
(``out``: the heat map / score curve ``.png`` or the report ``.json``); ``refine`` the refined result, its
``trace`` (every round) and ``files``; ``edit`` the edited result (one region: ``box`` in pixels, ``seconds``
or ``chars``; or an ``instruction``, then also its ``trace``: plan, regions, verdict). They are checked (:func:`unimodal.checks_refine.check_refine_request`) before anything runs, with
the same error types as generate; ``out`` of refine / edit is a file of the input's kind. Files are written
whole or not at all (temporary file, then rename).

A bad request gets an error response and the server goes on. Nothing else is written to stdout (logs,
warnings and progress go to stderr).
The same request handling backs ``unimodal generate`` (:func:`run_generate`, :func:`save_outputs`).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path

from unimodal.checks import (GENERATE_KEYS, INPUT_KEYS, SETTING_KEYS, CheckedRequest, check_device,  # noqa: F401
                             check_model_folder, check_request, plan_outputs)
from unimodal.checks_refine import REFINE_OPS, check_refine_request
from unimodal.core.errors import DeviceError, InputError, UnimodalError
from unimodal.core.paths import MODEL_ENV, default_model_dir, resolve_model_dir  # noqa: F401 (the server's API)
from unimodal.results import save_outputs  # noqa: F401 (part of the server's API)

OPS = ("generate", "critique", "refine", "edit", "ping", "shutdown")


def check_model(model: str | os.PathLike | None, device: str | None = None) -> Path:
    """The model folder and device checked without loading anything: call before :func:`load_pipeline` so a
    wrong one is refused at once."""
    check_device(device)
    return check_model_folder(resolve_model_dir(model))


def load_pipeline(model: str | os.PathLike | None, device: str | None = None):
    folder = check_model(model, device)
    import torch

    from unimodal.pipeline import UniModal

    pipe = UniModal.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return pipe.to(device)
    except (RuntimeError, AssertionError) as error:  # a GPU that is listed but unusable (driver, memory)
        raise DeviceError(f"cannot move the model to {device!r}: {error}") from None


# ---- one generate request (CLI and server) ------------------------------------------------------------------


def run_generate(pipe, request: Mapping, progress: bool = False, checked: CheckedRequest | None = None) -> dict:
    """Generate what ``request`` asks (keys: :data:`GENERATE_KEYS`), save it to ``out``; the JSON-ready result
    with ``files``: {output: absolute path}. ``checked``: the request already checked by the caller."""
    checked = checked or check_request(request)
    result = pipe.generate(**checked.inputs, to=checked.to, progress=progress, **checked.settings)
    files = save_outputs(result, checked.outputs)
    return {**result.to_dict(), "files": files}


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
    if op not in OPS:
        raise InputError(f"unknown op {op!r}; supported ops: {', '.join(OPS)}")
    arguments = {k: v for k, v in request.items() if k not in ("id", "op")}
    if op in REFINE_OPS:
        from unimodal.serve_refine import answer

        return answer(pipe, check_refine_request(op, arguments)), False
    return run_generate(pipe, arguments), False


def _error(error: BaseException) -> dict:
    if os.environ.get("UNIMODAL_DEBUG"):
        traceback.print_exception(error, file=sys.stderr)
    elif not isinstance(error, (UnimodalError, NotImplementedError)):  # a bug: one line, the trace on request
        print(f"unimodal serve: internal error {type(error).__name__}: {error} (UNIMODAL_DEBUG=1 prints the "
              f"traceback)", file=sys.stderr)
    return {"type": type(error).__name__, "message": str(error)}


def serve_stdio(pipe, stdin=None, stdout=None, model_dir: str = "") -> int:
    """Answer requests line by line until ``shutdown`` or the end of ``stdin``; 0 on a clean end."""
    if stdin is None and hasattr(sys.stdin, "reconfigure"):
        # Undecodable bytes become lone surrogates, which the request check refuses by name, instead of a
        # UnicodeDecodeError that would end the server.
        sys.stdin.reconfigure(errors="surrogateescape")
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
