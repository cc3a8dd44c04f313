"""A diffusers-style scheduler for masked diffusion: the stored sampling settings and their step.

:class:`MaskedDiffusionScheduler` holds no weights, only the sampling settings (saved as
``scheduler_config.json``). It serves two purposes:

* the pipeline's settings: :meth:`~MaskedDiffusionScheduler.sampler_config` turns the stored settings (plus the
  defaults of the generated modality and per-call overrides) into a
  :class:`~unimodal.inference.unmasking.SamplerConfig` for the batched :func:`unimodal.inference.sampler.generate`;
* a loop you write yourself, as with any diffusers scheduler::

      scheduler.set_timesteps(16)
      allowed = MaskedDiffusionScheduler.allowed_for(layout, packed)   # (L, V): ids each position may take
      for index, mask_ratio in enumerate(scheduler.timesteps):
          logits = model(ids, t, ...).logits                            # (B, L, V)
          ids = scheduler.step(logits, index, ids, allowed, generator).prev_sample

  ``step`` is the sampler's own step (:class:`~unimodal.inference.unmasking.UnmaskingScheduler`: the one
  commit rule, with its modes, schedules, skipped empty steps and MaskGIT order, documented there), so with
  the same generator seed a hand-written loop gives the sampler's tokens. Here the blocks of ``semi_ar`` are
  found from the segment markers in ``sample``, and text and audio are kept well formed the same way: after a
  segment's first END (or PAD) every later position becomes PAD. In ``semi_ar`` loop ``while (ids ==
  MASK).any()``: ``num_inference_steps`` is per block. ``step`` keeps the rule's state between calls; it
  starts afresh at step index 0 and after :meth:`set_timesteps`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, SchedulerMixin  # SchedulerMixin: diffusers pipelines look the name up here
from diffusers.configuration_utils import register_to_config
from diffusers.utils import BaseOutput

from unimodal.inference.unmasking import (NO_BLOCK, SAMPLER_SETTINGS, TOKEN_SETTINGS, SamplerConfig,
                                          UnmaskingScheduler, pad_after_end, slot_blocks)
from unimodal.tokenizers_mm.layout import BOA, BOI, BOT, EOA, EOT, MASK, Layout, Packed
from unimodal.core.errors import InputError

# Defaults per generated modality, beneath the caller's own settings (docs/results.md has the measurements):
# images and speech need guidance and MaskGIT's randomised commit order (a greedy order fills a picture with
# background first); captions decode greedily with threshold 0.95, which gave the same tokens as one token per
# pass (100 captions, agreement 1.000) in 4-6x fewer passes, where 16 cosine steps lost 5 points. Speech draws its
# codes at temperature 0.7 over up to 32 steps: on the model r9, 200 test captions spoken so that Whisper gets them
# exactly 0.175 -> 0.270 (paired +0.095 [+0.030, +0.165]; WER 0.514 -> 0.406) for 1.6x the passes, where either
# change alone moved it within the noise (docs/results.md, "Speech sampling"). Pictures draw their codes at
# temperature 0.7: on soup50 the digits went 0.536 -> 0.613 of 181 (+0.077 [+0.017, +0.138]) and the test scenes,
# held-out pairs and audio->image stayed within the noise (docs/results.md, "Picture sampling").
DEFAULT_TARGET_SETTINGS = {
    "image": {"temperature": 0.7, "choice_temperature": 4.5, "cfg": 3.0},
    "audio": {"temperature": 0.7, "choice_temperature": 4.5, "cfg": 3.0, "steps": 32},
    "text": {"temperature": 0.0, "mode": "threshold", "tau": 0.95, "steps": 32},
}
# A caption from nothing (no input to read) is sampled at temperature 0.5 in text's order (threshold, commit by
# confidence): greedy would write one caption for every seed. Confidence order commits first the word the model
# is surest of whatever the rest; on r12, whose data mix had moved, that wrote "a handwritten N" for 64 of 64
# seeds, though left to right (LEFT_TO_RIGHT_TEXT, nearly ancestral sampling) it writes 62 scenes of 64. The
# shipped r10 was judged with confidence order and its joint agreement falls under left to right (0.438 ->
# 0.250), so that stays the default and a model folder stores its own (``scheduler/scheduler_config.json``, key
# ``unconditional_text``; docs/results.md, "Captions from nothing"). The order keys apply as a unit (a caller
# who sets any of them chooses the order); the others, such as the temperature, each unless the caller sets it.
UNCONDITIONAL_TEXT_SETTINGS = {"temperature": 0.5}
LEFT_TO_RIGHT_TEXT = {"mode": "semi_ar", "block_length": 1, "steps": 1, "temperature": 0.5}
UNCONDITIONAL_TEXT_ORDER = ("mode", "block_length", "steps", "block_mode")


def unconditional_text_settings(settings: Mapping, defaults: dict | None = None) -> dict:
    """``settings`` (a caller's, None values meaning unset) for text from nothing: the caller's own keys, over
    ``defaults`` (:data:`UNCONDITIONAL_TEXT_SETTINGS` when None; the order keys only where the caller set none of
    them)."""
    given = {name: value for name, value in settings.items() if value is not None}
    defaults = dict(UNCONDITIONAL_TEXT_SETTINGS if defaults is None else defaults)
    if any(name in given for name in UNCONDITIONAL_TEXT_ORDER):
        defaults = {name: value for name, value in defaults.items() if name not in UNCONDITIONAL_TEXT_ORDER}
    return {**settings, **defaults, **given}


TARGET_PRIORITY = ("image", "audio", "text")  # a joint request takes the defaults of its first target here
_TARGET_KEYS = tuple(name for name in TOKEN_SETTINGS if name != "seed")  # what a modality's defaults may set
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
    ``unconditional_text``: the settings of text from nothing, over text's defaults (None stores
    :data:`UNCONDITIONAL_TEXT_SETTINGS`; ``{}``: text's defaults alone).
    """

    config_name = "scheduler_config.json"
    order = 1

    @register_to_config
    def __init__(self, mode: str = "confidence", schedule: str = "cosine", num_inference_steps: int = 16,
                 tau: float = 0.9, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 block_length: int = 16, block_mode: str = "confidence", choice_temperature: float = 0.0,
                 target_settings: dict | None = None, unconditional_text: dict | None = None):
        if target_settings is None:
            self.register_to_config(target_settings={m: dict(v) for m, v in DEFAULT_TARGET_SETTINGS.items()})
        if unconditional_text is None:
            self.register_to_config(unconditional_text=dict(UNCONDITIONAL_TEXT_SETTINGS))
        self._check_target_settings()
        self.set_timesteps(num_inference_steps)  # validates every setting now (InputError names the bad one)

    # ---- settings ------------------------------------------------------------------------------------------

    def _check_target_settings(self) -> None:
        table = self.config.target_settings
        if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
            raise InputError(f"target_settings must map a modality to a dict of settings, got {table!r}")
        unknown = sorted(set(table) - set(TARGET_PRIORITY))
        if unknown:
            raise InputError(f"target_settings: unknown modalities {unknown}; accepted: {list(TARGET_PRIORITY)}")
        for modality, values in table.items():
            self._check_settings(f"target_settings[{modality!r}]", values, modality)
        values = self.config.unconditional_text
        if not isinstance(values, dict):
            raise InputError(f"unconditional_text must be a dict of settings, got {values!r}")
        self._check_settings("unconditional_text", values, "text")

    def _check_settings(self, name: str, values: dict, modality: str) -> None:
        """One stored table of defaults (``name`` as the config spells it): known keys, values a sampler takes
        (over ``modality``'s defaults)."""
        wrong = sorted(set(values) - set(_TARGET_KEYS))
        if wrong:
            raise InputError(f"{name}: unknown settings {wrong}; accepted: {list(_TARGET_KEYS)}")
        self.sampler_config(targets=[modality], **values)  # validates the values

    def unconditional_text_settings(self, settings: Mapping) -> dict:
        """A caller's ``settings`` for text from nothing, over this scheduler's ``unconditional_text`` defaults
        (see :func:`unconditional_text_settings`)."""
        return unconditional_text_settings(settings, self.config.unconditional_text)

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
        unknown = sorted(set(overrides) - set(SAMPLER_SETTINGS))
        if unknown:
            raise InputError(f"unknown sampler settings {unknown}; accepted: {sorted(SAMPLER_SETTINGS)}")
        # The settings this scheduler stores are its config keys that are SamplerConfig fields, and steps.
        stored = {name: self.config[name] for name in SAMPLER_SETTINGS if name in self.config}
        stored["steps"] = self.config.num_inference_steps
        stored.update(self.target_defaults(targets))
        stored.update({name: value for name, value in overrides.items() if value is not None})
        return SamplerConfig(**stored)

    def set_timesteps(self, num_inference_steps: int | None = None, device: str | torch.device | None = None) -> None:
        """``self.timesteps``: the mask ratio before each step (1.0 first), from the schedule; resets the state."""
        steps = self.config.num_inference_steps if num_inference_steps is None else num_inference_steps
        timesteps = UnmaskingScheduler(self.sampler_config(steps=steps)).timesteps  # validates
        self.num_inference_steps = steps
        self.timesteps = timesteps.to(device) if device is not None else timesteps
        self._rule: UnmaskingScheduler | None = None

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
        sample, index = self._checked(model_output, timestep, sample)
        if allowed is None:
            allowed = torch.ones(model_output.shape[-1], dtype=torch.bool, device=sample.device)
            allowed[MASK] = False
        if self._rule is None or index == 0:
            self._rule = UnmaskingScheduler(self.sampler_config(steps=self.num_inference_steps))
            self._rule.set_timesteps(_blocks(sample, self._rule.config), sample.shape[0])
        generators = generator if isinstance(generator, (list, tuple)) else [generator] * sample.shape[0]
        out = self._rule.step(model_output, sample, allowed.to(sample.device), list(generators))
        prev_sample = out.prev_sample
        for row, sequences in enumerate(_sequences(prev_sample)):
            pad_after_end(prev_sample[row:row + 1], sequences)  # in place
        result = (prev_sample, out.confidence.float(), out.committed)
        return MaskedDiffusionSchedulerOutput(*result) if return_dict else result

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


def _blocks(sample: torch.Tensor, config: SamplerConfig) -> torch.Tensor:
    """(B, L) block of each position of a hand-written loop's ``sample``: in ``semi_ar`` the positions after
    each segment's BEGIN marker, cut into blocks as the sampler cuts its targets; otherwise block 0 for every
    MASK. Positions that are not MASK never open a block."""
    if config.mode != "semi_ar":
        return torch.where(sample == MASK, 0, NO_BLOCK)
    rows = []
    for row in sample.tolist():
        starts = _segment_starts(row) + [len(row)]
        segments = [torch.arange(start + 1, stop) for start, stop in zip(starts, starts[1:])]
        rows.append(slot_blocks(segments, len(row), config))
    return torch.where(sample == MASK, torch.stack(rows).to(sample.device), NO_BLOCK)


__all__ = ["MaskedDiffusionScheduler", "MaskedDiffusionSchedulerOutput"]
