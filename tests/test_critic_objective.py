"""The learned critic's training objective (training/critic.py) on tiny models: its drafts (model fills, partial
commits, code and caption swaps, labels = token inequality), a loss that is finite and reaches the critic head only
where it should, a critic that is entirely out of the step at weight 0 (no gradient, not in the optimizer, an old
checkpoint's optimizer state still resumes), a critic that learns to flag swapped tokens, and model folders that
say whether their critic was trained."""

import json

import numpy as np
import pytest
import torch

from unimodal.backbone.dit import DiT
from unimodal.core.errors import InputError
from unimodal.core.grammar import COLORS, SHAPES, SIZES
from unimodal.tokenizers_mm.layout import MASK, SEGMENT_IDS
from unimodal.training.critic import (AttributeSwaps, CriticDraft, CriticSpec, critic_drafts, critic_loss,
                                      still_masked, swap_codes)
from unimodal.training.objective import mask_targets
from unimodal.training.schedule import MaskSchedule
from unimodal.training.tasks import Task, build_example, collate_examples
from unimodal.training.train import TrainConfig, _optimizer, step_loss, trainable_optimizer_state

from conftest import mixed_batch, toy_layout  # noqa: E402


def _critic_params(model):
    return {id(p) for p in model.critic_head.parameters()}


def _drafted(spec=None):
    """A tiny model's drafts of a four-task batch (every row critiqued): (layout, batch, masked batch, rows, draft,
    spec)."""
    layout = toy_layout()
    batch = mixed_batch(layout)
    b = batch.batch
    torch.manual_seed(0)
    model = DiT.from_preset("tiny", layout.vocab_size)
    masked = mask_targets(b.ids, batch.maskable, torch.tensor([0.5, 0.7, 0.9, 0.6]), torch.Generator().manual_seed(0))
    out = model(masked.noisy_ids, masked.t, b.segment_ids, b.positions, batch.is_target, b.attention_mask)
    spec = spec or CriticSpec.of(layout, weight=0.1, share=1.0, swap_rate=0.5)
    rows, draft = critic_drafts(model.output_logits, out.hidden, b.segment_ids, masked, spec,
                                torch.Generator().manual_seed(1))
    return layout, batch, masked, rows, draft, spec


def test_drafts_commit_the_most_confident_fills_and_label_what_differs_from_the_truth():
    layout, batch, masked, rows, draft, spec = _drafted()
    b = batch.batch
    assert torch.equal(rows, torch.arange(4))
    left = draft.ids == MASK
    assert torch.equal(left | draft.scored, batch.maskable[rows] & (left | draft.scored))  # only target slots
    assert not (left & draft.scored).any() and (left <= masked.masked).all()  # still masked: never scored
    assert torch.equal(draft.wrong, draft.scored & (draft.ids != b.ids))  # wrong = token inequality
    assert torch.equal(draft.ids[~batch.maskable], b.ids[~batch.maskable])  # conditions untouched
    assert torch.allclose(draft.t, left.sum(1) / batch.maskable.sum(1))  # the draft's own mask ratio
    for segment in (SEGMENT_IDS["image"], SEGMENT_IDS["audio"]):  # fills and swaps stay in the modality's ids
        allowed = spec.vocab.index[segment][draft.ids[draft.scored & (b.segment_ids == segment)]]
        assert (allowed >= 0).all()
    # a row commits its most confident draws first
    confidence = torch.tensor([[0.9, 0.1, 0.5, 0.0]])
    assert still_masked(torch.tensor([[True, True, True, False]]), confidence, torch.tensor([2 / 3])).tolist() == \
        [[False, True, False, False]]


def test_drafts_take_their_labels_from_the_decoded_content_when_given():
    class NothingDiffers:  # a codec under which every code decodes alike: only captions can be wrong
        def wrong(self, ids, targets, segment_ids):
            return (ids != targets) & (segment_ids == SEGMENT_IDS["text"])

    spec = CriticSpec.of(toy_layout(), weight=0.1, share=1.0, swap_rate=0.5, labels=NothingDiffers())
    _, batch, _, _, draft, spec = _drafted(spec)
    b = batch.batch
    assert torch.equal(draft.wrong, draft.scored & (draft.ids != b.ids) & (b.segment_ids == SEGMENT_IDS["text"]))
    assert (draft.scored & (draft.ids != b.ids) & (b.segment_ids == SEGMENT_IDS["image"])).any()  # not called wrong
    assert spec.to("cpu").labels is spec.labels


