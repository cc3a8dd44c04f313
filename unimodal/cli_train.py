"""``unimodal train`` and ``unimodal export-model``: train the model, and re-save it for shipping.

The train parser's options live beside the training code (torch), so the group is built only when named;
``TRAIN_HELP`` / ``EXPORT_MODEL_HELP`` are the help lines ``unimodal --help`` shows without building it.
"""

from __future__ import annotations


TRAIN_HELP = "train the model (masked diffusion over the shared token space)"
EXPORT_MODEL_HELP = "re-save a trained model folder in float16 for shipping (the packaged default model)"
MERGE_MODELS_HELP = "average model folders of one architecture (a model soup; WiSE-FT between a model and its fine-tune)"


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
    merge = sub.add_parser("merge-models", help=MERGE_MODELS_HELP)
    merge.add_argument("--models", required=True, nargs="+", help="two or more model folders of one architecture "
                                                                   "and layout (the first gives codecs and config)")
    merge.add_argument("--weights", required=True, nargs="+", type=float, help="one weight a model, >= 0, summing to 1")
    merge.add_argument("--critic-from", type=int, default=0, help="the model (0-based) whose critic head is kept "
                                                                   "whole (default 0)")
    merge.add_argument("--out", required=True)
    merge.add_argument("--int8", action="store_true", help="store matrices as int8 (as export-model --int8)")
    merge.set_defaults(func=_cmd_merge_models)


def _cmd_export_model(args) -> int:
    from unimodal.training.export import export_model

    print(export_model(args.model, args.out, codecs=args.codecs, int8=args.int8))
    return 0


def _cmd_merge_models(args) -> int:
    from unimodal.training.export import merge_models

    print(merge_models(args.models, args.weights, args.out, critic_from=args.critic_from, int8=args.int8))
    return 0


__all__ = ["EXPORT_MODEL_HELP", "MERGE_MODELS_HELP", "TRAIN_HELP", "add_train_command"]
