"""The shared vocabulary and packing: id ranges, pack/unpack round trips, positions, collate, regions, errors."""

from __future__ import annotations

import functools
import itertools
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unimodal.tokenizers_mm import layout as lay
from unimodal.tokenizers_mm.layout import (BOI, BOT, EOI, EOS, EOT, MASK, MODALITIES, NUM_SPECIAL, PAD, SEG_AUDIO, SEG_IMAGE,
                                  SEG_PAD, SEG_TEXT, SPECIAL_TOKENS, Layout, Segment, collate)
from unimodal.tokenizers_mm.text import TextCodec
from unimodal.core.errors import DataError, InputError

ROWS, COLS = 8, 8


@pytest.fixture
def layout() -> Layout:
    return Layout(text_vocab_size=300, image_codebook_size=64, audio_codebook_size=40, audio_frame_rate=10.0,
                  max_text_len=12, max_audio_len=20)


def sample_content(layout: Layout, modality: str, seed: int = 0, length: int = 5) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    n = ROWS * COLS if modality == "image" else length
    return torch.randint(0, layout.codebook_size(modality), (n,), generator=generator)


ORDERS = [order for k in (1, 2, 3) for order in itertools.permutations(MODALITIES, k)]


# ---- id ranges ------------------------------------------------------------------------------------------

def test_special_tokens_are_distinct_and_below_num_special():
    ids = list(SPECIAL_TOKENS.values())
    assert len(set(ids)) == len(ids) and max(ids) < NUM_SPECIAL and PAD == 0 and MASK == 1


def test_id_ranges_tile_the_vocabulary_without_overlap(layout):
    ranges = [(layout.offset(m), layout.offset(m) + layout.codebook_size(m)) for m in MODALITIES]
    assert ranges[0][0] == NUM_SPECIAL and ranges[-1][1] == layout.vocab_size
    assert all(end == next_start for (_, end), (next_start, _) in zip(ranges, ranges[1:]))
    assert layout.vocab_size == NUM_SPECIAL + 300 + 64 + 40


@pytest.mark.parametrize("modality", MODALITIES)
def test_to_shared_and_back(layout, modality):
    local = torch.arange(layout.codebook_size(modality))
    shared = layout.to_shared(modality, local)
    assert torch.equal(layout.to_local(modality, shared), local)
    assert (layout.modality_of(shared) == lay.SEGMENT_IDS[modality]).all()
    with pytest.raises(InputError, match=f"{modality} ids must lie in"):
        layout.to_shared(modality, torch.tensor([layout.codebook_size(modality)]))
    with pytest.raises(InputError, match=f"shared ids of {modality}"):
        layout.to_local(modality, torch.tensor([MASK]))


def test_modality_of_specials_is_seg_pad(layout):
    assert layout.modality_of(torch.tensor([PAD, MASK, BOT, EOI])).tolist() == [SEG_PAD] * 4


def test_allowed_ids(layout):
    text_ok = layout.allowed_ids("text")
    assert text_ok[EOT] and text_ok[PAD] and not text_ok[MASK] and not text_ok[layout.offset("image")]
    image_ok = layout.allowed_ids("image")
    assert image_ok.sum() == 64 and not image_ok[EOI]


# ---- pack / unpack --------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", ORDERS, ids=lambda order: "+".join(order))
def test_pack_unpack_round_trip_every_subset_and_order(layout, order):
    contents = {m: sample_content(layout, m, seed=i) for i, m in enumerate(order)}
    packed = layout.pack([(m, contents[m]) for m in order])
    assert [span.modality for span in packed.spans] == list(order)
    unpacked = layout.unpack(packed.ids, packed.segment_ids)
    assert set(unpacked) == set(order)
    assert all(torch.equal(unpacked[m], contents[m]) for m in order)


@settings(max_examples=25, deadline=None)
@given(order=st.sampled_from(ORDERS), text_len=st.integers(0, 12), audio_len=st.integers(0, 20),
       padded=st.booleans())
