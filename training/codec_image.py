"""Train the image codec (``unimodal.tokenizers_mm.image``) from scratch on scenes, real digits and photo crops.

Two phases: (1) encoder, codebook (EMA, dead-code restarts) and decoder together; (2) for the last
``decoder_finetune_fraction`` of the steps, the codes are frozen and only the decoder trains, which sharpens
reconstructions without moving any code (measured: +3.6 dB on shape scenes).

Every batch is a pure function of (seed, step), so a resumed run sees exactly the data it would have seen.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from unimodal.tokenizers_mm.image import ImageCodec, ImageVQModel, to_pixels
from unimodal.training.hardware import cpu_autocast_bf16
from unimodal.training.checkpoint import restore, resumed_config, save_atomic
from unimodal.training.optim import warmup_cosine
from unimodal.training.data import digits, photos, scenes

DEFAULT_MODEL = dict(block_out_channels=(32, 64, 128, 128), layers_per_block=1, norm_num_groups=16,
                     latent_channels=64, vq_embed_dim=16, num_vq_embeddings=512)


@dataclass
class ImageCodecTrainConfig:
    steps: int = 2000
    batch_size: int = 32
    lr: float = 5e-4
    warmup: int = 100
    decoder_finetune_fraction: float = 0.25
    mix: tuple[float, float, float] = (0.6, 0.2, 0.2)  # scenes, digits, photo crops
    seed: int = 0
    checkpoint_every: int = 100
    bf16: bool | None = None  # None: bf16 autocast where the CPU has bf16 matrix units (training.hardware)
    model: dict = field(default_factory=lambda: dict(DEFAULT_MODEL))


def training_batch(cfg: ImageCodecTrainConfig, step: int) -> np.ndarray:
    """(B, 64, 64, 3) uint8: scenes from the train grammar, train-split digits, crops of train photos."""
    rng = np.random.default_rng([cfg.seed, step])
    kinds = rng.choice(3, size=cfg.batch_size, p=np.asarray(cfg.mix) / sum(cfg.mix))
    digit_pixels, _ = digits.load_digits_arrays()
    digit_train = digits.split_indices(0)["train"]
    images = []
    for kind in kinds:
        if kind == 0:
            images.append(scenes.make_sample(cfg.seed + 1, 0, int(rng.integers(2**31)), False, speech=False).image)
        elif kind == 1:
            images.append(digits.render_digit(digit_pixels[digit_train[rng.integers(len(digit_train))]]))
        else:
            images.append(photos.random_crop(rng))
    return np.stack(images)


def _lr(cfg: ImageCodecTrainConfig, step: int) -> float:
    return cfg.lr * warmup_cosine(step, cfg.steps, cfg.warmup, min_ratio=0.05)


def _freeze_codes(model: ImageVQModel) -> None:
    """Phase 2: only the decoder side (post-quant conv + decoder) keeps training."""
    for module in (model.encoder, model.quant_conv, model.quantize):
        module.requires_grad_(False)
        module.eval()


def _psnr(recon: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    mse = ((recon.clamp(-1, 1) - target) ** 2).mean(dim=(1, 2, 3))  # values span 2.0
    return 10 * torch.log10(4.0 / mse.clamp_min(1e-10))


def train_image_codec(out_dir: str | Path, cfg: ImageCodecTrainConfig | None = None, resume: bool = False,
                      progress: bool = True) -> ImageCodec:
    out_dir = Path(out_dir)
    ckpt_path = out_dir / "checkpoint.pt"
    cfg, state = resumed_config(ImageCodecTrainConfig, cfg, ckpt_path, resume)
    bf16 = cpu_autocast_bf16(cfg.bf16, "image codec training", progress)
    torch.manual_seed(cfg.seed)
    model = ImageVQModel(**cfg.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    start = restore(state, model, optimizer)
    if state is not None and "torch_rng" in state:  # dead-code restarts draw from it
        torch.set_rng_state(state["torch_rng"])
    finetune_from = int(cfg.steps * (1 - cfg.decoder_finetune_fraction))
    model.train()
    if start >= finetune_from:
        _freeze_codes(model)
    bar = tqdm(range(start, cfg.steps), desc="image codec", disable=not progress, initial=start, total=cfg.steps)
    for step in bar:
        if step == finetune_from:
            _freeze_codes(model)
        for group in optimizer.param_groups:
            group["lr"] = _lr(cfg, step)
        pixels = to_pixels(training_batch(cfg, step)).contiguous(memory_format=torch.channels_last)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            recon, commit_loss, _ = model.reconstruct(pixels)
        recon = recon.float()
        loss = F.mse_loss(recon, pixels) + 0.5 * F.l1_loss(recon, pixels) + commit_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.4f}", psnr=f"{_psnr(recon.detach(), pixels).mean():.1f}",
                        alive=f"{model.quantize.usage():.2f}", img_s=f"{len(pixels) / (time.perf_counter() - t0):.1f}")
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            save_atomic({"config": asdict(cfg), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "step": step + 1, "torch_rng": torch.get_rng_state()}, ckpt_path)
    codec = ImageCodec(model.eval())
    codec.save_pretrained(out_dir / "codec")
    return codec


def _round_trip(codec: ImageCodec, images: np.ndarray, batch: int = 64) -> tuple[np.ndarray, torch.Tensor]:
    recons, codes = [], []
    for i in range(0, len(images), batch):
        ids = codec.encode(images[i:i + batch])
        codes.append(ids)
        recons.append(codec.decode(ids))
    return np.concatenate(recons), torch.cat(codes)


def _psnr_uint8(a: np.ndarray, b: np.ndarray) -> float:
    mse = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean(axis=(1, 2, 3))
    return float(np.mean(10 * np.log10(255.0**2 / np.maximum(mse, 1e-10))))


def heldout_images(n: int) -> dict[str, tuple[np.ndarray, list]]:
    """Images the codec never trained on: scene test split (seed 0), digit test split, held-out photos."""
    scene_samples = [scenes.make_sample(0, 2, i, False, speech=False) for i in range(n)]
    digit_pixels, digit_labels = digits.load_digits_arrays()
    test_idx = digits.split_indices(0)["test"][:n]
    rng = np.random.default_rng(12345)
    return {
        "scenes": (np.stack([s.image for s in scene_samples]), [s.meta["attributes"] for s in scene_samples]),
        "digits": (np.stack([digits.render_digit(digit_pixels[i]) for i in test_idx]), digit_labels[test_idx].tolist()),
        "photos": (np.stack([photos.random_crop(rng, heldout=True) for _ in range(n)]), []),
    }


def _judged(kind: str, originals: np.ndarray, recons: np.ndarray, labels: list) -> dict:
    from unimodal.judges import DigitJudge, SceneJudge

    if kind == "scenes":
        judge = SceneJudge()
        ok = lambda images: float(np.mean([judge.score(im, a)["correct"] for im, a in zip(images, labels)]))  # noqa: E731
    elif kind == "digits":
        judge = DigitJudge()
        ok = lambda images: float(np.mean(judge.predict(images) == np.asarray(labels)))  # noqa: E731
    else:
        return {}
    return {"judged_original": ok(originals), "judged_reconstruction": ok(recons)}


def save_comparison_grid(originals: np.ndarray, recons: np.ndarray, path: Path, columns: int = 12,
                         rows: int = 2, scale: int = 2) -> None:
    """A PNG with originals on odd rows and their reconstructions below them, enlarged ``scale`` times."""
    from PIL import Image

    k = min(len(originals), columns * rows)
    rows = []
    for start in range(0, k, columns):
        for source in (originals, recons):
            rows.append(np.concatenate(list(source[start:start + columns]), axis=1))
    width = max(r.shape[1] for r in rows)
    grid = np.concatenate([np.pad(r, ((0, 0), (0, width - r.shape[1]), (0, 0))) for r in rows], axis=0)
    Image.fromarray(grid).resize((grid.shape[1] * scale, grid.shape[0] * scale), Image.NEAREST).save(path)


def evaluate_image_codec(codec_dir: str | Path, n: int = 300, out: str | Path | None = None) -> dict:
    """PSNR, codebook usage and judge accuracy (originals vs reconstructions) on held-out images."""
    codec = ImageCodec.from_pretrained(codec_dir)
    report, all_codes = {"codec": str(codec_dir), "n_per_kind": n, "codebook_size": codec.codebook_size}, []
    for kind, (images, labels) in heldout_images(n).items():
        recons, codes = _round_trip(codec, images)
        all_codes.append(codes.flatten())
        report[kind] = {"psnr_db": round(_psnr_uint8(images, recons), 2),
                        "codes_used": int(codes.unique().numel()), **_judged(kind, images, recons, labels)}
        if out is not None:
            Path(out).mkdir(parents=True, exist_ok=True)
            save_comparison_grid(images, recons, Path(out) / f"image_codec_{kind}.png")
    report["codebook_usage"] = round(torch.cat(all_codes).unique().numel() / codec.codebook_size, 3)
    if out is not None:
        with open(Path(out) / "image_codec_eval.json", "w") as f:
            json.dump(report, f, indent=2)
    return report
