"""``unimodal serve --mcp``: the model as a Model Context Protocol server (stdio transport, the official SDK).

Tools (each argument has a JSON schema, from the annotated signature):

- ``generate``: any inputs (``text``; ``image`` / ``audio`` as file paths) -> any outputs (``to``). A text output
  comes back as text, an image as image content plus its file path, audio as its file path; a last text block
  holds the JSON summary (files, settings used, cost, warnings).

Resources: ``unimodal://vocabulary`` (the words the model was trained on: colours, shapes, sizes, positions,
relations, digits; JSON) and ``unimodal://model`` (folder, modalities, limits; JSON).

Every call is checked (:func:`unimodal.checks.check_request`) before the model is touched; the model loads on
the first call that passes, so a wrong call is refused at once even then. A refused or failed call is a tool
error (``isError``) whose text starts with the error type (``InputFileError: ...``), and the server goes on.

Adding a tool (``critique``, ``refine`` and ``edit`` once ``UniModal`` has them): write ``critique_tool(runner)``
returning a function whose annotated keyword arguments are the tool's schema, build its answer with
:func:`result_content`, and add one line to :data:`TOOLS`. Run it inside :func:`_answering` so errors become
tool errors.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import threading
import traceback
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from unimodal.checks import check_request
from unimodal.errors import MissingDependencyError, UnimodalError

Modality = Literal["text", "image", "audio"]
# MIME type of the image content for each image file suffix the results write.
IMAGE_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
INSTRUCTIONS = ("unimodal: one masked-diffusion model that writes text, images and audio from any of them. Call "
                "generate with a prompt (text), an image file or an audio file, and the outputs you want (to). "
                "Read unimodal://vocabulary first: the model only knows the words it was trained on.")


class Runner:
    """What every tool shares: the model folder, the model (loaded on first use, once) and where outputs go."""

    def __init__(self, model_dir: str | os.PathLike, device: str | None = None,
                 out_dir: str | os.PathLike | None = None):
        self.model_dir, self.device = Path(model_dir), device
        self.out_dir = Path(out_dir).expanduser() if out_dir else _default_out_dir()
        self._pipe = None
        self._lock = threading.Lock()
        self._calls = itertools.count(1)

    def pipe(self):
        with self._lock:  # two first calls at once load it once
            if self._pipe is None:
                from unimodal.serve import load_pipeline

                self._pipe = load_pipeline(self.model_dir, self.device)
            return self._pipe

    def fresh_out(self) -> Path:
        """A new folder for the outputs of a call that named none."""
        return self.out_dir / f"call-{os.getpid()}-{next(self._calls):05d}"

    def vocabulary(self) -> dict:
        path = self.model_dir / "vocabulary.json"
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
        return {"note": "this model folder does not list its training vocabulary (no vocabulary.json); any "
                        "words are taken, none are checked"}


def _default_out_dir() -> Path:
    from unimodal.paths import cache_root

    return cache_root() / "mcp-outputs"


# ---- generate --------------------------------------------------------------------------------------------------


def generate_tool(runner: Runner):
    """The ``generate`` tool over ``runner``."""

    def generate(
        to: Annotated[Modality | list[Modality], Field(
            description="the output(s): 'text', 'image', 'audio' or a list such as ['image', 'audio']")] = "image",
        text: Annotated[str | None, Field(description="a prompt, e.g. 'a small red circle on the left' (see "
                                                      "unimodal://vocabulary for the words the model knows)")] = None,
        image: Annotated[str | None, Field(description="path of an input image file (PNG, JPEG, ...)")] = None,
        audio: Annotated[str | None, Field(description="path of an input audio file (WAV, FLAC, ...)")] = None,
        out: Annotated[str | None, Field(description="where to write: a folder (every output), or a file whose "
                                                     "extension names the one output (.png/.jpg image, "
                                                     ".wav/.flac audio, .txt text). Default: a fresh folder "
                                                     "under the server's output folder")] = None,
        steps: Annotated[int | None, Field(ge=1, description="model calls (the cap in threshold mode); more than "
                                                             "the tokens to fill is capped and reported")] = None,
        mode: Annotated[Literal["confidence", "threshold", "semi_ar"] | None, Field(
            description="sampler: confidence (fixed steps), threshold (commit every token above tau), semi_ar "
                        "(blocks left to right)")] = None,
        tau: Annotated[float | None, Field(gt=0, le=1, description="threshold mode: confidence to commit")] = None,
        temperature: Annotated[float | None, Field(ge=0, description="0 = greedy")] = None,
        top_k: Annotated[int | None, Field(ge=0, description="0 = off")] = None,
        top_p: Annotated[float | None, Field(gt=0, le=1, description="1 = off")] = None,
        cfg: Annotated[Annotated[float, Field(ge=0)] | dict[Modality, Annotated[float, Field(ge=0)]] | None, Field(
            description="classifier-free guidance scale, or one per input modality {'text': 3}")] = None,
        choice_temperature: Annotated[float | None, Field(
            ge=0, description="randomised commit order (MaskGIT)")] = None,
        seed: Annotated[int | None, Field(ge=0, lt=2**62, description="same seed, same output; null: fresh")] = 0,
        max_text_tokens: Annotated[int | None, Field(ge=1, description="cap on generated text tokens")] = None,
        max_audio_seconds: Annotated[float | None, Field(gt=0, description="cap on generated audio")] = None,
    ) -> list:
        request = {key: value for key, value in locals().items() if key != "runner"}
        with _answering():
            return _generate(runner, request)

    return generate


def _generate(runner: Runner, request: dict) -> list:
    from unimodal.serve import save_outputs

    request = {key: value for key, value in request.items() if value is not None or key == "seed"}
    request["out"] = request.get("out") or str(runner.fresh_out())
    checked = check_request(request)  # before the model loads or runs
    pipe = runner.pipe()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = pipe.generate(**checked.inputs, to=checked.to, **checked.settings)
    files = save_outputs(result, checked.outputs)
    return result_content(result, files, [str(w.message) for w in caught])


def result_content(result, files: dict[str, str], warned: list[str]) -> list:
    """A result as MCP content: its text, its image (with the file path in the summary), then the summary."""
    from mcp_types import ImageContent, TextContent

    content = []
    if result.text is not None:
        content.append(TextContent(type="text", text=result.text))
    image = files.get("image")
    if image and Path(image).suffix.lower() in IMAGE_MIME:
        import base64

        data = base64.b64encode(Path(image).read_bytes()).decode("ascii")
        content.append(ImageContent(type="image", data=data, mime_type=IMAGE_MIME[Path(image).suffix.lower()]))
    summary = {"modalities": list(result.modalities), "text": result.text, "files": files,
               "forward_passes": result.forward_passes, "steps": result.steps, "settings": result.settings,
               "warnings": list(dict.fromkeys(warned))}
    content.append(TextContent(type="text", text=json.dumps(summary, indent=1)))
    return content


@contextlib.contextmanager
def _answering():
    """Errors as tool errors whose text starts with the error's type; a bug is reported the same way (one line
    on stderr, the traceback with UNIMODAL_DEBUG=1), never as a crash."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        yield
    except UnimodalError as error:
        raise ToolError(f"{type(error).__name__}: {error}") from None
    except Exception as error:  # noqa: BLE001 - the server must outlive a bug
        if os.environ.get("UNIMODAL_DEBUG"):
            traceback.print_exception(error, file=sys.stderr)
        print(f"unimodal serve --mcp: internal error {type(error).__name__}: {error}", file=sys.stderr)
        raise ToolError(f"internal error {type(error).__name__}: {error}") from None


