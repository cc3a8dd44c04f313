"""The codec registry drives the pipeline: UniModal loads, encodes and decodes every modality through
``unimodal.tokenizers_mm.CODECS``, so a codec registered there is the one a generation uses, with no other change;
and every registered codec has what a modality needs beyond the registry (layout markers, pipeline components)."""

import inspect

import numpy as np
import pytest

from unimodal.core.errors import InputError
from unimodal.tokenizers_mm import CODECS, codec_from_parts, codec_parts, get_codec_class, load_codecs
from unimodal.tokenizers_mm.image import ImageCodec
from unimodal.tokenizers_mm.layout import MARKERS, MODALITIES, SEGMENT_IDS
from unimodal.tokenizers_mm.text import TextCodec


class RecordingImageCodec(ImageCodec):
    """The image codec, counting what passes through it: a stand-in for a new codec of a modality."""

    calls: list[tuple[str, int]] = []

    def encode(self, images):
        ids = super().encode(images)
        RecordingImageCodec.calls.append(("encode", len(ids)))
        return ids

    def decode(self, ids):
        images = super().decode(ids)
        RecordingImageCodec.calls.append(("decode", len(images)))
        return images


class ShoutingTextCodec(TextCodec):
    """The text codec, but its decoded text is upper case: shows the registered class decodes results."""

    def decode(self, ids):
        return [text.upper() for text in super().decode(ids)]


@pytest.fixture
def registered(monkeypatch):
    """Register test codecs for image and text in place of the shipped ones, for one test."""
    RecordingImageCodec.calls = []
    monkeypatch.setitem(CODECS, "image", f"{__name__}:RecordingImageCodec")
    monkeypatch.setitem(CODECS, "text", f"{__name__}:ShoutingTextCodec")


def test_the_pipeline_loads_encodes_and_decodes_through_the_registered_codecs(registered, tiny_model_dir):
    from unimodal import UniModal

    pipe = UniModal.from_pretrained(tiny_model_dir)
    assert type(pipe.codecs["image"]) is RecordingImageCodec and type(pipe.codecs["text"]) is ShoutingTextCodec
    assert pipe.image_codec is pipe.codecs["image"]  # the per-modality attributes are views of the mapping
    assert pipe.codecs["image"].model is pipe.image_vq  # built from the pipeline's registered component

    picture = np.zeros((64, 64, 3), np.uint8)
    captions = pipe.generate_batch([{"image": picture, "to": "text"}, {"image": picture, "to": "text"}], steps=2)
    assert RecordingImageCodec.calls == [("encode", 2)]  # both requests' images in one codec call
    assert all(r.text == r.text.upper() for r in captions)

    RecordingImageCodec.calls = []
    drawn = pipe.generate(text="a red circle", to="image", steps=2)
    assert RecordingImageCodec.calls == [("decode", 1)] and drawn.image.size == (64, 64)


def test_a_codec_rebuilt_from_its_pipeline_parts_is_the_same_codec(tiny_codec_dir):
    for modality, codec in load_codecs(tiny_codec_dir).items():
        parts = codec_parts(codec)
        rebuilt = codec_from_parts(modality, parts)
        assert type(rebuilt) is type(codec) and codec_parts(rebuilt) == parts
        assert rebuilt.codebook_size == codec.codebook_size


def test_every_registered_modality_has_what_the_registry_cannot_give_it():
    """A registry line alone is not a modality: the layout's markers and segment id, and a UniModal component
    per pipeline part (the saved-pipeline format), must exist too; this names what is missing."""
    from unimodal.pipeline import UniModal
    from unimodal.results import GenerationResult

    components = set(inspect.signature(UniModal.__init__).parameters)
    results = set(inspect.signature(GenerationResult).parameters)
    assert tuple(CODECS) == MODALITIES, "the registry and the layout must list the same modalities, in order"
    for modality in CODECS:
        codec = get_codec_class(modality)
        assert codec.modality == modality
        assert modality in MARKERS and modality in SEGMENT_IDS, f"layout.py has no markers for {modality}"
        missing = set(codec.pipeline_parts) - components
        assert not missing, f"UniModal.__init__ has no component {sorted(missing)} for the {modality} codec"
        assert modality in results, f"GenerationResult has no {modality} field"


def test_an_unregistered_modality_is_named_with_the_known_ones():
    with pytest.raises(InputError, match="unknown modality 'smell'.*audio, image, text"):
        get_codec_class("smell")


def test_a_codec_set_can_share_a_modality_with_another_folder(tiny_codec_dir, tmp_path):
    """A codec set stores only the codecs that differ; ``codecs.json`` names where the others are (a newer codec set
    beside the default model, ``unimodal/default_codecs``, shares its image and text codecs: stored once)."""
    import json
    import shutil

    from unimodal.tokenizers_mm import codec_folder
    from unimodal.training.tokens import CodecStack

    new = tmp_path / "new"
    shutil.copytree(tiny_codec_dir / "audio", new / "audio")
    (new / "codecs.json").write_text(json.dumps({"shared": {"image": "../base", "text": "../base"}}))
    shutil.copytree(tiny_codec_dir, tmp_path / "base")
    assert codec_folder(new, "image").resolve() == (tmp_path / "base" / "image").resolve()
    assert codec_folder(new, "audio") == new / "audio"  # its own copy wins
    stack, reference = CodecStack.load(new), CodecStack.load(tiny_codec_dir)
    assert stack.layout.to_dict() == reference.layout.to_dict()
    assert stack.fingerprint(new) == reference.fingerprint(tiny_codec_dir)  # same codecs, same token caches


def test_a_codec_set_without_a_modality_says_which_and_where_it_looked(tiny_codec_dir, tmp_path):
    import json
    import shutil

    from unimodal.core.errors import DataError
    from unimodal.tokenizers_mm import codec_folder

    shutil.copytree(tiny_codec_dir / "audio", tmp_path / "audio")
    with pytest.raises(DataError, match="has no image codec"):
        codec_folder(tmp_path, "image")
    (tmp_path / "codecs.json").write_text(json.dumps({"shared": {"image": "."}}))
    with pytest.raises(DataError, match="its own folder"):
        codec_folder(tmp_path, "image")
    (tmp_path / "codecs.json").write_text("[1, 2]")
    with pytest.raises(DataError, match="codecs.json"):
        codec_folder(tmp_path, "image")
