"""Self-critique and refine on a tiny untrained model: region <-> token mapping in every modality, critics
(the batched confidence score equals scoring one group at a time; the critic head's logit is read as "wrong"),
refine touching nothing outside its regions, a perfect critic leaving a right sample alone and finding the
wrong tokens of a corrupted one, a JSON trace that counts forward passes and respects the budget, and the
critique / refine / edit / bench refine commands."""

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from unimodal.inference.critique import (CONFIDENCE_THRESHOLDS, DEFAULT_THRESHOLD, audio_region, confidence_scores,
                                         flagged, flags_of, image_region, learned_scores, make_draft, random_scores,
                                         region_indices, regions_from_flags, sample_score, score_groups, text_offsets,
                                         thresholds_for)
from unimodal.inference.refine import RefineConfig
from unimodal.tokenizers_mm.layout import MASK, Layout
from unimodal.core.errors import InputError, SettingError

from conftest import assert_output_file, random_tiny_dit, write_tiny_model  # noqa: E402

FAST = dict(steps=4)
PROMPT = "a small red circle on the left"


@pytest.fixture(scope="module")
def pipe(tiny_model_dir):
    from unimodal import UniModal

    return UniModal.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def image_result(pipe):
    return pipe.generate(text=PROMPT, to="image", seed=0, **FAST)


def speech(seconds=0.8, rate=16_000):
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


# ---- regions <-> tokens, every modality -------------------------------------------------------------------------


LAYOUT = Layout(text_vocab_size=300, image_codebook_size=32, audio_codebook_size=32, audio_frame_rate=12.5,
                max_text_len=16, max_audio_len=40)


def test_image_boxes_round_trip_to_the_cells_they_came_from():
    cells = [9, 10, 17, 18, 25, 26]  # rows 1-3, cols 1-2 of the 8x8 grid
    region = image_region(LAYOUT, cells)
    assert region["box"] == [8, 8, 24, 32]  # pixels (x0, y0, x1, y1), 8-pixel codes
    assert LAYOUT.image_box_to_positions(region["box"]).tolist() == cells
    draft = make_draft(LAYOUT, [], {"image": torch.arange(64) % 32})
    flags = torch.zeros(64, dtype=torch.bool)
    flags[[0, 1, 9, 63]] = True  # one L-shaped component (its box adds cell 8) and one lone corner cell
    regions = regions_from_flags(LAYOUT, {"image": flags}, {"image": torch.linspace(0, 1, 64)}, draft)
    assert [r["box"] for r in regions] == [[0, 0, 16, 16], [56, 56, 64, 64]]
    assert [r["indices"] for r in regions] == [[0, 1, 8, 9], [63]]


@pytest.mark.parametrize("rate", [12.5, 15.625, 31.25, 50.0])
def test_audio_spans_round_trip_at_every_frame_rate(rate):
    layout = Layout(text_vocab_size=300, image_codebook_size=32, audio_codebook_size=32, audio_frame_rate=rate,
                    max_text_len=16, max_audio_len=120)
    for start in range(0, 100, 7):
        codes = list(range(start, start + 3))
        region = audio_region(layout, codes)
        assert layout.audio_span_to_positions(*region["seconds"], n_codes=120).tolist() == codes


def test_text_spans_map_to_the_tokens_as_generated(pipe):
    codec, layout = pipe.text_codec, pipe.layout
    words = codec.encode_one(" red circle").tolist()
    split = codec.encode_one(" r").tolist() + codec.encode_one("ed").tolist()  # a spelling BPE would not pick
    ids = codec.encode_one("a small").tolist() + split + words[len(codec.encode_one(" red").tolist()):]
    text = codec.decode_one(ids)
    assert text == "a small red circle"
    offsets = text_offsets(codec, ids)
    assert [text[a:b] for a, b in offsets] == [codec.decode_one([i]) for i in ids]
    draft = make_draft(layout, [], {"text": torch.tensor(ids)})
    start = text.index("red")
    red = [i for i, (a, b) in enumerate(offsets) if a < start + 3 and b > start]
    found = region_indices(layout, {"modality": "text", "chars": [start, start + 3]}, draft, codec)
    assert found.tolist() == red and len(red) >= 2  # "r" and "ed": the tokens of the draft, not a re-encoding
    flags = torch.zeros(len(ids), dtype=torch.bool)
    flags[red] = True
    region, = regions_from_flags(layout, {"text": flags}, {"text": torch.zeros(len(ids))}, draft, codec)
    assert region["text"] == "red" and region["indices"] == red


def test_bad_regions_say_what_a_region_is(pipe, image_result):
    draft = make_draft(pipe.layout, [], {"image": torch.tensor(image_result.token_ids["image"])})
    with pytest.raises(InputError, match="'modality': 'image', 'box'"):
        region_indices(pipe.layout, {"modality": "audio", "seconds": [0, 1]}, draft)
    with pytest.raises(InputError, match="'box': 4 numbers"):
        region_indices(pipe.layout, {"modality": "image", "box": [0, 0, 8]}, draft)


def test_a_region_with_its_indices_selects_exactly_those(pipe, image_result):
    """The critic's regions carry their token indices (a text token that decodes to no character of its own has
    an empty character span, so only its index says where it is); a selection takes them as they are."""
    from unimodal.inference.critique import selection_of

    draft = make_draft(pipe.layout, [], {"image": torch.tensor(image_result.token_ids["image"])})
    chosen = selection_of(pipe.layout, [{"modality": "image", "box": [0, 0, 64, 64], "indices": [3, 9]}], draft)
    assert chosen["image"].nonzero().flatten().tolist() == [3, 9]
    whole = selection_of(pipe.layout, [{"modality": "image", "box": [0, 0, 16, 8]}], draft)  # no indices: the box
    assert whole["image"].nonzero().flatten().tolist() == [0, 1]
    with pytest.raises(InputError, match="indices must lie in 0..63"):
        selection_of(pipe.layout, [{"modality": "image", "box": [0, 0, 8, 8], "indices": [64]}], draft)


# ---- critics ----------------------------------------------------------------------------------------------------


def test_flagged_takes_the_lowest_fraction_below_the_threshold():
    scores = torch.tensor([0.9, 0.1, 0.3, 0.2, 0.8, 0.05, 0.7, 0.95])
    assert flagged(scores, 0.25, 0.5).nonzero().flatten().tolist() == [1, 5]
    assert flagged(scores, 1.0, 0.25).nonzero().flatten().tolist() == [1, 3, 5]
    assert not flagged(torch.ones(8), 0.5, 0.5).any()  # a confident critic flags nothing


def test_each_critic_flags_below_its_own_threshold_unless_one_is_given():
    assert thresholds_for("confidence") == CONFIDENCE_THRESHOLDS
    assert all(0 < v < DEFAULT_THRESHOLD for v in CONFIDENCE_THRESHOLDS.values())
    for critic in ("learned", "random", lambda tokens: tokens):
        assert set(thresholds_for(critic).values()) == {DEFAULT_THRESHOLD}
    assert set(thresholds_for("confidence", 0.3).values()) == {0.3}
    for bad in (0, 1.5, True, "0.5"):
        with pytest.raises(InputError, match="threshold must be a number in"):
            thresholds_for("confidence", bad)
    # the confidence score's own default: a picture's code at 0.02 is left alone, a caption token at 0.02 is not
    scores = {"image": torch.tensor([0.02, 0.005, 0.9, 0.9]), "text": torch.tensor([0.02, 0.9, 0.9, 0.9])}
    flags = flags_of(scores, "confidence", fraction=1.0)
    assert flags["image"].tolist() == [False, True, False, False] and flags["text"].tolist() == [True, False, False, False]
    assert flags_of(scores, "random", fraction=1.0)["image"].tolist() == [True, True, False, False]


def test_score_groups_never_mask_an_image_token_with_a_4_neighbour():
    group = score_groups(LAYOUT, "image", 64, 4).reshape(8, 8)
    assert (group[:, 1:] != group[:, :-1]).all() and (group[1:] != group[:-1]).all()
    assert score_groups(LAYOUT, "text", 6, 4).tolist() == [0, 1, 2, 3, 0, 1]


