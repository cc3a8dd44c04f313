"""The autoregressive twin: causal backbone, next-token objective, KV-cache decoding, training and loading."""

import json
import math

import numpy as np
import pytest
import torch

from unimodal.backbone.dit import DiT
from unimodal.inference.ar import generate_autoregressive
from unimodal.inference.sampler import Request, SamplerConfig
from unimodal.tokenizers_mm.layout import BOI, EOI, EOT
from unimodal.training.objective import next_token_accuracy, next_token_loss
from unimodal.training.tasks import Task, build_example, collate_examples
from unimodal.training.tokens import CodecStack
from unimodal.training.train import TrainConfig, ar_step_loss, train
from unimodal.core.errors import InputError, SettingError


def _causal_tiny(vocab_size: int) -> DiT:
    torch.manual_seed(0)
    model = DiT.from_preset("tiny", vocab_size, causal=True).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model


@pytest.fixture(scope="module")
def layout(tiny_codec_dir):
    return CodecStack.load(tiny_codec_dir, max_text_len=12, max_audio_len=16).layout


def test_next_token_loss_on_a_hand_made_case():
    ids = torch.tensor([[5, 6, 7]])
    logits = torch.full((1, 3, 10), -1e4)
    logits[0, 0, 6] = 0.0  # position 0 predicts token 1 (6) surely
    logits[0, 1, :] = 0.0  # position 1 predicts token 2 (7) uniformly: CE log(10)
    predict = torch.tensor([[False, True, True]])
    assert next_token_loss(logits, ids, predict).item() == pytest.approx(math.log(10) / 2, rel=1e-5)
    only_last = torch.tensor([[False, False, True]])
    assert next_token_loss(logits, ids, only_last).item() == pytest.approx(math.log(10), rel=1e-5)
    assert next_token_accuracy(logits, ids, predict).item() == pytest.approx(0.5)  # argmax of a tie is id 0


def test_causal_model_never_looks_ahead_and_extend_equals_forward(layout):
    model = _causal_tiny(layout.vocab_size)
    packed = layout.pack([("text", torch.tensor([3, 4, 5])), ("image", torch.arange(64) % 32)])
    ids, seg, pos = packed.ids[None], packed.segment_ids[None], packed.positions[None]
    t, is_target = torch.zeros(1), torch.zeros_like(ids, dtype=torch.bool)
    full = model(ids, t, seg, pos, is_target).logits
    changed = ids.clone()
    changed[0, -1] = BOI  # perturb the last token: no earlier output may move
    assert torch.allclose(model(changed, t, seg, pos, is_target).logits[:, :-1], full[:, :-1], atol=1e-5)
    cut = 7  # a prefix in one call, then one token per call over the growing cache
    out, cache = model.extend(ids[:, :cut], seg[:, :cut], pos[:, :cut], model.empty_condition(1))
    steps = [out.logits]
    for i in range(cut, ids.shape[1]):
        out, cache = model.extend(ids[:, i:i + 1], seg[:, i:i + 1], pos[:, i:i + 1], cache)
        steps.append(out.logits)
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-4)


def test_diffusion_and_causal_entry_points_refuse_each_other(layout):
    causal, bidirectional = _causal_tiny(layout.vocab_size), DiT.from_preset("tiny", layout.vocab_size)
    ids = torch.tensor([[EOT]])
    with pytest.raises(InputError, match="causal"):
        bidirectional.extend(ids, torch.zeros_like(ids), torch.zeros(1, 1, 2, dtype=torch.long),
                             bidirectional.empty_condition(1))
    with pytest.raises(InputError, match="extend"):
        causal.forward_targets(ids, torch.zeros(1), torch.zeros_like(ids), torch.zeros(1, 1, 2, dtype=torch.long),
                               causal.empty_condition(1))
    with pytest.raises(InputError, match="causal model"):
        generate_autoregressive(bidirectional, layout, Request([], ["text"]))


