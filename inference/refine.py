"""Plan, execute, evaluate: repair a draft by re-masking the regions a critic flags and regenerating them.

Each round:

1. **plan**: score the draft's tokens with the critic and turn the lowest into regions (see
   :mod:`unimodal.inference.critique`), or take the caller's regions;
2. **execute**: re-mask exactly the tokens of those regions and regenerate them with the sampler, every other
   token of the draft (and the original conditions) held fixed as context (``Request.start_ids``);
3. **evaluate**: score the candidate with the evaluator; keep it only if its sample score rose.

The loop stops when ``patience`` rounds in a row were not kept (1: the first round that does not improve), when
the critic flags nothing (a token ``keep`` protects is never flagged), after ``rounds`` rounds, or before a round
whose worst-case cost would pass the forward-pass ``budget``; a given plan whose regions hold only kept tokens
runs no round and counts as a round not kept. A round after one that was not kept plans again and regenerates
with its own seed, so it tries something new (fresh positions for the random critic, fresh samples for every
critic). The evaluators:

- ``"critic"``: the critic itself (the mean log-score of the draft's tokens), except for ``random``, whose
  scores mean nothing: there the model's confidence judges, so the random baseline differs from the
  confidence critic in *where* it re-masks and in how much (random flags its ``fraction``; confidence only
  tokens below its own thresholds, often fewer);
- ``"agreement"``: the request read back from the draft by the same model
  (:func:`unimodal.inference.critique.agreement_score`, one model call): a round is kept when the picture (or
  speech, or caption) makes the request more likely. The critic still plans where to re-mask;
- ``"agreement-each"``: the same, each request token read alone with the rest of the request in view (the
  ``"each"`` reading: a pass per request token), so the words that name the content decide.

The trace (:func:`refine` returns it) is plain JSON: per round the regions, the sample score before and
after, the tokens changed, the forward passes (critic, regeneration and evaluation model calls over the
targets, as the sampler counts its steps) and whether the round was kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from unimodal.inference.critique import (DEFAULT_FRACTION, DEFAULT_GROUPS, Draft, agreement_score,
                                         flags_of, make_critic, region_indices, regions_from_flags, remasked,
                                         sample_score, selection_of, thresholds_for)
from unimodal.inference.sampler import Request, SamplerConfig
from unimodal.inference.sampler import generate as sample
from unimodal.core.errors import InputError
from unimodal.core.seeds import check_seed, derived_seed

EVALUATORS = ("critic", "agreement", "agreement-each")
NOT_KEPT = ("no improvement", "region cut the content after it")  # a round ran and its candidate was dropped
# a plan given for the first round (the caller's ``regions``, the cross-modal check's) held only tokens ``keep``
# protects: no round ran; it counts as a round not kept (with ``patience`` > 1 the critic plans the next)
ALL_KEPT = "everything flagged is kept"


@dataclass(frozen=True)
class RefineConfig:
    """``rounds``: most rounds; ``budget``: most forward passes in all (None: no cap); ``fraction`` /
    ``threshold``: which tokens a round may flag (the lowest ``fraction``, scored below ``threshold``; None:
    the critic's own default per modality, :func:`unimodal.inference.critique.thresholds_for`);
    ``groups``: re-masking groups of the confidence score; ``regen_steps``: sampler steps to regenerate a
    round's tokens (None: the sampler's steps scaled by the share of tokens re-masked, at least 2);
    ``seed``: noise of the regenerations (round r uses ``seed + r``, :func:`~unimodal.core.seeds.derived_seed`)
    and of the random critic; ``evaluator``: what decides whether a round is kept (``EVALUATORS``, see the module's docstring); ``patience``: rounds in a
    row not kept before the loop stops."""

    rounds: int = 3
    budget: int | None = None
    fraction: float = DEFAULT_FRACTION
    threshold: float | None = None
    groups: int = DEFAULT_GROUPS
    regen_steps: int | None = None
    seed: int = 0
    evaluator: str = "critic"
    patience: int = 1

    def __post_init__(self):
        if self.evaluator not in EVALUATORS:
            raise InputError(f"evaluator must be one of {EVALUATORS}, got {self.evaluator!r}")
        for name, low in (("rounds", 0), ("groups", 1), ("seed", 0), ("patience", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InputError(f"{name} must be an int >= {low}, got {value!r}")
        check_seed(self.seed)
        for name in ("budget", "regen_steps"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InputError(f"{name} must be a positive int or None, got {value!r}")
        for name in ("fraction", "threshold"):
            value = getattr(self, name)
            if name == "threshold" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise InputError(f"{name} must be a number in (0, 1], got {value!r}")


def critic_name(critic) -> str:
    if isinstance(critic, str):
        return critic
    return getattr(critic, "name", None) or getattr(critic, "__name__", "callable")


def plan_regions(layout, draft: Draft, scores: Mapping[str, torch.Tensor], config: RefineConfig,
                 text_codec=None, critic=None) -> list[dict]:
    """The regions to redo: connected areas of flagged tokens (``critic`` names whose scores these are: it sets
    the default thresholds; None: :data:`~unimodal.inference.critique.DEFAULT_THRESHOLD`)."""
    flags = flags_of(scores, critic, config.fraction, config.threshold)
    return regions_from_flags(layout, flags, scores, draft, text_codec)


def regenerate(model, layout, draft: Draft, selection: Mapping[str, torch.Tensor], sampler: SamplerConfig,
               seed: int):
    """The draft with its selected tokens re-masked and sampled again (the rest is context); the sampler's
    result for it."""
    start_ids = remasked(layout, draft, selection)
    request = Request(list(draft.conditions), draft.target_segments(), start_ids=start_ids, seed=seed)
    result = sample(model, layout, request, sampler)[0]
    return draft.with_ids(result.target.ids), result


def regen_steps(config: RefineConfig, sampler: SamplerConfig, n_masked: int, n_tokens: int) -> int:
    if config.regen_steps is not None:
        return config.regen_steps
    return max(2, math.ceil(sampler.steps * n_masked / max(n_tokens, 1)))


def outside_unchanged(layout, before: Draft, after: Draft, selection: Mapping[str, torch.Tensor]) -> bool:
    """Whether every token outside the selection is as it was (an END written inside a text or audio
    region would cut what follows it: such a candidate is refused)."""
    old, new = before.tokens(layout), after.tokens(layout)
    for modality, chosen in selection.items():
        if len(new[modality]) < len(old[modality]):
            keep = ~chosen
            if bool(keep[len(new[modality]):].any()):
                return False
        length = min(len(old[modality]), len(new[modality]))
        if not torch.equal(old[modality][:length][~chosen[:length]], new[modality][:length][~chosen[:length]]):
            return False
    return True


def tokens_changed(layout, before: Draft, after: Draft) -> int:
    old, new = before.tokens(layout), after.tokens(layout)
    changed = 0
    for modality in old:
        length = min(len(old[modality]), len(new[modality]))
        changed += int((old[modality][:length] != new[modality][:length]).sum())
        changed += abs(len(old[modality]) - len(new[modality]))
    return changed


@dataclass
class _Loop:
    """What the loop carries from round to round."""

    draft: Draft
    scores: dict
    score: float
    passes: int
    judge_passes: int  # what one evaluation costs
    confidence: dict  # per modality, the probability each token had when last sampled
    critic: object  # the planning critic (its name sets the default thresholds)
    keep: dict  # per modality, the tokens no plan re-masks


def refine(model, layout, draft: Draft, sampler: SamplerConfig, critic="confidence",
           config: RefineConfig | None = None, cfg=None, text_codec=None,
           regions: Sequence[Mapping] | None = None, confidence: Mapping | None = None,
           on_round: Callable[[int, Draft], None] | None = None,
           keep: Mapping[str, torch.Tensor] | None = None) -> tuple[Draft, dict, dict]:
    """Refine ``draft``; returns the final draft, per-token confidences of its tokens, and the trace.

    ``sampler``: the settings regenerations use (their steps are set per round, see :class:`RefineConfig`);
    ``cfg``: the guidance the confidence score reads logits with (the sampler's, as a rule); ``regions``: a
    caller's plan, executed in the first round instead of the critic's; ``confidence``: the draft's
    per-token confidences (carried into the result for tokens no round changes); ``on_round(r, draft)``: called
    after each round r (1-based) that ran, with the draft as it stands then (a benchmark judges it); ``keep``: per
    modality, a bool mask over its content tokens that no round re-masks, whoever planned it (what a repair already
    made right: the critic reads them as sure, and they are taken out of any region, ``regions`` included).
    """
    config = config or RefineConfig()
    if config.evaluator.startswith("agreement") and not draft.conditions:
        raise InputError(f"evaluator={config.evaluator!r} reads the request back from the draft, and this draft was "
                         "generated from no input; use evaluator='critic'")
    judged_by = "confidence" if isinstance(critic, str) and critic == "random" else critic
    plan = make_critic(critic, model, layout, cfg, config.groups, config.seed)
    if config.evaluator.startswith("agreement"):
        evaluator, reading = config.evaluator, "each" if config.evaluator == "agreement-each" else "joint"

        def judge(d: Draft):  # no per-token scores: the critic plans every round
            return (None, *agreement_score(model, layout, d, reading=reading))
    else:
        evaluator, score_of = critic_name(judged_by), make_critic(judged_by, model, layout, cfg, config.groups)

        def judge(d: Draft):
            scores, passes = score_of(d)
            return scores, sample_score(scores), passes
    reuse = config.evaluator == "critic" and judged_by is critic  # the evaluation's scores plan the next round
    scores, score, passes = judge(draft)
    state = _Loop(draft, scores, score, passes, passes,
                  {m: torch.as_tensor(v, dtype=torch.float32) for m, v in (confidence or {}).items()}, critic,
                  {m: torch.as_tensor(k, dtype=torch.bool) for m, k in (keep or {}).items()})
    trace = {"critic": critic_name(critic), "evaluator": evaluator,
             "config": {k: getattr(config, k) for k in config.__dataclass_fields__},
             "thresholds": {m: v for m, v in thresholds_for(critic, config.threshold).items()
                            if m in draft.tokens(layout)},
             "score_initial": round(state.score, 6), "scoring_passes_initial": passes, "rounds": []}
    stopped, misses = None, 0
    for round_ in range(config.rounds):
        stopped = _round(model, layout, state, plan if not reuse else None, judge, sampler, config, round_, trace,
                         text_codec, regions if round_ == 0 else None)
        if on_round is not None and len(trace["rounds"]) > round_:
            on_round(round_ + 1, state.draft)
        retry = stopped in (*NOT_KEPT, ALL_KEPT)
        misses = misses + 1 if retry else 0
        if retry and misses < config.patience:
            stopped = None  # try again: the next round re-plans and samples with its own seed
        if stopped:
            break
    trace.update(score_final=round(state.score, 6), forward_passes=state.passes, stopped=stopped or "rounds",
                 rounds_kept=sum(r["kept"] for r in trace["rounds"]))
    return state.draft, state.confidence, trace


def _kept_out(scores: Mapping[str, torch.Tensor], keep: Mapping[str, torch.Tensor]) -> dict:
    """The critic's scores with the tokens to keep read as sure (1): no plan flags them."""
    out = dict(scores)
    for modality, mask in keep.items():
        if modality in out:  # a caption may end elsewhere after a round: the tokens both hold
            score = torch.as_tensor(out[modality])
            out[modality] = score.masked_fill(_fitted(mask, len(score)), 1.0)
    return out


def _fitted(mask: torch.Tensor, n: int) -> torch.Tensor:
    """``mask`` cut or padded (False) to ``n`` tokens."""
    out = torch.zeros(n, dtype=torch.bool)
    out[:min(n, len(mask))] = mask[:n]
    return out


def _round(model, layout, state: _Loop, plan, judge, sampler: SamplerConfig, config: RefineConfig, round_: int,
           trace: dict, text_codec, given_regions) -> str | None:
    """One plan-execute-evaluate round; returns why the loop stops, or None to go on. ``plan`` None: plan from
    the scores the last evaluation left (the evaluator is the critic)."""
    plan_passes = 0
    if given_regions is not None:
        regions = [{**r, "indices": region_indices(layout, r, state.draft, text_codec).tolist()}
                   for r in given_regions]  # the trace says exactly what a caller's region covered
    else:
        scores, plan_passes = (state.scores, 0) if plan is None else plan(state.draft, round_)
        scores = _kept_out(scores, state.keep)
        regions = plan_regions(layout, state.draft, scores, config, text_codec, state.critic)
    if not regions:
        state.passes += plan_passes
        return "nothing flagged"
    selection = selection_of(layout, regions, state.draft, text_codec)
    # a region is a box or span around what was flagged (or a plan given for the first round, a caller's or the
    # cross-modal check's): what is kept stays out of it
    n_planned = int(sum(int(s.sum()) for s in selection.values()))
    selection = {m: chosen & ~_fitted(state.keep[m], len(chosen)) if m in state.keep else chosen
                 for m, chosen in selection.items()}
    n_masked = int(sum(int(s.sum()) for s in selection.values()))
    if not n_masked:
        state.passes += plan_passes
        return ALL_KEPT
    n_tokens = int(sum(len(s) for s in selection.values()))
    steps = regen_steps(config, sampler, n_masked, n_tokens)
    if config.budget is not None and state.passes + plan_passes + steps + state.judge_passes > config.budget:
        return "budget"
    candidate, result = regenerate(model, layout, state.draft, selection,
                                   replace(sampler, steps=steps, seed=derived_seed(config.seed, round_)),
                                   derived_seed(config.seed, round_))
    scores, after, passes = judge(candidate)
    spent = plan_passes + result.forward_passes + passes
    state.passes += spent
    intact = outside_unchanged(layout, state.draft, candidate, selection)
    kept = intact and after > state.score
    trace["rounds"].append({
        "round": round_ + 1, "regions": [_public(r) for r in regions], "tokens_remasked": n_masked,
        "tokens_kept": n_planned - n_masked,
        "tokens_changed": tokens_changed(layout, state.draft, candidate), "score_before": round(state.score, 6),
        "score_after": round(after, 6), "kept": kept, "outside_unchanged": intact, "regen_steps": result.steps,
        "forward_passes": spent})
    if not kept:
        return "no improvement" if intact else "region cut the content after it"
    state.confidence = _merged_confidence(layout, state, candidate, result)
    state.draft, state.scores, state.score = candidate, scores, after
    return None


def _public(region: Mapping) -> dict:
    """A region as JSON (token indices kept: they say exactly what was re-masked)."""
    return {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in region.items()}


def _merged_confidence(layout, state: _Loop, candidate: Draft, result) -> dict:
    """Regenerated tokens take the probability they were sampled with; the others keep theirs."""
    merged = {}
    for modality, ids in candidate.tokens(layout).items():
        new = result.confidence.get(modality, torch.full((len(ids),), math.nan)).float()
        old = state.confidence.get(modality, torch.full((len(ids),), math.nan))
        old = torch.cat([old[:len(ids)], torch.full((max(0, len(ids) - len(old)),), math.nan)])
        merged[modality] = torch.where(torch.isnan(new), old, new)
    return merged


__all__ = ["ALL_KEPT", "EVALUATORS", "NOT_KEPT", "RefineConfig", "plan_regions", "refine", "regenerate"]
