"""``unimodal bench refine``: does self-critique repair generations, and is it worth its passes?

For each case (a scene of the test split) the model makes one output, seed ``seed + i`` (wrapped at the seed
limit: :func:`~unimodal.core.seeds.derived_seed`): a picture from the caption (``direction="text->image"``, the
default) or a caption of the picture (``"image->text"``); then:

- **refine**, per critic (``confidence``, ``random``; ``learned`` once its head is trained): up to ``rounds``
  plan-execute-evaluate rounds (:func:`unimodal.inference.refine.refine`); the output after every round is judged,
  so the table holds the accuracy and the mean forward passes spent so far after each round, and the fix
  rate (wrong -> right, over the cases wrong before the round) and break rate (right -> wrong, over those
  right before it) of each round;
- **own mistakes** (:func:`bench_mistakes`, ``--mistakes``): each critic's AUROC on the tokens the model
  regenerated wrong in real test data, the measure of the learned critic against the confidence score;
- **best-of-N**: N outputs per case (seeds ``seed + i + k * 100003``; the draws after the first at
  ``best_of_temperature``, since greedy captions are all the same), the one with the best score kept,
  N = 1 .. ``best_of``, chosen twice: by the confidence score (each scored with the same ``groups`` calls the
  confidence critic spends) and by the agreement score (the input read back from each output, one call).

Forward passes are model calls over the targets per case, as the sampler counts steps (the guidance rows of
a call are not counted apart, the same for every method). The independent judges (the scene judge for
pictures, the caption grammar for captions) score every output; the model never sees them. The cases arrive
ready-made (``inference/`` does not import ``training/``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from unimodal.inference.critique import agreement_score, confidence_scores, make_draft, sample_score
from unimodal.inference.evaluate import EvalCase, Judges, caption_correct, judge_image, paired_difference, verdicts_of
from unimodal.core.errors import InputError
from unimodal.core.figures import pyplot, save_figure
from unimodal.core.ranking import auroc, auroc_interval
from unimodal.core.seeds import derived_seed

BEST_OF_SEED_STRIDE = 100_003
DIRECTIONS = ("text->image", "image->text")
# Draws after the first of a best-of-N caption: greedy captions of one picture are all the same.
TEXT_BEST_OF_TEMPERATURE = 1.0


class _Direction:
    """What one bench direction generates from what, how its output is judged, and the input refine reads."""

    def __init__(self, name: str):
        if name not in DIRECTIONS:
            raise InputError(f"bench refine's direction must be one of {DIRECTIONS}, got {name!r}")
        self.name = name
        self.source, self.target = name.split("->")

    def request(self, case, seed: int) -> dict:
        return {self.source: getattr(case, self.source), "to": self.target, "seed": seed}

    def output(self, result):
        return getattr(result, self.target)

    def inputs(self, case) -> dict:
        """The request as ``refine`` and ``critique`` take it (what an agreement evaluator reads back)."""
        return {self.source: getattr(case, self.source)}

    def verdicts(self, cases, outputs, judges: Judges) -> list[bool]:
        if self.target == "text":
            return [bool(caption_correct(c, text)) for c, text in zip(cases, outputs)]
        return _verdicts(cases, outputs, judges)


def _verdicts(cases: Sequence[EvalCase], images, judges: Judges) -> list[bool]:
    return [bool(judge_image(c, im, judges.scene if c.kind == "scene" else None,
                             judges.digit if c.kind == "digit" else None).get("correct")) for c, im in zip(cases, images)]


def _base(pipe, cases, seed: int, batch_size: int, direction: _Direction | None = None,
          temperature: float | None = None) -> list:
    direction = direction or _Direction("text->image")
    requests = [direction.request(c, derived_seed(seed, i)) for i, c in enumerate(cases)]
    # captions as read: refine (and best-of-N) are measured from the model's own caption, not from one already
    # checked against its rival (generate's default, unimodal.rivals), so the bench's figures stay those of refine;
    # and speech as drawn, not refined already (generate's default for speech): the bench refines it
    sampling = {"rivals": False, "refine": 0, **({} if temperature is None else {"temperature": temperature})}
    return [r for first in range(0, len(requests), batch_size)
            for r in pipe.generate_batch(requests[first:first + batch_size], **sampling)]


def _refined(pipe, cases, base, drawn: np.ndarray, judges, critic, rounds: int, seed: int, groups: int,
             options: dict, direction: _Direction, repair: bool = False) -> dict:
    """Per round: accuracy, mean cumulative passes, fix and break rates; and the stop reasons. ``drawn``: the
    draws' verdicts (judged once by the caller). ``repair``: each
    output first repaired by reading it back (``UniModal.refine(..., repair=True, rounds=0)``), then refined
    ``rounds`` rounds with ``critic`` (none: the repair alone); row 0 is then the repaired output (its fix and
    break rates against the draw), and ``repair`` counts the edits kept."""
    n, first = len(cases), 1 if repair else 0
    rounds = rounds if critic is not None else 0
    verdicts = np.zeros((n, first + rounds + 1), dtype=bool)  # [case, draw / repaired / after round r]
    passes = np.zeros((n, first + rounds + 1))
    stops: dict[str, int] = {}
    edits = 0
    ran = None  # what the loop resolved (evaluator, patience, thresholds, temperature), the same for every case
    verdicts[:, 0] = drawn
    for i, (case, result) in enumerate(zip(cases, base)):
        spent = [0.0]
        if repair:
            result, trace = pipe.refine(result, **direction.inputs(case), repair=True, rounds=0,
                                        seed=derived_seed(seed, i))
            edits += sum(e["kept"] for e in trace["repair"]["edits"])
            spent = [float(trace["forward_passes"])] * 2
            verdicts[i, 1] = direction.verdicts([case], [direction.output(result)], judges)[0]
        if rounds:
            seen = {}
            _, trace = pipe.refine(result, **direction.inputs(case), rounds=rounds, critic=critic, groups=groups,
                                   seed=derived_seed(seed, i), **options,
                                   on_round=lambda r, res: seen.__setitem__(r, direction.output(res)))
            ran = ran or {"evaluator": trace["evaluator"], "patience": trace["config"]["patience"],
                          "thresholds": trace["thresholds"], "regen_temperature": trace.get("regen_temperature")}
            spent += list(spent[-1] + np.cumsum([trace["scoring_passes_initial"]] +
                                                [x["forward_passes"] for x in trace["rounds"]]))[1:]
            stops[trace["stopped"]] = stops.get(trace["stopped"], 0) + 1
        for r in range(1, rounds + 1):
            column = first + r
            verdicts[i, column] = (direction.verdicts([case], [seen[r]], judges)[0] if r in seen
                                   else verdicts[i, column - 1])
            passes[i, column] = spent[min(column, len(spent) - 1)]
        if repair:
            passes[i, 1] = spent[1]
    base_passes = np.mean([r.forward_passes for r in base])
    rows = []
    for column in range(first, first + rounds + 1):
        before, after = verdicts[:, max(column - 1, 0)], verdicts[:, column]
        r = column - first
        rows.append({"round": r, "accuracy": float(after.mean()),
                     "forward_passes": float(base_passes + passes[:, column].mean()),
                     "fix_rate": _rate(~before & after, ~before) if column else None,
                     "break_rate": _rate(before & ~after, before) if column else None})
    part = {"rounds": rows, "stopped": stops, "ran": ran,
            "final_minus_base": paired_difference(verdicts_of(verdicts[:, -1]), verdicts_of(verdicts[:, 0]))}
    if repair:
        part.update(critic=critic, edits_kept=edits, draw_accuracy=float(verdicts[:, 0].mean()),
                    repair_minus_base=paired_difference(verdicts_of(verdicts[:, 1]), verdicts_of(verdicts[:, 0])))
    return part


def _rate(hits: np.ndarray, among: np.ndarray) -> float | None:
    return float(hits.sum() / among.sum()) if among.sum() else None


def _best_of(pipe, cases, base, drawn: np.ndarray, judges, best_of: int, seed: int, groups: int, batch_size: int,
             direction: _Direction, temperature: float | None) -> list[dict]:
    """Accuracy of the best-scored of the first N outputs per case, N = 1 .. best_of, per selector (``drawn``:
    the first draws' verdicts, judged once by the caller)."""
    draws = [base] + [_base(pipe, cases, derived_seed(seed, k * BEST_OF_SEED_STRIDE), batch_size, direction,
                            temperature) for k in range(1, best_of)]
    right = np.array([drawn] + [direction.verdicts(cases, [direction.output(r) for r in results], judges)
                                for results in draws[1:]], dtype=bool)  # (N, n)
    base_passes = np.mean([r.forward_passes for r in base])
    selectors = {"confidence": lambda case, r: (_confidence(pipe, case, r, groups, direction), groups),
                 "agreement": lambda case, r: _agreement_read(pipe, case, r, direction, "joint"),
                 "agreement-each": lambda case, r: _agreement_read(pipe, case, r, direction, "each")}
    rows = []
    for selector, score in selectors.items():
        read = np.array([[score(case, r) for case, r in zip(cases, results)] for results in draws])  # (N, n, 2)
        scores, calls = read[..., 0], float(read[..., 1].mean())  # calls: one read's passes, on average
        for count in range(1, best_of + 1):
            pick = scores[:count].argmax(0)  # (n,)
            scoring = calls * count if count > 1 else 0  # one picture needs no choosing
            rows.append({"n": count, "selector": selector, "accuracy": float(right[pick, np.arange(len(cases))].mean()),
                         "forward_passes": float(count * base_passes + scoring),
                         "oracle_accuracy": float(right[:count].any(0).mean())})
    return rows


def _draft(pipe, case, result, direction: _Direction | None = None):
    """The output made for ``case`` as a draft conditioned on its input (the caption, or the picture's codes)."""
    import torch

    direction = direction or _Direction("text->image")
    if direction.source == "text":
        condition = pipe.text_codec.encode_one(case.text)
    else:
        condition = pipe.image_codec.encode(case.image[None])[0].cpu()
    return make_draft(pipe.layout, [(direction.source, condition)],
                      {direction.target: torch.tensor(result.token_ids[direction.target])})


def _agreement_read(pipe, case, result, direction: _Direction | None = None,
                    reading: str = "joint") -> tuple[float, int]:
    """How likely the model finds the case's input when it reads the output back (no guidance), read ``reading``
    (joint: one call; each: a call per input token), and its passes."""
    return agreement_score(pipe.backbone, pipe.layout, _draft(pipe, case, result, direction), reading=reading)


def _confidence(pipe, case, result, groups: int, direction: _Direction | None = None) -> float:
    """The draft's confidence score, read with the guidance it was sampled with."""
    scores, _ = confidence_scores(pipe.backbone, pipe.layout, _draft(pipe, case, result, direction), groups,
                                  result.settings.get("cfg"))
    return sample_score(scores)


def bench_refine(pipe, cases: Sequence[EvalCase], critics: Sequence = ("confidence", "random"), rounds: int = 3,
                 best_of: int = 4, seed: int = 0, groups: int = 4, batch_size: int = 16, judges: Judges | None = None,
                 progress=print, options: dict | None = None, direction: str = "text->image",
                 best_of_temperature: float | None = None, repair: bool = False) -> dict:
    """The report: base accuracy, refine per critic per round, best-of-N; every figure with its passes.
    ``options``: more keywords of ``pipe.refine`` (e.g. ``temperature`` of the regenerations); ``direction``:
    text->image or image->text; ``best_of_temperature``: the sampling temperature of the best-of-N draws after
    the first (default: 1.0 for captions, the model's own for pictures); ``repair`` (text->image): one more
    series, each picture repaired by reading it back, then refined with the first of ``critics`` (the report's
    ``repair``)."""
    if not cases:
        raise InputError("bench refine needs at least one case")
    if repair and direction != "text->image":
        raise InputError(f"repair reads a picture back against its request: bench refine --repair is for "
                         f"text->image, not {direction}")
    way = _Direction(direction)
    if best_of_temperature is None and way.target == "text":
        best_of_temperature = TEXT_BEST_OF_TEMPERATURE
    judges = judges or Judges()
    base = _base(pipe, cases, seed, batch_size, way)
    drawn = np.array(way.verdicts(cases, [way.output(r) for r in base], judges), dtype=bool)
    report = {"n": len(cases), "direction": way.name, "seed": seed, "rounds": rounds, "groups": groups,
              "options": dict(options or {}), "best_of_temperature": best_of_temperature,
              "sampler": {k: base[0].settings.get(k) for k in ("mode", "steps", "cfg", "temperature",
                                                               "choice_temperature")}, "refine": {},
              "base": {"accuracy": float(drawn.mean()),
                       "forward_passes": float(np.mean([r.forward_passes for r in base]))}}
    for critic in critics:
        report["refine"][critic] = _refined(pipe, cases, base, drawn, judges, critic, rounds, seed, groups,
                                            dict(options or {}), way)
        progress(f"done: refine {critic}")
    if repair:
        report["repair"] = _refined(pipe, cases, base, drawn, judges, critics[0] if critics else None, rounds,
                                    seed, groups, dict(options or {}), way, repair=True)
        progress("done: repair")
    report["best_of"] = _best_of(pipe, cases, base, drawn, judges, best_of, seed, groups, batch_size, way,
                                 best_of_temperature)
    return report


REPAIR_MODALITIES = ("image", "text", "audio")


def _corrupted(truth: list, size: int, fraction: float, seed: int):
    """Each token list with ``fraction`` of its tokens replaced by other random ones, and where."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    corrupt, wrong = [], []
    for ids in truth:
        count = max(1, round(len(ids) * fraction))
        where = torch.randperm(len(ids), generator=generator)[:count]
        shift = torch.randint(1, size, (count,), generator=generator)
        changed, flags = ids.clone(), torch.zeros(len(ids), dtype=torch.bool)
        changed[where] = (ids[where] + shift) % size  # never the token it was
        flags[where] = True
        corrupt.append(changed)
        wrong.append(flags)
    return corrupt, wrong


class _RepairKind:
    """What repairing one modality means: its real tokens, the condition it is read against, and the judge.
    image: the picture's codes against its caption; text: the caption's tokens against the picture; audio:
    the speech's codes against the caption (judged through the speech judge's transcript)."""

    def __init__(self, pipe, modality: str, judges: Judges):
        self.pipe, self.modality, self.judges = pipe, modality, judges

    def truth(self, cases) -> list:
        pipe, layout = self.pipe, self.pipe.layout
        if self.modality == "image":
            return list(pipe.image_codec.encode(np.stack([c.image for c in cases])).cpu())
        if self.modality == "text":
            return [ids[:layout.max_text_len] for ids in pipe.text_codec.encode([c.text for c in cases])]
        return [ids[:layout.max_audio_len] for ids in pipe.audio_codec.encode([c.audio for c in cases])]

    def condition(self, case) -> dict:
        return {"image": case.image} if self.modality == "text" else {"text": case.text}

    def result(self, ids):
        """A result holding exactly these tokens (what refine reads) and what they decode to."""
        from unimodal.results import GenerationResult

        pipe, output = self.pipe, {}
        if self.modality == "image":
            from PIL import Image

            output["image"] = Image.fromarray(pipe.image_codec.decode(ids[None])[0])
        elif self.modality == "audio":
            output["audio"] = pipe.audio_codec.decode([ids])[0]
        else:
            output["text"] = pipe.text_codec.decode_one(ids)
        inputs = ["image"] if self.modality == "text" else ["text"]
        return GenerationResult(**output, token_ids={self.modality: ids.tolist()}, settings={"inputs": inputs})

    def verdicts(self, cases, token_lists) -> list[bool]:
        from unimodal.inference.evaluate import caption_correct

        if self.modality == "image":
            return _verdicts(cases, list(self.pipe.image_codec.decode(_stack(token_lists))), self.judges)
        if self.modality == "text":
            return [bool(caption_correct(c, self.pipe.text_codec.decode_one(ids))) for c, ids in zip(cases, token_lists)]
        heard = self.judges.speech.transcribe_many(self.pipe.audio_codec.decode(list(token_lists)), progress=False)
        return [bool(caption_correct(c, h)) for c, h in zip(cases, heard)]


def _stack(token_lists):
    import torch

    return torch.stack(list(token_lists))


def bench_repair(pipe, cases: Sequence[EvalCase], critics: Sequence = ("confidence", "random"), fraction: float = 0.25,
                 rounds: int = 3, seed: int = 0, groups: int = 4, judges: Judges | None = None, progress=print,
                 options: dict | None = None, modality: str = "image", reread: int = 0) -> dict:
    """Real test data with ``fraction`` of one modality's tokens corrupted (pictures by default, or captions,
    or speech): judged accuracy of the codec's own round trip, of the corrupted data, and after refine per
    critic; each critic's AUROC at telling the corrupted tokens from the others and the precision of the
    tokens it scores lowest. ``reread`` > 0 (captions only): each repaired caption is then refined that many
    rounds more as the model's own reading of the picture (``model_caption=True``: the caption recipe), and
    judged after both (``accuracy_repaired`` is the first call's)."""
    if modality not in REPAIR_MODALITIES:
        raise InputError(f"the repair modality must be one of {REPAIR_MODALITIES}, got {modality!r}")
    if isinstance(reread, bool) or not isinstance(reread, int) or reread < 0 or (reread and modality != "text"):
        raise InputError(f"reread re-reads repaired captions against their picture: a whole number >= 0 with "
                         f"modality 'text', got {reread!r} with {modality!r}")
    show, progress = progress is not None, progress or _quiet
    kind = _RepairKind(pipe, modality, judges or Judges())
    truth = kind.truth(cases)
    corrupt, wrong = _corrupted(truth, pipe.layout.codebook_size(modality), fraction, seed)
    options = dict(options or {})
    report = {"n": len(cases), "modality": modality, "corrupted_fraction": fraction, "rounds": rounds, "seed": seed,
              "options": options, "reread": reread, "accuracy_reconstructed": float(np.mean(kind.verdicts(cases, truth))),
              "accuracy_corrupted": float(np.mean(kind.verdicts(cases, corrupt))), "critics": {}}
    for critic in critics:
        report["critics"][critic] = _repaired(pipe, kind, cases, truth, corrupt, wrong, critic, rounds, seed, groups,
                                              options, reread, show=show)
        progress(f"done: repair {critic}")
    return report


# A repair bench's bound on the regenerate half: a critic that knows the real tokens (scores 0 where a token
# differs from them, 1 elsewhere), so it scores exactly the corrupted ones low (its image regions are their
# boxes, which may hold right codes too) and keeps a round when more tokens are back; what it does not restore,
# the model's regeneration lost.
ORACLE = "oracle"


def _oracle(modality: str, truth):
    def knows(tokens):
        ids = tokens[modality]
        same = np.concatenate([(ids[:len(truth)] == truth[:len(ids)]).float().numpy(),
                               np.zeros(max(0, len(ids) - len(truth)))])
        if len(ids) < len(truth) and len(same):  # an END written early cut real tokens: the last one is wrong
            same[-1] = 0.0
        return {modality: same}

    knows.__name__ = ORACLE
    return knows


# Where the critic's scores of *real* (uncorrupted) tokens lie: a threshold at the 5% quantile flags about one
# real token in twenty (inference/critique.py's CONFIDENCE_THRESHOLDS were read off these).
REAL_QUANTILES = (0.01, 0.02, 0.05, 0.1, 0.25, 0.5)


def _quiet(*_) -> None:
    """The ``progress`` of a bench called with ``progress=None``: no bar, no lines."""


def _bar(items, desc: str, show: bool = True):
    """A progress bar over a bench's cases on stderr (each case is several model calls)."""
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit="case", disable=not show, leave=False)


