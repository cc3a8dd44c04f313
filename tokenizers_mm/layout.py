"""The one shared vocabulary, and how a multimodal sample becomes one token sequence and back.

Ids: special tokens first (``0 .. NUM_SPECIAL-1``), then the text codec's ids, then image codes, then audio
codes. A codec's *local* id ``k`` is shared id ``layout.offset(modality) + k``.

A packed sample is a list of segments, one per modality present, in any order. Each segment is::

    [BEGIN] slot_1 ... slot_n

where the slots hold the content, then the END marker, then PAD filler up to a fixed slot count (text and
audio padded for training or generation, so the model learns where content stops). An image always has
exactly ``rows*cols`` codes followed by its END marker, which is never generated. A generation target is the
same segment with its slots (an image: its codes) set to MASK; see :meth:`Layout.target_segment`.

PAD means two things told apart by the segment id: inside a segment (segment id of its modality) it is
filler the model predicts; with segment id ``SEG_PAD`` it is batch padding, excluded from attention.

Positions are ``(L, 2)``: images use (row, col) with the BEGIN marker at (0, 0), code ``(r, c)`` at
``(1 + r, 1 + c)`` and the END marker at ``(rows + 1, cols + 1)``; text and audio use ``(i, i)``, so a rotary
embedding that rotates half of each head by ``pos[:, 0]`` and half by ``pos[:, 1]`` is plain 1-D RoPE for
them. Positions restart at 0 in every segment; the segment id tells segments apart.

With ``Layout.audio_position_rate`` set (text tokens per audio code, ~0.25 for the scenes' speech), audio slot
``i`` sits at ``(i, round(i * rate))`` instead: the first half of each head still orders the audio codes one by
one, the second counts in text tokens, so a spoken word's codes and the word itself are at the same position on
that axis and a text-audio attention head can find the word it is saying by a near-zero offset, not an offset
that grows with the position (about 3 positions per word without it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from unimodal.core.errors import DataError, InputError

# Special tokens. New markers take reserved ids, so adding a modality never shifts the ids of a trained model.
PAD = 0  # filler after a segment's END marker, and batch padding (with SEG_PAD)
MASK = 1  # a slot the model must fill
BOS = 2  # start of a whole sequence; not added by pack(), reserved for callers that want one
EOS = 3  # end of a whole sequence; unpack() also accepts it as the end of text or audio content
BOT, EOT = 4, 5  # begin / end of text
BOI, EOI = 6, 7  # begin / end of image
BOA, EOA = 8, 9  # begin / end of audio
NUM_RESERVED = 6  # ids 10..15, unused
NUM_SPECIAL = 16
SPECIAL_TOKENS = {"PAD": PAD, "MASK": MASK, "BOS": BOS, "EOS": EOS, "BOT": BOT, "EOT": EOT,
                  "BOI": BOI, "EOI": EOI, "BOA": BOA, "EOA": EOA}

# Segment ids, one per modality; SEG_PAD marks batch padding.
SEG_PAD, SEG_TEXT, SEG_IMAGE, SEG_AUDIO = 0, 1, 2, 3
SEGMENT_IDS = {"text": SEG_TEXT, "image": SEG_IMAGE, "audio": SEG_AUDIO}
MODALITY_OF_SEGMENT = {seg: modality for modality, seg in SEGMENT_IDS.items()}
MODALITIES = tuple(SEGMENT_IDS)  # also the order of the id ranges
MARKERS = {"text": (BOT, EOT), "image": (BOI, EOI), "audio": (BOA, EOA)}  # (begin, end)
LAYOUT_FILE = "layout.json"
FORMAT_VERSION = 1


def _check_modality(modality: str) -> None:
    if modality not in SEGMENT_IDS:
        raise InputError(f"unknown modality {modality!r}; known modalities: {', '.join(sorted(SEGMENT_IDS))}")


def _as_ids(ids, what: str) -> torch.Tensor:
    """``ids`` as a LongTensor; refuses floats, which would be truncated silently."""
    if isinstance(ids, torch.Tensor) and (ids.is_floating_point() or ids.is_complex()):
        raise InputError(f"{what} must be integer ids, got a {ids.dtype} tensor")
    return torch.as_tensor(ids, dtype=torch.long)


def is_position_rate(rate) -> bool:
    """Whether ``rate`` can be a layout's ``audio_position_rate``: text tokens per audio code, a finite number in
    (0, 1] (not a bool)."""
    return isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) and 0 < rate <= 1


def _sequential_positions(n: int, rate: float | None = None) -> torch.Tensor:
    """(i, i) for i in 0..n-1: 1-D positions in the 2-D format; with ``rate``, (i, round(i * rate))."""
    steps = torch.arange(n, dtype=torch.long)
    second = steps if rate is None else torch.round(steps.double() * rate).long()
    return torch.stack([steps, second], dim=1)  # (n, 2)


@dataclass(frozen=True, eq=False)  # eq=False: comparing tensor fields with == is ambiguous
class Segment:
    """One modality's part of a sample, before packing.

    ``content``: local ids (an image: ``rows*cols`` codes, flat row-major or shaped ``(rows, cols)``), or
    None for a generation target whose slots are all MASK. ``slots``: for text/audio, the number of tokens
    after the BEGIN marker (content, END, PAD filler); None means just ``len(content) + 1``.
    """

    modality: str
    content: torch.Tensor | None = None
    slots: int | None = None


@dataclass(frozen=True)
class SegmentSpan:
    """Where a segment sits in a packed sequence: ``[start, end)``, ``start`` being its BEGIN marker."""

    modality: str
    start: int
    end: int

    @property
    def content_start(self) -> int:
        """Sequence index of content index 0."""
        return self.start + 1

    @property
    def slots(self) -> range:
        """Sequence indices the model may have to generate: all after BEGIN, except an image's END."""
        return range(self.start + 1, self.end - 1 if self.modality == "image" else self.end)


