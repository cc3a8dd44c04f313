"""Ground-truth cases for ``unimodal eval`` and ``unimodal bench versus-ar``, from the embedded data sets or a
built data folder.

The embedded sets are pure functions of (data seed, split, index), so the cases are made on the fly, no
build needed, and they are exactly the samples a build of any size holds: the first N of a split.
"""

from __future__ import annotations

from pathlib import Path

from unimodal.inference.evaluate import EvalCase
from unimodal.core.errors import InputError

EVAL_SPLITS = ("test", "heldout", "val")
DATA_SEED = 0  # the embedded sets' build seed (the default model was trained on seed 0's train split)


def check_case_request(data: str, split: str = "test", n: int = 100, voices: str = "varied") -> list[str]:
    """The entries of ``data``, every setting of :func:`load_cases` checked without reading a case (so a command
    refuses a wrong one before its model loads): the split, the count, the voice set, and no other voice set than
    the default for a built folder (its clips are spoken as it was built)."""
    from unimodal.training.data.speech import check_voices

    check_voices(voices)
    if split not in EVAL_SPLITS:
        raise InputError(f"--split must be one of {EVAL_SPLITS}, got {split!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"--n must be a positive number of cases per data set, got {n!r}")
    names = [name.strip() for name in str(data).split(",") if name.strip()]
    if not names:
        raise InputError("--data is empty; give scenes, digits or a built data folder")
    for name in names:
        if name not in ("scenes", "digits") and voices != "varied":
            raise InputError(f"--voices {voices} speaks the embedded scenes and digits; the built folder "
                             f"{name!r} holds its clips as it was built (its info.json says in which voices)")
    return names


def load_cases(data: str, split: str = "test", n: int = 100, speech: bool = True,
               voices: str = "varied") -> tuple[list[EvalCase], list[str]]:
    """Up to ``n`` cases from each comma-separated entry of ``data`` (``scenes``, ``digits`` or a built data
    folder) and notes on what was skipped (digits have no heldout split). ``voices``: the eSpeak voice set the
    embedded sets' captions are spoken in (the same scenes and captions whatever the set; a built folder's clips
    are spoken as it was built, so another set than the default is refused for one)."""
    names = check_case_request(data, split, n, voices)
    cases, notes = [], []
    for name in names:
        if name == "scenes":
            cases += _scene_cases(split, n, speech, voices)
        elif name == "digits":
            if split == "heldout":
                notes.append("digits have no heldout split (the held-out colour/shape pairs are a scenes idea); "
                             "skipped")
                continue
            cases += _digit_cases(split, n, speech, voices)
        else:
            cases += _folder_cases(Path(name), split, n, speech)
    if not cases:
        raise InputError(f"no evaluation cases in {data!r} for split {split!r}")
    return cases, notes


def _scene_cases(split: str, n: int, speech: bool, voices: str = "varied") -> list[EvalCase]:
    from unimodal.training.data.build import SCENE_SPLIT_IDS
    from unimodal.training.data.scenes import make_sample

    samples = [make_sample(DATA_SEED, SCENE_SPLIT_IDS[split], i, heldout=split == "heldout", speech=speech,
                           voices=voices) for i in range(n)]
    return [EvalCase("scene", s.text, s.image, s.audio, s.meta["attributes"]) for s in samples]


def _digit_cases(split: str, n: int, speech: bool, voices: str = "varied") -> list[EvalCase]:
    from unimodal.training.data import digits

    indices = digits.split_indices(DATA_SEED)[split][:n]
    return [EvalCase("digit", s.text, s.image, s.audio, s.meta["attributes"]["digit"])
            for s in digits.make_samples(DATA_SEED, split, indices, speech, voices=voices)]


def _folder_cases(folder: Path, split: str, n: int, speech: bool = True) -> list[EvalCase]:
    from unimodal.training.data.store import BuiltDataset

    if folder.is_file() and folder.suffix == ".jsonl":  # a manifest of the user's own data: nothing judges it
        raise InputError(f"--data entry {str(folder)!r} is a manifest of your own data: eval judges scenes and digits "
                         f"(scenes, digits or a folder `unimodal data build` wrote), whose judges know what each "
                         f"caption means; a model trained on a manifest is measured by its validation loss "
                         f"(`unimodal train` writes it to OUT/history.json and OUT/val_loss.png)")
    if not (folder / "info.json").is_file():
        raise InputError(f"--data entry {str(folder)!r} is neither scenes, digits nor a built data folder "
                         f"(one with info.json)")
    dataset = BuiltDataset(folder, split)
    cases = []
    for index in range(len(dataset)):
        if len(cases) == n:
            break
        sample = dataset[index]
        if not (sample.text or "").strip():  # every direction reads or scores the caption
            continue
        truth = sample.meta.get("attributes")
        kind = "scene" if isinstance(truth, dict) and "objects" in truth else \
            "digit" if isinstance(truth, dict) and "digit" in truth else "other"
        truth = truth["digit"] if kind == "digit" else truth if kind == "scene" else None
        cases.append(EvalCase(kind, sample.text, sample.image, sample.audio if speech else None, truth))
    return cases


__all__ = ["EVAL_SPLITS", "check_case_request", "load_cases"]
