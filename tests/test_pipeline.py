"""UniModal pipeline and MaskedDiffusionScheduler on a tiny untrained model folder: loading both folder kinds,
save -> load -> same tokens, every direction, joint generation, batching = one by one, seeds, clear errors,
and a hand-written scheduler loop that commits what the schedule says (and reproduces the sampler)."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
import torch
from PIL import Image

from unimodal.backbone.dit import DiT
from unimodal.inference.sampler import Request, SamplerConfig, generate, masked_after_step
from unimodal.inference.schedulers import MaskedDiffusionScheduler
from unimodal.tokenizers_mm.layout import EOT, MASK, PAD, Layout
from unimodal.core.errors import DataError, InputError, SettingError

from conftest import TASKS, random_tiny_dit  # noqa: E402

FAST = dict(steps=4)


@pytest.fixture(scope="module")
def pipe(tiny_model_dir):
    from unimodal import UniModal

    return UniModal.from_pretrained(tiny_model_dir)


def speech(seconds=1.0, rate=16_000):
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def picture():
    image = np.zeros((64, 64, 3), np.uint8)
    image[16:40, 8:30] = (220, 40, 40)
    return image


# ---- the scheduler ----------------------------------------------------------------------------------------------


LAYOUT = Layout(text_vocab_size=300, image_codebook_size=32, audio_codebook_size=32, audio_frame_rate=15.6,
                max_text_len=16, max_audio_len=24)


@pytest.fixture(scope="module")
def dit():
    return random_tiny_dit(LAYOUT.vocab_size)


def test_scheduler_config_round_trip_and_checks(tmp_path):
    scheduler = MaskedDiffusionScheduler(mode="threshold", tau=0.7, num_inference_steps=8, top_k=5)
    scheduler.save_pretrained(tmp_path)
    loaded = MaskedDiffusionScheduler.from_pretrained(tmp_path)
    public = lambda config: {k: v for k, v in config.items() if not k.startswith("_")}  # noqa: E731
    assert public(loaded.config) == public(scheduler.config)
    config = loaded.sampler_config(cfg=2.0, seed=3, steps=None)
    assert (config.mode, config.tau, config.steps, config.top_k, config.cfg, config.seed) == ("threshold", 0.7, 8, 5,
                                                                                              2.0, 3)
    loaded.set_timesteps(4)
    assert torch.allclose(loaded.timesteps, torch.tensor([1.0, math.cos(math.pi / 8), math.cos(math.pi / 4),
                                                          math.cos(3 * math.pi / 8)]))
    with pytest.raises(InputError, match="tau"):
        MaskedDiffusionScheduler(tau=1.5)
    with pytest.raises(InputError, match="unknown sampler settings"):
        scheduler.sampler_config(stepz=3)


def test_scheduler_defaults_per_generated_modality(tmp_path):
    from unimodal.inference.schedulers import DEFAULT_TARGET_SETTINGS

    scheduler = MaskedDiffusionScheduler()
    image, text = scheduler.sampler_config("image"), scheduler.sampler_config("text")
    assert (image.cfg, image.choice_temperature, image.temperature) == (3.0, 4.5, 0.7)
    assert (text.cfg, text.choice_temperature, text.temperature) == (None, 0.0, 0.0)
    speech = scheduler.sampler_config("audio")
    assert (speech.cfg, speech.choice_temperature, speech.temperature, speech.steps) == (3.0, 4.5, 0.7, 32)
    assert scheduler.sampler_config(["text", "image"]).cfg == 3.0  # a joint request: the image's defaults
    assert scheduler.sampler_config("image", cfg=1.5, temperature=0.0).cfg == 1.5  # the caller's settings win
    assert scheduler.sampler_config().cfg is None  # no target: the scheduler's own settings
    scheduler.save_pretrained(tmp_path)
    assert MaskedDiffusionScheduler.from_pretrained(tmp_path).config.target_settings == DEFAULT_TARGET_SETTINGS
    assert MaskedDiffusionScheduler(target_settings={}).sampler_config("image").cfg is None
    custom = MaskedDiffusionScheduler(target_settings={"text": {"mode": "threshold", "tau": 0.8}})
    assert (custom.sampler_config("text").mode, custom.sampler_config("image").mode) == ("threshold", "confidence")
    for bad, message in (({"video": {}}, "unknown modalities"), ({"text": {"seed": 1}}, "unknown settings"),
                         ({"text": {"tau": 2.0}}, "tau"), ({"text": 3}, "map a modality")):
        with pytest.raises(InputError, match=message):
            MaskedDiffusionScheduler(target_settings=bad)


def _manual_loop(dit, scheduler, condition, target, steps, seed):
    """A user's loop: model.forward on [condition; target], scheduler.step on the target part."""
    packed = LAYOUT.pack([condition, target])
    cond_len = packed.spans[0].end
    allowed = MaskedDiffusionScheduler.allowed_for(LAYOUT, packed)[cond_len:]  # (L_t, V)
    is_target = torch.arange(len(packed)) >= cond_len
    ids, n_slots = packed.ids[cond_len:].clone()[None], int((packed.ids[cond_len:] == MASK).sum())
    generator = torch.Generator().manual_seed(seed)
    scheduler.set_timesteps(steps)
    history = []
    for index, _ in enumerate(scheduler.timesteps):
        t = (ids == MASK).sum(1).float() / n_slots
        full = torch.cat([packed.ids[None, :cond_len], ids], dim=1)
        logits = dit(full, t, packed.segment_ids[None], packed.positions[None], is_target[None]).logits[:, cond_len:]
        out = scheduler.step(logits, index, ids, allowed, generator=generator)
        history.append((int((ids == MASK).sum()), int(out.committed.sum())))
        ids = out.prev_sample
    return ids[0], history