@dataclass(eq=False)
class Packed:
    """One packed sample: ``ids`` (L,), ``segment_ids`` (L,), ``positions`` (L, 2), one span per segment."""

    ids: torch.Tensor
    segment_ids: torch.Tensor
    positions: torch.Tensor
    spans: tuple[SegmentSpan, ...]

    def __len__(self) -> int:
        return self.ids.shape[0]

    def span(self, modality: str) -> SegmentSpan:
        for span in self.spans:
            if span.modality == modality:
                return span
        raise InputError(f"this sample has no {modality!r} segment; it has {[s.modality for s in self.spans]}")

    def sequence_indices(self, modality: str, content_indices) -> torch.Tensor:
        """Sequence indices of content indices of a segment (e.g. from a region helper of :class:`Layout`)."""
        span = self.span(modality)
        indices = _as_ids(content_indices, "content indices")
        if indices.numel() and (indices.min() < 0 or indices.max() >= span.end - span.content_start):
            raise InputError(f"content indices must lie in [0, {span.end - span.content_start}) for this "
                             f"{modality} segment, got {indices.tolist()}")
        return indices + span.content_start


@dataclass(eq=False)
class Batch:
    """Padded batch: ids/segment_ids (B, L), positions (B, L, 2), attention_mask (B, L) True at real tokens."""

    ids: torch.Tensor
    segment_ids: torch.Tensor
    positions: torch.Tensor
    attention_mask: torch.Tensor
    spans: list[tuple[SegmentSpan, ...]] = field(default_factory=list)

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(self.ids.to(device), self.segment_ids.to(device), self.positions.to(device),
                     self.attention_mask.to(device), self.spans)


def collate(samples: Sequence[Packed], pad_to: int | None = None) -> Batch:
    """Stack packed samples, padding with PAD / SEG_PAD to the longest sample (or to ``pad_to``)."""
    if not samples:
        raise InputError("collate needs at least one packed sample")
    longest = max(len(s) for s in samples)
    length = longest if pad_to is None else pad_to
    if length < longest:
        raise InputError(f"pad_to={pad_to} is shorter than the longest sample ({longest} tokens)")
    ids = torch.full((len(samples), length), PAD, dtype=torch.long)
    segment_ids = torch.full((len(samples), length), SEG_PAD, dtype=torch.long)
    positions = torch.zeros((len(samples), length, 2), dtype=torch.long)
    for row, sample in enumerate(samples):
        n = len(sample)
        ids[row, :n], segment_ids[row, :n], positions[row, :n] = sample.ids, sample.segment_ids, sample.positions
    return Batch(ids, segment_ids, positions, segment_ids != SEG_PAD, [s.spans for s in samples])


