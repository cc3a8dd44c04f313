"""Build the embedded data sets into a cache folder: ``unimodal data build NAME --n N --out DIR``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tqdm.auto import tqdm

from unimodal.training.data import digits, scenes
from unimodal.training.data.speech import SAMPLE_RATE, check_voices
from unimodal.training.data.store import Sample, publish, staging_dir, write_info, write_split
from unimodal.core.errors import InputError
from unimodal.core.grammar import IMAGE_SIZE

SCENE_SPLIT_IDS = {"train": 0, "val": 1, "test": 2, "heldout": 3}


def scene_split_sizes(n: int) -> dict[str, int]:
    """train/val/test share ``n`` 80/10/10; the heldout split adds n/10 more."""
    n_train, n_val = int(n * 0.8), int(n * 0.1)
    return {"train": n_train, "val": n_val, "test": n - n_train - n_val, "heldout": max(1, n // 10)}


def _build_scenes(n: int, seed: int, speech: bool, bar: tqdm, pair_fraction: float = scenes.PAIR_FRACTION,
                  voices: str = "varied") -> dict[str, list[Sample]]:
    splits = {}
    for split, count in scene_split_sizes(n).items():
        samples = []
        for i in range(count):
            samples.append(scenes.make_sample(seed, SCENE_SPLIT_IDS[split], i, heldout=split == "heldout", speech=speech,
                                              pair_fraction=pair_fraction, voices=voices))
            bar.update(1)
        splits[split] = samples
    return splits


def _build_digits(n: int, seed: int, speech: bool, bar: tqdm, voices: str = "varied") -> dict[str, list[Sample]]:
    fraction = n / digits.NUM_DIGITS
    return {split: digits.make_samples(seed, split, idx[: max(1, round(len(idx) * fraction))], speech, bar, voices)
            for split, idx in digits.split_indices(seed).items()}


BUILDERS = {"scenes": _build_scenes, "digits": _build_digits}
DEFAULT_N = {"scenes": 2000, "digits": digits.NUM_DIGITS}


def _bar_label(name: str, n: int) -> str:
    """What the progress bar counts: for scenes, the ``n`` asked for plus the held-out scenes it adds, so a bar
    that ends at 2,200 for ``--n 2000`` says why."""
    if name == "scenes":
        return f"building scenes ({n} train/val/test + {scene_split_sizes(n)['heldout']} held-out)"
    return f"building {name}"


def _total(name: str, n: int) -> int:
    if name == "scenes":
        return sum(scene_split_sizes(n).values())
    return min(n, digits.NUM_DIGITS)


def check_pair_fraction(name: str, pair_fraction) -> float | None:
    """``pair_fraction`` as :func:`build` takes it: for scenes a number from 0 to 1 (None: the default,
    :data:`scenes.PAIR_FRACTION`), for other data sets None; an :class:`InputError` naming it otherwise."""
    if pair_fraction is None:
        return scenes.PAIR_FRACTION if name == "scenes" else None
    if name != "scenes":
        raise InputError(f"--pair-fraction is the share of two-object scenes; {name!r} has no pairs (leave it out)")
    if isinstance(pair_fraction, bool) or not isinstance(pair_fraction, (int, float)) or not 0 <= pair_fraction <= 1:
        raise InputError(f"--pair-fraction must be a number from 0 to 1 (the share of two-object scenes; default "
                         f"{scenes.PAIR_FRACTION}), got {pair_fraction!r}")
    return float(pair_fraction)


def _built_with(out: Path, settings: dict) -> bool:
    """Whether ``out`` holds a complete build whose ``info.json`` says these settings (it is written last, on
    publish)."""
    info_file = out / "info.json"
    if not info_file.is_file():
        return False
    info = json.loads(info_file.read_text())
    if info.get("speech"):  # a build from before voice sets spoke every caption in the varied set
        info.setdefault("voices", "varied")
    return all(info.get(k) == v for k, v in settings.items())


def build(name: str, n: int | None = None, seed: int = 0, out: str | Path | None = None, speech: bool = True,
          progress: bool = True, pair_fraction: float | None = None, voices: str = "varied",
          reuse: bool = False) -> Path:
    """Build data set ``name`` with ``n`` samples into ``out`` (default: the cache) and return the folder.

    ``pair_fraction`` (scenes only): the share of two-object scenes in every split (default
    :data:`scenes.PAIR_FRACTION`); the default folder then says it (``scenes-n10000-seed4-pairs0.7``). One-object
    scenes are the easy ones (the shipped model draws and reads nearly all of them), so a set with more pairs
    spends a training run where its errors are. ``unimodal eval`` judges on its own fixed cases, not on this set.

    ``voices``: the eSpeak voice set the captions are spoken in (:data:`VOICE_SETS`): ``"varied"`` (the default,
    many voices), or ``"clear"`` (the few the speech judge hears best: speech for the model to learn to say);
    another set names the default folder (``scenes-n40000-seed1-voicesclear``) and is written in ``info.json``.

    The build happens in a staging folder and is moved into place only when complete, so an interrupted
    build never leaves a half-written data set behind. ``reuse``: when ``out`` already holds a complete build of
    the same set with the same settings (its ``info.json`` says so), return it as it is instead of building again
    (builds are deterministic, so it is the same data); a folder built with other settings is built over.
    """
    if name not in BUILDERS:
        raise InputError(f"unknown data set {name!r}; the embedded ones are {sorted(BUILDERS)} "
                         f"(your own data: a JSONL manifest, see unimodal.training.data.folder)")
    pair_fraction = check_pair_fraction(name, pair_fraction)
    voices = check_voices(voices)
    if voices != "varied" and not speech:
        raise InputError(f"--voices {voices} says how the captions are spoken; with --no-speech none are (leave one out)")
    n = DEFAULT_N[name] if n is None else n
    if not isinstance(n, int) or n < 10:
        raise InputError(f"--n must be an integer >= 10, got {n!r}")
    if name == "digits" and n > digits.NUM_DIGITS:
        raise InputError(f"digits has {digits.NUM_DIGITS} real samples; --n {n} asks for more "
                         f"(use --n <= {digits.NUM_DIGITS})")
    if out is None:
        from unimodal.core.paths import data_dir

        out = data_dir(name, n, seed)
        if pair_fraction not in (None, scenes.PAIR_FRACTION):
            out = out.with_name(f"{out.name}-pairs{pair_fraction:g}")
        if voices != "varied":
            out = out.with_name(f"{out.name}-voices{voices}")
    out = Path(out)
    # what the build is made of, as info.json records it and --reuse compares it
    settings = {"name": name, "n": n, "seed": seed, "speech": speech, **({"voices": voices} if speech else {}),
                **({"pair_fraction": pair_fraction} if name == "scenes" else {})}
    if reuse and _built_with(out, settings):
        return out
    tmp = staging_dir(out)
    try:
        with tqdm(total=_total(name, n), desc=_bar_label(name, n), unit="sample", disable=not progress) as bar:
            options = {"pair_fraction": pair_fraction} if name == "scenes" else {}
            splits = BUILDERS[name](n, seed, speech, bar, voices=voices, **options)
        for split, samples in splits.items():
            write_split(tmp, split, samples)
        write_info(tmp, {**settings, "sample_rate": SAMPLE_RATE, "image_size": IMAGE_SIZE,
                         "splits": {s: len(v) for s, v in splits.items()},
                         **({"heldout_pairs": sorted(map(list, scenes.HELDOUT_PAIRS))} if name == "scenes" else {})})
        publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