# ---- the server ------------------------------------------------------------------------------------------------

# name -> (builder of the tool function over a Runner, description). critique / refine / edit join here.
TOOLS = {
    "generate": (generate_tool, "Generate text, an image and/or audio from a prompt, an image file and/or an "
                                "audio file (or from nothing). Images come back as image content and files; "
                                "audio as a file path; text as text."),
}


def build_server(runner: Runner):
    """The MCP server with every tool of :data:`TOOLS` and the two resources."""
    from mcp.server.mcpserver import MCPServer

    from unimodal import __version__

    server = MCPServer(name="unimodal", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    for name, (make, description) in TOOLS.items():
        server.add_tool(make(runner), name=name, description=description, structured_output=False)

    @server.resource("unimodal://vocabulary", name="vocabulary", mime_type="application/json",
                     description="the words the model was trained on, by kind (colors, shapes, sizes, positions, "
                                 "relations, digits) and all together (words)")
    def vocabulary() -> str:
        return json.dumps(runner.vocabulary(), indent=1)

    @server.resource("unimodal://model", name="model", mime_type="application/json",
                     description="the model served: its folder, what it reads and writes, output extensions")
    def model() -> str:
        return json.dumps(_model_info(runner), indent=1)

    return server


def _model_info(runner: Runner) -> dict[str, Any]:
    from unimodal.paths import OUTPUT_SUFFIXES

    info: dict[str, Any] = {"model": str(runner.model_dir), "device": runner.device or "auto",
                            "outputs": str(runner.out_dir), "file_extensions": OUTPUT_SUFFIXES,
                            "tools": list(TOOLS)}
    layout = runner.model_dir / "layout.json"
    if layout.is_file():
        info["layout"] = json.loads(layout.read_text(encoding="utf-8"))
    return info


def require_mcp() -> None:
    """The official SDK is an extra (``unimodal[mcp]``): say how to get it instead of an ImportError."""
    try:
        import mcp.server.mcpserver  # noqa: F401
    except ImportError:
        raise MissingDependencyError("mcp", "mcp", "unimodal serve --mcp") from None


def serve_mcp(model_dir: str | os.PathLike, device: str | None = None, out_dir: str | os.PathLike | None = None) -> int:
    """Serve until the client closes stdin; 0 on a clean end."""
    require_mcp()
    runner = Runner(model_dir, device, out_dir)
    print(f"unimodal serve --mcp: model {runner.model_dir} (loads on the first call), outputs under "
          f"{runner.out_dir}", file=sys.stderr, flush=True)
    build_server(runner).run("stdio")
    return 0


__all__ = ["Runner", "TOOLS", "build_server", "generate_tool", "result_content", "serve_mcp"]
