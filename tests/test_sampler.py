"""Contracts of inference/sampler.py on a tiny random DiT: commit counts per step, allowed ids, END handling,
cache on = cache off, classifier-free guidance (batched, exact), batching and seeds, clear errors."""

import math

import pytest
import torch

from unimodal.backbone import DiT
from unimodal.inference.sampler import Request, SamplerConfig, generate, masked_after_step
from unimodal.tokenizers_mm.layout import BOT, EOT, MASK, PAD, Layout
from unimodal.core.errors import InputError

LAYOUT = Layout(text_vocab_size=300, image_codebook_size=32, audio_codebook_size=32, audio_frame_rate=15.6,
                max_text_len=16, max_audio_len=24)
N_CODES = 64  # an 8x8 image


@pytest.fixture(scope="module")
def model():
    """Random weights everywhere (at init adaLN-Zero makes every block the identity)."""
    torch.manual_seed(0)
    model = DiT.from_preset("tiny", LAYOUT.vocab_size).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model


def text(*ids):
    return ("text", torch.tensor(ids))


def image_codes(seed=0):
    return ("image", torch.randint(0, 32, (N_CODES,), generator=torch.Generator().manual_seed(seed)))


def audio(length=10, seed=0):
    return ("audio", torch.randint(0, 32, (length,), generator=torch.Generator().manual_seed(seed)))


def mixed_requests():
    """Different conditions (lengths, modalities) and two target structures."""
    return [Request([text(5, 6, 7)], ["image"]),
            Request([image_codes(1)], ["text", "audio"]),
            Request([text(9, 8, 7, 6, 5, 4, 3)], ["image"]),
            Request([text(1), audio(12)], ["image"]),
            Request([], ["text", "audio"])]


def same_tokens(a, b):
    return a.tokens.keys() == b.tokens.keys() and all(torch.equal(a.tokens[m], b.tokens[m]) for m in a.tokens)


class Recording:
    """Delegates to a DiT, recording each call's kind and batch size, and optionally adding a logit bias
    (V,) or (L_t, V) to the target logits."""

    def __init__(self, model, bias=None):
        self.model, self.bias, self.calls, self.mask_ratios = model, bias, [], []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def encode_condition(self, ids, *args, **kwargs):
        self.calls.append(("encode_condition", ids.shape[0]))
        return self.model.encode_condition(ids, *args, **kwargs)

    def forward_targets(self, ids, *args, **kwargs):
        self.calls.append(("forward_targets", ids.shape[0]))
        self.mask_ratios.append(args[0].tolist())
        out = self.model.forward_targets(ids, *args, **kwargs)
        if self.bias is not None:
            out.logits = out.logits + self.bias
        return out

    def __call__(self, ids, *args, **kwargs):
        self.calls.append(("forward", ids.shape[0]))
        return self.model(ids, *args, **kwargs)


# ---- how many slots a step commits --------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_confidence_mode_commits_follow_the_schedule(model, schedule):
    steps = 8
    kept = {"cosine": lambda f: math.cos(math.pi / 2 * f), "linear": lambda f: 1 - f}[schedule]
    masked_after = [math.floor(N_CODES * kept((s + 1) / steps)) for s in range(steps - 1)] + [0]
    expected = [before - after for before, after in zip([N_CODES] + masked_after, masked_after)]
    recording = Recording(model)
    config = SamplerConfig(steps=steps, schedule=schedule)
    result, = generate(recording, LAYOUT, Request([text(3, 4)], ["image"]), config)
    assert result.commits_per_step == expected and sum(expected) == N_CODES
    assert recording.mask_ratios == [[masked / N_CODES] for masked in [N_CODES] + masked_after[:-1]]  # the model's t
    assert result.forward_passes == result.steps == steps and result.guidance_passes == 0
    for step, count in enumerate(expected):  # the step that committed each code
        assert int((result.committed_at["image"] == step).sum()) == count
    assert [masked_after_step(N_CODES, s, steps, schedule) for s in range(steps)] == masked_after


def test_more_steps_than_slots_skips_empty_steps(model):
    result, = generate(model, LAYOUT, Request([], ["image"]), SamplerConfig(steps=200, schedule="linear"))
    assert result.commits_per_step == [1] * N_CODES


