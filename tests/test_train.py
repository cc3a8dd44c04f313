import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import free_port, run_group
from unimodal.backbone.dit import DiT
from unimodal.tokenizers_mm.layout import MASK
from unimodal.training.objective import mask_targets, masked_diffusion_loss
from unimodal.training.schedule import MaskSchedule
from unimodal.training.tasks import Task, TaskMixture, build_example, collate_examples
from unimodal.training.tokens import CodecStack, tokenized_split
from unimodal.training.train import TrainConfig, global_batch_indices, step_loss, train
from unimodal.core.errors import DataError, InputError

REPO = Path(__file__).resolve().parents[1]


def test_stratified_mask_ratios_cover_the_interval():
    t = MaskSchedule(min_ratio=0.01).sample(1000, torch.Generator().manual_seed(0))
    assert t.min() >= 0.01 and t.max() <= 1.0
    counts = torch.histc(t, bins=10, min=0.01, max=1.0)
    assert counts.min() >= 95 and counts.max() <= 105  # evenly spread, not merely uniform on average
    assert torch.allclose(MaskSchedule.weight(torch.tensor([0.5, 0.25])), torch.tensor([2.0, 4.0]))


def test_mask_targets_masks_only_maskable_at_rate_t():
    ids = torch.arange(20_000).reshape(2, 10_000) % 50 + 100
    maskable = torch.zeros_like(ids, dtype=torch.bool)
    maskable[:, :5000] = True
    out = mask_targets(ids, maskable, torch.tensor([0.2, 0.9]), torch.Generator().manual_seed(0))
    assert not out.masked[:, 5000:].any()
    assert torch.equal(out.noisy_ids[out.masked], torch.full_like(out.noisy_ids[out.masked], MASK))
    assert torch.equal(out.noisy_ids[~out.masked], ids[~out.masked])
    rates = out.masked[:, :5000].float().mean(dim=1)
    assert abs(rates[0] - 0.2) < 0.02 and abs(rates[1] - 0.9) < 0.02


def test_loss_is_ce_over_masked_weighted_by_inverse_t():
    vocab, t = 7, torch.tensor([0.5])
    ids = torch.tensor([[3, 4, 5, 6]])
    maskable = torch.tensor([[False, True, True, True]])
    masked = mask_targets(ids, maskable, t, torch.Generator().manual_seed(3))
    masked.masked = torch.tensor([[False, True, False, True]])  # fix the draw: 2 of 3 maskable masked
    uniform = torch.zeros(1, 4, vocab)
    expected = 2 * np.log(vocab) / 0.5 / 3  # two masked CE of log V, weight 1/t, per maskable token
    assert masked_diffusion_loss(uniform, masked).item() == pytest.approx(expected, rel=1e-6)
    perfect = torch.full((1, 4, vocab), -30.0)
    perfect[0, torch.arange(4), ids[0]] = 30.0
    assert masked_diffusion_loss(perfect, masked).item() < 1e-6


def test_task_parsing_and_mixture():
    assert Task.parse("text+audio->image").conditions == ("text", "audio")
    with pytest.raises(InputError, match="task 'image->image' is not of the form .* no modality on both sides"):
        Task.parse("image->image")
    mixture = TaskMixture({"text->image": 1.0, "->audio": 1.0})
    rng = np.random.default_rng(0)
    assert {mixture.choose(rng, frozenset({"text", "image"})).name for _ in range(20)} == {"text->image"}
    with pytest.raises(InputError, match="no task"):
        mixture.choose(rng, frozenset({"text"}))


def test_examples_mark_targets_and_slots(tiny_codec_dir):
    layout = CodecStack.load(tiny_codec_dir).layout
    tokens = {"text": torch.tensor([1, 2, 3]), "image": torch.arange(64) % 32}
    example = build_example(layout, tokens, Task.parse("text->image"))
    text_len = 1 + 3 + 1  # BOT, content, EOT
    assert not example.is_target[:text_len].any() and example.is_target[text_len:].all()
    assert example.maskable.sum() == 64  # image codes only: markers are never generated
    reverse = build_example(layout, tokens, Task.parse("image->text"))
    assert reverse.maskable.sum() == layout.max_text_len + 1  # content, EOT and PAD filler: lengths are learned
    dropped = build_example(layout, tokens, Task.parse("text->image"), drop_condition=True)
    assert dropped.task == "->image" and len(dropped.packed) == 66


