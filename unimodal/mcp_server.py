"""``unimodal serve --mcp``: the model as a Model Context Protocol server (stdio transport, the official SDK).

Tools (each argument has a JSON schema, from the annotated signature):

- ``generate``: any inputs (``text``; ``image`` / ``audio`` as file paths) -> any outputs (``to``). A text output
  comes back as text, an image as image content plus its file path, audio as audio content plus its file path; a
  last text block holds the JSON summary (files, settings used, cost, warnings).

Resources: ``unimodal://vocabulary`` (the words the model was trained on: colours, shapes, sizes, positions,
relations, digits; JSON) and ``unimodal://model`` (folder, modalities, limits; JSON).

Every call is checked (:func:`unimodal.checks.check_request`) before the model is touched; the model loads on
the first call that passes, so a wrong call is refused at once even then. A refused or failed call is a tool
error (``isError``) whose text starts with the error type (``InputFileError: ...``), and the server goes on.

- ``critique``: per-token scores and flagged regions of a picture, clip or caption (``input``, a file) made from
  ``prompt`` (or from the picture / clip ``source``: a caption's picture); the heat map / score curve comes back
  as image content plus its file path, the report as JSON text.
- ``refine``: re-mask flagged regions (the critic's or the caller's ``regions``) and regenerate, ``rounds`` times
  within ``budget`` forward passes; the result as ``generate`` returns it, then the trace of every round as a last
  JSON text block.
- ``edit``: regenerate one region (``box`` pixels, ``seconds``, ``chars``) from ``prompt``; the result as
  ``generate`` returns it. With ``instruction`` ("make the circle blue") instead of a region: the instructed
  edit (plan, execute, check), then its trace (plan and verdict) as a last JSON text block.

Adding a tool: write ``name_tool(runner)`` returning a function whose annotated keyword arguments are the tool's
schema, build its answer with :func:`result_content` / :func:`image_content` / :func:`audio_content`, and add one
line to :data:`TOOLS`.
Run it inside :func:`_answering` so errors become tool errors.
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

from pydantic import BeforeValidator, Field, StrictBool, StrictFloat, StrictInt

from unimodal.checks import MAX_ATTEMPTS, MAX_CANDIDATES, MAX_REFINE_ROUNDS, MAX_SPEECH_MARGIN, check_request
from unimodal.checks_refine import check_refine_request
from unimodal.core.errors import MissingDependencyError, OutputPathError, UnimodalError
from unimodal.core.paths import user_path
from unimodal.core.seeds import SEED_LIMIT

Modality = Literal["text", "image", "audio"]


def _json_scalar(value):
    """A number or flag some MCP clients send JSON-encoded in a string ("2", "0.5", "true") read as the JSON it
    holds (the SDK pre-parses objects and arrays sent so, not scalars); anything else is left for the strict type
    to refuse."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            return value
        if isinstance(parsed, (int, float)):  # bool included: StrictInt refuses it, StrictBool takes it
            return parsed
    return value


# Numbers and flags are strict (StrictInt, StrictFloat, StrictBool), as `serve --stdio` reads them: pydantic's lax
# mode would take true as 1, 2.0 as 2 and "no" as false. A value JSON-encoded in a string ("2", "true") is read as
# that JSON first (FromJson, after the constraints so the schema keeps them); an int is read where a float is asked.
FromJson = BeforeValidator(_json_scalar)
Scale = Annotated[StrictFloat, Field(ge=0), FromJson]
Coordinate = Annotated[StrictFloat, FromJson]  # of a box, a span of seconds or of characters
# MIME type of the image / audio content for each file suffix the results write.
IMAGE_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
AUDIO_MIME = {".wav": "audio/wav", ".flac": "audio/flac"}
INSTRUCTIONS = ("unimodal: one masked-diffusion model that writes text, images and audio from any of them. Call "
                "generate with a prompt (text), an image file or an audio file, and the outputs you want (to). "
                "Read unimodal://vocabulary first: the model only knows the words it was trained on.")