def test_pack_unpack_round_trip_random_lengths(order, text_len, audio_len, padded):
    layout = Layout(text_vocab_size=300, image_codebook_size=64, audio_codebook_size=40, audio_frame_rate=10.0,
                    max_text_len=12, max_audio_len=20)
    lengths = {"text": text_len, "audio": audio_len, "image": ROWS * COLS}
    contents = {m: sample_content(layout, m, length=lengths[m]) for m in order}
    make = layout.padded_segment if padded else Segment
    packed = layout.pack([make(m, contents[m]) for m in order])
    unpacked = layout.unpack(packed.ids, packed.segment_ids)
    assert all(torch.equal(unpacked[m], contents[m]) for m in order)
    if padded:
        assert len(packed) == sum(layout.segment_length(m) for m in order)


def test_segment_structure(layout):
    packed = layout.pack([("text", torch.tensor([3, 4])), ("image", sample_content(layout, "image"))])
    assert packed.ids[:4].tolist() == [BOT, layout.offset("text") + 3, layout.offset("text") + 4, EOT]
    assert packed.ids[4].item() == BOI and packed.ids[-1].item() == EOI
    assert packed.segment_ids.tolist() == [SEG_TEXT] * 4 + [SEG_IMAGE] * (ROWS * COLS + 2)
    assert packed.span("image").slots == range(5, 5 + ROWS * COLS)  # the image's END is never generated


def test_padded_text_segment_has_end_then_pad(layout):
    packed = layout.pack([layout.padded_segment("text", torch.tensor([7]))])
    assert packed.ids.tolist() == [BOT, layout.offset("text") + 7, EOT] + [PAD] * 11
    assert (packed.segment_ids == SEG_TEXT).all()  # in-segment PAD is predicted filler, not batch padding
    assert len(packed) == layout.segment_length("text") == 14


def test_image_accepts_grid_shaped_codes(layout):
    grid = sample_content(layout, "image").reshape(ROWS, COLS)
    packed = layout.pack([("image", grid)])
    assert torch.equal(layout.unpack(packed.ids, packed.segment_ids)["image"], grid.reshape(-1))


# ---- positions ------------------------------------------------------------------------------------------

def test_image_positions_are_2d(layout):
    packed = layout.pack([("image", sample_content(layout, "image"))])
    positions = packed.positions
    assert positions.shape == (ROWS * COLS + 2, 2)
    assert positions[0].tolist() == [0, 0] and positions[-1].tolist() == [ROWS + 1, COLS + 1]
    code = 3 * COLS + 5  # row 3, col 5
    assert positions[1 + code].tolist() == [1 + 3, 1 + 5]


def test_sequence_positions_are_diagonal_and_restart_per_segment(layout):
    packed = layout.pack([("text", torch.tensor([1, 2, 3])), ("image", sample_content(layout, "image")),
                          ("audio", torch.tensor([0, 1]))])
    for span in packed.spans:
        assert packed.positions[span.start].tolist() == [0, 0]
    text = packed.positions[slice(*_bounds(packed.span("text")))]
    audio = packed.positions[slice(*_bounds(packed.span("audio")))]
    assert text.tolist() == [[i, i] for i in range(5)] and audio.tolist() == [[i, i] for i in range(4)]


