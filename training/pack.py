"""A packed training set: every split of the tokenised data in one small safetensors file.

``unimodal data pack --data scenes-n40000-seed0,digits --out scenes.pack.safetensors`` encodes the data with the
codecs once (through the token cache) and writes the ids. Training from a pack needs no codecs, no eSpeak and
no data build: it is what travels to a GPU machine (``training/gpu_train.sh``).

Layout of the file: per split and modality, ``{split}/{modality}/ids`` (all samples' local ids, concatenated,
int16) and ``{split}/{modality}/lengths`` (int32, one per sample; -1 where the sample has no such segment). The
metadata holds the format version, the layout, the codec fingerprint and where the data came from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from unimodal.tokenizers_mm.layout import Layout
from unimodal.core.errors import DataError

PACK_FORMAT = 1
PACK_SUFFIX = ".pack.safetensors"
PACK_SPLITS = ("train", "val", "test", "heldout")
PACK_MODALITIES = ("text", "image", "audio")
MAX_PACK_BYTES = 30 * 1024 * 1024  # what a GPU machine's 64 MiB working tree leaves for data, with margin


@dataclass
class Pack:
    layout: Layout
    splits: dict[str, list[dict[str, torch.Tensor]]]
    meta: dict

    @property
    def fingerprint(self) -> str:
        return self.meta["codec_fingerprint"]

    def train_parts(self) -> list[tuple[str, int, float]]:
        """(source, training samples, weight) of each packed data set in order; one part of weight 1 for a pack
        written before weights were recorded."""
        parts = self.meta.get("train_parts")
        if not parts:
            return [(", ".join(self.meta.get("sources", [])) or "pack", len(self.splits["train"]), 1.0)]
        return [(p["source"], int(p["n"]), float(p["weight"])) for p in parts]

    def weighted_train(self, seed: int = 0) -> list[dict[str, torch.Tensor]]:
        """The training split with each data set drawn as often as its packed weight says (``digits:4``)."""
        from unimodal.training.data.sources import weighted

        out, start = [], 0
        for source, n, weight in self.train_parts():
            out += weighted(self.splits["train"][start:start + n], weight, seed, source)
            start += n
        return out


def is_pack(path: str | Path) -> bool:
    return str(path).endswith(PACK_SUFFIX) and Path(path).expanduser().is_file()


def pack_tokens(splits: dict[str, list[dict[str, torch.Tensor]]], layout: Layout, out: str | Path,
                meta: dict) -> Path:
    """Write ``splits`` (per split, per sample, local ids per modality) as a pack; atomic."""
    from safetensors.torch import save_file

    out = _checked_out(out)
    tensors = {}
    for split, samples in splits.items():
        for modality in PACK_MODALITIES:
            parts = [s[modality] for s in samples if modality in s]
            lengths = [len(s[modality]) if modality in s else -1 for s in samples]
            if max(lengths, default=-1) < 0:
                continue
            ids = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
            if ids.numel() and int(ids.max()) > torch.iinfo(torch.int16).max:
                raise DataError(f"{split}/{modality} ids exceed int16; a pack holds codebooks of <= 32767 ids")
            tensors[f"{split}/{modality}/ids"] = ids.to(torch.int16).contiguous()
            tensors[f"{split}/{modality}/lengths"] = torch.tensor(lengths, dtype=torch.int32)
    header = {"format": str(PACK_FORMAT), "layout": json.dumps(layout.to_dict()),
              "meta": json.dumps({**meta, "counts": {k: len(v) for k, v in splits.items()}})}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    save_file(tensors, str(tmp), metadata=header)
    tmp.replace(out)
    return out


def _checked_out(out: str | Path) -> Path:
    out = Path(out)
    if not out.name.endswith(PACK_SUFFIX):
        raise DataError(f"a pack's file name ends with {PACK_SUFFIX!r}, got {out.name!r}")
    return out


def load_pack(path: str | Path) -> Pack:
    from safetensors import safe_open

    path = Path(path).expanduser()
    check_pack(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except Exception as exc:  # noqa: BLE001 - torn after its header: say which
        raise DataError(f"{path} is not a readable pack: {exc}") from exc
    meta = json.loads(header["meta"])
    splits = {split: _unpack_split(tensors, split, n) for split, n in meta["counts"].items()}
    return Pack(Layout.from_dict(json.loads(header["layout"])), splits, meta)


def check_pack(path: str | Path) -> None:
    """Refuse a file that is not a pack of this version from its header alone (cheap: no tensor is read), so
    ``unimodal train`` says so before anything loads."""
    from safetensors import safe_open

    path = Path(path).expanduser()
    if not path.name.endswith(PACK_SUFFIX):
        raise DataError(f"{path} is not a pack (a file named *{PACK_SUFFIX}, from `unimodal data pack`)")
    if not path.is_file():
        raise DataError(f"{path}: no such pack file")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
    except Exception as exc:  # noqa: BLE001 - a torn or foreign file: say which
        raise DataError(f"{path} is not a readable pack: {exc}") from exc
    if header.get("format") != str(PACK_FORMAT) or not {"meta", "layout"} <= set(header):
        raise DataError(f"{path}: pack format {header.get('format')!r}, this version reads {PACK_FORMAT} "
                        f"(a file from `unimodal data pack`)")


def _unpack_split(tensors: dict, split: str, n: int) -> list[dict[str, torch.Tensor]]:
    samples: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]
    for modality in PACK_MODALITIES:
        if f"{split}/{modality}/ids" not in tensors:
            continue
        ids, lengths = tensors[f"{split}/{modality}/ids"].long(), tensors[f"{split}/{modality}/lengths"].tolist()
        start = 0
        for sample, length in zip(samples, lengths):
            if length >= 0:
                sample[modality] = ids[start:start + length]
                start += length
    return samples


def build_pack(data: list[str], codec_dir: str | Path, out: str | Path, max_audio_seconds: float | None = None,
               progress: bool = True, skip_bad: bool = False) -> Path:
    """Tokenise every split of ``data`` (embedded set names, built folders, manifests) with the codecs in
    ``codec_dir`` and write one pack; refuses a pack larger than :data:`MAX_PACK_BYTES`; ``skip_bad``: a manifest's
    bad records skipped (said on stderr) instead of refused."""
    from unimodal.training.tokens import MAX_AUDIO_SECONDS, CodecStack, tokenized_split
    from unimodal.training.data.sources import dataset_names, resolve_weighted, weighted

    _checked_out(out)  # refused before the codecs load and every split is encoded
    weighted_sources = resolve_weighted(data)
    sources = [source for source, _ in weighted_sources]
    stack = CodecStack.load(codec_dir, max_audio_seconds=max_audio_seconds or MAX_AUDIO_SECONDS)
    splits: dict[str, list] = {}
    parts = []
    for split in PACK_SPLITS:
        seen = set()
        for source, weight in weighted_sources:
            if split != "train" and source in seen:  # a folder named twice is evaluated once
                continue
            seen.add(source)
            if _has_split(source, split):
                skipped: list[str] = []
                tokens = tokenized_split(stack, codec_dir, source, split, progress, skip_bad, skipped_out=skipped)
                splits.setdefault(split, []).extend(tokens)
                if split == "train":  # stored once; the weight is applied when a run loads the pack
                    weighted(tokens, weight, 0, str(source))  # refuses a weight that keeps nothing, now
                    parts.append({"source": str(source), "n": len(tokens), "weight": weight,
                                  **({"skipped": skipped} if skipped else {})})  # said again by a run on the pack
    if "train" not in splits:
        raise DataError(f"{data}: no training split to pack")

    meta = {"codec_fingerprint": stack.fingerprint(codec_dir), "sources": [str(s) for s in sources],
            "datasets": dataset_names(sources), "train_parts": parts,
            "max_audio_seconds": max_audio_seconds or MAX_AUDIO_SECONDS}
    path = pack_tokens(splits, stack.layout, out, meta)
    if path.stat().st_size > MAX_PACK_BYTES:
        size = path.stat().st_size / 2**20
        path.unlink()
        raise DataError(f"the pack would be {size:.1f} MiB, over the {MAX_PACK_BYTES / 2**20:.0f} MiB a GPU "
                        f"machine's working tree leaves for data; pack fewer samples")
    return path


def _has_split(source: Path, split: str) -> bool:
    if source.is_file():  # a manifest: train and val only
        return split in ("train", "val")
    info = json.loads((source / "info.json").read_text())
    return int(info.get("splits", {}).get(split, 0)) > 0
