"""The any-to-any task mixture: which segments of a sample are conditions and which are targets.

A task is named ``"cond+cond->target+target"`` (``"text->image"``, ``"audio->text"``, ``"->text+image+audio"``
for joint generation, ``"->image"`` for one modality alone). Each training example draws a task among those
the sample can serve, then drops its condition with probability ``cond_drop`` (so the same model also
learns the unconditional distribution that classifier-free guidance needs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from unimodal.tokenizers_mm.layout import Batch, Layout, Packed, Segment, collate
from unimodal.core.errors import InputError

MODALITY_NAMES = ("text", "image", "audio")


@dataclass(frozen=True)
class Task:
    conditions: tuple[str, ...]
    targets: tuple[str, ...]

    @property
    def name(self) -> str:
        return "+".join(self.conditions) + "->" + "+".join(self.targets)

    @property
    def modalities(self) -> frozenset[str]:
        return frozenset(self.conditions + self.targets)

    @staticmethod
    def parse(name: str) -> "Task":
        """``"text->image"``; a bare modality ``"image"`` means ``"->image"``."""
        cond, _, target = name.rpartition("->") if "->" in name else ("", "", name)
        conditions = tuple(m for m in cond.split("+") if m)
        targets = tuple(m for m in target.split("+") if m)
        unknown = [m for m in conditions + targets if m not in MODALITY_NAMES]
        if unknown or not targets or set(conditions) & set(targets) or len(set(targets)) != len(targets):
            raise InputError(f"task {name!r} is not of the form 'cond+...->target+...' over {MODALITY_NAMES} "
                             f"with at least one target and no modality on both sides")
        return Task(conditions, targets)


DEFAULT_TASK_WEIGHTS = {
    "text->image": 3.0, "image->text": 2.0, "text->audio": 2.0, "audio->text": 2.0,
    "image->audio": 1.0, "audio->image": 1.0, "->text+image+audio": 1.0,
    "->text": 0.5, "->image": 0.5, "->audio": 0.5,
}


@dataclass
class TaskMixture:
    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_TASK_WEIGHTS))
    cond_drop: float = 0.1

    def __post_init__(self):
        self.tasks = [Task.parse(name) for name in self.weights]
        self.probs = np.array([float(w) for w in self.weights.values()])
        if (self.probs < 0).any() or self.probs.sum() <= 0:
            raise InputError(f"task weights must be >= 0 with a positive sum, got {dict(self.weights)}")
        if not 0.0 <= self.cond_drop < 1.0:
            raise InputError(f"cond_drop must lie in [0, 1), got {self.cond_drop}")

    def choose(self, rng: np.random.Generator, available: frozenset[str]) -> Task:
        """A task whose modalities the sample has, drawn by weight."""
        ok = np.array([task.modalities <= available for task in self.tasks])
        probs = self.probs * ok
        if probs.sum() == 0:
            raise InputError(f"no task in the mixture fits a sample holding {sorted(available)}")
        return self.tasks[rng.choice(len(self.tasks), p=probs / probs.sum())]


@dataclass(eq=False)
class Example:
    packed: Packed
    is_target: torch.Tensor  # (L,) bool: tokens of target segments (they see everything)
    maskable: torch.Tensor  # (L,) bool: target slots the model must learn to generate
    task: str


def build_example(layout: Layout, tokens: Mapping[str, torch.Tensor], task: Task, drop_condition: bool = False,
                  pad_targets: bool = True) -> Example:
    """Conditions first (plain segments), then targets. Masked diffusion pads targets to full size (so the
    model learns lengths: it fills the slots after END with PAD); an autoregressive model ends a target at its
    END marker (``pad_targets=False``)."""
    conditions = () if drop_condition else _canonical(task.conditions)
    target = layout.padded_segment if pad_targets else Segment
    segments = [Segment(m, tokens[m]) for m in conditions] + [target(m, tokens[m]) for m in _canonical(task.targets)]
    packed = layout.pack(segments)
    is_target = torch.zeros(len(packed), dtype=torch.bool)
    maskable = torch.zeros(len(packed), dtype=torch.bool)
    for span in packed.spans:
        if span.modality in task.targets:
            is_target[span.start:span.end] = True
            maskable[list(span.slots)] = True
    name = task.name if not drop_condition else "->" + "+".join(task.targets)
    return Example(packed, is_target, maskable, name)


def _canonical(modalities: tuple[str, ...]) -> list[str]:
    """Segments in the one fixed order (text, image, audio) that generation packs them in: a causal model
    must see them in the order it was trained on, whatever order a task's name lists them in."""
    return sorted(modalities, key=MODALITY_NAMES.index)


@dataclass(eq=False)
class ExampleBatch:
    batch: Batch
    is_target: torch.Tensor  # (B, L)
    maskable: torch.Tensor  # (B, L)
    tasks: list[str]


def collate_examples(examples: Sequence[Example], pad_to: int | None = None) -> ExampleBatch:
    batch = collate([e.packed for e in examples], pad_to=pad_to)
    length = batch.ids.shape[1]

    def pad(flags: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(flags, (0, length - flags.numel()), value=False)

    return ExampleBatch(batch, torch.stack([pad(e.is_target) for e in examples]),
                        torch.stack([pad(e.maskable) for e in examples]), [e.task for e in examples])