def test_confidence_equals_scoring_each_group_by_itself_without_the_cache():
    """The batched, cached, guided score is the probability of each token in a plain forward of its group."""
    model = random_tiny_dit(LAYOUT.vocab_size)
    draft = make_draft(LAYOUT, [("text", torch.tensor([5, 9, 2]))],
                       {"image": torch.arange(64) % 32, "audio": torch.tensor([3, 4, 5, 6, 7])})
    scores, passes = confidence_scores(model, LAYOUT, draft, groups=3, cfg=2.0)
    assert passes == 3
    cond = LAYOUT.pack([("text", torch.tensor([5, 9, 2]))])
    target = draft.target
    allowed = {s.modality: LAYOUT.allowed_ids(s.modality) for s in target.spans}
    positions = draft.content_positions(LAYOUT)
    for modality, where in positions.items():
        group = score_groups(LAYOUT, modality, len(where), 3)
        for k in range(3):
            masked = torch.cat([where[group == k] for m, where in positions.items()
                                for group in [score_groups(LAYOUT, m, len(where), 3)]])
            ids = target.ids.clone()
            ids[masked] = MASK
            t = torch.tensor([len(masked) / sum(len(s.slots) for s in target.spans)])

            def logits(with_condition):
                c = cond if with_condition else None
                full_ids = torch.cat([c.ids, ids]) if c else ids
                seg = torch.cat([c.segment_ids, target.segment_ids]) if c else target.segment_ids
                pos = torch.cat([c.positions, target.positions]) if c else target.positions
                is_target = torch.cat([torch.zeros(len(c.ids), dtype=torch.bool) if c else torch.zeros(0, dtype=torch.bool),
                                       torch.ones(len(ids), dtype=torch.bool)])
                with torch.no_grad():
                    out = model(full_ids[None], t, seg[None], pos[None], is_target[None])
                return out.logits[0, -len(ids):]

            cond_logits, uncond_logits = logits(True), logits(False)
            guided = (cond_logits + (cond_logits - uncond_logits)).masked_fill(~allowed[modality], -math.inf)
            expected = guided.softmax(-1).gather(-1, target.ids[:, None]).squeeze(-1)
            mine = where[group == k]
            torch.testing.assert_close(scores[modality][group == k], expected[mine], rtol=1e-4, atol=1e-5)


def test_learned_critic_reads_the_head_as_the_logit_of_wrong():
    model = random_tiny_dit(LAYOUT.vocab_size)
    with torch.no_grad():
        model.critic_head[-1].weight.zero_()
        model.critic_head[-1].bias.fill_(2.0)  # "wrong" everywhere, with probability sigmoid(2)
    draft = make_draft(LAYOUT, [], {"image": torch.arange(64) % 32})
    scores, passes = learned_scores(model, LAYOUT, draft)
    assert passes == 1
    torch.testing.assert_close(scores["image"], torch.full((64,), 1 / (1 + math.e ** 2)))


class _FakeAudioModel:
    """Codes decode to a constant log-mel per code (4 frames each); codes 0 and 1 decode alike."""

    device, config = torch.device("cpu"), type("Config", (), {"mel_std": 1.0})()
    table = torch.tensor([0.0, 0.0, 3.0, -3.0])

    def decode_indices(self, ids):
        return self.table[ids].repeat_interleave(4, dim=1)[:, None, :].expand(-1, 2, -1)


class _FakeImageModel:
    """Codes decode to a flat 8x8 patch per cell (grey level per code); codes 0 and 1 decode alike."""

    device = torch.device("cpu")
    table = torch.tensor([0.5, 0.5, -0.5, 1.0])

    def decode_indices(self, ids, grid):
        cells = self.table[ids].reshape(len(ids), 1, *grid)
        return cells.repeat_interleave(8, dim=2).repeat_interleave(8, dim=3).expand(-1, 3, -1, -1)


def test_content_critic_counts_the_mass_of_codes_that_decode_alike():
    """The committed code 0 has probability 0.1, but code 1 (0.6) decodes like it there: the content is right
    with probability 0.7; codes 2 and 3 decode otherwise. Captions are scored as by confidence."""
    from unimodal.inference.content import ContentCritic

    critic = ContentCritic(_FakeImageModel(), _FakeAudioModel(), top_k=3)
    probs = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0.0, 0.1, 0.8, 0.1]])
    own = torch.tensor([0, 2, 2])
    for modality in ("audio", "image"):
        torch.testing.assert_close(critic.near_mass(modality, own, probs), torch.tensor([0.7, 0.2, 0.8]))
    torch.testing.assert_close(critic.near_mass("text", own, probs), torch.tensor([0.1, 0.2, 0.8]))
    assert ContentCritic().near_mass("image", own, probs).tolist() == pytest.approx([0.1, 0.2, 0.8])
    assert critic.image_alike(4).tolist()[0] == [True, True, False, False]
    rare = ContentCritic(audio_model=_FakeAudioModel(), min_p=0.7)  # code 1 (0.6) is below min_p: not decoded
    torch.testing.assert_close(rare.near_mass("audio", own, probs), torch.tensor([0.1, 0.2, 0.8]))
    one = ContentCritic(audio_model=_FakeAudioModel())  # a clip of one code
    torch.testing.assert_close(one.near_mass("audio", own[:1], probs[:1]), torch.tensor([0.7]))
    # speech codes count as alike only within AUDIO_ALIKE (0.3 mel standard deviations, stricter than a wrong
    # code's 0.5): code 1 decoding 0.4 away is counted by a critic whose ear is set at the label's threshold only
    from unimodal.core.wrong import AUDIO_ALIKE, AUDIO_THRESHOLD

    class Near(_FakeAudioModel):
        table = torch.tensor([0.0, 0.4, 3.0, -3.0])

    strict, label = ContentCritic(audio_model=Near(), top_k=3), ContentCritic(audio_model=Near(), top_k=3,
                                                                               audio_threshold=AUDIO_THRESHOLD)
    assert strict.thresholds["audio"] == AUDIO_ALIKE == 0.3 and AUDIO_THRESHOLD == 0.5
    torch.testing.assert_close(strict.near_mass("audio", own, probs), torch.tensor([0.1, 0.2, 0.8]))
    torch.testing.assert_close(label.near_mass("audio", own, probs), torch.tensor([0.7, 0.2, 0.8]))
    with pytest.raises(InputError, match="top_k an int >= 1"):
        ContentCritic(top_k=0)


def test_content_scores_bound_confidence_and_refine_names_the_content_critic(pipe, image_result):
    """Per token the content score is at least the confidence score (the committed code is one of the codes that
    decode like it) and at most 1, from the same model calls; through the pipeline the name is enough."""
    from unimodal.inference.critique import CONTENT_THRESHOLDS, confidence_scores, content_scores
    from unimodal.refine import draft_of, scoring_critic

    draft = draft_of(pipe, image_result, {"text": PROMPT})
    confidence, _ = confidence_scores(pipe.backbone, pipe.layout, draft)
    content, passes = content_scores(pipe.backbone, pipe.layout, draft, scoring_critic(pipe, "content"))
    assert passes == 4 and bool((content["image"] >= confidence["image"] - 1e-6).all())
    assert bool((content["image"] <= 1).all()) and set(content) == {"image"}
    report = pipe.critique(image_result, text=PROMPT, critic="content")
    assert report.critic == "content" and report.thresholds == {"image": CONTENT_THRESHOLDS["image"]}
    _, trace = pipe.refine(image_result, text=PROMPT, critic="content", rounds=1, **FAST)
    assert trace["critic"] == trace["evaluator"] == "content"
    from unimodal.inference.critique import make_critic

    with pytest.raises(InputError, match="pass a ContentCritic"):  # the inference layer alone cannot decode
        make_critic("content", pipe.backbone, pipe.layout)


