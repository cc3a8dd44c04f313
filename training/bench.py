"""``unimodal bench train``: training throughput and model FLOP utilisation (MFU) on this machine.

The peak is measured in the same run, the same way, with the same threads: a large square matmul in
float32 and in bfloat16. MFU is the model's useful FLOPs (forward + backward = 3x the forward FLOPs of
:func:`unimodal.backbone.dit.flops_per_token`) per second, divided by the bf16 peak when training runs under bf16
autocast (else the fp32 peak).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from unimodal.backbone import dit
from unimodal.backbone.dit import DiT, flops_per_token
from unimodal.tokenizers_mm.layout import Layout
from unimodal.training.schedule import MaskSchedule
from unimodal.training.tasks import Task, build_example, collate_examples
from unimodal.training.objective import LossSpec, TargetVocab, rows_per_sample
from unimodal.training.train import CompiledForward, length_grouped, step_loss


@dataclass
class TrainBenchResult:
    preset: str
    params_m: float
    threads: int
    batch_size: int
    grad_accum: int
    seq_len: int
    real_token_fraction: float  # non-padding share of the computed positions
    bf16: bool
    step_seconds: float
    tokens_per_s: float
    model_tflops: float
    peak_fp32_tflops: float
    peak_bf16_tflops: float
    mfu: float
    compiled: bool = False
    sparse: bool = True  # logits only at masked slots, over their modality's ids
    per_token: str = "product"  # how each token gets its adaLN row (unimodal.backbone.dit.PER_TOKEN)
    unpad: bool = True  # per-token layers on the real tokens alone (unimodal.backbone.dit.Packing)
    masking: str = "independent"  # objective.MASKINGS: one mask per sample, complementary (twice), partition
    data: str = "synthetic"  # the batch timed: synthetic, or the training sets it was drawn from


@dataclass(frozen=True)
class StepForm:
    """How a benchmarked step computes what it computes (each form gives the same loss, up to rounding):
    ``sparse``: logits only at masked slots, over their modality's ids; ``per_token``: how a token gets its
    adaLN row (a name of :data:`unimodal.backbone.dit.PER_TOKEN`); ``unpad``: the per-token layers skip the
    padding slots; ``masking``: the step's masking (a name of :data:`unimodal.training.objective.MASKINGS`;
    None: the benchmark's)."""

    sparse: bool = True
    per_token: str = "product"
    unpad: bool = True
    masking: str | None = None


FIRST_RECIPE = StepForm(sparse=False, per_token="where", unpad=False)  # the step before issue 13's changes


def matmul_peak(dtype: torch.dtype, size: int = 2048, repeats: int = 5, budget_s: float = 0.5) -> float:
    """Best-of FLOP/s of a (size x size) @ (size x size) matmul.

    The side grows from 256 by doubling up to ``size`` while the next product would take at most ``budget_s``:
    bf16 emulated on a CPU without bf16 units runs at ~1 GFLOP/s (a 2048 product: ~20 s), and a slow kernel is
    as slow on smaller matrices; the benchmark does not spend minutes proving it."""
    side = min(256, size)
    while True:
        a, b = torch.randn(side, side, dtype=dtype), torch.randn(side, side, dtype=dtype)
        start = time.perf_counter()
        a @ b  # warm-up: thread pool and kernels
        if side * 2 > size or 8 * (time.perf_counter() - start) > budget_s:
            break
        side *= 2
    size = side
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def synthetic_examples(batch_size: int, seed: int = 0):
    """A realistic mixed batch (scenes-sized text, image and audio) of random ids in the default layout."""
    layout = Layout(text_vocab_size=4096, image_codebook_size=512, audio_codebook_size=512,
                    audio_frame_rate=31.25, max_text_len=32, max_audio_len=160)
    rng = np.random.default_rng(seed)
    tasks = [Task.parse(n) for n in ("text->image", "image->text", "text->audio", "audio->text", "->text+image+audio")]
    examples = []
    for i in range(batch_size):
        tokens = {"text": torch.from_numpy(rng.integers(0, 4096, 14)), "image": torch.from_numpy(rng.integers(0, 512, 64)),
                  "audio": torch.from_numpy(rng.integers(0, 512, 70))}
        examples.append(build_example(layout, tokens, tasks[i % len(tasks)]))
    return layout, examples


