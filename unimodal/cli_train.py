"""``unimodal train`` and ``unimodal export-model``: train the model, and re-save it for shipping.

The train parser's options live beside the training code (torch), so the group is built only when named;
``TRAIN_HELP`` / ``EXPORT_MODEL_HELP`` are the help lines ``unimodal --help`` shows without building it.
"""

from __future__ import annotations


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


__all__ = ["EXPORT_MODEL_HELP", "TRAIN_HELP", "add_train_command"]