def test_content_and_learned_together_multiply_for_codes_and_need_a_trained_head(pipe, image_result, monkeypatch):
    """critic="content+learned": a picture or speech code's content score times the head's (right only when
    both say so), one model call more than content; refused by name on a model whose head was never trained."""
    import unimodal.refine as refining
    from unimodal.inference.critique import CONTENT_THRESHOLDS, content_scores, learned_scores
    from unimodal.refine import draft_of, scoring_critic

    with pytest.raises(SettingError, match="critic='content\\+learned' reads the backbone's critic head"):
        pipe.critique(image_result, text=PROMPT, critic="content+learned")
    monkeypatch.setattr(refining, "require_trained_critic", lambda *a: None)  # the tiny head: untrained, but scores
    draft = draft_of(pipe, image_result, {"text": PROMPT})
    cfg = refining._scoring_cfg(pipe, draft, None)  # the guidance critique scores with
    content, _ = content_scores(pipe.backbone, pipe.layout, draft, scoring_critic(pipe, "content"), cfg=cfg)
    head, _ = learned_scores(pipe.backbone, pipe.layout, draft, cfg)
    report = pipe.critique(image_result, text=PROMPT, critic="content+learned")
    assert report.critic == "content+learned" and report.forward_passes == 5
    assert np.allclose(report.scores["image"], (content["image"] * head["image"]).numpy(), atol=1e-6)
    assert report.thresholds == {"image": CONTENT_THRESHOLDS["image"]}
    assert scoring_critic(pipe, "content") is not scoring_critic(pipe, "content+learned")  # one of each, kept
    assert scoring_critic(pipe, "content+learned") is scoring_critic(pipe, "content+learned")


def test_random_critic_is_seeded_and_free():
    draft = make_draft(LAYOUT, [], {"image": torch.arange(64) % 32})
    a, passes = random_scores(LAYOUT, draft, seed=3)
    assert passes == 0 and torch.equal(a["image"], random_scores(LAYOUT, draft, seed=3)[0]["image"])
    assert sample_score({"image": torch.ones(4)}) == 0.0


# ---- refine -----------------------------------------------------------------------------------------------------


def _changed(before, after):
    return {m: [i for i, (a, b) in enumerate(zip(before[m], after[m])) if a != b] for m in before}


def test_a_draft_reads_its_inputs_as_conditions(pipe, image_result):
    """The critique scores a draft in the context it was generated from: the prompt's tokens are the draft's
    text condition (a draft without them would be scored as if generated from nothing)."""
    from unimodal.refine import draft_of

    draft = draft_of(pipe, image_result, {"text": PROMPT})
    assert [m for m, _ in draft.conditions] == ["text"]
    assert torch.equal(torch.as_tensor(draft.conditions[0][1]), torch.as_tensor(pipe.text_codec.encode([PROMPT])[0]))


def test_a_planned_result_is_read_with_the_words_it_was_generated_with(pipe):
    """plan="text": a picture drawn from speech was generated with the speech and the words the model heard in
    it; its draft has both as conditions (the words' own ids), unless the caller gives a text; refine runs on it."""
    from unimodal.refine import draft_of

    clip = speech()
    heard = pipe.generate(audio=clip, to="image", seed=0, plan="text", **FAST)
    assert heard.settings["text_stage"]["conditioned"]  # the model heard words (the seed is fixed)
    words = heard.settings["text_stage"]["token_ids"]
    draft = draft_of(pipe, heard, {"audio": clip})
    conditions = dict(draft.conditions)
    assert list(conditions) == ["text", "audio"] and words and conditions["text"].tolist() == words
    assert [m for m, _ in draft_of(pipe, heard, {"audio": clip, "text": PROMPT}).conditions] == ["text", "audio"]
    unplanned = pipe.generate(audio=clip, to="image", seed=0, plan="none", **FAST)
    assert [m for m, _ in draft_of(pipe, unplanned, {"audio": clip}).conditions] == ["audio"]
    fixed, trace = pipe.refine(heard, audio=clip, rounds=1, critic="random", fraction=0.3, **FAST)
    assert fixed.modalities == ("image",) and trace["rounds"]


@pytest.mark.parametrize("critic", ["confidence", "random"])
def test_refine_never_changes_tokens_outside_the_chosen_regions(pipe, image_result, critic):
    fixed, trace = pipe.refine(image_result, text=PROMPT, rounds=3, critic=critic, fraction=0.3, threshold=1.0,
                               **FAST)
    chosen = {i for r in trace["rounds"] if r["kept"] for region in r["regions"] for i in region["indices"]}
    assert trace["rounds"], "the untrained model's scores are low: something is flagged"
    assert set(_changed(image_result.token_ids, fixed.token_ids)["image"]) <= chosen
    assert len(chosen) < 64
    assert fixed.image.size == (64, 64)


def test_refine_of_text_and_audio_keeps_everything_outside_its_regions(pipe):
    caption = pipe.generate(image=np.full((64, 64, 3), 90, np.uint8), to="text", seed=1, max_text_tokens=10, **FAST)
    fixed, trace = pipe.refine(caption, image=np.full((64, 64, 3), 90, np.uint8), rounds=2, critic="random",
                               fraction=0.5, threshold=1.0, **FAST)
    old, new = caption.token_ids["text"], fixed.token_ids["text"]
    chosen = {i for r in trace["rounds"] if r["kept"] for region in r["regions"] for i in region["indices"]}
    kept = [i for i in range(len(old)) if i not in chosen]
    assert all(i < len(new) and new[i] == old[i] for i in kept)
    clip = pipe.generate(text=PROMPT, to="audio", seed=2, max_audio_seconds=0.8, **FAST)
    fixed, trace = pipe.refine(clip, text=PROMPT, rounds=2, critic="confidence", fraction=0.3, threshold=1.0, **FAST)
    chosen = {i for r in trace["rounds"] if r["kept"] for region in r["regions"] for i in region["indices"]}
    old, new = clip.token_ids["audio"], fixed.token_ids["audio"]
    assert all(i < len(new) and new[i] == old[i] for i in range(len(old)) if i not in chosen)
    assert all("seconds" in region for r in trace["rounds"] for region in r["regions"])


def test_a_caption_read_from_an_input_is_refined_by_its_own_defaults(pipe, image_result, monkeypatch):
    """A caption the model wrote from a picture: flagged below 0.9, redrawn at temperature 1.0, kept by agreement
    (one model call reading the picture back), retried until ``rounds`` rounds in a row were not kept; every one
    of those only where the caller gives none. Other outputs, and captions from elsewhere, keep the critic's own
    defaults."""
    import unimodal.inference.refine as loop
    from unimodal.refine import CAPTION_REFINE, as_result

    grey = np.full((64, 64, 3), 90, np.uint8)
    caption = pipe.generate(image=grey, to="text", seed=1, max_text_tokens=10, **FAST)
    calls = []
    real = loop.agreement_score
    monkeypatch.setattr(loop, "agreement_score", lambda *a, **k: calls.append(1) or real(*a, **k))
    fixed, trace = pipe.refine(caption, image=grey, rounds=2, **FAST)
    assert trace["evaluator"] == "agreement" and calls  # the picture read back from each candidate caption
    assert trace["config"]["patience"] == 2 and trace["config"]["threshold"] == CAPTION_REFINE["threshold"] == 0.9
    assert trace["thresholds"] == {"text": 0.9} and trace["regen_temperature"] == 1.0
    assert pipe.critique(caption, image=grey).thresholds == {"text": 0.9}  # flagged where refine would redo it
    chosen = {i for r in trace["rounds"] if r["kept"] for region in r["regions"] for i in region["indices"]}
    old, new = caption.token_ids["text"], fixed.token_ids["text"]
    assert all(i < len(new) and new[i] == old[i] for i in range(len(old)) if i not in chosen)
    _, given = pipe.refine(caption, image=grey, rounds=2, evaluator="critic", patience=1, threshold=0.3,
                           temperature=0.0, **FAST)
    assert given["evaluator"] == "confidence" and given["config"]["patience"] == 1
    assert given["thresholds"] == {"text": 0.3} and given["regen_temperature"] == 0.0
    with pytest.raises(InputError, match="patience must be an int >= 1"):  # refused, not taken as the default
        pipe.refine(caption, image=grey, patience=0, **FAST)
    _, drawn = pipe.refine(image_result, text=PROMPT, rounds=1, **FAST)  # a picture: the critic's own defaults
    assert drawn["evaluator"] == "confidence" and drawn["config"]["patience"] == 1
    assert drawn["thresholds"] == {"image": CONFIDENCE_THRESHOLDS["image"]}
    assert drawn["regen_temperature"] == pipe.generate(text=PROMPT, to="image", seed=0, **FAST).settings["temperature"]
    given_caption = as_result(pipe, caption.text or "a", "text")  # a caption from elsewhere: the critic's defaults
    _, elsewhere = pipe.refine(given_caption, image=grey, rounds=1, **FAST)
    assert elsewhere["evaluator"] == "confidence" and elsewhere["thresholds"] == {"text": CONFIDENCE_THRESHOLDS["text"]}
    assert elsewhere["regen_temperature"] == 0.0 and elsewhere["caption_recipe"] is False
    _, declared = pipe.refine(given_caption, image=grey, rounds=1, model_caption=True, **FAST)  # generate wrote it
    assert declared["caption_recipe"] is True and declared["evaluator"] == "agreement"
    assert declared["thresholds"] == {"text": 0.9} and declared["regen_temperature"] == 1.0
    assert pipe.critique(given_caption, image=grey, model_caption=True).thresholds == {"text": 0.9}
    _, denied = pipe.refine(caption, image=grey, rounds=1, model_caption=False, **FAST)  # the caller knows better
    assert denied["caption_recipe"] is False and denied["evaluator"] == "confidence"
    with pytest.raises(InputError, match="model_caption is for a caption read against"):
        pipe.refine(image_result, text=PROMPT, model_caption=True, **FAST)
    with pytest.raises(SettingError, match="model_caption must be True, False or None"):
        pipe.refine(given_caption, image=grey, model_caption="yes", **FAST)