def data_batches(data: str, batch_size: int, grad_accum: int = 1, codec_dir=None, step: int = 0):
    """The micro-batches of a real training step: the layout and what the trainer's :class:`StepBatches` builds
    for step ``step`` (default task mixture, seed 0). ``data``: data sets (``scenes,digits``, folders) encoded
    with ``codec_dir`` (default: the shipped codecs; the token cache makes a second call quick), or one pack."""
    from unimodal.core.paths import default_codecs_dir
    from unimodal.training.data.sources import resolve_weighted
    from unimodal.training.pack import is_pack, load_pack
    from unimodal.training.tokens import CodecStack
    from unimodal.training.train import StepBatches, TrainConfig, weighted_train_tokens

    if is_pack(data):
        pack = load_pack(data)
        layout, tokens = pack.layout, pack.weighted_train()
    else:
        codec_dir = Path(codec_dir or default_codecs_dir())
        stack = CodecStack.load(codec_dir)
        layout = stack.layout
        tokens, _ = weighted_train_tokens(stack, codec_dir, resolve_weighted([d for d in data.split(",") if d]))
    cfg = TrainConfig(batch_size=batch_size, grad_accum=grad_accum)
    _, _, batches = StepBatches(layout, tokens, cfg, step, step + 1, rank=0, world=1).batches(step)
    return layout, batches


def bench_train(preset: str = "small", batch_size: int = 16, steps: int = 5, bf16: bool = True,
                grad_accum: int = 1, compile: bool = False, sparse: bool = True) -> TrainBenchResult:
    """One optimizer step = ``grad_accum`` length-grouped micro-batches of the ``batch_size`` examples, as the
    trainer does it. ``compile``: the forward under ``torch.compile`` (its compile time is in the warm-up).
    ``sparse``: the loss's logits only where it reads them (False: the whole vocabulary at every position)."""
    return bench_train_side_by_side(preset, batch_size, steps, bf16, grad_accum, compile, (StepForm(sparse),))[0]


def bench_train_side_by_side(preset: str = "small", batch_size: int = 16, steps: int = 5, bf16: bool = True,
                             grad_accum: int = 1, compile: bool = False,
                             forms: tuple[StepForm, ...] = (StepForm(sparse=False), StepForm()),
                             masking: str = "independent", data: str | None = None, codec_dir=None
                             ) -> list[TrainBenchResult]:
    """:func:`bench_train` for several forms of the step (:class:`StepForm`) on the same model and batches,
    their timed steps interleaved (first form, second form, first, ...) so that a machine whose load changes
    during the run slows each alike. ``masking``: ``complementary`` trains each sample twice a step, as the
    trainer does by default (and the unpadded form computes their conditions once). ``data``: time a real batch
    of those data sets (:func:`data_batches`) instead of the synthetic one."""
    if data is None:
        layout, examples = synthetic_examples(batch_size)
        batches = [collate_examples(chunk) for chunk in length_grouped(examples, grad_accum)]
    else:
        layout, batches = data_batches(data, batch_size, grad_accum, codec_dir)
    torch.manual_seed(0)
    model = DiT.from_preset(preset, layout.vocab_size).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    runner = CompiledForward(model) if compile else model
    masking_of = {form: form.masking or masking for form in forms}
    specs = {form: LossSpec(TargetVocab.of(layout) if form.sparse else None, masking=masking_of[form],
                            unpad=form.unpad) for form in forms}

    def one_step(form: StepForm) -> float:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with _rows_by(form.per_token):
            for batch in batches:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss, _ = step_loss(runner, batch, MaskSchedule(), generator, specs[form])
                (loss / len(batches)).backward()
        optimizer.step()
        return time.perf_counter() - start

    for form in forms:
        one_step(form)  # warm-up (and compilation)
        if compile:
            one_step(form)  # dynamic shapes may compile a second graph
    times = [[one_step(form) for form in forms] for _ in range(steps)]  # (steps, forms)
    peak32, peak16 = matmul_peak(torch.float32), matmul_peak(torch.bfloat16)
    tokens = sum(int(b.batch.attention_mask.sum()) for b in batches)
    padded = sum(b.batch.ids.numel() for b in batches)
    seq_len = max(b.batch.ids.shape[1] for b in batches)
    # complementary masks and partitions: every sample trained two or more times (the unpadded form computes their
    # shared conditions once, so its MFU counts work the objective asks for, a little above what the hardware did)
    once = sum(3 * flops_per_token(model, b.batch.ids.shape[1]) * int(b.batch.attention_mask.sum()) for b in batches)
    results = []
    for index, form in enumerate(forms):
        flops = rows_per_sample(masking_of[form]) * once
        step_s = float(np.median([row[index] for row in times]))
        results.append(TrainBenchResult(preset, sum(p.numel() for p in model.parameters()) / 1e6,
                                        torch.get_num_threads(), batch_size, grad_accum, seq_len, tokens / padded,
                                        bf16, step_s, tokens / step_s, flops / step_s / 1e12, peak32 / 1e12,
                                        peak16 / 1e12, flops / step_s / (peak16 if bf16 else peak32), compile,
                                        form.sparse, form.per_token, form.unpad and not compile,  # compiled: padded
                                        masking_of[form], data or "synthetic"))
    return results