def test_audio_positions_at_the_text_rate_line_a_word_up_with_its_sound(layout):
    """With audio_position_rate, audio slot i sits at (i, round(i * rate)); text and images are unchanged,
    the layout saves and reloads the rate, and a layout without it saves exactly the fields it always had."""
    paced = Layout.from_dict(layout.to_dict() | {"audio_position_rate": 0.25})
    segments = [("text", torch.tensor([1, 2, 3])), ("image", sample_content(layout, "image")),
                ("audio", torch.arange(9))]
    plain, packed = layout.pack(segments), paced.pack(segments)
    audio = packed.positions[slice(*_bounds(packed.span("audio")))]
    assert audio[:, 0].tolist() == list(range(11))  # BEGIN, 9 codes, END: the first axis still counts codes
    assert audio[:, 1].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2]  # round(i / 4): a word every ~4 codes
    for modality in ("text", "image"):
        span = packed.span(modality)
        assert torch.equal(packed.positions[span.start:span.end], plain.positions[span.start:span.end])
    assert torch.equal(packed.ids, plain.ids)
    # a generation target (all MASK) gets the same positions as the content it will become
    target = paced.pack([paced.target_segment("audio", 10)])
    assert torch.equal(target.positions, audio)
    assert Layout.from_dict(json.loads(json.dumps(paced.to_dict()))) == paced
    assert "audio_position_rate" not in layout.to_dict() and paced.to_dict()["audio_position_rate"] == 0.25
    for bad in (0, -0.5, 1.5, float("nan"), True, "0.25"):
        with pytest.raises(InputError, match="audio_position_rate"):
            Layout.from_dict(layout.to_dict() | {"audio_position_rate": bad})


def _bounds(span) -> tuple[int, int]:
    return span.start, span.end


# ---- generation targets ---------------------------------------------------------------------------------

def test_target_segments_are_masked(layout):
    packed = layout.pack([("text", torch.tensor([1])), layout.target_segment("image"),
                          layout.target_segment("audio", 6)])
    image, audio = packed.span("image"), packed.span("audio")
    assert (packed.ids[list(image.slots)] == MASK).all() and packed.ids[image.end - 1].item() == EOI
    assert packed.ids[audio.start + 1:audio.end].tolist() == [MASK] * 6
    assert list(audio.slots) == list(range(audio.start + 1, audio.end))
    with pytest.raises(InputError, match="MASK"):
        layout.unpack(packed.ids, packed.segment_ids)


def test_filled_target_unpacks_up_to_end_marker(layout):
    packed = layout.pack([layout.target_segment("text", 6)])
    ids = packed.ids.clone()
    offset = layout.offset("text")
    ids[1:] = torch.tensor([offset + 9, offset + 8, EOT, PAD, PAD, PAD])
    assert layout.unpack(ids, packed.segment_ids)["text"].tolist() == [9, 8]
    ids[3:] = torch.tensor([PAD, MASK, offset, EOT])  # content also stops at PAD; what follows is ignored
    assert layout.unpack(ids, packed.segment_ids)["text"].tolist() == [9, 8]
    ids[3] = EOS
    assert layout.unpack(ids, packed.segment_ids)["text"].tolist() == [9, 8]


def test_default_target_length_is_full_size(layout):
    packed = layout.pack([layout.target_segment("text")])
    assert len(packed) == layout.segment_length("text")


# ---- collate --------------------------------------------------------------------------------------------

def test_collate_pads_and_masks(layout):
    short = layout.pack([("text", torch.tensor([1]))])
    long = layout.pack([("audio", torch.tensor([1, 2, 3, 4]))])
    batch = collate([short, long])
    assert batch.ids.shape == (2, 6) and batch.positions.shape == (2, 6, 2)
    assert batch.ids[0, 3:].tolist() == [PAD] * 3 and batch.segment_ids[0, 3:].tolist() == [SEG_PAD] * 3
    assert batch.attention_mask.tolist() == [[True] * 3 + [False] * 3, [True] * 6]
    assert (batch.segment_ids[1] == SEG_AUDIO).all() and batch.spans[1] == long.spans
    assert collate([short], pad_to=10).ids.shape == (1, 10)
    with pytest.raises(InputError, match="shorter than the longest"):
        collate([short, long], pad_to=4)


def test_unpack_ignores_batch_padding(layout):
    packed = layout.pack([("audio", torch.tensor([5, 6]))])
    batch = collate([packed], pad_to=12)
    assert layout.unpack(batch.ids[0], batch.segment_ids[0])["audio"].tolist() == [5, 6]


# ---- regions in native units ----------------------------------------------------------------------------

