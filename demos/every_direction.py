"""Generate in every direction from one caption and save what a person would look at or listen to.

    python -m unimodal.demos.every_direction --model runs/small/model --out demo-out

Writes ``text_to_image.png``, ``text_to_audio.wav``, ``image_to_text.txt``, ``audio_to_image.png``,
``joint/`` (image, audio and text generated together) and ``summary.json`` (settings, passes, outputs).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from unimodal import UniModal

CAPTION = "a large red circle to the left of a small blue square"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a trained model folder")
    parser.add_argument("--out", default="demo-out")
    parser.add_argument("--caption", default=CAPTION)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pipe = UniModal.from_pretrained(args.model)

    picture = pipe.generate(text=args.caption, to="image", seed=args.seed)
    picture.save(out / "text_to_image.png")
    speech = pipe.generate(text=args.caption, to="audio", seed=args.seed)
    speech.save(out / "text_to_audio.wav")
    described = pipe.generate(image=picture.image, to="text", seed=args.seed)
    described.save(out / "image_to_text.txt")
    heard = pipe.generate(audio=speech.audio, to="image", seed=args.seed)
    heard.save(out / "audio_to_image.png")
    joint = pipe.generate(to=["text", "image", "audio"], seed=args.seed)
    joint.save(out / "joint")

    summary = {"caption": args.caption, "image_to_text": described.text, "joint_text": joint.text,
               "forward_passes": {name: r.forward_passes for name, r in
                                  [("text_to_image", picture), ("text_to_audio", speech),
                                   ("image_to_text", described), ("audio_to_image", heard), ("joint", joint)]}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