def test_global_batches_are_epochs_of_permutations():
    cfg = TrainConfig(batch_size=4, seed=1)
    seen = np.concatenate([global_batch_indices(10, cfg, s) for s in range(5)])  # 20 draws = 2 epochs
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
    assert np.array_equal(global_batch_indices(10, cfg, 3), global_batch_indices(10, cfg, 3))


def test_overfitting_a_tiny_batch(tiny_codec_dir):
    """The objective and the backbone together can memorise: same batch, same masks, loss goes to ~0."""
    torch.manual_seed(0)
    layout = CodecStack.load(tiny_codec_dir).layout
    rng = np.random.default_rng(0)
    samples = [{"text": torch.tensor([i + 1, i + 5]), "image": torch.from_numpy(rng.integers(0, 32, 64))} for i in range(4)]
    batch = collate_examples([build_example(layout, s, Task.parse("text->image")) for s in samples])
    model = DiT.from_preset("tiny", layout.vocab_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    t = torch.full((4,), 0.5)
    first = None
    for _ in range(150):
        loss, acc = step_loss(model, batch, MaskSchedule(), torch.Generator().manual_seed(0), t=t)
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert first > 3.0 and loss.item() < 0.05 and acc.item() == 1.0


def _tiny_cfg(**kw):
    base = dict(preset="tiny", steps=4, batch_size=4, warmup=1, val_every=2, val_samples=2, checkpoint_every=2,
                bf16=False)
    return TrainConfig(**{**base, **kw})


def test_train_writes_model_and_resumes_exactly_after_a_kill(tiny_codec_dir, tiny_scenes, tmp_path, monkeypatch,
                                                             capsys):
    import unimodal.training.train as tr

    straight = train(tmp_path / "a", [str(tiny_scenes)], tiny_codec_dir, _tiny_cfg(), progress=False)
    for part in ("backbone/config.json", "layout.json", "text", "image", "audio", "training_config.json"):
        assert (straight / part).exists(), part
    history = json.loads((tmp_path / "a" / "history.json").read_text())
    assert [h["step"] for h in history] == [1, 2, 3, 4] and set(history[1]["val"]) >= {"text->image", "image->text"}
    assert (tmp_path / "a" / "val_loss.png").exists()

    real, calls = tr.make_examples, []

    def killed_at_step_3(layout, tokens, mixture, indices, rng, **kwargs):
        calls.append(1)  # one call per training step
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(layout, tokens, mixture, indices, rng, **kwargs)

    monkeypatch.setattr(tr, "make_examples", killed_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "b", [str(tiny_scenes)], tiny_codec_dir, _tiny_cfg(), progress=False)
    assert torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)["step"] == 2
    monkeypatch.setattr(tr, "make_examples", real)
    capsys.readouterr()
    resumed = train(tmp_path / "b", [str(tiny_scenes)], tiny_codec_dir, None, resume=True, progress=True)
    assert f"resuming {tmp_path / 'b' / 'checkpoint.pt'} at step 2 of 4" in capsys.readouterr().out
    a = DiT.from_pretrained(straight / "backbone").state_dict()
    b = DiT.from_pretrained(resumed / "backbone").state_dict()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_bf16_autocast_training_step(tiny_codec_dir, tiny_scenes, tmp_path):
    """accelerate's bf16 mixed precision rebuilds the model output from a dict: it must survive that."""
    model_dir = train(tmp_path / "bf16", [str(tiny_scenes)], tiny_codec_dir, _tiny_cfg(steps=1, bf16=True),
                      progress=False)
    history = json.loads((tmp_path / "bf16" / "history.json").read_text())
    assert np.isfinite(history[0]["train_loss"]) and (model_dir / "backbone").exists()