@pytest.mark.parametrize("box, codes", [
    ((0, 0, 16, 16), [0, 1, 8, 9]),  # pixels 0..15 x 0..15
    ((0, 0, 15, 15), [0, 1, 8, 9]),
    ((0, 0, 8, 8), [0]),
    ((8, 0, 9, 17), [1, 9, 17]),  # x picks column 1, y rows 0..2
    ((60, 60, 100, 100), [63]),  # clipped to the image
    ((7.5, 7.5, 8.5, 8.5), [0, 1, 8, 9]),
])
def test_image_box_to_positions(layout, box, codes):
    assert layout.image_box_to_positions(box).tolist() == codes


def test_audio_span_to_positions(layout):
    assert layout.audio_span_to_positions(0.25, 0.5).tolist() == [2, 3, 4]
    assert layout.audio_span_to_positions(0.0, 0.1).tolist() == [0]
    assert layout.audio_span_to_positions(1.5, 9.0, n_codes=17).tolist() == [15, 16]


def test_text_span_to_positions(layout):
    codec = TextCodec.train(["a red circle", "a blue square"] * 50, vocab_size=300)
    text = "a red circle"
    ids, offsets = codec.encode_with_offsets(text)
    red = text.index("red")
    hits = layout.text_span_to_positions(text, red, red + 3, codec).tolist()
    assert hits and all(offsets[i][0] < red + 3 and offsets[i][1] > red for i in hits)
    assert codec.decode_one(ids[hits]).strip() == "red"
    assert layout.text_span_to_positions(text, 0, len(text), codec).tolist() == list(range(ids.numel()))


def test_region_indices_map_to_sequence_indices(layout):
    packed = layout.pack([("text", torch.tensor([1, 2])), ("image", sample_content(layout, "image"))])
    codes = layout.image_box_to_positions((0, 0, 16, 16))
    assert packed.sequence_indices("image", codes).tolist() == [5 + c for c in (0, 1, 8, 9)]


def test_region_errors(layout):
    with pytest.raises(InputError, match="x1 > x0"):
        layout.image_box_to_positions((10, 0, 10, 5))
    with pytest.raises(InputError, match="outside the image"):
        layout.image_box_to_positions((70, 0, 80, 5))
    with pytest.raises(InputError, match="start < end"):
        layout.audio_span_to_positions(1.0, 0.5)
    with pytest.raises(InputError, match="after the audio ends"):
        layout.audio_span_to_positions(5.0, 6.0, n_codes=10)
    with pytest.raises(InputError, match="text span"):
        layout.text_span_to_positions("abc", 2, 9, codec=None)


# ---- clear errors ---------------------------------------------------------------------------------------

def test_wrong_image_code_count(layout):
    with pytest.raises(InputError, match="exactly 8x8=64 codes"):
        layout.pack([("image", torch.arange(63))])
    with pytest.raises(InputError, match="exactly 8x8=64 codes"):
        layout.pack([("image", torch.zeros(4, 16, dtype=torch.long))])


def test_out_of_range_and_unknown_modality(layout):
    with pytest.raises(InputError, match="text ids must lie in"):
        layout.pack([("text", torch.tensor([300]))])
    with pytest.raises(InputError, match="text ids must lie in"):
        layout.pack([("text", torch.tensor([-1]))])
    with pytest.raises(InputError, match="known modalities: audio, image, text"):
        layout.pack([("video", torch.tensor([1]))])
    with pytest.raises(InputError, match="known modalities"):
        layout.offset("smell")
    with pytest.raises(InputError, match="integer ids"):
        layout.pack([("text", torch.tensor([1.5]))])


def test_pack_rejects_duplicates_and_overfull_segments(layout):
    with pytest.raises(InputError, match="once per sample"):
        layout.pack([("text", torch.tensor([1])), ("text", torch.tensor([2]))])
    with pytest.raises(InputError, match="cannot hold"):
        layout.pack([Segment("text", torch.tensor([1, 2, 3]), slots=3)])
    with pytest.raises(InputError, match="more than the 12"):
        layout.padded_segment("text", torch.arange(13))
    with pytest.raises(InputError, match="at least one segment"):
        layout.pack([])