def test_manual_scheduler_loop_commits_the_schedule_and_matches_the_sampler(dit):
    condition = ("text", torch.tensor([5, 6, 7]))
    scheduler = MaskedDiffusionScheduler(num_inference_steps=6)
    ids, history = _manual_loop(dit, scheduler, condition, LAYOUT.target_segment("image"), 6, seed=11)
    n = 64
    assert [committed for _, committed in history] == [
        (n if s == 0 else masked_after_step(n, s - 1, 6, "cosine")) - masked_after_step(n, s, 6, "cosine")
        for s in range(6)]
    codes = ids[1:-1]
    assert not (ids == MASK).any()
    assert LAYOUT.allowed_ids("image")[codes].all()
    # The same rules as the sampler: with the same generator seed, the same tokens.
    [sampled] = generate(dit, LAYOUT, [Request([condition], ["image"])], SamplerConfig(steps=6, seed=11,
                                                                                      use_cache=False))
    assert torch.equal(sampled.target.ids, ids)
    # and with MaskGIT's randomised commit order
    noisy = MaskedDiffusionScheduler(num_inference_steps=6, choice_temperature=4.5)
    ids, _ = _manual_loop(dit, noisy, condition, LAYOUT.target_segment("image"), 6, seed=11)
    [sampled] = generate(dit, LAYOUT, [Request([condition], ["image"])],
                         SamplerConfig(steps=6, seed=11, use_cache=False, choice_temperature=4.5))
    assert torch.equal(sampled.target.ids, ids)


def test_manual_loop_on_text_fills_every_mask_and_pads_after_end(dit):
    scheduler = MaskedDiffusionScheduler(mode="threshold", tau=0.3, num_inference_steps=5, temperature=0.0)
    ids, history = _manual_loop(dit, scheduler, ("image", torch.arange(64) % 32), LAYOUT.target_segment("text"), 5,
                                seed=0)
    assert not (ids == MASK).any()
    assert all(committed >= 1 for masked, committed in history if masked)
    body = ids[1:].tolist()
    stop = next(i for i, token in enumerate(body) if token in (EOT, PAD))
    assert all(token == PAD for token in body[stop + 1:])


def test_semi_ar_step_opens_blocks_left_to_right(dit):
    scheduler = MaskedDiffusionScheduler(mode="semi_ar", block_length=4, num_inference_steps=2, temperature=0.0)
    scheduler.set_timesteps(2)
    packed = LAYOUT.pack([LAYOUT.target_segment("image")])
    allowed = MaskedDiffusionScheduler.allowed_for(LAYOUT, packed)
    ids = packed.ids[None].clone()
    logits = torch.randn(1, len(packed), LAYOUT.vocab_size, generator=torch.Generator().manual_seed(0))
    out = scheduler.step(logits, 0, ids, allowed)
    assert out.committed[0, 1:5].sum() == 2 and out.committed.sum() == 2  # half of the first block
    out = scheduler.step(logits, 1, out.prev_sample, allowed)
    assert out.committed[0, 1:5].sum() == 2 and not (out.prev_sample[0, 1:5] == MASK).any()
    assert (out.prev_sample[0, 5:-1] == MASK).all()


# ---- loading and saving -----------------------------------------------------------------------------------------


def test_loads_a_training_model_folder(pipe, tiny_model_dir):
    from unimodal.tokenizers_mm.layout import Layout as LayoutClass

    assert isinstance(pipe.backbone, DiT) and not pipe.backbone.training
    assert isinstance(pipe.scheduler, MaskedDiffusionScheduler)
    assert pipe.layout.to_dict() == LayoutClass.load(tiny_model_dir).to_dict()
    assert pipe.config.task_weights == TASKS
    assert pipe.trained_modalities == ({"text", "image", "audio"}, {"text", "image", "audio"})


def test_save_then_load_gives_the_same_tokens(pipe, tmp_path):
    from unimodal import UniModal

    pipe.save_pretrained(tmp_path / "pipe")
    assert (tmp_path / "pipe" / "model_index.json").is_file()
    loaded = UniModal.from_pretrained(tmp_path / "pipe")
    assert loaded.config.task_weights == TASKS and loaded.layout.to_dict() == pipe.layout.to_dict()
    first = pipe.generate(text="a red circle", to="image", seed=3, **FAST)
    again = loaded.generate(text="a red circle", to="image", seed=3, **FAST)
    assert first.token_ids == again.token_ids


def test_folders_that_are_not_models_give_clear_errors(tmp_path):
    from unimodal import UniModal

    with pytest.raises(InputError, match="does not exist"):
        UniModal.from_pretrained(tmp_path / "nope")
    with pytest.raises(DataError, match="not a unimodal model folder"):
        UniModal.from_pretrained(tmp_path)


def test_import_unimodal_stays_light():
    code = "import sys, unimodal; assert 'torch' not in sys.modules and 'diffusers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- generation -------------------------------------------------------------------------------------------------


def check_lengths(result):
    assert set(result.token_ids) == set(result.confidence) == set(result.modalities)
    for modality, ids in result.token_ids.items():
        assert len(ids) == len(result.confidence[modality])
        assert all(0.0 < c <= 1.0 for c in result.confidence[modality])
    assert result.forward_passes == result.steps == len(result.settings["commits_per_step"])


