"""The word probe reads exactly the attribute words of each caption: an oracle that copies the clean next token
(autoregressive) is right on every one, a model that can only copy its input (diffusion) is right on none,
because each probed word is masked."""

import json

import pytest
import torch

from unimodal.core.grammar import COLORS, SHAPES
from unimodal.training import probe as probe_module
from unimodal.training.probe import word_probe

from conftest import write_tiny_model  # noqa: E402


class _Out:
    def __init__(self, logits):
        self.logits = logits


class _Oracle(torch.nn.Module):
    """``next``: logits at i are one-hot of ids[i + 1] (what an AR model should say); else one-hot of ids[i]."""

    def __init__(self, vocab: int, next_token: bool):
        super().__init__()
        self.vocab, self.next_token = vocab, next_token

    def forward(self, ids, t, segment_ids, positions, is_target, attention_mask):
        target = torch.roll(ids, -1, dims=1) if self.next_token else ids
        return _Out(torch.nn.functional.one_hot(target, self.vocab).float())


@pytest.fixture(scope="module")
def probe_setup(tiny_codec_dir, tmp_path_factory):
    from unimodal.training.data.scenes import make_sample
    from unimodal.training.tokens import CodecStack

    model_dir = write_tiny_model(tiny_codec_dir, tmp_path_factory.mktemp("probe") / "model", max_text_len=32)
    stack = CodecStack.load(model_dir)
    captions = ["a small red circle on the left", "a large blue square at the top"]
    tokens = [{"text": stack.text.encode_one(c), "image": stack.image.encode(make_sample(i, 0, 0, heldout=False,
                                                                                          speech=False).image[None])[0]}
              for i, c in enumerate(captions)]
    return model_dir, stack, tokens, captions


@pytest.mark.parametrize("source", ["image", "audio"])
@pytest.mark.parametrize("objective, oracle_next, expected", [("ar", True, 1.0), ("diffusion", False, 0.0)])
def test_the_probe_reads_exactly_the_attribute_words(probe_setup, monkeypatch, objective, oracle_next, expected,
                                                     source):
    model_dir, stack, tokens, captions = probe_setup
    if source == "audio":  # the same captions heard: a clip's codes in place of the picture's
        tokens = [{"text": t["text"], "audio": torch.arange(12) % 8} for t in tokens]
    config = json.loads((model_dir / "training_config.json").read_text())
    (model_dir / "training_config.json").write_text(json.dumps({**config, "objective": objective}))
    vocab = stack.layout.vocab_size
    monkeypatch.setattr(probe_module, "load_pretrained", lambda cls, folder: _Oracle(vocab, oracle_next))
    report = word_probe(model_dir, tokens, stack.text, source=source)
    single = [w for c in captions for w in c.split() if len(stack.text.encode_one(" " + w)) == 1
              and (w in COLORS or w in SHAPES or w in ("small", "large", "left", "top"))]
    assert report["objective"] == objective and report["captions"] == 2 and report["source"] == source
    assert report["words"] == len(single) > 0  # the one-token attribute words, each once
    assert report["accuracy"] == expected
    assert report["by_objects"] == {"1": {"words": len(single), "accuracy": expected}}  # one-object captions
    assert ("in_view" in report) == (objective == "diffusion")  # each word alone: a masked model's second state


def test_the_probe_needs_captioned_pictures(probe_setup):
    model_dir, stack, tokens, _ = probe_setup
    from unimodal.core.errors import InputError

    with pytest.raises(InputError, match="image\\+text"):
        word_probe(model_dir, [{"text": tokens[0]["text"]}], stack.text)
    with pytest.raises(InputError, match="audio\\+text"):
        word_probe(model_dir, tokens, stack.text, source="audio")  # pictures, not clips
    with pytest.raises(InputError, match="not from 'text'"):
        word_probe(model_dir, tokens, stack.text, source="text")


class _TruthWhenAlone(torch.nn.Module):
    """Names the true token of a row's masked slot when it is the row's only one, else copies its input: a model
    that binds every word once the rest of its caption is in view, and can do nothing with two words hidden."""

    def __init__(self, vocab: int, clean: torch.Tensor):
        super().__init__()
        self.vocab, self.clean = vocab, clean

    def forward(self, ids, t, segment_ids, positions, is_target, attention_mask):
        from unimodal.tokenizers_mm.layout import MASK

        out = ids.clone()
        for row in range(ids.shape[0]):
            hidden = ids[row] == MASK
            if int(hidden.sum()) == 1:
                match = next(c for c in self.clean if bool(((ids[row] == c) | hidden).all()))
                out[row] = match
        return _Out(torch.nn.functional.one_hot(out, self.vocab).float())


def test_the_probe_tells_one_object_from_two_and_each_word_alone_from_all_at_once(probe_setup, monkeypatch):
    from unimodal.tokenizers_mm.layout import Layout
    from unimodal.training.data.scenes import make_sample
    from unimodal.training.tasks import Task, build_example, collate_examples

    model_dir, stack, _, _ = probe_setup
    config = json.loads((model_dir / "training_config.json").read_text())
    (model_dir / "training_config.json").write_text(json.dumps({**config, "objective": "diffusion"}))
    captions = ["a small red circle on the left", "a small red circle to the left of a large blue square"]
    tokens = [{"text": stack.text.encode_one(c), "image": stack.image.encode(make_sample(i, 0, 0, heldout=False,
                                                                                          speech=False).image[None])[0]}
              for i, c in enumerate(captions)]
    layout = Layout.load(model_dir)
    clean = collate_examples([build_example(layout, s, Task.parse("image->text"), pad_targets=True)
                              for s in tokens]).batch.ids
    monkeypatch.setattr(probe_module, "load_pretrained",
                        lambda cls, folder: _TruthWhenAlone(stack.layout.vocab_size, clean))
    report = word_probe(model_dir, tokens, stack.text)
    assert set(report["by_objects"]) == set(report["in_view"]) == {"1", "2"}
    assert report["accuracy"] == 0.0  # every attribute word hidden at once: nothing to bind from
    assert all(row["accuracy"] == 1.0 for row in report["in_view"].values())  # each alone: every one named
    assert sum(row["words"] for row in report["in_view"].values()) == report["words"]
    assert report["in_view"]["2"]["words"] > report["in_view"]["1"]["words"]  # the pair has more attribute words
