"""The training recipe's parts: the sparse loss, its weightings and normalisations, precision and device
choice, packs, time-budgeted runs and sharded model folders."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from unimodal.backbone.dit import DiT
from unimodal.tokenizers_mm.layout import PAD
from unimodal.training.hardware import cpu_has_bf16_units, resolve_device, use_bf16
from unimodal.training.objective import (LossSpec, TargetVocab, complementary_masks, mask_targets, masked_diffusion_loss, sparse_diffusion_loss,
                                token_weight)
from unimodal.training.schedule import MaskSchedule
from unimodal.training.tasks import Task, build_example, collate_examples
from unimodal.training.train import Deadline, RunOptions, TrainConfig, step_loss, train
from unimodal.core.errors import DataError, InputError

from conftest import mixed_batch, toy_layout  # noqa: E402


def test_sparse_loss_equals_the_dense_loss_over_each_slots_allowed_ids():
    layout = toy_layout()
    batch = mixed_batch(layout)
    torch.manual_seed(0)
    model = DiT.from_preset("tiny", layout.vocab_size)
    with torch.no_grad():  # random head and output bias: the restriction must matter
        model.output_bias.normal_()
        model.final_layer.adaLN_modulation[-1].weight.normal_(std=0.1)
    t = torch.tensor([0.3, 0.6, 0.9, 0.5])
    masked = mask_targets(batch.batch.ids, batch.maskable, t, torch.Generator().manual_seed(1))
    b = batch.batch
    out = model(masked.noisy_ids, t, b.segment_ids, b.positions, batch.is_target, b.attention_mask)
    allowed = torch.zeros_like(out.logits, dtype=torch.bool)
    for row, spans in enumerate(b.spans):
        for span in spans:
            allowed[row, span.start:span.end] = layout.allowed_ids(span.modality)
    restricted = out.logits.masked_fill(~allowed, -1e9)
    vocab = TargetVocab.of(layout)
    for weighting in ("elbo", "clipped", "flat", "text-flat"):
        for normalise in ("real", "maskable"):
            dense = masked_diffusion_loss(restricted, masked, weighting, normalise, b.segment_ids)
            sparse, acc = sparse_diffusion_loss(model.output_logits, out.hidden, b.segment_ids, masked, vocab,
                                                weighting, normalise)
            assert sparse.item() == pytest.approx(dense.item(), rel=1e-5), (weighting, normalise)
    right = (restricted.argmax(-1) == masked.targets) & masked.masked
    assert acc.item() == pytest.approx(right.sum().item() / masked.masked.sum().item())
    # The unrestricted loss is larger: mass on other modalities' ids is what the sparse head never computes.
    assert masked_diffusion_loss(out.logits, masked, "elbo", "real") > sparse


def test_text_flat_weighs_text_targets_flat_and_codes_by_one_over_t():
    layout = toy_layout()
    t = torch.tensor([0.25])
    for task, expected in (("image->text", 1.0), ("text->image", 4.0)):
        tokens = {"text": torch.tensor([5, 6]), "image": torch.zeros(64, dtype=torch.long)}
        batch = collate_examples([build_example(layout, tokens, Task.parse(task))])
        masked = mask_targets(batch.batch.ids, batch.maskable, torch.tensor([1.0]))
        masked.t = t
        logits = torch.randn(1, batch.batch.ids.shape[1], layout.vocab_size, generator=torch.Generator().manual_seed(0))
        flat = masked_diffusion_loss(logits, masked, "flat", "real")
        mixed = masked_diffusion_loss(logits, masked, "text-flat", "real", batch.batch.segment_ids)
        assert mixed.item() == pytest.approx(expected * flat.item(), rel=1e-6), task
    with pytest.raises(ValueError, match="segment"):
        token_weight(t, "text-flat")


def test_real_normalisation_counts_content_and_end_not_filler():
    layout = toy_layout()
    tokens = {"text": torch.tensor([5, 6]), "image": torch.zeros(64, dtype=torch.long)}
    batch = collate_examples([build_example(layout, tokens, Task.parse("image->text"))])
    masked = mask_targets(batch.batch.ids, batch.maskable, torch.tensor([1.0]))
    uniform = torch.zeros(1, batch.batch.ids.shape[1], layout.vocab_size)
    per_slot = np.log(layout.vocab_size)
    slots = layout.max_text_len + 1  # 2 words, END, 6 PAD filler
    assert int((masked.targets[masked.masked] == PAD).sum()) == slots - 3
    assert masked_diffusion_loss(uniform, masked, "elbo", "maskable").item() == pytest.approx(per_slot)
    assert masked_diffusion_loss(uniform, masked, "elbo", "real").item() == pytest.approx(per_slot * slots / 3)
    assert torch.allclose(token_weight(torch.tensor([0.01, 0.5]), "clipped"), torch.tensor([10.0, 2.0]))
    with pytest.raises(ValueError, match="weighting"):
        LossSpec(weighting="sqrt")
    with pytest.raises(InputError, match="weighting"):
        TrainConfig(loss_weighting="sqrt")


def test_step_loss_sparse_and_dense_agree_on_gradients_of_the_trunk():
    """The sparse step (logits only at masked slots, over their modality's ids) has the loss and the gradients of
    the dense reference: full logits at every slot, restricted to each slot's modality, on the same mask."""
    layout = toy_layout()
    batch = mixed_batch(layout, seed=3)
    torch.manual_seed(0)
    model = DiT.from_preset("tiny", layout.vocab_size)
    for p in model.parameters():  # adaLN-Zero starts every block as the identity: move off it
        torch.nn.init.normal_(p, std=0.05)
    t = torch.full((4,), 0.5)
    spec = LossSpec(TargetVocab.of(layout))
    loss, _ = step_loss(model, batch, MaskSchedule(), torch.Generator().manual_seed(0), spec, t=t)
    loss.backward()
    # every weight but the critic head takes part (DDP needs it); the head is off without a critic objective
    assert all(p.grad is not None for n, p in model.named_parameters() if not n.startswith("critic_head"))
    assert all(p.grad is None for p in model.critic_head.parameters())
    sparse = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    b = batch.batch
    masked = spec.mask(b.ids, batch.maskable, t, torch.Generator().manual_seed(0), segment_ids=b.segment_ids)
    out = model(masked.noisy_ids, t, b.segment_ids, b.positions, batch.is_target, b.attention_mask)
    allowed = torch.zeros_like(out.logits, dtype=torch.bool)
    for row, spans in enumerate(b.spans):
        for span in spans:
            allowed[row, span.start:span.end] = layout.allowed_ids(span.modality)
    dense = masked_diffusion_loss(out.logits.masked_fill(~allowed, -1e9), masked, spec.weighting, spec.normalise,
                                  b.segment_ids)
    dense.backward()
    assert loss.item() == pytest.approx(dense.item(), rel=1e-5)
    for name, grad in sparse.items():
        reference = model.get_parameter(name).grad
        reference = torch.zeros_like(grad) if reference is None else reference
        assert torch.allclose(grad, reference, rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("sparse", [False, True])
def test_step_loss_is_the_same_with_the_padding_slots_skipped(sparse):
    layout = toy_layout()
    batch = mixed_batch(layout, seed=3)
    assert not bool(batch.batch.attention_mask.all())  # the mixed batch is padded
    torch.manual_seed(0)
    model = DiT.from_preset("tiny", layout.vocab_size)
    for p in model.parameters():  # adaLN-Zero starts every block as the identity: move off it
        torch.nn.init.normal_(p, std=0.05)
    results = []
    for unpad in (False, True):
        model.zero_grad()
        spec = LossSpec(TargetVocab.of(layout) if sparse else None, masking="complementary", unpad=unpad)
        loss, acc = step_loss(model, batch, MaskSchedule(), torch.Generator().manual_seed(0), spec,
                              t=torch.tensor([0.2, 0.5, 0.7, 0.95]))
        loss.backward()
        results.append((loss.item(), float(acc), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (loss_a, acc_a, grads_a), (loss_b, acc_b, grads_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-5) and acc_a == acc_b and len(grads_a) == len(grads_b)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads_a, grads_b))
    assert TrainConfig().loss_spec(layout).unpad and not TrainConfig(unpad=False).loss_spec(layout).unpad


def test_complementary_masks_train_every_target_token_once_per_step():
    layout = toy_layout()
    batch = mixed_batch(layout, seed=5)
    t = torch.tensor([0.2, 0.5, 0.7, 0.95])
    masked = complementary_masks(batch.batch.ids, batch.maskable, t, torch.Generator().manual_seed(0))
    first, second = masked.masked[:4], masked.masked[4:]
    assert not (first & second).any()  # the two masks are disjoint ...
    assert torch.equal(first | second, batch.maskable)  # ... and cover every maskable slot
    assert torch.equal(masked.noisy_ids == 1, masked.masked) and torch.equal(masked.targets[4:], batch.batch.ids)
    assert torch.allclose(masked.t[4:], 1 - t)
    # the step doubles the rows of everything the model reads, and the loss is an ordinary finite scalar
    torch.manual_seed(0)
    model = DiT.from_preset("tiny", layout.vocab_size)
    spec = LossSpec(TargetVocab.of(layout), masking="complementary")
    loss, acc = step_loss(model, batch, MaskSchedule(), torch.Generator().manual_seed(0), spec, t=t)
    loss.backward()
    assert torch.isfinite(loss) and 0 <= float(acc) <= 1
    with pytest.raises(InputError, match="masking"):
        TrainConfig(masking="half")


def test_suffix_masks_hide_the_rest_of_a_text_target_and_leave_codes_random():
    from unimodal.tokenizers_mm.layout import SEGMENT_IDS

    layout = toy_layout()
    batch = mixed_batch(layout, seed=5)
    b = batch.batch
    t = torch.tensor([0.2, 0.5, 0.7, 1.0])
    spec = LossSpec(TargetVocab.of(layout), masking="independent", suffix_share=1.0)
    masked = spec.mask(b.ids, batch.maskable, t, torch.Generator().manual_seed(0), segment_ids=b.segment_ids)
    random = mask_targets(b.ids, batch.maskable, t, torch.Generator().manual_seed(0))
    text = batch.maskable & (b.segment_ids == SEGMENT_IDS["text"])
    assert text.any()
    for row in range(4):
        slots = text[row].nonzero().squeeze(1)
        if slots.numel() == 0:
            continue
        hidden = masked.masked[row, slots]
        # a suffix: nothing visible after the first masked text slot, and floor((1 - t) n) real tokens kept
        assert torch.equal(hidden, torch.sort(hidden.int(), stable=True).values.bool())
        real = int((b.ids[row, slots] != PAD).sum())
        assert int((~hidden).sum()) == int((1 - t[row]) * real)
    # image and audio targets keep exactly the random mask they had
    assert torch.equal(masked.masked & ~text, random.masked & ~text)
    assert torch.equal(masked.noisy_ids == 1, masked.masked)
    # share 0 is the random mask itself; complementary masking takes the suffix's complement (its prefix)
    none = LossSpec(masking="independent", suffix_share=0.0).mask(b.ids, batch.maskable, t,
                                                                  torch.Generator().manual_seed(0), b.segment_ids)
    assert torch.equal(none.masked, random.masked)
    both = LossSpec(masking="complementary", suffix_share=1.0).mask(b.ids, batch.maskable, t,
                                                                    torch.Generator().manual_seed(0), b.segment_ids)
    assert torch.equal(both.masked[:4], masked.masked) and torch.equal(both.masked[4:], batch.maskable & ~masked.masked)
    torch.manual_seed(0)
    model = DiT.from_preset("tiny", layout.vocab_size)
    loss, _ = step_loss(model, batch, MaskSchedule(), torch.Generator().manual_seed(0), spec, t=t)
    assert torch.isfinite(loss)
    with pytest.raises(InputError, match="suffix_share"):
        TrainConfig(suffix_share=1.5)
    assert TrainConfig(suffix_share=0.5).loss_spec(layout).suffix_share == 0.5


def _templated_captions(layout, n=64, seed=0):
    """Captions in two phrasings, (1, 2, colour) and (3, 4, colour), the colour one of 8 ids: the phrasing's
    words are given away by their neighbours, the colour is not."""
    rng = np.random.default_rng(seed)
    return [{"text": torch.tensor([1, 2, 10 + (i // 2) % 8] if i % 2 else [3, 4, 10 + (i // 2) % 8]),
             "image": torch.from_numpy(rng.integers(0, 16, 64))} for i in range(n)]


def test_caption_surprisal_is_high_for_content_words_and_zero_for_the_phrasing():
    from unimodal.training.objective import CaptionSurprisal

    layout = toy_layout()
    samples = _templated_captions(layout)
    surprisal = CaptionSurprisal.of(layout, samples)
    packed = layout.pack([layout.padded_segment("text", samples[1]["text"])]).ids[None]  # BOT 1 2 c END PAD...
    score = surprisal.score(packed)[0]
    words = layout.to_shared("text", samples[1]["text"])
    assert torch.equal(packed[0, 1:4], words)
    assert score[1].item() == 0 and score[2].item() == 0  # "1" and "2" between their neighbours: certain
    assert score[3].item() == pytest.approx(np.log(8), abs=1e-5)  # one colour of 8, each as often
    assert (score[packed[0] < 16] == 0).all()  # the markers and the filler
    assert surprisal.unseen == pytest.approx(float(surprisal.values.max()))
    unseen = packed.clone()
    unseen[0, 2] = layout.to_shared("text", torch.tensor([30]))  # a triple no caption held
    assert surprisal.score(unseen)[0, 2].item() == pytest.approx(surprisal.unseen)
    empty = CaptionSurprisal.of(layout, [{"image": torch.zeros(64, dtype=torch.long)}])  # no caption to learn from
    assert empty.unseen == 0.0 and bool((empty.score(packed) == 0).all())  # every word as likely: nothing first


def test_content_first_masks_hide_the_content_words_first_and_keep_the_count():
    from unimodal.tokenizers_mm.layout import SEGMENT_IDS
    from unimodal.training.objective import CaptionSurprisal, content_first_masks

    layout = toy_layout()
    samples = _templated_captions(layout, seed=1)
    surprisal = CaptionSurprisal.of(layout, samples)
    batch = collate_examples([build_example(layout, s, Task.parse(task)) for s in samples[:8]
                              for task in ("image->text", "text->image")])
    b = batch.batch
    t = torch.linspace(0.1, 0.9, b.ids.shape[0])
    first = mask_targets(b.ids, batch.maskable, t, torch.Generator().manual_seed(0))
    ordered = content_first_masks(first, b.segment_ids, surprisal, 50.0, torch.Generator().manual_seed(0))
    text = batch.maskable & (b.segment_ids == SEGMENT_IDS["text"]) & (b.ids != PAD)
    assert torch.equal((ordered.masked & text).sum(1), (first.masked & text).sum(1))  # the draw's count
    assert torch.equal(ordered.masked & ~text, first.masked & ~text)  # codes and filler as drawn
    assert torch.equal(ordered.noisy_ids == 1, ordered.masked)
    colour = text & (b.ids >= int(layout.to_shared("text", torch.tensor([10])))) & (
        b.ids <= int(layout.to_shared("text", torch.tensor([17]))))
    hidden = (ordered.masked & text).sum(1)
    assert hidden.gt(0).any() and (ordered.masked[hidden > 0] | ~colour[hidden > 0]).all()  # colour first
    assert content_first_masks(first, b.segment_ids, surprisal, 0.0) is first
    # through the spec: complementary masking still predicts every target token exactly once
    spec = LossSpec(TargetVocab.of(layout), masking="complementary", content_first=50.0, surprisal=surprisal)
    both = spec.mask(b.ids, batch.maskable, t, torch.Generator().manual_seed(0), segment_ids=b.segment_ids)
    n = b.ids.shape[0]
    assert torch.equal(both.masked[:n] ^ both.masked[n:], batch.maskable)
    with pytest.raises(ValueError, match="segment id"):
        spec.mask(b.ids, batch.maskable, t, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="CaptionSurprisal"):
        LossSpec(content_first=1.0)
    with pytest.raises(InputError, match="content_first"):
        TrainConfig(content_first=-1)
    with pytest.raises(ValueError, match="train_tokens"):
        TrainConfig(content_first=2.0).loss_spec(layout)
    assert TrainConfig(content_first=2.0).loss_spec(layout, train_tokens=samples).surprisal is not None
    assert TrainConfig().loss_spec(layout, train_tokens=samples).surprisal is None


def test_bf16_follows_the_hardware():
    assert cpu_has_bf16_units("flags : fpu sse avx2 avx512f avx512_bf16 avx512vl")
    assert cpu_has_bf16_units("flags : fpu sse avx2 amx_bf16 amx_tile")
    assert not cpu_has_bf16_units("flags : fpu sse avx2 avx512f avx512vl")
    assert use_bf16(False, "cpu") == (False, "as requested")
    with pytest.raises(InputError, match="cuda"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="no CUDA GPU"):
            resolve_device("cuda")
        assert resolve_device("auto") == "cpu"


def test_the_codec_trainers_follow_the_hardware_too(capsys, monkeypatch):
    from unimodal.training import hardware
    from unimodal.training.codec_audio import AudioCodecTrainConfig
    from unimodal.training.codec_image import ImageCodecTrainConfig
    from unimodal.training.vocoder import VocoderTrainConfig

    # bf16 autocast on a CPU without bf16 units made the image codec train ~25x slower than float32
    assert ImageCodecTrainConfig().bf16 is AudioCodecTrainConfig().bf16 is VocoderTrainConfig().bf16 is None
    monkeypatch.setattr(hardware, "cpu_has_bf16_units", lambda cpuinfo=None: False)
    assert hardware.cpu_autocast_bf16(None, "image codec training") is False
    assert hardware.cpu_autocast_bf16(True, "vocoder training") is True
    out = capsys.readouterr().out
    assert "image codec training: float32 (the CPU has no bf16 matrix units" in out
    assert "vocoder training: bf16 autocast (as requested)" in out


def test_deadline_leaves_room_for_the_next_step_and_the_save():
    assert not Deadline(None).reached()
    deadline = Deadline(10.0)
    deadline.step_took(1.0)
    assert not deadline.reached()
    deadline.step_took(400.0)  # two such steps and the save would overrun 10 minutes
    assert deadline.reached()


def _cfg(**kw):
    base = dict(preset="tiny", steps=4, batch_size=4, warmup=1, val_every=2, val_samples=2, checkpoint_every=2,
                bf16=False)
    return TrainConfig(**{**base, **kw})


def test_pack_round_trip_and_training_from_a_pack_without_codecs(tiny_codec_dir, tiny_scenes, tmp_path):
    from unimodal.training.export import export_model
    from unimodal.training.pack import build_pack, load_pack
    from unimodal.training.tokens import CodecStack, tokenized_split

    path = build_pack([str(tiny_scenes)], tiny_codec_dir, tmp_path / "tiny.pack.safetensors", progress=False)
    pack = load_pack(path)
    stack = CodecStack.load(tiny_codec_dir)
    assert pack.meta["counts"] == {"train": 32, "val": 4, "test": 4, "heldout": 4}
    assert pack.layout.to_dict() == stack.layout.to_dict() and pack.fingerprint == stack.fingerprint(tiny_codec_dir)
    for split in ("train", "test"):
        direct = tokenized_split(stack, tiny_codec_dir, tiny_scenes, split, progress=False)
        for a, b in zip(direct, pack.splits[split]):
            assert set(a) == set(b) and all(torch.equal(a[m], b[m]) for m in a)
    with pytest.raises(DataError, match="pack"):
        load_pack(tmp_path / "nothing.pack.safetensors")

    wide = {"hidden_size": 192, "critic_hidden": 16}  # ~2.8 MB in float16: three 1 MB shards
    model_dir = train(tmp_path / "run", [str(path)], None, _cfg(steps=2, model_overrides=wide), progress=False,
                      options=RunOptions(shard_mb=1, half=True))
    assert not (model_dir / "image").exists()  # no codecs on a pack-only machine
    assert json.loads((model_dir / "vocabulary.json").read_text())["data"] == ["scenes"]
    shards = sorted((model_dir / "backbone").glob("*.safetensors"))
    assert len(shards) >= 2 and all(s.stat().st_size <= 1_000_000 for s in shards)
    from safetensors.torch import load_file

    assert {v.dtype for v in load_file(shards[0]).values()} == {torch.float16}
    DiT.from_pretrained(model_dir / "backbone")  # the shards load back as one model
    shipped = export_model(model_dir, tmp_path / "shipped", codecs=tiny_codec_dir)
    assert (shipped / "image").is_dir() and (shipped / "backbone").is_dir()
    with pytest.raises(InputError, match="alone"):
        train(tmp_path / "mixed", [str(path), str(tiny_scenes)], tiny_codec_dir, _cfg(), progress=False)


def test_data_weights_draw_a_set_as_often_as_its_weight_says():
    from unimodal.training.data.sources import split_weight, weighted

    assert split_weight("digits:4") == ("digits", 4.0) and split_weight("digits") == ("digits", 1.0)
    assert split_weight("runs/a:b") == ("runs/a:b", 1.0)  # a colon that is part of a name
    assert split_weight("/data/set:0.5") == ("/data/set", 0.5)
    assert split_weight("~/sets/digits:2") == (str(Path.home() / "sets" / "digits"), 2.0)  # after a comma too
    samples = [{"i": i} for i in range(10)]
    assert weighted(samples, 1) == samples and weighted(samples, 3) == samples * 3
    half = weighted(samples, 2.5, seed=7)
    assert half[:20] == samples * 2 and len(half) == 25 and len({id(s) for s in half[20:]}) == 5
    assert half == weighted(samples, 2.5, seed=7) and half[20:] != weighted(samples, 2.5, seed=8)[20:]
    assert all(s is samples[s["i"]] for s in half)  # references, not copies
    with pytest.raises(InputError, match="keeps none"):
        weighted(samples, 0.01, name="x")
    for n in (3, 7, 64, 100, 1000):  # the weight the refusal suggests keeps a sample
        many = list(range(n))
        with pytest.raises(InputError, match="at least") as refused:
            weighted(many, 0.4 / n)
        suggested = float(str(refused.value).rsplit("at least ", 1)[1])
        assert len(weighted(many, suggested)) >= 1


def test_a_weighted_pack_stores_each_sample_once_and_trains_on_the_weights(tiny_codec_dir, tiny_scenes, tmp_path,
                                                                          capsys, monkeypatch):
    from unimodal.cli import main
    from unimodal.training.pack import load_pack
    from unimodal.training.train import check_data, load_run_data

    plain, heavy = tmp_path / "plain.pack.safetensors", tmp_path / "heavy.pack.safetensors"
    for data, out in ((f"{tiny_scenes}", plain), (f"{tiny_scenes},{tiny_scenes}:2.5", heavy)):
        assert main(["data", "pack", "--data", data, "--codecs", str(tiny_codec_dir), "--out", str(out)]) == 0
    assert "train weights scenes x1, scenes x2.5" in capsys.readouterr().out
    pack = load_pack(heavy)
    # each entry's training samples stored once (weights applied on load); a folder named twice is validated once
    assert pack.meta["counts"]["train"] == 64 and pack.meta["counts"]["val"] == 4 and pack.meta["counts"]["test"] == 4
    assert [(n, w) for _, n, w in pack.train_parts()] == [(32, 1.0), (32, 2.5)]
    assert len(pack.weighted_train()) == 32 + 80
    single = load_pack(plain)
    assert [id(s) for s in single.weighted_train()] == [id(s) for s in single.splits["train"]]
    monkeypatch.setenv("HOME", str(tmp_path))  # a pack named from ~ is a pack, not a pack given a weight
    check_data(["~/plain.pack.safetensors"])
    assert load_pack("~/plain.pack.safetensors").meta["counts"] == single.meta["counts"]
    with pytest.raises(InputError, match="weights are set when it is packed"):
        check_data(["~/plain.pack.safetensors:2"])

    class Accelerator:  # what load_run_data asks of accelerate's
        is_main_process = True

        @staticmethod
        def main_process_first():
            import contextlib
            return contextlib.nullcontext()

    run = load_run_data([str(heavy)], None, _cfg(), Accelerator(), progress=True)
    assert len(run.train) == 112 and len(run.val) == 4
    assert "data: scenes 32 x1 (29%), scenes 32 x2.5 (71%)" in capsys.readouterr().out
    direct = load_run_data([f"{tiny_scenes}:3", str(tiny_scenes)], tiny_codec_dir, _cfg(), Accelerator(), progress=False)
    assert len(direct.train) == 128 and len(direct.val) == 4 and direct.sources == [f"{tiny_scenes}:3", str(tiny_scenes)]


def test_max_minutes_stops_cleanly_with_a_checkpoint_and_a_model(tiny_codec_dir, tiny_scenes, tmp_path, capsys):
    model_dir = train(tmp_path / "short", [str(tiny_scenes)], tiny_codec_dir, _cfg(steps=50), progress=True,
                      options=RunOptions(max_minutes=0.01))  # 0.6 s: less than the save reserve
    history = json.loads((tmp_path / "short" / "history.json").read_text())
    assert len(history) == 1 and "val" in history[-1]  # stopped after its first step, validated
    assert torch.load(tmp_path / "short" / "checkpoint.pt", weights_only=False)["step"] == 1
    assert (model_dir / "backbone" / "config.json").exists()
    assert "stopping at step 1 of 50" in capsys.readouterr().out
    record = json.loads((model_dir / "training_config.json").read_text())
    assert record["steps"] == 50 and record["steps_done"] == 1  # the plan, and what the weights had


def test_a_cpu_run_hands_freed_memory_back_every_few_steps(tiny_codec_dir, tiny_scenes, tmp_path, monkeypatch):
    import platform

    import unimodal.training.train as train_module
    from unimodal.training.hardware import release_freed_memory

    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert release_freed_memory() is True  # glibc's malloc_trim found and called
    calls = []
    monkeypatch.setattr(train_module, "TRIM_EVERY", 2)
    monkeypatch.setattr(train_module, "release_freed_memory", lambda: calls.append(1) or True)
    train(tmp_path / "run", [str(tiny_scenes)], tiny_codec_dir, _cfg(steps=4), progress=False)
    assert len(calls) == 2  # after steps 2 and 4


def test_a_resumed_runs_step_seconds_count_every_process(tiny_codec_dir, tiny_scenes, tmp_path):
    from unimodal.recipe import step_seconds

    train(tmp_path / "run", [str(tiny_scenes)], tiny_codec_dir, _cfg(steps=2), progress=False)
    train(tmp_path / "run", [str(tiny_scenes)], tiny_codec_dir, _cfg(steps=4), resume=True, progress=False)
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [h["step"] for h in history] == [1, 2, 3, 4] and all(h["step_s"] > 0 for h in history)
    if Path("/proc/self/statm").is_file():
        assert all(h["rss_mb"] > 10 for h in history)  # the process's memory after each step
    assert step_seconds(history) == pytest.approx(sum(h["step_s"] for h in history))
    assert step_seconds([{"step": 1, "train_loss": 1.0}]) is None  # logged before steps were timed: unknown


def test_fit_steps_times_whole_steps_and_revises_the_total_when_the_machine_changes_speed():
    from unimodal.training import train as train_mod

    ends = [10.0, 11.0, 12.0, 13.0, 16.0, 17.0]  # a 10 s first step, then 1 s, with a 3 s step (a checkpoint)
    assert train_mod.seconds_per_step(ends, window=100) == pytest.approx(7.0 / 5)  # the first step left out
    assert train_mod.seconds_per_step(ends, window=2) == pytest.approx(4.0 / 2)  # the recent window
    with pytest.raises(ValueError, match="at least two steps"):
        train_mod.seconds_per_step([1.0], window=5)
    # during the warmup any change is taken; after it only one beyond the tolerance
    assert train_mod.refitted_total(1000, 1050, done=50, warmup=100) == 1050
    assert train_mod.refitted_total(1000, 1050, done=300, warmup=100) == 1000
    assert train_mod.refitted_total(1000, 400, done=300, warmup=100) == 400  # slowed down: the cosine still ends
    assert train_mod.refitted_total(1000, 1500, done=300, warmup=100) == 1500

    class Budget:  # 100 s left
        end = train_mod.time.monotonic() + 100 + train_mod.SAVE_RESERVE_S

    fitted = train_mod.fitted_steps(10, 1.0, Budget, asked=5000)
    assert 10 + 90 <= fitted <= 10 + 98  # what 100 s hold at 1 s a step, a little kept back
    assert train_mod.fitted_steps(10, 1.0, Budget, asked=50) == 50  # never beyond the command's steps
    assert train_mod.fitted_steps(10, 1000.0, Budget, asked=50) == 11  # always one more step


def test_fit_steps_fits_a_run_to_its_budget(tiny_codec_dir, tiny_scenes, tmp_path, capsys, monkeypatch):
    from unimodal.training import train as train_mod

    monkeypatch.setattr(train_mod, "FIT_AFTER_STEPS", 3)
    monkeypatch.setattr(train_mod, "SAVE_RESERVE_S", 1.0)
    model_dir = train(tmp_path / "fit", [str(tiny_scenes)], tiny_codec_dir, _cfg(steps=100_000), progress=True,
                      options=RunOptions(max_minutes=0.2, fit_steps=True))
    out = capsys.readouterr().out
    assert "--fit-steps:" in out and "validation and checkpoints included" in out
    record = json.loads((model_dir / "training_config.json").read_text())
    history = json.loads((tmp_path / "fit" / "history.json").read_text())
    assert 3 < record["steps"] < 100_000 and record["steps_done"] == len(history) <= record["steps"]


def test_bench_recipe_refuses_a_thread_count_below_one(tmp_path, capsys):
    from unimodal.cli import main

    assert main(["bench", "recipe", "--out", str(tmp_path / "r"), "--variant", "a", "--threads", "0"]) == 2
    assert "--threads must be a positive number" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # refused before any work


def test_recipe_variants_are_typed_checked_and_compared_pairwise(tmp_path):
    from unimodal.recipe import RecipeBudget, format_report, parse_variant, run_recipe

    assert parse_variant(["first", "loss_norm=maskable", "sparse_head=false", "lr=2e-3"]) == \
        ("first", {"loss_norm": "maskable", "sparse_head": False, "lr": 0.002})
    for bad, said in ((["x", "no_such=1"], "'no_such=1' is not KEY=VALUE with KEY a training setting"),
                      (["x", "lr"], "'lr' is not KEY=VALUE"), (["x", "sparse_head=maybe"], "must be true or false"),
                      (["x", "steps=many"], "cannot read 'many' as int")):
        with pytest.raises(InputError, match=f"variant 'x': .*{re.escape(said)}"):
            parse_variant(bad)
    assert parse_variant(["c128", f"codecs={tmp_path}"]) == ("c128", {"codecs": str(tmp_path.resolve())})
    assert parse_variant(["paced", "audio_position_rate=auto"]) == ("paced", {"audio_position_rate": "auto"})
    assert parse_variant(["paced", "audio_position_rate=0.25"]) == ("paced", {"audio_position_rate": 0.25})
    with pytest.raises(InputError, match="variant 'paced': audio_position_rate must be 'auto'"):
        parse_variant(["paced", "audio_position_rate=fast"])
    assert parse_variant(["cf", "content_first=3"]) == ("cf", {"content_first": 3.0})
    with pytest.raises(InputError, match="content_first"):
        parse_variant(["cf", "content_first=-1"])
    with pytest.raises(InputError, match="codecs='nowhere' is not a folder"):
        parse_variant(["c128", "codecs=nowhere"])
    judged = {"text->image": {"accuracy": 0.25, "verdicts": [1, 0, 0, 0]},
              "image->text": {"accuracy": 0.5, "verdicts": [1, 1, 0, 0]}}
    better = {"text->image": {"accuracy": 0.75, "verdicts": [1, 1, 1, 0]},
              "image->text": {"accuracy": 0.5, "verdicts": [1, 1, 0, 0]}}
    report = {"budget": {"preset": "mini", "steps": 10, "batch_size": 4, "lr": 1e-3, "data": "scenes",
                         "tasks": {}, "eval_n": 4},
              "variants": {"first": {"overrides": {}, "seconds": 60, "judged": judged},
                           "real": {"overrides": {"loss_norm": "real"}, "seconds": 30, "judged": better}}}
    table = format_report(report)
    assert "+0.500" in table and "+0.000" in table  # paired differences from the first variant
    first = next(line for line in table.splitlines() if line.startswith("first"))
    assert first.count("(the reference)") == 2 and "+0.000 [+0.000" not in first  # no difference from itself
    assert "pairs (alike/scenes)" in table.splitlines()[2] and first.rstrip().endswith("-  defaults")  # no pairs kept
    better["image->text"]["by_objects"] = {"1": {"n": 2, "accuracy": 1.0},
                                           "2": {"n": 2, "accuracy": 0.0, "alike": {"captions": 2, "read": 2.5,
                                                                                     "truth": 0.5}}}
    real = next(line for line in format_report(report).splitlines() if line.startswith("real"))
    assert "0.000 (2.50/0.50)" in real  # the two-object scenes, and how alike their captions' objects read
    from unimodal.recipe import trained_directions

    # a variant that trains drawing alone is judged on drawing alone (the model refuses to read pictures)
    assert trained_directions(RecipeBudget(), {}) == ["text->image", "image->text"]
    assert trained_directions(RecipeBudget(), {"task_weights": {"text->image": 1.0}}) == ["text->image"]
    assert trained_directions(RecipeBudget(), {"task_weights": {"audio->text": 1.0}}) == ["audio->text"]
    from unimodal.recipe import probe_source

    assert [probe_source(d) for d in (["text->image", "image->text"], ["audio->text"], ["text->image"])] == \
        ["image", "audio", None]  # the probe hears a variant that learned only to hear
    with pytest.raises(InputError, match="variant 'speak' trains none of the directions bench recipe judges"):
        run_recipe(RecipeBudget(), [("speak", {"task_weights": {"text->audio": 1.0}})], None, tmp_path / "none")
    assert not (tmp_path / "none" / "speak").exists()  # refused before anything trained
    report["variants"]["draw"] = {"overrides": {"task_weights": {"text->image": 1.0}}, "seconds": 30, "probe": {},
                                  "judged": {"text->image": better["text->image"]}}
    row = next(line for line in format_report(report).splitlines() if line.startswith("draw"))
    assert "0.750" in row and "nan" in row and "+0.500" in row
    assert "audio->text" not in format_report(report)  # the column appears once a variant was judged hearing
    report["variants"]["hear"] = {"overrides": {"task_weights": {"audio->text": 1.0}}, "seconds": 30, "probe": {},
                                  "judged": {"audio->text": {"accuracy": 0.5, "verdicts": [1, 0, 1, 0]}}}
    table = format_report(report)
    assert "audio->text" in table.splitlines()[2]
    row = next(line for line in table.splitlines() if line.startswith("hear"))
    assert "0.500" in row and row.count("nan") == 2
    report["variants"] = {"a-variant-with-a-long-name": report["variants"]["hear"], **report["variants"]}
    lines = format_report(report).splitlines()  # the reference judged on hearing alone: '-' where it has no verdicts
    assert lines[3].startswith("a-variant-with-a-long-name ") and lines[3].count("(the reference)") == 1
    assert lines[2].index("train min") > len("a-variant-with-a-long-name")  # the name column widened to fit it
    (tmp_path / "recipe.json").write_text(json.dumps({"budget": {"steps": 1}, "variants": {}}))
    with pytest.raises(InputError, match="another budget"):
        run_recipe(RecipeBudget(), [("first", {})], None, tmp_path)


def test_a_variant_that_never_drew_reads_captions_without_the_rival_check(tmp_path, monkeypatch):
    """The rival check asks the drawing direction which caption the picture is likelier under: a variant trained
    on reading alone would choose at random, so its captions are judged as read."""
    import unimodal.eval_cases
    import unimodal.inference.evaluate
    import unimodal.pipeline
    from unimodal.recipe import RecipeBudget, judge_variant

    given = []

    def fake_evaluate(pipe, cases, directions, settings, **kwargs):
        given.append((directions, settings))
        return {"figures": {d: {"accuracy": 1.0} for d in directions},
                "_samples": {d: (None, None, [{"correct": True}]) for d in directions}}

    monkeypatch.setattr(unimodal.inference.evaluate, "evaluate", fake_evaluate)
    speech = []
    monkeypatch.setattr(unimodal.eval_cases, "load_cases", lambda *a, **k: (speech.append(k["speech"]), ([], None))[1])
    monkeypatch.setattr(unimodal.pipeline.UniModal, "from_pretrained", classmethod(lambda cls, *a, **k: None))
    judge_variant(RecipeBudget(), tmp_path, False, ["image->text"])
    judge_variant(RecipeBudget(), tmp_path, False, ["text->image", "image->text"])
    judge_variant(RecipeBudget(), tmp_path, False, ["audio->text"])
    assert given == [(["image->text"], {"rivals": False}), (["text->image", "image->text"], {}),
                     (["audio->text"], {"rivals": False})]
    assert speech == [False, False, True]  # the spoken captions are loaded only for hearing


def test_a_checkpoint_older_than_a_setting_resumes_as_it_was_trained(tmp_path):
    """Changing a default (complementary masking, per-real-token normalisation, the sparse head) must not change
    a run that is resumed: keys its checkpoint predates take what it was trained with."""
    from dataclasses import asdict

    from unimodal.training.checkpoint import resumed_config, save_atomic

    old = {k: v for k, v in asdict(TrainConfig(steps=7)).items() if k not in ("masking", "loss_norm", "sparse_head")}
    save_atomic({"config": old}, tmp_path / "checkpoint.pt")
    cfg, _ = resumed_config(TrainConfig, None, tmp_path / "checkpoint.pt", resume=True)
    assert (cfg.masking, cfg.loss_norm, cfg.sparse_head, cfg.steps) == ("independent", "maskable", False, 7)
    new = TrainConfig()
    assert (new.masking, new.loss_norm, new.sparse_head) == ("complementary", "real", True)  # what new runs use


def test_partition_masks_cover_each_target_slot_once_across_four_rows():
    from unimodal.training.objective import PARTITION_ROWS, rows_per_sample

    layout = toy_layout()
    batch = mixed_batch(layout, seed=3)
    b = batch.batch
    n = b.ids.shape[0]
    t = torch.tensor([0.1, 0.4, 0.8, 1.0])
    spec = LossSpec(TargetVocab.of(layout), masking="partition")
    rows = spec.mask(b.ids, batch.maskable, t, torch.Generator().manual_seed(0), segment_ids=b.segment_ids)
    assert rows_per_sample("partition") == PARTITION_ROWS == rows.masked.shape[0] // n
    masks = rows.masked.view(PARTITION_ROWS, n, -1)
    # the first rows are the random mask itself; every maskable slot is masked in exactly one row, no other slot
    assert torch.equal(masks[0], mask_targets(b.ids, batch.maskable, t, torch.Generator().manual_seed(0)).masked)
    assert torch.equal(masks.sum(dim=0), batch.maskable.long())
    # the complement is really split: at t = 0.1 each extra row holds part of it, none the whole
    rest = batch.maskable[0] & ~masks[0, 0]
    assert all(0 < int(masks[k, 0].sum()) < int(rest.sum()) for k in range(1, PARTITION_ROWS))
    assert torch.allclose(rows.t.view(PARTITION_ROWS, n)[1], ((1 - t) / (PARTITION_ROWS - 1)).clamp_min(1e-3))
    assert torch.equal(rows.noisy_ids == 1, rows.masked)
    torch.manual_seed(0)
    model = DiT.from_preset("tiny", layout.vocab_size)
    loss, acc = step_loss(model, batch, MaskSchedule(), torch.Generator().manual_seed(0), spec, t=t)
    assert torch.isfinite(loss) and 0 <= float(acc) <= 1
    assert TrainConfig(masking="partition").loss_spec(layout).masking == "partition"


def test_bench_recipe_trains_judges_and_probes_each_variant_once_and_names_the_code(tmp_path, monkeypatch):
    """run_recipe's bookkeeping, with training and judging stubbed: each variant trained, judged on the directions
    it trains and probed once, the report saved after each, the code that judged it named; the same command again
    trains and judges nothing more."""
    import unimodal.recipe as recipe
    from unimodal.core.provenance import code_version

    calls = []
    monkeypatch.setattr(recipe, "train_variant", lambda budget, name, overrides, codec_dir, out, progress: (
        calls.append(("train", name)) or {"run": str(out / name), "seconds": 1.0}))
    monkeypatch.setattr(recipe, "judge_variant", lambda budget, run, progress, directions: (
        calls.append(("judge", run.name, tuple(directions))) or {d: {"accuracy": 0.5} for d in directions}))
    monkeypatch.setattr(recipe, "probe_variant", lambda budget, run, source: (
        calls.append(("probe", run.name, source)) or {"accuracy": 0.25}))
    variants = [("both", {}), ("read", {"task_weights": {"image->text": 1.0}})]
    report = recipe.run_recipe(recipe.RecipeBudget(steps=4), variants, None, tmp_path, progress=False)
    assert calls == [("train", "both"), ("judge", "both", ("text->image", "image->text")), ("probe", "both", "image"),
                     ("train", "read"), ("judge", "read", ("image->text",)), ("probe", "read", "image")]
    for name, overrides in variants:
        row = report["variants"][name]
        assert row["overrides"] == overrides and row["probe"] == {"accuracy": 0.25} and row["code"] == code_version()
    assert json.loads((tmp_path / "recipe.json").read_text()) == report
    calls.clear()
    assert recipe.run_recipe(recipe.RecipeBudget(steps=4), variants, None, tmp_path, progress=False) == report
    assert calls == []  # judged variants are not trained or judged again