def test_code_swaps_never_keep_the_code_and_leave_end_and_pad_alone():
    layout = toy_layout()
    spec = CriticSpec.of(layout, 0.1, 1.0, 0.5)
    low, size = spec.code_ranges[SEGMENT_IDS["image"]]
    ids = (low + torch.arange(64) % size)[None]
    segments = torch.full_like(ids, SEGMENT_IDS["image"])
    swapped = swap_codes(ids, segments, torch.ones_like(ids, dtype=torch.bool), torch.ones(1), spec,
                         torch.Generator().manual_seed(0))
    assert (swapped != ids).all() and ((swapped >= low) & (swapped < low + size)).all()
    pad = torch.zeros_like(ids)  # PAD is no code: never swapped
    assert torch.equal(swap_codes(pad, segments, torch.ones_like(ids, dtype=torch.bool), torch.ones(1), spec,
                                  torch.Generator().manual_seed(0)), pad)


def test_caption_swaps_replace_an_attribute_by_another_of_its_kind(tiny_codec_dir):
    from unimodal.tokenizers_mm.text import TextCodec
    from unimodal.training.tokens import CodecStack

    layout = CodecStack.load(tiny_codec_dir).layout
    codec = TextCodec.from_pretrained(tiny_codec_dir / "text")
    swaps = AttributeSwaps.of(codec, layout)
    assert swaps is not None
    caption = codec.encode_one("a small red circle on the left") + layout.offset("text")
    ids = caption[None]
    out = swaps.swap(ids, torch.ones_like(ids, dtype=torch.bool), torch.ones(1), torch.Generator().manual_seed(0))
    changed = (out != ids)[0]
    assert changed.any()
    assert (swaps.kind[ids[0][changed]] == swaps.kind[out[0][changed]]).all()  # a colour for a colour ...
    words = codec.decode_one((out[0] - layout.offset("text")).tolist()).split()
    assert words[0] == "a" and words[4:] == ["on", "the", "left"]  # ... and nothing else touched
    assert words[1] in SIZES and words[2] in COLORS and words[3] in SHAPES
    assert words[1:4] != ["small", "red", "circle"]


def test_the_critic_loss_is_finite_and_reaches_the_head_only_at_scored_slots():
    logits = torch.zeros(2, 5, requires_grad=True)
    scored = torch.tensor([[True, True, False, False, True], [False, True, True, False, False]])
    wrong = scored & torch.tensor([[True, False, False, True, False], [False, False, True, False, False]])
    loss = critic_loss(logits, CriticDraft(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2), scored, wrong))
    loss.backward()
    assert torch.isfinite(loss) and loss.item() == pytest.approx(np.log(2))
    assert torch.equal(logits.grad != 0, scored)
    # through the step: the critic head gets a gradient from the critic term, and none without it
    layout = toy_layout()
    batch = mixed_batch(layout, seed=2)
    torch.manual_seed(0)
    model = DiT.from_preset("tiny", layout.vocab_size)
    with torch.no_grad():
        model.critic_head[-1].weight.normal_(std=0.1)
    for masking in ("independent", "complementary"):
        for sparse in (True, False):
            cfg = TrainConfig(critic_weight=0.1, masking=masking, sparse_head=sparse)
            model.zero_grad(set_to_none=True)
            loss, _ = step_loss(model, batch, MaskSchedule(), torch.Generator().manual_seed(0), cfg.loss_spec(layout))
            loss.backward()
            assert torch.isfinite(loss), (masking, sparse)
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.critic_head.parameters())
    model.zero_grad(set_to_none=True)
    loss, _ = step_loss(model, batch, MaskSchedule(), torch.Generator().manual_seed(0), TrainConfig().loss_spec(layout))
    loss.backward()
    assert all(p.grad is None for p in model.critic_head.parameters())
    assert all(p.grad is not None for n, p in model.named_parameters() if not n.startswith("critic_head"))