def test_every_direction_returns_the_right_types(pipe):
    inputs = {"text": "a small red circle on the left", "image": picture(), "audio": speech()}
    for source, value in inputs.items():
        for target in ("text", "image", "audio"):
            if target == source:
                continue
            result = pipe.generate(**{source: value}, to=target, **FAST)
            check_lengths(result)
            assert result.modalities == (target,) and result.settings["inputs"] == [source]
            if target == "image":
                assert isinstance(result.image, Image.Image) and result.image.size == (64, 64)
                assert result.image.mode == "RGB" and len(result.token_ids["image"]) == 64
            elif target == "audio":
                assert result.audio.dtype == np.float32 and result.audio.ndim == 1
                assert len(result.token_ids["audio"]) <= pipe.layout.max_audio_len
            else:
                assert isinstance(result.text, str)
                assert len(result.token_ids["text"]) <= pipe.layout.max_text_len


def test_joint_generation_and_unconditional(pipe):
    joint = pipe.generate(text="a blue square", to=["image", "audio"], **FAST)
    assert joint.modalities == ("image", "audio")
    check_lengths(joint)
    everything = pipe.generate(to="text,image,audio", **FAST)
    assert everything.modalities == ("text", "image", "audio") and everything.settings["inputs"] == []
    check_lengths(everything)


def recorded_stages(monkeypatch) -> list:
    """Each sampler call's requests from now on, as (targets, conditions' ids), one list per call."""
    from unimodal import UniModal

    stages = []
    sample_prepared = UniModal._sample_prepared

    def recording(self, ready, settings, progress):
        stages.append([(list(item.targets), {m: c.tolist() for m, c in item.conditions.items()}) for item in ready])
        return sample_prepared(self, ready, settings, progress)

    monkeypatch.setattr(UniModal, "_sample_prepared", recording)
    return stages


def test_plan_in_text_writes_the_text_then_the_rest_guided_by_it(pipe, monkeypatch):
    """plan="text": the text is what a text-only request gives, and the other outputs are sampled with the inputs
    and that text's own ids as conditions (guided by it); costs add up; "none" samples from the inputs alone."""
    stages = recorded_stages(monkeypatch)
    joint = pipe.generate(to="text,image,audio", seed=5, plan="text", **FAST)
    assert joint.settings["plan"] == "text" and joint.settings["to"] == ["text", "image", "audio"]
    assert joint.settings["inputs"] == [] and joint.modalities == ("text", "image", "audio")
    assert stages == [[(["text"], {})], [(["image", "audio"], {"text": joint.token_ids["text"]})]]
    caption = pipe.generate(to="text", seed=5)  # the text stage takes text's defaults, not the outputs' steps=4
    assert joint.text == caption.text and joint.token_ids["text"] == caption.token_ids["text"]
    for stage in (joint.settings["text_stage"], caption.settings):  # from nothing: text's order, sampled
        assert (stage["mode"], stage["temperature"]) == ("threshold", 0.5)
    assert joint.settings["text_stage"]["text"] == joint.text
    assert joint.settings["cfg"] == 3.0 and joint.settings["text_stage"]["cfg"] is None  # the rest is guided
    assert joint.forward_passes == len(joint.settings["commits_per_step"]) > caption.forward_passes  # both stages
    assert joint.settings["commits_per_step"][:caption.forward_passes] == caption.settings["commits_per_step"]
    together = pipe.generate(to="text,image,audio", seed=5, plan="none", **FAST)
    assert together.settings["plan"] == "none" and "text_stage" not in together.settings
    assert together.modalities == ("text", "image", "audio")
    # an input and no text output: the text is read from the input (greedy: text's defaults) and only guides
    stages.clear()
    heard = pipe.generate(audio=speech(), to="image", seed=1, plan="text", **FAST)
    read = pipe.generate(audio=speech(), to="text", seed=1)
    assert heard.modalities == ("image",) and set(heard.token_ids) == {"image"} and heard.text is None
    assert heard.settings["text_stage"]["text"] == read.text and heard.settings["text_stage"]["temperature"] == 0.0
    assert heard.settings["inputs"] == ["audio"] and heard.settings["to"] == ["image"]
    assert [targets for (targets, _), in stages[:2]] == [["text"], ["image"]]
    # the image stage reads the clip and the text
    assert read.text.strip() and set(stages[1][0][1]) == {"audio", "text"}
    hot = pipe.generate(audio=speech(), to="image", seed=1, temperature=1.0, choice_temperature=2.0, plan="text",
                       **FAST)
    assert hot.settings["text_stage"]["text"] == read.text and hot.settings["temperature"] == 1.0  # outputs' only
    fresh = pipe.generate(to="text,image", seed=None, **FAST)  # one fresh seed for both stages: it reruns
    assert pipe.generate(to="text,image", seed=fresh.settings["seed"], **FAST).token_ids == fresh.token_ids
    # text given, or text alone asked for: nothing to plan
    assert pipe.generate(text="a red circle", to=["image", "audio"], **FAST).settings["plan"] == "none"
    assert pipe.generate(image=picture(), to="text", **FAST).settings["plan"] == "none"
    # batched = one by one, errors in place
    batch = pipe.generate_batch([{"to": "text,image,audio", "seed": 5}, {"text": "", "to": "text,image"},
                                 {"to": "text"}], errors="return", plan="text", **FAST)
    assert batch[0].token_ids == joint.token_ids and isinstance(batch[1], InputError)
    assert batch[2].token_ids == pipe.generate(to="text", seed=2, **FAST).token_ids
    first, second = (r.settings["seed"] for r in pipe.generate_batch([{"to": "image"}] * 2, seed=None, **FAST))
    assert second == first + 1  # a fresh base seed, request i at base + i as with a given seed
    with pytest.raises(SettingError, match="plan must be one of"):
        pipe.generate(to="text,image", plan="caption")


