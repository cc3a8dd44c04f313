"""``unimodal codec``: train, evaluate and export the modality codecs, and attach a trained vocoder."""

from __future__ import annotations

import json

from unimodal.cli_common import number_list
from unimodal.core.errors import InputError


def _cmd_codec_train(args) -> int:
    from unimodal.core.paths import cache_root

    out = args.out or str(cache_root() / "codecs" / args.modality)
    audio_only = (args.num_down, args.decoder_channels, args.decoder_dilations)
    if args.modality != "audio" and any(value is not None for value in audio_only):
        raise InputError(f"--num-down / --decoder-channels / --decoder-dilations are audio codec options, "
                         f"not {args.modality}")
    if args.init_from and args.num_down is not None:
        raise InputError("--num-down changes the codes; --init-from keeps them (it only trains a new decoder)")
    if args.codes is not None and args.modality != "image":
        raise InputError(f"--codes sets the image codec's codebook size, not the {args.modality} codec's")
    if args.codes is not None and not 2 <= args.codes <= 4096:
        raise InputError(f"--codes must be between 2 and 4096, got {args.codes}")
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

        from unimodal.training.codec_image import DEFAULT_MODEL

        if args.codes is not None:
            extra["model"] = {**DEFAULT_MODEL, "num_vq_embeddings": args.codes}
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
    train.add_argument("--codes", type=int, default=None,
                       help="image: codebook size (default 512, as shipped); fewer codes carry less nuisance "
                            "(background shade) at some cost in reconstruction")
    train.add_argument("--decoder-channels", type=int, default=None, help="audio: decoder width (default 256)")
    train.add_argument("--decoder-dilations", type=number_list(int), default=None,
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


__all__ = ["add_codec_commands"]
