"""``UniModal``: the one model as a diffusers pipeline. Load a model folder, generate any modality from any other.

    from unimodal import UniModal
    pipe = UniModal.from_pretrained("runs/small/model")          # a training run's model folder, or a saved pipeline
    result = pipe.generate(text="a small red circle on the left", to="image", seed=0)
    result.image.save("red.png")
    pipe.generate(image="photo.png", to="text").text
    pipe.generate(text="a blue square", to=["image", "audio"])   # joint generation
    pipe.generate(to=["text", "image", "audio"])                  # all three from nothing
    pipe.generate_batch([{"text": "a red circle", "to": "image"}, {"audio": "clip.wav", "to": "text"}])

The pipeline owns five components: ``backbone`` (:class:`backbone.dit.DiT`), ``tokenizer`` (the text codec's
``PreTrainedTokenizerFast``), ``image_vq`` / ``audio_vq`` (the codecs' VQ models) and ``scheduler``
(:class:`inference.schedulers.MaskedDiffusionScheduler`, the default sampling settings); its config holds the
``layout`` (the shared vocabulary) and the ``task_weights`` the model was trained with (None: unknown). The
math lives elsewhere: the codecs in ``tokenizers_mm``, sampling in :func:`inference.sampler.generate`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from diffusers import DiffusionPipeline
from PIL import Image
from transformers import PreTrainedTokenizerFast

from backbone.dit import DiT
from inference.ar import generate_autoregressive
from inference.sampler import Request, SampleResult, SamplerConfig
from inference.sampler import generate as sample
from inference.schedulers import MaskedDiffusionScheduler
from tokenizers_mm.audio import AudioCodec, AudioVQModel
from tokenizers_mm.image import ImageCodec, ImageVQModel
from tokenizers_mm.layout import LAYOUT_FILE, MODALITIES, Layout
from tokenizers_mm.text import TextCodec
from tokenizers_mm.vocoder import MelVocoder
from unimodal.errors import DataError, InputError
from unimodal.inputs import as_audio, as_image, as_text
from unimodal.results import GenerationResult

PIPELINE_INDEX = "model_index.json"
TRAINING_CONFIG = "training_config.json"
REQUEST_KEYS = ("text", "image", "audio", "to", "seed", "max_text_tokens", "max_audio_seconds")
SETTING_KEYS = ("steps", "mode", "schedule", "tau", "temperature", "top_k", "top_p", "cfg", "seed",
                "block_length", "block_mode", "max_batch_size", "choice_temperature")


class UniModal(DiffusionPipeline):
    """Any-to-any generation with one masked-diffusion transformer; see the module docstring.

    Thread safety: ``generate`` / ``generate_batch`` hold a per-instance lock, so calls from several threads
    are safe but run one at a time (the torch modules are shared). For parallel generation, batch the requests
    (:meth:`generate_batch`) or load one instance per thread.
    """

    _optional_components = ["vocoder"]  # an audio codec without a trained vocoder decodes with Griffin-Lim

    def __init__(self, backbone: DiT, tokenizer: PreTrainedTokenizerFast, image_vq: ImageVQModel,
                 audio_vq: AudioVQModel, scheduler: MaskedDiffusionScheduler, vocoder: MelVocoder | None = None,
                 layout: dict | None = None, task_weights: dict | None = None):
        super().__init__()
        if layout is None:
            raise DataError("a UniModal pipeline needs its layout (the shared vocabulary of the trained model); "
                            "load one with UniModal.from_pretrained(model_folder)")
        layout = layout if isinstance(layout, Layout) else Layout.from_dict(layout)
        self.register_modules(backbone=backbone, tokenizer=tokenizer, image_vq=image_vq, audio_vq=audio_vq,
                              scheduler=scheduler, vocoder=vocoder)
        self.register_to_config(layout=layout.to_dict(), task_weights=dict(task_weights) if task_weights else None)
        self.layout = layout
        self._codecs: dict[str, object] = {}
        self._lock = threading.RLock()
        self._check_components()
        backbone.eval()

    # ---- loading --------------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs) -> "UniModal":
        """Load a saved pipeline (a folder with ``model_index.json``) or a training run's model folder
        (``backbone/``, ``layout.json``, ``text/``, ``image/``, ``audio/``, as ``unimodal train`` writes it)."""
        folder = Path(pretrained_model_name_or_path).expanduser()
        if not folder.is_dir():
            raise InputError(f"model folder {str(folder)!r} does not exist; give a folder written by "
                             f"`unimodal train` (OUT/model) or by UniModal.save_pretrained")
        if (folder / PIPELINE_INDEX).is_file():
            kwargs.setdefault("local_files_only", True)
            return super().from_pretrained(str(folder), **kwargs)
        if (folder / "backbone").is_dir() and (folder / LAYOUT_FILE).is_file():
            return cls.from_model_folder(folder, torch_dtype=kwargs.get("torch_dtype"))
        raise DataError(f"{folder} is not a unimodal model folder: expected either {PIPELINE_INDEX} (a saved "
                        f"pipeline) or backbone/ and {LAYOUT_FILE} with text/, image/ and audio/ codecs (the model "
                        f"folder a training run writes, OUT/model)")

    @classmethod
    def from_model_folder(cls, folder: str | os.PathLike, torch_dtype: torch.dtype | None = None) -> "UniModal":
        """Build the pipeline from a training run's model folder (see ``training.train.write_model_folder``)."""
        folder = Path(folder)
        backbone = DiT.from_pretrained(folder / "backbone")
        if torch_dtype is not None:
            backbone = backbone.to(torch_dtype)
        audio = AudioCodec.from_pretrained(_codec_folder(folder, "audio"))
        return cls(backbone=backbone, tokenizer=TextCodec.from_pretrained(_codec_folder(folder, "text")).tokenizer,
                   image_vq=ImageCodec.from_pretrained(_codec_folder(folder, "image")).model,
                   audio_vq=audio.model, vocoder=audio.vocoder,
                   scheduler=MaskedDiffusionScheduler(), layout=Layout.load(folder).to_dict(),
                   task_weights=_training_task_weights(folder))

    def _check_components(self) -> None:
        layout = self.layout
        sizes = {"text": self.text_codec.codebook_size, "image": self.image_codec.codebook_size,
                 "audio": self.audio_codec.codebook_size}
        for modality, size in sizes.items():
            if layout.codebook_size(modality) != size:
                raise DataError(f"the layout expects {layout.codebook_size(modality)} {modality} ids but the "
                                f"{modality} codec has {size}; the model folder mixes codecs from different runs")
        if self.backbone.config.vocab_size != layout.vocab_size:
            raise DataError(f"the backbone's vocabulary ({self.backbone.config.vocab_size}) is not the layout's "
                            f"({layout.vocab_size}); the model folder mixes parts of different runs")

    # ---- codecs, built lazily from the modules --------------------------------------------------------------

    def _codec(self, modality: str, build):
        if modality not in self._codecs:
            self._codecs[modality] = build()
        return self._codecs[modality]

    @property
    def text_codec(self) -> TextCodec:
        return self._codec("text", lambda: TextCodec(self.tokenizer))

    @property
    def image_codec(self) -> ImageCodec:
        return self._codec("image", lambda: ImageCodec(self.image_vq))

    @property
    def audio_codec(self) -> AudioCodec:
        return self._codec("audio", lambda: AudioCodec(self.audio_vq, getattr(self, "vocoder", None)))

    @property
    def autoregressive(self) -> bool:
        """True for the autoregressive twin (a causal backbone): it decodes token by token with a KV cache and
        ignores ``steps``, ``mode``, ``tau`` and ``cfg``."""
        return bool(getattr(self.backbone.config, "causal", False))

    @property
    def trained_modalities(self) -> tuple[set[str], set[str]]:
        """(input modalities, output modalities) of the tasks trained with a positive weight (all if unknown)."""
        weights = self.config.task_weights
        if not weights:
            return set(MODALITIES), set(MODALITIES)
        inputs, outputs = set(), set()
        for name, weight in weights.items():
            if float(weight) > 0:
                conditions, _, targets = name.rpartition("->") if "->" in name else ("", "", name)
                inputs.update(m for m in conditions.split("+") if m)
                outputs.update(m for m in targets.split("+") if m)
        return inputs, outputs

    # ---- generation -----------------------------------------------------------------------------------------

    def __call__(self, *args, **kwargs) -> GenerationResult:
        """Same as :meth:`generate`."""
        return self.generate(*args, **kwargs)

    def generate(self, text=None, image=None, audio=None, to: str | Sequence[str] = "image",
                 steps: int | None = None, mode: str | None = None, tau: float | None = None,
                 temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                 cfg: float | Mapping[str, float] | None = None, seed: int | None = 0,
                 max_text_tokens: int | None = None, max_audio_seconds: float | None = None,
                 progress: bool = False, **settings) -> GenerationResult:
        """Generate ``to`` (a modality, a list, or ``"image,audio"``) from the inputs given (none: unconditional).

        Inputs: ``text`` a string; ``image`` a PIL image, uint8 array or file path (resized to the codec's
        size); ``audio`` a float array at 16 kHz, ``(array, rate)`` or a file path. Settings left None take the
        scheduler's defaults: ``steps`` (model calls; the cap in ``threshold`` mode), ``mode``
        (``confidence`` / ``threshold`` / ``semi_ar``), ``tau`` (threshold), ``temperature`` (0: greedy),
        ``top_k``, ``top_p``, ``cfg`` (guidance scale, or ``{"text": 3.0}`` per input modality). ``seed``:
        same seed, same settings, same output (None: a fresh seed, reported in ``result.settings``).
        ``max_text_tokens`` / ``max_audio_seconds`` cap the generated text / audio (default: the model's
        maximum). Extra ``settings``: ``schedule``, ``block_length``, ``block_mode``.
        """
        request = dict(text=text, image=image, audio=audio, to=to, max_text_tokens=max_text_tokens,
                       max_audio_seconds=max_audio_seconds)
        return self.generate_batch([request], steps=steps, mode=mode, tau=tau, temperature=temperature,
                                   top_k=top_k, top_p=top_p, cfg=cfg, seed=seed, progress=progress, **settings)[0]

    def generate_batch(self, requests: Sequence[Mapping], progress: bool = False,
                       **settings) -> list[GenerationResult]:
        """Many requests in one batched sampler call; one :class:`GenerationResult` per request, in order.

        Each request is a dict with keys among ``text``, ``image``, ``audio`` (inputs), ``to``, ``seed``,
        ``max_text_tokens``, ``max_audio_seconds``; ``settings`` are :meth:`generate`'s sampling keywords,
        shared by all. Request ``i`` without its own seed uses ``seed + i``, so ``generate_batch`` gives what
        ``generate(seed=seed + i)`` gives one by one.
        """
        if isinstance(requests, Mapping) or not isinstance(requests, Sequence) or not requests:
            raise InputError("generate_batch takes a non-empty list of request dicts, e.g. "
                             "[{'text': 'a red circle', 'to': 'image'}]")
        config = self._sampler_config(settings)  # validates the settings before any input is read
        with self._lock:
            prepared = [self._prepare(spec, index, len(requests) > 1) for index, spec in enumerate(requests)]
            self._encode_inputs(prepared)
            kinds: dict[str | None, list[int]] = {}  # requests that take the same per-target defaults
            for index, item in enumerate(prepared):
                if item.seed is None and config.seed is not None:
                    item.seed = config.seed + index  # as one call would give it, whatever the grouping
                kinds.setdefault(self.scheduler.target_kind(item.targets), []).append(index)
            results: list[GenerationResult | None] = [None] * len(prepared)
            for kind, indices in kinds.items():
                group = [prepared[i] for i in indices]
                group_config = self._sampler_config(settings, kind)
                for index, result in zip(indices, self._decode(group, group_config, progress)):
                    results[index] = result
            return results

    def _decode(self, prepared: list["_Prepared"], config: SamplerConfig, progress: bool) -> list[GenerationResult]:
        decode = generate_autoregressive if self.autoregressive else sample
        model = _Stepping(self.backbone, progress, None if len(prepared) > 1 or config.mode == "semi_ar"
                          or self.autoregressive else config.steps)
        try:
            samples = decode(model, self.layout, [item.request() for item in prepared], config)
        finally:
            model.close()
        return self._results(prepared, samples, config)

    # ---- settings and requests ------------------------------------------------------------------------------

    def _sampler_config(self, settings: Mapping, targets: str | None = None) -> SamplerConfig:
        unknown = sorted(set(settings) - set(SETTING_KEYS))
        if unknown:
            raise InputError(f"unknown setting(s) {unknown}; accepted: {', '.join(SETTING_KEYS)}")
        seed = settings.get("seed", 0)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**62):
            raise InputError(f"seed must be a non-negative int (or None for a fresh one), got {seed!r}")
        values = {k: v for k, v in settings.items() if k != "seed" and v is not None}
        try:
            defaults = self.scheduler.target_defaults(targets)
            if self.autoregressive:  # the twin decodes one token per step, unguided: only these apply
                defaults = {k: v for k, v in defaults.items() if k in ("temperature", "top_k", "top_p")}
            config = self.scheduler.sampler_config(**{**defaults, **values})
        except InputError as error:  # name the argument as the caller wrote it
            raise InputError(str(error).replace("SamplerConfig.", "")) from None
        return SamplerConfig(**{**config.__dict__, "seed": seed})

    def _prepare(self, spec, index: int, in_batch: bool) -> "_Prepared":
        where = f"request {index}: " if in_batch else ""
        if not isinstance(spec, Mapping):
            raise InputError(f"{where}a request must be a dict with keys among {REQUEST_KEYS}, got "
                             f"{type(spec).__name__}")
        unknown = sorted(set(spec) - set(REQUEST_KEYS))
        if unknown:
            raise InputError(f"{where}unknown request key(s) {unknown}; accepted: {', '.join(REQUEST_KEYS)} "
                             f"(sampling settings such as steps are keywords of generate_batch)")
        item = _Prepared(index, where, targets=_parse_to(spec.get("to", "image"), where))
        item.inputs = self._raw_inputs(spec, where)
        self._check_directions(item, where)
        item.seed = _request_seed(spec.get("seed"), where)
        item.target_segments = [self._target_segment(m, spec, where) for m in item.targets]
        return item

    def _raw_inputs(self, spec: Mapping, where: str) -> dict:
        inputs = {m: spec.get(m) for m in MODALITIES if spec.get(m) is not None}
        text = inputs.get("text")
        if isinstance(text, str) and not text.strip():
            if len(inputs) == 1:
                raise InputError(f"{where}text is empty and there is no other input; give a non-empty prompt, "
                                 f"an image or audio, or no input at all for unconditional generation")
            del inputs["text"]  # an empty prompt beside another input means no prompt
        return inputs

    def _check_directions(self, item: "_Prepared", where: str) -> None:
        both = [m for m in item.targets if m in item.inputs]
        if both:
            raise InputError(f"{where}{', '.join(both)} is both an input and an output; generate a modality "
                             f"from the others (to edit an input use edit/refine, not generate)")
        readable, writable = self.trained_modalities
        for modality in item.inputs:
            if modality not in readable:
                raise InputError(f"{where}this model was not trained to read {modality} (its training tasks read "
                                 f"{sorted(readable) or 'nothing'}); leave the {modality} input out")
        for modality in item.targets:
            if modality not in writable:
                raise InputError(f"{where}this model was not trained to write {modality}; it writes "
                                 f"{sorted(writable)}")

    def _target_segment(self, modality: str, spec: Mapping, where: str):
        layout = self.layout
        if modality == "text" and spec.get("max_text_tokens") is not None:
            tokens = _checked_number("max_text_tokens", spec["max_text_tokens"], where, integer=True)
            if not 1 <= tokens <= layout.max_text_len:
                raise InputError(f"{where}max_text_tokens must lie in 1..{layout.max_text_len} for this model, "
                                 f"got {tokens}")
            return layout.target_segment("text", tokens + 1)
        if modality == "audio" and spec.get("max_audio_seconds") is not None:
            seconds = _checked_number("max_audio_seconds", spec["max_audio_seconds"], where)
            codes = math.ceil(seconds * layout.audio_frame_rate)
            longest = layout.max_audio_len / layout.audio_frame_rate
            if not 0 < seconds or codes > layout.max_audio_len:
                raise InputError(f"{where}max_audio_seconds must lie in (0, {longest:.2f}] for this model "
                                 f"({layout.max_audio_len} codes at {layout.audio_frame_rate:.2f}/s), got {seconds}")
            return layout.target_segment("audio", codes + 1)
        return layout.target_segment(modality)

    def _encode_inputs(self, prepared: list["_Prepared"]) -> None:
        """Local ids of every input; text and images in one codec call each."""
        self._encode_texts([item for item in prepared if "text" in item.inputs])
        self._encode_images([item for item in prepared if "image" in item.inputs])
        for item in prepared:
            if "audio" in item.inputs:
                self._encode_audio_input(item)

    def _encode_texts(self, items: list["_Prepared"]) -> None:
        texts = [as_text(item.inputs["text"], _name(item, "text")) for item in items]
        for item, ids in zip(items, self.text_codec.encode(texts) if texts else []):
            if len(ids) > self.layout.max_text_len:
                raise InputError(f"{_name(item, 'text')} is {len(ids)} tokens; this model reads at most "
                                 f"{self.layout.max_text_len}. Shorten the prompt")
            item.conditions["text"] = ids

    def _encode_images(self, items: list["_Prepared"]) -> None:
        arrays = [as_image(item.inputs["image"], self.image_codec.image_size, _name(item, "image")) for item in items]
        if arrays:
            for item, ids in zip(items, self.image_codec.encode(np.stack(arrays)).cpu()):
                item.conditions["image"] = ids

    def _encode_audio_input(self, item: "_Prepared") -> None:
        layout = self.layout
        wave = torch.tensor(as_audio(item.inputs["audio"], name=_name(item, "audio")), dtype=torch.float32)
        ids = self._encode_audio(wave)
        if len(ids) > layout.max_audio_len:  # as in training, which cut audio to the layout's maximum
            warnings.warn(f"{_name(item, 'audio')} is {len(ids) / layout.audio_frame_rate:.1f} s; the model "
                          f"reads its first {layout.max_audio_len / layout.audio_frame_rate:.1f} s")
            item.notes.append(f"audio input cut to its first {layout.max_audio_len} codes")
            ids = ids[:layout.max_audio_len]
        item.conditions["audio"] = ids

    @torch.no_grad()
    def _encode_audio(self, wave: torch.Tensor) -> torch.Tensor:
        # AudioCodec.encode, except that the log-mel (computed on the CPU) goes to the VQ's device first, so
        # the pipeline also works after .to("cuda").
        log_mel = self.audio_codec.log_mel(wave)[None].to(self.audio_vq.device, self.audio_vq.dtype)
        return self.audio_vq.encode_indices(log_mel)[0].cpu()

    # ---- results --------------------------------------------------------------------------------------------

    def _results(self, prepared: list["_Prepared"], samples: list[SampleResult],
                 config: SamplerConfig) -> list[GenerationResult]:
        images = [i for i, s in enumerate(samples) if "image" in s.tokens]
        pictures = {}
        if images:
            decoded = self.image_codec.decode(torch.stack([samples[i].tokens["image"] for i in images]))
            pictures = {i: Image.fromarray(array) for i, array in zip(images, decoded)}
        results = []
        for index, (item, result) in enumerate(zip(prepared, samples)):
            tokens, confidence = _capped(item, result.tokens), result.confidence
            results.append(GenerationResult(
                text=self.text_codec.decode_one(tokens["text"]) if "text" in tokens else None,
                image=pictures.get(index),
                audio=self.audio_codec.decode([tokens["audio"]])[0] if "audio" in tokens else None,
                sample_rate=self.audio_codec.sample_rate,
                token_ids={m: ids.tolist() for m, ids in tokens.items()},
                confidence={m: [float(c) for c in confidence[m][:len(ids)]] for m, ids in tokens.items()},
                forward_passes=result.forward_passes, steps=result.steps,
                settings=_settings(config, item, result)))
        return results

    # ---- self-critique: the loop lives in inference/critique.py and inference/refine.py ----------------------

    def critique(self, result, **kwargs):
        """Per-token scores, flagged regions (native units) and a heat map; see :func:`unimodal.refine.critique`."""
        from unimodal.refine import critique

        return critique(self, result, **kwargs)

    def refine(self, result, **kwargs):
        """Re-mask flagged regions and regenerate them: (result, trace); see :func:`unimodal.refine.refine`."""
        from unimodal.refine import refine

        return refine(self, result, **kwargs)

    def edit(self, content, region, **kwargs):
        """Regenerate ``region`` of ``content`` from a new description; see :func:`unimodal.refine.edit`."""
        from unimodal.refine import edit

        return edit(self, content, region, **kwargs)


