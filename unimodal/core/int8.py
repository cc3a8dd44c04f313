"""int8 storage of shipped weights, dequantised to float32 on load.

Each matrix (linear, convolution, embedding: every floating tensor of two or more dimensions) is stored as
int8 with one float16 scale per output row (symmetric, ``scale = max|row| / 127``): a quarter of float32, half
of float16. Vectors (biases, norms) and VQ codebooks stay float16: nearest-code search compares distances to
codebook rows, so rounding them would change which code an input gets. A component folder holds its
``config.json`` and :data:`INT8_FILE` instead of ``diffusion_pytorch_model.safetensors``;
:func:`load_pretrained` reads either.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

INT8_FILE = "int8.safetensors"
FLOAT_FILE = "diffusion_pytorch_model.safetensors"
SCALE_SUFFIX = ".int8_scale"
KEEP_FLOAT = ("quantize", "codebook")  # name parts of VQ codebooks


def _quantizable(name: str, tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() and tensor.dim() >= 2 and not any(k in name for k in KEEP_FLOAT)


def quantize_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """int8 rows + float16 row scales for matrices, float16 for the rest (integer buffers unchanged)."""
    out = {}
    for name, tensor in state.items():
        if _quantizable(name, tensor):
            rows = tensor.detach().float().flatten(1)  # (out, rest)
            scale = rows.abs().amax(dim=1).clamp_min(1e-12) / 127.0  # (out,)
            out[name] = torch.round(rows / scale[:, None]).to(torch.int8).reshape(tensor.shape).contiguous()
            out[name + SCALE_SUFFIX] = scale.to(torch.float16)
        elif tensor.is_floating_point():
            out[name] = tensor.detach().to(torch.float16).contiguous()
        else:
            out[name] = tensor.detach().contiguous()
    return out


def dequantize_state(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state = {}
    for name, tensor in stored.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        scale = stored.get(name + SCALE_SUFFIX)
        if scale is not None:
            state[name] = (tensor.float().flatten(1) * scale.float()[:, None]).reshape(tensor.shape)
        else:
            state[name] = tensor.float() if tensor.is_floating_point() else tensor
    return state


def convert_folder_to_int8(folder: str | os.PathLike) -> int:
    """Replace every ``diffusion_pytorch_model.safetensors`` under ``folder`` by its int8 form; returns how many."""
    from safetensors.torch import load_file, save_file

    converted = 0
    for path in sorted(Path(folder).rglob(FLOAT_FILE)):
        save_file(quantize_state(load_file(str(path))), str(path.with_name(INT8_FILE)))
        path.unlink()
        converted += 1
    return converted


def load_pretrained(cls, directory: str | os.PathLike):
    """``cls.from_pretrained(directory)`` (a diffusers ModelMixin), or the same model built from its config and
    the dequantised :data:`INT8_FILE` when the folder holds that instead."""
    directory = Path(directory)
    if not (directory / INT8_FILE).is_file():
        return cls.from_pretrained(directory)
    from safetensors.torch import load_file

    model = cls.from_config(cls.load_config(directory))
    model.load_state_dict(dequantize_state(load_file(str(directory / INT8_FILE))))
    return model.eval()