def _repaired(pipe, kind: _RepairKind, cases, truth, corrupt, wrong, critic, rounds, seed, groups, options,
              reread: int = 0, show: bool = True) -> dict:
    import torch

    repaired, scores, real, first, passes = [], [], [], [], []
    name = critic if isinstance(critic, str) else "critic"
    for i, case in enumerate(_bar(cases, f"repair {kind.modality} ({name})", show)):
        result, condition, case_seed = kind.result(corrupt[i]), kind.condition(case), derived_seed(seed, i)
        scorer = _oracle(kind.modality, truth[i]) if critic == ORACLE else critic
        report = pipe.critique(result, **condition, critic=scorer, groups=groups, seed=case_seed,
                               threshold=options.get("threshold"))
        scores.append(np.array(report.scores[kind.modality]))
        real.append(np.array(pipe.critique(kind.result(truth[i]), **condition, critic=scorer, groups=groups,
                                           seed=case_seed).scores[kind.modality]))
        fixed, trace = pipe.refine(result, **condition, rounds=rounds, critic=scorer, groups=groups,
                                   seed=case_seed, **options)
        passes.append(trace["forward_passes"])
        if reread:  # the repaired caption, read again as the model's own reading of the picture
            first.append(torch.tensor(fixed.token_ids[kind.modality]))
            fixed, trace = pipe.refine(fixed, **condition, rounds=reread, critic=scorer, groups=groups,
                                       seed=case_seed, model_caption=True)
            passes[-1] += trace["forward_passes"]
        repaired.append(torch.tensor(fixed.token_ids[kind.modality]))
    lowest = [np.argsort(s, kind="stable")[:max(1, round(len(s) * 0.1))] for s in scores]
    flags = np.concatenate([w.numpy() for w in wrong])
    threshold = report.thresholds[kind.modality]  # what refine flagged below, as the critique resolved it
    real = np.concatenate(real)
    return {"threshold": threshold, "real_flagged": float((real < threshold).mean()),
            "real_score_quantiles": dict(zip(REAL_QUANTILES, np.quantile(real, REAL_QUANTILES).round(6).tolist())),
            "corrupted_below_threshold": float((np.concatenate(scores)[flags] < threshold).mean()),
            "auroc": auroc(np.concatenate(scores), flags),
            "precision_lowest_10pct": float(np.mean(np.concatenate([w.numpy()[k] for w, k in zip(wrong, lowest)]))),
            "accuracy_refined": float(np.mean(kind.verdicts(cases, repaired))),
            "accuracy_repaired": float(np.mean(kind.verdicts(cases, first))) if reread else None,
            # with reread, restored / broken are counted after both calls; these are the repair's alone
            "codes_restored_repaired": _restored(first, truth, wrong, flags) if reread else None,
            "codes_broken_repaired": _broken_share(first, truth, wrong, flags) if reread else None,
            "forward_passes": float(np.mean(passes)),
            "codes_restored": _restored(repaired, truth, wrong, flags),
            "codes_broken": _broken_share(repaired, truth, wrong, flags)}