def test_at_weight_0_the_critic_head_is_out_of_the_step_and_the_optimizer():
    layout = toy_layout()
    cfg = TrainConfig()
    assert cfg.critic_weight == 0 and cfg.loss_spec(layout).critic is None
    torch.manual_seed(0)
    model = DiT.from_preset("tiny", layout.vocab_size)
    model.critic_head.requires_grad_(cfg.trains_critic)
    optimizer = _optimizer(model, cfg, torch.device("cpu"))
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert not in_optimizer & _critic_params(model)
    assert len(in_optimizer) == sum(1 for p in model.parameters()) - len(_critic_params(model))
    loss, _ = step_loss(model, mixed_batch(layout), MaskSchedule(), torch.Generator().manual_seed(0),
                        cfg.loss_spec(layout))
    loss.backward()
    assert all(p.grad is None for p in model.critic_head.parameters())
    # a checkpoint from before the critic objective (every parameter in the optimizer) still resumes
    old = DiT.from_preset("tiny", layout.vocab_size)
    old_optimizer = torch.optim.AdamW(old.parameters())
    old(**_inputs(layout)).logits.sum().backward()
    old_optimizer.step()
    optimizer.load_state_dict(trainable_optimizer_state(old_optimizer.state_dict(), model))
    assert len(optimizer.state_dict()["state"]) == len(in_optimizer)
    with pytest.raises(InputError, match="critic"):
        TrainConfig(objective="ar", critic_weight=0.1)
    with pytest.raises(InputError, match="critic_weight"):
        TrainConfig(critic_weight=-1.0)


def _inputs(layout):
    b = mixed_batch(layout).batch
    return dict(ids=b.ids, t=torch.full((4,), 0.5), segment_ids=b.segment_ids, positions=b.positions,
                is_target=mixed_batch(layout).is_target, attention_mask=b.attention_mask)


def _striped_batch(layout, rows: int, generator: torch.Generator):
    """Toy pictures: every code of a picture is the same one of 4 codes (of 16), so a swapped code stands out by
    itself (a code the data never holds) or against its picture (another of the 4)."""
    codes = torch.randint(0, 4, (rows,), generator=generator)
    return collate_examples([build_example(layout, {"image": torch.full((64,), int(c))}, Task.parse("->image"))
                             for c in codes])


def test_a_trained_critic_scores_swapped_codes_above_clean_ones():
    """60 steps with the critic on: at t = 0 the head's "wrong" logit is higher at swapped codes than at the
    others of the same pictures (AUROC over a held-out batch; untrained it is 0.5, with the labels inverted ~0)."""
    layout = toy_layout()
    torch.manual_seed(0)
    model = DiT.from_preset("tiny", layout.vocab_size)
    model.critic_head.requires_grad_(True)
    cfg = TrainConfig(critic_weight=1.0, critic_share=0.5, critic_swap_rate=0.3)
    spec = cfg.loss_spec(layout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):
        loss, _ = step_loss(model, _striped_batch(layout, 16, generator), MaskSchedule(), generator, spec)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    held_out = _striped_batch(layout, 16, torch.Generator().manual_seed(99))
    b = held_out.batch
    swapped = held_out.maskable & (b.segment_ids == SEGMENT_IDS["image"]) & \
        (torch.rand(b.ids.shape, generator=torch.Generator().manual_seed(5)) < 0.1)
    low, size = layout.offset("image"), layout.codebook_size("image")
    shift = 1 + torch.randint(0, size - 1, b.ids.shape, generator=torch.Generator().manual_seed(6))
    ids = torch.where(swapped, low + (b.ids - low + shift) % size, b.ids)
    with torch.no_grad():
        logits = model(ids, torch.zeros(16), b.segment_ids, b.positions, held_out.is_target, b.attention_mask).critic
    content = held_out.maskable & (b.segment_ids == SEGMENT_IDS["image"])
    bad, good = logits[swapped], logits[content & ~swapped]
    auroc = (bad[:, None] > good[None, :]).float().mean().item()
    assert auroc > 0.85, auroc


# ---- model folders say whether their critic was trained; critic="learned" refuses one that was not ---------------


