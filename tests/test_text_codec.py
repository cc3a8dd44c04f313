"""The text codec (byte-level BPE) and the codec registry: round trips, persistence, clear errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unimodal.tokenizers_mm import CODECS, Codec, get_codec_class
from unimodal.tokenizers_mm.text import TextCodec, caption_corpus, default_corpus, normalize
from unimodal.core import grammar
from unimodal.core.errors import DataError, InputError

TINY_VOCAB = 400


def tiny_corpus() -> list[str]:
    """A few hundred strings: every 100th grammar caption plus some varied sentences."""
    sentences = ["The quick brown fox jumps over the lazy dog.", "Draw a red circle, please!",
                 "Numbers 0123456789 and symbols #$%&*()", "Ünïcödé tèxt wïth äccents", "naïve café résumé"]
    return caption_corpus()[::100] + sentences * 20


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    return TextCodec.train(tiny_corpus(), vocab_size=TINY_VOCAB)


ROUND_TRIP_CASES = [
    "a small red circle on the left",
    "",
    " leading and trailing spaces ",
    "tabs\tand\nnewlines\r\n",
    "Ünïcödé, naïve café",
    "e\u0301 (e + combining acute: NFC makes it é)",
    "emoji 😀🎨🔊 and a family 👨‍👩‍👧",
    "中文字符 and 日本語 and 한국어",
    "\x00 control \x07 chars",
    "a , b . c ?",  # spaces before punctuation must survive (no tokenization-space clean-up)
]


@pytest.mark.parametrize("text", ROUND_TRIP_CASES)
def test_round_trip_returns_normalized_text(codec, text):
    ids = codec.encode([text])[0]
    assert ids.dtype == torch.long and ids.dim() == 1
    assert codec.decode([ids]) == [normalize(text)]


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=40))
def test_round_trip_any_string(codec, text):
    ids = codec.encode_one(text)
    assert ((ids >= 0) & (ids < codec.codebook_size)).all()
    assert codec.decode_one(ids) == normalize(text)


def test_no_unknown_token(codec):
    assert codec.tokenizer.unk_token is None
    unseen = "ŧĥïś ŵåś ñëṽëŕ ŝëëñ 🦜"
    ids = codec.encode_one(unseen)
    assert ids.numel() > 0 and codec.decode_one(ids) == unseen


def test_empty_string_is_zero_tokens(codec):
    assert codec.encode([""])[0].numel() == 0
    assert codec.decode([[]]) == [""]


def test_batch_encode_has_no_special_tokens_and_variable_lengths(codec):
    short, long = codec.encode(["a", "a small red circle on the left"])
    assert short.numel() < long.numel()
    assert codec.decode([short, long.tolist()]) == ["a", "a small red circle on the left"]


def test_max_length_truncates(codec):
    (full,) = codec.encode(["a small red circle on the left"])
    (ids,) = codec.encode(["a small red circle on the left"], max_length=3)
    assert full.numel() > 3 and ids.tolist() == full[:3].tolist()  # the first three tokens: cut at the end


def test_codebook_size_is_vocab_size(codec):
    assert codec.codebook_size == TINY_VOCAB == len(codec.tokenizer.get_vocab())


def test_offsets_cover_the_original_string(codec):
    text = "a red café 😀"
    ids, offsets = codec.encode_with_offsets(text)
    assert len(offsets) == ids.numel()
    assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    assert all(start <= end for start, end in offsets)


def test_save_load_gives_same_ids(codec, tmp_path):
    codec.save_pretrained(tmp_path / "text")
    loaded = TextCodec.from_pretrained(tmp_path / "text")
    assert loaded.codebook_size == codec.codebook_size
    for text in ROUND_TRIP_CASES:
        assert torch.equal(loaded.encode_one(text), codec.encode_one(text))
        assert loaded.decode_one(codec.encode_one(text)) == normalize(text)


def test_training_is_deterministic():
    first = TextCodec.train(tiny_corpus(), vocab_size=TINY_VOCAB)
    second = TextCodec.train(tiny_corpus(), vocab_size=TINY_VOCAB)
    assert first.tokenizer.get_vocab() == second.tokenizer.get_vocab()


def test_bad_inputs_raise_clear_errors(codec, tmp_path):
    with pytest.raises(InputError, match="list of strings"):
        codec.encode("a bare string")
    with pytest.raises(InputError, match="expected str"):
        codec.encode([b"bytes"])
    with pytest.raises(InputError, match="outside the text codebook"):
        codec.decode([[0, codec.codebook_size]])
    with pytest.raises(InputError, match="at least 256"):
        TextCodec.train(["x"], vocab_size=100)
    with pytest.raises(DataError, match="no text codec"):
        TextCodec.from_pretrained(tmp_path / "missing")


def test_caption_corpus_holds_every_caption():
    captions = caption_corpus()
    n_objects = len(grammar.SHAPES) * len(grammar.COLORS) * len(grammar.SIZES)
    n_single = n_objects * len(grammar.POSITIONS) * len(grammar.SINGLE_TEMPLATES)
    n_pair = n_objects ** 2 * len(grammar.RELATIONS) * len(grammar.PAIR_TEMPLATES)
    n_digit = 10 * len(grammar.DIGIT_TEMPLATES)
    assert len(captions) == n_single + n_pair + n_digit
    assert "a handwritten 7" in captions and "there is a large blue cross at the top" in captions


def test_default_codec_keeps_caption_words_whole():
    """Trains on the full default corpus (about a second): every caption word is one token."""
    codec = TextCodec.train(default_corpus(n_faker=500, n_words=1000), vocab_size=1024)
    caption = "the picture shows a small red circle to the left of a large purple triangle"
    assert codec.encode_one(caption).numel() == len(caption.split())


def test_codec_protocol_and_registry(codec):
    assert isinstance(codec, Codec)
    assert get_codec_class("text") is TextCodec
    assert set(CODECS) == {"text", "image", "audio"}
    with pytest.raises(InputError, match="audio, image, text"):
        get_codec_class("smell")