class Runner:
    """What every tool shares: the model folder, the model (loaded on first use, once) and where outputs go."""

    def __init__(self, model_dir: str | os.PathLike, device: str | None = None,
                 out_dir: str | os.PathLike | None = None):
        self.model_dir, self.device = Path(model_dir), device
        self.out_dir = user_path(out_dir, "out_dir", OutputPathError) if out_dir else _default_out_dir()
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
    from unimodal.core.paths import cache_root

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
        steps: Annotated[StrictInt | None, Field(
            ge=1, description="model calls (the cap in threshold mode); more than the tokens to fill is capped and "
                              "reported"), FromJson] = None,
        mode: Annotated[Literal["confidence", "threshold", "semi_ar"] | None, Field(
            description="sampler: confidence (fixed steps), threshold (commit every token above tau), semi_ar "
                        "(blocks left to right)")] = None,
        tau: Annotated[StrictFloat | None, Field(
            gt=0, le=1, description="threshold mode: confidence to commit"), FromJson] = None,
        temperature: Annotated[StrictFloat | None, Field(ge=0, description="0 = greedy"), FromJson] = None,
        top_k: Annotated[StrictInt | None, Field(ge=0, description="0 = off"), FromJson] = None,
        top_p: Annotated[StrictFloat | None, Field(gt=0, le=1, description="1 = off"), FromJson] = None,
        cfg: Annotated[Scale | dict[Modality, Scale] | None, Field(
            description="classifier-free guidance scale, or one per input modality {'text': 3}")] = None,
        choice_temperature: Annotated[StrictFloat | None, Field(
            ge=0, description="randomised commit order (MaskGIT)"), FromJson] = None,
        seed: Annotated[StrictInt | None, Field(
            ge=0, lt=SEED_LIMIT, description="same seed, same output; null: fresh"), FromJson] = 0,
        max_text_tokens: Annotated[StrictInt | None, Field(
            ge=1, description="cap on generated text tokens"), FromJson] = None,
        max_audio_seconds: Annotated[StrictFloat | None, Field(
            gt=0, description="cap on generated audio"), FromJson] = None,
        candidates: Annotated[StrictInt | None, Field(
            ge=1, le=MAX_CANDIDATES,
            description="draw this many and keep the one that agrees best with the input, read back by the "
                        "model; needs temperature > 0 for text (greedy draws are all the same)"), FromJson] = None,
        accept_confidence: Annotated[StrictFloat | None, Field(
            le=0, description="with candidates: keep the first draw, drawing no more, when the model's confidence "
                              "score of it (mean log-probability, e.g. -0.1) reaches this"), FromJson] = None,
        accept_agreement: Annotated[StrictFloat | None, Field(
            le=0, description="with candidates: draw one at a time and keep the first whose agreement score (the "
                              "input read back from it, mean log-probability, e.g. -0.3) reaches this; else the "
                              "best of them all. Not with accept_confidence"), FromJson] = None,
        agreement: Annotated[Literal["joint", "each"] | None, Field(
            description="with candidates: how each draw is read back to choose one: joint (the whole input at "
                        "once, the default) or each (input token by token: the words naming the content decide)")] = None,
        refine: Annotated[StrictInt | None, Field(
            ge=0, le=MAX_REFINE_ROUNDS,
            description="then refine the output against the inputs for this many rounds: re-mask what the model "
                        "doubts, regenerate it, keep a round only if it reads better (3 took captions of test "
                        "pictures from 81% to 92% right at ~2x the passes); default: 2 for speech alone when the "
                        "model's critic head is trained (picture to speech 72% -> 78% heard right at 1.4x the "
                        "passes), 0 otherwise"), FromJson] = None,
        repair: Annotated[StrictBool | None, Field(
            description="to='image' from text or audio: then read the picture back and change each colour, size "
                        "or place it shows otherwise than the request, from the object's own pixels (held-out "
                        "colour+shape pairs 69% -> 86% right at ~1.6x the passes); before any refine rounds"),
            FromJson] = None,
        plan: Annotated[Literal["text", "text-only", "none"] | None, Field(
            description="without a text input: the model writes its plan in words first (what it reads in the "
                        "input, or the caption asked for), then text-only (default) draws each other output from "
                        "those words alone, text from them and the inputs; none generates from the inputs alone")] = None,
        rivals: Annotated[StrictBool | None, Field(
            description="a caption read from an image (to='text', or the plan image->audio speaks) that names two "
                        "objects is checked against the same words with the relation turned around, keeping the "
                        "one the image reads back better from (test pictures 80% -> 96% read right, 2 passes, 3 "
                        "when the rival is kept); default on"), FromJson] = None,
        rephrase: Annotated[StrictBool | None, Field(
            description="speech made from the words read from an image (to='audio' from an image) says the scene "
                        "in the form the model speaks most clearly, 'there is a ...' (validation scenes heard "
                        "right 60% -> 72%); default on, false to say it as read"), FromJson] = None,
    ) -> list:
        request = {key: value for key, value in locals().items() if key != "runner"}
        with _answering():
            return _generate(runner, request)

    return generate