def test_a_run_with_the_critic_writes_a_folder_whose_learned_critic_works(tiny_codec_dir, tiny_scenes, tmp_path):
    from conftest import write_tiny_model

    from unimodal import UniModal
    from unimodal.core.errors import SettingError
    from unimodal.training.train import train

    cfg = TrainConfig(preset="tiny", steps=2, batch_size=4, warmup=1, val_every=2, val_samples=2, checkpoint_every=2,
                      bf16=False, critic_weight=0.1)
    trained = train(tmp_path / "run", [str(tiny_scenes)], tiny_codec_dir, cfg, progress=False)
    assert json.loads((trained / "training_config.json").read_text())["critic_trained"] is True
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    model = DiT.from_preset("tiny", 10)  # parameter count only
    assert len(state["optimizer"]["param_groups"][0]["params"]) == sum(1 for _ in model.parameters())
    untrained = write_tiny_model(tiny_codec_dir, tmp_path / "untrained")
    assert json.loads((untrained / "training_config.json").read_text())["critic_trained"] is False
    prompt = "a small red circle on the left"
    pipe = UniModal.from_pretrained(trained)
    result = pipe.generate(text=prompt, to="image", seed=0, steps=2)
    report = pipe.critique(result, text=prompt, critic="learned")
    assert report.forward_passes == 1 and all(0 <= s <= 1 for s in report.scores["image"])
    old = UniModal.from_pretrained(untrained)
    for call in (lambda: old.critique(result, text=prompt, critic="learned"),
                 lambda: old.refine(result, text=prompt, critic="learned")):
        with pytest.raises(SettingError, match="never trained.*--critic-weight.*--critic-only.*merge-models"):
            call()
    confidence = old.critique(result, text=prompt, critic="confidence")  # the training-free critic still works
    assert len(confidence.scores["image"]) == len(result.token_ids["image"])
    assert all(0 <= s <= 1 for s in confidence.scores["image"])


def test_bench_refine_measures_critics_on_the_models_own_mistakes(tiny_codec_dir, tmp_path, capsys):
    pytest.importorskip("cv2")
    from conftest import write_tiny_model

    from unimodal.cli import main

    model = write_tiny_model(tiny_codec_dir, tmp_path / "model", max_text_len=32)

    def run(*args):
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    code, out, err = run("bench", "refine", "--model", model, "--n", "2", "--mistakes", "0.5",
                         "--critics", "confidence,content,random", "--out", tmp_path / "mistakes")
    assert code == 0, err
    report = json.loads((tmp_path / "mistakes" / "bench_refine.json").read_text())
    assert report["tokens"] == 2 * 32 and 0 <= report["wrong"] <= report["tokens"]  # half of 64 codes, twice
    assert 0 <= report["decoded"]["wrong"] <= report["wrong"]  # wrong by decoded content: a subset
    assert "AUROC*" in out and all("auroc_decoded" in row for row in report["critics"].values())
    assert all(row["auroc"] is None or 0 <= row["auroc"] <= 1 for row in report["critics"].values())
    assert "95% interval" in out and all("auroc_decoded_ci95" in row for row in report["critics"].values())
    # every case's scores and labels are kept, so two reports of the same cases pair critic by critic
    assert len(report["cases"]) == 2 and all(len(c["wrong"]) == 32 == len(c["scores"]["content"])
                                             for c in report["cases"])
    code, out, err = run("bench", "compare", tmp_path / "mistakes", tmp_path / "mistakes" / "bench_refine.json",
                         "--out", tmp_path / "self.json")
    assert code == 0, err
    assert "paired difference" in out and "content" in out and "reference model" in out
    # a report against itself: each critic's two AUROCs equal, and where a difference can be computed it is
    # exactly zero, its interval too (the resampled cases are the same for both sides)
    compared = json.loads((tmp_path / "self.json").read_text())["critics"]
    assert sorted(compared) == ["confidence", "content", "random"]
    for critic, row in compared.items():
        assert row["reference"] == row["candidate"], critic
        assert row["difference"] is None or (row["difference"]["mean"] == 0
                                             and row["difference"]["ci95"] == [0, 0]), critic
    assert any(row["difference"] is not None for row in compared.values())
    reseeded = dict(report, seed=1)  # other cases (another seed) are refused
    (tmp_path / "reseeded.json").write_text(json.dumps(reseeded))
    code, out, err = run("bench", "compare", tmp_path / "mistakes", tmp_path / "reseeded.json")
    assert code != 0 and "seed" in err and "Traceback" not in err
    old = {k: v for k, v in report.items() if k != "cases"}  # a report written before the cases were kept
    (tmp_path / "old.json").write_text(json.dumps(old))
    code, out, err = run("bench", "compare", tmp_path / "old.json", tmp_path / "mistakes")
    assert code != 0 and "run the bench again" in err
    code, out, err = run("bench", "compare", tmp_path / "mistakes", tmp_path / "reseeded-missing")
    assert code != 0 and "Traceback" not in err
    # a report kept gzip-compressed (as the repository keeps its largest) pairs the same; a broken one is refused
    import gzip
    (tmp_path / "kept.json.gz").write_bytes(gzip.compress(json.dumps(report).encode()))
    code, again, err = run("bench", "compare", tmp_path / "mistakes", tmp_path / "kept.json.gz")
    assert code == 0, err
    assert "paired difference" in again and "content" in again
    (tmp_path / "broken.json.gz").write_bytes(b"not gzip")
    code, out, err = run("bench", "compare", tmp_path / "mistakes", tmp_path / "broken.json.gz")
    assert code != 0 and "broken.json.gz" in err and "Traceback" not in err
    code, out, err = run("bench", "refine", "--model", model, "--n", "2", "--mistakes", "0.5",
                         "--critics", "confidence,learned", "--out", tmp_path / "refused")
    assert code != 0 and "never trained" in err and not (tmp_path / "refused").exists()


