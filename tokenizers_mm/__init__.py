"""Codecs that turn each modality into discrete tokens, and the layout of the one shared vocabulary.

``CODECS`` names the codec class of each modality as ``"module:Class"``; classes are imported only when
asked for (:func:`get_codec_class`), so importing this package never needs the image or audio stacks.
Training (``unimodal.training.tokens.CodecStack``) and the pipeline (``unimodal.pipeline.UniModal``) both load,
encode and decode every modality through this registry, in its order.

Adding a modality takes:

1. one codec file implementing :class:`unimodal.tokenizers_mm.base.Codec`, including ``pipeline_parts`` (the
   pipeline components the codec is built from, e.g. ``{"image_vq": "model"}``);
2. one line in ``CODECS``;
3. its tests.

What the registry cannot supply, because it is fixed in the format of a trained model: the modality's BEGIN /
END markers (reserved ids), segment id and codebook size in ``layout.py``; a parameter of
``UniModal.__init__`` per pipeline part (diffusers saves a pipeline by its ``__init__`` signature); a field of
``GenerationResult`` and a reader in ``unimodal/inputs.py`` for the user's native values.
``tests/test_codec_registry.py`` checks each registered codec against these.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path

from unimodal.tokenizers_mm.base import Codec
from unimodal.core.errors import DataError, InputError

CODECS: dict[str, str] = {
    "text": "unimodal.tokenizers_mm.text:TextCodec",
    "image": "unimodal.tokenizers_mm.image:ImageCodec",
    "audio": "unimodal.tokenizers_mm.audio:AudioCodec",
}


def get_codec_class(modality: str) -> type:
    """The codec class registered for ``modality``, imported on first use."""
    if modality not in CODECS:
        raise InputError(f"unknown modality {modality!r}; known modalities: {', '.join(sorted(CODECS))}")
    module_name, class_name = CODECS[modality].split(":")
    return getattr(importlib.import_module(module_name), class_name)


SHARED_CODECS_FILE = "codecs.json"  # {"shared": {"image": "../default_model"}}: a codec kept in another folder


def codec_folder(directory: str | os.PathLike, modality: str) -> Path:
    """``directory/modality/codec`` when it exists (a codec training run), else ``directory/modality``; a codec set
    that shares a modality's codec with another folder (so it is stored once) names that folder in
    ``directory/codecs.json`` (``{"shared": {modality: folder relative to directory}}``)."""
    base = Path(directory) / modality
    if not base.exists():
        base = _shared_folder(Path(directory), modality) or base
    folder = base / "codec" if (base / "codec").is_dir() else base
    if not folder.is_dir():
        raise DataError(f"{directory} has no {modality} codec (looked for {base}/codec and {base}); train one "
                        f"with: unimodal codec train {modality}")
    return folder


def _shared_folder(directory: Path, modality: str) -> Path | None:
    import json

    listing = directory / SHARED_CODECS_FILE
    if not listing.is_file():
        return None
    try:
        shared = json.loads(listing.read_text()).get("shared", {})
    except (ValueError, AttributeError) as error:
        raise DataError(f"{listing} is not a JSON object with a \"shared\" map of modality -> folder: {error}") from None
    if modality not in shared:
        return None
    folder = (directory / str(shared[modality])).resolve()
    if folder == directory.resolve():
        raise DataError(f"{listing} shares the {modality} codec with its own folder")
    return folder / modality


def load_codecs(directory: str | os.PathLike) -> dict[str, Codec]:
    """Every registered modality's codec from ``directory/<modality>`` (see :func:`codec_folder`)."""
    return {m: get_codec_class(m).from_pretrained(codec_folder(directory, m)) for m in CODECS}


def codec_parts(codec: Codec) -> dict[str, object]:
    """The pipeline components ``codec`` is built from, by component name (``{"image_vq": <ImageVQModel>}``)."""
    return {component: getattr(codec, argument) for component, argument in type(codec).pipeline_parts.items()}


def codec_from_parts(modality: str, parts: Mapping[str, object]) -> Codec:
    """The registered codec of ``modality`` rebuilt from pipeline components (the inverse of :func:`codec_parts`);
    a component missing from ``parts`` is passed as None (an optional one, such as the vocoder)."""
    cls = get_codec_class(modality)
    return cls(**{argument: parts.get(component) for component, argument in cls.pipeline_parts.items()})


__all__ = ["CODECS", "Codec", "codec_folder", "codec_from_parts", "codec_parts", "get_codec_class", "load_codecs"]
