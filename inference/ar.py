"""Autoregressive decoding with a key/value cache: the sampler of the autoregressive twin.

The twin (``unimodal train --objective ar``) is the same backbone with a causal mask, trained to predict each
target token from the tokens before it. It is the baseline the diffusion model's speed is measured against,
so it gets the decoding a fair rival deserves: the conditions (and the first target's BEGIN marker) go
through the model once as a prefix, then every step feeds one token per sample over the cached keys and
values (:meth:`unimodal.backbone.dit.DiT.extend`), exactly one model call per generated token.

Requests, settings and results are those of :func:`unimodal.inference.sampler.generate` (``temperature``, ``top_k``,
``top_p`` and ``seed`` apply; steps, modes and tau do not: an autoregressive model takes one step per token).
A sample's sequence follows training: for each target in order, BEGIN, content, END. An image's content is
its fixed number of codes, then its END; text and audio end when the model writes END (or at the target's
slot cap). Tokens that are not the model's choice (markers) are fed without sampling, but still take a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from unimodal.inference.sampler import (PreparedRequest, Request, SampleResult, SamplerConfig, group_requests,
                                        prepare_requests)
from unimodal.inference.unmasking import draw_tokens
from unimodal.tokenizers_mm.layout import MARKERS, PAD, Layout, Packed, Segment, collate
from unimodal.core.errors import InputError


@torch.no_grad()
def generate_autoregressive(model, layout: Layout, requests: Request | Sequence[Request],
                            config: SamplerConfig | None = None) -> list[SampleResult]:
    """Decode the targets of each request left to right; one :class:`SampleResult` per request, in order."""
    if not getattr(model.config, "causal", False):
        raise InputError("generate_autoregressive needs a causal model (trained with --objective ar); a "
                         "masked-diffusion model samples with unimodal.inference.sampler.generate")
    if isinstance(config, SamplerConfig) and config.cfg is not None:
        raise InputError("the autoregressive twin decodes without classifier-free guidance; leave cfg unset")
    requests = [requests] if isinstance(requests, Request) else list(requests)
    config, prepared = prepare_requests(model, layout, requests, config, "generate_autoregressive")
    for item, request in zip(prepared, requests):
        if request.start_ids is not None:
            raise InputError(f"request {item.index}: an autoregressive model cannot regenerate parts of a given "
                             f"target (start_ids); only the diffusion model edits")
    results: list[SampleResult | None] = [None] * len(prepared)
    for group in group_requests(prepared, config.max_batch_size):
        for item, result in zip(group, _decode_group(model, layout, group, config)):
            results[item.index] = result
    return results


@dataclass(eq=False)
class _Row:
    """One sample's walk through its targets: which span, how far, what it has written."""

    spans: tuple
    span: int = 0
    written: int = 0  # content tokens of the current span so far
    ended: bool = False  # the current span's END has been fed
    done: bool = False
    content: dict = field(default_factory=dict)  # modality -> list of local ids
    confidence: dict = field(default_factory=dict)
    committed_at: dict = field(default_factory=dict)
    commits: list = field(default_factory=list)


def _decode_group(model, layout: Layout, group: list[PreparedRequest], config: SamplerConfig) -> list[SampleResult]:
    device = model.device
    target = group[0].target  # one target structure per group
    rows = [_Row(target.spans) for _ in group]
    generators = [torch.Generator(device=device).manual_seed(item.seed) for item in group]
    allowed = {span.modality: (layout.allowed_ids(span.modality) & (torch.arange(layout.vocab_size) != PAD)).to(device)
               for span in target.spans}
    logits, cache = _prefix(model, layout, group, target, device)
    while not all(row.done for row in rows):
        sampled, prob = draw_tokens(logits[:, None], torch.stack([allowed[_modality(r)] for r in rows])[:, None],
                                    generators, config)
        feed = [_advance(layout, row, int(sampled[i, 0]), float(prob[i, 0]), len(row.commits))
                for i, row in enumerate(rows)]
        if all(row.done for row in rows):
            break
        logits, cache = _feed(model, target, rows, feed, cache, device)
    return [_result(layout, item, row) for item, row in zip(group, rows)]


def _modality(row: _Row) -> str:
    return row.spans[min(row.span, len(row.spans) - 1)].modality