def _generate(runner: Runner, request: dict) -> list:
    from unimodal.results import save_outputs

    request = {key: value for key, value in request.items() if value is not None or key == "seed"}
    request["out"] = request.get("out") or str(runner.fresh_out())
    checked = check_request(request)  # before the model loads or runs
    pipe = runner.pipe()
    with collected_warnings() as warned:
        result = pipe.generate(**checked.inputs, to=checked.to, **checked.settings)
    files = save_outputs(result, checked.outputs)
    return result_content(result, files, warned)


@contextlib.contextmanager
def collected_warnings():
    """The messages of the warnings raised inside (unknown words, capped steps): the caller hands them back."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        messages: list[str] = []
        yield messages
    messages += [str(w.message) for w in caught]


def result_content(result, files: dict[str, str], warned: list[str]) -> list:
    """A result as MCP content: its text, its image, its audio (with the file paths in the summary), then the
    summary."""
    from mcp_types import TextContent

    content = []
    if result.text is not None:
        content.append(TextContent(type="text", text=result.text))
    content += image_content(files.get("image")) + audio_content(files.get("audio"))
    summary = {"modalities": list(result.modalities), "text": result.text, "files": files,
               "forward_passes": result.forward_passes, "steps": result.steps, "settings": result.settings,
               "warnings": list(dict.fromkeys(warned))}
    content.append(TextContent(type="text", text=json.dumps(summary, indent=1)))
    return content


def image_content(path: str | None) -> list:
    """The picture at ``path`` as one image content block; none for no path or a file that is not a picture."""
    from mcp_types import ImageContent

    if not path or Path(path).suffix.lower() not in IMAGE_MIME:
        return []
    import base64

    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return [ImageContent(type="image", data=data, mime_type=IMAGE_MIME[Path(path).suffix.lower()])]


def audio_content(path: str | None) -> list:
    """The clip at ``path`` as one audio content block (a client can play it; ~0.2 MB for 5 s of 16 kHz WAV); none
    for no path or a file that is not a clip."""
    from mcp_types import AudioContent

    if not path or Path(path).suffix.lower() not in AUDIO_MIME:
        return []
    import base64

    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return [AudioContent(type="audio", data=data, mime_type=AUDIO_MIME[Path(path).suffix.lower()])]


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


# ---- critique, refine, edit -------------------------------------------------------------------------------------

Input = Annotated[str, Field(description="the file to work on: a picture (.png/.jpg), a clip (.wav/.flac) or a "
                                         "caption (.txt), e.g. one generate wrote")]
Prompt = Annotated[str | None, Field(description="the text the content was made from (its condition); for edit, "
                                                 "the new description of the region")]
Seed = Annotated[StrictInt | None, Field(ge=0, lt=SEED_LIMIT, description="same seed, same output"), FromJson]
Critic = Annotated[Literal["confidence", "content", "content+learned", "learned", "random"] | None, Field(
    description="who scores the tokens: confidence (the model's probability of each token when re-masked), "
                "content (the probability of the codes that decode like it there: right content, not right id), "
                "learned (the critic head), content+learned (both: right only when both say so; the best on "
                "speech), random (ReMDM-style baseline). Default: content+learned for speech when the model's "
                "critic head is trained, confidence otherwise")]
Fraction = Annotated[StrictFloat | None, Field(gt=0, le=1, description="most tokens flagged per critique, as a "
                                                                       "share (default 0.25)"), FromJson]
Threshold = Annotated[StrictFloat | None, Field(gt=0, le=1, description="flag only tokens scored below this "
                                                                        "(default: the critic's own; for confidence, "
                                                                        "per modality: image 0.01, caption 0.05, "
                                                                        "speech 0.001; 0.5 for the others)"), FromJson]
Check = Annotated[StrictBool, Field(description="also read the output back with the model (caption the picture, "
                                                "transcribe the speech) and compare with the prompt"), FromJson]
Source = Annotated[str | None, Field(description="the picture (.png) or clip (.wav) the input was made from, its "
                                                 "condition in place of prompt: a caption's picture or speech, a "
                                                 "picture's speech")]
ModelCaption = Annotated[StrictBool | None, Field(description="with a .txt input and source: the caption is the "
                                                              "model's own (generate wrote it), so the caption "
                                                              "recipe applies (words below 0.9 redone, a round kept "
                                                              "when the source read back became likelier)"), FromJson]
Span = Annotated[list[Coordinate], Field(min_length=2, max_length=2)]
Box = Annotated[list[Coordinate], Field(min_length=4, max_length=4)]


def critique_tool(runner: Runner):
    """The ``critique`` tool over ``runner``."""

    def critique(
        input: Input,  # noqa: A002 - the CLI's --in, as an agent reads it
        prompt: Prompt = None,
        critic: Critic = None,
        fraction: Fraction = None,
        threshold: Threshold = None,
        check: Check = False,
        source: Source = None,
        model_caption: ModelCaption = None,
        out: Annotated[str | None, Field(description="where to write: the heat map / score curve (.png) or the "
                                                     "report (.json). Default: a .png under the server's output "
                                                     "folder (a caption has no picture)")] = None,
        seed: Seed = 0,
    ) -> list:
        with _answering():
            return _critique(runner, _given(locals()))

    return critique


def refine_tool(runner: Runner):
    """The ``refine`` tool over ``runner``."""

    def refine(
        input: Input,  # noqa: A002
        prompt: Prompt = None,
        rounds: Annotated[StrictInt | None, Field(ge=0, description="most rounds of critique -> re-mask -> regenerate "
                                                              "(3; with repair 0, the repair alone, which measured "
                                                              "best; 0 only with repair)"), FromJson] = None,
        budget: Annotated[StrictInt | None, Field(ge=1, description="most forward passes in all"), FromJson] = None,
        critic: Critic = None,
        fraction: Fraction = None,
        threshold: Threshold = None,
        check: Check = False,
        source: Source = None,
        model_caption: ModelCaption = None,
        repair: Annotated[StrictBool | None, Field(
            description="a picture and its prompt (or the clip it was drawn from as source): first read the "
                        "picture back with the model and change each colour, size or place the reading gets "
                        "otherwise than the request by an instructed edit from the object's own pixels"),
            FromJson] = None,
        evaluator: Annotated[Literal["critic", "agreement", "agreement-each"] | None, Field(
            description="what keeps a round: the critic's own score (default), or agreement (the prompt read back "
                        "from the output by the model became likelier; needs prompt; agreement-each: read word "
                        "by word, a pass a word)")] = None,
        patience: Annotated[StrictInt | None, Field(ge=1, description="rounds in a row not kept before it stops; "
                                                                      "each retry re-plans and samples anew "
                                                                      "(default 1)"), FromJson] = None,
        regions: Annotated[list[dict[Literal["box", "seconds", "chars"], list[Coordinate]]] | None, Field(
            description="your plan for the first round instead of the critic's, e.g. [{'box': [0, 16, 32, 48]}] "
                        "(pixels x0, y0, x1, y1), [{'seconds': [0.5, 1.0]}] or [{'chars': [2, 7]}]")] = None,
        out: Annotated[str | None, Field(description="the refined file, of the input's kind (.png, .wav, .txt). "
                                                     "Default: under the server's output folder")] = None,
        trace: Annotated[str | None, Field(description="also write the trace here (.json)")] = None,
        seed: Seed = 0,
    ) -> list:
        with _answering():
            return _refine(runner, _given(locals()))

    return refine


def edit_tool(runner: Runner):
    """The ``edit`` tool over ``runner``."""

    def edit(
        input: Input,  # noqa: A002
        prompt: Prompt = None,
        box: Annotated[Box | None, Field(description="a picture's region in pixels [x0, y0, x1, y1]")] = None,
        seconds: Annotated[Span | None, Field(description="a clip's region [start, end] in seconds")] = None,
        chars: Annotated[Span | None, Field(description="a caption's region [start, end] in characters")] = None,
        instruction: Annotated[str | None, Field(description="instead of a region: what to change, e.g. 'make the "
                                                             "circle blue', 'move the square to the top', 'turn the "
                                                             "red cross into a circle' (a picture), \"replace 'small' "
                                                             "by 'large'\", \"say 'green' instead of 'red'\" (a "
                                                             "caption or speech); prompt then says what the input "
                                                             "shows (else the model reads it back)")] = None,
        out: Annotated[str | None, Field(description="the edited file, of the input's kind (.png, .wav, .txt). "
                                                     "Default: under the server's output folder")] = None,
        trace: Annotated[str | None, Field(description="an instructed edit: also write its plan and verdict "
                                                       "here (.json)")] = None,
        candidates: Annotated[StrictInt, Field(
            ge=1, le=MAX_CANDIDATES,
            description="regenerate the region this many times and keep the one that agrees best with the "
                        "description, read back by the model"), FromJson] = 1,
        attempts: Annotated[StrictInt | None, Field(
            ge=1, le=MAX_ATTEMPTS,
            description="an instructed edit the model redraws (a new shape, speech): redo it until the model "
                        "reads the target back from it, at most this many times (default 4)"), FromJson] = None,
        draft: Annotated[StrictBool | None, Field(
            description="an instructed picture edit: start a change of colour, size or place from the object's own "
                        "pixels (true, the default) or let the model redraw its box from the target caption "
                        "(false)"), FromJson] = None,
        speech_margin: Annotated[StrictFloat | None, Field(
            gt=0, le=MAX_SPEECH_MARGIN,
            description="an instructed speech edit: seconds either side of the word's middle that it redoes "
                        "(default 0.4)"), FromJson] = None,
        refine: Annotated[StrictInt | None, Field(
            ge=0, le=MAX_REFINE_ROUNDS,
            description="an instructed speech edit: up to this many rounds of refine inside the stretch it redid, "
                        "before the check, by refine's default critic (the speech critic when the model's critic "
                        "head is trained, else confidence; default 0: none)"), FromJson] = None,
        seed: Seed = 0,
    ) -> list:
        with _answering():
            return _edit(runner, _given(locals()))

    return edit


def _given(arguments: dict) -> dict:
    """A tool's arguments as a request: the ones given (None means the default), without the runner."""
    return {key: value for key, value in arguments.items() if key != "runner" and value is not None}


