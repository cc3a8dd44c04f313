"""The protocol every modality codec implements, so the rest of the library can treat them alike.

A codec turns a batch of native data (strings, images, waveforms) into discrete *local* ids in
``[0, codebook_size)`` and back. Local ids are mapped into the one shared vocabulary by
:mod:`unimodal.tokenizers_mm.layout`; a codec never sees special tokens or the other modalities.

``encode`` returns one LongTensor per batch element when lengths vary (text, audio) and one stacked
LongTensor when they do not (image codes); ``decode`` accepts what ``encode`` returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable


@runtime_checkable
class Codec(Protocol):
    """A modality codec: native batch <-> local token ids, saved and loaded as a self-describing folder."""

    modality: ClassVar[str]  # "text", "image", "audio": the key of the codec in ``tokenizers_mm.CODECS``
    # The pipeline components the codec is built from: component name -> constructor argument, which is also the
    # attribute holding it. ``UniModal`` registers and saves the components, and rebuilds the codec from them.
    pipeline_parts: ClassVar[dict[str, str]]

    @property
    def codebook_size(self) -> int:
        """Number of local ids; every id ``encode`` returns lies in ``[0, codebook_size)``."""
        ...

    def encode(self, batch: Any) -> Any:
        """Native batch -> local ids (a LongTensor, or a list of 1-D LongTensors for ragged modalities)."""
        ...

    def decode(self, ids: Any) -> Any:
        """Local ids (as returned by ``encode``) -> native batch."""
        ...

    def save_pretrained(self, directory: str | Path) -> None:
        """Write everything needed to rebuild the codec offline into ``directory``."""
        ...

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "Codec":
        """Rebuild a codec saved by ``save_pretrained``."""
        ...