def test_unpack_rejects_broken_images(layout):
    packed = layout.pack([("image", sample_content(layout, "image"))])
    ids = packed.ids.clone()
    ids[10] = layout.offset("audio")  # an audio code inside the image
    with pytest.raises(InputError, match="not image codes"):
        layout.unpack(ids, packed.segment_ids)
    with pytest.raises(InputError, match="64 codes and then EOI"):
        layout.unpack(packed.ids[:-2], packed.segment_ids[:-2])
    ids = packed.ids.clone()
    ids[0] = BOT
    with pytest.raises(InputError, match="begin marker"):
        layout.unpack(ids, packed.segment_ids)


# ---- persistence ----------------------------------------------------------------------------------------

def test_layout_json_round_trip(layout, tmp_path):
    assert Layout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout
    layout.save(tmp_path)
    assert (tmp_path / "layout.json").is_file() and Layout.load(tmp_path) == layout


def test_layout_load_errors(layout, tmp_path):
    changed = layout.to_dict() | {"special_tokens": {**SPECIAL_TOKENS, "MASK": 2}}
    with pytest.raises(DataError, match="special token ids"):
        Layout.from_dict(changed)
    with pytest.raises(DataError, match="malformed layout"):
        Layout.from_dict(layout.to_dict() | {"colour_depth": 3})
    with pytest.raises(DataError, match="no layout.json"):
        Layout.load(tmp_path / "empty")
    with pytest.raises(InputError, match="image_grid"):
        Layout(text_vocab_size=1, image_codebook_size=1, audio_codebook_size=1, audio_frame_rate=1.0,
               image_grid=(8,))


# ---- properties over any layout: round trips, and region <-> token maps that stay in range -------------------

LAYOUTS = st.builds(Layout, text_vocab_size=st.integers(1, 400), image_codebook_size=st.integers(1, 70),
                    audio_codebook_size=st.integers(1, 50), audio_frame_rate=st.floats(0.5, 100),
                    image_grid=st.tuples(st.integers(1, 6), st.integers(1, 6)), image_patch=st.integers(1, 16),
                    max_text_len=st.integers(1, 16), max_audio_len=st.integers(1, 24))


def draw_contents(data, layout: Layout, order) -> dict[str, torch.Tensor]:
    """Local ids for each modality of ``order``: any length a padded segment holds (an image: its full grid)."""
    contents = {}
    for modality in order:
        size = layout.max_content_len(modality)
        length = size if modality == "image" else data.draw(st.integers(0, size), label=f"{modality} length")
        ids = data.draw(st.lists(st.integers(0, layout.codebook_size(modality) - 1), min_size=length,
                                 max_size=length), label=f"{modality} ids")
        contents[modality] = torch.tensor(ids, dtype=torch.long)
    return contents


@settings(max_examples=80, deadline=None)
@given(layout=LAYOUTS, order=st.sampled_from(ORDERS), padded=st.booleans(), data=st.data())
def test_any_layout_packs_and_unpacks_any_content(layout, order, padded, data):
    contents = draw_contents(data, layout, order)
    make = layout.padded_segment if padded else Segment
    packed = layout.pack([make(m, contents[m]) for m in order])
    assert all(torch.equal(layout.unpack(packed.ids, packed.segment_ids)[m], contents[m]) for m in order)
    assert packed.spans[0].start == 0 and packed.spans[-1].end == len(packed)  # spans tile the sequence
    assert all(a.end == b.start for a, b in zip(packed.spans, packed.spans[1:]))
    assert packed.ids.min() >= 0 and packed.ids.max() < layout.vocab_size
    for m in order:  # each content token sits where sequence_indices says, as its shared id
        where = packed.sequence_indices(m, torch.arange(len(contents[m])))
        assert torch.equal(packed.ids[where], layout.to_shared(m, contents[m]))
        assert (layout.modality_of(packed.ids[where]) == lay.SEGMENT_IDS[m]).all()
    batch = collate([packed], pad_to=len(packed) + data.draw(st.integers(0, 5)))
    again = layout.unpack(batch.ids[0], batch.segment_ids[0])
    assert all(torch.equal(again[m], contents[m]) for m in order)


