"""Turn data sets into token ids with a codec stack, once, and cache the result.

Training reads only ids: captions through the text codec, pictures through the image codec, speech through
the audio codec. Encoding a 2,000-sample set takes a minute on the CPU, so the ids are cached under
``~/.cache/unimodal/tokens`` keyed by the data set and a fingerprint of the codec weights: retraining a
codec invalidates its cache, nothing else does.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from unimodal.tokenizers_mm import CODECS, codec_folder, get_codec_class
from unimodal.tokenizers_mm.layout import Layout
from unimodal.training.checkpoint import load_checkpoint, save_atomic
from unimodal.training.data.store import BuiltDataset, Sample
from unimodal.core.errors import DataError, InputError
from unimodal.core.paths import cache_root

CODEC_MODALITIES = tuple(CODECS)  # re-exported for export.py and train.py; the registry is the one list


MAX_AUDIO_SECONDS = 5.12  # longest clip a sample keeps: 80 codes at 15.625 codes/s, 160 at 31.25


@dataclass
class CodecStack:
    """The three codecs and the layout of their shared vocabulary."""

    text: object
    image: object
    audio: object
    layout: Layout

    @classmethod
    def load(cls, directory: str | os.PathLike, max_text_len: int = 32, max_audio_len: int | None = None,
             max_audio_seconds: float = MAX_AUDIO_SECONDS) -> "CodecStack":
        """Codecs from ``directory/{text,image,audio}`` (each a codec folder, or a codec training run whose
        result is in ``codec/``); the layout follows from their sizes. The audio segment holds
        ``max_audio_len`` codes, by default ``max_audio_seconds`` at the audio codec's frame rate."""
        codecs = {m: get_codec_class(m).from_pretrained(codec_folder(directory, m)) for m in CODEC_MODALITIES}
        if max_audio_len is None:
            max_audio_len = round(max_audio_seconds * float(codecs["audio"].frame_rate))
            if max_audio_len < 1:
                raise InputError(f"max_audio_seconds {max_audio_seconds} holds no audio code at "
                                 f"{codecs['audio'].frame_rate} codes/s")
        layout = Layout(text_vocab_size=codecs["text"].codebook_size,
                        image_codebook_size=codecs["image"].codebook_size,
                        audio_codebook_size=codecs["audio"].codebook_size,
                        audio_frame_rate=float(codecs["audio"].frame_rate), image_grid=tuple(codecs["image"].grid),
                        image_patch=int(codecs["image"].patch), max_text_len=max_text_len,
                        max_audio_len=max_audio_len)
        return cls(layout=layout, **codecs)

    def fingerprint(self, directory: str | os.PathLike) -> str:
        digest = hashlib.sha256()
        for modality in CODEC_MODALITIES:
            folder = codec_folder(directory, modality)
            for path in sorted(folder.rglob("*")):
                parts = path.relative_to(folder).parts  # the vocoder only decodes; dot-folders are staging
                if path.is_file() and "vocoder" not in parts and not any(p.startswith(".") for p in parts):
                    digest.update(f"{modality}/{path.relative_to(folder).as_posix()}".encode())
                    digest.update(path.read_bytes())
        digest.update(repr(self.layout.to_dict()).encode())
        return digest.hexdigest()[:16]


def encode_samples(stack: CodecStack, samples: list[Sample], batch_size: int = 64, progress: bool = True,
                   cut: dict | None = None) -> list[dict[str, torch.Tensor]]:
    """Local ids of every modality each sample has; text and audio cut to the layout's maximum length (``cut``,
    when given, gets per modality how many were cut and the longest, in ids)."""
    out: list[dict[str, torch.Tensor]] = [{} for _ in samples]
    bar = tqdm(total=len(samples), desc="encoding", unit="sample", disable=not progress)
    for start in range(0, len(samples), batch_size):
        chunk = samples[start:start + batch_size]
        for modality, codec, limit in (("text", stack.text, stack.layout.max_text_len),
                                       ("image", stack.image, None), ("audio", stack.audio, stack.layout.max_audio_len)):
            rows = [i for i, s in enumerate(chunk) if getattr(s, modality) is not None]
            if not rows:
                continue
            values = [getattr(chunk[i], modality) for i in rows]
            ids = codec.encode(np.stack(values) if modality == "image" else values)
            for i, row_ids in zip(rows, ids):
                out[start + i][modality] = row_ids[:limit].clone() if limit else row_ids.clone()
                if cut is not None and limit and len(row_ids) > limit:
                    count, longest = cut.get(modality, (0, 0))
                    cut[modality] = (count + 1, max(longest, len(row_ids)))
        bar.update(len(chunk))
    bar.close()
    return out


FOLDER_VAL_FRACTION = 0.05  # a user's manifest has no splits: every 20th record validates


def _source_key(source: Path) -> str:
    """Names a data source in the cache: its path and the modification time of its index file (a manifest, or a
    built set's info.json), so two data sets with the same folder name never share cached tokens; for a manifest
    also the size and modification time of every file it names (a picture replaced, or a missing one put in place,
    is read again)."""
    index = source if source.is_file() else source / "info.json"
    stat = index.stat()
    digest = hashlib.sha256(f"{source.resolve()}:{stat.st_mtime_ns}:{stat.st_size}".encode())
    if source.is_file():
        digest.update(_named_files_state(source).encode())
    return f"{source.stem if source.is_file() else source.name}-{digest.hexdigest()[:10]}"


