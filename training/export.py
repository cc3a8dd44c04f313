"""Export trained codecs and models as the package's shipped files: weights stored in float16, which halves
the files and measured the same as float32 (image codec: identical PSNR, usage and judge accuracy on 100
held-out samples of each kind). They load back as float32.

The default model (``unimodal/default_model``) is a whole model folder: backbone, layout, training config and
the three codecs it was trained with, so it is also the default codec folder for training.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from unimodal.backbone.dit import DiT
from unimodal.tokenizers_mm import get_codec_class
from unimodal.tokenizers_mm.layout import LAYOUT_FILE
from unimodal.training.tokens import CODEC_MODALITIES, codec_folder
from unimodal.core.errors import DataError
from unimodal.core.int8 import convert_folder_to_int8, load_pretrained
from unimodal.core.paths import SCHEDULER_DIR

MODEL_FILES = (LAYOUT_FILE, "training_config.json", "vocabulary.json")


def export_codecs(source: str | Path, out: str | Path) -> Path:
    """Copy the text codec and re-save the image and audio codecs in float16 into ``out/{text,image,audio}``."""
    out = Path(out)
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    _write_codecs(source, staging)
    _publish(staging, out)
    return out


def export_model(model_dir: str | Path, out: str | Path, codecs: str | Path | None = None, int8: bool = False) -> Path:
    """A training run's model folder (``OUT/model``) re-saved for shipping: float16 backbone and codecs, the
    layout and training config as they are. Written beside ``out`` and renamed into place. ``codecs``: take
    the codecs from this folder instead (a run on a pack has none); their layout must be the model's. ``int8``:
    matrices stored as int8 with per-row scales (:mod:`unimodal.core.int8`), half the float16 size."""
    model_dir, out = Path(model_dir), Path(out)
    if not (model_dir / "backbone").is_dir() or not (model_dir / LAYOUT_FILE).is_file():
        raise DataError(f"{model_dir} is not a model folder (expected backbone/ and {LAYOUT_FILE}, as "
                        f"`unimodal train` writes in OUT/model)")
    if codecs is not None:
        _check_codecs_fit(model_dir, codecs)
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    backbone = load_pretrained(DiT, model_dir / "backbone")
    backbone.half().save_pretrained(staging / "backbone")
    for name in MODEL_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, staging / name)
    if (model_dir / SCHEDULER_DIR).is_dir():  # the model's own sampler defaults travel with it
        shutil.copytree(model_dir / SCHEDULER_DIR, staging / SCHEDULER_DIR)
    _write_codecs(model_dir if codecs is None else codecs, staging)
    if int8:
        convert_folder_to_int8(staging)
    _publish(staging, out)
    return out


CRITIC_PREFIX = "critic_head."


def merge_models(models: list[str | Path], weights: list[float], out: str | Path, critic_from: int = 0,
                 int8: bool = False) -> Path:
    """A weighted average of model folders of one architecture (a "model soup", WiSE-FT when the models are a
    model and its fine-tune), exported like :func:`export_model`: ``sum(w_i * theta_i)`` in float32 for every
    backbone weight but the critic head, which comes whole from ``models[critic_from]`` (a head is trained on the
    features of one backbone; averaging two heads averages two different readings). Layout, codecs, scheduler and
    training config are ``models[0]``'s, the config also records what was merged (``merged``) and the critic's
    origin. The models must share the backbone config and the layout; ``weights`` are >= 0 and sum to 1."""
    import json

    from unimodal.core.paths import model_hash

    folders = [Path(m) for m in models]
    if len(folders) < 2 or len(weights) != len(folders):
        raise DataError(f"merging needs two or more model folders and one weight each; got {len(folders)} folders "
                        f"and {len(weights)} weights")
    if any(not (w >= 0) for w in weights) or abs(sum(weights) - 1) > 1e-6:
        raise DataError(f"merge weights must be >= 0 and sum to 1, got {list(weights)}")
    if not 0 <= critic_from < len(folders):
        raise DataError(f"critic_from must name one of the {len(folders)} models (0 to {len(folders) - 1}), "
                        f"got {critic_from}")
    for folder in folders:
        if not (folder / "backbone").is_dir() or not (folder / LAYOUT_FILE).is_file():
            raise DataError(f"{folder} is not a model folder (expected backbone/ and {LAYOUT_FILE})")
    first = folders[0]
    for folder in folders[1:]:
        for name, read in (("backbone config", lambda f: {k: v for k, v in DiT.load_config(f / "backbone").items()
                                                            if not k.startswith("_")}),
                           ("layout", lambda f: json.loads((f / LAYOUT_FILE).read_text()))):
            if read(folder) != read(first):
                raise DataError(f"{folder} and {first} differ in their {name}: only models of one architecture "
                                f"and layout can be averaged")
    states = [load_pretrained(DiT, folder / "backbone").state_dict() for folder in folders]
    merged = {}
    for key, value in states[0].items():
        if key.startswith(CRITIC_PREFIX):
            merged[key] = states[critic_from][key].clone()
        else:
            merged[key] = sum(w * state[key].float() for w, state in zip(weights, states)).to(value.dtype)
    staging = Path(out).with_name(Path(out).name + ".merge")
    shutil.rmtree(staging, ignore_errors=True)
    backbone = DiT.from_config(DiT.load_config(first / "backbone"))
    backbone.load_state_dict(merged)
    backbone.save_pretrained(staging / "backbone")
    for name in MODEL_FILES:
        if (first / name).is_file():
            shutil.copy2(first / name, staging / name)
    if (first / SCHEDULER_DIR).is_dir():
        shutil.copytree(first / SCHEDULER_DIR, staging / SCHEDULER_DIR)
    config_file = staging / "training_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    critic_config_file = folders[critic_from] / "training_config.json"
    critic_config = json.loads(critic_config_file.read_text()) if critic_config_file.is_file() else {}
    for key in ("critic_trained", "critic_head"):
        config.pop(key, None)
        if key in critic_config:
            config[key] = critic_config[key]
    config["merged"] = {"models": [{"folder": _run_name(folder), "hash": model_hash(folder)} for folder in folders],
                        "weights": [float(w) for w in weights], "critic_from": critic_from}
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    try:
        return export_model(staging, out, codecs=first, int8=int8)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _run_name(folder: Path) -> str:
    """How a merged config names a model folder: its name, with its run's for a run's ``OUT/model`` (no path of
    the merging machine)."""
    return f"{folder.parent.name}/{folder.name}" if folder.name == "model" and folder.parent.name else folder.name


def _check_codecs_fit(model_dir: Path, codecs: str | Path) -> None:
    """The codecs must give the layout the model was trained on (same vocabulary sizes, grid, frame rate)."""
    from unimodal.tokenizers_mm.layout import Layout
    from unimodal.training.tokens import CodecStack

    trained = Layout.load(model_dir)
    stack = CodecStack.load(codecs, max_text_len=trained.max_text_len, max_audio_len=trained.max_audio_len)
    # where audio codes sit (audio_position_rate) is the model's choice, not the codecs'
    if replace(stack.layout, audio_position_rate=trained.audio_position_rate).to_dict() != trained.to_dict():
        raise DataError(f"the codecs in {codecs} do not fit the model in {model_dir}: layout "
                        f"{stack.layout.to_dict()} vs the model's {trained.to_dict()}")


def _publish(staging: Path, out: Path) -> None:
    _drop_local_paths(staging)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)


def _drop_local_paths(folder: Path) -> None:
    """diffusers records where a component was loaded from (``_name_or_path``): a path on the exporting machine,
    meaningless in the package, so shipped configs leave it out."""
    import json

    for config in folder.rglob("config.json"):
        values = json.loads(config.read_text())
        if values.pop("_name_or_path", None) is not None:
            config.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")


def _write_codecs(source: str | Path, staging: Path) -> None:
    for modality in CODEC_MODALITIES:
        folder = codec_folder(source, modality)
        if modality == "text":
            shutil.copytree(folder, staging / modality)
            continue
        codec = get_codec_class(modality).from_pretrained(folder)
        parts = [codec.model] + ([codec.vocoder] if getattr(codec, "vocoder", None) is not None else [])
        for part in parts:
            part.half()
        codec.save_pretrained(staging / modality)
        for part in parts:
            part.float()