def test_init_from_starts_from_a_models_weights_and_refuses_a_misfit(tiny_codec_dir, tiny_scenes, tmp_path, capsys):
    source = train(tmp_path / "source", [str(tiny_scenes)], tiny_codec_dir, _tiny_cfg(steps=2), progress=False)
    # lr 0: the fine-tuning run cannot move, so its EMA model is exactly the source's weights
    tuned = train(tmp_path / "tuned", [str(tiny_scenes)], tiny_codec_dir,
                  _tiny_cfg(steps=1, lr=0.0, init_from=str(source)), progress=True)
    assert f"initialised from {source}" in capsys.readouterr().out
    a = DiT.from_pretrained(source / "backbone").state_dict()
    b = DiT.from_pretrained(tuned / "backbone").state_dict()
    assert all(torch.allclose(a[k].float(), b[k].float()) for k in a)
    with pytest.raises(InputError, match="does not fit.*num_heads 4 here 2"):  # same shapes, other attention
        train(tmp_path / "misfit", [str(tiny_scenes)], tiny_codec_dir,
              _tiny_cfg(steps=1, init_from=str(source), model_overrides={"num_heads": 2}), progress=False)
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(InputError, match="max_audio_seconds"):
            _tiny_cfg(max_audio_seconds=bad)
    with pytest.raises(InputError, match="not a model folder"):
        train(tmp_path / "nowhere", [str(tiny_scenes)], tiny_codec_dir,
              _tiny_cfg(steps=1, init_from=str(tmp_path / "nothing")), progress=False)


def test_neighbour_inputs_are_trained_saved_inherited_and_refused_on_a_model_without(tiny_codec_dir, tiny_scenes,
                                                                                    tmp_path):
    from unimodal.cli import build_parser

    first = train(tmp_path / "nb", [str(tiny_scenes)], tiny_codec_dir,
                  _tiny_cfg(steps=2, content_first=2.0, model_overrides={"neighbour_inputs": True}), progress=False)
    model = DiT.from_pretrained(first / "backbone")
    assert model.config.neighbour_inputs and model.neighbours is not None
    fresh = DiT.from_preset("tiny", vocab_size=model.config.vocab_size, neighbour_inputs=True)
    assert not torch.equal(model.neighbours["left_token"].weight, fresh.neighbours["left_token"].weight)  # trained
    tuned = train(tmp_path / "tuned", [str(tiny_scenes)], tiny_codec_dir, _tiny_cfg(steps=1, init_from=str(first)),
                  progress=False)  # a fine-tune keeps them without being told
    assert DiT.from_pretrained(tuned / "backbone").config.neighbour_inputs
    assert json.loads((tuned / "training_config.json").read_text())["model_overrides"] == {"neighbour_inputs": True}
    plain = train(tmp_path / "plain", [str(tiny_scenes)], tiny_codec_dir, _tiny_cfg(steps=1), progress=False)
    with pytest.raises(InputError, match="neighbour_inputs False here True"):
        train(tmp_path / "misfit", [str(tiny_scenes)], tiny_codec_dir,
              _tiny_cfg(steps=1, init_from=str(plain), model_overrides={"neighbour_inputs": True}), progress=False)
    args = build_parser(["train"]).parse_args(["train", "--out", "x", "--neighbour-inputs", "--content-first", "3"])
    assert args.neighbour_inputs and args.content_first == 3.0


def test_audio_position_rate_is_measured_saved_inherited_and_switched_off(tiny_codec_dir, tiny_scenes, tmp_path,
                                                                            capsys):
    from unimodal.tokenizers_mm.layout import Layout
    from unimodal.training.train import audio_position_rate

    stack = CodecStack.load(tiny_codec_dir)
    tokens = tokenized_split(stack, tiny_codec_dir, tiny_scenes, "train", progress=False)
    ratios = [t["text"].numel() / t["audio"].numel() for t in tokens if "text" in t and "audio" in t]
    paced = train(tmp_path / "paced", [str(tiny_scenes)], tiny_codec_dir,
                  _tiny_cfg(steps=1, audio_position_rate="auto"), progress=True)
    rate = Layout.load(paced).audio_position_rate
    assert rate == pytest.approx(sum(ratios) / len(ratios), abs=1e-4) and 0 < rate < 1
    assert f"audio positions at {rate:g} text tokens per audio code" in capsys.readouterr().out
    assert json.loads((paced / "training_config.json").read_text())["audio_position_rate"] == rate
    # a fine-tune keeps the positions its model was trained with unless told otherwise; 0 goes back to (i, i)
    inherited = train(tmp_path / "inherited", [str(tiny_scenes)], tiny_codec_dir,
                      _tiny_cfg(steps=1, init_from=str(paced)), progress=False)
    assert Layout.load(inherited).audio_position_rate == rate
    plain = train(tmp_path / "plain", [str(tiny_scenes)], tiny_codec_dir,
                  _tiny_cfg(steps=1, init_from=str(paced), audio_position_rate=0), progress=True)
    assert Layout.load(plain).audio_position_rate is None and "audio_position_rate" not in \
        json.loads((plain / "layout.json").read_text())
    assert "layout changes: {'audio_position_rate': (" in capsys.readouterr().out
    assert audio_position_rate(_tiny_cfg(), tokens) == 0.0  # no init_from: sequential
    with pytest.raises(DataError, match="no training sample has both text and audio"):
        audio_position_rate(_tiny_cfg(audio_position_rate="auto"), [{"text": t["text"]} for t in tokens])
    for bad in ("fast", -0.1, 2.0, float("nan")):
        with pytest.raises(InputError, match="audio_position_rate"):
            _tiny_cfg(audio_position_rate=bad)