def _critique(runner: Runner, request: dict) -> list:
    from mcp_types import TextContent

    from unimodal.serve_refine import run_critique

    checked = check_refine_request("critique", request, runner.fresh_out())  # before the model loads
    pipe = runner.pipe()
    with collected_warnings() as warned:
        report, files = run_critique(pipe, checked)
    answer = {**report.to_dict(), "files": files, "warnings": list(dict.fromkeys(warned))}
    return image_content(files.get("picture")) + [TextContent(type="text", text=json.dumps(answer, indent=1))]


def _refine(runner: Runner, request: dict) -> list:
    from mcp_types import TextContent

    from unimodal.serve_refine import run_refine

    checked = check_refine_request("refine", request, runner.fresh_out())
    pipe = runner.pipe()
    with collected_warnings() as warned:
        fixed, files, trace = run_refine(pipe, checked)
    return result_content(fixed, files, warned) + [TextContent(type="text", text=json.dumps(trace, indent=1))]


def _edit(runner: Runner, request: dict) -> list:
    from mcp_types import TextContent

    from unimodal.serve_refine import run_edit

    checked = check_refine_request("edit", request, runner.fresh_out())
    pipe = runner.pipe()
    with collected_warnings() as warned:
        edited, files, trace = run_edit(pipe, checked)
    if trace is None:
        return result_content(edited, files, warned)
    return result_content(edited, files, warned) + [TextContent(type="text", text=json.dumps(trace, indent=1))]


