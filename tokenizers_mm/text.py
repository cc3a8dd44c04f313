"""Text codec: a byte-level BPE, so any Unicode string encodes with no unknown token.

Normalisation is Unicode NFC, built into the tokenizer itself: ``decode(encode(s)) == normalize(s)`` for
every string ``s`` (NFC only merges canonically equivalent code points such as "e" + combining acute into
"é"; it never changes what a person reads). Character offsets reported by :meth:`TextCodec.encode_with_offsets`
refer to the caller's original, un-normalised string.

The pre-tokenizer splits on word boundaries (GPT-2 rule), so merges never cross a space: every caption word
stays its own token (" red", " triangle"), which keeps colour/shape compositional and text edits word-aligned.

The codec adds no special tokens: ``unimodal.tokenizers_mm.layout`` wraps text in its begin/end markers.
"""

from __future__ import annotations

import itertools
import json
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from unimodal.core.errors import DataError, InputError

# Measured on default_corpus(): grammar words are whole tokens at any size >= 1024, so a scene caption is
# 11.9 tokens (= its words) and a digit caption 3.9 (2048: 6.6, "handwritten" split); a held-out Faker
# sentence (5.5 words) is 7.2 tokens (2048: 9.0, 3072: 7.5, 6144: 6.7). Beyond 4096 the gain is small.
DEFAULT_VOCAB_SIZE = 4096
DEFAULT_MIN_FREQUENCY = 2
NORMALIZATION = "NFC"
CONFIG_NAME = "text_codec.json"
FORMAT_VERSION = 1


def normalize(text: str) -> str:
    """The form of ``text`` that a round trip through the codec returns (Unicode NFC)."""
    return unicodedata.normalize(NORMALIZATION, text)


def _new_bpe_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    # add_prefix_space=False: a leading space would not survive decode, breaking the round trip.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _check_texts(texts: Sequence[str]) -> None:
    if isinstance(texts, str):
        raise InputError("TextCodec.encode takes a list of strings; wrap a single string as [text]")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"text {i} is a {type(text).__name__}, expected str")


