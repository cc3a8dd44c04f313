"""What the sampling benchmark runs: the settings swept, the directions, and the conditions encoded as
training encoded them (``unimodal.inference.bench_sample`` runs it; see its docstring)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unimodal.inference.evaluate import shell_hint
from unimodal.inference.sampler import SamplerConfig
from unimodal.tokenizers_mm.layout import MODALITIES
from unimodal.core.errors import InputError

DEFAULT_DIRECTIONS = ("text->image", "image->text", "text->audio", "audio->text", "audio->image", "image->audio")
DEFAULT_TAUS = (0.5, 0.7, 0.9)
DEFAULT_STEPS = (4, 8, 16, 64)
REFERENCE = "all-steps"
SWEPT_FIELDS = ("steps", "mode", "schedule", "tau", "seed", "use_cache")  # what each Setting decides itself


def shared_settings(sampling: dict | None) -> dict:
    """The settings every row shares: greedy unless ``sampling`` says otherwise, plus ``sampling``."""
    return {"temperature": 0.0, **(sampling or {})}


@dataclass(frozen=True)
class Setting:
    """One sampler setting of the sweep; ``steps`` None means "as many as target slots"."""

    name: str
    mode: str
    schedule: str = "cosine"
    steps: int | None = None
    tau: float | None = None

    def config(self, n_slots: int, use_cache: bool, seed: int, sampling: dict | None = None) -> SamplerConfig:
        """``sampling``: the settings shared by the whole sweep (temperature, cfg, choice_temperature, ...)."""
        return SamplerConfig(mode=self.mode, schedule=self.schedule, steps=self.steps or n_slots,
                             tau=self.tau if self.tau is not None else 0.9, use_cache=use_cache, seed=seed,
                             **shared_settings(sampling))


def sweep(taus, steps) -> list[Setting]:
    """The reference first, then the tau sweep (threshold mode), then the step counts (confidence mode)."""
    return ([Setting(REFERENCE, "confidence", schedule="linear")]
            + [Setting(f"tau={tau:g}", "threshold", tau=float(tau)) for tau in taus]
            + [Setting(f"steps={n}", "confidence", steps=int(n)) for n in steps])


def parse_direction(text: str) -> tuple[str, str]:
    """``"text->image"`` -> ("text", "image"), with a clear error for anything else."""
    condition, arrow, target = (part.strip() for part in text.partition("->"))
    if not arrow or condition not in MODALITIES or target not in MODALITIES or condition == target:
        raise InputError(f"a direction is CONDITION->TARGET with two different modalities among {MODALITIES}, "
                         f"e.g. text->image; got {text!r}{shell_hint(text)}")
    return condition, target


@torch.no_grad()
def encode_conditions(pipe, modality: str, values: list) -> list[torch.Tensor]:
    """Local ids of each condition, cut to what the layout holds (as training cut them)."""
    longest = pipe.layout.max_content_len(modality)
    return [torch.as_tensor(ids)[:longest].cpu() for ids in pipe.codecs[modality].encode(list(values))]


def target_slots(layout, modality: str) -> int:
    """Slots of a full-size target of ``modality`` (what the sampler fills)."""
    return len(layout.pack([layout.target_segment(modality)]).spans[0].slots)


__all__ = ["DEFAULT_DIRECTIONS", "DEFAULT_STEPS", "DEFAULT_TAUS", "REFERENCE", "SWEPT_FIELDS", "Setting",
           "encode_conditions", "parse_direction", "shared_settings", "sweep", "target_slots"]