def test_overfitting_a_tiny_batch_with_the_next_token_loss(layout):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    samples = [{"text": torch.tensor([i + 1, i + 5]), "image": torch.from_numpy(rng.integers(0, 32, 64))}
               for i in range(4)]
    batch = collate_examples([build_example(layout, s, Task.parse("text->image"), pad_targets=False)
                              for s in samples])
    model = DiT.from_preset("tiny", layout.vocab_size, causal=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for _ in range(150):
        loss, acc = ar_step_loss(model, batch)
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert first > 3.0 and loss.item() < 0.05 and acc.item() == 1.0


def test_kv_cache_decoding_structure_batching_and_seeds(layout):
    model = _causal_tiny(layout.vocab_size)
    requests = [Request([("text", torch.tensor([1, 2, 3]))], ["image"]),
                Request([("text", torch.tensor([4]))], ["image"]),
                Request([("image", torch.arange(64) % 32)], [layout.target_segment("text", 6)]),
                Request([], ["text", "image", "audio"])]
    config = SamplerConfig(temperature=1.0, seed=3)
    batched = generate_autoregressive(model, layout, requests, config)
    for index, request in enumerate(requests):
        alone = generate_autoregressive(model, layout, [request], SamplerConfig(temperature=1.0, seed=3 + index))[0]
        for modality, ids in batched[index].tokens.items():
            assert torch.equal(ids, alone.tokens[modality]), (index, modality)
    image = batched[0]
    assert image.tokens["image"].shape == (64,) and image.forward_passes == 64  # one call per code
    assert image.target.ids[0] == BOI and image.target.ids[-1] == EOI and sum(image.commits_per_step) == 64
    text = batched[2].tokens["text"]
    assert len(text) <= 5 and batched[2].forward_passes == len(text) + (len(text) < 5)  # END sampled or cap
    joint = batched[3]
    assert set(joint.tokens) == {"text", "image", "audio"} and joint.tokens["image"].shape == (64,)
    again = generate_autoregressive(model, layout, requests, config)
    assert all(torch.equal(a.tokens[m], b.tokens[m]) for a, b in zip(batched, again) for m in a.tokens)
    greedy = generate_autoregressive(model, layout, requests[:1], SamplerConfig(temperature=0.0))[0]
    assert torch.isfinite(greedy.confidence["image"]).all() and (greedy.confidence["image"] <= 1).all()
    with pytest.raises(InputError, match="guidance"):
        generate_autoregressive(model, layout, requests[:1], SamplerConfig(cfg=2.0))


def test_train_objective_ar_writes_a_twin_the_pipeline_decodes(tiny_codec_dir, tiny_scenes, tmp_path):
    from unimodal.pipeline import UniModal

    cfg = TrainConfig(preset="tiny", steps=2, batch_size=4, warmup=1, val_every=2, val_samples=2,
                      checkpoint_every=2, bf16=False, objective="ar", snapshots=[1], train_subset=8)
    model_dir = train(tmp_path / "ar", [str(tiny_scenes)], tiny_codec_dir, cfg, progress=False)
    assert json.loads((model_dir / "backbone" / "config.json").read_text())["causal"] is True
    assert (tmp_path / "ar" / "model-step1" / "backbone").is_dir()
    history = json.loads((tmp_path / "ar" / "history.json").read_text())
    assert all(np.isfinite(v) for v in history[-1]["val"].values())
    pipe = UniModal.from_pretrained(model_dir)
    assert pipe.autoregressive
    result = pipe.generate(text="a small red circle on the left", to="image", seed=0)
    assert result.image.size == (64, 64) and result.forward_passes == 64
    # its settings say how it decoded, not the masked sampler's mode, steps and guidance, which it ignores
    assert result.settings["decoding"] == "autoregressive" and "mode" not in result.settings
    assert {k: result.settings[k] for k in ("temperature", "top_k", "top_p")} == {"temperature": 0.7, "top_k": 0,
                                                                              "top_p": 1.0}
    assert pipe.generate(text="a small red circle", to="image", seed=0).token_ids == \
        pipe.generate(text="a small red circle", to="image", seed=0).token_ids
    with pytest.raises(SettingError, match="refine > 0 re-masks and regenerates with the masked-diffusion model"):
        pipe.generate(text="a small red circle", to="image", refine=1)  # refused before anything is sampled
    with pytest.raises(SettingError, match="repair reads the picture back with the masked-diffusion model"):
        pipe.generate(text="a small red circle", to="image", repair=True)
    with pytest.raises(InputError, match="train_subset"):
        TrainConfig(train_subset=0)


def test_examples_pack_segments_in_the_order_generation_uses(layout):
    tokens = {"text": torch.tensor([1, 2]), "image": torch.arange(64) % 32, "audio": torch.tensor([3, 4])}
    for name in ("audio+text->image", "->image+text", "image->audio+text"):
        for pad in (True, False):
            spans = build_example(layout, tokens, Task.parse(name), pad_targets=pad).packed.spans
            conditions, _, targets = name.partition("->")
            n_cond = len([m for m in conditions.split("+") if m])
            order = [s.modality for s in spans]
            assert order[:n_cond] == sorted(order[:n_cond], key=["text", "image", "audio"].index)
            assert order[n_cond:] == sorted(order[n_cond:], key=["text", "image", "audio"].index)