def test_token_cache_is_reused(tiny_codec_dir, tiny_scenes):
    stack = CodecStack.load(tiny_codec_dir)
    first = tokenized_split(stack, tiny_codec_dir, tiny_scenes, "val", progress=False)
    again = tokenized_split(stack, tiny_codec_dir, tiny_scenes, "val", progress=False)
    assert len(first) == 4 and all(torch.equal(x["image"], y["image"]) for x, y in zip(first, again))
    assert set(first[0]) == {"text", "image", "audio"}


@pytest.mark.slow
@pytest.mark.parametrize("critic_weight", ["0", "0.1"])  # critic head frozen / a second forward before backward
def test_two_processes_agree_on_weights(tiny_codec_dir, tiny_scenes, tmp_path, critic_weight):
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "unimodal.training.train", "--preset", "tiny", "--data", str(tiny_scenes), "--codecs", str(tiny_codec_dir),
           "--out", str(tmp_path / "ddp"), "--steps", "2", "--batch-size", "4", "--val-every", "2", "--no-bf16",
           "--critic-weight", critic_weight]
    result = run_group(cmd, timeout=300, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    checksums = json.loads((tmp_path / "ddp" / "replica_checksums.json").read_text())
    assert len(checksums) == 2 and checksums[0] == checksums[1]


def test_a_hung_worker_fails_its_test_and_is_killed(tmp_path):
    """The multi-process tests' runner: a grandchild that holds the output open and never ends (a hung
    torch.distributed worker) fails the test at the timeout, and no process of the group outlives it."""
    pid_file = tmp_path / "worker.pid"
    worker = "import time; time.sleep(120)"
    launcher = (f"import subprocess, sys, time; w = subprocess.Popen([sys.executable, '-c', {worker!r}]); "
                f"open({str(pid_file)!r}, 'w').write(str(w.pid)); print('launched', flush=True); time.sleep(120)")
    with pytest.raises(pytest.fail.Exception, match="launched"):
        run_group([sys.executable, "-c", launcher], timeout=5)
    status = Path(f"/proc/{int(pid_file.read_text())}/status")

    def killed() -> bool:  # gone, or a zombie until its new parent reaps it
        try:
            return "zombie" in status.read_text()
        except FileNotFoundError:
            return True

    # SIGKILL is delivered asynchronously: a process scheduled at that moment can still read "running" for a few
    # milliseconds (a clean-clone CI run saw it once), so wait for the kernel to end it, up to 5 s
    deadline = time.monotonic() + 5
    while not killed() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert killed()
    assert run_group([sys.executable, "-c", "print('done')"], timeout=60).stdout == "done\n"


def test_training_on_a_users_manifest(tiny_codec_dir, tmp_path, monkeypatch):
    from PIL import Image

    import unimodal.training.data.folder as folder

    reads = []
    real_load_image = folder.load_image
    monkeypatch.setattr(folder, "load_image", lambda *a, **k: reads.append(a[0]) or real_load_image(*a, **k))

    lines = []
    for i in range(20):
        Image.new("RGB", (80, 80), (10 * i, 100, 200)).save(tmp_path / f"img{i}.png")
        lines.append(json.dumps({"text": f"a blue picture number {i}", "image": f"img{i}.png"}))
    manifest = tmp_path / "mine.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    stack = CodecStack.load(tiny_codec_dir)
    train_ids = tokenized_split(stack, tiny_codec_dir, manifest, "train", progress=False)
    val_ids = tokenized_split(stack, tiny_codec_dir, manifest, "val", progress=False)
    assert len(train_ids) == 19 and len(val_ids) == 1 and set(train_ids[0]) == {"text", "image"}
    assert len(reads) == 20 + 19 + 1  # each picture checked once for both splits, then read for its own split
    model_dir = train(tmp_path / "run", [str(manifest)], tiny_codec_dir,
                      _tiny_cfg(steps=2, task_weights={"text->image": 1.0, "image->text": 1.0}), progress=False)
    assert (model_dir / "backbone" / "config.json").exists()
    with pytest.raises(InputError, match="manifest"):
        train(tmp_path / "bad", ["no-such-thing"], tiny_codec_dir, _tiny_cfg(), progress=False)


def test_a_manifest_s_bad_records_refuse_a_run_or_are_skipped_aloud(tiny_codec_dir, tmp_path, capsys):
    """Bad records refuse a run by default, naming them; with skip_bad (--skip-bad) the run goes on without them and
    says which on stderr, from the token cache too; a skipping run's cache never lets a later strict run through."""
    from PIL import Image

    from unimodal.core.errors import BadRecordsError
    from unimodal.training.pack import build_pack, load_pack
    from unimodal.training.train import RunOptions

    lines = []
    for i in range(21):
        Image.new("RGB", (64, 64), (10 * i, 100, 200)).save(tmp_path / f"img{i}.png")
        lines.append(json.dumps({"text": f"a blue picture number {i}", "image": f"img{i}.png"}))
    lines[4] = json.dumps({"text": "a lost picture", "image": "gone.png"})
    lines[0] = json.dumps({"text": " ".join(["a very long caption"] * 20), "image": "img0.png"})  # > 32 tokens
    manifest = tmp_path / "mine.jsonl"
    manifest.write_text("\n".join(lines) + "\nnot json\n")
    cfg = _tiny_cfg(steps=1, task_weights={"text->image": 1.0})
    with pytest.raises(BadRecordsError, match="2 bad records in all, lines 5, 22"):
        train(tmp_path / "strict", [str(manifest)], tiny_codec_dir, cfg, progress=False)
    assert not (tmp_path / "strict" / "checkpoint.pt").exists()
    capsys.readouterr()
    for encoded in (True, False):  # encoded, then from the cache: said both times
        train(tmp_path / "skipping", [str(manifest)], tiny_codec_dir, cfg, progress=False,
              options=RunOptions(skip_bad=True))
        err = capsys.readouterr().err
        assert "mine.jsonl: 2 bad record(s) skipped (--skip-bad), 19 training samples kept: line 5: cannot read image" \
            in err and "line 22: not valid JSON" in err
        # what the model will not see of the data, said when it is encoded
        assert ("(train, 19 samples): 1 text(s) cut to their first 32 tokens (the longest" in err) == encoded
    with pytest.raises(BadRecordsError):  # the skipping run's cached tokens are not the strict run's
        train(tmp_path / "strict", [str(manifest)], tiny_codec_dir, cfg, progress=False)
    Image.new("RGB", (64, 64), (0, 0, 0)).save(tmp_path / "gone.png")  # the missing picture put in place: read
    train(tmp_path / "fixed", [str(manifest)], tiny_codec_dir, cfg, progress=False, options=RunOptions(skip_bad=True))
    assert "1 bad record(s) skipped (--skip-bad), 20 training samples kept: line 22: not valid JSON" in \
        capsys.readouterr().err  # the validation record (line 20) the same as before: split by line number
    with pytest.raises(BadRecordsError):
        build_pack([str(manifest)], tiny_codec_dir, tmp_path / "strict.pack.safetensors", progress=False)
    pack = build_pack([str(manifest)], tiny_codec_dir, tmp_path / "mine.pack.safetensors", progress=False,
                      skip_bad=True)
    assert load_pack(pack).meta["counts"] == {"train": 20, "val": 1}
    assert load_pack(pack).meta["train_parts"][0]["skipped"] == ["line 22: not valid JSON (Expecting value)"]
    capsys.readouterr()
    train(tmp_path / "from-pack", [str(pack)], None, cfg, progress=False)  # a run on the pack says it again
    assert "1 bad record(s) skipped when packed (--skip-bad), 20 training samples kept: line 22: not valid JSON" \
        in capsys.readouterr().err


def test_length_grouped_micro_batches_cut_padding(tiny_codec_dir):
    from unimodal.training.train import length_grouped

    layout = CodecStack.load(tiny_codec_dir).layout
    tokens = {"text": torch.tensor([1, 2, 3]), "image": torch.arange(64) % 32, "audio": torch.arange(10) % 32}
    tasks = ["->text+image+audio", "text->image", "->text+image+audio", "text->image"]
    examples = [build_example(layout, tokens, Task.parse(t)) for t in tasks]
    groups = length_grouped(examples, 2)
    assert [len(g) for g in groups] == [2, 2]
    assert {e.task for e in groups[0]} == {"text->image"} and {e.task for e in groups[1]} == {"->text+image+audio"}
    assert sorted(e.task for g in groups for e in g) == sorted(tasks)


def test_bench_train_times_the_first_recipes_step_and_the_unpadded_one_side_by_side(capsys):
    from unimodal.cli import main

    assert main(["bench", "train", "--preset", "tiny", "--batch-size", "4", "--steps", "1", "--no-bf16",
                 "--compare-unpad", "--masking", "complementary"]) == 0
    out = capsys.readouterr().out
    assert "unpad=False masking=complementary" in out and "unpad=True masking=complementary" in out
    assert "per-token layers on the real tokens only (unpadded) (bf16=False, compiled=False, sparse=True, " \
           "per_token=product):" in out
    assert main(["bench", "train", "--preset", "tiny", "--batch-size", "4", "--steps", "1", "--no-bf16",
                 "--compare-first"]) == 0
    out = capsys.readouterr().out
    assert "sparse=False per_token=where unpad=False" in out and "sparse=True per_token=product unpad=True" in out
    assert "this step over the first recipe's (dense logits, torch.where rows, padded; bf16=False, compiled=False):" in out
    assert main(["bench", "train", "--preset", "tiny", "--batch-size", "4", "--steps", "1", "--no-bf16",
                 "--masking", "complementary", "--compare-masking", "partition"]) == 0
    out = capsys.readouterr().out
    assert "unpad=True masking=complementary" in out and "unpad=True masking=partition" in out
    assert "step time with masking=partition over masking=complementary (sparse=True, per_token=product, " \
           "unpad=True, bf16=False, compiled=False; as a slowdown):" in out
    assert main(["bench", "train", "--preset", "tiny", "--steps", "1", "--masking", "partition",
                 "--compare-masking", "partition"]) == 2
    assert "--compare-masking partition is the step's own --masking" in capsys.readouterr().err
    assert main(["bench", "train", "--preset", "tiny", "--steps", "1", "--threads", "0"]) == 2
    assert "--threads must be a positive number" in capsys.readouterr().err


def test_bench_train_offers_every_masking_the_trainer_has():
    """The command's choices are written out (its parser must not import torch); they follow the objective's."""
    from unimodal.cli import build_parser
    from unimodal.training.objective import MASKINGS

    def sub(parser, name):
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]

    train = sub(sub(build_parser(["bench", "train"]), "bench"), "train")
    for flag in ("--masking", "--compare-masking"):
        action = next(a for a in train._actions if flag in a.option_strings)
        assert tuple(action.choices) == MASKINGS, flag


