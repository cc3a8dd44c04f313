import numpy as np
import pytest
import torch

from unimodal.tokenizers_mm import get_codec_class
from unimodal.tokenizers_mm.image import CosineEMAQuantizer, ImageCodec, ImageVQModel
from unimodal.training.checkpoint import load_checkpoint
from unimodal.training.codec_image import ImageCodecTrainConfig, evaluate_image_codec, train_image_codec, training_batch
from unimodal.core.errors import InputError

TINY = dict(block_out_channels=(8, 8, 16, 16), layers_per_block=1, norm_num_groups=4, latent_channels=8,
            vq_embed_dim=4, num_vq_embeddings=32)


@pytest.fixture(scope="module")
def codec():
    torch.manual_seed(0)
    return ImageCodec(ImageVQModel(**TINY))


def test_registry_resolves_image_codec():
    assert get_codec_class("image") is ImageCodec


def test_encode_decode_shapes(codec):
    images = training_batch(ImageCodecTrainConfig(batch_size=3), step=0)
    ids = codec.encode(images)
    assert ids.shape == (3, 64) and ids.dtype == torch.long
    assert 0 <= int(ids.min()) and int(ids.max()) < codec.codebook_size == 32
    out = codec.decode(ids)
    assert out.shape == (3, 64, 64, 3) and out.dtype == np.uint8
    assert codec.grid == (8, 8) and codec.patch == 8


def test_accepts_pil_and_single_arrays(codec):
    from PIL import Image

    image = training_batch(ImageCodecTrainConfig(batch_size=1), step=1)[0]
    assert torch.equal(codec.encode(Image.fromarray(image)), codec.encode(image))


def test_save_load_same_codes(codec, tmp_path):
    images = training_batch(ImageCodecTrainConfig(batch_size=2), step=2)
    codec.save_pretrained(tmp_path)
    again = ImageCodec.from_pretrained(tmp_path)
    assert torch.equal(again.encode(images), codec.encode(images))
    assert np.array_equal(again.decode(codec.encode(images)), codec.decode(codec.encode(images)))


def test_bad_input_is_named(codec, tmp_path):
    with pytest.raises(InputError, match="64x64"):
        codec.encode(np.zeros((1, 32, 32, 3), np.uint8))
    with pytest.raises(InputError, match="uint8"):
        codec.encode(np.zeros((1, 64, 64, 3), np.float64))
    with pytest.raises(InputError, match=r"\[0, 32\)"):
        codec.decode(torch.full((1, 64), 99))
    with pytest.raises(InputError, match="shaped"):
        codec.decode(torch.zeros(1, 10, dtype=torch.long))
    with pytest.raises(InputError, match="no image codec"):
        ImageCodec.from_pretrained(tmp_path / "empty")


def test_quantizer_ema_pulls_codes_to_data_and_restarts_dead_codes():
    torch.manual_seed(0)
    q = CosineEMAQuantizer(num_codes=8, dim=2, decay=0.5, restart_every=4, dead_threshold=0.5).train()
    data = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).repeat(16, 1)  # two directions only
    z = data.reshape(1, 32, 1, 2).permute(0, 3, 1, 2)  # (B, D, H, W)
    for _ in range(8):
        _, loss, (_, _, ids) = q(z)
    # every code is now one of the two data directions (dead ones were restarted onto data)...
    near_data = (q.codebook @ torch.tensor([[1.0, 0.0], [0.0, 1.0]]).t()).max(dim=1).values
    assert torch.all(near_data > 0.95)
    # ...and the quantised vectors equal the data, so the commitment loss vanishes
    assert float(loss) < 1e-3
    q.eval()
    before = q.codebook.clone()
    q(z)
    assert torch.equal(before, q.codebook)  # no update outside training


def test_killed_training_resumes_to_the_same_weights(tmp_path, monkeypatch):
    import unimodal.training.codec_image as ci

    cfg = ImageCodecTrainConfig(steps=4, batch_size=2, checkpoint_every=2, warmup=1, model=dict(TINY))
    straight = train_image_codec(tmp_path / "a", cfg, progress=False)

    real_batch = ci.training_batch

    def dies_at_step_3(c, step):
        if step == 3:
            raise KeyboardInterrupt  # killed after the step-2 checkpoint
        return real_batch(c, step)

    monkeypatch.setattr(ci, "training_batch", dies_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        train_image_codec(tmp_path / "b", cfg, progress=False)
    assert load_checkpoint(tmp_path / "b" / "checkpoint.pt")["step"] == 2
    monkeypatch.setattr(ci, "training_batch", real_batch)
    resumed = train_image_codec(tmp_path / "b", resume=True, progress=False)
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), name


def test_eval_reports_every_kind(tmp_path, codec):
    codec.save_pretrained(tmp_path / "codec")
    report = evaluate_image_codec(tmp_path / "codec", n=4, out=tmp_path / "eval")
    for kind in ("scenes", "digits", "photos"):
        assert np.isfinite(report[kind]["psnr_db"])
        assert (tmp_path / "eval" / f"image_codec_{kind}.png").exists()
    assert report["scenes"]["judged_original"] == 1.0
    assert 0 < report["codebook_usage"] <= 1


def test_codec_train_codes_sets_the_image_codebook_and_is_refused_elsewhere(monkeypatch, tmp_path, capsys):
    import unimodal.training.codec_image as codec_image
    from unimodal.cli import main

    seen = {}
    monkeypatch.setattr(codec_image, "train_image_codec", lambda out, cfg, resume: seen.update(cfg=cfg))
    assert main(["codec", "train", "image", "--codes", "128", "--steps", "3", "--out", str(tmp_path)]) == 0
    assert seen["cfg"].model["num_vq_embeddings"] == 128 and seen["cfg"].steps == 3
    assert seen["cfg"].model["block_out_channels"] == codec_image.DEFAULT_MODEL["block_out_channels"]
    for argv, message in ((["audio", "--codes", "64"], "not the audio codec's"),
                          (["image", "--codes", "1"], "between 2 and 4096")):
        assert main(["codec", "train", *argv, "--out", str(tmp_path)]) != 0
        assert message in capsys.readouterr().err
