"""Fine-tune a model on a folder of your own files, then generate with the result.

    python -m unimodal.demos.train_tiny --out train-out                    # makes a small sample folder first
    python -m unimodal.demos.train_tiny --files my_pictures/ --steps 200 --out train-out

The folder holds pictures (``NAME.png`` / ``.jpg``), each with its caption in ``NAME.txt`` and, if you have
it, its speech in ``NAME.wav``. The script writes a JSONL manifest of them (``OUT/manifest.jsonl``, the form
``unimodal train --data`` reads), fine-tunes ``--model`` on it with ``unimodal train --init-from`` (same size,
same codecs; a fresh optimizer), and generates a picture from the first caption with the new model.
Writes ``OUT/run/`` (checkpoint, history, ``model/``), ``generated.png`` and ``train.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image, ImageDraw

from unimodal import DataError
from unimodal.cli import main as unimodal_cli
from unimodal.demos.common import load, out_folder, parser_for, write_json

SAMPLES = {"red_left": ("a large red circle on the left", (235, 50, 50), 16),
           "blue_right": ("a large blue circle on the right", (50, 90, 235), 48),
           "green_left": ("a large green circle on the left", (40, 190, 70), 16),
           "yellow_right": ("a large yellow circle on the right", (240, 220, 40), 48)}
PICTURE_SUFFIXES = (".png", ".jpg", ".jpeg")


def make_sample_folder(folder: Path) -> Path:
    """A few pictures with captions beside them, standing in for your own files."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, (caption, colour, x) in SAMPLES.items():
        picture = Image.new("RGB", (64, 64), (40, 40, 40))
        ImageDraw.Draw(picture).ellipse([x - 12, 20, x + 12, 44], fill=colour)
        picture.save(folder / f"{name}.png")
        (folder / f"{name}.txt").write_text(caption + "\n")
    return folder


def write_manifest(files: Path, manifest: Path) -> int:
    """One JSONL record per picture that has a caption (and its speech when there is a NAME.wav)."""
    records = []
    for picture in sorted(p for p in files.iterdir() if p.suffix.lower() in PICTURE_SUFFIXES):
        caption = picture.with_suffix(".txt")
        if not caption.is_file():
            continue
        record = {"text": caption.read_text().strip(), "image": str(picture.resolve())}
        if picture.with_suffix(".wav").is_file():
            record["audio"] = str(picture.with_suffix(".wav").resolve())
        records.append(record)
    if not records:
        raise DataError(f"{files} holds no picture with a caption beside it (NAME.png and NAME.txt)")
    manifest.write_text("".join(json.dumps(r) + "\n" for r in records))
    return len(records)


def preset_of(model: Path) -> str:
    """The size the model was trained at (its training_config.json): fine-tuning keeps it."""
    config = model / "training_config.json"
    if not config.is_file():
        raise DataError(f"{model} has no training_config.json; fine-tune a model folder that `unimodal train` wrote")
    return json.loads(config.read_text())["preset"]


def main(argv=None) -> dict:
    parser = parser_for(__doc__, "train-out")
    parser.add_argument("--files", default=None, help="your folder (default: a sample folder made in OUT/files)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args(argv)
    out = out_folder(args.out)
    files = Path(args.files) if args.files else make_sample_folder(out / "files")
    count = write_manifest(files, out / "manifest.jsonl")
    _, model = load(args.model)
    status = unimodal_cli(["train", "--init-from", str(model), "--preset", preset_of(model), "--codecs", str(model),
                           "--data", str(out / "manifest.jsonl"), "--steps", str(args.steps), "--batch-size",
                           str(args.batch_size), "--seed", str(args.seed), "--out", str(out / "run")])
    if status != 0:
        raise SystemExit(status)
    tuned, _ = load(str(out / "run" / "model"))
    caption = json.loads((out / "manifest.jsonl").read_text().splitlines()[0])["text"]
    tuned.generate(text=caption, to="image", seed=args.seed).save(out / "generated.png")
    report = {"files": str(files), "records": count, "steps": args.steps, "model": str(out / "run" / "model"),
              "generated": {"caption": caption, "file": str(out / "generated.png")}}
    write_json(out / "train.json", report)
    return report


if __name__ == "__main__":
    main()
