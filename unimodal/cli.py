"""The ``unimodal`` command line. Each command group is one ``add_*`` function that registers its parser.

Errors a user can cause are printed as one line (``error: ...``) with exit status 2, never a traceback;
``unimodal --debug ...`` (or ``UNIMODAL_DEBUG=1``) shows the traceback too. An unexpected error (a bug) is one
line with exit status 1. The parser imports no torch: commands whose options live beside torch code (train,
bench, eval) are built only when named, so ``--help``, ``--version`` and a refused request answer at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

from unimodal.cli_common import EVAL_HELP, add_model_arguments, parse_cfg
from unimodal.core.errors import InputError, UnimodalError
from unimodal.demo import add_demo_command


def _cmd_data_build(args) -> int:
    from unimodal.training.data.build import build

    out = build(args.name, n=args.n, seed=args.seed, out=args.out, speech=not args.no_speech)
    print(out)
    return 0


def _cmd_data_pack(args) -> int:
    from unimodal.training.pack import build_pack, load_pack
    from unimodal.core.paths import default_codecs_dir

    path = build_pack([d for d in args.data.split(",") if d], args.codecs or default_codecs_dir(), args.out,
                      args.max_audio_seconds)
    counts = load_pack(path).meta["counts"]
    print(f"{path} ({path.stat().st_size / 2**20:.1f} MiB): " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


def _cmd_data_info(args) -> int:
    from unimodal.training.data.store import read_info

    print(json.dumps(read_info(args.dir), indent=2, sort_keys=True))
    return 0


def _cmd_data_check(args) -> int:
    from unimodal.training.data.folder import FolderDataset

    dataset = FolderDataset(args.manifest, skip_bad=args.skip_bad)
    for err in dataset.skipped:
        print(f"skipped: {err}", file=sys.stderr)
    counts = {m: 0 for m in ("text", "image", "audio")}
    for _, record in dataset.records:
        for m in counts:
            counts[m] += bool(record.get(m))
    print(json.dumps({"manifest": str(args.manifest), "records": len(dataset), "skipped": len(dataset.skipped),
                      "with": counts}, indent=2))
    return 0


def add_data_commands(sub) -> None:
    data = sub.add_parser("data", help="build and inspect data sets").add_subparsers(dest="data_cmd", required=True)
    build = data.add_parser("build", help="build an embedded data set (scenes, digits) into a cache folder")
    build.add_argument("name", help="scenes or digits")
    build.add_argument("--n", type=int, default=None, help="samples in train+val+test (scenes default 2000; "
                                                          "digits default and maximum 1797)")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--out", default=None, help="output folder (default: ~/.cache/unimodal/data/NAME-nN-seedS)")
    build.add_argument("--no-speech", action="store_true", help="skip the spoken captions")
    build.set_defaults(func=_cmd_data_build)
    info = data.add_parser("info", help="print a built data set's info.json")
    info.add_argument("dir")
    info.set_defaults(func=_cmd_data_info)
    pack = data.add_parser("pack", help="tokenise every split into one small file that training reads without "
                                        "codecs (what a GPU machine trains on)")
    pack.add_argument("--data", required=True, help="comma-separated: scenes, digits, built data folders, manifests")
    pack.add_argument("--codecs", default=None, help="codec folder (default: the package's shipped codecs)")
    pack.add_argument("--max-audio-seconds", type=float, default=None, help="longest audio a sample keeps")
    pack.add_argument("--out", required=True, help="the pack file, named *.pack.safetensors")
    pack.set_defaults(func=_cmd_data_pack)
    check = data.add_parser("check", help="validate a JSONL manifest of your own data")
    check.add_argument("manifest")
    check.add_argument("--skip-bad", action="store_true", help="skip bad records (they are counted and listed)")
    check.set_defaults(func=_cmd_data_check)


def _cmd_codec_train(args) -> int:
    from unimodal.core.paths import cache_root

    out = args.out or str(cache_root() / "codecs" / args.modality)
    audio_only = (args.num_down, args.decoder_channels, args.decoder_dilations)
    if args.modality != "audio" and any(value is not None for value in audio_only):
        raise InputError(f"--num-down / --decoder-channels / --decoder-dilations are audio codec options, "
                         f"not {args.modality}")
    if args.init_from and args.num_down is not None:
        raise InputError("--num-down changes the codes; --init-from keeps them (it only trains a new decoder)")
    if args.modality in ("text", "image") and args.init_from:
        raise InputError(f"--init-from works for the audio codec and the vocoder, not the {args.modality} codec")
    if args.modality != "vocoder" and args.codec_mel_fraction is not None:
        raise InputError(f"--codec-mel-fraction is a vocoder option, not {args.modality}")
    if args.modality == "text" and args.lr is not None:
        raise InputError("--lr does not apply to the text codec (a BPE is counted, not trained by gradient)")
    if args.codec_mel_fraction is not None and not 0.0 <= args.codec_mel_fraction <= 1.0:
        raise InputError(f"--codec-mel-fraction must be in [0, 1], got {args.codec_mel_fraction}")
    if args.lr is not None and not args.lr > 0:
        raise InputError(f"--lr must be > 0, got {args.lr}")
    extra = {"init_from": args.init_from} if args.init_from else {}
    if args.lr is not None:
        extra["lr"] = args.lr
    if args.modality == "vocoder":
        from unimodal.training.checkpoint import cli_config
        from unimodal.training.tokens import codec_folder
        from unimodal.training.vocoder import FINETUNE_DEFAULTS, VocoderTrainConfig, train_vocoder
        from unimodal.core.paths import default_codecs_dir

        codec = args.codec or str(codec_folder(default_codecs_dir(), "audio"))
        if args.init_from:
            extra = {**FINETUNE_DEFAULTS, **extra}
        if args.codec_mel_fraction is not None:
            extra["codec_mel_fraction"] = args.codec_mel_fraction
        cfg = cli_config(VocoderTrainConfig, out, args.resume, args.steps, seed=args.seed, **_batch(args), **extra)
        train_vocoder(codec, out, cfg, resume=args.resume)
        print(f"{out}/vocoder  (attach it: unimodal codec attach-vocoder --codec {codec} --vocoder {out}/vocoder)")
        return 0
    if args.modality == "text":
        from unimodal.tokenizers_mm.text import TextCodec, default_corpus

        TextCodec.train(default_corpus(seed=args.seed)).save_pretrained(f"{out}/codec")
    elif args.modality == "image":
        from unimodal.training.checkpoint import cli_config
        from unimodal.training.codec_image import ImageCodecTrainConfig, train_image_codec

        cfg = cli_config(ImageCodecTrainConfig, out, args.resume, args.steps, seed=args.seed, **_batch(args), **extra)
        train_image_codec(out, cfg, resume=args.resume)
    else:
        from unimodal.training.checkpoint import cli_config
        from unimodal.training.codec_audio import AudioCodecTrainConfig, train_audio_codec

        from unimodal.training.codec_audio import DEFAULT_MODEL

        model = {} if args.init_from else dict(DEFAULT_MODEL)  # an upgrade keeps the source's unless told
        if args.num_down is not None:
            model["num_down"] = args.num_down
        if args.decoder_channels is not None:
            model["decoder_channels"] = args.decoder_channels
        if args.decoder_dilations is not None:
            model["decoder_dilations"] = tuple(args.decoder_dilations)
        cfg = cli_config(AudioCodecTrainConfig, out, args.resume, args.steps, seed=args.seed, model=model,
                         **_batch(args), **extra)
        train_audio_codec(out, cfg, resume=args.resume)
    print(out)
    return 0


def _batch(args) -> dict:
    return {} if args.batch_size is None else {"batch_size": args.batch_size}


def _cmd_attach_vocoder(args) -> int:
    from unimodal.training.vocoder import attach_vocoder

    print(attach_vocoder(args.codec, args.vocoder))
    return 0


def _cmd_codec_eval(args) -> int:
    if args.modality == "image":
        from unimodal.training.codec_image import evaluate_image_codec as evaluate
    else:
        from unimodal.training.codec_audio import evaluate_audio_codec as evaluate
    report = evaluate(args.codec, n=args.n, out=args.out)
    print(json.dumps(report, indent=2))
    return 0


def _cmd_codec_export(args) -> int:
    from unimodal.training.export import export_codecs

    from unimodal.core.paths import cache_root

    print(export_codecs(args.source or cache_root() / "codecs", args.out))
    return 0


def add_codec_commands(sub) -> None:
    codec = sub.add_parser("codec", help="train and evaluate the modality codecs").add_subparsers(
        dest="codec_cmd", required=True)
    train = codec.add_parser("train", help="train a codec (resumable); from scratch unless --init-from")
    train.add_argument("modality", choices=["text", "image", "audio", "vocoder"],
                       help="vocoder: the audio codec's trained mel -> waveform model (replaces Griffin-Lim)")
    train.add_argument("--codec", default=None, help="vocoder only: the audio codec folder it serves (default: "
                                                      "the packaged audio codec)")
    train.add_argument("--init-from", default=None,
                       help="vocoder: start from this trained vocoder folder; audio: upgrade the decoder of this "
                            "trained codec folder (its encoder and codebook are copied and frozen, so its codes "
                            "do not change; only the decoder trains)")
    train.add_argument("--num-down", type=int, choices=[1, 2, 3], default=None,
                       help="audio: halvings of the 62.5 mel frames/s: 1 -> 31.25 codes/s (default, as "
                            "shipped), 2 -> 15.625")
    train.add_argument("--decoder-channels", type=int, default=None, help="audio: decoder width (default 256)")
    train.add_argument("--decoder-dilations", type=_number_list(int), default=None,
                       help="audio: dilations of the decoder's code-rate stack, e.g. 1,3,9,27 (default 1,3,1,3)")
    train.add_argument("--out", default=None, help="run folder (default: ~/.cache/unimodal/codecs/MODALITY); "
                                                   "the trained codec lands in OUT/codec")
    train.add_argument("--steps", type=int, default=None,
                       help="total steps (default 2000; with --resume, the run's own total unless given)")
    train.add_argument("--batch-size", type=int, default=None, help="default: 32 (vocoder: 16)")
    train.add_argument("--lr", type=float, default=None,
                       help="peak learning rate (defaults: image 5e-4, audio 1e-3, vocoder 1e-3, vocoder "
                            "fine-tuning with --init-from 5e-4)")
    train.add_argument("--codec-mel-fraction", type=float, default=None,
                       help="vocoder: share of training windows whose input is the codec's decoded mel rather "
                            "than the true mel (default 0.5; 0.9 with --init-from)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt (its config wins, "
                                                              "except --steps)")
    train.set_defaults(func=_cmd_codec_train)
    evaluate = codec.add_parser("eval", help="measure a trained codec on held-out data")
    evaluate.add_argument("modality", choices=["image", "audio"])
    evaluate.add_argument("--codec", required=True, help="a codec folder (OUT/codec of a training run)")
    evaluate.add_argument("--n", type=int, default=300, help="held-out samples per kind")
    evaluate.add_argument("--out", default=None, help="folder for the JSON report and sample files")
    evaluate.set_defaults(func=_cmd_codec_eval)
    attach = codec.add_parser("attach-vocoder", help="put a trained vocoder into an audio codec folder (the codec "
                                                     "then decodes with it instead of Griffin-Lim)")
    attach.add_argument("--codec", required=True, help="the audio codec folder")
    attach.add_argument("--vocoder", required=True, help="OUT/vocoder of `unimodal codec train vocoder`")
    attach.set_defaults(func=_cmd_attach_vocoder)
    export = codec.add_parser("export", help="save trained codecs (float16) as the package's shipped set")
    export.add_argument("--source", default=None, help="folder with text/, image/, audio/ codec runs "
                                                        "(default: ~/.cache/unimodal/codecs)")
    export.add_argument("--out", default="unimodal/default_codecs")
    export.set_defaults(func=_cmd_codec_export)


def _default_scenes_dir():
    from unimodal.core.paths import data_dir

    return data_dir("scenes", 2000, 0)


def _cmd_judges(args) -> int:
    from unimodal.judges import calibrate
    from unimodal.training.data import BuiltDataset

    data = BuiltDataset(args.data or _default_scenes_dir(), args.split)
    scenes = [data[i] for i in range(min(args.n, len(data)))]
    speech = [s for s in scenes[: args.speech_n] if s.audio is not None]
    report = {"data": str(data.data_dir), "split": args.split, **calibrate(scenes, speech, digit_split=args.split)}
    print(f"scene judge : {report['scene']['object_accuracy']:.1%} of {report['scene']['objects']} objects, "
          f"{report['scene']['scene_accuracy']:.1%} of {report['scene']['scenes']} scenes fully right")
    print(f"digit judge : {report['digit']['accuracy']:.1%} on the real digits' {args.split} split")
    if "speech" in report:
        print(f"speech judge: WER {report['speech']['wer']:.3f} on {report['speech']['clips']} real eSpeak "
              f"captions ({report['speech']['seconds_per_clip']:.2f} s per clip)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


def add_judge_commands(sub) -> None:
    judges = sub.add_parser("judges", help="measure the independent judges on ground truth (needs unimodal[eval])")
    judges.add_argument("--data", default=None, help="a built scenes set (default: the cached scenes-n2000-seed0)")
    judges.add_argument("--split", default="test", choices=["val", "test"])
    judges.add_argument("--n", type=int, default=200, help="scenes to judge")
    judges.add_argument("--speech-n", type=int, default=100, help="spoken captions to transcribe")
    judges.add_argument("--json", default=None, help="also write the figures to this JSON file")
    judges.set_defaults(func=_cmd_judges)


TRAIN_HELP = "train the model (masked diffusion over the shared token space)"
EXPORT_MODEL_HELP = "re-save a trained model folder in float16 for shipping (the packaged default model)"


def add_train_command(sub) -> None:
    from unimodal.training.train import add_arguments, run_from_args

    train = sub.add_parser("train", help=TRAIN_HELP)
    add_arguments(train)
    train.set_defaults(func=run_from_args)
    export = sub.add_parser("export-model", help=EXPORT_MODEL_HELP)
    export.add_argument("--model", required=True, help="a training run's model folder (OUT/model)")
    export.add_argument("--codecs", default=None,
                        help="codec folder to add (a run on a pack, e.g. from a GPU machine, has none); must be the "
                             "codecs the pack was made with")
    export.add_argument("--out", default="unimodal/default_model")
    export.add_argument("--int8", action="store_true", help="store matrices as int8 with per-row scales (half the "
                                                            "float16 size; VQ codebooks and vectors stay float16)")
    export.set_defaults(func=_cmd_export_model)


def _cmd_export_model(args) -> int:
    from unimodal.training.export import export_model

    print(export_model(args.model, args.out, codecs=args.codecs, int8=args.int8))
    return 0


def _cmd_bench_train(args) -> int:
    import torch

    from unimodal.training.bench import bench_train_side_by_side, format_result, result_dict

    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for bf16 in ([True, False] if args.compare_fp32 else [not args.no_bf16]):
        for compiled in ([False, True] if args.compile else [False]):
            heads = (False, True) if args.compare_dense else (True,)
            for result in bench_train_side_by_side(args.preset, args.batch_size, args.steps, bf16=bf16,
                                                   grad_accum=args.grad_accum, compile=compiled, sparse=heads):
                results.append(result)
                print(format_result(result), flush=True)
            if args.compare_dense:
                print(f"  sparse logits speed-up (bf16={bf16}, compiled={compiled}): "
                      f"{results[-2].step_seconds / results[-1].step_seconds:.2f}x", flush=True)
        if args.compile and not args.compare_dense:
            print(f"  torch.compile speed-up (bf16={bf16}): "
                  f"{results[-2].step_seconds / results[-1].step_seconds:.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([result_dict(r) for r in results], f, indent=2)
    return 0


def _cmd_bench_sample(args) -> int:
    from unimodal.inference.bench_sample import bench_sample, format_table, parse_direction, save_report
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


def _number_list(kind):
    def parse(value: str):
        try:
            return [kind(item) for item in value.split(",") if item.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {value!r}") from None
    return parse


def _add_bench_sample_command(bench) -> None:
    from unimodal.inference.bench_sample import DEFAULT_DIRECTIONS, DEFAULT_STEPS, DEFAULT_TAUS

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
    sample.add_argument("--taus", type=_number_list(float), default=list(DEFAULT_TAUS),
                        help="threshold-mode confidence thresholds")
    sample.add_argument("--steps", type=_number_list(int), default=list(DEFAULT_STEPS),
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
    train.add_argument("--compare-dense", action="store_true",
                       help="also run the first recipe's step (logits over the whole vocabulary at every "
                            "position), side by side with the sparse one")
    train.add_argument("--json", default=None)
    train.set_defaults(func=_cmd_bench_train)
    _add_bench_sample_command(bench)
    from unimodal.cli_eval import add_data_efficiency_command, add_versus_ar_command

    add_versus_ar_command(bench)
    add_data_efficiency_command(bench)
    from unimodal.recipe import add_recipe_command

    add_recipe_command(bench)
    from unimodal.cli_refine import add_bench_refine_command

    add_bench_refine_command(bench)


def _cmd_generate(args) -> int:
    from unimodal.checks import check_request
    from unimodal.serve import check_model, load_pipeline, run_generate

    request = {key: getattr(args, key) for key in ("text", "image", "audio", "to", "steps", "mode", "tau",
                                                   "temperature", "top_k", "top_p", "cfg", "seed",
                                                   "max_text_tokens", "max_audio_seconds", "choice_temperature")}
    request["out"] = args.out
    model_dir = check_model(args.model, args.device)  # all of it before torch is even imported
    checked = check_request(request, needs_out=True)
    pipe = load_pipeline(model_dir, args.device)
    result = run_generate(pipe, request, progress=not args.quiet, checked=checked)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if result["text"] is not None:
        print(result["text"])
    for kind, path in result["files"].items():
        print(f"{kind}: {path}")
    return 0


def add_generate_commands(sub) -> None:
    gen = sub.add_parser("generate", help="generate text, an image or audio from any of the others",
                         description="Examples: unimodal generate --text 'a small red circle on the left' --to image "
                                     "--out red.png | --image photo.png --to text | --audio clip.wav --to image "
                                     "--out pic.png | --text 'a blue square' --to image,audio --out outdir")
    add_model_arguments(gen)
    gen.add_argument("--text", default=None, help="a text prompt")
    gen.add_argument("--image", default=None, help="an image file (resized to the model's image size)")
    gen.add_argument("--audio", default=None, help="an audio file (wav/flac/..., resampled to 16 kHz)")
    gen.add_argument("--to", default="image", help="text, image, audio or several comma-separated "
                                                   "(e.g. image,audio); default image")
    gen.add_argument("--out", nargs="+", action="extend", default=None,
                     help="one file per output (by extension: .png, .wav, .txt; .json for the summary) or one folder")
    gen.add_argument("--steps", type=int, default=None, help="model calls (the cap in threshold mode)")
    gen.add_argument("--mode", default=None, choices=["confidence", "threshold", "semi_ar"])
    gen.add_argument("--tau", type=float, default=None, help="threshold mode: commit tokens this confident")
    gen.add_argument("--temperature", type=float, default=None, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--cfg", type=parse_cfg, default=None, help="guidance scale (3) or per input (text=3,audio=2)")
    gen.add_argument("--choice-temperature", type=float, default=None,
                     help="Gumbel noise on which slots are committed first, annealed to 0 (MaskGIT; 0 = greedy order)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--max-text-tokens", type=int, default=None)
    gen.add_argument("--max-audio-seconds", type=float, default=None)
    gen.add_argument("--json", action="store_true", help="print the result as JSON (with the saved file paths)")
    gen.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    gen.set_defaults(func=_cmd_generate)


def _cmd_serve(args) -> int:
    from unimodal.serve import check_model, load_pipeline, serve_stdio

    if args.stdio == args.mcp:
        raise InputError("choose one protocol: unimodal serve --mcp (Model Context Protocol over stdio, for "
                         "agents) or unimodal serve --stdio (JSON lines)")
    if args.mcp:
        from unimodal.mcp_server import require_mcp

        require_mcp()
    model_dir = check_model(args.model, args.device)
    if args.mcp:
        from unimodal.mcp_server import serve_mcp

        return serve_mcp(model_dir, args.device, out_dir=args.out_dir)
    pipe = load_pipeline(model_dir, args.device)
    print(f"unimodal serve: model {model_dir} loaded on {pipe.device}; reading JSON requests from stdin",
          file=sys.stderr, flush=True)
    return serve_stdio(pipe, model_dir=str(model_dir))


def add_serve_command(sub) -> None:
    serve = sub.add_parser("serve", help="keep the model loaded and answer agents: MCP (--mcp) or JSON lines "
                                         "(--stdio)",
                           description="unimodal serve --mcp: a Model Context Protocol server on stdin/stdout (tool "
                                       "generate; resources unimodal://vocabulary and unimodal://model). "
                                       "unimodal serve --stdio --model DIR: one JSON request per line on stdin "
                                       '({"id": 1, "op": "generate", "text": "...", "to": "image", "out": "a.png"}, '
                                       'ops: generate, ping, shutdown), one JSON response per line on stdout')
    add_model_arguments(serve)
    serve.add_argument("--stdio", action="store_true", help="talk JSON lines over stdin/stdout")
    serve.add_argument("--mcp", action="store_true", help="be a Model Context Protocol server over stdin/stdout "
                                                          "(tools: generate; resource: the known vocabulary)")
    serve.add_argument("--out-dir", default=None, help="--mcp: folder for outputs of calls that give no out "
                                                       "(default: a fresh folder under the cache)")
    serve.set_defaults(func=_cmd_serve)


def add_eval_commands(sub) -> None:
    from unimodal.cli_eval import add_eval_command

    add_eval_command(sub)


def add_refine_commands(sub) -> None:
    from unimodal.cli_refine import add_refine_commands as add

    add(sub)


# Groups whose parsers import torch (their defaults live beside the code) are built only when their command is
# named; otherwise each gets a stub with its help line, so `unimodal --help` lists it without the import.
HEAVY_GROUPS = {add_train_command: {"train": TRAIN_HELP, "export-model": EXPORT_MODEL_HELP},
                add_bench_commands: {"bench": "benchmarks"}, add_eval_commands: {"eval": EVAL_HELP}}
COMMAND_GROUPS = [add_data_commands, add_codec_commands, add_judge_commands, add_train_command, add_bench_commands,
                  add_eval_commands, add_generate_commands, add_serve_command, add_refine_commands, add_demo_command]


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser for the command ``argv`` names (None: every command, the heavy ones included)."""
    from unimodal import __version__

    parser = argparse.ArgumentParser(prog="unimodal", description="One masked-diffusion model for text, images "
                                     "and audio, any-to-any.")
    parser.add_argument("--version", action="version", version=f"unimodal {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    command = _command_of(argv)
    for add in COMMAND_GROUPS:
        stubs = HEAVY_GROUPS.get(add, {})
        if argv is None or not stubs or command in stubs:
            add(sub)
        else:
            for name, help_line in stubs.items():
                sub.add_parser(name, help=help_line)
    return parser


def _command_of(argv: list[str] | None) -> str | None:
    """The command word of ``argv`` (top-level options take no values, so it is the first non-option)."""
    return next((word for word in argv or [] if not word.startswith("-")), None)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    # A user-facing warning is one line, not the source location and code line Python shows by default.
    print(f"warning: {message}", file=sys.stderr if file is None else file)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(word) for word in argv]
    debug = "--debug" in argv or bool(os.environ.get("UNIMODAL_DEBUG"))  # anywhere: before or after the command
    args = build_parser(argv).parse_args([word for word in argv if word != "--debug"])
    shown, warnings.showwarning = warnings.showwarning, (warnings.showwarning if debug else _show_warning)
    try:
        return args.func(args)
    except UnimodalError as err:
        if debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - a bug still answers in one line; --debug shows where
        if debug:
            raise
        print(f"error: internal error {type(err).__name__}: {err} (run with --debug for the traceback, and "
              f"please report it)", file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = shown


if __name__ == "__main__":
    sys.exit(main())