def test_plan_text_only_samples_each_output_from_the_words_alone(pipe, monkeypatch):
    """plan="text-only": the same text stage, then each other output its own request with the words as the only
    condition (the input it was read from set aside); costs add up, the outputs and tokens are joined in order,
    and critique reads such a result with the words alone."""
    from unimodal.refine import draft_of

    stages = recorded_stages(monkeypatch)
    joint = pipe.generate(to="text,image,audio", seed=5, plan="text-only", **FAST)
    words = {"text": joint.token_ids["text"]}
    assert stages[0] == [(["text"], {})] and stages[1] == [(["image"], words), (["audio"], words)]
    assert joint.settings["plan"] == "text-only" and joint.modalities == ("text", "image", "audio")
    assert joint.settings["to"] == ["text", "image", "audio"] and list(joint.token_ids) == ["text", "image", "audio"]
    planned = pipe.generate(to="text,image,audio", seed=5, plan="text", **FAST)
    assert joint.token_ids["text"] == planned.token_ids["text"]  # the same text stage
    assert pipe.generate(to="text,image,audio", seed=5, **FAST).token_ids == joint.token_ids  # the default
    check_lengths(joint)
    drawn = pipe.generate(to="text,image", seed=5, plan="text-only", **FAST)  # each output its own request
    assert drawn.token_ids == {m: joint.token_ids[m] for m in ("text", "image")}
    assert joint.forward_passes == len(joint.settings["commits_per_step"])
    assert joint.forward_passes > drawn.forward_passes  # the speech is a third loop, after the text and the image
    assert joint.settings["guidance_passes"] > drawn.settings["guidance_passes"] > 0
    stages.clear()
    heard = pipe.generate(audio=speech(), to="image", seed=1, plan="text-only", **FAST)
    assert heard.settings["inputs"] == ["audio"] and heard.modalities == ("image",)
    conditioned = heard.settings["text_stage"]["conditioned"]
    assert set(stages[1][0][1]) == ({"text"} if conditioned else {"audio"})  # empty words: the input stays
    draft = draft_of(pipe, heard, {"audio": speech()})  # critique and refine read it as it was made
    assert [m for m, _ in draft.conditions] == (["text"] if conditioned else ["audio"])


def test_unconditional_text_samples_so_seeds_differ(pipe):
    """Text from nothing samples (greedy would write one caption for every seed); temperature given wins."""
    drawn = {tuple(pipe.generate(to="text", seed=s, **FAST).token_ids["text"]) for s in range(4)}
    assert len(drawn) > 1
    greedy = {tuple(pipe.generate(to="text", seed=s, temperature=0, **FAST).token_ids["text"]) for s in range(3)}
    assert len(greedy) == 1
    plain = [pipe.generate(to="text", seed=s) for s in range(4)]  # no order key given: text's order, sampled
    assert all((r.settings["mode"], r.settings["temperature"]) == ("threshold", 0.5) for r in plain)
    assert len({tuple(r.token_ids["text"]) for r in plain}) > 1
    ordered = pipe.generate(to="text", seed=0, mode="confidence")  # an order key given: the caller's order
    assert ordered.settings["mode"] == "confidence" and ordered.settings["temperature"] == 0.5


def test_unconditional_text_defaults_layering():
    """The caller's keys win; the order keys of the defaults go as a unit when the caller sets any of them."""
    from unimodal.inference.schedulers import LEFT_TO_RIGHT_TEXT, UNCONDITIONAL_TEXT_SETTINGS, unconditional_text_settings

    assert unconditional_text_settings({"seed": 3, "temperature": None}) == {"seed": 3, **UNCONDITIONAL_TEXT_SETTINGS}
    assert unconditional_text_settings({"seed": 3}, LEFT_TO_RIGHT_TEXT) == {"seed": 3, **LEFT_TO_RIGHT_TEXT}
    assert unconditional_text_settings({"temperature": 1.0})["temperature"] == 1.0
    assert unconditional_text_settings({"steps": 8}, LEFT_TO_RIGHT_TEXT) == {"steps": 8, "temperature": 0.5}
    assert unconditional_text_settings({"mode": "threshold"}, LEFT_TO_RIGHT_TEXT) == {"mode": "threshold",
                                                                                       "temperature": 0.5}


def test_length_caps_and_inputs_as_files(pipe, tmp_path):
    Image.fromarray(picture()).resize((100, 80)).save(tmp_path / "photo.png")
    sf.write(tmp_path / "clip.wav", speech(), 16_000)
    result = pipe.generate(image=str(tmp_path / "photo.png"), audio=tmp_path / "clip.wav", to=["text"],
                           max_text_tokens=3, **FAST)
    assert len(result.token_ids["text"]) <= 3 and result.settings["inputs"] == ["image", "audio"]
    audio = pipe.generate(text="a red circle", to="audio", max_audio_seconds=0.5, **FAST)
    assert len(audio.token_ids["audio"]) <= math.ceil(0.5 * pipe.layout.audio_frame_rate)


def test_same_seed_same_output_and_batch_equals_one_by_one(pipe):
    requests = [{"text": "a red circle", "to": "image"}, {"image": picture(), "to": "text"},
                {"text": "a green cross", "to": "image"}, {"text": "two", "to": "audio", "seed": 42}]
    batch = pipe.generate_batch(requests, seed=7, temperature=1.0, **FAST)
    for index, (request, result) in enumerate(zip(requests, batch)):
        seed = request.pop("seed", 7 + index)
        alone = pipe.generate(**request, seed=seed, temperature=1.0, **FAST)
        assert alone.token_ids == result.token_ids and result.settings["seed"] == seed
    again = pipe.generate(text="a red circle", to="image", seed=7, temperature=1.0, **FAST)
    assert again.token_ids == batch[0].token_ids
    other = pipe.generate(text="a red circle", to="image", seed=8, temperature=1.0, **FAST)
    assert other.token_ids != batch[0].token_ids
    fresh = pipe.generate(text="a red circle", to="image", seed=None, **FAST)
    assert isinstance(fresh.settings["seed"], int)