def _segment_runs(segment_ids: torch.Tensor) -> list[tuple[str, int, int]]:
    """(modality, start, end) of each maximal run of one non-pad segment id."""
    runs, values = [], segment_ids.tolist()
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            if values[start] != SEG_PAD:
                if values[start] not in MODALITY_OF_SEGMENT:
                    raise InputError(f"unknown segment id {values[start]} at position {start}")
                runs.append((MODALITY_OF_SEGMENT[values[start]], start, i))
            start = i
    return runs


@dataclass(kw_only=True)
class Layout:
    """The shared vocabulary and the geometry needed to map native units (pixels, seconds) to codes.

    ``image_patch``: pixels per code side; ``audio_frame_rate``: audio codes per second; ``max_text_len`` /
    ``max_audio_len``: most content tokens a padded text / audio segment holds; ``audio_position_rate``: None
    (audio positions ``(i, i)``) or text tokens per audio code, putting audio slot ``i`` at ``(i, round(i *
    rate))`` so that a word and its sound share the second position axis (module docstring). It changes what
    every audio position means, so it is fixed when a model is trained and saved with it.
    """

    text_vocab_size: int
    image_codebook_size: int
    audio_codebook_size: int
    audio_frame_rate: float
    image_grid: tuple[int, int] = (8, 8)
    image_patch: int = 8
    max_text_len: int = 32
    max_audio_len: int = 128
    audio_position_rate: float | None = None

    def __post_init__(self):
        self.image_grid = tuple(int(n) for n in self.image_grid)
        if len(self.image_grid) != 2 or min(self.image_grid) < 1:
            raise InputError(f"image_grid must be two positive ints (rows, cols), got {self.image_grid}")
        for name in ("text_vocab_size", "image_codebook_size", "audio_codebook_size", "image_patch",
                     "max_text_len", "max_audio_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InputError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if not self.audio_frame_rate > 0:
            raise InputError(f"audio_frame_rate must be positive, got {self.audio_frame_rate!r}")
        if self.audio_position_rate is not None and not is_position_rate(self.audio_position_rate):
            raise InputError(f"audio_position_rate must be None or text tokens per audio code in (0, 1], got "
                             f"{self.audio_position_rate!r}")

    # ---- id ranges -------------------------------------------------------------------------------------

    def codebook_size(self, modality: str) -> int:
        _check_modality(modality)
        return {"text": self.text_vocab_size, "image": self.image_codebook_size,
                "audio": self.audio_codebook_size}[modality]

    def offset(self, modality: str) -> int:
        """Shared id of the modality's local id 0."""
        _check_modality(modality)
        preceding = MODALITIES[:MODALITIES.index(modality)]
        return NUM_SPECIAL + sum(self.codebook_size(m) for m in preceding)

    @property
    def vocab_size(self) -> int:
        return NUM_SPECIAL + sum(self.codebook_size(m) for m in MODALITIES)

    def to_shared(self, modality: str, local_ids) -> torch.Tensor:
        local_ids = _as_ids(local_ids, f"{modality} ids")
        size = self.codebook_size(modality)
        if local_ids.numel() and (local_ids.min() < 0 or local_ids.max() >= size):
            bad = local_ids[(local_ids < 0) | (local_ids >= size)]
            raise InputError(f"{modality} ids must lie in [0, {size}), got {bad[:5].tolist()}")
        return local_ids + self.offset(modality)

    def to_local(self, modality: str, shared_ids) -> torch.Tensor:
        shared_ids = _as_ids(shared_ids, "shared ids")
        low, high = self.offset(modality), self.offset(modality) + self.codebook_size(modality)
        if shared_ids.numel() and (shared_ids.min() < low or shared_ids.max() >= high):
            bad = shared_ids[(shared_ids < low) | (shared_ids >= high)]
            raise InputError(f"shared ids of {modality} lie in [{low}, {high}), got {bad[:5].tolist()}")
        return shared_ids - low

    def modality_of(self, shared_ids) -> torch.Tensor:
        """Per id, the segment id of the modality it belongs to (SEG_TEXT...); SEG_PAD for special tokens."""
        shared_ids = _as_ids(shared_ids, "shared ids")
        if shared_ids.numel() and (shared_ids.min() < 0 or shared_ids.max() >= self.vocab_size):
            raise InputError(f"shared ids must lie in [0, {self.vocab_size}), got {shared_ids.tolist()[:5]}...")
        result = torch.full_like(shared_ids, SEG_PAD)
        for modality in MODALITIES:
            low = self.offset(modality)
            inside = (shared_ids >= low) & (shared_ids < low + self.codebook_size(modality))
            result[inside] = SEGMENT_IDS[modality]
        return result

    def allowed_ids(self, modality: str) -> torch.Tensor:
        """Bool (vocab_size,): ids a slot of this modality may hold (its codes; text/audio also END and PAD).

        Samplers can use it to keep logits of a segment inside its modality.
        """
        allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
        low = self.offset(modality)
        allowed[low:low + self.codebook_size(modality)] = True
        if modality != "image":
            allowed[[MARKERS[modality][1], PAD]] = True
        return allowed

    # ---- segment sizes ---------------------------------------------------------------------------------

    def max_content_len(self, modality: str) -> int:
        _check_modality(modality)
        rows, cols = self.image_grid
        return {"text": self.max_text_len, "image": rows * cols, "audio": self.max_audio_len}[modality]

    def segment_length(self, modality: str) -> int:
        """Tokens of a full-size segment: BEGIN, the most content, END."""
        return self.max_content_len(modality) + 2

    @property
    def max_sequence_length(self) -> int:
        """Length of a sample holding every modality at full size."""
        return sum(self.segment_length(m) for m in MODALITIES)

    def padded_segment(self, modality: str, content) -> Segment:
        """A segment padded to full size (text/audio: content, END, PAD filler), as used for training targets."""
        content = _as_ids(content, f"{modality} content")
        if modality == "image":
            return Segment(modality, content)
        if content.numel() > self.max_content_len(modality):
            raise InputError(f"{modality} content has {content.numel()} tokens, more than the "
                             f"{self.max_content_len(modality)} this layout allows")
        return Segment(modality, content, slots=self.max_content_len(modality) + 1)

    def target_segment(self, modality: str, length: int | None = None) -> Segment:
        """A generation target: ``length`` MASK slots (default: full size) for the model to fill with
        content, the END marker, then PAD; an image gets ``rows*cols`` MASK codes and its fixed END."""
        _check_modality(modality)
        if modality == "image":
            return Segment(modality, None)
        length = self.max_content_len(modality) + 1 if length is None else length
        if length < 1:
            raise InputError(f"a {modality} target needs at least one slot (for its END marker), got {length}")
        return Segment(modality, None, slots=length)

    # ---- packing ---------------------------------------------------------------------------------------

    def pack(self, segments: Sequence[Segment | tuple[str, torch.Tensor]]) -> Packed:
        """One sequence from ordered segments, each a :class:`Segment` or a ``(modality, local_ids)`` pair."""
        segments = [s if isinstance(s, Segment) else Segment(*s) for s in segments]
        if not segments:
            raise InputError("pack needs at least one segment")
        modalities = [s.modality for s in segments]
        if len(set(modalities)) != len(modalities):
            raise InputError(f"each modality may appear once per sample, got {modalities}")
        pieces, spans, start = [], [], 0
        for segment in segments:
            ids, positions = self._segment_tokens(segment)
            pieces.append((ids, torch.full_like(ids, SEGMENT_IDS[segment.modality]), positions))
            spans.append(SegmentSpan(segment.modality, start, start + ids.numel()))
            start += ids.numel()
        ids, segment_ids, positions = (torch.cat(parts) for parts in zip(*pieces))
        return Packed(ids, segment_ids, positions, tuple(spans))

    def _segment_tokens(self, segment: Segment) -> tuple[torch.Tensor, torch.Tensor]:
        _check_modality(segment.modality)
        if segment.modality == "image":
            return self._image_tokens(segment)
        begin, end = MARKERS[segment.modality]
        if segment.content is None:
            if segment.slots is None:
                raise InputError(f"a masked {segment.modality} segment needs a slot count (use target_segment)")
            body = torch.full((segment.slots,), MASK, dtype=torch.long)
        else:
            content = self.to_shared(segment.modality, _as_ids(segment.content, "content").reshape(-1))
            slots = content.numel() + 1 if segment.slots is None else segment.slots
            if slots < content.numel() + 1:
                raise InputError(f"{segment.modality} segment of {slots} slots cannot hold "
                                 f"{content.numel()} tokens and its END marker")
            filler = torch.full((slots - content.numel() - 1,), PAD, dtype=torch.long)
            body = torch.cat([content, torch.tensor([end]), filler])
        ids = torch.cat([torch.tensor([begin]), body])
        rate = self.audio_position_rate if segment.modality == "audio" else None
        return ids, _sequential_positions(ids.numel(), rate)

    def _image_tokens(self, segment: Segment) -> tuple[torch.Tensor, torch.Tensor]:
        rows, cols = self.image_grid
        if segment.slots is not None and segment.slots != rows * cols + 1:
            raise InputError(f"an image segment always has {rows * cols + 1} slots, got slots={segment.slots}")
        if segment.content is None:
            codes = torch.full((rows * cols,), MASK, dtype=torch.long)
        else:
            content = _as_ids(segment.content, "image content")
            if content.numel() != rows * cols or content.dim() not in (1, 2) or (
                    content.dim() == 2 and tuple(content.shape) != (rows, cols)):
                raise InputError(f"an image needs exactly {rows}x{cols}={rows * cols} codes (flat or shaped "
                                 f"({rows}, {cols})), got shape {tuple(content.shape)}")
            codes = self.to_shared("image", content.reshape(-1))
        ids = torch.cat([torch.tensor([BOI]), codes, torch.tensor([EOI])])
        return ids, self._image_positions()

    def _image_positions(self) -> torch.Tensor:
        rows, cols = self.image_grid
        grid_rows, grid_cols = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        content = torch.stack([grid_rows.reshape(-1), grid_cols.reshape(-1)], dim=1) + 1  # (rows*cols, 2)
        return torch.cat([torch.tensor([[0, 0]]), content, torch.tensor([[rows + 1, cols + 1]])])

    # ---- unpacking -------------------------------------------------------------------------------------

    def unpack(self, ids, segment_ids) -> dict[str, torch.Tensor]:
        """Local content ids of each segment of one sequence (1-D ``ids`` and ``segment_ids``).

        Text/audio: the tokens after BEGIN up to the first END, PAD or EOS (anything after it is ignored).
        Images: exactly ``rows*cols`` codes between BOI and EOI. A MASK or a foreign id inside the content
        raises :class:`InputError` (sampling is unfinished or unconstrained), so callers never get garbage.
        """
        ids, segment_ids = _as_ids(ids, "ids"), _as_ids(segment_ids, "segment ids")
        if ids.dim() != 1 or ids.shape != segment_ids.shape:
            raise InputError(f"unpack takes 1-D ids and segment ids of one length, got shapes "
                             f"{tuple(ids.shape)} and {tuple(segment_ids.shape)}")
        contents = {}
        for modality, start, end in _segment_runs(segment_ids):
            if modality in contents:
                raise InputError(f"more than one {modality} segment (second one starts at position {start})")
            tokens = ids[start:end]
            if tokens[0].item() != MARKERS[modality][0]:
                raise InputError(f"the {modality} segment at position {start} does not start with its begin "
                                 f"marker {MARKERS[modality][0]} (got {tokens[0].item()})")
            read = self._read_image if modality == "image" else self._read_sequence
            contents[modality] = read(modality, tokens[1:])
        return contents

    def _read_sequence(self, modality: str, body: torch.Tensor) -> torch.Tensor:
        stops = (body == MARKERS[modality][1]) | (body == PAD) | (body == EOS)
        length = int(stops.nonzero()[0]) if stops.any() else body.numel()
        return self._checked_local(modality, body[:length])

    def _read_image(self, modality: str, body: torch.Tensor) -> torch.Tensor:
        rows, cols = self.image_grid
        if body.numel() != rows * cols + 1 or body[-1].item() != EOI:
            last = body[-1].item() if body.numel() else None
            raise InputError(f"an image segment must hold {rows * cols} codes and then EOI ({EOI}); got "
                             f"{body.numel()} tokens after BOI, the last being {last}")
        return self._checked_local(modality, body[:-1])

    def _checked_local(self, modality: str, content: torch.Tensor) -> torch.Tensor:
        low = self.offset(modality)
        foreign = ((content < low) | (content >= low + self.codebook_size(modality))).nonzero().reshape(-1)
        if foreign.numel():
            masked = (content[foreign] == MASK).sum().item()
            raise InputError(f"the {modality} content holds {foreign.numel()} ids that are not {modality} codes "
                             f"({masked} of them MASK) at content indices {foreign[:8].tolist()}; finish "
                             f"sampling (or restrict logits with allowed_ids) before unpacking")
        return content - low

    # ---- regions in native units -----------------------------------------------------------------------

    def image_box_to_positions(self, box_px: Sequence[float]) -> torch.Tensor:
        """Row-major indices of the grid codes a pixel box ``(x0, y0, x1, y1)`` touches.

        The box is half-open like an array slice: (0, 0, 16, 16) covers pixels 0..15 and, with 8-pixel
        codes, codes 0, 1, 8, 9. Parts outside the image are clipped.
        """
        x0, y0, x1, y1 = (float(v) for v in box_px)
        rows, cols = self.image_grid
        first_col, end_col = self._cells_touched(x0, x1, cols, "x")
        first_row, end_row = self._cells_touched(y0, y1, rows, "y")
        row_index = torch.arange(first_row, end_row).unsqueeze(1)
        col_index = torch.arange(first_col, end_col).unsqueeze(0)
        return (row_index * cols + col_index).reshape(-1)

    def _cells_touched(self, low: float, high: float, cells: int, axis: str) -> tuple[int, int]:
        extent = cells * self.image_patch
        if not high > low:
            raise InputError(f"a box needs {axis}1 > {axis}0, got {axis}0={low}, {axis}1={high}")
        if high <= 0 or low >= extent:
            raise InputError(f"the box's {axis} range [{low}, {high}) lies outside the image (0..{extent} px)")
        first = max(0, math.floor(low / self.image_patch))
        return first, min(cells, math.ceil(high / self.image_patch))

    def audio_span_to_positions(self, start_s: float, end_s: float, n_codes: int | None = None) -> torch.Tensor:
        """Indices of the audio codes overlapping ``[start_s, end_s)``; code k covers [k, k+1) / frame rate.

        Clipped to ``n_codes`` (the clip's code count; default ``max_audio_len``).
        """
        n_codes = self.max_audio_len if n_codes is None else n_codes
        if start_s < 0 or not end_s > start_s:
            raise InputError(f"an audio span needs 0 <= start < end (seconds), got {start_s}..{end_s}")
        # The epsilon keeps code boundaries exact: at 12.5 codes/s, (6 / 12.5) * 12.5 is 5.999..., which would
        # floor to code 5, so the span a region helper wrote for code 6 would not map back to code 6.
        first = math.floor(start_s * self.audio_frame_rate + 1e-9)
        # ... and a span shorter than the epsilon still touches the code it starts in
        end = min(n_codes, max(first + 1, math.ceil(end_s * self.audio_frame_rate - 1e-9)))
        if first >= end:
            raise InputError(f"the span {start_s}..{end_s} s starts after the audio ends "
                             f"({n_codes} codes = {n_codes / self.audio_frame_rate:.2f} s)")
        return torch.arange(first, end)

    @staticmethod
    def text_span_to_positions(text: str, char_start: int, char_end: int, codec) -> torch.Tensor:
        """Indices of the tokens of ``codec.encode_one(text)`` that overlap characters ``[char_start, char_end)``.

        Byte-level tokens carry their leading space, so a span starting at a word also covers that space.
        """
        if not 0 <= char_start < char_end <= len(text):
            raise InputError(f"a text span needs 0 <= start < end <= {len(text)}, got {char_start}..{char_end}")
        _, offsets = codec.encode_with_offsets(text)
        hits = [i for i, (start, end) in enumerate(offsets) if start < char_end and end > char_start]
        return torch.tensor(hits, dtype=torch.long)

    # ---- persistence -----------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        # The special-token table is stored so that a model folder built with other ids is refused on load.
        fields = asdict(self)
        if fields["audio_position_rate"] is None:  # absent = sequential, so layouts saved before it read the same
            del fields["audio_position_rate"]
        return {"format_version": FORMAT_VERSION, **fields, "image_grid": list(self.image_grid),
                "num_special": NUM_SPECIAL, "special_tokens": dict(SPECIAL_TOKENS)}

    @classmethod
    def from_dict(cls, data: dict) -> "Layout":
        data = dict(data)
        version = data.pop("format_version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise DataError(f"layout format {version} is not {FORMAT_VERSION}")
        if (data.pop("num_special", NUM_SPECIAL) != NUM_SPECIAL
                or data.pop("special_tokens", SPECIAL_TOKENS) != SPECIAL_TOKENS):
            raise DataError("this layout was saved with different special token ids than this version uses")
        try:
            return cls(**data)
        except TypeError as error:  # unknown or missing field
            raise DataError(f"malformed layout: {error}") from error

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / LAYOUT_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> "Layout":
        path = Path(directory) / LAYOUT_FILE
        if not path.is_file():
            raise DataError(f"{directory} holds no {LAYOUT_FILE}")
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as error:
            raise DataError(f"{path} is not valid JSON: {error}") from error