def test_critic_only_trains_the_head_of_a_trained_model_and_nothing_else(tiny_codec_dir, tiny_scenes, tmp_path):
    """--critic-only: the starting model's weights come out bit for bit the same except the critic head, which
    learned (and the folder says so); the loss is the critic's alone; it needs a model to start from."""
    from safetensors.torch import load_file

    from unimodal.core.paths import model_hash
    from unimodal.training.train import train

    base = dict(preset="tiny", steps=3, batch_size=4, warmup=1, val_every=3, val_samples=2, checkpoint_every=3,
                bf16=False)
    first = train(tmp_path / "gen", [str(tiny_scenes)], tiny_codec_dir, TrainConfig(**base), progress=False)
    cfg = TrainConfig(**base, critic_only=True, critic_share=1.0, init_from=str(first), lr=1e-2)
    spec = cfg.loss_spec(toy_layout())
    assert cfg.trains_critic and spec.critic_only and spec.critic.weight == 1.0 and spec.to("cpu").critic_only
    started_from = model_hash(first)
    trained = train(tmp_path / "critic", [str(tiny_scenes)], tiny_codec_dir, cfg, progress=False)
    record = json.loads((trained / "training_config.json").read_text())
    generator = json.loads((first / "training_config.json").read_text())
    assert record["critic_trained"] is True and generator["critic_trained"] is False
    # the folder describes its generator (the starting model's run), the critic run beside it
    assert {k: v for k, v in record.items() if k not in ("critic_trained", "critic_head")} == \
        {k: v for k, v in generator.items() if k != "critic_trained"}
    assert record["critic_head"]["critic_only"] is True and record["critic_head"]["init_from"] == str(first)
    assert generator["steps_done"] == 3 and record["critic_head"]["steps_done"] == 3
    # the lineage by content: the starting folder's hash when the run began (None: a run from scratch)
    assert record["critic_head"]["init_from_hash"] == started_from and generator["init_from_hash"] is None
    assert cfg.init_from_hash is None  # the caller's config is not changed by the run

    def weights(folder):
        files = sorted((folder / "backbone").glob("*.safetensors"))
        return {k: v for f in files for k, v in load_file(f).items()}

    before, after = weights(first), weights(trained)
    assert before.keys() == after.keys()
    head = {k for k in before if k.startswith("critic_head.")}
    assert head and all(torch.equal(before[k], after[k]) for k in before if k not in head)
    assert any(not torch.equal(before[k], after[k]) for k in head)
    history = torch.load(tmp_path / "critic" / "checkpoint.pt", weights_only=False)["history"]
    losses = [h["train_loss"] for h in history if "train_loss" in h]
    assert losses and all(0 < loss < 1.5 for loss in losses), losses  # the critic's BCE alone (~0.69 untrained)
    with pytest.raises(InputError, match="--init-from"):
        TrainConfig(critic_only=True)
    with pytest.raises(InputError, match="critic"):
        TrainConfig(critic_only=True, init_from=str(first), objective="ar")