def test_threshold_mode_commits_everything_above_tau_and_at_least_one(model):
    tau = 0.1
    result, = generate(model, LAYOUT, Request([text(3, 4)], ["image"]),
                       SamplerConfig(mode="threshold", tau=tau, steps=64, temperature=0.0))
    confidence, step_of = result.confidence["image"], result.committed_at["image"]
    assert all(count >= 1 for count in result.commits_per_step) and sum(result.commits_per_step) == N_CODES
    assert max(result.commits_per_step) > 1 and result.steps < N_CODES  # the threshold does commit in bulk here
    for step, count in enumerate(result.commits_per_step):
        chosen = confidence[step_of == step]
        assert len(chosen) == count
        assert count == 1 or bool((chosen >= tau).all())


def test_threshold_mode_commits_all_at_the_step_cap(model):
    result, = generate(model, LAYOUT, Request([], ["image"]), SamplerConfig(mode="threshold", tau=1.0, steps=3))
    assert result.commits_per_step == [1, 1, N_CODES - 2]


# ---- what the targets hold ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, block_mode", [("confidence", "confidence"), ("threshold", "confidence"),
                                              ("semi_ar", "confidence"), ("semi_ar", "threshold")])
def test_every_slot_filled_with_an_allowed_id(model, mode, block_mode):
    request = Request([], ["audio", "image", LAYOUT.target_segment("text", 9)])
    config = SamplerConfig(mode=mode, block_mode=block_mode, steps=6, tau=0.5, block_length=5)
    result, = generate(model, LAYOUT, request, config)
    target = result.target
    assert not bool((target.ids == MASK).any())
    for span in target.spans:
        body = target.ids[list(span.slots)]
        assert bool(LAYOUT.allowed_ids(span.modality)[body].all())
        tokens = result.tokens[span.modality]
        assert bool(((tokens >= 0) & (tokens < LAYOUT.codebook_size(span.modality))).all())
        assert result.confidence[span.modality].shape == tokens.shape
        assert bool((result.confidence[span.modality] > 0).all())
    assert result.tokens["image"].shape == (N_CODES,)


def end_bias(slot_index: int, modality_span) -> torch.Tensor:
    """(L_t, V) logit bias: END certain at one text slot, END and PAD impossible at the others."""
    bias = torch.zeros(modality_span.end, LAYOUT.vocab_size)
    slots = list(modality_span.slots)
    bias[slots, EOT] = bias[slots, PAD] = -1e4
    bias[slots[slot_index], EOT] = 1e4
    return bias


def test_text_stops_at_end_and_pads_after_it(model):
    span = LAYOUT.pack([LAYOUT.target_segment("text")]).spans[0]
    biased = Recording(model, end_bias(5, span))
    result, = generate(biased, LAYOUT, Request([image_codes()], ["text"]), SamplerConfig(steps=4))
    body = result.target.ids[list(span.slots)]
    assert len(result.tokens["text"]) == 5 and int(body[5]) == EOT and bool((body[6:] == PAD).all())
    # The slots after END are filled with PAD at once, with no model call (a slot sampled in END's own step
    # and then overwritten counts as a commit).
    assert sum(result.commits_per_step) + result.structural_pads == len(body)
    assert result.structural_pads >= len(body) - 6 - (result.commits_per_step[0] - 1)
    assert int(result.committed_at["text"].max()) <= result.steps - 1


def test_semi_ar_stops_opening_blocks_after_end(model):
    span = LAYOUT.pack([LAYOUT.target_segment("text")]).spans[0]
    biased = Recording(model, end_bias(5, span))  # END in the second block of 4 slots
    config = SamplerConfig(mode="semi_ar", block_length=4, steps=4)
    result, = generate(biased, LAYOUT, Request([image_codes()], ["text"]), config)
    assert len(result.tokens["text"]) == 5
    # Block 0: 4 steps of one slot. Block 1: END first, slots 6-7 become PAD, then slot 4; later blocks: none.
    assert result.commits_per_step == [1, 1, 1, 1, 1, 1] and result.forward_passes == 6
    step_of = result.committed_at["text"].tolist()
    assert sorted(step_of[:4]) == [0, 1, 2, 3] and step_of[4] == 5  # left to right: block 0 first


# ---- condition cache and guidance ---------------------------------------------------------------------------


def test_cache_on_equals_cache_off(model):
    config = dict(steps=5, temperature=1.0, top_k=20, top_p=0.9, cfg={"text": 2.0, "image": 1.5}, seed=3)
    cached = generate(model, LAYOUT, mixed_requests(), SamplerConfig(**config))
    recording = Recording(model)
    full = generate(recording, LAYOUT, mixed_requests(), SamplerConfig(**config, use_cache=False))
    assert {kind for kind, _ in recording.calls} == {"forward"}
    for a, b in zip(cached, full):
        assert same_tokens(a, b) and a.commits_per_step == b.commits_per_step
        for m in a.confidence:
            torch.testing.assert_close(a.confidence[m], b.confidence[m], rtol=1e-4, atol=1e-5)