def test_candidates_keep_the_draw_that_agrees_best_with_the_input(pipe):
    """candidates=N draws seeds seed .. seed + N - 1 and keeps the one whose prompt the model reads back best;
    the kept one is exactly what generate gives for its seed, and every draw's passes are counted."""
    best = pipe.generate(text="a red circle", to="image", steps=4, seed=5, candidates=3)
    chosen = best.settings["candidates"]
    assert chosen["n"] == 3 and chosen["seeds"] == [5, 6, 7]
    assert chosen["agreement"][chosen["kept"]] == max(chosen["agreement"])
    alone = pipe.generate(text="a red circle", to="image", steps=4, seed=5 + chosen["kept"])
    assert alone.token_ids == best.token_ids
    assert best.forward_passes == 3 * alone.forward_passes + 3  # three samplings, three read-backs
    black = np.zeros((64, 64, 3), np.uint8)
    caption = pipe.generate(image=black, to="text", steps=4, temperature=0.7, candidates=2)
    assert caption.settings["candidates"]["n"] == 2  # any direction with an input
    assert pipe.draws_differ("image") and not pipe.draws_differ("text") and pipe.draws_differ("text", temperature=0.7)
    with pytest.raises(SettingError, match="greedy sampling .* draws the same output 2 times; give temperature"):
        pipe.generate(image=black, to="text", steps=4, candidates=2)  # text is greedy by default: 2 equal draws
    with pytest.raises(SettingError, match="greedy"):
        pipe.generate(text="a red circle", to="image", temperature=0, choice_temperature=0, candidates=2)
    with pytest.raises(InputError, match="unconditional"):
        pipe.generate(to="image", steps=4, candidates=2)
    for bad in (0, 65, True, 1.5):
        with pytest.raises(SettingError, match="candidates"):
            pipe.generate(text="a red circle", to="image", candidates=bad)


def test_best_of_returns_every_draw_it_chose_from(pipe):
    """best_of: generate(candidates=N)'s result and its N draws in seed order, each the output of its own seed."""
    kept, draws = pipe.best_of(3, text="a red circle", to="image", steps=4, seed=5)
    again = pipe.generate(text="a red circle", to="image", steps=4, seed=5, candidates=3)
    chosen = dict(kept.settings["candidates"])
    by_reading = chosen.pop("by_reading")  # every draw read each way: best_of's alone (a benchmark's comparison)
    assert kept.token_ids == again.token_ids and chosen == again.settings["candidates"]
    assert len(draws) == 3 and draws[chosen["kept"]] is kept
    assert draws[1].token_ids == pipe.generate(text="a red circle", to="image", steps=4, seed=6).token_ids
    assert chosen["draw_passes"] == [4, 4, 4] and kept.forward_passes == 3 * 4 + 3
    assert chosen["reading"] == "joint" and by_reading["joint"] == {"agreement": chosen["agreement"], "read_passes": 1}
    words = len(pipe.text_codec.encode_one("a red circle"))
    assert by_reading["each"]["read_passes"] == words > 1 and len(by_reading["each"]["agreement"]) == 3
    with pytest.raises(SettingError, match="candidates must be >= 2"):
        pipe.best_of(1, text="a red circle", to="image")


def test_candidates_chosen_by_each_word_read_alone(pipe):
    """agreement="each": the same draws, the one whose request reads back best word by word kept (a pass per
    request token counted for each read); the reading is refused without candidates to choose among."""
    kept, draws = pipe.best_of(3, text="a red circle", to="image", steps=4, seed=5)
    each = kept.settings["candidates"]["by_reading"]["each"]
    chosen = pipe.generate(text="a red circle", to="image", steps=4, seed=5, candidates=3, agreement="each")
    best = max(range(3), key=each["agreement"].__getitem__)
    assert chosen.token_ids == draws[best].token_ids and chosen.settings["candidates"]["kept"] == best
    assert chosen.settings["candidates"]["reading"] == "each"
    assert chosen.settings["candidates"]["agreement"] == each["agreement"]
    assert chosen.forward_passes == 3 * 4 + 3 * each["read_passes"]
    with pytest.raises(SettingError, match="needs candidates > 1"):
        pipe.generate(text="a red circle", to="image", steps=4, agreement="each")
    with pytest.raises(SettingError, match="agreement must be one of"):
        pipe.generate(text="a red circle", to="image", steps=4, candidates=2, agreement="word")


