"""Generate from a file of prompts in batches: one line per request, ``OUTPUTS: caption``.

    python -m unimodal.demos.batch_prompts --out batch-out                       # writes a sample prompts.txt first
    python -m unimodal.demos.batch_prompts --prompts my_prompts.txt --batch-size 8 --out batch-out

A line reads ``image: a small red circle on the left`` or ``image,audio: a large blue square at the top``
(no prefix: ``image``); blank lines and lines starting with ``#`` are skipped. Requests go to
``UniModal.generate_batch`` a batch at a time (one batched sampler call per kind of output); a request the
model refuses (an unknown output, a prompt too long) is reported in ``index.json`` and the rest still run.
Writes ``NNN.png`` / ``NNN.wav`` / ``NNN.txt`` per request and ``index.json`` (prompt, files, model calls).
"""

from __future__ import annotations

from pathlib import Path

from unimodal import UnimodalError
from unimodal.core.seeds import derived_seed
from unimodal.demos.common import load, out_folder, parser_for, write_json

SAMPLE = """# one request per line: OUTPUTS: caption
image: a small red circle on the left
image: a large blue square at the top
image,audio: a small green cross on the right
audio: a large yellow triangle at the bottom
image: a small purple circle above a large orange square
"""


def read_prompts(path: Path) -> list[dict]:
    """Requests from the prompt file: ``{"text": caption, "to": [outputs], "line": n}``."""
    requests = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        outputs, _, caption = line.rpartition(":") if ":" in line else ("image", "", line)
        requests.append({"text": caption.strip(), "to": [o.strip() for o in outputs.split(",")], "line": number})
    return requests


def save_one(result, stem: Path) -> list[str]:
    suffix = {"image": ".png", "audio": ".wav", "text": ".txt"}
    return [str(p) for m in result.modalities for p in result.save(stem.with_suffix(suffix[m]))]


def main(argv=None) -> list[dict]:
    parser = parser_for(__doc__, "batch-out")
    parser.add_argument("--prompts", default=None, help="prompt file (default: write the sample to OUT/prompts.txt)")
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args(argv)
    out = out_folder(args.out)
    prompts = Path(args.prompts) if args.prompts else out / "prompts.txt"
    if not args.prompts:
        prompts.write_text(SAMPLE)
    requests, (pipe, _) = read_prompts(prompts), load(args.model)
    index = []
    for first in range(0, len(requests), args.batch_size):
        chunk = requests[first:first + args.batch_size]
        results = pipe.generate_batch([{"text": r["text"], "to": r["to"]} for r in chunk],
                                      seed=derived_seed(args.seed, first), errors="return")
        for number, (request, result) in enumerate(zip(chunk, results), first):
            entry = {"line": request["line"], "prompt": request["text"], "to": request["to"]}
            if isinstance(result, UnimodalError):
                entry["error"] = str(result)
            else:
                entry |= {"files": save_one(result, out / f"{number:03d}"), "forward_passes": result.forward_passes}
            index.append(entry)
    write_json(out / "index.json", index)
    return index


if __name__ == "__main__":
    main()