def test_bench_train_times_a_real_batch_drawn_as_the_trainer_draws_one(tiny_codec_dir, tiny_scenes, capsys):
    from unimodal.cli import main
    from unimodal.training.bench import data_batches

    layout, batches = data_batches(str(tiny_scenes), 6, 1, tiny_codec_dir)
    again = data_batches(str(tiny_scenes), 6, 1, tiny_codec_dir)[1]
    assert len(batches) == 1 and batches[0].batch.ids.shape[0] == 6
    assert torch.equal(batches[0].batch.ids, again[0].batch.ids)  # drawn as the trainer draws step 0, every time
    assert main(["bench", "train", "--preset", "tiny", "--batch-size", "6", "--steps", "1", "--no-bf16",
                 "--data", str(tiny_scenes), "--codecs", str(tiny_codec_dir)]) == 0
    assert f"batch=6 of {tiny_scenes} in 1 micro-batch(es)" in capsys.readouterr().out


def test_resume_keeps_the_runs_config_unless_steps_or_snapshots_are_given(tmp_path):
    from unimodal.training.checkpoint import cli_config, resumed_config, save_atomic

    assert cli_config(TrainConfig, tmp_path, resume=True, steps=None, lr=1e-3).lr == 1e-3  # nothing to resume yet
    save_atomic({"config": {**TrainConfig(lr=5e-4, steps=10).__dict__, "retired_field": 1}, "step": 3},
                tmp_path / "checkpoint.pt")
    assert cli_config(TrainConfig, tmp_path, resume=True, steps=None, lr=1e-3) is None
    cfg, state = resumed_config(TrainConfig, None, tmp_path / "checkpoint.pt", resume=True)
    assert (cfg.lr, cfg.steps, state["step"]) == (5e-4, 10, 3)  # unknown keys of old checkpoints are dropped
    longer = cli_config(TrainConfig, tmp_path, resume=True, steps=20, lr=1e-3)
    cfg, _ = resumed_config(TrainConfig, longer, tmp_path / "checkpoint.pt", resume=True)
    assert (cfg.lr, cfg.steps) == (5e-4, 20)
    with_snapshots = cli_config(TrainConfig, tmp_path, resume=True, steps=20, lr=1e-3, snapshots=[12, 16])
    cfg, _ = resumed_config(TrainConfig, with_snapshots, tmp_path / "checkpoint.pt", resume=True)
    assert (cfg.lr, cfg.steps, cfg.snapshots) == (5e-4, 20, [12, 16])  # snapshots never change what is trained
    cfg, state = resumed_config(TrainConfig, longer, tmp_path / "checkpoint.pt", resume=False)
    assert (cfg.lr, state) == (1e-3, None)


