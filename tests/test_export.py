"""Exporting codecs and models for shipping (training/export.py): float16 on disk, float32 when loaded, the same
codes and tokens as the source, and no paths of the exporting machine in the shipped configs."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from unimodal.training.export import export_codecs, export_model
from unimodal.training.tokens import CodecStack
from unimodal.core.errors import DataError, InputError


def _weights(folder):
    return [tensor for path in sorted(folder.rglob("*.safetensors")) for tensor in load_file(path).values()]


def _assert_shippable(folder):
    assert all(t.dtype == torch.float16 for t in _weights(folder) if t.is_floating_point())
    for config in folder.rglob("config.json"):
        assert "_name_or_path" not in json.loads(config.read_text()), config


def test_exported_codecs_keep_their_codes(tiny_codec_dir, tmp_path):
    out = export_codecs(tiny_codec_dir, tmp_path / "shipped")
    assert sorted(p.name for p in out.iterdir()) == ["audio", "image", "text"]
    assert not (tmp_path / "shipped.tmp").exists()
    _assert_shippable(out)
    source, shipped = CodecStack.load(tiny_codec_dir), CodecStack.load(out)
    assert next(shipped.image.model.parameters()).dtype == torch.float32
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
    waves = [(0.1 * rng.standard_normal(12_000)).astype(np.float32)]
    # float16 rounding may flip a code whose two nearest entries tie to 3 decimals; these tiny codecs have none
    assert torch.equal(source.image.encode(images), shipped.image.encode(images))
    assert torch.equal(source.audio.encode(waves)[0], shipped.audio.encode(waves)[0])
    assert torch.equal(shipped.text.encode(["a red circle"])[0], source.text.encode(["a red circle"])[0])


def test_exported_model_loads_and_refuses_a_non_model(tiny_model_dir, tmp_path):
    from unimodal.pipeline import UniModal

    out = export_model(tiny_model_dir, tmp_path / "model")
    _assert_shippable(out)
    source, shipped = UniModal.from_pretrained(tiny_model_dir), UniModal.from_pretrained(out)
    for (name, a), (_, b) in zip(source.backbone.state_dict().items(), shipped.backbone.state_dict().items()):
        assert b.dtype == a.dtype and torch.equal(b, a.half().to(a.dtype)), name  # float16-rounded, loaded back
    assert shipped.layout == source.layout
    result = shipped.generate(text="a red circle", to="image", steps=2, seed=0)
    assert len(result.token_ids["image"]) == 64 and result.image.size == (64, 64)
    with pytest.raises(DataError, match="not a model folder"):
        export_model(tmp_path, tmp_path / "nothing")


def test_a_model_folder_keeps_its_own_sampler_defaults_through_export(tiny_caption_model_dir, tmp_path):
    """scheduler/scheduler_config.json in a model folder sets its sampler defaults (here: captions from nothing left
    to right, as r13 stores them); export carries it; a bad one is refused by name."""
    import shutil

    from unimodal.inference.schedulers import LEFT_TO_RIGHT_TEXT, MaskedDiffusionScheduler
    from unimodal.pipeline import UniModal

    folder = tmp_path / "model"
    shutil.copytree(tiny_caption_model_dir, folder)
    plain = UniModal.from_pretrained(folder).generate(to="text", seed=0)
    assert (plain.settings["mode"], plain.settings["temperature"]) == ("threshold", 0.5)  # the library's default
    MaskedDiffusionScheduler(unconditional_text=dict(LEFT_TO_RIGHT_TEXT)).save_pretrained(folder / "scheduler")
    out = export_model(folder, tmp_path / "shipped")
    assert (out / "scheduler" / "scheduler_config.json").is_file()
    own = UniModal.from_pretrained(out).generate(to="text", seed=0)
    assert (own.settings["mode"], own.settings["block_length"]) == ("semi_ar", 1)  # the folder's own order
    given = UniModal.from_pretrained(out).generate(to="text", seed=0, mode="threshold")
    assert given.settings["mode"] == "threshold"  # the caller's own still wins
    with pytest.raises(InputError, match="unconditional_text: unknown settings \\['colour'\\]"):
        MaskedDiffusionScheduler(unconditional_text={"colour": 1})


def test_int8_export_stores_matrices_in_int8_and_loads_back_within_half_a_step(tiny_model_dir, tmp_path):
    from unimodal.core.int8 import INT8_FILE, SCALE_SUFFIX, dequantize_state, quantize_state
    from unimodal.pipeline import UniModal

    out = export_model(tiny_model_dir, tmp_path / "int8", int8=True)
    assert not list(out.rglob("diffusion_pytorch_model.safetensors"))
    stored = load_file(out / "backbone" / INT8_FILE)
    assert stored["blocks.0.attn.qkv.weight"].dtype == torch.int8
    assert stored["blocks.0.attn.qkv.bias"].dtype == torch.float16
    codebook = [k for k in load_file(out / "image" / "vq" / INT8_FILE) if k.endswith("quantize.codebook")]
    assert codebook and load_file(out / "image" / "vq" / INT8_FILE)[codebook[0]].dtype == torch.float16
    source, shipped = UniModal.from_pretrained(tiny_model_dir), UniModal.from_pretrained(out)
    for (name, a), (_, b) in zip(source.backbone.state_dict().items(), shipped.backbone.state_dict().items()):
        assert b.dtype == torch.float32
        if a.dim() >= 2:  # within half a quantisation step of each row
            step = a.abs().flatten(1).amax(dim=1) / 127
            assert ((a - b).abs().flatten(1) <= step[:, None] * 0.5 + 1e-3).all(), name
    result = shipped.generate(text="a red circle", to="image", steps=2, seed=0)
    assert len(result.token_ids["image"]) == 64
    weights = {"w": torch.tensor([[1.0, -0.5], [0.0, 0.0]]), "b": torch.tensor([0.25])}
    packed = quantize_state(weights)
    assert packed["w"].tolist() == [[127, -64], [0, 0]] and "w" + SCALE_SUFFIX in packed
    assert torch.allclose(dequantize_state(packed)["w"], weights["w"], atol=1 / 254)


def test_merged_models_average_every_weight_but_the_critic_head(tiny_model_dir, tmp_path, capsys):
    """merge-models: w0 * A + w1 * B for the generator, A's or B's critic head whole, exported like export-model;
    folders of another architecture or bad weights refused by name before anything is written."""
    import shutil

    from safetensors.torch import save_file

    from unimodal.cli import main
    from unimodal.pipeline import UniModal
    from unimodal.training.export import merge_models

    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    state = UniModal.from_pretrained(tiny_model_dir).backbone.state_dict()
    moved = {k: (v + 1.0).contiguous() for k, v in state.items()}
    for stale in (other / "backbone").glob("*.safetensors"):
        stale.unlink()
    save_file(moved, other / "backbone" / "diffusion_pytorch_model.safetensors")
    out = merge_models([tiny_model_dir, other], [0.75, 0.25], tmp_path / "merged", critic_from=1)
    _assert_shippable(out)
    merged = UniModal.from_pretrained(out).backbone.state_dict()
    for name, value in state.items():
        want = moved[name] if name.startswith("critic_head.") else value + 0.25
        assert torch.allclose(merged[name], want.half().float(), atol=2e-3), name
    config = json.loads((out / "training_config.json").read_text())
    assert config["merged"]["weights"] == [0.75, 0.25] and config["merged"]["critic_from"] == 1
    # a run's OUT/model is named with its run, no path of this machine
    assert [m["folder"] for m in config["merged"]["models"]] == [f"{tiny_model_dir.parent.name}/model", "other"]
    with pytest.raises(DataError, match="sum to 1"):
        merge_models([tiny_model_dir, other], [0.5, 0.6], tmp_path / "bad")
    with pytest.raises(DataError, match="one weight each"):
        merge_models([tiny_model_dir], [1.0], tmp_path / "bad")
    with pytest.raises(DataError, match="critic_from"):
        merge_models([tiny_model_dir, other], [0.5, 0.5], tmp_path / "bad", critic_from=2)
    config = json.loads((other / "backbone" / "config.json").read_text())
    (other / "backbone" / "config.json").write_text(json.dumps({**config, "num_layers": config["num_layers"] + 1}))
    with pytest.raises(DataError, match="differ in their backbone config"):
        merge_models([tiny_model_dir, other], [0.5, 0.5], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    code = main(["merge-models", "--models", str(tiny_model_dir), str(tmp_path / "merged"), "--weights", "0.5", "0.5",
                 "--int8", "--out", str(tmp_path / "cli")])
    assert code == 0 and (tmp_path / "cli" / "backbone" / "int8.safetensors").is_file()
    assert str(tmp_path / "cli") in capsys.readouterr().out