def test_a_perfect_critic_leaves_a_right_sample_alone_and_finds_a_corrupted_ones_errors(pipe, image_result):
    truth = torch.tensor(image_result.token_ids["image"])

    def perfect(tokens):
        return {"image": (tokens["image"] == truth).float()}

    same, trace = pipe.refine(image_result, text=PROMPT, critic=perfect, **FAST)
    assert same.token_ids == image_result.token_ids
    assert trace["rounds"] == [] and trace["stopped"] == "nothing flagged"
    corrupt = truth.clone()
    corrupt[[0, 1, 8, 9, 45]] = (corrupt[[0, 1, 8, 9, 45]] + 1) % 32
    report = pipe.critique(_result(pipe, corrupt), text=PROMPT, critic=perfect)
    assert [r["indices"] for r in report.regions] == [[0, 1, 8, 9], [45]]
    assert report.critic == "perfect" == trace["critic"]  # a callable critic is named as the trace names it
    assert [r["box"] for r in report.regions] == [[0, 0, 16, 16], [40, 40, 48, 48]]
    repaired, trace = pipe.refine(_result(pipe, corrupt), text=PROMPT, critic=perfect, rounds=1, **FAST)
    assert set(_changed({"image": corrupt.tolist()}, repaired.token_ids)["image"]) <= {0, 1, 8, 9, 45}


def test_refine_never_re_masks_what_it_is_told_to_keep(pipe, image_result):
    """``keep``: regions no critic's plan re-masks (what a repair made right): a critic that doubts every code
    redraws all but the kept box; the kept codes are exactly as they were."""
    truth = torch.tensor(image_result.token_ids["image"])

    def doubts_all(tokens):
        return {"image": torch.zeros(len(tokens["image"]))}

    box = {"modality": "image", "box": [0, 0, 16, 16]}  # codes 0, 1, 8, 9 of the tiny 8x8 grid
    kept, trace = pipe.refine(image_result, text=PROMPT, critic=doubts_all, rounds=1, fraction=1.0, keep=[box],
                              **FAST)
    assert trace["rounds"] and trace["rounds"][0]["tokens_remasked"] == len(truth) - 4
    after = torch.tensor(kept.token_ids["image"])
    assert after[[0, 1, 8, 9]].tolist() == truth[[0, 1, 8, 9]].tolist()
    _, free = pipe.refine(image_result, text=PROMPT, critic=doubts_all, rounds=1, fraction=1.0, **FAST)
    assert free["rounds"][0]["tokens_remasked"] == len(truth)  # without keep: every code
    everything = {"modality": "image", "box": [0, 0, 64, 64]}
    same, none = pipe.refine(image_result, text=PROMPT, critic=doubts_all, rounds=1, fraction=1.0, keep=[everything],
                             **FAST)
    assert none["stopped"] == "nothing flagged" and same.token_ids == image_result.token_ids
    given, plan = pipe.refine(image_result, text=PROMPT, rounds=1, regions=[everything], keep=[box], **FAST)
    assert plan["rounds"][0]["tokens_remasked"] == len(truth) - 4 and plan["keep"] == [box]  # a given plan too
    assert torch.tensor(given.token_ids["image"])[[0, 1, 8, 9]].tolist() == truth[[0, 1, 8, 9]].tolist()
    assert plan["rounds"][0]["tokens_kept"] == 4 and trace["rounds"][0]["tokens_kept"] == 4
    assert free["rounds"][0]["tokens_kept"] == 0
    inside, told = pipe.refine(image_result, text=PROMPT, rounds=2, regions=[box], keep=[box], **FAST)
    assert told["stopped"] == "everything flagged is kept" and told["rounds"] == []  # said, not "nothing flagged"
    assert inside.token_ids == image_result.token_ids
    with pytest.raises(InputError, match="keep must be a list of regions"):
        pipe.refine(image_result, text=PROMPT, rounds=1, keep=box, **FAST)


def _result(pipe, image_ids):
    from unimodal.refine import as_result

    picture = pipe.image_codec.decode(image_ids[None])[0]
    result = as_result(pipe, picture, "image")
    result.token_ids = {"image": image_ids.tolist()}  # exactly these codes, not a re-encoding of the picture
    return result


def test_the_trace_is_json_and_counts_forward_passes(pipe, image_result):
    _, trace = pipe.refine(image_result, text=PROMPT, rounds=2, critic="confidence", groups=4, threshold=1.0, **FAST)
    assert json.loads(json.dumps(trace)) == trace
    assert trace["scoring_passes_initial"] == 4
    assert set(trace["thresholds"].values()) == {1.0}  # the threshold given, for every modality
    for r in trace["rounds"]:
        assert r["forward_passes"] == r["regen_steps"] + 4  # regeneration, then the evaluation's 4 groups
        assert {"regions", "score_before", "score_after", "tokens_changed", "kept"} <= set(r)
    assert trace["forward_passes"] == 4 + sum(r["forward_passes"] for r in trace["rounds"])


def test_the_budget_is_never_passed(pipe, image_result):
    _, trace = pipe.refine(image_result, text=PROMPT, rounds=5, budget=12, critic="confidence", threshold=1.0,
                           regen_steps=3, **FAST)
    assert trace["forward_passes"] <= 12 and trace["stopped"] in ("budget", "no improvement", "nothing flagged")
    with pytest.raises(InputError, match="budget"):
        RefineConfig(budget=0)


def test_a_callers_plan_and_an_edit_touch_only_their_region(pipe, image_result):
    region = {"modality": "image", "box": [0, 0, 16, 16]}
    _, trace = pipe.refine(image_result, text=PROMPT, regions=[region], rounds=1, critic="confidence", **FAST)
    assert trace["rounds"][0]["tokens_remasked"] == 4 and trace["rounds"][0]["regions"][0]["indices"] == [0, 1, 8, 9]
    edited = pipe.edit(image_result, region, text="a blue square", **FAST)
    assert set(_changed(image_result.token_ids, edited.token_ids)["image"]) <= {0, 1, 8, 9}
    assert edited.settings["edit"]["tokens_remasked"] == {"image": 4}


