"""Word probe: how well a model reads a picture's attributes, one caption word at a time.

A judged caption is right only when every attribute is, so 64 judged captions separate two recipes only when
they differ a lot (recipe variants at one budget all landed inside each other's noise). The probe asks the
narrower question on many more words: given the picture and the caption's other words, is each attribute
word (colour, shape, size, position) the model's first choice?

- masked diffusion: every attribute word of a caption is masked at once, the rest of the caption stays
  visible (the state the sampler reaches once the template words are committed), ``t`` = the masked share;
- autoregressive twin: the argmax of the next-token prediction at each attribute word (its own inference
  state: everything before the word visible).

Both figures are also given by the caption's object count (``by_objects``: one-object and two-object scenes),
and for a diffusion model a second state (``in_view``): each attribute word masked alone, every other word of
the true caption in view. That isolates binding: in a two-object scene a model that knows which object a slot
describes names its attribute from the picture; one that does not names the other object's as often (the reading
gap on fresh scenes, docs/results.md). The twin's own state already shows it the words before (its second object
with the first in view).

Both read the same image->text validation examples. A word counts when the text codec writes it as one token
(every attribute word is one token in the shipped codec; a codec that splits a word leaves it out). The figure
is a teacher-forced accuracy, not a judged one: it says where a recipe stands early and cheaply, ``unimodal
eval`` still decides.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from unimodal.backbone.dit import DiT
from unimodal.core.errors import InputError
from unimodal.core.grammar import COLORS, POSITIONS, SHAPES, SIZES
from unimodal.core.int8 import load_pretrained
from unimodal.tokenizers_mm.layout import MASK, Layout
from unimodal.training.tasks import Task, build_example, collate_examples

WORD_CLASSES = {"colour": tuple(COLORS), "shape": SHAPES, "size": tuple(SIZES), "position": tuple(POSITIONS)}


def attribute_positions(text_codec, layout, caption_ids: torch.Tensor, offset: int) -> dict[int, str]:
    """Packed positions (``offset`` + index in the caption) of the attribute words, with their class."""
    found = {}
    for i, local in enumerate(caption_ids.tolist()):
        word = text_codec.decode_one([local]).strip().lower()
        for name, words in WORD_CLASSES.items():
            if word in words:
                found[offset + i] = name
    return found


@torch.no_grad()
def word_probe(model_dir: str | Path, tokens: list[dict], text_codec, batch_size: int = 32,
               source: str = "image") -> dict:
    """Per word class and overall: the share of attribute words that are the model's first choice, over the
    ``source``->text examples in ``tokens`` (ids per modality, as training reads them): ``source`` "image" reads
    pictures, "audio" hears the captions spoken."""
    if source not in ("image", "audio"):
        raise InputError(f"the word probe reads captions from an image or from audio, not from {source!r}")
    model_dir = Path(model_dir)
    config_file = model_dir / "training_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    autoregressive = config.get("objective") == "ar"
    model = load_pretrained(DiT, model_dir / "backbone").eval()
    layout = Layout.load(model_dir)
    task = Task.parse(f"{source}->text")
    samples = [s for s in tokens if {source, "text"} <= set(s)]
    if not samples:
        raise InputError(f"the word probe needs {source}+text samples; the data holds none")
    right = {name: 0 for name in WORD_CLASSES}
    seen = {name: 0 for name in WORD_CLASSES}
    by_objects = {}  # caption object count -> [right, seen], the probe's own state
    in_view = {}  # diffusion: the same, each attribute word masked alone
    for start in range(0, len(samples), batch_size):
        chunk = samples[start:start + batch_size]
        batch = collate_examples([build_example(layout, s, task, pad_targets=not autoregressive) for s in chunk])
        b = batch.batch
        classes = []  # per row: packed position -> class
        for row, sample in enumerate(chunk):
            offset = int(batch.maskable[row].nonzero()[0])  # first target slot: the caption's first word
            caption = layout.to_shared("text", sample["text"])
            if not torch.equal(b.ids[row, offset:offset + len(caption)], caption):
                raise AssertionError("the caption is not where the probe reads it: the packing changed")
            classes.append(attribute_positions(text_codec, layout, sample["text"], offset))
        if autoregressive:
            out = model(b.ids, torch.zeros(len(chunk)), b.segment_ids, b.positions, batch.is_target, b.attention_mask)
            guess = torch.full_like(b.ids, -1)
            guess[:, 1:] = out.logits[:, :-1].argmax(-1)  # the prediction made at the word before
        else:
            noisy = b.ids.clone()
            for row, where in enumerate(classes):
                noisy[row, list(where)] = MASK
            guess = _masked_guess(model, batch, noisy)
        objects = [max(sum(name == "shape" for name in where.values()), 1) for where in classes]
        for row, where in enumerate(classes):
            for pos, name in where.items():
                seen[name] += 1
                right[name] += int(guess[row, pos] == b.ids[row, pos])
                _count(by_objects, objects[row], guess[row, pos] == b.ids[row, pos])
        if not autoregressive:
            _one_word_at_a_time(model, batch, classes, objects, in_view)
    total = sum(seen.values())
    return {"objective": "ar" if autoregressive else "diffusion", "source": source, "captions": len(samples),
            "words": total,
            "accuracy": sum(right.values()) / max(total, 1),
            "by_class": {name: {"words": seen[name], "accuracy": right[name] / max(seen[name], 1)}
                         for name in WORD_CLASSES if seen[name]},
            "by_objects": _rates(by_objects),
            **({"in_view": _rates(in_view)} if in_view else {})}


def _masked_guess(model, batch, noisy: torch.Tensor) -> torch.Tensor:
    """A diffusion model's first choice at every slot of ``noisy`` (B, L), ``t`` its masked share of each row."""
    b = batch.batch
    t = (noisy == MASK).sum(1).float() / batch.maskable.sum(1).clamp_min(1)
    return model(noisy, t, b.segment_ids, b.positions, batch.is_target, b.attention_mask).logits.argmax(-1)


def _one_word_at_a_time(model, batch, classes: list[dict[int, str]], objects: list[int], tally: dict) -> None:
    """Each attribute word masked alone, the rest of the true caption in view: the k-th word of every row in
    the k-th forward."""
    b = batch.batch
    for k in range(max((len(where) for where in classes), default=0)):
        noisy, probed = b.ids.clone(), {}
        for row, where in enumerate(classes):
            if k < len(where):
                probed[row] = list(where)[k]
                noisy[row, probed[row]] = MASK
        guess = _masked_guess(model, batch, noisy)
        for row, pos in probed.items():
            _count(tally, objects[row], guess[row, pos] == b.ids[row, pos])


def _count(tally: dict, objects: int, right) -> None:
    counts = tally.setdefault(str(objects), [0, 0])
    counts[0] += int(right)
    counts[1] += 1


def _rates(tally: dict) -> dict:
    return {key: {"words": seen, "accuracy": right / seen} for key, (right, seen) in sorted(tally.items())}
