"""The DiT backbone: one masked-diffusion transformer over the shared vocabulary (see ``dit.py``)."""

from unimodal.backbone.dit import PRESETS, ConditionCache, DiT, DiTOutput, flops_per_token

__all__ = ["PRESETS", "ConditionCache", "DiT", "DiTOutput", "flops_per_token"]
