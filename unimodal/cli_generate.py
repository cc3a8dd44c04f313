"""``unimodal generate``: one request from the command line, its outputs written to files."""

from __future__ import annotations

import argparse
import json

from unimodal.checks import AGREEMENTS, PLANS
from unimodal.cli_common import add_model_arguments, parse_cfg, refine_rounds_type
from unimodal.cli_refine import refine_line, repair_line


def _cmd_generate(args) -> int:
    from unimodal.checks import GENERATE_KEYS, check_request, check_twin_settings
    from unimodal.serve import check_model, load_pipeline, run_generate

    # every request key this command has a flag for (checks.GENERATE_KEYS mirrors the sampler's settings)
    request = {key: getattr(args, key) for key in GENERATE_KEYS if hasattr(args, key)}
    model_dir = check_model(args.model, args.device)  # all of it before torch is even imported
    checked = check_request(request, needs_out=True)
    check_twin_settings(model_dir, checked.settings)
    pipe = load_pipeline(model_dir, args.device)
    result = run_generate(pipe, request, progress=not args.quiet, checked=checked)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if result["text"] is not None:
        print(result["text"])
    settings = result.get("settings") or {}
    if settings.get("repair"):
        print(repair_line(settings["repair"]))
    if settings.get("refine"):  # speech is refined by default: say so, and what it did
        print(refine_line(settings["refine"]))
    for kind, path in result["files"].items():
        print(f"{kind}: {path}")
    return 0


def add_generate_commands(sub) -> None:
    gen = sub.add_parser("generate", help="generate text, an image or audio from any of the others",
                         description="Examples: unimodal generate --text 'a small red circle on the left' --to image "
                                     "--out red.png | --image photo.png --to text | --audio clip.wav --to image "
                                     "--out pic.png | --text 'a blue square' --to image,audio --out outdir")
    add_model_arguments(gen)
    gen.add_argument("--text", default=None, help="a text prompt")
    gen.add_argument("--image", default=None, help="an image file (resized to the model's image size)")
    gen.add_argument("--audio", default=None, help="an audio file (wav/flac/..., resampled to 16 kHz)")
    gen.add_argument("--to", default="image", help="text, image, audio or several comma-separated "
                                                   "(e.g. image,audio); default image")
    gen.add_argument("--out", nargs="+", action="extend", default=None,
                     help="one file per output (by extension: .png, .wav, .txt; .json for the summary) or one folder")
    gen.add_argument("--steps", type=int, default=None, help="model calls (the cap in threshold mode)")
    gen.add_argument("--mode", default=None, choices=["confidence", "threshold", "semi_ar"])
    gen.add_argument("--tau", type=float, default=None, help="threshold mode: commit tokens this confident")
    gen.add_argument("--temperature", type=float, default=None, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--cfg", type=parse_cfg, default=None, help="guidance scale (3) or per input (text=3,audio=2)")
    gen.add_argument("--choice-temperature", type=float, default=None,
                     help="Gumbel noise on which slots are committed first, annealed to 0 (MaskGIT; 0 = greedy order)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--max-text-tokens", type=int, default=None)
    gen.add_argument("--max-audio-seconds", type=float, default=None)
    gen.add_argument("--candidates", type=int, default=None, help="draw this many and keep the one that agrees "
                     "best with the input, read back by the model (costs that many samplings; default 1)")
    gen.add_argument("--accept-confidence", type=float, default=None, help="with --candidates: keep the first draw, "
                     "drawing no more, when its confidence score (mean log-probability, e.g. -0.1) reaches this")
    gen.add_argument("--accept-agreement", type=float, default=None, help="with --candidates: draw one at a time "
                     "and keep the first whose agreement score (the input read back from it, mean log-probability, "
                     "e.g. -0.3) reaches this, drawing no more; else the best of them all")
    gen.add_argument("--agreement", default=None, choices=AGREEMENTS,
                     help="with --candidates: how each draw is read back to choose one: joint (the whole input "
                          "masked at once, one pass; the default) or each (each input token masked alone, a pass a "
                          "token: the words that name the content decide)")
    gen.add_argument("--refine", type=refine_rounds_type("--refine"), default=None, metavar="ROUNDS",
                     help="then refine the output against the inputs for this many rounds (re-mask what the model "
                          "doubts, regenerate it, keep a round only if it reads better; a caption of a picture "
                          "read 0.810 -> 0.925 with 3, at ~2x the passes; default: 2 for speech alone when the model's critic "
                          "head is trained, image->audio 0.715 -> 0.815 at 1.5x the passes; 0 otherwise)")
    gen.add_argument("--repair", action="store_true", default=None,
                     help="a picture drawn from --text or --audio: then read it back and change each colour, size or "
                          "place it shows otherwise than the request, from the object's own pixels (held-out "
                          "colour+shape pairs 0.690 -> 0.865, at ~1.6x the passes); before any --refine rounds")
    gen.add_argument("--rivals", action=argparse.BooleanOptionalAction, default=None,
                     help="a caption read from --image that names two objects is checked against the same words with "
                          "the relation turned around, keeping the one the picture reads back better from (test "
                          "pictures 0.805 -> 0.955 read right, 2 passes, 3 when the rival is kept; default on: "
                          "--no-rivals to skip)")
    gen.add_argument("--rephrase", action=argparse.BooleanOptionalAction, default=None,
                     help="speech made from the words the model read from --image (a plan that is no output) says "
                          "the scene in the form the model speaks most clearly, 'there is a ...' (validation "
                          "scenes spoken from their pictures heard right 0.595 -> 0.715; default on: --no-rephrase "
                          "to say it as read)")
    gen.add_argument("--plan", default=None, choices=PLANS,
                     help="without --text, the model writes its plan in words first (read from the input, or the "
                          "caption it is asked for), then the rest guided by it and the inputs (text) or by it "
                          "alone, one output at a time (text-only, the default); none: from the inputs alone")
    gen.add_argument("--json", action="store_true", help="print the result as JSON (with the saved file paths)")
    gen.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    gen.set_defaults(func=_cmd_generate)


__all__ = ["add_generate_commands"]
