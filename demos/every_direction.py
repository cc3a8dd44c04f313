"""Generate in every direction from one caption and save what a person would look at or listen to.

    python -m unimodal.demos.every_direction --out demo-out            # the shipped model
    python -m unimodal.demos.every_direction --model runs/mine/model --caption "a small red circle on the left"

Chains the model's own outputs: the caption becomes a picture and speech, the picture and the speech are
read back into captions and into each other, and a joint request makes caption, picture and speech together.
Writes ``text_to_image.png``, ``text_to_audio.wav``, ``image_to_text.txt``, ``audio_to_text.txt``,
``image_to_audio.wav``, ``audio_to_image.png``, ``joint/`` and ``summary.json`` (texts and model calls).
"""

from __future__ import annotations

from unimodal.demos.common import load, out_folder, parser_for, write_json

CAPTION = "a large red circle to the left of a small blue square"


def main(argv=None) -> dict:
    parser = parser_for(__doc__, "demo-out")
    parser.add_argument("--caption", default=CAPTION)
    args = parser.parse_args(argv)
    out, (pipe, _) = out_folder(args.out), load(args.model)
    seed = args.seed
    made = {"text_to_image": pipe.generate(text=args.caption, to="image", seed=seed),
            "text_to_audio": pipe.generate(text=args.caption, to="audio", seed=seed)}
    picture, speech = made["text_to_image"].image, (made["text_to_audio"].audio, made["text_to_audio"].sample_rate)
    made["image_to_text"] = pipe.generate(image=picture, to="text", seed=seed)
    made["audio_to_text"] = pipe.generate(audio=speech, to="text", seed=seed)
    made["image_to_audio"] = pipe.generate(image=picture, to="audio", seed=seed)
    made["audio_to_image"] = pipe.generate(audio=speech, to="image", seed=seed)
    made["joint"] = pipe.generate(to=["text", "image", "audio"], seed=seed)
    suffix = {"image": ".png", "audio": ".wav", "text": ".txt"}
    for name, result in made.items():
        result.save(out / "joint" if name == "joint" else out / f"{name}{suffix[name.split('_to_')[1]]}")
    summary = {"caption": args.caption, "texts": {n: r.text for n, r in made.items() if r.text is not None},
               "forward_passes": {n: r.forward_passes for n, r in made.items()}}
    write_json(out / "summary.json", summary)
    return summary


if __name__ == "__main__":
    main()
