"""Codecs that turn each modality into discrete tokens, and the layout of the one shared vocabulary.

``CODECS`` names the codec class of each modality as ``"module:Class"``; classes are imported only when
asked for (:func:`get_codec_class`), so importing this package never needs the image or audio stacks.
A new modality is one new codec file plus one line here (and its markers in ``layout.py``).
"""

from __future__ import annotations

import importlib

from unimodal.tokenizers_mm.base import Codec
from unimodal.core.errors import InputError

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


__all__ = ["CODECS", "Codec", "get_codec_class"]