def _restored(repaired, truth, wrong, flags) -> float:
    """The share of the corrupted tokens back as the real ones."""
    restored = sum(int(((r[:len(t)] == t[:len(r)]) & w[:len(r)]).sum()) for r, t, w in zip(repaired, truth, wrong))
    return restored / max(int(flags.sum()), 1)


def _broken_share(repaired, truth, wrong, flags) -> float:
    """The share of the real (uncorrupted) tokens changed."""
    return sum(_broken(r, t, w) for r, t, w in zip(repaired, truth, wrong)) / max(int((~flags).sum()), 1)


def bench_mistakes(pipe, cases: Sequence[EvalCase], critics: Sequence = ("confidence", "random"),
                   fraction: float = 0.5, seed: int = 0, groups: int = 4, modality: str = "image",
                   progress=print) -> dict:
    """The critics on the model's own mistakes. Real test data (pictures by default, or captions, or speech)
    with ``fraction`` of one modality's tokens re-masked and regenerated by the model's sampler (the rest and
    the condition as context); among the regenerated tokens, those that differ from the real ones are the
    model's mistakes. Per critic: AUROC at scoring them below the regenerated tokens it got right, and the share
    of mistakes among the 10% it scores lowest. Only regenerated tokens count: the untouched ones are real, an
    easy call that would flatter every critic."""
    import math
    from dataclasses import replace

    import torch

    from unimodal.inference.refine import regenerate
    from unimodal.refine import draft_of, require_trained_critic

    if modality not in REPAIR_MODALITIES or not 0 < fraction < 1:
        raise InputError(f"bench mistakes needs a modality of {REPAIR_MODALITIES} and a fraction in (0, 1), got "
                         f"{modality!r} and {fraction!r}")
    for critic in critics:
        require_trained_critic(pipe, critic)
    show, progress = progress is not None, progress or _quiet
    kind = _RepairKind(pipe, modality, None)
    sampler = pipe._sampler_config({}, pipe.scheduler.target_kind([modality]))
    sampler = replace(sampler, steps=max(2, math.ceil(sampler.steps * fraction)))
    scores = {c: [] for c in critics}
    wrong, far, distances = [], [], []
    labels = _decoded_labels(pipe, modality)
    for i, (case, truth) in enumerate(_bar(list(zip(cases, kind.truth(cases))), f"{modality} mistakes", show)):
        case_seed = derived_seed(seed, i)
        generator = torch.Generator().manual_seed(case_seed)
        chosen = torch.zeros(len(truth), dtype=torch.bool)
        chosen[torch.randperm(len(truth), generator=generator)[:max(1, round(len(truth) * fraction))]] = True
        draft = draft_of(pipe, kind.result(truth), kind.condition(case))
        filled, _ = regenerate(pipe.backbone, pipe.layout, draft, {modality: chosen}, sampler, case_seed)
        ids = filled.tokens(pipe.layout)[modality]
        n = min(len(ids), len(truth))  # a caption or clip may end early: compare what both hold
        wrong.append((ids[:n] != truth[:n])[chosen[:n]].numpy())
        if labels is not None:
            distance = labels.distance(modality, truth[None, :n], ids[None, :n])[0]
            distances.append(distance[chosen[:n]].numpy())
            far.append((distances[-1] > labels.thresholds[modality]) & wrong[-1])
        for critic in critics:
            read = pipe.critique(kind.result(ids), **kind.condition(case), critic=critic, groups=groups, seed=case_seed)
            scores[critic].append(np.array(read.scores[modality])[:n][chosen[:n].numpy()])
    flags = np.concatenate(wrong)
    progress(f"done: {len(cases)} {modality} cases, {int(flags.sum())} of {len(flags)} regenerated tokens wrong")
    report = {"n": len(cases), "modality": modality, "remasked_fraction": fraction, "seed": seed, "groups": groups,
              "sampler_steps": sampler.steps, "tokens": int(len(flags)), "wrong": int(flags.sum()),
              "critics": {c: {"auroc": auroc(np.concatenate(s), flags),
                              "auroc_ci95": auroc_interval(list(zip(s, wrong))),
                              "precision_lowest_10pct": _lowest(s, wrong)}
                          for c, s in scores.items()}}
    if labels is not None:  # the same tokens, wrong only where their decoded content differs (critic_labels)
        decoded, distance = np.concatenate(far), np.concatenate(distances)
        report["decoded"] = {"threshold": labels.thresholds[modality], "wrong": int(decoded.sum()),
                             "distance_quantiles": {"q": list(QUANTILES),
                                                    "wrong_by_token": _quantiles(distance[flags]),
                                                    "right_by_token": _quantiles(distance[~flags])}}
        for critic, s in scores.items():
            report["critics"][critic].update(auroc_decoded=auroc(np.concatenate(s), decoded),
                                             auroc_decoded_ci95=auroc_interval(list(zip(s, far))),
                                             precision_lowest_10pct_decoded=_lowest(s, far))
    # every case's regenerated tokens, so two reports of the same cases pair case by case (bench compare)
    report["cases"] = [{"wrong": w.astype(int).tolist(), **({"wrong_decoded": far[i].astype(int).tolist()}
                                                              if labels is not None else {}),
                        "scores": {c: [float(f"{v:.6g}") for v in s[i]] for c, s in scores.items()}}
                       for i, w in enumerate(wrong)]
    return report


QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def _quantiles(values: np.ndarray) -> list[float] | None:
    return [round(float(v), 4) for v in np.quantile(values, QUANTILES)] if len(values) else None


def _decoded_labels(pipe, modality: str):
    """Decoded-content labels for image and audio codes (captions: None, token inequality is the content)."""
    from unimodal.training.critic_labels import DecodedLabels

    if modality == "image":
        return DecodedLabels(pipe.layout, image_model=pipe.image_codec.model)
    if modality == "audio":
        return DecodedLabels(pipe.layout, audio_model=pipe.audio_codec.model)
    return None


def _lowest(scores: list, wrong: list) -> float:
    """Share of mistakes among each case's lowest-scored 10% of regenerated tokens (at least one per case)."""
    picked = [w[np.argsort(s, kind="stable")[:max(1, round(len(s) * 0.1))]] for s, w in zip(scores, wrong) if len(s)]
    return float(np.mean(np.concatenate(picked))) if picked else float("nan")


def format_mistakes(report: dict) -> str:
    decoded = report.get("decoded")
    width = max([12] + [len(c) for c in report["critics"]])  # "content+learned" is wider than the rest
    headline = "auroc_decoded" if decoded else "auroc"  # the figure the interval is given for
    lines = [f"{'critic':<{width}} {'AUROC':>6} {'prec@10%':>9}" + (f" {'AUROC*':>7} {'prec@10%*':>10}" if decoded else "")
             + f"  {'95% interval' + ('*' if decoded else ''):>16}"]
    for critic, row in report["critics"].items():
        line = f"{critic:<{width}} {_cell(row['auroc']):>6} {row['precision_lowest_10pct']:>9.3f}"
        if decoded:
            line += f" {_cell(row['auroc_decoded']):>7} {row['precision_lowest_10pct_decoded']:>10.3f}"
        interval = row.get(headline + "_ci95")  # reports written before the intervals have none
        lines.append(line + (f"  {'[' + f'{interval[0]:.3f}, {interval[1]:.3f}' + ']':>16}" if interval else ""))
    lines.append(f"n={report['n']} real cases (the split below), {report['remasked_fraction']:.0%} of the "
                 f"{report['modality']} tokens re-masked and regenerated ({report['sampler_steps']} sampler steps), "
                 f"seed {report['seed']}; "
                 f"{report['wrong']} of {report['tokens']} regenerated tokens wrong (the model's own mistakes); "
                 f"prec@10%: share of mistakes among each case's lowest-scored 10%; 95% interval: bootstrap over "
                 f"the cases")
    if decoded:
        lines.append(f"*: wrong only where the decoded content differs (distance > {decoded['threshold']}, "
                     f"unimodal.training.critic_labels): {decoded['wrong']} of the {report['wrong']} wrong tokens")
        spread = decoded["distance_quantiles"]
        lines.append(f"decoded distance at quantiles {spread['q']}: tokens wrong by id {spread['wrong_by_token']}, "
                     f"right by id {spread['right_by_token']}")
    return "\n".join(lines)