def _named_files_state(manifest: Path) -> str:
    """Size and modification time (or absence) of each file a manifest's records name, in order: cheap next to
    reading them (one stat a file), malformed lines ignored (the reading names them)."""
    import json

    state = []
    with open(manifest, "rb") as f:
        for raw in f:
            try:
                record = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                continue
            if not isinstance(record, dict):
                continue
            for key in ("image", "audio"):
                name = record.get(key)
                if isinstance(name, str) and name:
                    try:
                        stat = (manifest.parent / name).stat()
                        state.append(f"{name}:{stat.st_mtime_ns}:{stat.st_size}")
                    except OSError:
                        state.append(f"{name}:missing")
    return "\n".join(state)


# The last manifest checked in this process (its records, not its samples), keyed by its path, its cache key (the
# manifest's and its files' sizes and times) and skip_bad: a run reads its train and val splits from one check.
_CHECKED: dict[tuple, object] = {}


def _load_samples(source: Path, split: str, skip_bad: bool = False, skipped: list | None = None,
                  progress: bool = False, source_key: str | None = None) -> list[Sample]:
    """The samples of one split; a manifest's bad records skipped with ``skip_bad`` are put in ``skipped``."""
    skipped = [] if skipped is None else skipped
    if source.is_file():  # a JSONL manifest of the user's own data
        from unimodal.training.data.folder import FolderDataset

        key = (str(source.resolve()), source_key or _source_key(source), skip_bad)
        if key not in _CHECKED:  # the train split's check serves its val split: every file is read once for it
            _CHECKED.clear()
            _CHECKED[key] = FolderDataset(source, skip_bad=skip_bad, progress=progress)
        dataset = _CHECKED[key]
        skipped[:] = [f"line {e.line}: {e.reason}" for e in dataset.skipped]
        period = round(1 / FOLDER_VAL_FRACTION)  # by line number: a record skipped or fixed moves no other one
        keep = [i for i, (line, _) in enumerate(dataset.records) if (line % period == 0) == (split == "val")]
        if split not in ("train", "val"):
            raise DataError(f"a manifest has only train and val splits, not {split!r}")
        return [dataset[i] for i in keep]
    dataset = BuiltDataset(source, split)
    return [dataset[i] for i in range(len(dataset))]


def tokenized_split(stack: CodecStack, codec_dir: str | os.PathLike, source: str | os.PathLike, split: str,
                    progress: bool = True, skip_bad: bool = False, quiet: bool = False,
                    skipped_out: list | None = None) -> list[dict[str, torch.Tensor]]:
    """Ids of one split of a built data set or a JSONL manifest, from the cache when the same codecs encoded
    the same data before; ``skip_bad``: a manifest's bad records are skipped (said on stderr) instead of refused
    (cached apart, so a later run without it reads the manifest again and refuses them); ``quiet``: say nothing
    of skipped or cut records (a run's other processes: its main one says it); ``skipped_out``: extended with the
    skipped records ("line N: reason"), for a pack to keep them."""
    source = Path(source)
    skipping = "-skipbad" if skip_bad and source.is_file() else ""
    source_key = _source_key(source)  # for a manifest, a stat of every file it names: computed once here
    path = cache_root() / "tokens" / f"{source_key}{skipping}-{split}-{stack.fingerprint(codec_dir)}.pt"
    if path.exists():
        cached = load_checkpoint(path)
        if skipped_out is not None:
            skipped_out.extend(cached.get("skipped", []))
        if not quiet:
            _say_skipped(source, split, cached.get("skipped", []), len(cached["tokens"]))
        return cached["tokens"]
    skipped: list[str] = []
    cut: dict = {}
    tokens = encode_samples(stack, _load_samples(source, split, skip_bad, skipped, progress, source_key),
                            progress=progress, cut=cut)
    save_atomic({"tokens": tokens, "data": str(source), "split": split, "skipped": skipped}, path)
    if skipped_out is not None:
        skipped_out.extend(skipped)
    if not quiet:
        _say_skipped(source, split, skipped, len(tokens))
    if cut and source.is_file() and not quiet:  # a user's own data: what the model will not see (said when encoded)
        _say_cut(source, split, cut, len(tokens), stack.layout)
    return tokens


def _say_cut(source: Path, split: str, cut: dict, n: int, layout: Layout) -> None:
    """The texts and clips of a manifest longer than the model's text / audio segment, cut to it, said on stderr."""
    parts = []
    if "text" in cut:
        parts.append(f"{cut['text'][0]} text(s) cut to their first {layout.max_text_len} tokens (the longest "
                     f"{cut['text'][1]})")
    if "audio" in cut:
        rate = layout.audio_frame_rate
        parts.append(f"{cut['audio'][0]} clip(s) cut to their first {layout.max_audio_len / rate:g} s (the longest "
                     f"{cut['audio'][1] / rate:.2f} s; --max-audio-seconds sets the segment)")
    print(f"{source} ({split}, {n} samples): {'; '.join(parts)}", file=sys.stderr, flush=True)


def _say_skipped(source, split: str, skipped: list[str], kept: int, when: str = "") -> None:
    """A manifest's records skipped by ``--skip-bad``, said on stderr whenever its training split is read (from the
    cache, or from a pack (``when``: " when packed"), too: they are never dropped silently); its val split skips the
    same records and says nothing more."""
    if skipped and split == "train":
        more = f"; and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        print(f"{source}: {len(skipped)} bad record(s) skipped{when} (--skip-bad), {kept} training samples kept: "
              f"{'; '.join(skipped[:5])}{more}", file=sys.stderr, flush=True)
