"""The commit rule, one step at a time: on hand-made logits each mode commits exactly the slots it should.

No model: logits (1, L, V) are built so that every slot's argmax is token 9 and the probability of it is known,
so which slots are "most confident" is known in advance."""

import math

import pytest
import torch

from unimodal.core.errors import InputError
from unimodal.inference.unmasking import (NO_BLOCK, SAMPLER_SETTINGS, TOKEN_SETTINGS, SamplerConfig,
                                          UnmaskingScheduler, masked_after_step, slot_blocks)
from unimodal.tokenizers_mm.layout import MASK

V = 12  # vocabulary of the hand-made logits: ids 0..11; MASK (1) is never allowed
TOKEN = 9
ALLOWED = torch.ones(V, dtype=torch.bool).index_fill(0, torch.tensor([MASK]), False)  # (V,)


def logits_with_confidence(confidence: list[float]) -> torch.Tensor:
    """(1, L, V) logits whose argmax is TOKEN at every slot, with probability ``confidence[i]`` at slot i
    (the rest of the mass spread evenly over the other allowed ids)."""
    others = int(ALLOWED.sum()) - 1
    rows = []
    for p in confidence:
        row = torch.full((V,), math.log((1 - p) / others))
        row[TOKEN] = math.log(p)
        rows.append(row)
    return torch.stack(rows)[None]


def scheduler(slots: int, **settings) -> UnmaskingScheduler:
    rule = UnmaskingScheduler(SamplerConfig(temperature=0.0, **settings))
    rule.set_timesteps(slot_blocks([torch.arange(slots)], slots, rule.config), batch_size=1)
    return rule


def committed(out) -> list[int]:
    return out.committed[0].nonzero().flatten().tolist()


CONFIDENCE = [0.30, 0.95, 0.20, 0.60, 0.91, 0.10, 0.50, 0.40]  # slots 1, 4, 3, 6, 7, 0, 2, 5 by confidence


def test_confidence_mode_commits_the_most_confident_as_many_as_the_schedule_says():
    rule, ids = scheduler(8, steps=4, mode="confidence"), torch.full((1, 8), MASK)
    logits = logits_with_confidence(CONFIDENCE)
    expected = [[1], [1, 3, 4], [1, 3, 4, 6, 7], list(range(8))]  # 7, 5, 3, 0 stay masked (cosine, floored)
    assert [masked_after_step(8, s, 4, "cosine") for s in range(4)] == [7, 5, 3, 0]
    for step, slots in enumerate(expected):
        out = rule.step(logits, ids, ALLOWED, [None])
        ids = out.prev_sample
        assert (ids[0] != MASK).nonzero().flatten().tolist() == slots
        assert (ids[0][slots] == TOKEN).all() and out.step_index.tolist() == [step]
    assert committed(out) == [0, 2, 5]
    assert out.confidence[0, 1].item() == pytest.approx(0.95)


def test_confidence_mode_skips_steps_that_would_commit_nothing():
    rule, ids = scheduler(3, steps=10), torch.full((1, 3), MASK)  # 10 steps for 3 slots: never an empty step
    logits = logits_with_confidence([0.5, 0.7, 0.6])
    counts = []
    while (ids == MASK).any():
        out = rule.step(logits, ids, ALLOWED, [None])
        counts.append(len(committed(out)))
        ids = out.prev_sample
    assert counts == [1, 1, 1]


def test_threshold_mode_commits_every_slot_above_tau_at_least_one_and_all_at_the_last_step():
    rule, ids = scheduler(8, steps=3, mode="threshold", tau=0.55), torch.full((1, 8), MASK)
    out = rule.step(logits_with_confidence(CONFIDENCE), ids, ALLOWED, [None])
    assert committed(out) == [1, 3, 4]  # 0.95, 0.60, 0.91
    out = rule.step(logits_with_confidence([0.1] * 8), out.prev_sample, ALLOWED, [None])
    assert committed(out) == [0]  # nothing above tau: the most confident only (ties: leftmost)
    out = rule.step(logits_with_confidence([0.1] * 8), out.prev_sample, ALLOWED, [None])
    assert committed(out) == [2, 5, 6, 7]  # the last of 3 steps commits what is left