class TextCodec:
    """Byte-level BPE text codec wrapped as a ``transformers`` fast tokenizer.

    ``encode(["a red circle"]) -> [LongTensor([...])]`` (one 1-D tensor per text, no special tokens),
    ``decode([ids]) -> ["a red circle"]``.
    """

    modality = "text"
    pipeline_parts = {"tokenizer": "tokenizer"}

    def __init__(self, tokenizer: PreTrainedTokenizerFast):
        self.tokenizer = tokenizer
        self._backend: Tokenizer = tokenizer.backend_tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE,
              min_frequency: int = DEFAULT_MIN_FREQUENCY) -> "TextCodec":
        """Train a BPE of at most ``vocab_size`` ids (fewer when the corpus has fewer merges to offer)."""
        alphabet_size = len(pre_tokenizers.ByteLevel.alphabet())
        if vocab_size < alphabet_size:
            raise InputError(f"vocab_size must be at least {alphabet_size} (one id per byte), got {vocab_size}")
        tokenizer = _new_bpe_tokenizer()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False, special_tokens=[],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # all 256 bytes: nothing is ever unknown
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(PreTrainedTokenizerFast(tokenizer_object=tokenizer, clean_up_tokenization_spaces=False))

    @property
    def codebook_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, texts: Sequence[str], max_length: int | None = None) -> list[torch.Tensor]:
        """One 1-D LongTensor of local ids per text; ``max_length`` truncates (may cut a character's bytes)."""
        _check_texts(texts)
        encodings = self._backend.encode_batch(list(texts), add_special_tokens=False)
        ids = [torch.tensor(e.ids, dtype=torch.long) for e in encodings]
        return ids if max_length is None else [i[:max_length] for i in ids]

    def decode(self, ids: Sequence[torch.Tensor | Sequence[int]]) -> list[str]:
        """Text of each id sequence; invalid UTF-8 (e.g. a half-generated character) becomes U+FFFD."""
        lists = [self._checked_ids(i, n) for n, i in enumerate(ids)]
        return self._backend.decode_batch(lists, skip_special_tokens=False)

    def encode_one(self, text: str) -> torch.Tensor:
        return self.encode([text])[0]

    def decode_one(self, ids: torch.Tensor | Sequence[int]) -> str:
        return self.decode([ids])[0]

    def encode_with_offsets(self, text: str) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """Ids of ``text`` and, per token, the (start, end) characters of ``text`` it covers."""
        _check_texts([text])
        encoding = self._backend.encode(text, add_special_tokens=False)
        return torch.tensor(encoding.ids, dtype=torch.long), [tuple(o) for o in encoding.offsets]

    def _checked_ids(self, ids: torch.Tensor | Sequence[int], index: int) -> list[int]:
        values = ids.reshape(-1).tolist() if isinstance(ids, torch.Tensor) else list(ids)
        bad = [v for v in values if not 0 <= v < self.codebook_size]
        if bad:
            raise InputError(f"sequence {index} holds ids outside the text codebook [0, {self.codebook_size}): "
                             f"{bad[:5]}")
        return values

    def save_pretrained(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(directory)
        config = {"modality": self.modality, "format_version": FORMAT_VERSION, "normalization": NORMALIZATION,
                  "codebook_size": self.codebook_size}
        (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "TextCodec":
        directory = Path(directory)
        config_path = directory / CONFIG_NAME
        if not config_path.is_file():
            raise DataError(f"{directory} holds no text codec ({CONFIG_NAME} is missing)")
        config = json.loads(config_path.read_text())
        if config.get("modality") != cls.modality or config.get("format_version") != FORMAT_VERSION:
            raise DataError(f"{config_path} describes {config.get('modality')!r} codec format "
                            f"{config.get('format_version')}, expected text format {FORMAT_VERSION}")
        tokenizer = PreTrainedTokenizerFast.from_pretrained(directory, local_files_only=True)
        codec = cls(tokenizer)
        if codec.codebook_size != config["codebook_size"]:
            raise DataError(f"{directory}: tokenizer has {codec.codebook_size} ids, config says "
                            f"{config['codebook_size']}")
        return codec


def caption_corpus() -> list[str]:
    """Every caption the grammar can produce: all scene captions (one and two objects) and digit captions."""
    from unimodal.core import grammar

    objects = [{"shape": s, "color": c, "size": z}
               for s, c, z in itertools.product(grammar.SHAPES, grammar.COLORS, grammar.SIZES)]
    singles = [grammar.scene_caption({"objects": [{**obj, "position": p}], "relation": None}, t)
               for obj in objects for p in grammar.POSITIONS for t in range(len(grammar.SINGLE_TEMPLATES))]
    pairs = [grammar.scene_caption({"objects": [a, b], "relation": r}, t)
             for a, b in itertools.product(objects, objects) for r in grammar.RELATIONS
             for t in range(len(grammar.PAIR_TEMPLATES))]
    digits = [grammar.digit_caption(d, t) for d in range(10) for t in range(len(grammar.DIGIT_TEMPLATES))]
    return singles + pairs + digits


def faker_corpus(n: int, seed: int = 0) -> list[str]:
    """``n`` deterministic English Faker texts: mostly sentences, every fifth a paragraph."""
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(seed)
    return [fake.paragraph() if i % 5 == 4 else fake.sentence() for i in range(n)]


def word_corpus(n: int, repeats: int = 3, words_per_line: int = 16) -> list[str]:
    """The ``n`` most frequent English words (wordfreq) as lines, ``repeats`` times lower case plus once
    capitalised: BPE keeps only merges seen ``min_frequency`` times, so a word listed once would be lost."""
    from wordfreq import top_n_list

    words = top_n_list("en", n)
    lines = [" ".join(words[i:i + words_per_line]) for i in range(0, len(words), words_per_line)]
    return lines * repeats + [" ".join(w.capitalize() for w in line.split()) for line in lines]


def default_corpus(seed: int = 0, n_faker: int = 5000, n_words: int = 5000) -> list[str]:
    """The default BPE training corpus: all grammar captions, Faker English and frequent English words."""
    return caption_corpus() + faker_corpus(n_faker, seed) + word_corpus(n_words)