def _broken(repaired, truth, wrong) -> int:
    """Right tokens that are no longer what they were (cut off by a shorter repair counts as changed)."""
    length = min(len(repaired), len(truth))
    return int(((repaired[:length] != truth[:length]) & ~wrong[:length]).sum()) + int((~wrong[length:]).sum())


def format_repair(report: dict) -> str:
    width = max([12] + [len(c) for c in report["critics"]])  # "content+learned" is wider than the rest
    lead = width + 25  # the name, AUROC and prec@10% columns: where accuracy starts
    lines = [f"{'critic':<{width}} {'AUROC':>6} {'prec@10%':>9} {'accuracy':>9} {'restored':>9} {'broken':>7} "
             f"{'threshold':>9} {'real flagged':>12} {'corrupted':>9}",
             f"{'(real, codec round trip)':<{lead}} {report['accuracy_reconstructed']:>9.3f}",
             f"{'(corrupted ' + format(report['corrupted_fraction'], '.0%') + ')':<{lead}} "
             f"{report['accuracy_corrupted']:>9.3f}"]
    for critic, row in report["critics"].items():
        lines.append(f"{critic:<{width}} {_cell(row['auroc']):>6} {row['precision_lowest_10pct']:>9.3f} "
                     f"{row['accuracy_refined']:>9.3f} {row['codes_restored']:>9.3f} {row['codes_broken']:>7.3f} "
                     f"{row['threshold']:>9g} {row['real_flagged']:>12.3f} {row['corrupted_below_threshold']:>9.3f}")
    for critic, row in report["critics"].items():
        quantiles = ", ".join(f"{float(q):.0%}: {v:.4g}" for q, v in row["real_score_quantiles"].items())
        lines.append(f"{critic} scores of the real tokens, quantiles {quantiles}")
    for critic, row in report["critics"].items():
        if row.get("accuracy_repaired") is not None:
            lines.append(f"{critic}: repaired {row['accuracy_repaired']:.3f}, then re-read {report['reread']} rounds "
                         f"as the model's own caption (the caption recipe) {row['accuracy_refined']:.3f}; "
                         f"{row['forward_passes']:.1f} forward passes a case in all")
        elif row.get("forward_passes") is not None:
            lines.append(f"{critic}: {row['forward_passes']:.1f} refine forward passes a case")
    lines.append(f"n={report['n']} real cases (the split below), {report.get('modality', 'image')} corrupted, "
                 f"{report['rounds']} refine rounds, seed {report['seed']}, "
                 f"refine options {report.get('options') or {}}; "
                 f"restored: corrupted codes back to the original; broken: other codes changed; real flagged / "
                 f"corrupted: shares of the real and of the corrupted tokens scored below the threshold")
    return "\n".join(lines)


