"""``unimodal bench``: training throughput, sampler settings, start-up time, and the benchmarks of
``cli_eval`` (versus-ar, data-efficiency), ``recipe`` and ``cli_refine`` (refine, edit) gathered under one group.
"""

from __future__ import annotations

import json
import sys

from unimodal.cli_common import add_model_arguments, number_list, parse_cfg, set_threads


def _cmd_bench_train(args) -> int:
    import itertools
    from dataclasses import replace

    from unimodal.core.errors import InputError
    from unimodal.training.bench import (FIRST_RECIPE, StepForm, bench_train_side_by_side, format_result,
                                         result_dict, speedups)

    set_threads(args.threads)
    if args.compare_first:
        forms = (FIRST_RECIPE, StepForm())
    else:
        # the adaLN row choice exists only in the padded form (unpadded, each token's row is gathered), so
        # --compare-where times padded steps
        unpad = (False, True) if args.compare_unpad else (False,) if args.compare_where else (True,)
        axes = ((False, True) if args.compare_dense else (True,), ("where", "product") if args.compare_where
                else ("product",), unpad)
        forms = tuple(StepForm(*choice) for choice in itertools.product(*axes)
                      if not (choice[1] == "where" and choice[2]))
    if args.compare_masking is not None:
        if args.compare_masking == args.masking:
            raise InputError(f"--compare-masking {args.compare_masking} is the step's own --masking: name another")
        forms = forms + tuple(replace(form, masking=args.compare_masking) for form in forms)
    results = []
    for bf16 in ([True, False] if args.compare_fp32 else [not args.no_bf16]):
        for compiled in ([False, True] if args.compile else [False]):
            timed = bench_train_side_by_side(args.preset, args.batch_size, args.steps, bf16=bf16,
                                             grad_accum=args.grad_accum, compile=compiled, forms=forms,
                                             masking=args.masking, data=args.data, codec_dir=args.codecs)
            for result in timed:
                print(format_result(result), flush=True)
            for label, ratio in speedups(timed):
                print(f"  {label}: {ratio:.2f}x", flush=True)
            results += timed
        if args.compile and len(forms) == 1:
            print(f"  torch.compile speed-up (bf16={bf16}): "
                  f"{results[-2].step_seconds / results[-1].step_seconds:.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([result_dict(r) for r in results], f, indent=2)
    return 0


def _cmd_bench_sample(args) -> int:
    from unimodal.inference.bench_report import format_table, save_report
    from unimodal.inference.bench_sample import bench_sample
    from unimodal.inference.bench_setup import parse_direction
    from unimodal.eval_cases import load_cases
    from unimodal.inputs import as_image
    from unimodal.serve import load_pipeline, resolve_model_dir

    directions = [d.strip() for d in args.directions.split(",") if d.strip()]
    needed = {parse_direction(d)[0] for d in directions}
    if args.compile:
        parse_direction(args.compile)
    sampling = _shared_sampling(args)
    model_dir = resolve_model_dir(args.model)
    pipe = load_pipeline(model_dir, args.device)
    # Conditions and their truth from the embedded data's test split: no data build is needed.
    cases, _ = load_cases(args.data, "test", args.n, speech="audio" in needed)
    size = pipe.image_codec.image_size
    conditions = {"text": [c.text for c in cases], "image": [as_image(c.image, size) for c in cases],
                  "audio": [c.audio for c in cases]}
    report = bench_sample(pipe, {m: conditions[m] for m in needed}, directions, args.taus, args.steps,
                          seed=args.seed, model_path=str(model_dir), sampling=sampling,
                          progress=lambda d: print(f"done: {d}", file=sys.stderr, flush=True), cases=cases,
                          compile_direction=args.compile, cache_check=not args.no_cache_check)
    print(format_table(report))
    for path in save_report(report, args.out):
        print(path)
    return 0


def _shared_sampling(args) -> dict:
    """The sampler settings every row of ``bench sample`` shares, validated like any SamplerConfig."""
    from unimodal.inference.sampler import SamplerConfig

    sampling = {"temperature": args.temperature}
    if args.cfg is not None:
        sampling["cfg"] = args.cfg
    if args.choice_temperature is not None:
        sampling["choice_temperature"] = args.choice_temperature
    SamplerConfig(**sampling)  # a bad value fails here, before the model is loaded
    return sampling




def _add_bench_sample_command(bench) -> None:
    from unimodal.inference.bench_setup import DEFAULT_DIRECTIONS, DEFAULT_STEPS, DEFAULT_TAUS

    sample = bench.add_parser("sample", help="sampler speed, memory and agreement per direction: tau sweep, step "
                                             "counts, with and without the condition cache")
    add_model_arguments(sample)
    sample.add_argument("--n", type=int, default=16, help="prompts (conditions) per data set and direction")
    sample.add_argument("--data", default="scenes", help="scenes, digits or built data folders (test split); their "
                                                         "truth gives each setting a judged quality")
    sample.add_argument("--compile", default=None, metavar="DIRECTION",
                        help="also time DIRECTION (e.g. text->image) with the denoising step under torch.compile")
    sample.add_argument("--out", default="bench-sample", help="folder for bench_sample.json and bench_sample.png")
    sample.add_argument("--directions", default=",".join(DEFAULT_DIRECTIONS),
                        help="comma-separated CONDITION->TARGET (default: all six one-to-one directions)")
    sample.add_argument("--taus", type=number_list(float), default=list(DEFAULT_TAUS),
                        help="threshold-mode confidence thresholds")
    sample.add_argument("--steps", type=number_list(int), default=list(DEFAULT_STEPS),
                        help="confidence-mode step counts")
    sample.add_argument("--seed", type=int, default=0, help="seed of the prompts and of the sampler")
    sample.add_argument("--temperature", type=float, default=0.0,
                        help="0 (greedy, default) makes agreement measure decoding drift, not sampling noise")
    sample.add_argument("--cfg", type=parse_cfg, default=None, help="guidance scale for every row (e.g. 3)")
    sample.add_argument("--choice-temperature", type=float, default=None,
                        help="randomised commit order for every row (MaskGIT's choice temperature, e.g. 4.5)")
    sample.add_argument("--no-cache-check", action="store_true",
                        help="run every setting with the condition cache only (half the time; for quality sweeps "
                             "over many prompts): the cache speed-up and identity are then not measured")
    sample.set_defaults(func=_cmd_bench_sample)


def _cmd_bench_startup(args) -> int:
    from unimodal.bench_startup import bench_startup, format_table

    report = bench_startup(repeats=args.repeats)
    print(format_table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


def _add_bench_startup_command(bench) -> None:
    startup = bench.add_parser("startup", help="seconds until --help, --version and refused requests answer "
                                               "(fresh processes, median of --repeats)")
    startup.add_argument("--repeats", type=int, default=5)
    startup.add_argument("--json", default=None, help="also write the figures to this JSON file")
    startup.set_defaults(func=_cmd_bench_startup)


def add_bench_commands(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench_cmd", required=True)
    _add_bench_startup_command(bench)
    train = bench.add_parser("train", help="training tokens/s and model FLOP utilisation vs this machine's peak")
    train.add_argument("--preset", default="small")
    train.add_argument("--batch-size", type=int, default=16)
    train.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
    train.add_argument("--grad-accum", type=int, default=1, help="length-grouped micro-batches per step")
    train.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    train.add_argument("--no-bf16", action="store_true")
    train.add_argument("--compare-fp32", action="store_true", help="run bf16 and fp32 side by side")
    train.add_argument("--compile", action="store_true", help="also run the step with the forward under "
                                                              "torch.compile, side by side with eager")
    comparisons = {  # flag -> what it times side by side with the step as it is now
        "--compare-dense": "also run the first recipe's step (logits over the whole vocabulary at every position), "
                           "side by side with the sparse one",
        "--compare-where": "also run the step with each token's adaLN row chosen by torch.where (the form before "
                           "the one-hot product), side by side",
        "--compare-unpad": "also run the step with the per-token layers over every padding slot (the form before "
                           "the forward skipped them), side by side",
        "--compare-first": "run the first recipe's step (dense logits, torch.where rows, padded) and this one side "
                           "by side: the whole speed-up per example in one run",
    }
    for flag, text in comparisons.items():
        train.add_argument(flag, action="store_true", help=text)
    train.add_argument("--data", default=None,
                       help="time a batch of these training sets (scenes,digits, folders or one pack), drawn as the "
                            "trainer draws one, instead of the synthetic batch (default)")
    train.add_argument("--codecs", default=None, help="with --data: the codecs that encode it (default: the shipped "
                                                      "ones)")
    # training.objective.MASKINGS, written out so the parser does not import torch (a test holds them equal)
    maskings = ("independent", "complementary", "partition")
    train.add_argument("--masking", choices=maskings, default="independent",
                       help="one mask per sample (default, as the figures in docs/results.md), complementary: "
                            "each sample twice a step, with a mask and its complement, as the trainer does, or "
                            "partition: the complement split into three more rows")
    train.add_argument("--compare-masking", choices=maskings, default=None,
                       help="also run the step under this masking, side by side with --masking's: what the extra "
                            "rows cost per step (complementary trains each sample twice, partition four times)")
    train.add_argument("--json", default=None)
    train.set_defaults(func=_cmd_bench_train)
    _add_bench_sample_command(bench)
    from unimodal.cli_eval import add_compare_command, add_data_efficiency_command, add_versus_ar_command

    add_versus_ar_command(bench)
    add_data_efficiency_command(bench)
    add_compare_command(bench)
    from unimodal.recipe import add_recipe_command

    add_recipe_command(bench)
    from unimodal.recipe_curve import add_recipe_curve_command

    add_recipe_curve_command(bench)
    from unimodal.cli_refine import add_bench_edit_command, add_bench_refine_command, add_bench_refine_plot_command

    add_bench_refine_command(bench)
    add_bench_refine_plot_command(bench)
    add_bench_edit_command(bench)


__all__ = ["add_bench_commands"]