def test_semi_ar_opens_blocks_left_to_right_and_never_straddles_segments():
    config = SamplerConfig(temperature=0.0, mode="semi_ar", block_length=3, steps=2, block_mode="confidence")
    # Two segments of 4 and 2 slots at positions 1..4 and 6..7 (0 and 5 are markers): blocks [0 0 0 1] [2 2].
    blocks = slot_blocks([torch.arange(1, 5), torch.arange(6, 8)], 8, config)
    assert blocks.tolist() == [NO_BLOCK, 0, 0, 0, 1, NO_BLOCK, 2, 2]
    rule = UnmaskingScheduler(config)
    rule.set_timesteps(blocks, batch_size=1)
    ids = torch.tensor([[4, MASK, MASK, MASK, MASK, 6, MASK, MASK]])
    logits = logits_with_confidence([0.5, 0.2, 0.3, 0.4, 0.9, 0.5, 0.8, 0.7])
    opened = []
    while (ids == MASK).any():
        out = rule.step(logits, ids, ALLOWED, [None])
        opened.append(committed(out))
        ids = out.prev_sample
    # Block 0 (3 slots, cosine over 2 steps keeps 2 then 0): its most confident first, even though slot 4
    # (0.9, block 1) is more confident; then block 1 (one slot, one step), then block 2 (keeps 1, then 0).
    assert opened == [[3], [1, 2], [4], [6], [7]]


def test_choice_temperature_orders_by_log_probability_plus_annealed_gumbel_noise():
    ct, seed = 3.0, 5
    rule = scheduler(8, steps=4, choice_temperature=ct)
    out = rule.step(logits_with_confidence(CONFIDENCE), torch.full((1, 8), MASK), ALLOWED,
                    [torch.Generator().manual_seed(seed)])
    # The first step's anneal is 1: the noise is the row generator's first draw (temperature 0 draws none).
    uniform = torch.rand(8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    noise = -torch.log(-torch.log(uniform.clamp_min(torch.finfo(torch.float64).tiny))).float()
    score = torch.tensor(CONFIDENCE).log() + ct * noise
    assert committed(out) == [int(score.argmax())]
    again = scheduler(8, steps=4, choice_temperature=ct).step(
        logits_with_confidence(CONFIDENCE), torch.full((1, 8), MASK), ALLOWED, [torch.Generator().manual_seed(seed)])
    assert torch.equal(again.committed, out.committed)  # same seed, same slots


def test_step_takes_the_rows_it_is_given_and_keeps_each_rows_own_schedule():
    rule = UnmaskingScheduler(SamplerConfig(temperature=0.0, steps=4))
    rule.set_timesteps(slot_blocks([torch.arange(8)], 8, rule.config), batch_size=2)
    logits = logits_with_confidence(CONFIDENCE)
    first = rule.step(logits.expand(2, -1, -1), torch.full((2, 8), MASK), ALLOWED, [None, None])
    # Row 1 goes on alone for one step: it takes its second step (2 more slots); row 0 is still at step 1.
    alone = rule.step(logits, first.prev_sample[1:], ALLOWED, [None], rows=torch.tensor([1]))
    assert committed(alone) == [3, 4] and alone.step_index.tolist() == [1]
    row0 = rule.step(logits, first.prev_sample[:1], ALLOWED, [None], rows=torch.tensor([0]))
    assert committed(row0) == [3, 4] and row0.step_index.tolist() == [1]


def test_step_needs_set_timesteps_and_a_sampler_config():
    with pytest.raises(InputError, match="set_timesteps"):
        UnmaskingScheduler(SamplerConfig()).step(logits_with_confidence([0.5]), torch.full((1, 1), MASK), ALLOWED,
                                                 [None])
    with pytest.raises(InputError, match="SamplerConfig"):
        UnmaskingScheduler({"steps": 4})


def test_setting_names_are_the_config_fields():
    assert SAMPLER_SETTINGS == tuple(SamplerConfig.__dataclass_fields__)
    assert set(SAMPLER_SETTINGS) - set(TOKEN_SETTINGS) == {"use_cache", "max_batch_size"}