def test_generate_refine_is_refine_of_the_output_against_its_inputs(pipe, tmp_path):
    """refine=N: the output, then N rounds of refine against the inputs with refine's own defaults (a caption read
    from a picture gets the caption recipe), exactly what calling refine on it gives; its passes counted and what
    ran recorded. Bad rounds are refused before any sampling."""
    grey = np.full((64, 64, 3), 90, np.uint8)
    plain = pipe.generate(image=grey, to="text", seed=1, max_text_tokens=10, **FAST)
    refined = pipe.generate(image=grey, to="text", seed=1, max_text_tokens=10, refine=2, **FAST)
    expected, trace = pipe.refine(plain, image=grey, rounds=2, seed=1)
    assert trace["caption_recipe"] and trace["evaluator"] == "agreement"
    assert refined.token_ids == expected.token_ids and refined.text == expected.text
    assert refined.settings["refine"] == {**{k: trace[k] for k in ("critic", "forward_passes", "stopped", "rounds_kept")},
                                         "rounds_run": len(trace["rounds"])}
    assert refined.forward_passes == plain.forward_passes + trace["forward_passes"] > plain.forward_passes
    Image.fromarray(grey).save(tmp_path / "grey.png")  # a file input is read back by refine as generate read it
    from_file = pipe.generate(image=str(tmp_path / "grey.png"), to="text", seed=1, max_text_tokens=10, refine=2,
                              **FAST)
    assert from_file.token_ids == refined.token_ids
    picture = pipe.generate(text="a red circle", to="image", seed=3, refine=1, **FAST)
    assert picture.settings["refine"]["critic"] == "confidence"
    assert pipe.generate(text="a red circle", to="image", seed=3, refine=0, **FAST).settings.get("refine") is None
    for bad in (-1, 33, True, 1.5, "2"):
        with pytest.raises(SettingError, match="refine must be a whole number of rounds from 0"):
            pipe.generate(text="a red circle", to="image", refine=bad, **FAST)
    from unimodal.core.seeds import SEED_LIMIT, derived_seed

    # every accepted seed works with any rounds: the round seeds wrap around the limit (seed + r below it)
    top = SEED_LIMIT - 1
    near = pipe.generate(text="a red circle", to="image", seed=top, refine=3, **FAST)
    assert near.settings["refine"]["critic"] == "confidence" and derived_seed(top, 2) == 1 and derived_seed(5, 2) == 7
    _, near_trace = pipe.refine(picture, text="a red circle", rounds=3, seed=top, critic="random")  # always flags
    assert near_trace["rounds"] and near_trace["config"]["seed"] == top
    with pytest.raises(InputError, match="seed must be a non-negative int below 2\\*\\*62"):  # before any work
        pipe.refine(picture, text="a red circle", rounds=3, seed=SEED_LIMIT)
    # ... and any batch or candidates: request 1 after the top seed is drawn with seed 0, as one by one
    batch = pipe.generate_batch([dict(text="a red circle", to="image"), dict(text="a blue square", to="image")],
                                seed=top, refine=0, **FAST)
    alone = pipe.generate(text="a blue square", to="image", seed=0, refine=0, **FAST)
    assert batch[1].token_ids == alone.token_ids
    assert pipe.generate(text="a red circle", to="image", seed=top, candidates=2, refine=0,
                         **FAST).settings["candidates"]["seeds"] == [top, 0]
    # keeps the caption recipe whatever drew the caption: the sampling settings given are not refine's
    warm = pipe.generate(image=grey, to="text", seed=1, max_text_tokens=10, temperature=0.5, refine=1, **FAST)
    _, trace = pipe.refine(pipe.generate(image=grey, to="text", seed=1, max_text_tokens=10, temperature=0.5, **FAST),
                           image=grey, rounds=1, seed=1)
    assert trace["regen_temperature"] == 1.0 and warm.settings["refine"]["forward_passes"] == trace["forward_passes"]


def trained_head_copy(model_dir, folder):
    """A copy of a model folder whose training record says its critic head was trained (the tiny model's is
    random: the defaults that read a trained head then apply to it)."""
    import shutil

    shutil.copytree(model_dir, folder)
    record = folder / "training_config.json"
    config = json.loads(record.read_text()) if record.is_file() else {}
    record.write_text(json.dumps({**config, "critic_trained": True}))
    return folder


def test_speech_alone_is_refined_by_default_with_its_critic_when_the_head_is_trained(pipe, tiny_model_dir, tmp_path):
    """refine=None: speech alone (to="audio") on a model whose critic head is trained is refined
    SPEECH_REFINE_ROUNDS rounds by SPEECH_CRITIC, exactly what refine with its defaults gives; nothing else is, and
    no model without a trained head; generate_batch refines as generate does; refine=0 draws as before."""
    from unimodal import UniModal
    from unimodal.refine import SPEECH_CRITIC, SPEECH_REFINE_ROUNDS, default_critic, default_refine_rounds

    assert not pipe.config.critic_trained
    assert default_refine_rounds(pipe, ["audio"]) == 0 and default_critic(pipe, ["audio"]) == "confidence"
    assert pipe.generate(text="a red circle", to="audio", seed=2, **FAST).settings.get("refine") is None
    trained = UniModal.from_pretrained(trained_head_copy(tiny_model_dir, tmp_path / "trained"))
    assert default_refine_rounds(trained, ["audio"]) == trained.default_refine_rounds("audio") == SPEECH_REFINE_ROUNDS == 2
    assert default_critic(trained, ["audio"]) == SPEECH_CRITIC == "content+learned"
    for targets in (["image"], ["text"], ["text", "audio"], ["image", "audio"]):
        assert default_refine_rounds(trained, targets) == 0 and default_critic(trained, targets) == "confidence"
    plain = trained.generate(text="a red circle", to="audio", seed=2, refine=0, **FAST)
    assert plain.settings.get("refine") is None
    refined = trained.generate(text="a red circle", to="audio", seed=2, **FAST)
    expected, trace = trained.refine(plain, text="a red circle", rounds=SPEECH_REFINE_ROUNDS, seed=2)
    assert trace["critic"] == SPEECH_CRITIC and refined.settings["refine"]["critic"] == SPEECH_CRITIC
    assert refined.token_ids == expected.token_ids
    assert refined.forward_passes == plain.forward_passes + trace["forward_passes"] > plain.forward_passes
    picture = trained.generate(text="a red circle", to="image", seed=3, **FAST)
    assert picture.settings.get("refine") is None
    batch = trained.generate_batch([{"text": "a red circle", "to": "audio", "seed": 2},
                                    {"text": "a red circle", "to": "image", "seed": 3}], **FAST)
    assert batch[0].token_ids == refined.token_ids and batch[1].token_ids == picture.token_ids
    assert batch[1].settings.get("refine") is None
    raw = trained.generate_batch([{"text": "a red circle", "to": "audio", "seed": 2}], refine=0, **FAST)[0]
    assert raw.token_ids == plain.token_ids
    # best of N: the draws as drawn, the kept one refined once
    kept, drawn = trained.best_of(2, text="a red circle", to="audio", seed=2, **FAST)
    assert all(d.settings.get("refine") is None for d in drawn)
    chosen = trained.generate(text="a red circle", to="audio", seed=2, candidates=2, **FAST)
    assert chosen.settings["refine"]["critic"] == SPEECH_CRITIC
    # critique reads speech with the same critic when none is named; a caller's choice is kept
    assert trained.critique(plain, text="a red circle").critic == SPEECH_CRITIC
    assert trained.critique(plain, text="a red circle", critic="confidence").critic == "confidence"
    with pytest.raises(SettingError, match="refine must be a whole number of rounds"):
        trained.generate_batch([{"text": "a red circle", "to": "audio"}], refine=-1, **FAST)