def test_agreement_reads_the_request_back_from_the_draft(pipe, image_result):
    """The agreement score is the request's mean log-probability when the model reads it from the draft (one
    call): the same as scoring the reversed draft (picture as condition, caption as target) directly."""
    from unimodal.inference.critique import agreement_score, confidence_scores, make_draft
    from unimodal.refine import draft_of

    draft = draft_of(pipe, image_result, {"text": PROMPT})
    score, calls = agreement_score(pipe.backbone, pipe.layout, draft)
    reading = make_draft(pipe.layout, [("image", torch.tensor(image_result.token_ids["image"]))],
                         {"text": pipe.text_codec.encode_one(PROMPT)})
    probs, _ = confidence_scores(pipe.backbone, pipe.layout, reading, 1)
    assert calls == 1 and score == pytest.approx(float(probs["text"].clamp_min(1e-6).log().mean()), abs=1e-5)
    assert score < 0
    unconditioned = make_draft(pipe.layout, [], {"image": torch.tensor(image_result.token_ids["image"])})
    with pytest.raises(InputError, match="no input"):
        agreement_score(pipe.backbone, pipe.layout, unconditioned)
    # word by word: each request token re-masked alone, the rest of the request in view (a pass per token)
    each, each_calls = agreement_score(pipe.backbone, pipe.layout, draft, reading="each")
    words = len(reading.content_positions(pipe.layout)["text"])
    alone, _ = confidence_scores(pipe.backbone, pipe.layout, reading, words)
    assert each_calls == words > 1 and each == pytest.approx(float(alone["text"].clamp_min(1e-6).log().mean()), abs=1e-5)
    with pytest.raises(InputError, match="reading must be one of"):
        agreement_score(pipe.backbone, pipe.layout, draft, reading="words")
    # a request of words and a picture, read word by word: the picture stays in view beside the draft (speech here)
    codes = torch.randint(0, pipe.layout.codebook_size("audio"), (6,), generator=torch.Generator().manual_seed(0))
    words_ids = pipe.text_codec.encode_one(PROMPT)
    picture = torch.tensor(image_result.token_ids["image"])
    both = make_draft(pipe.layout, [("text", words_ids), ("image", picture)], {"audio": codes})
    mixed, mixed_calls = agreement_score(pipe.backbone, pipe.layout, both, reading="each")
    words_alone = make_draft(pipe.layout, [("image", picture), ("audio", codes)], {"text": words_ids})
    expected, _ = confidence_scores(pipe.backbone, pipe.layout, words_alone, len(words_ids))
    assert mixed_calls == len(words_ids) and set(expected) == {"text"}
    assert mixed == pytest.approx(float(expected["text"].clamp_min(1e-6).log().mean()), abs=1e-5)


def test_refine_kept_by_agreement_plans_with_the_critic_and_counts_its_passes(pipe, image_result):
    fixed, trace = pipe.refine(image_result, text=PROMPT, rounds=2, critic="confidence", groups=4, threshold=1.0,
                               evaluator="agreement", **FAST)
    assert trace["evaluator"] == "agreement" and trace["scoring_passes_initial"] == 1
    for r in trace["rounds"]:
        assert r["forward_passes"] == 4 + r["regen_steps"] + 1  # plan (4 groups), regenerate, read back (1)
        assert r["kept"] == (r["score_after"] > r["score_before"])
    chosen = {i for r in trace["rounds"] if r["kept"] for region in r["regions"] for i in region["indices"]}
    assert set(_changed(image_result.token_ids, fixed.token_ids)["image"]) <= chosen
    words = len(pipe.text_codec.encode_one(PROMPT))
    _, each = pipe.refine(image_result, text=PROMPT, rounds=1, critic="confidence", groups=4, threshold=1.0,
                          evaluator="agreement-each", **FAST)  # the request read back word by word
    assert each["evaluator"] == "agreement-each" and each["scoring_passes_initial"] == words > 1
    assert all(r["forward_passes"] == 4 + r["regen_steps"] + words for r in each["rounds"])
    with pytest.raises(InputError, match="evaluator must be one of"):
        pipe.refine(image_result, text=PROMPT, evaluator="vibes", **FAST)
    with pytest.raises(InputError, match="no input"):  # a picture from nothing, drawn without a plan in words
        pipe.refine(pipe.generate(to="image", seed=0, plan="none", **FAST), evaluator="agreement", **FAST)
    planned = pipe.generate(to="image", seed=0, **FAST)  # drawn from the caption it wrote: that is its request
    assert planned.settings["text_stage"]["conditioned"]  # it wrote a caption (the seed is fixed)
    _, trace = pipe.refine(planned, rounds=1, evaluator="agreement", threshold=1.0, **FAST)
    assert trace["evaluator"] == "agreement" and trace["scoring_passes_initial"] > 0


def test_patience_retries_rounds_that_were_not_kept(pipe, image_result):
    """patience=1 stops at the first round not kept; patience=k retries (re-planning, sampling with the round's
    own seed) until k rounds in a row were not kept or the rounds run out."""
    def stubborn(tokens):  # flags the same four codes and never sees an improvement: no round is kept
        scores = torch.ones(len(tokens["image"]))
        scores[:4] = 0.1
        return {"image": scores}

    _, once = pipe.refine(image_result, text=PROMPT, critic=stubborn, rounds=5, **FAST)
    assert len(once["rounds"]) == 1 and once["stopped"] == "no improvement"
    _, thrice = pipe.refine(image_result, text=PROMPT, critic=stubborn, rounds=5, patience=3, **FAST)
    assert len(thrice["rounds"]) == 3 and thrice["stopped"] == "no improvement"
    assert not any(r["kept"] for r in thrice["rounds"]) and thrice["config"]["patience"] == 3
    _, all_rounds = pipe.refine(image_result, text=PROMPT, critic=stubborn, rounds=2, patience=3, **FAST)
    assert len(all_rounds["rounds"]) == 2 and all_rounds["stopped"] == "rounds"
    with pytest.raises(InputError, match="patience"):
        RefineConfig(patience=0)


def test_an_edit_with_candidates_keeps_the_one_that_agrees_best(pipe, image_result):
    from unimodal.inference.critique import agreement_score
    from unimodal.refine import draft_of

    region = {"modality": "image", "box": [16, 16, 48, 48]}
    edited = pipe.edit(image_result, region, text="a large blue square", candidates=3, **FAST)
    record = edited.settings["edit"]
    assert record["candidates"] == 3 and len(record["agreement"]) == 3
    assert record["agreement"][record["kept"]] == max(record["agreement"])
    again = pipe.edit(image_result, region, text="a large blue square", seed=record["kept"], **FAST)
    assert again.token_ids == edited.token_ids  # the kept candidate is the regeneration with that seed
    score, _ = agreement_score(pipe.backbone, pipe.layout, draft_of(pipe, edited, {"text": "a large blue square"}))
    assert score == pytest.approx(max(record["agreement"]), abs=1e-5)
    assert edited.forward_passes == 3 * (again.forward_passes + 1)
    inside = set(pipe.layout.image_box_to_positions(region["box"]).tolist())
    assert set(_changed(image_result.token_ids, edited.token_ids)["image"]) <= inside
    with pytest.raises(SettingError, match="candidates"):
        pipe.edit(image_result, region, text="a blue square", candidates=0)
    for bad in (-1, 2**62):  # refused as given, not wrapped into a seed it was not
        with pytest.raises(SettingError, match="seed must be a non-negative int below 2\\*\\*62"):
            pipe.edit(image_result, region, text="a blue square", seed=bad)
        with pytest.raises(SettingError, match="seed must be a non-negative int below 2\\*\\*62"):
            pipe.edit(image_result, instruction="make the square blue", text="a large red square", seed=bad)
    with pytest.raises(InputError, match="new description"):
        pipe.edit(image_result, region, candidates=2)
    with pytest.raises(SettingError, match="greedy sampling"):  # every regeneration would be the same
        pipe.edit(image_result, region, text="a blue square", candidates=2, temperature=0, choice_temperature=0)


def test_critique_reports_scores_regions_and_pictures(pipe, image_result, tmp_path):
    report = pipe.critique(image_result, text=PROMPT, threshold=1.0)
    assert len(report.scores["image"]) == 64 and report.forward_passes == 4 and report.regions
    assert report.save(tmp_path / "heat.png").is_file() and report.picture.size == (2 * 4 * 64, 4 * 64)
    assert json.loads(report.save(tmp_path / "c.json").read_text())["regions"] == report.regions
    assert report.to_dict()["thresholds"] == {"image": 1.0}  # what a token had to score below, as given
    assert pipe.critique(image_result, text=PROMPT).to_dict()["thresholds"] == {"image": CONFIDENCE_THRESHOLDS["image"]}
    clip = pipe.generate(text=PROMPT, to="audio", seed=0, max_audio_seconds=0.8, **FAST)
    curve = pipe.critique(clip, text=PROMPT, threshold=1.0)
    assert curve.picture is not None and curve.save(tmp_path / "curve.png").is_file()
    with pytest.raises(InputError, match="pass the same input"):
        pipe.critique(image_result)