def speedups(results: list[TrainBenchResult]) -> list[tuple[str, float]]:
    """For each pair of results that differ in one part of the step only, the speed-up of the newer form, named;
    and the whole step over the first recipe's (:data:`FIRST_RECIPE`) when both were timed."""
    named = {"sparse": "sparse logits speed-up", "per_token": "adaLN rows by product instead of torch.where",
             "unpad": "per-token layers on the real tokens only (unpadded)"}
    newer = {"sparse": True, "per_token": "product", "unpad": True}
    lines = []
    for part, label in named.items():
        others = [k for k in named if k != part]
        for new in (r for r in results if getattr(r, part) == newer[part]):
            for old in (r for r in results if getattr(r, part) != newer[part]):
                if all(getattr(old, k) == getattr(new, k) for k in others) and old.masking == new.masking:
                    context = ", ".join(f"{k}={getattr(new, k)}" for k in others)
                    lines.append((f"{label} (bf16={new.bf16}, compiled={new.compiled}, {context})",
                                  old.step_seconds / new.step_seconds))
    forms = {(r.sparse, r.per_token, r.unpad) for r in results}
    for form in sorted(forms, key=str):  # the same step under two maskings: what the other rows cost
        timed = [r for r in results if (r.sparse, r.per_token, r.unpad) == form]
        for other in timed[1:]:
            lines.append((f"step time with masking={other.masking} over masking={timed[0].masking} (sparse={form[0]}, "
                          f"per_token={form[1]}, unpad={form[2]}, bf16={other.bf16}, compiled={other.compiled}; "
                          f"as a slowdown)", other.step_seconds / timed[0].step_seconds))
    first = [r for r in results if StepForm(r.sparse, r.per_token, r.unpad) == FIRST_RECIPE]
    now = [r for r in results if StepForm(r.sparse, r.per_token, r.unpad) == StepForm()]
    if first and now:
        lines.append((f"this step over the first recipe's (dense logits, torch.where rows, padded; bf16={now[0].bf16}, "
                      f"compiled={now[0].compiled})", first[0].step_seconds / now[0].step_seconds))
    return lines