def test_cfg_scale_one_is_plain_conditional_sampling(model):
    request = Request([text(4, 5, 6), audio(8)], ["image"])
    plain, = generate(model, LAYOUT, request, SamplerConfig(steps=6, seed=1))
    for cfg in (1.0, {"text": 1.0}, {"text": 1.0, "audio": 1.0}):
        recording = Recording(model)
        guided, = generate(recording, LAYOUT, request, SamplerConfig(steps=6, seed=1, cfg=cfg))
        assert same_tokens(plain, guided) and guided.guidance_passes == 0
        assert [size for kind, size in recording.calls if kind == "forward_targets"] == [1] * 6


@pytest.mark.parametrize("cfg, rows", [(3.0, 2), ({"text": 3.0}, 2), ({"text": 3.0, "audio": 2.0}, 3)])
def test_cfg_batches_conditional_and_unconditional_rows_in_one_call(model, cfg, rows):
    recording = Recording(model)
    request = Request([text(4, 5, 6), audio(8)], ["image"])
    result, = generate(recording, LAYOUT, request, SamplerConfig(steps=5, cfg=cfg))
    assert recording.calls[0] == ("encode_condition", rows)  # every row's conditions, encoded once
    assert recording.calls[1:] == [("forward_targets", rows)] * 5
    assert result.forward_passes == 5 and result.guidance_passes == 5 * (rows - 1)


def test_cfg_logits_are_uncond_plus_scale_times_difference(model):
    """One step, argmax: the tokens are the argmax of uncond + s (cond - uncond), restricted to image codes."""
    scale, cond_ids = 4.0, torch.tensor([4, 5, 6])
    result, = generate(model, LAYOUT, Request([("text", cond_ids)], ["image"]),
                       SamplerConfig(steps=1, temperature=0.0, cfg={"text": scale}))
    condition, target = LAYOUT.pack([("text", cond_ids)]), LAYOUT.pack([LAYOUT.target_segment("image")])
    with torch.no_grad():
        cache = model.encode_condition(condition.ids[None], condition.segment_ids[None], condition.positions[None])
        args = (target.ids[None], torch.ones(1), target.segment_ids[None], target.positions[None])
        cond = model.forward_targets(*args, cache).logits  # (1, L_t, V)
        uncond = model.forward_targets(*args, model.empty_condition(1)).logits  # (1, L_t, V)
    guided = (uncond + scale * (cond - uncond))[0, list(target.spans[0].slots)]  # (64, V)
    codes = guided[:, LAYOUT.offset("image"):LAYOUT.offset("image") + 32].argmax(-1)
    assert torch.equal(result.tokens["image"], codes)
    plain, = generate(model, LAYOUT, Request([("text", cond_ids)], ["image"]), SamplerConfig(steps=1, temperature=0.0))
    assert not same_tokens(plain, result)


# ---- batching, seeds, filters -------------------------------------------------------------------------------


def test_batched_requests_equal_one_by_one(model):
    config = dict(steps=5, temperature=1.0, cfg=2.0, seed=11)
    batched = generate(model, LAYOUT, mixed_requests(), SamplerConfig(**config))
    for index, request in enumerate(mixed_requests()):
        alone, = generate(model, LAYOUT, request, SamplerConfig(**{**config, "seed": 11 + index}))
        assert same_tokens(batched[index], alone) and batched[index].seed == alone.seed == 11 + index
        assert batched[index].commits_per_step == alone.commits_per_step
    small_batches = generate(model, LAYOUT, mixed_requests(), SamplerConfig(**config, max_batch_size=1))
    assert all(same_tokens(a, b) for a, b in zip(batched, small_batches))


def test_same_seed_same_tokens_other_seed_other_tokens(model):
    request = Request([audio(6)], ["image", "text"])
    first, second = (generate(model, LAYOUT, request, SamplerConfig(steps=4, seed=5))[0] for _ in range(2))
    other, = generate(model, LAYOUT, request, SamplerConfig(steps=4, seed=6))
    assert same_tokens(first, second) and not same_tokens(first, other)
    fresh = [generate(model, LAYOUT, request, SamplerConfig(steps=4, seed=None))[0] for _ in range(2)]
    assert fresh[0].seed != fresh[1].seed
    replay, = generate(model, LAYOUT, request, SamplerConfig(steps=4, seed=fresh[0].seed))
    assert same_tokens(replay, fresh[0])