def test_cross_modal_check_names_the_region_to_redo(pipe, image_result, monkeypatch):
    from unimodal import refine as face

    class Read:
        text, forward_passes = "a small blue circle on the left", 3

    monkeypatch.setattr(pipe, "generate", lambda **kwargs: Read())
    report = face.cross_modal_check(pipe, image_result, PROMPT)
    assert report["agrees"] is False and report["differences"] == ["object 1 color: asked red, read blue"]
    (region,) = report["regions"]
    assert region["modality"] == "image" and region["box"][0] == 0 and region["box"][2] > 16  # around x = 16
    Read.text = PROMPT
    assert face.cross_modal_check(pipe, image_result, PROMPT)["agrees"] is True


def test_cross_modal_check_on_speech_points_at_the_differing_word(pipe, monkeypatch):
    from unimodal import refine as face
    from unimodal.results import GenerationResult

    class Read:
        text, forward_passes = "a small blue circle on the left", 3

    monkeypatch.setattr(pipe, "generate", lambda **kwargs: Read())
    codes = int(3.0 * pipe.layout.audio_frame_rate)  # a 3-second clip
    clip = GenerationResult(audio=np.zeros(48_000, np.float32), token_ids={"audio": [0] * codes})
    report = face.cross_modal_check(pipe, clip, PROMPT)
    (region,) = report["regions"]
    middle = 3.0 * (PROMPT.index("red") + 1.5) / len(PROMPT)  # "red" at an even speaking rate
    assert region["modality"] == "audio" and region["seconds"][0] < middle < region["seconds"][1]


# ---- the commands -----------------------------------------------------------------------------------------------


def run(capsys, *argv):
    from unimodal.cli import main

    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit:  # argparse refuses a flag's value itself: exit status 2, the message on stderr
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


def test_critique_refine_and_edit_commands(tiny_model_dir, image_result, tmp_path, capsys):
    image_result.save(tmp_path / "gen.png")
    model = ["--model", tiny_model_dir]
    code, out, _ = run(capsys, "critique", *model, "--in", tmp_path / "gen.png", "--prompt", PROMPT,
                       "--out", tmp_path / "heat.png", "--json", "--threshold", "1")
    assert code == 0 and json.loads(out)["files"] == [str((tmp_path / "heat.png").resolve())]
    code, out, _ = run(capsys, "refine", *model, "--in", tmp_path / "gen.png", "--prompt", PROMPT, "--rounds", "2",
                       "--out", tmp_path / "fixed.png", "--trace", tmp_path / "trace.json")
    assert code == 0 and (tmp_path / "fixed.png").is_file()
    assert json.loads((tmp_path / "trace.json").read_text())["critic"] == "confidence"
    code, out, _ = run(capsys, "refine", *model, "--in", tmp_path / "gen.png", "--prompt", PROMPT, "--rounds", "1",
                       "--repair", "--out", tmp_path / "repaired.png", "--trace", tmp_path / "repair.json")
    repair = json.loads((tmp_path / "repair.json").read_text())["repair"]
    assert code == 0 and (tmp_path / "repaired.png").is_file() and out.startswith("repair: read back as ")
    assert repair["check"]["ran"] is True and "edits" in repair
    code, _, err = run(capsys, "refine", *model, "--in", tmp_path / "gen.png", "--repair")
    assert code == 2 and "--repair reads a picture back" in err
    code, out, _ = run(capsys, "edit", *model, "--in", tmp_path / "gen.png", "--box", "0,0,16,16", "--prompt",
                       "a blue square", "--out", tmp_path / "edited.png")
    assert code == 0
    assert_output_file(tmp_path / "edited.png")  # the contract (codes outside the box kept): test_serve_refine
    code, _, err = run(capsys, "refine", *model, "--in", tmp_path / "gen.png", "--critic", "psychic")
    assert code == 2 and "--critic must be one of" in err
    (tmp_path / "caption.txt").write_text(PROMPT + "\n")  # a caption refined against the picture it describes
    code, out, _ = run(capsys, "refine", *model, "--in", tmp_path / "caption.txt", "--source", tmp_path / "gen.png",
                       "--model-caption", "--rounds", "1", "--out", tmp_path / "fixed.txt", "--trace",
                       tmp_path / "caption.json")
    trace = json.loads((tmp_path / "caption.json").read_text())
    assert code == 0 and (tmp_path / "fixed.txt").read_text().strip() and trace["caption_recipe"] is True
    assert trace["thresholds"] == {"text": 0.9} and trace["evaluator"] == "agreement"
    code, out, _ = run(capsys, "critique", *model, "--in", tmp_path / "caption.txt", "--source", tmp_path / "gen.png",
                       "--json")
    assert code == 0 and json.loads(out)["thresholds"] == {"text": CONFIDENCE_THRESHOLDS["text"]}


@pytest.mark.parametrize("argv, message", [
    (["critique", "--out", "heat.gif"], "--out 'heat.gif': a critique of image content writes"),
    (["refine", "--out", "fixed.wav"], "--out 'fixed.wav': a refine of image content writes image"),
    (["refine", "--trace", "trace.txt"], "--trace must be a .json file path"),
    (["refine", "--rounds", "0"], "--rounds must be"),
    (["refine", "--fraction", "2"], "--fraction must be a number in (0, 1]"),
    (["edit", "--box", "0,0,16,16", "--prompt", "a blue square"], "--out is required"),
    (["edit", "--out", "e.png"], "exactly one region"),
    (["edit", "--box", "0,0,16,16", "--out", "e.png", "--trace", "t.json"], "--trace is written by an instructed edit"),
    (["edit", "--instruction", "paint it like van gogh", "--out", "e.png"], "paint it like van gogh"),
    (["edit", "--box", "0,0,16,16", "--instruction", "make it blue", "--out", "e.png"], "not both"),
    (["edit", "--seconds", "0,1", "--out", "e.png"], "a seconds region is for audio content"),
    (["refine", "--source", "gen.png"], "--source 'gen.png' is a picture, as is input"),
    (["refine", "--source", "scene.mp4"], "--source 'scene.mp4': the input the content was made from is a picture"),
    (["critique", "--source", "missing.wav"], "--source"),
    (["refine", "--model-caption"], "--model-caption says a caption read against its source"),
])
def test_critique_refine_and_edit_refuse_bad_flags_before_the_model_loads(tmp_path, capsys, monkeypatch, argv,
                                                                          message):
    """The CLI checks its request as the server does: every refusal names the flag, and comes before the model
    (here a folder that does not exist) is touched or any file is written."""
    from PIL import Image as PILImage

    PILImage.new("RGB", (64, 64), "white").save(tmp_path / "gen.png")
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, argv[0], "--model", tmp_path / "no-model", "--in", tmp_path / "gen.png", *argv[1:])
    assert code == 2 and message in err and "no-model" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen.png"]
    code, _, err = run(capsys, argv[0], "--model", tmp_path / "no-model", "--in", tmp_path / "none.png", *argv[1:])
    assert code == 2 and "--in" in err and "none.png" in err, err


def test_bench_refine_command(tiny_codec_dir, tmp_path, capsys):
    pytest.importorskip("cv2")
    model = write_tiny_model(tiny_codec_dir, tmp_path / "model", max_text_len=32)  # scene captions fit
    code, out, err = run(capsys, "bench", "refine", "--model", model, "--n", "2", "--rounds", "1",
                         "--best-of", "2", "--out", tmp_path / "bench")
    assert code == 0, err
    report = json.loads((tmp_path / "bench" / "bench_refine.json").read_text())
    assert code == 0 and "best-of-2" in out and set(report["refine"]) == {"confidence", "random"}
    assert report["best_of"][1]["forward_passes"] > report["best_of"][0]["forward_passes"]
    assert {r["selector"] for r in report["best_of"]} == {"confidence", "agreement", "agreement-each"}
    assert "best-of-2 (agreement)" in out and (tmp_path / "bench" / "bench_refine.png").is_file()
    code, out, err = run(capsys, "bench", "refine-plot", tmp_path / "bench" / "bench_refine.json",
                         tmp_path / "bench" / "bench_refine.json", "--out", tmp_path / "both.png")
    assert code == 0, err
    assert Image.open(tmp_path / "both.png").size[0] > 300
    (tmp_path / "other.json").write_text(json.dumps({**report, "seed": 5}))
    code, _, err = run(capsys, "bench", "refine-plot", tmp_path / "bench" / "bench_refine.json",
                       tmp_path / "other.json", "--out", tmp_path / "x.png")
    assert code == 2 and "different cases" in err
    (tmp_path / "repair.json").write_text(json.dumps({"n": 2, "critics": {}}))
    code, _, err = run(capsys, "bench", "refine-plot", tmp_path / "repair.json", "--out", tmp_path / "x.png")
    assert code == 2 and "no curves" in err