@settings(max_examples=80, deadline=None)
@given(layout=LAYOUTS, modality=st.sampled_from(MODALITIES), ids=st.lists(st.integers(-3, 500), max_size=20))
def test_local_and_shared_ids_round_trip_or_are_refused(layout, modality, ids):
    local = torch.tensor(ids, dtype=torch.long)
    if all(0 <= i < layout.codebook_size(modality) for i in ids):
        shared = layout.to_shared(modality, local)
        assert torch.equal(layout.to_local(modality, shared), local)
        assert ((shared >= NUM_SPECIAL) & (shared < layout.vocab_size)).all()
    else:
        with pytest.raises(InputError, match=f"{modality} ids must lie in \\[0, {layout.codebook_size(modality)}\\)"):
            layout.to_shared(modality, local)


@settings(max_examples=150, deadline=None)
@given(layout=LAYOUTS, box=st.tuples(*[st.floats(-50, 150, allow_nan=False)] * 4))
def test_an_image_box_maps_to_exactly_the_codes_it_touches(layout, box):
    """Either an InputError, or every code whose pixels meet the half-open box, each once, and no other."""
    rows, cols = layout.image_grid
    patch = layout.image_patch
    x0, y0, x1, y1 = box
    touched = sorted(r * cols + c for r in range(rows) for c in range(cols)
                     if c * patch < x1 and (c + 1) * patch > x0 and r * patch < y1 and (r + 1) * patch > y0)
    try:
        codes = layout.image_box_to_positions(box).tolist()
    except InputError:
        assert not touched or not (x1 > x0 and y1 > y0)
        return
    assert codes == touched and codes and all(0 <= c < rows * cols for c in codes)


@settings(max_examples=150, deadline=None)
@given(layout=LAYOUTS, start=st.floats(-1, 30, allow_nan=False), length=st.floats(-1, 30, allow_nan=False),
       n_codes=st.one_of(st.none(), st.integers(1, 40)))
def test_an_audio_span_maps_to_exactly_the_codes_it_overlaps(layout, start, length, n_codes):
    """Every code the span overlaps by more than the mapping's tolerance (1e-9 of a code: a boundary that float
    arithmetic puts a hair off, 1.9999999999999964 s at 1 code/s, counts as the boundary), or, for a span shorter
    than that, the code it starts in."""
    end, rate, tolerance = start + length, layout.audio_frame_rate, 1e-9
    total = layout.max_audio_len if n_codes is None else n_codes
    overlapping = [k for k in range(total) if k < end * rate - tolerance and k + 1 > start * rate + tolerance]
    starts_in = math.floor(start * rate + tolerance)
    if not overlapping and end > start and 0 <= starts_in < total:
        overlapping = [starts_in]
    try:
        codes = layout.audio_span_to_positions(start, end, n_codes).tolist()
    except InputError:
        assert start < 0 or not end > start or not overlapping
        return
    assert codes == overlapping and codes and all(0 <= k < total for k in codes)


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet="a redcircleblusquare ,.", min_size=1, max_size=30), data=st.data())
def test_a_text_span_maps_to_exactly_the_tokens_it_overlaps(text, data):
    codec = _span_codec()
    start = data.draw(st.integers(0, len(text) - 1))
    end = data.draw(st.integers(start + 1, len(text)))
    ids, offsets = codec.encode_with_offsets(text)
    hits = Layout.text_span_to_positions(text, start, end, codec).tolist()
    assert hits == [i for i, (a, b) in enumerate(offsets) if a < end and b > start]
    assert all(0 <= i < ids.numel() for i in hits)
    with pytest.raises(InputError, match="a text span needs 0 <= start < end"):
        Layout.text_span_to_positions(text, end, start, codec)


@functools.lru_cache(maxsize=1)
def _span_codec() -> TextCodec:
    """One small BPE for every example (hypothesis reruns the test; training it each time would dominate)."""
    return TextCodec.train(["a red circle", "a blue square", "red, blue."] * 20, vocab_size=300)