# ---- helpers ------------------------------------------------------------------------------------------------


class _Prepared:
    """One request as it is checked and encoded."""

    def __init__(self, index: int, where: str, targets: list[str]):
        self.index, self.where, self.targets = index, where, targets
        self.inputs: dict = {}
        self.conditions: dict[str, torch.Tensor] = {}
        self.target_segments: list = []
        self.seed: int | None = None
        self.notes: list[str] = []

    def request(self) -> Request:
        conditions = [(m, self.conditions[m]) for m in MODALITIES if m in self.conditions]
        return Request(conditions, self.target_segments, seed=self.seed)


class _Stepping:
    """The backbone as the sampler sees it, ticking a progress bar (stderr) at each batched model call."""

    def __init__(self, model: DiT, progress: bool, total: int | None):
        from tqdm.auto import tqdm

        self._model = model
        self._bar = tqdm(total=total, desc="sampling", unit="step", file=sys.stderr, disable=not progress,
                         leave=False)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        self._bar.update(1)
        return self._model(*args, **kwargs)

    def forward_targets(self, *args, **kwargs):
        self._bar.update(1)
        return self._model.forward_targets(*args, **kwargs)

    def extend(self, *args, **kwargs):
        self._bar.update(1)
        return self._model.extend(*args, **kwargs)

    def close(self) -> None:
        self._bar.close()