def test_bench_refine_repair_series(tiny_codec_dir, tmp_path, capsys):
    """--repair: each picture repaired by reading it back, then refined with the first critic; its row 0 is the
    repair alone, costed with the reading; an empty --critics gives the repair alone next to best-of-N."""
    pytest.importorskip("cv2")
    model = write_tiny_model(tiny_codec_dir, tmp_path / "model", max_text_len=32)
    code, out, err = run(capsys, "bench", "refine", "--model", model, "--n", "2", "--rounds", "1", "--best-of", "1",
                         "--critics", "confidence", "--repair", "--out", tmp_path / "bench")
    assert code == 0, err
    report = json.loads((tmp_path / "bench" / "bench_refine.json").read_text())
    repaired, draw = report["repair"], report["base"]
    assert repaired["critic"] == "confidence" and [r["round"] for r in repaired["rounds"]] == [0, 1]
    assert repaired["rounds"][0]["forward_passes"] > draw["forward_passes"]  # the reading is counted
    assert repaired["rounds"][1]["forward_passes"] > repaired["rounds"][0]["forward_passes"]
    assert repaired["draw_accuracy"] == draw["accuracy"] == report["refine"]["confidence"]["rounds"][0]["accuracy"]
    assert "repair " in out and "repair, confidence r1" in out and "edits kept over 2 pictures" in out
    code, out, err = run(capsys, "bench", "refine", "--model", model, "--n", "2", "--best-of", "1", "--critics", "",
                         "--repair", "--out", tmp_path / "alone")
    assert code == 0, err
    report = json.loads((tmp_path / "alone" / "bench_refine.json").read_text())
    assert report["refine"] == {} and len(report["repair"]["rounds"]) == 1 and "no refine" in out
    assert (tmp_path / "alone" / "bench_refine.png").is_file()


def test_bench_refine_reads_pictures_too(tiny_codec_dir, tmp_path, capsys, monkeypatch):
    """--direction image->text: captions of the test pictures, judged by the caption grammar, refined with the
    picture as their input, and best-of-N draws after the first sampled (greedy captions are all the same)."""
    import unimodal.bench_refine as bench

    model = write_tiny_model(tiny_codec_dir, tmp_path / "model", max_text_len=32)
    seen = []
    real_base = bench._base
    monkeypatch.setattr(bench, "_base", lambda *a, **k: seen.append((a[3:], k)) or real_base(*a, **k))
    code, out, err = run(capsys, "bench", "refine", "--model", model, "--direction", "image->text", "--n", "2",
                         "--rounds", "1", "--best-of", "2", "--critics", "confidence", "--temperature", "1.0",
                         "--threshold", "0.9", "--evaluator", "agreement", "--out", tmp_path / "bench")
    assert code == 0, err
    report = json.loads((tmp_path / "bench" / "bench_refine.json").read_text())
    assert report["direction"] == "image->text" and report["best_of_temperature"] == 1.0
    assert report["options"] == {"temperature": 1.0, "threshold": 0.9, "evaluator": "agreement"}
    assert report["sampler"]["temperature"] == 0.0  # the first caption is the greedy one, as generate makes it
    assert "n=2 image->text cases" in out and "best-of draws after the first at temperature 1.0" in out
    assert [args[1].name for args, _ in seen] == ["image->text", "image->text"]
    assert [args[2] if len(args) > 2 else None for args, _ in seen] == [None, 1.0]
    assert {r["selector"] for r in report["best_of"]} == {"confidence", "agreement", "agreement-each"}
    rows = report["refine"]["confidence"]["rounds"]
    assert 0 <= rows[1]["accuracy"] <= 1 and rows[1]["forward_passes"] >= rows[0]["forward_passes"]
    assert report["refine"]["confidence"]["ran"] == {"evaluator": "agreement", "patience": 1,
                                                     "thresholds": {"text": 0.9}, "regen_temperature": 1.0}
    assert "refine confidence ran: kept by agreement, patience 1" in out
    code, _, err = run(capsys, "bench", "refine-plot", tmp_path / "bench" / "bench_refine.json", "--out",
                       tmp_path / "read.png")
    assert code == 0, err
    (tmp_path / "drawn.json").write_text(json.dumps({**report, "direction": "text->image"}))
    code, _, err = run(capsys, "bench", "refine-plot", tmp_path / "bench" / "bench_refine.json",
                       tmp_path / "drawn.json", "--out", tmp_path / "x.png")
    assert code == 2 and "direction differ" in err


def test_bench_refine_direction_judges_captions_by_the_grammar():
    from unimodal.bench_refine import _Direction
    from unimodal.inference.evaluate import EvalCase

    truth = {"objects": [{"shape": "circle", "color": "red", "size": "small", "position": "left"}],
             "relation": None}
    case = EvalCase("scene", "a small red circle on the left", np.zeros((64, 64, 3), np.uint8), None, truth)
    reading = _Direction("image->text")
    assert reading.request(case, 7) == {"image": case.image, "to": "text", "seed": 7}
    assert reading.inputs(case) == {"image": case.image}
    assert reading.verdicts([case] * 3, ["on the left, a small red circle", "a small blue circle on the left", None],
                            None) == [True, False, False]
    assert _Direction("text->image").inputs(case) == {"text": case.text}
    with pytest.raises(InputError, match="must be one of"):
        _Direction("audio->text")