@contextmanager
def _rows_by(form: str):
    """The backbone's blocks choose their adaLN rows with ``PER_TOKEN[form]`` inside this block (the blocks
    look ``per_token`` up when they run)."""
    if form not in dit.PER_TOKEN:
        raise ValueError(f"per_token form {form!r}; known: {sorted(dit.PER_TOKEN)}")
    saved, dit.per_token = dit.per_token, dit.PER_TOKEN[form]
    try:
        yield
    finally:
        dit.per_token = saved


def format_result(r: TrainBenchResult) -> str:
    return (f"preset={r.preset} ({r.params_m:.1f}M params) threads={r.threads} batch={r.batch_size} of {r.data} "
            f"in {r.grad_accum} micro-batch(es), longest {r.seq_len}, {r.real_token_fraction:.0%} real tokens, "
            f"bf16={r.bf16} compiled={r.compiled} sparse={r.sparse} per_token={r.per_token} unpad={r.unpad} masking={r.masking}\n"
            f"  step {r.step_seconds:.3f} s | {r.tokens_per_s:,.0f} tokens/s | model "
            f"{r.model_tflops * 1000:.1f} GFLOP/s | peak fp32 {r.peak_fp32_tflops * 1000:.1f} / bf16 "
            f"{r.peak_bf16_tflops * 1000:.1f} GFLOP/s | MFU {r.mfu:.1%}")


def result_dict(r: TrainBenchResult) -> dict:
    return asdict(r)


def device_peak(device: str, dtype: torch.dtype, size: int | None = None, repeats: int = 10) -> float:
    """Best-of FLOP/s of a square matmul on ``device`` (on CUDA, 8192-wide and synchronised)."""
    if device != "cuda":
        return matmul_peak(dtype, size or 2048, repeats=min(repeats, 5))
    size = size or 8192
    a = torch.randn(size, size, dtype=dtype, device="cuda")
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ a
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def summarize_run(run_dir, skip: int = 30) -> dict:
    """Throughput of a finished run from its history (steps after the first ``skip``: compilation and warm-up
    excluded) and its MFU against this machine's measured matmul peak in the run's precision."""
    import json
    from pathlib import Path

    run_dir = Path(run_dir)
    history = json.loads((run_dir / "history.json").read_text())
    config = json.loads((run_dir / "model" / "backbone" / "config.json").read_text())
    training = json.loads((run_dir / "model" / "training_config.json").read_text())
    timed = [h for h in history if "tokens_per_s" in h][skip:] or [h for h in history if "tokens_per_s" in h]
    tokens_per_s = float(np.median([h["tokens_per_s"] for h in timed]))
    per_example = float(np.median([h["tokens_per_example"] for h in timed]))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    from unimodal.training.hardware import use_bf16

    bf16 = use_bf16(training.get("bf16"), device)[0]
    peak = device_peak(device, torch.bfloat16 if bf16 else torch.float32)
    model_flops = 3 * flops_per_token(config, round(per_example)) * tokens_per_s
    return {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "steps": history[-1]["step"],
            "timed_steps": len(timed), "tokens_per_s": tokens_per_s, "tokens_per_example": per_example,
            "examples_per_s": tokens_per_s / per_example, "model_tflops": model_flops / 1e12,
            "peak_tflops": peak / 1e12, "peak_dtype": "bf16" if bf16 else "fp32", "mfu": model_flops / peak,
            "final_val": history[-1].get("val") or next((h["val"] for h in reversed(history) if h.get("val")), None)}


def main(argv=None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m unimodal.training.bench", description="training benchmarks")
    sub = parser.add_subparsers(dest="cmd", required=True)
    summary = sub.add_parser("summarize", help="tokens/s and MFU of a finished run (its history.json)")
    summary.add_argument("run", help="the run folder (--out of the training command)")
    summary.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    result = summarize_run(args.run)
    print(f"run {args.run}: {result['steps']} steps on {result['device']}, {result['tokens_per_s']:,.0f} tokens/s "
          f"({result['examples_per_s']:,.0f} examples/s), model {result['model_tflops']:.2f} TFLOP/s, peak "
          f"{result['peak_tflops']:.2f} ({result['peak_dtype']}), MFU {result['mfu']:.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
