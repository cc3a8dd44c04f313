"""Edit part of an output and keep the rest: a picture's box, a clip's span of seconds, a caption's characters.

    python -m unimodal.demos.edit_regions --out edit-out

Each edit re-masks one region, in native units (pixels, seconds, characters), and regenerates it from a new
description with everything outside the region as context (``UniModal.edit``):

1. picture: a large red circle on the left; the left half is redone from "a large blue circle on the left";
2. speech: the spoken caption's middle second is redone from a caption that says another colour;
3. caption: the colour word of "a large red circle on the left" is redone to fit a picture of a blue one.

Writes the before and after of each (``image_before.png`` / ``image_after.png``, ``audio_*.wav``,
``caption_*.txt``) and ``edits.json`` (the regions, the descriptions, the tokens re-masked).
"""

from __future__ import annotations

from unimodal.demos.common import load, out_folder, parser_for, write_json

CAPTION = "a large red circle on the left"
NEW_CAPTION = "a large blue circle on the left"
LEFT_HALF = [0, 0, 32, 64]  # x0, y0, x1, y1 in pixels of the 64x64 picture
COLOUR_WORD = [CAPTION.index("red"), CAPTION.index("red") + len("red")]  # characters of "red"


def edit_picture(pipe, seed: int) -> tuple:
    before = pipe.generate(text=CAPTION, to="image", seed=seed)
    after = pipe.edit(before.image, region={"modality": "image", "box": LEFT_HALF}, text=NEW_CAPTION, seed=seed)
    return before, after, {"box": LEFT_HALF}


def edit_speech(pipe, seed: int) -> tuple:
    before = pipe.generate(text=CAPTION, to="audio", seed=seed)
    seconds = len(before.audio) / before.sample_rate
    span = [round(seconds / 2 - 0.5, 2), round(seconds / 2 + 0.5, 2)] if seconds > 1 else [0.0, round(seconds, 2)]
    after = pipe.edit((before.audio, before.sample_rate), region={"modality": "audio", "seconds": span},
                      text=NEW_CAPTION, seed=seed)
    return before, after, {"seconds": span}


def edit_caption(pipe, seed: int) -> tuple:
    picture = pipe.generate(text=NEW_CAPTION, to="image", seed=seed).image
    after = pipe.edit(CAPTION, region={"modality": "text", "chars": COLOUR_WORD}, image=picture, modality="text",
                      seed=seed)
    return CAPTION, after, {"chars": COLOUR_WORD, "conditioned_on": "a generated picture of a blue circle"}


def main(argv=None) -> list[dict]:
    args = parser_for(__doc__, "edit-out").parse_args(argv)
    out, (pipe, _) = out_folder(args.out), load(args.model)
    edits = []
    for name, run, suffix in (("image", edit_picture, ".png"), ("audio", edit_speech, ".wav"),
                              ("caption", edit_caption, ".txt")):
        before, after, region = run(pipe, args.seed)
        if isinstance(before, str):
            (out / f"{name}_before{suffix}").write_text(before + "\n")
        else:
            before.save(out / f"{name}_before{suffix}")
        after.save(out / f"{name}_after{suffix}")
        edits.append({"edit": name, "region": region, "description": NEW_CAPTION if name != "caption" else None,
                      "tokens_remasked": after.settings["edit"]["tokens_remasked"], "text_after": after.text,
                      "files": [str(out / f"{name}_{when}{suffix}") for when in ("before", "after")]})
    write_json(out / "edits.json", edits)
    return edits


if __name__ == "__main__":
    main()
