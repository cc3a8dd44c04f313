"""An agent's loop around the model: plan, execute, check, refine, until the output says what was asked.

    python -m unimodal.demos.agent_loop --out agent-out
    python -m unimodal.demos.agent_loop --request "a small green cross on the right" --rounds 3 --out agent-out

Plan: read the request with the caption grammar (which objects, colours, places; unknown words named).
Execute: generate the picture. Check: ``UniModal.critique`` with ``check=True`` scores every code and reads
the picture back into a caption; the differences name what is wrong and where. Refine: ``UniModal.refine``
re-masks the regions the check (else the critic) points at and regenerates them. Repeat until the read-back
agrees or the rounds run out. Every step, with its arguments, outcome and model calls, goes to ``trace.json``;
each picture and heat map to ``stepNN-*.png``.
"""

from __future__ import annotations

from unimodal.core.grammar import known_vocabulary, parse_scene_caption, unknown_words
from unimodal.core.seeds import derived_seed
from unimodal.demos.common import load, out_folder, parser_for, write_json

REQUEST = "a large blue square at the top"


def plan(request: str) -> dict:
    """What the request asks, as the grammar reads it, and the steps the loop will take."""
    return {"parsed": parse_scene_caption(request),
            "unknown_words": unknown_words(request, known_vocabulary()["words"]),
            "steps": ["generate image", "check (critique + read-back)", "refine the flagged regions", "repeat"]}


def check(pipe, result, request: str, seed: int, path) -> dict:
    """Critique with the read-back check; the heat map saved to ``path``."""
    report = pipe.critique(result, text=request, check=True, seed=seed)
    report.save(path)
    return {"agrees": report.check["agrees"], "read_back": report.check["read_back"],
            "differences": report.check["differences"], "check_regions": report.check["regions"],
            "critic_regions": len(report.regions), "score": round(report.score, 4),
            "forward_passes": report.forward_passes, "heat_map": str(path)}


def main(argv=None) -> list[dict]:
    parser = parser_for(__doc__, "agent-out")
    parser.add_argument("--request", default=REQUEST)
    parser.add_argument("--rounds", type=int, default=2, help="refine rounds at most")
    args = parser.parse_args(argv)
    out, (pipe, _) = out_folder(args.out), load(args.model)
    trace = [{"step": 0, "action": "plan", "request": args.request, **plan(args.request)}]
    result = pipe.generate(text=args.request, to="image", seed=args.seed)
    result.save(out / "step01-generated.png")
    trace.append({"step": 1, "action": "execute", "files": [str(out / "step01-generated.png")],
                  "forward_passes": result.forward_passes})
    for round_ in range(1, args.rounds + 1):
        found = check(pipe, result, args.request, args.seed, out / f"step{2 * round_:02d}-heat.png")
        trace.append({"step": 2 * round_, "action": "check", **found})
        if found["agrees"]:
            break
        regions = found["check_regions"] or None  # the read-back's place to redo, else the critic's own choice
        result, refined = pipe.refine(result, text=args.request, rounds=1, regions=regions,
                                      seed=derived_seed(args.seed, round_))
        path = out / f"step{2 * round_ + 1:02d}-refined.png"
        result.save(path)
        trace.append({"step": 2 * round_ + 1, "action": "refine", "regions": regions or "critic's choice",
                      "kept": [r["kept"] for r in refined["rounds"]], "forward_passes": refined["forward_passes"],
                      "files": [str(path)]})
    write_json(out / "trace.json", trace)
    return trace


if __name__ == "__main__":
    main()