def _prefix(model, layout: Layout, group: list[PreparedRequest], target: Packed, device):
    """Conditions and the first target's BEGIN marker in one causal pass: the next-token logits (B, V) and the cache."""
    begin = Packed(target.ids[:1], target.segment_ids[:1], target.positions[:1], ())
    packed = []
    for item in group:
        if item.conditions:
            cond = layout.pack(item.conditions)
            packed.append(Packed(torch.cat([cond.ids, begin.ids]), torch.cat([cond.segment_ids, begin.segment_ids]),
                                 torch.cat([cond.positions, begin.positions]), ()))
        else:
            packed.append(begin)
    batch = collate(packed).to(device)
    # Right-padded rows: each row's next-token logits sit at its last real token (its BEGIN marker).
    out, cache = model.extend(batch.ids, batch.segment_ids, batch.positions, model.empty_condition(len(group), device),
                              batch.attention_mask)
    last = batch.attention_mask.long().sum(1) - 1  # (B,)
    return out.logits[torch.arange(len(group), device=device), last], cache


def _advance(layout: Layout, row: _Row, sampled: int, prob: float, step: int):
    """Decide the row's next token (sampled content or a forced marker); returns (id, span) to feed, or None."""
    if row.done:
        return None
    span = row.spans[row.span]
    modality, end = span.modality, MARKERS[span.modality][1]
    if row.ended:  # the END was fed: the next span's BEGIN
        row.span, row.written, row.ended = row.span + 1, 0, False
        row.commits.append(0)
        return MARKERS[row.spans[row.span].modality][0], 0
    capacity = span.end - span.start - 2  # content slots before the END
    chose_end = modality != "image" and sampled == end and row.written < capacity
    if row.written == capacity or chose_end:
        row.commits.append(int(chose_end))  # an END forced by the slot cap (or an image's END) is not sampled
        if row.span == len(row.spans) - 1:  # the last END needs no model call
            row.done = True
            return None
        row.ended = True
        return end, row.written + 1
    row.content.setdefault(modality, []).append(int(layout.to_local(modality, torch.tensor([sampled]))[0]))
    row.confidence.setdefault(modality, []).append(prob)
    row.committed_at.setdefault(modality, []).append(step)
    row.written += 1
    row.commits.append(1)
    if row.written == capacity and row.span == len(row.spans) - 1:  # its END is forced: no further call
        row.done = True
        return None
    return sampled, row.written


def _feed(model, target: Packed, rows: list[_Row], feed: list, cache, device):
    """One KV-cache step: each live row feeds its token at its place in its current span."""
    ids = torch.full((len(rows), 1), PAD, dtype=torch.long)
    segments = torch.zeros((len(rows), 1), dtype=torch.long)
    positions = torch.zeros((len(rows), 1, 2), dtype=torch.long)
    live = torch.zeros((len(rows), 1), dtype=torch.bool)
    for i, (row, token) in enumerate(zip(rows, feed)):
        if token is None:
            continue
        token_id, offset = token
        index = row.spans[row.span].start + offset  # the token's place in the packed target structure
        ids[i, 0], segments[i, 0], positions[i, 0], live[i, 0] = token_id, target.segment_ids[index], \
            target.positions[index], True
    out, cache = model.extend(ids.to(device), segments.to(device), positions.to(device), cache, live.to(device))
    return out.logits[:, 0], cache


def _result(layout: Layout, item: PreparedRequest, row: _Row) -> SampleResult:
    segments, tokens, confidence, committed_at = [], {}, {}, {}
    for span in item.target.spans:
        m = span.modality
        ids = torch.tensor(row.content.get(m, []), dtype=torch.long)
        tokens[m] = ids
        confidence[m] = torch.tensor(row.confidence.get(m, []), dtype=torch.float32)
        committed_at[m] = torch.tensor(row.committed_at.get(m, []), dtype=torch.long)
        slots = None if m == "image" else span.end - span.start - 1
        segments.append(Segment(m, ids, slots=slots))
    packed = layout.pack(segments)
    target = Packed(packed.ids, item.target.segment_ids, item.target.positions, item.target.spans)
    passes = len(row.commits)
    return SampleResult(tokens, confidence, committed_at, target, row.commits, passes, 0, 0, item.seed)


__all__ = ["generate_autoregressive"]
