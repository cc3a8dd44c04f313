"""Image codec: a VQ-VAE built on diffusers ``VQModel``; 64x64 RGB <-> an 8x8 grid of codes.

The encoder, decoder and 1x1 projections are diffusers' own. The quantiser is ours
(:class:`CosineEMAQuantizer`), because diffusers' ``VectorQuantizer`` learns its codebook by gradient and
collapses on our data (measured: 14 of 512 codes alive). Ours:

* looks codes up by cosine similarity in a low-dimensional space (l2-normalised vectors), which spreads
  assignments over the codebook;
* learns the codebook by exponential moving averages of the vectors assigned to each code (no codebook
  gradient, no learning-rate coupling);
* restarts dead codes: every ``restart_every`` training steps, a code whose running usage fell under
  ``dead_threshold`` is moved onto a random encoder output of the current batch.

Codes are returned row-major: id ``r * grid + c`` is the code of pixel block (r, c).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import ModelMixin, VQModel  # ModelMixin: diffusers pipelines look the name up here to load us
from diffusers.configuration_utils import register_to_config
from PIL import Image
from torch import nn

from unimodal.core.errors import InputError
from unimodal.core.int8 import load_pretrained


class CosineEMAQuantizer(nn.Module):
    """Nearest-code lookup by cosine similarity; codebook learned by EMA with dead-code restarts.

    ``forward`` has the signature of diffusers' ``VectorQuantizer``: ``(z_q, loss, (None, None, indices))``.
    """

    def __init__(self, num_codes: int, dim: int, decay: float = 0.99, commitment: float = 0.25,
                 restart_every: int = 100, dead_threshold: float = 0.03):
        super().__init__()
        self.num_codes, self.dim, self.decay, self.commitment = num_codes, dim, decay, commitment
        self.restart_every, self.dead_threshold = restart_every, dead_threshold
        codebook = F.normalize(torch.randn(num_codes, dim), dim=1)
        self.register_buffer("codebook", codebook)  # (K, D), unit vectors
        self.register_buffer("ema_count", torch.ones(num_codes))  # running number of vectors per code
        self.register_buffer("ema_sum", codebook.clone())  # running sum of the vectors per code
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def lookup(self, indices: torch.Tensor) -> torch.Tensor:
        return self.codebook[indices]

    def nearest(self, z_unit: torch.Tensor) -> torch.Tensor:
        return (z_unit @ self.codebook.t()).argmax(dim=1)  # (N,)

    def forward(self, z: torch.Tensor):
        b, d, h, w = z.shape
        z_unit = F.normalize(z.float().permute(0, 2, 3, 1).reshape(-1, d), dim=1)  # (N, D)
        indices = self.nearest(z_unit)
        z_q = self.codebook[indices]
        if self.training:
            self._ema_update(z_unit.detach(), indices)
        loss = self.commitment * F.mse_loss(z_unit, z_q.detach())
        z_st = z_unit + (z_q - z_unit).detach()  # straight-through gradient to the encoder
        z_st = z_st.reshape(b, h, w, d).permute(0, 3, 1, 2).contiguous().to(z.dtype)
        return z_st, loss, (None, None, indices.reshape(b, h * w))

    @torch.no_grad()
    def _ema_update(self, z_unit: torch.Tensor, indices: torch.Tensor) -> None:
        one_hot = F.one_hot(indices, self.num_codes).type_as(z_unit)  # (N, K)
        self.ema_count.mul_(self.decay).add_(one_hot.sum(0), alpha=1 - self.decay)
        self.ema_sum.mul_(self.decay).add_(one_hot.t() @ z_unit, alpha=1 - self.decay)
        self.codebook.copy_(F.normalize(self.ema_sum, dim=1))
        self.steps += 1
        if self.restart_every and int(self.steps) % self.restart_every == 0:
            self._restart_dead(z_unit, indices)

    @torch.no_grad()
    def _restart_dead(self, z_unit: torch.Tensor, indices: torch.Tensor | None = None) -> None:
        """Move dead codes onto encoder outputs. With ``indices``, onto the outputs worst served by their
        code: on flat-background pictures a random output is almost always background, which a live code
        already covers, so a code restarted there dies again (measured: 27% of codes alive)."""
        dead = (self.ema_count < self.dead_threshold).nonzero().flatten()
        if len(dead) == 0:
            return
        pool = z_unit
        if indices is not None:
            similarity = (z_unit * self.codebook[indices]).sum(dim=1)  # (N,) cosine to the assigned code
            pool = z_unit[similarity.topk(min(len(z_unit), 4 * len(dead)), largest=False).indices]
        picks = torch.randint(len(pool), (len(dead),), device=z_unit.device)
        fresh = F.normalize(pool[picks] + 0.01 * torch.randn_like(pool[picks]), dim=1)
        self.codebook[dead] = fresh
        self.ema_sum[dead] = fresh
        self.ema_count[dead] = 1.0

    def usage(self) -> torch.Tensor:
        """Fraction of codes whose running usage is above the dead threshold."""
        return (self.ema_count >= self.dead_threshold).float().mean()


class ImageVQModel(VQModel):
    """diffusers ``VQModel`` with :class:`CosineEMAQuantizer` in place of its gradient-trained quantiser."""

    @register_to_config
    def __init__(self, in_channels: int = 3, out_channels: int = 3,
                 down_block_types: tuple[str, ...] = ("DownEncoderBlock2D",) * 4,
                 up_block_types: tuple[str, ...] = ("UpDecoderBlock2D",) * 4,
                 block_out_channels: tuple[int, ...] = (64, 128, 128, 256), layers_per_block: int = 1,
                 act_fn: str = "silu", latent_channels: int = 64, sample_size: int = 64,
                 num_vq_embeddings: int = 512, norm_num_groups: int = 32, vq_embed_dim: int = 16,
                 mid_block_add_attention: bool = True, scaling_factor: float = 0.18215,
                 norm_type: str = "group", lookup_from_codebook: bool = False, force_upcast: bool = False,
                 codebook_decay: float = 0.99,
                 commitment: float = 0.25, restart_every: int = 100, dead_threshold: float = 0.03):
        super().__init__(in_channels=in_channels, out_channels=out_channels, down_block_types=down_block_types,
                         up_block_types=up_block_types, block_out_channels=block_out_channels,
                         layers_per_block=layers_per_block, act_fn=act_fn, latent_channels=latent_channels,
                         sample_size=sample_size, num_vq_embeddings=num_vq_embeddings,
                         norm_num_groups=norm_num_groups, vq_embed_dim=vq_embed_dim,
                         mid_block_add_attention=mid_block_add_attention, scaling_factor=scaling_factor,
                         norm_type=norm_type, lookup_from_codebook=lookup_from_codebook,
                         force_upcast=force_upcast)
        self.quantize = CosineEMAQuantizer(num_vq_embeddings, vq_embed_dim, decay=codebook_decay,
                                           commitment=commitment, restart_every=restart_every,
                                           dead_threshold=dead_threshold)

    def encode_indices(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> (B, h*w) code ids."""
        latents = self.encode(pixels).latents  # (B, D, h, w)
        return self.quantize(latents)[2][2]

    def decode_indices(self, indices: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """(B, h*w) code ids -> (B, 3, H, W) in about [-1, 1]."""
        b = indices.shape[0]
        quant = self.quantize.lookup(indices).reshape(b, grid[0], grid[1], -1).permute(0, 3, 1, 2)
        return self.decoder(self.post_quant_conv(quant))

    def reconstruct(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training forward: (reconstruction, commitment loss, code ids)."""
        latents = self.encode(pixels).latents
        quant, commit_loss, (_, _, indices) = self.quantize(latents)
        return self.decoder(self.post_quant_conv(quant)), commit_loss, indices


def to_pixels(images) -> torch.Tensor:
    """PIL images, uint8 arrays (H, W, 3) or (B, H, W, 3), or a float tensor (B, 3, H, W) in [-1, 1]
    -> a float tensor (B, 3, H, W) in [-1, 1]."""
    if isinstance(images, torch.Tensor) and images.is_floating_point():
        if images.ndim != 4 or images.shape[1] != 3:
            raise InputError(f"image tensor must be (B, 3, H, W) in [-1, 1], got shape {tuple(images.shape)}")
        return images
    if isinstance(images, Image.Image):
        images = [images]
    if isinstance(images, (list, tuple)):
        images = np.stack([np.asarray(im.convert("RGB") if isinstance(im, Image.Image) else im) for im in images])
    array = np.asarray(images)
    if array.ndim == 3:
        array = array[None]
    if array.ndim != 4 or array.shape[-1] != 3 or array.dtype != np.uint8:
        raise InputError(f"images must be uint8 RGB arrays (B, H, W, 3) or PIL images, got {array.dtype} "
                         f"array of shape {array.shape}")
    array = array if array.flags.writeable else array.copy()  # torch refuses to wrap read-only memory
    return torch.from_numpy(np.ascontiguousarray(array)).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def to_uint8(pixels: torch.Tensor) -> np.ndarray:
    """(B, 3, H, W) float in [-1, 1] -> (B, H, W, 3) uint8."""
    return pixels.clamp(-1, 1).add(1).mul(127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()


class ImageCodec:
    """64x64 RGB images <-> 8x8 grids of local code ids (row-major), in ``[0, codebook_size)``."""

    modality = "image"
    pipeline_parts = {"image_vq": "model"}
    WEIGHTS = "vq"

    def __init__(self, model: ImageVQModel):
        self.model = model.eval()
        self.image_size = int(model.config.sample_size)
        factor = 2 ** (len(model.config.block_out_channels) - 1)
        self.grid = (self.image_size // factor, self.image_size // factor)
        self.patch = factor  # pixels per code side

    @property
    def codebook_size(self) -> int:
        return int(self.model.config.num_vq_embeddings)

    @property
    def num_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @torch.no_grad()
    def encode(self, images) -> torch.Tensor:
        """Images (see :func:`to_pixels`) -> (B, rows*cols) LongTensor of codes."""
        pixels = to_pixels(images)
        if tuple(pixels.shape[-2:]) != (self.image_size, self.image_size):
            raise InputError(f"the image codec takes {self.image_size}x{self.image_size} images, got "
                             f"{pixels.shape[-1]}x{pixels.shape[-2]}; resize first (unimodal does it for you)")
        return self.model.encode_indices(pixels.to(self.model.device, self.model.dtype))

    @torch.no_grad()
    def decode(self, ids) -> np.ndarray:
        """(B, rows*cols) code ids, or a list of B rows of them (as iterating ``encode``'s result gives) ->
        (B, H, W, 3) uint8 images."""
        if isinstance(ids, (list, tuple)) and ids and isinstance(ids[0], torch.Tensor):
            ids = torch.stack([row.long() for row in ids])
        ids = torch.as_tensor(ids, dtype=torch.long)
        if ids.ndim == 1:
            ids = ids[None]
        if ids.shape[-1] != self.num_tokens or ids.ndim != 2:
            raise InputError(f"image codes must be shaped (B, {self.num_tokens}), got {tuple(ids.shape)}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.codebook_size:
            raise InputError(f"image codes must lie in [0, {self.codebook_size}), got range "
                             f"[{int(ids.min())}, {int(ids.max())}]")
        return to_uint8(self.model.decode_indices(ids.to(self.model.device), self.grid).float())

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        self.model.save_pretrained(directory / self.WEIGHTS)
        with open(directory / "codec.json", "w") as f:
            json.dump({"modality": self.modality, "class": type(self).__name__, "grid": list(self.grid)}, f, indent=2)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> "ImageCodec":
        directory = Path(directory)
        if not (directory / cls.WEIGHTS).is_dir():
            raise InputError(f"{directory} holds no image codec (expected a {cls.WEIGHTS}/ folder)")
        return cls(load_pretrained(ImageVQModel, directory / cls.WEIGHTS))