def _capped(item: _Prepared, tokens: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Text/audio content cut to the cap asked for: a target of n slots leaves its last one for END, but a
    model may fill every slot with content (an untrained one does)."""
    caps = {segment.modality: segment.slots - 1 for segment in item.target_segments if segment.modality != "image"}
    return {m: ids[:caps[m]] if m in caps else ids for m, ids in tokens.items()}


def _name(item: _Prepared, modality: str) -> str:
    return f"{item.where}{modality}"


def _parse_to(to, where: str) -> list[str]:
    """``"image"``, ``"image,audio"`` or ``["image", "audio"]`` -> modalities in canonical order."""
    accepted = "'text', 'image', 'audio', or several as a list or comma-separated string (e.g. 'image,audio')"
    if isinstance(to, str):
        names = [name.strip() for name in to.split(",")]
    elif isinstance(to, Sequence) and all(isinstance(name, str) for name in to):
        names = [name.strip() for name in to]
    else:
        raise InputError(f"{where}to must be {accepted}; got {to!r}")
    unknown = [name for name in names if name not in MODALITIES]
    if unknown or not names:
        raise InputError(f"{where}unknown output {', '.join(map(repr, unknown)) or 'none'} in to={to!r}; "
                         f"accepted: {accepted}")
    return [m for m in MODALITIES if m in names]


def _request_seed(seed, where: str) -> int | None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**62):
        raise InputError(f"{where}seed must be a non-negative int (or None), got {seed!r}")
    return seed


def _checked_number(name: str, value, where: str, integer: bool = False):
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
        raise InputError(f"{where}{name} must be {'an int' if integer else 'a number'}, got {value!r}")
    return value


def _settings(config: SamplerConfig, item: _Prepared, result: SampleResult) -> dict:
    settings = {name: getattr(config, name) for name in ("mode", "schedule", "steps", "tau", "temperature",
                                                         "top_k", "top_p", "cfg", "choice_temperature",
                                                         "block_length", "block_mode")}
    settings.update(seed=result.seed, guidance_passes=result.guidance_passes, to=list(item.targets),
                    inputs=[m for m in MODALITIES if m in item.conditions],
                    commits_per_step=list(result.commits_per_step))
    if item.notes:
        settings["notes"] = list(item.notes)
    return settings


def _codec_folder(folder: Path, modality: str) -> Path:
    """``folder/modality/codec`` when present (a codec training run), else ``folder/modality``."""
    base = folder / modality
    found = base / "codec" if (base / "codec").is_dir() else base
    if not found.is_dir():
        raise DataError(f"{folder} has no {modality} codec (expected {base}/); the model folder is incomplete")
    return found


def _training_task_weights(folder: Path) -> dict | None:
    path = folder / TRAINING_CONFIG
    if not path.is_file():
        return None
    try:
        weights = json.loads(path.read_text()).get("task_weights")
    except (json.JSONDecodeError, AttributeError) as error:
        raise DataError(f"{path} is not a valid training config: {error}") from error
    return {str(k): float(v) for k, v in weights.items()} if isinstance(weights, Mapping) else None


__all__ = ["UniModal"]