def test_accept_confidence_keeps_a_sure_first_draw_and_draws_the_rest_otherwise(pipe):
    """accept_confidence: the first draw alone when its confidence score reaches the bar (its passes and the 4 of
    the score counted), else all N drawn and the best by agreement kept, exactly as without it."""
    from unimodal.inference.critique import confidence_scores, sample_score
    from unimodal.refine import draft_of

    first = pipe.generate(text="a red circle", to="image", steps=4, seed=5)
    scores, calls = confidence_scores(pipe.backbone, pipe.layout, draft_of(pipe, first, {"text": "a red circle"}), 4)
    score = sample_score(scores)
    sure = pipe.generate(text="a red circle", to="image", steps=4, seed=5, candidates=3, accept_confidence=score - 0.01)
    chosen = sure.settings["candidates"]
    assert (chosen["drawn"], chosen["kept"], chosen["seeds"]) == (1, 0, [5]) and "agreement" not in chosen
    assert chosen["confidence"] == pytest.approx(score, abs=1e-5) and chosen["accept_confidence"] == score - 0.01
    assert sure.token_ids == first.token_ids and sure.forward_passes == first.forward_passes + calls == first.forward_passes + 4
    unsure = pipe.generate(text="a red circle", to="image", steps=4, seed=5, candidates=3, accept_confidence=0.0)
    all_drawn = pipe.generate(text="a red circle", to="image", steps=4, seed=5, candidates=3)
    assert score < 0.0  # the random model is sure of no draw (a score of 0 would be accepted at 0 as well)
    assert unsure.settings["candidates"]["drawn"] == 3 and unsure.token_ids == all_drawn.token_ids
    assert unsure.settings["candidates"]["kept"] == all_drawn.settings["candidates"]["kept"]
    assert unsure.forward_passes == all_drawn.forward_passes + 4  # the first draw's score was read too
    for bad in (0.5, float("nan"), "high", True):
        with pytest.raises(SettingError, match="accept_confidence must be a number <= 0"):
            pipe.generate(text="a red circle", to="image", candidates=2, accept_confidence=bad)
    with pytest.raises(SettingError, match="needs candidates > 1"):
        pipe.generate(text="a red circle", to="image", accept_confidence=-0.1)


def test_accept_agreement_draws_one_at_a_time_until_a_draw_reads_back_as_asked(pipe):
    """accept_agreement: draws made one by one (seed, seed + 1, ...), each read back as it comes; the first whose
    score reaches the bar is kept and no more are drawn; when none does, all are drawn and the best kept, the
    same draw as without it. Passes count the draws made and their reads; refused without candidates, beside
    accept_confidence, or above 0."""
    from unimodal.inference.critique import agreement_score
    from unimodal.refine import draft_of

    prompt = {"text": "a red circle"}
    singles = [pipe.generate(**prompt, to="image", steps=4, seed=5 + k) for k in range(3)]
    reads = [agreement_score(pipe.backbone, pipe.layout, draft_of(pipe, d, prompt), reading="each") for d in singles]
    scores = [score for score, _ in reads]
    bar = scores[1] - 1e-4  # the second draw reaches it; whether the first does decides where drawing stops
    stop = 0 if scores[0] >= bar else 1
    until = pipe.generate(**prompt, to="image", steps=4, seed=5, candidates=3, agreement="each", accept_agreement=bar)
    chosen = until.settings["candidates"]
    assert (chosen["drawn"], chosen["kept"], chosen["seeds"]) == (stop + 1, stop, [5 + k for k in range(stop + 1)])
    assert chosen["accepted"] and chosen["accept_agreement"] == bar and chosen["reading"] == "each"
    assert chosen["agreement"] == pytest.approx(scores[:stop + 1], abs=1e-5)
    assert until.token_ids == singles[stop].token_ids
    assert until.forward_passes == sum(d.forward_passes + calls for d, (_, calls) in zip(singles[:stop + 1], reads))
    assert max(scores) + 1e-3 <= 0  # the random model reads no draw back as certain: a bar above them all exists
    never = pipe.generate(**prompt, to="image", steps=4, seed=5, candidates=3, agreement="each",
                          accept_agreement=max(scores) + 1e-3)
    every = pipe.generate(**prompt, to="image", steps=4, seed=5, candidates=3, agreement="each")
    # a bar no draw reaches: all drawn, the best kept, as always drawing all keeps it
    assert never.settings["candidates"]["drawn"] == 3 and not never.settings["candidates"]["accepted"]
    assert never.token_ids == every.token_ids
    assert never.settings["candidates"]["kept"] == every.settings["candidates"]["kept"]
    for bad in (0.5, float("nan"), "high", True):
        with pytest.raises(SettingError, match="accept_agreement must be a number <= 0"):
            pipe.generate(**prompt, to="image", candidates=2, accept_agreement=bad)
    with pytest.raises(SettingError, match="needs candidates > 1"):
        pipe.generate(**prompt, to="image", accept_agreement=-0.3)
    with pytest.raises(SettingError, match="give one or the other"):
        pipe.generate(**prompt, to="image", candidates=2, accept_agreement=-0.3, accept_confidence=-0.1)