def _cell(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_table(report: dict) -> str:
    lines = [f"{'method':<28} {'passes':>7} {'accuracy':>9} {'fix':>6} {'break':>6}"]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731 - table cells
    if not report["refine"] and report.get("base"):
        lines.append(f"{'no refine':<28} {report['base']['forward_passes']:>7.1f} {report['base']['accuracy']:>9.3f} "
                     f"{'-':>6} {'-':>6}")
    for critic, part in report["refine"].items():
        for row in part["rounds"]:
            name = "no refine" if row["round"] == 0 else f"refine {critic} r{row['round']}"
            if row["round"] == 0 and critic != next(iter(report["refine"])):
                continue
            lines.append(f"{name:<28} {row['forward_passes']:>7.1f} {row['accuracy']:>9.3f} "
                         f"{fmt(row['fix_rate']):>6} {fmt(row['break_rate']):>6}")
    repaired = report.get("repair")
    for row in (repaired or {}).get("rounds", []):
        name = "repair" if row["round"] == 0 else f"repair, {repaired['critic']} r{row['round']}"
        lines.append(f"{name:<28} {row['forward_passes']:>7.1f} {row['accuracy']:>9.3f} "
                     f"{fmt(row['fix_rate']):>6} {fmt(row['break_rate']):>6}")
    for row in report["best_of"]:
        lines.append(f"{'best-of-' + str(row['n']) + ' (' + row.get('selector', 'confidence') + ')':<28} "
                     f"{row['forward_passes']:>7.1f} "
                     f"{row['accuracy']:>9.3f} {'-':>6} {'-':>6}   (any of {row['n']} right: {row['oracle_accuracy']:.3f})")
    for critic, part in report["refine"].items():
        diff = part.get("final_minus_base")
        if diff:
            lines.append(f"refine {critic} minus no refine (same cases): {diff['mean']:+.3f}, 95% CI "
                         f"[{diff['ci95'][0]:+.3f}, {diff['ci95'][1]:+.3f}]")
    if repaired:
        for label, key in (("repair", "repair_minus_base"), ("repair then refine", "final_minus_base")):
            diff = repaired.get(key)
            if diff and (key == "repair_minus_base" or len(repaired["rounds"]) > 1):
                lines.append(f"{label} minus no refine (same cases): {diff['mean']:+.3f}, 95% CI "
                             f"[{diff['ci95'][0]:+.3f}, {diff['ci95'][1]:+.3f}]")
        lines.append(f"repair: {repaired['edits_kept']} edits kept over {report['n']} pictures")
    stops = "; ".join(f"{c}: {p['stopped']}" for c, p in report["refine"].items())
    for critic, part in report["refine"].items():
        ran = part.get("ran")
        if ran:
            lines.append(f"refine {critic} ran: kept by {ran['evaluator']}, patience {ran['patience']}, flagged below "
                         f"{ran['thresholds']}, regenerated at temperature {ran['regen_temperature']}")
    later = report.get("best_of_temperature")
    lines.append(f"n={report['n']} {report.get('direction', 'text->image')} cases, seed {report['seed']}, sampler "
                 f"{report['sampler']}, best-of draws after the first at temperature "
                 f"{'the sampler default' if later is None else later}, refine options {report.get('options') or {}}, "
                 f"confidence groups {report['groups']}; refine stops: {stops}")
    return "\n".join(lines)


def plot_refine(reports: Sequence[dict], path) -> Path:
    """Judged accuracy against mean forward passes per picture: no refine, every refine run round by round (one
    line per critic and evaluator), best-of-N per selector, and the share where any of N pictures is right (the
    best a selector could do). Several reports of the same cases and seeds go on one figure."""
    plt = pyplot()

    figure, axis = plt.subplots(figsize=(7.5, 4.8))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    axis.set_prop_cycle(color=[c for k, c in enumerate(palette) if k != 7])  # the 8th is grey, as the oracle
    base = reports[0].get("base") or reports[0]["refine"][next(iter(reports[0]["refine"]))]["rounds"][0]
    axis.plot([base["forward_passes"]], [base["accuracy"]], "ks", label="no refine")
    seen, oracle_drawn = set(), False
    for report in reports:
        options = report.get("options") or {}
        tag = f"kept by {options.get('evaluator', 'critic')}" + (f", patience {options['patience']}"
                                                                  if options.get("patience", 1) > 1 else "")
        for critic, part in report["refine"].items():
            rows = part["rounds"]
            ran = part.get("ran")  # what the loop resolved (the library's defaults included), when recorded
            label = tag if not ran else f"kept by {ran['evaluator']}" + (
                f", patience {ran['patience']}" if ran["patience"] > 1 else "")
            axis.plot([r["forward_passes"] for r in rows], [r["accuracy"] for r in rows], "-o", markersize=3,
                      label=f"refine {critic}, {label}")
        repaired = report.get("repair")
        if repaired:
            rows = [base] + repaired["rounds"]  # from the draw it repairs
            axis.plot([r["forward_passes"] for r in rows], [r["accuracy"] for r in rows], "-D", markersize=4,
                      label="repair by reading back" + (f", then refine {repaired['critic']}"
                                                       if len(repaired["rounds"]) > 1 else ""))
        by_selector: dict[str, list] = {}
        for row in report.get("best_of", []):
            by_selector.setdefault(row.get("selector", "confidence"), []).append(row)
        for selector, rows in by_selector.items():
            key = (selector, tuple((r["n"], r["accuracy"]) for r in rows))
            if len(rows) < 2 or key in seen:
                continue
            seen.add(key)
            axis.plot([r["forward_passes"] for r in rows], [r["accuracy"] for r in rows], "--^", markersize=4,
                      label=f"best-of-N, kept by {selector}")
            if not oracle_drawn:  # at the cost of the N draws alone: a perfect selector costs nothing
                oracle_drawn = True
                one = rows[0]["forward_passes"]
                axis.plot([r["n"] * one for r in rows], [r["oracle_accuracy"] for r in rows], ":",
                          color="black", alpha=0.6, label="any of N right (a perfect selector, free)")
    direction = reports[0].get("direction", "text->image")
    output, judge, inputs = (("caption", "caption grammar", "pictures") if direction == "image->text"
                             else ("picture", "scene judge", "captions"))
    axis.set_xlabel(f"forward passes per {output} (mean)")
    axis.set_ylabel(f"judged accuracy ({judge})")
    split = reports[0].get("split", "test")  # the held-out split is not the test split: say which
    axis.set_title(f"{direction}, n={reports[0]['n']} {split} {inputs}, seed {reports[0]['seed']}", fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    return save_figure(figure, path)


def is_mistakes_report(report) -> bool:
    """Whether a parsed report is one of ``bench refine --mistakes`` (critics' AUROCs on the model's own fills)."""
    return isinstance(report, dict) and {"critics", "remasked_fraction", "tokens"} <= report.keys()


def compare_mistakes(reference: dict, candidate: dict, resamples: int = 2000, seed: int = 0) -> dict:
    """Two ``bench refine --mistakes`` reports of the same cases (two models' fills of the same re-masked
    tokens): per critic both models share, the AUROC of each and the paired difference ``candidate -
    reference`` with a 95% bootstrap interval drawing the same cases for both (by decoded content where both
    reports have it). Refused (``InputError``) when the reports are not of the same cases or lack the
    per-case scores (written before they were kept)."""
    from unimodal.core.ranking import auroc_difference

    def cases_of(report: dict) -> dict:  # what names the cases (a report older than --voices spoke varied ones)
        return {key: report.get(key) for key in ("n", "modality", "remasked_fraction", "seed", "split")} | {
            "voices": report.get("voices", "varied")}

    same, other = cases_of(reference), cases_of(candidate)
    differ = [key for key in same if same[key] != other[key]]
    if differ:
        raise InputError("bench compare pairs two bench refine --mistakes reports of the same cases; they differ in "
                         + ", ".join(f"{k} ({same[k]!r} and {other[k]!r})" for k in differ))
    if "cases" not in reference or "cases" not in candidate:
        raise InputError("bench compare needs the per-case scores of both bench refine --mistakes reports; a report "
                         "written before they were kept has none: run the bench again")
    decoded = all("wrong_decoded" in c for c in reference["cases"] + candidate["cases"])
    label = "wrong_decoded" if decoded else "wrong"
    critics = {}
    for critic in [c for c in reference["critics"] if c in candidate["critics"]]:
        pairs = [[(case["scores"][critic], np.asarray(case[label], dtype=bool)) for case in report["cases"]]
                 for report in (candidate, reference)]
        critics[critic] = {"reference": auroc(*map(np.concatenate, zip(*pairs[1]))),
                           "candidate": auroc(*map(np.concatenate, zip(*pairs[0]))),
                           "difference": auroc_difference(*pairs, resamples=resamples, seed=seed)}
    return {"kind": "mistakes", "labels": "decoded content" if decoded else "token ids",
            "reference_model": reference.get("model"), "candidate_model": candidate.get("model"),
            "wrong": [sum(int(np.sum(c[label])) for c in r["cases"]) for r in (reference, candidate)],
            "groups": [reference.get("groups"), candidate.get("groups")], **same, "critics": critics}


def format_mistakes_comparison(comparison: dict) -> str:
    width = max([12] + [len(c) for c in comparison["critics"]])
    lines = [f"{'critic':<{width}} {'reference':>9} {'candidate':>9} {'paired difference (95% CI)':>34}  verdict"]
    for critic, row in comparison["critics"].items():
        difference = row["difference"]
        if difference is None:
            lines.append(f"{critic:<{width}} {_cell(row['reference']):>9} {_cell(row['candidate']):>9}  "
                         f"(a side without both wrong and right tokens)")
            continue
        low, high = difference["ci95"]
        verdict = "better" if low > 0 else "worse" if high < 0 else "within the noise"
        lines.append(f"{critic:<{width}} {row['reference']:>9.3f} {row['candidate']:>9.3f} "
                     f"{difference['mean']:>+14.3f} [{low:+.3f}, {high:+.3f}]{'':>2}  {verdict}")
    lines.append(f"AUROC at scoring the model's own wrong fills (by {comparison['labels']}: {comparison['wrong'][0]} "
                 f"and {comparison['wrong'][1]} wrong) below its right ones; reference model "
                 f"{comparison['reference_model']}, candidate model {comparison['candidate_model']}; "
                 f"{comparison['modality']}, n {comparison['n']} {comparison['split']} cases "
                 f"({comparison['voices']} voices), "
                 f"{comparison['remasked_fraction']:.0%} re-masked, seed {comparison['seed']}, critics in "
                 f"{' and '.join(map(str, dict.fromkeys(comparison['groups'])))} groups; the interval resamples "
                 f"the cases, the same for both")
    return "\n".join(lines)


__all__ = ["auroc", "bench_mistakes", "bench_refine", "bench_repair", "compare_mistakes", "format_mistakes",
           "format_mistakes_comparison", "format_repair", "format_table", "is_mistakes_report", "plot_refine"]