def test_bench_train_reports_throughput_and_mfu():
    from unimodal.training.bench import bench_train, format_result

    result = bench_train("tiny", batch_size=4, steps=1, bf16=False, grad_accum=2)
    assert result.tokens_per_s > 0 and 0 < result.mfu < 1 and 0 < result.real_token_fraction <= 1
    assert result.peak_bf16_tflops > 0 and not result.compiled and "MFU" in format_result(result)
    assert result.per_token == "product" and "per_token=product" in format_result(result)


def test_bench_train_times_both_forms_of_the_adaln_rows_side_by_side(capsys):
    from unimodal.backbone import dit
    from unimodal.cli import main

    chosen = dit.per_token
    assert main(["bench", "train", "--preset", "tiny", "--batch-size", "4", "--steps", "1", "--no-bf16",
                 "--compare-where"]) == 0
    out = capsys.readouterr().out
    assert "per_token=where" in out and "per_token=product" in out
    assert "adaLN rows by product instead of torch.where (bf16=False, compiled=False, sparse=True, unpad=False):" in out
    assert dit.per_token is chosen  # the benchmark puts the model's own form back


def test_compiled_forward_builds_and_matches_the_eager_forward():
    """The GPU recipe's forward under torch.compile (CompiledForward): it must construct (the first GPU run died
    there on an UnboundLocalError, and fell back to an eager run) and compute what the eager forward computes.
    Traced by dynamo with the "eager" backend: the graph capture the GPU run relies on, without a minute of
    C++ code generation on the CPU."""
    from conftest import mixed_batch, random_tiny_dit, toy_layout
    from unimodal.training.train import CompiledForward

    layout = toy_layout()
    model = random_tiny_dit(layout.vocab_size)  # off adaLN-Zero's identity blocks, so the blocks are compared too
    batch = mixed_batch(layout)
    b = batch.batch
    args = (b.ids, torch.full((b.ids.shape[0],), 0.5), b.segment_ids, b.positions, batch.is_target, b.attention_mask)
    compiled = CompiledForward(model, backend="eager")
    with torch.no_grad():
        eager, out = model(*args), compiled(*args)
    assert torch.allclose(out.logits, eager.logits, atol=1e-4, rtol=1e-4)
