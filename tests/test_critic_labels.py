"""Wrong by decoded content (training/critic_labels.py): a code that decodes like the real one is not wrong, a
code that changes what is decoded is wrong where it sits, and a draft that ends early or late is wrong there."""

import torch

from unimodal.tokenizers_mm.layout import EOA, PAD, SEGMENT_IDS
from unimodal.training.critic_labels import DecodedLabels
from unimodal.training.tokens import CodecStack


def _row(layout, modality, local):
    return (torch.as_tensor(local) + layout.offset(modality))[None]


class _PatchDecoder:
    """A decoder whose codes paint their own 8x8 patch a grey level (``levels[code]``), so what each code
    changes is known exactly; codes 3 and 5 paint the same grey."""

    device = torch.device("cpu")

    def __init__(self, size=32):
        self.levels = torch.linspace(-1, 1, size)
        self.levels[3] = self.levels[5]

    def decode_indices(self, indices, grid):
        grey = self.levels[indices].reshape(-1, 1, *grid)
        return grey.repeat_interleave(8, 2).repeat_interleave(8, 3).expand(-1, 3, -1, -1)


def test_image_codes_are_wrong_only_where_their_decoded_patch_differs(tiny_codec_dir):
    layout = CodecStack.load(tiny_codec_dir).layout
    labels = DecodedLabels(layout, image_model=_PatchDecoder(), image_threshold=0.05)
    truth = torch.full((64,), 5)
    truth[40:] = torch.arange(24) % 30 + 1  # a varied picture
    segments = torch.full((1, 64), SEGMENT_IDS["image"])

    same = truth.clone()
    same[9] = 3  # another id, the same patch: token inequality calls it wrong, its content does not differ
    assert not labels.wrong(_row(layout, "image", same), _row(layout, "image", truth), segments).any()

    far = truth.clone()
    far[9], far[50] = 20, truth[50] + 1  # one patch far from the truth, one a grey level off (1/31 of the range)
    distance = labels.distance("image", truth[None], far[None])[0]
    assert distance.nonzero().squeeze(1).tolist() == [9, 50]
    assert abs(float(distance[9]) - float(labels.models["image"].levels[20] - labels.models["image"].levels[5]) / 2) \
        < 1e-6  # mean |difference| over the patch, in [0, 1] pixel units
    wrong = labels.wrong(_row(layout, "image", far), _row(layout, "image", truth), segments)[0]
    assert wrong.nonzero().squeeze(1).tolist() == [9]  # the near one is not called wrong
    # without the codec, token inequality
    tokens = DecodedLabels(layout)
    assert tokens.wrong(_row(layout, "image", same), _row(layout, "image", truth), segments)[0].nonzero().tolist() \
        == [[9]]


def test_the_real_image_codec_gives_zero_for_identical_codes_and_more_for_others(tiny_codec_dir):
    stack = CodecStack.load(tiny_codec_dir)
    labels = DecodedLabels.of(stack)
    truth = torch.arange(64) % stack.layout.codebook_size("image")
    other = truth.flip(0)
    assert (labels.distance("image", truth[None], truth[None]) == 0).all()
    assert (labels.distance("image", truth[None], other[None]) > 0).any()


def test_audio_that_ends_early_or_late_is_wrong_there_and_like_codes_are_not(tiny_codec_dir):
    stack = CodecStack.load(tiny_codec_dir)
    layout = stack.layout
    labels = DecodedLabels(layout, audio_model=stack.audio.model, audio_threshold=1e9)  # codes never far apart
    low = layout.offset("audio")
    truth = torch.tensor([low + 1, low + 2, low + 3, low + 4, EOA, PAD])[None]
    draft = torch.tensor([low + 1, low + 7, low + 3, EOA, PAD, PAD])[None]  # one code changed, ends one early
    segments = torch.full(truth.shape, SEGMENT_IDS["audio"])
    wrong = labels.wrong(draft, truth, segments)[0].tolist()
    assert wrong == [False, False, False, True, True, False]  # the changed code decodes alike at this threshold
    late = torch.tensor([low + 1, low + 2, low + 3, low + 4, low + 5, EOA])[None]
    assert labels.wrong(late, truth, segments)[0].tolist() == [False, False, False, False, True, True]
    codes = truth[:, :4] - low
    assert (DecodedLabels(layout, audio_model=stack.audio.model).distance("audio", codes, codes) == 0).all()