def test_top_k_one_and_tiny_top_p_are_argmax(model):
    request = Request([text(3, 4, 5)], ["image"])
    greedy, = generate(model, LAYOUT, request, SamplerConfig(steps=4, temperature=0.0))
    for filters in (dict(top_k=1), dict(top_p=1e-6)):
        filtered, = generate(model, LAYOUT, request, SamplerConfig(steps=4, temperature=2.0, **filters))
        assert same_tokens(greedy, filtered)


def test_start_ids_regenerates_only_the_masked_slots(model):
    first, = generate(model, LAYOUT, Request([text(3)], ["image"]), SamplerConfig(steps=4))
    start = first.target.ids.clone()
    region = torch.tensor(list(first.target.spans[0].slots))[:10]
    start[region] = MASK
    edited, = generate(model, LAYOUT, Request([text(3)], ["image"], start_ids=start), SamplerConfig(steps=4, seed=9))
    kept = torch.ones(N_CODES, dtype=torch.bool)
    kept[:10] = False
    assert torch.equal(edited.tokens["image"][kept], first.tokens["image"][kept])
    assert sum(edited.commits_per_step) == 10 and bool(edited.confidence["image"][kept].isnan().all())


def test_sampler_does_not_touch_the_model(model):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    generate(model, LAYOUT, mixed_requests()[:2], SamplerConfig(steps=2))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and not model.training


# ---- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("steps", 0), ("steps", -3), ("steps", 2.0), ("steps", True), ("tau", 0.0), ("tau", 1.5), ("tau", "high"),
    ("temperature", -0.1), ("top_k", -1), ("top_k", 1.0), ("top_p", 0.0), ("top_p", 1.1), ("seed", "7"),
    ("seed", 7.0), ("seed", -1), ("seed", False), ("mode", "greedy"), ("schedule", "exp"), ("block_mode", "x"),
    ("block_length", 0), ("cfg", -1.0), ("cfg", {"video": 2.0}), ("cfg", {"text": -2.0}), ("cfg", "3"),
    ("use_cache", 1), ("max_batch_size", 0), ("choice_temperature", -1.0)])
def test_bad_settings_name_the_field(field, value):
    with pytest.raises(InputError, match=field):
        SamplerConfig(**{field: value})


@pytest.mark.parametrize("requests, message", [
    ([], "at least one Request"),
    (Request([text(3)], []), "no target"),
    (Request([], ["video"]), "'video' is not in the layout"),
    (Request([text(3)], ["text"]), "both a condition and a target"),
    (Request([("image", None)], ["text"]), "no content"),
    (Request([], ["image"], start_ids=torch.zeros(3, dtype=torch.long)), "start_ids"),
    (Request([], ["image"], seed=1.5), "seed"),
    (Request([], ["text"], start_ids=torch.tensor([BOT] + [10**6] * 17)), "neither MASK nor allowed"),
    (Request([], ["text"], start_ids=torch.full((18,), MASK)), "markers"),
    (Request([], [LAYOUT.target_segment("text", 3), ("audio", torch.tensor([1]))]), "empty Segment"),
    (Request([text(400)], ["image"]), "text ids must lie in"),
    ("text", "must be a Request"),
])
def test_bad_requests_are_refused_clearly(model, requests, message):
    with pytest.raises(InputError, match=message):
        generate(model, LAYOUT, requests, SamplerConfig(steps=2))


def test_model_and_layout_must_share_the_vocabulary():
    other = DiT.from_preset("tiny", LAYOUT.vocab_size + 1)
    with pytest.raises(InputError, match="vocabulary"):
        generate(other, LAYOUT, Request([], ["image"]))


def test_choice_temperature_changes_the_order_not_the_schedule(model):
    """Gumbel noise on the commit order (MaskGIT): same commits per step, other slots first, reproducible."""
    request = Request([text(3, 4)], ["image"])
    greedy, = generate(model, LAYOUT, request, SamplerConfig(steps=8, seed=1))
    noisy, = generate(model, LAYOUT, request, SamplerConfig(steps=8, seed=1, choice_temperature=50.0))
    again, = generate(model, LAYOUT, request, SamplerConfig(steps=8, seed=1, choice_temperature=50.0))
    assert noisy.commits_per_step == greedy.commits_per_step
    assert not torch.equal(noisy.committed_at["image"], greedy.committed_at["image"])
    assert torch.equal(noisy.tokens["image"], again.tokens["image"])
    assert torch.equal(noisy.committed_at["image"], again.committed_at["image"])