def test_each_output_gets_its_modalitys_defaults_under_the_callers_settings(pipe):
    image = pipe.generate(text="a red circle", to="image", **FAST)
    caption = pipe.generate(image=picture(), to="text", **FAST)
    assert (image.settings["cfg"], image.settings["choice_temperature"], image.settings["temperature"]) == (3.0, 4.5, 0.7)
    assert (caption.settings["cfg"], caption.settings["temperature"]) == (None, 0.0)
    mine = pipe.generate(text="a red circle", to="image", cfg=1.0, choice_temperature=0.0, **FAST)
    assert (mine.settings["cfg"], mine.settings["choice_temperature"]) == (1.0, 0.0)


def test_progress_bar_ends_where_the_work_ends(pipe, capsys):
    """Threshold decoding that commits every slot early ends its bar full (k/k), not at k/steps."""
    result = pipe.generate(image=picture(), to="text", mode="threshold", tau=0.01, steps=8, progress=True)
    renders = [part for part in capsys.readouterr().err.split("\r") if "sampling" in part]
    assert result.steps < result.settings["steps"]  # it did stop early
    assert f"{result.steps}/{result.steps}" in renders[-1]


def test_calls_from_several_threads_are_serialised(pipe):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        threaded = list(pool.map(lambda seed: pipe.generate(text="a red circle", seed=seed, **FAST), [1, 2, 3]))
    for seed, result in zip([1, 2, 3], threaded):
        assert result.token_ids == pipe.generate(text="a red circle", seed=seed, **FAST).token_ids


def test_guidance_passes_are_reported(pipe):
    result = pipe.generate(text="a red circle", image=picture(), to="audio", cfg={"text": 2.0, "image": 3.0}, **FAST)
    assert result.settings["guidance_passes"] == 2 * result.forward_passes
    assert result.settings["cfg"] == {"text": 2.0, "image": 3.0}


@pytest.mark.parametrize("kwargs, message", [
    (dict(text="a", to="video"), "unknown output 'video'.*accepted"),
    (dict(text="a", to=[]), "unknown output"),
    (dict(text="a", to=3), "to must be"),
    (dict(text="   ", to="image"), "text is empty and there is no other input"),
    (dict(text="a", to="text"), "text is both an input and an output"),
    (dict(text="a", steps=0), "steps must be an int >= 1, got 0"),
    (dict(text="a", tau=0.0), r"tau must be a number in \(0, 1\]"),
    (dict(text="a", tau=1.5), r"tau must be a number in \(0, 1\]"),
    (dict(text="a", seed=1.5), "seed must be a non-negative int"),
    (dict(text="a", seed="1"), "seed must be a non-negative int"),
    (dict(text="a", mode="fast"), "mode must be one of"),
    (dict(text="a", stepz=3), "unknown setting"),
    (dict(image="/no/such/file.png", to="text"), "image: no such file"),
    (dict(audio=3, to="text"), "audio must be"),
    (dict(image=picture(), to="text", max_text_tokens=999), "max_text_tokens must lie in 1..12"),
    (dict(text="a", to="audio", max_audio_seconds=60), r"max_audio_seconds must lie in \(0, 1.02\]"),
    (dict(text="word " * 40, to="image"), "tokens; this model reads at most 12"),
])
def test_bad_input_says_what_is_wrong(pipe, kwargs, message):
    with pytest.raises(InputError, match=message):
        pipe.generate(**{**FAST, **kwargs})


def test_unreadable_files_and_untrained_inputs(pipe, tmp_path):
    from unimodal import UniModal

    (tmp_path / "broken.png").write_bytes(b"not a png")
    with pytest.raises(InputError, match="image"):
        pipe.generate(image=tmp_path / "broken.png", to="text")
    text_only = UniModal(**pipe.components, layout=pipe.config.layout, task_weights={"text->image": 1.0})
    with pytest.raises(InputError, match="not trained to read audio.*leave the audio input out"):
        text_only.generate(audio=speech(), to="image")
    with pytest.raises(InputError, match="not trained to write text"):
        text_only.generate(to="text")
    with pytest.raises(InputError, match="request 1: unknown request key"):
        pipe.generate_batch([{"text": "a"}, {"txt": "b"}])


def test_result_saves_every_format(pipe, tmp_path):
    import json

    result = pipe.generate(to=["text", "image", "audio"], **FAST)
    for name in ("out.png", "out.wav", "out.txt", "out.json"):
        assert result.save(tmp_path / name) == [tmp_path / name]
    assert Image.open(tmp_path / "out.png").size == (64, 64)
    wave, rate = sf.read(tmp_path / "out.wav")
    assert rate == 16_000 and len(wave) == len(result.audio)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == result.text + "\n"
    assert json.loads((tmp_path / "out.json").read_text())["token_ids"] == result.token_ids