# ---- the server ------------------------------------------------------------------------------------------------

# name -> (builder of the tool function over a Runner, description).
TOOLS = {
    "generate": (generate_tool, "Generate text, an image and/or audio from a prompt, an image file and/or an "
                                "audio file (or from nothing). Images come back as image content and files; "
                                "audio as audio content and files; text as text."),
    "critique": (critique_tool, "Score each token of a picture, clip or caption the model made (1: looks right), "
                                "find the flawed regions (pixels, seconds, characters) and draw them: the heat map "
                                "over a picture / score curve under a clip comes back as image content and a "
                                "file; scores and regions as JSON."),
    "refine": (refine_tool, "Repair a picture, clip or caption: re-mask its flawed regions (the critic's, or your "
                            "regions) and regenerate them, round by round, keeping a round only if the score "
                            "improves. Returns the result as generate does, then the trace of every round (JSON)."),
    "edit": (edit_tool, "Regenerate one region of a picture (box, pixels), clip (seconds) or caption (chars) from "
                        "a new description (prompt), the rest as context; or follow an instruction ('make the "
                        "circle blue'): plan the region, regenerate it, read the result back. Returns the result "
                        "as generate does, then (instructed) the plan and verdict (JSON)."),
}


def build_server(runner: Runner):
    """The MCP server with every tool of :data:`TOOLS` and the two resources."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    from unimodal import __version__

    class Server(MCPServer):
        """Refuses an argument a tool does not take (a misspelt ``temprature``, ``steps`` given to critique) by
        name, as ``serve --stdio`` refuses an unknown key, where the SDK's argument model would drop it silently."""

        async def call_tool(self, name, arguments, context=None):
            schemas = {tool.name: tool.input_schema for tool in await self.list_tools()}
            if name in schemas:
                accepted = schemas[name].get("properties", {})
                unknown = sorted(set(arguments or {}) - set(accepted))
                if unknown:
                    raise ToolError(f"InputError: unknown argument(s) {', '.join(map(repr, unknown))} of {name}; "
                                    f"accepted: {', '.join(accepted)}")
            return await super().call_tool(name, arguments, context)

    server = Server(name="unimodal", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
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
    from unimodal.core.paths import OUTPUT_SUFFIXES

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


__all__ = ["Runner", "TOOLS", "audio_content", "build_server", "critique_tool", "edit_tool", "generate_tool",
           "image_content", "refine_tool", "result_content", "serve_mcp"]
