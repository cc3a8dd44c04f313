"""A diffusers-style scheduler for masked diffusion: the sampler's commit rules, one step at a time.

:class:`MaskedDiffusionScheduler` holds no weights, only the sampling settings (saved as
``scheduler_config.json``). It serves two purposes:

* the pipeline's fast path: :meth:`~MaskedDiffusionScheduler.sampler_config` turns the stored settings (plus
  per-call overrides) into a :class:`~unimodal.inference.sampler.SamplerConfig` for the batched
  :func:`unimodal.inference.sampler.generate`;
* a loop you write yourself, as with any diffusers scheduler::

      scheduler.set_timesteps(16)
      allowed = MaskedDiffusionScheduler.allowed_for(layout, packed)   # (L, V): ids each position may take
      for index, mask_ratio in enumerate(scheduler.timesteps):
          logits = model(ids, t, ...).logits                            # (B, L, V)
          ids = scheduler.step(logits, index, ids, allowed, generator).prev_sample

  ``step`` draws a token per masked position with the sampler's own helpers (argmax, or Gumbel-max with
  temperature / top-k / top-p in float64), then commits, by ``mode``: ``confidence``: the most confident, as
  many as the schedule says (after step ``i`` of ``n``, ``masked_after_step(N, i, n, schedule)`` of the ``N``
  positions masked at the start stay masked; the last step commits all); ``threshold``: every position with
  confidence >= ``tau`` (at least one; the last step commits all); ``semi_ar``: left-to-right blocks of
  ``block_length`` positions of each segment, ``num_inference_steps`` steps each, with ``block_mode`` inside
  a block (loop ``while (ids == MASK).any()``). "Most confident" is the probability, or with
  ``choice_temperature`` MaskGIT's order (log-probability plus annealed Gumbel noise from the same
  generators), as in the sampler. Text and audio stay well formed: after a segment's first END (or PAD)
  every later position becomes PAD, as in the sampler.

Unlike :func:`unimodal.inference.sampler.generate`, a hand-written loop never skips a step: a step whose schedule count
is zero commits nothing. ``step`` keeps a little state between calls: the number of masked positions when
sampling started (recorded at step index 0, or on the first call after :meth:`set_timesteps`) and, in
``semi_ar``, the current block of each row. Call :meth:`set_timesteps` before each new generation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from types import SimpleNamespace

import torch
from diffusers import ConfigMixin, SchedulerMixin  # SchedulerMixin: diffusers pipelines look the name up here
from diffusers.configuration_utils import register_to_config
from diffusers.utils import BaseOutput

from unimodal.inference.sampler import (
    _NO_BLOCK,
    KEPT_FRACTION,
    SamplerConfig,
    _draw,
    _most_confident,
    _pad_after_end,
    _Progress,
    _windows,
    masked_after_step,
    perturbed_order,
)
from unimodal.tokenizers_mm.layout import BOA, BOI, BOT, EOA, EOT, MASK, Layout, Packed
from unimodal.core.errors import InputError

# Settings stored in scheduler_config.json, by SamplerConfig field name (num_inference_steps is "steps").
_STORED = ("mode", "schedule", "tau", "temperature", "top_k", "top_p", "block_length", "block_mode",
           "choice_temperature")
# Defaults per generated modality, beneath the caller's own settings (docs/results.md has the measurements):
# images and speech need guidance and MaskGIT's randomised commit order (a greedy order fills a picture with
# background first); captions decode greedily with threshold 0.95, which gave the same tokens as one token per
# pass (100 captions, agreement 1.000) in 4-6x fewer passes, where 16 cosine steps lost 5 points.
DEFAULT_TARGET_SETTINGS = {
    "image": {"temperature": 1.0, "choice_temperature": 4.5, "cfg": 3.0},
    "audio": {"temperature": 1.0, "choice_temperature": 4.5, "cfg": 3.0},
    "text": {"temperature": 0.0, "mode": "threshold", "tau": 0.95, "steps": 32},
}
TARGET_PRIORITY = ("image", "audio", "text")  # a joint request takes the defaults of its first target here
_TARGET_KEYS = ("steps", "mode", "schedule", "tau", "temperature", "top_k", "top_p", "cfg", "block_length",
                "block_mode", "choice_temperature")
_BEGIN_TO_END = {BOT: EOT, BOA: EOA}  # sequence segments (text, audio): begin marker -> END marker
_BEGINS = (BOT, BOI, BOA)


@dataclass
class MaskedDiffusionSchedulerOutput(BaseOutput):
    """``prev_sample`` (B, L): ids after this step; ``confidence`` (B, L): probability of the token drawn at each
    position under the restricted, untempered distribution (meaningful where ``committed``); ``committed``
    (B, L) bool: positions this step sampled and committed (PAD filled in after an END is not counted)."""

    prev_sample: torch.Tensor
    confidence: torch.Tensor
    committed: torch.Tensor


class MaskedDiffusionScheduler(SchedulerMixin, ConfigMixin):
    """The masked-diffusion sampling settings and a one-step commit rule; see the module docstring.

    ``mode``: ``confidence`` / ``threshold`` / ``semi_ar``; ``schedule``: ``cosine`` / ``linear`` (masked
    fraction after each step); ``num_inference_steps``: default step count (per block in ``semi_ar``);
    ``tau``: threshold-mode confidence; ``temperature`` (0: argmax), ``top_k`` (0: off), ``top_p`` (1: off);
    ``block_length`` / ``block_mode``: ``semi_ar`` blocks and the rule inside them; ``choice_temperature``:
    MaskGIT's randomised commit order. ``target_settings``: defaults per generated modality
    (``{"image": {"cfg": 3.0, ...}, "text": {...}}``, any of ``_TARGET_KEYS``), applied over the settings above
    and under a caller's own; None stores :data:`DEFAULT_TARGET_SETTINGS`, ``{}`` turns them off.
    """

    config_name = "scheduler_config.json"
    order = 1

    @register_to_config
    def __init__(self, mode: str = "confidence", schedule: str = "cosine", num_inference_steps: int = 16,
                 tau: float = 0.9, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 block_length: int = 16, block_mode: str = "confidence", choice_temperature: float = 0.0,
                 target_settings: dict | None = None):
        if target_settings is None:
            self.register_to_config(target_settings={m: dict(v) for m, v in DEFAULT_TARGET_SETTINGS.items()})
        self._check_target_settings()
        self.sampler_config()  # validates every setting now (InputError names the bad one)
        self.num_inference_steps = num_inference_steps
        self.timesteps = self._mask_ratios(num_inference_steps)
        self._state = None

    # ---- settings ------------------------------------------------------------------------------------------

    def _check_target_settings(self) -> None:
        table = self.config.target_settings
        if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
            raise InputError(f"target_settings must map a modality to a dict of settings, got {table!r}")
        unknown = sorted(set(table) - set(TARGET_PRIORITY))
        if unknown:
            raise InputError(f"target_settings: unknown modalities {unknown}; accepted: {list(TARGET_PRIORITY)}")
        for modality, values in table.items():
            wrong = sorted(set(values) - set(_TARGET_KEYS))
            if wrong:
                raise InputError(f"target_settings[{modality!r}]: unknown settings {wrong}; accepted: "
                                 f"{list(_TARGET_KEYS)}")
            self.sampler_config(targets=[modality])  # validates the values

    @staticmethod
    def target_kind(targets) -> str | None:
        """The modality whose defaults a request generating ``targets`` takes (see ``TARGET_PRIORITY``)."""
        return next((m for m in TARGET_PRIORITY if m in targets), None)

    def target_defaults(self, targets) -> dict:
        """The stored defaults for a request generating ``targets`` (a modality or a list; None: none)."""
        if targets is None:
            return {}
        kind = self.target_kind([targets] if isinstance(targets, str) else list(targets))
        return dict((self.config.target_settings or {}).get(kind, {}))

    def sampler_config(self, targets=None, **overrides) -> SamplerConfig:
        """The stored settings as a :class:`SamplerConfig`: the scheduler's settings, then the defaults of the
        generated modality (``targets``: a modality or list of them; None: none), then ``overrides`` (any
        SamplerConfig field, e.g. ``steps``, ``cfg``, ``seed``; None values are ignored)."""
        known = {f.name for f in fields(SamplerConfig)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise InputError(f"unknown sampler settings {unknown}; accepted: {sorted(known)}")
        stored = {name: self.config[name] for name in _STORED}
        stored["steps"] = self.config.num_inference_steps
        stored.update(self.target_defaults(targets))
        stored.update({name: value for name, value in overrides.items() if value is not None})
        return SamplerConfig(**stored)

    def _mask_ratios(self, steps: int) -> torch.Tensor:
        kept = KEPT_FRACTION[self.config.schedule]
        return torch.tensor([kept(step / steps) for step in range(steps)], dtype=torch.float32)

    def set_timesteps(self, num_inference_steps: int | None = None, device: str | torch.device | None = None) -> None:
        """``self.timesteps``: the mask ratio before each step (1.0 first), from the schedule; resets the state."""
        steps = self.config.num_inference_steps if num_inference_steps is None else num_inference_steps
        self.sampler_config(steps=steps)  # validates
        self.num_inference_steps = steps
        self.timesteps = self._mask_ratios(steps).to(device) if device is not None else self._mask_ratios(steps)
        self._state = None

    @staticmethod
    def allowed_for(layout: Layout, packed: Packed) -> torch.Tensor:
        """(L, V) bool for a packed sequence: a slot may take its modality's ``layout.allowed_ids``; other
        positions (markers, conditions) any id, which never matters since only MASK positions are committed."""
        allowed = torch.ones(len(packed), layout.vocab_size, dtype=torch.bool)
        for span in packed.spans:
            allowed[list(span.slots)] = layout.allowed_ids(span.modality)
        return allowed

    # ---- one step ------------------------------------------------------------------------------------------

    def step(self, model_output: torch.Tensor, timestep: int, sample: torch.Tensor,
             allowed: torch.Tensor | None = None, generator: torch.Generator | list[torch.Generator] | None = None,
             return_dict: bool = True) -> MaskedDiffusionSchedulerOutput | tuple:
        """Commit one step's tokens: ``model_output`` (B, L, V) logits (guidance already applied),
        ``timestep`` the 0-based step index, ``sample`` (B, L) ids with MASK where still to fill, ``allowed``
        (L, V) or (B, L, V) bool (None: any id but MASK), ``generator`` one or one per row (None: torch's
        global generator; unused when temperature is 0)."""
        config = self.sampler_config(steps=self.num_inference_steps)
        sample, index = self._checked(model_output, timestep, sample)
        if allowed is None:
            allowed = torch.ones(model_output.shape[-1], dtype=torch.bool, device=sample.device)
            allowed[MASK] = False
        masked = sample == MASK  # (B, L)
        if self._state is None or index == 0:
            self._state = self._start(sample, config)
        info, progress = self._state
        window = _windows(info, masked, progress)  # (B, L) masked positions this step may commit
        generators = generator if isinstance(generator, (list, tuple)) else [generator] * sample.shape[0]
        chosen, prob = _draw(model_output, allowed.to(sample.device), list(generators), config)  # (B, L) x2
        available = window.sum(1).tolist()
        confident = (window & (prob >= config.tau)).sum(1).tolist()
        counts = [self._commit_count(n, c, state, index, config) for n, c, state in zip(available, confident, progress)]
        order = prob  # commit the most confident first; with choice_temperature, MaskGIT's noisy order:
        if config.choice_temperature > 0:
            anneal = torch.full((prob.shape[0],), max(0.0, 1.0 - index / config.steps), device=prob.device)
            order = perturbed_order(prob, anneal, list(generators), config.choice_temperature)  # as the sampler
        committed = _most_confident(window, order, torch.tensor(counts, device=sample.device))  # (B, L)
        prev_sample = torch.where(committed, chosen, sample)
        for row, sequences in enumerate(_sequences(prev_sample)):
            _pad_after_end(SimpleNamespace(sequences=sequences), prev_sample[row:row + 1])  # in place
        out = (prev_sample, prob.float(), committed)
        return MaskedDiffusionSchedulerOutput(*out) if return_dict else out

    def _checked(self, logits: torch.Tensor, timestep, sample: torch.Tensor) -> tuple[torch.Tensor, int]:
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
            raise InputError(f"model_output must be (B, L, V) logits, got {getattr(logits, 'shape', type(logits))}")
        sample = torch.as_tensor(sample)
        if sample.dim() == 1:
            sample = sample[None]
        if sample.is_floating_point() or tuple(sample.shape) != tuple(logits.shape[:2]):
            raise InputError(f"sample must be (B, L) integer ids matching the logits {tuple(logits.shape[:2])}, "
                             f"got {sample.dtype} {tuple(sample.shape)}")
        index = int(timestep.item() if isinstance(timestep, torch.Tensor) else timestep)
        if index < 0:
            raise InputError(f"timestep is the 0-based step index, got {timestep!r}")
        return sample.clone(), index

    def _start(self, sample: torch.Tensor, config: SamplerConfig):
        """Blocks of every MASK position (one block per row, or semi_ar blocks) and a fresh progress per row."""
        masked = sample == MASK
        if config.mode == "semi_ar":
            block_of = _semi_ar_blocks(sample, config.block_length)
        else:
            block_of = torch.where(masked, 0, _NO_BLOCK)
        return SimpleNamespace(block_of=block_of), [_Progress() for _ in range(sample.shape[0])]

    @staticmethod
    def _commit_count(available: int, n_confident: int, state: _Progress, index: int, config: SamplerConfig) -> int:
        """How many of ``available`` window positions to commit now (never skips a step, unlike the sampler)."""
        if available == 0:
            return 0
        rule = config.block_mode if config.mode == "semi_ar" else config.mode
        step = state.block_step if config.mode == "semi_ar" else index
        state.block_step += 1
        if rule == "threshold":
            return available if step >= config.steps - 1 else min(available, max(1, n_confident))
        remaining = masked_after_step(state.block_size, step, config.steps, config.schedule)
        return max(0, available - remaining)


def _segment_starts(row: list[int]) -> list[int]:
    return [i for i, token in enumerate(row) if token in _BEGINS]


def _sequences(ids: torch.Tensor) -> list[list[tuple[torch.Tensor, int]]]:
    """Per row: (positions after each text/audio BEGIN up to the next segment, END id), found by the markers."""
    out = []
    for row in ids.tolist():
        starts = _segment_starts(row) + [len(row)]
        out.append([(torch.arange(start + 1, stop, device=ids.device), _BEGIN_TO_END[row[start]])
                    for start, stop in zip(starts, starts[1:]) if row[start] in _BEGIN_TO_END])
    return out


def _semi_ar_blocks(sample: torch.Tensor, block_length: int) -> torch.Tensor:
    """(B, L) block of each MASK position: segments left to right, ``block_length`` slots per block, as in the
    sampler (a block never straddles two segments); _NO_BLOCK elsewhere."""
    block_of = torch.full(sample.shape, _NO_BLOCK, dtype=torch.long)
    for b, row in enumerate(sample.tolist()):
        starts = _segment_starts(row) + [len(row)]
        first_block = 0
        for start, stop in zip(starts, starts[1:]):
            slots = torch.arange(stop - start - 1)
            block_of[b, start + 1:stop] = first_block + slots // block_length
            first_block += math.ceil(len(slots) / block_length)
    return torch.where(sample.cpu() == MASK, block_of, _NO_BLOCK).to(sample.device)


__all__ = ["MaskedDiffusionScheduler", "MaskedDiffusionSchedulerOutput"]