@pytest.mark.parametrize("flags, message", [
    (["--patience", "0"], "--patience must be an int >= 1, got 0"),
    (["--best-of-temperature", "-1"], "--best-of-temperature must be >= 0"),
    (["--direction", "image->text", "--corrupt", "0.25"], "--direction chooses what the generation bench makes"),
    (["--rounds", "-1"], "--rounds must be an int >= 0"),
    (["--fraction", "1.5"], "--fraction must be a number in (0, 1]"),
    (["--threshold", "0"], "--threshold must be a number in (0, 1]"),
    (["--n", "0"], "--n must be a positive whole number"),
    (["--best-of", "0"], "--best-of must be a positive whole number"),
    (["--corrupt", "1"], "--corrupt is the share of codes to corrupt, in (0, 1)"),
    (["--mistakes", "0"], "--mistakes is the share of tokens to re-mask"),
    (["--corrupt", "0.2", "--mistakes", "0.5"], "give one"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--seed", "-3"], "--seed"),
    (["--reread", "2"], "--reread re-reads repaired captions"),
    (["--reread", "2", "--corrupt", "0.25"], "--reread re-reads repaired captions"),  # pictures: no caption
    (["--reread", "-1", "--corrupt", "0.25", "--modality", "text"], "--reread re-reads repaired captions"),
    (["--groups", "0"], "--groups must be a positive whole number"),
    (["--voices", "clear", "--mistakes", "0.5"], "only the speech benches hear them"),  # picture codes
    (["--voices", "loud", "--mistakes", "0.5", "--modality", "audio"], "--voices must be one of"),
    (["--repair", "--direction", "image->text"], "--repair repairs pictures drawn from captions"),
    (["--repair", "--corrupt", "0.25"], "--repair repairs pictures drawn from captions"),
])
def test_bench_refine_refuses_bad_numbers_before_the_model_loads(tmp_path, capsys, flags, message):
    """No model exists at --model: each refusal comes before the model (or any case) is loaded."""
    code, _, err = run(capsys, "bench", "refine", "--model", tmp_path / "no-model", *flags, "--out", tmp_path / "b")
    assert code == 2 and message in err and "no-model" not in err, err
    assert not (tmp_path / "b").exists()


def test_bench_refine_repair_mode_and_auroc(tiny_codec_dir, tmp_path, capsys):
    from unimodal.bench_refine import auroc

    assert auroc(np.array([0.1, 0.2, 0.9, 0.8]), np.array([True, True, False, False])) == 1.0
    assert auroc(np.array([0.5, 0.5]), np.array([True, False])) == 0.5
    pytest.importorskip("cv2")
    model = write_tiny_model(tiny_codec_dir, tmp_path / "model", max_text_len=32)
    code, out, err = run(capsys, "bench", "refine", "--model", model, "--n", "2", "--rounds", "1", "--corrupt",
                         "0.25", "--critics", "random", "--out", tmp_path / "repair")
    assert code == 0, err
    report = json.loads((tmp_path / "repair" / "bench_refine.json").read_text())
    row = report["critics"]["random"]
    assert report["corrupted_fraction"] == 0.25 and 0 <= row["codes_broken"] <= 1
    assert row["threshold"] == 0.5 and 0 <= row["real_flagged"] <= 1 and 0 <= row["corrupted_below_threshold"] <= 1
    quantiles = list(row["real_score_quantiles"].values())  # the real tokens' scores, rising with the quantile
    assert len(quantiles) == 6 and quantiles == sorted(quantiles)
    assert "real flagged" in out and "scores of the real tokens, quantiles" in out
    code, out, err = run(capsys, "bench", "refine", "--model", model, "--n", "2", "--rounds", "1", "--corrupt",
                         "0.25", "--critics", "oracle", "--out", tmp_path / "oracle")
    assert code == 0, err
    oracle = json.loads((tmp_path / "oracle" / "bench_refine.json").read_text())["critics"]["oracle"]
    # it knows the real codes: it scores exactly the corrupted ones low and no real one
    assert oracle["auroc"] == 1.0 and oracle["real_flagged"] == 0.0 and oracle["corrupted_below_threshold"] == 1.0
    code, out, err = run(capsys, "bench", "refine", "--model", model, "--n", "2", "--critics", "oracle",
                         "--out", tmp_path / "no-oracle")
    assert code != 0 and "--critic must be one of" in err  # only a repair bench knows the real tokens
    code, out, err = run(capsys, "bench", "refine", "--model", model, "--n", "2", "--rounds", "1", "--corrupt",
                         "0.25", "--modality", "text", "--critics", "confidence", "--out", tmp_path / "text")
    assert code == 0, err
    report = json.loads((tmp_path / "text" / "bench_refine.json").read_text())
    assert report["modality"] == "text" and 0 <= report["critics"]["confidence"]["auroc"] <= 1
    # corrupted captions are given as tokens, not written by the model: the critic's own default
    assert report["critics"]["confidence"]["threshold"] == CONFIDENCE_THRESHOLDS["text"]
    assert report["reread"] == 0 and report["critics"]["confidence"]["accuracy_repaired"] is None
    code, out, err = run(capsys, "bench", "refine", "--model", model, "--n", "2", "--rounds", "1", "--corrupt",
                         "0.25", "--modality", "text", "--critics", "confidence", "--reread", "2",
                         "--out", tmp_path / "reread")
    assert code == 0, err
    again = json.loads((tmp_path / "reread" / "bench_refine.json").read_text())
    row = again["critics"]["confidence"]
    assert again["reread"] == 2 and 0 <= row["accuracy_repaired"] <= 1 and 0 <= row["accuracy_refined"] <= 1
    # the repair's own code counts beside those after both calls; the repair is the first run's, same seeds
    assert row["codes_restored_repaired"] == report["critics"]["confidence"]["codes_restored"]
    assert row["codes_broken_repaired"] == report["critics"]["confidence"]["codes_broken"]
    # the same first call (same seeds), then more rounds: at least its passes
    assert row["forward_passes"] >= report["critics"]["confidence"]["forward_passes"] > 0
    assert "then re-read 2 rounds as the model's own caption" in out
    # from Python with progress=None: the same report, and neither a bar nor a line on the terminal
    from unimodal import UniModal
    from unimodal.bench_refine import bench_repair
    from unimodal.eval_cases import load_cases

    cases, _ = load_cases("scenes", "test", 2, speech=False)
    quiet = bench_repair(UniModal.from_pretrained(model), cases, critics=("confidence",), rounds=1,
                         modality="text", progress=None)
    assert capsys.readouterr() == ("", "")
    assert quiet["critics"]["confidence"]["auroc"] == report["critics"]["confidence"]["auroc"]


def test_auroc_within_ranks_only_the_draws_of_one_request():
    """auroc_within: pairs of one group only; a request whose draws are all right (or all wrong) adds no pair."""
    from unimodal.core.ranking import auroc, auroc_within

    groups = [([-1.0, -0.1], [True, False]), ([-5.0, -6.0], [False, True]), ([-0.3, -0.2], [False, False])]
    assert auroc_within(groups) == 1.0  # within each request the wrong draw reads worse
    # pooled, request 2's right draw (-5.0) reads below request 1's wrong one (-1.0): not every pair is ranked right
    pooled = auroc([-1.0, -0.1, -5.0, -6.0, -0.3, -0.2], [True, False, False, True, False, False])
    assert pooled == pytest.approx(7 / 8)
    assert auroc_within([([-1.0, -2.0], [False, False])]) is None and auroc([0.1], [True]) is None
    assert auroc_within([([-1.0, -1.0], [True, False])]) == 0.5  # a tie counts half


def test_auroc_interval_resamples_whole_cases_and_pairs_two_sides():
    """The bootstrap of the critic benches: whole cases are drawn (their tokens together), the interval holds the
    pooled AUROC, narrows with more cases, and a paired difference of a side with itself is exactly zero."""
    from unimodal.core.ranking import _weighted_aurocs, auroc, auroc_difference, auroc_interval

    rng = np.random.default_rng(0)
    scores, wrong = np.round(rng.normal(size=300), 1), rng.random(300) < 0.2
    weights = rng.integers(0, 3, 300)
    repeated = np.repeat(np.arange(300), weights)  # the weighted form counts an item as often as its weight
    assert _weighted_aurocs(scores, wrong, weights[None].astype(float))[0] == pytest.approx(
        auroc(scores[repeated], wrong[repeated]))

    def cases(n):
        out = []
        for _ in range(n):
            flags = rng.random(40) < 0.05
            out.append((rng.normal(size=40) - 1.5 * flags, flags))
        return out

    few, many = cases(16), cases(256)
    pooled = auroc(*map(np.concatenate, zip(*many)))
    low, high = auroc_interval(many)
    assert low < pooled < high and 0.75 < pooled < 0.95
    assert (high - low) < np.subtract(*auroc_interval(few)[::-1])  # more cases, a narrower interval
    assert auroc_difference(many, many) == {"mean": 0.0, "ci95": [0.0, 0.0], "cases": 256}
    shuffled = [(rng.permutation(s), w) for s, w in many]  # the same labels, scores that know nothing
    difference = auroc_difference(shuffled, many)
    assert difference["ci95"][1] < 0 < pooled - 0.5  # the useless critic is worse beyond the interval
    assert auroc_interval([([0.1, 0.2], [False, False])]) is None
    with pytest.raises(ValueError, match="same cases"):
        auroc_difference(few, many)


def test_report_json_keeps_every_value_and_puts_number_lists_on_one_line():
    from unimodal.core.paths import report_json

    report = {"n": 2, "scores": [0.5, -1e-05, 3, None, True], "cases": [{"wrong": [0, 1, 1], "name": ["a", "b"]}],
              "empty": [], "nested": [[1, 2], [3]]}
    text = report_json(report)
    assert json.loads(text) == report and text.endswith("\n")
    assert '"scores": [0.5, -1e-05, 3, null, true]' in text and '"wrong": [0, 1, 1]' in text
    assert '"name": ["a", "b"]' in text  # a list of words too
    many = {"cases": [{"wrong": list(range(40)), "who": {"a": 1}} for _ in range(2)], "when": float("nan")}
    text = report_json(many)
    assert text.count("\n") == 7 and json.loads(text)["cases"] == many["cases"]  # each case a line
    assert '"when": NaN' in text  # as json.dumps writes it
    assert json.loads(report_json({1: {2, 3}}, default=sorted)) == {"1": [2, 3]}  # default: as for json.dumps
