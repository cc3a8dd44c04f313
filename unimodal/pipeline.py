"""``UniModal``: the one model as a diffusers pipeline. Load a model folder, generate any modality from any other.

    from unimodal import UniModal
    pipe = UniModal.from_pretrained("runs/small/model")          # a training run's model folder, or a saved pipeline
    result = pipe.generate(text="a small red circle on the left", to="image", seed=0)
    result.image.save("red.png")
    pipe.generate(image="photo.png", to="text").text
    pipe.generate(text="a blue square", to=["image", "audio"])   # several outputs
    pipe.generate(to=["text", "image", "audio"])                  # all three from nothing
    pipe.generate_batch([{"text": "a red circle", "to": "image"}, {"audio": "clip.wav", "to": "text"}])

The pipeline owns ``backbone`` (:class:`unimodal.backbone.dit.DiT`), ``scheduler``
(:class:`unimodal.inference.schedulers.MaskedDiffusionScheduler`, the default sampling settings) and the parts of
the codecs (each codec's ``pipeline_parts``: ``tokenizer``, ``image_vq``, ``audio_vq``, ``vocoder``); its config
holds the ``layout`` (the shared vocabulary) and the ``task_weights`` the model was trained with (None: unknown).
Every modality is loaded, encoded and decoded through the codec registry (:data:`unimodal.tokenizers_mm.CODECS`),
the one training uses: ``pipe.codecs`` maps each modality to its codec. The math lives elsewhere: the codecs in
``tokenizers_mm``, sampling in :func:`unimodal.inference.sampler.generate`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from diffusers import DiffusionPipeline
from PIL import Image
from transformers import PreTrainedTokenizerFast

from unimodal.backbone.dit import DiT
from unimodal.inference.ar import generate_autoregressive
from unimodal.inference.sampler import Request, SampleResult, SamplerConfig
from unimodal.inference.sampler import generate as sample
from unimodal.inference.unmasking import SAMPLER_SETTINGS, TOKEN_SETTINGS
from unimodal.inference.schedulers import MaskedDiffusionScheduler
from unimodal.tokenizers_mm import CODECS, Codec, codec_from_parts, codec_parts, get_codec_class, load_codecs
from unimodal.tokenizers_mm.audio import AudioCodec, AudioVQModel
from unimodal.tokenizers_mm.image import ImageCodec, ImageVQModel
from unimodal.tokenizers_mm.layout import LAYOUT_FILE, MODALITIES, Layout
from unimodal.tokenizers_mm.text import TextCodec
from unimodal.tokenizers_mm.vocoder import MelVocoder
from unimodal.checks import (AGREEMENT_DEFAULT, check_accept_agreement, check_accept_confidence, check_agreement, check_candidates, check_plan, check_draws_differ,
                             check_refine_rounds, check_repair_request, check_repair_setting,
                             check_model_folder, check_not_both, check_to, TWIN_REFUSALS, twin_refuses)
from unimodal.core.errors import (DataError, EmptyInputError, InputError, ModelFolderError, SettingError,
                             StepsCappedWarning, UnimodalError, UnknownWordsWarning)
from unimodal.core.paths import SCHEDULER_DIR, resolve_model_dir
from unimodal.core.grammar import unknown_words
from unimodal.core.seeds import check_seed, derived_seed, fresh_seed
from unimodal.inputs import as_audio, as_image, as_text
from unimodal.core.int8 import load_pretrained
from unimodal.results import GenerationResult
from unimodal.phrasing import applies as phrasing_applies, rephrased, resolve_rephrase
from unimodal.rivals import applies as rivals_apply, resolve_rivals, rival_checked

PIPELINE_INDEX = "model_index.json"
TRAINING_CONFIG = "training_config.json"
VOCABULARY_FILE = "vocabulary.json"  # the words the training captions used (unimodal.core.grammar.known_vocabulary)
REQUEST_KEYS = ("text", "image", "audio", "to", "seed", "max_text_tokens", "max_audio_seconds")
# The sampler settings the autoregressive twin reads (one token a step, left to right, unguided: mode, steps, tau,
# guidance and the rest do not apply to it): the only defaults it takes, and what its results say it decoded with
TWIN_SETTINGS = ("temperature", "top_k", "top_p")
# keywords of an instructed edit (unimodal.instructed.instructed_edit) that a described edit has no use for
INSTRUCTED_ONLY = {"attempts", "draft", "touch_up", "speech_margin", "refine"}
# Whether a request without a text input plans in words first (see UniModal.generate's ``plan``), and how. Measured
# on the model r7 (docs/results.md, "Planning in words"): image, caption and speech from nothing agree in 0.219 of
# 64 samples against 0.000 in one loop; pictures drawn from speech are right 0.531 against 0.156 (64 test scenes).
# On r9 each output drawn from the words alone ("text-only") draws spoken scenes right 0.775 against 0.705 with
# the speech beside the words (200 test scenes, better beyond the 95% interval; the other two planned directions
# level within the noise: docs/results.md, "r9").
PLAN_DEFAULT = "text-only"


class UniModal(DiffusionPipeline):
    """Any-to-any generation with one masked-diffusion transformer; see the module docstring.

    Thread safety: ``generate`` / ``generate_batch`` hold a per-instance lock, so calls from several threads
    are safe but run one at a time (the torch modules are shared). For parallel generation, batch the requests
    (:meth:`generate_batch`) or load one instance per thread.
    """

    _optional_components = ["vocoder"]  # an audio codec without a trained vocoder decodes with Griffin-Lim

    def __init__(self, backbone: DiT, tokenizer: PreTrainedTokenizerFast, image_vq: ImageVQModel,
                 audio_vq: AudioVQModel, scheduler: MaskedDiffusionScheduler, vocoder: MelVocoder | None = None,
                 layout: dict | None = None, task_weights: dict | None = None, vocabulary: dict | None = None,
                 critic_trained: bool = False):
        super().__init__()
        if layout is None:
            raise DataError("a UniModal pipeline needs its layout (the shared vocabulary of the trained model); "
                            "load one with UniModal.from_pretrained(model_folder)")
        layout = layout if isinstance(layout, Layout) else Layout.from_dict(layout)
        self.register_modules(backbone=backbone, tokenizer=tokenizer, image_vq=image_vq, audio_vq=audio_vq,
                              scheduler=scheduler, vocoder=vocoder)
        self.register_to_config(layout=layout.to_dict(), task_weights=dict(task_weights) if task_weights else None,
                                vocabulary=dict(vocabulary) if vocabulary else None,
                                critic_trained=bool(critic_trained))  # critic="learned" needs it (refine.py)
        self.layout = layout
        self._codecs: dict[str, Codec] = {}
        self._lock = threading.RLock()
        self._check_components()
        backbone.eval()

    # ---- loading --------------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike | None = None, **kwargs) -> "UniModal":
        """Load a saved pipeline (a folder with ``model_index.json``) or a training run's model folder
        (``backbone/``, ``layout.json``, ``text/``, ``image/``, ``audio/``, as ``unimodal train`` writes it).
        Without a folder: ``$UNIMODAL_MODEL``, else the model shipped in the package (offline, no download)."""
        folder = check_model_folder(resolve_model_dir(pretrained_model_name_or_path))  # damaged files named before torch reads them
        try:
            if (folder / PIPELINE_INDEX).is_file():
                kwargs.setdefault("local_files_only", True)
                return super().from_pretrained(str(folder), **kwargs)
            if (folder / "backbone").is_dir() and (folder / LAYOUT_FILE).is_file():
                return cls.from_model_folder(folder, torch_dtype=kwargs.get("torch_dtype"))
        except UnimodalError:
            raise
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, json.JSONDecodeError) as error:
            # What the header check cannot see (a wrong shape, a config value or argument missing) still names
            # the folder.
            raise ModelFolderError(f"cannot load the model in {folder}: {type(error).__name__}: {error}") from error
        codecs = ", ".join(f"{m}/" for m in CODECS)
        raise DataError(f"{folder} is not a unimodal model folder: expected either {PIPELINE_INDEX} (a saved "
                        f"pipeline) or backbone/ and {LAYOUT_FILE} with {codecs} codecs (the model folder a "
                        f"training run writes, OUT/model)")

    @classmethod
    def from_model_folder(cls, folder: str | os.PathLike, torch_dtype: torch.dtype | None = None) -> "UniModal":
        """Build the pipeline from a training run's model folder (see ``unimodal.training.train.write_model_folder``):
        the backbone, and each registered modality's codec from ``folder/<modality>``, split into its parts."""
        folder = Path(folder)
        backbone = load_pretrained(DiT, folder / "backbone")
        if torch_dtype is not None:
            backbone = backbone.to(torch_dtype)
        codecs = load_codecs(folder)
        parts = {name: part for codec in codecs.values() for name, part in codec_parts(codec).items()}
        scheduler = MaskedDiffusionScheduler()  # a folder may store its own sampler defaults, as a saved pipeline does
        if (folder / SCHEDULER_DIR / MaskedDiffusionScheduler.config_name).is_file():
            scheduler = MaskedDiffusionScheduler.from_pretrained(folder, subfolder=SCHEDULER_DIR)
        return cls(backbone=backbone, scheduler=scheduler, layout=Layout.load(folder).to_dict(),
                   task_weights=_training_task_weights(folder), vocabulary=_vocabulary(folder),
                   critic_trained=_critic_trained(folder), **parts)

    def _check_components(self) -> None:
        layout = self.layout
        for modality, codec in self.codecs.items():
            size = codec.codebook_size
            if layout.codebook_size(modality) != size:
                raise DataError(f"the layout expects {layout.codebook_size(modality)} {modality} ids but the "
                                f"{modality} codec has {size}; the model folder mixes codecs from different runs")
        if self.backbone.config.vocab_size != layout.vocab_size:
            raise DataError(f"the backbone's vocabulary ({self.backbone.config.vocab_size}) is not the layout's "
                            f"({layout.vocab_size}); the model folder mixes parts of different runs")

    # ---- codecs: the registry's classes, built lazily from the registered parts -------------------------------

    @property
    def codecs(self) -> dict[str, Codec]:
        """Modality -> codec, for every modality in :data:`unimodal.tokenizers_mm.CODECS`, in its order."""
        for modality in CODECS:
            if modality not in self._codecs:
                names = get_codec_class(modality).pipeline_parts
                self._codecs[modality] = codec_from_parts(modality, {name: getattr(self, name, None) for name in names})
        return {modality: self._codecs[modality] for modality in CODECS}

    @property
    def text_codec(self) -> TextCodec:
        return self.codecs["text"]

    @property
    def image_codec(self) -> ImageCodec:
        return self.codecs["image"]

    @property
    def audio_codec(self) -> AudioCodec:
        return self.codecs["audio"]

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
                 progress: bool = False, candidates: int = 1, plan: str = PLAN_DEFAULT,
                 accept_confidence: float | None = None, agreement: str | None = None, refine: int | None = None,
                 accept_agreement: float | None = None, repair: bool = False, rivals: bool | None = None,
                 rephrase: bool | None = None, **settings) -> GenerationResult:
        """Generate ``to`` (a modality, a list, or ``"image,audio"``) from the inputs given (none: unconditional).

        Inputs: ``text`` a string; ``image`` a PIL image, uint8 array or file path (resized to the codec's
        size); ``audio`` a float array at 16 kHz, ``(array, rate)`` or a file path. Settings left None take the
        scheduler's defaults: ``steps`` (model calls; the cap in ``threshold`` mode), ``mode``
        (``confidence`` / ``threshold`` / ``semi_ar``), ``tau`` (threshold), ``temperature`` (0: greedy),
        ``top_k``, ``top_p``, ``cfg`` (guidance scale, or ``{"text": 3.0}`` per input modality). ``seed``:
        same seed, same settings, same output (None: a fresh seed, reported in ``result.settings``).
        ``max_text_tokens`` / ``max_audio_seconds`` cap the generated text / audio (default: the model's
        maximum). Extra ``settings``: ``schedule``, ``block_length``, ``block_mode``.

        ``plan``: ``"text"``: a request without a text input puts its plan in words first. The model
        writes the text with text's own defaults whatever the other settings (read from the inputs greedily; or,
        with no input, sampled with the scheduler's ``unconditional_text``, temperature 0.5 by default
        (:data:`~unimodal.inference.schedulers.UNCONDITIONAL_TEXT_SETTINGS`) unless the model folder stores its own;
        the sampling settings given are the other outputs', the seed is shared), then generates the
        other outputs with the inputs and that text as conditions, guided by it like any prompt. When text is
        an output it is that text (so a joint picture, caption and speech agree); otherwise it is only the plan,
        reported in ``result.settings["text_stage"]["text"]`` (audio->image: the picture is drawn from the speech
        and what the model heard in it). ``"text-only"``: the same text first, then each other output in a loop of
        its own with that text as its only condition (the inputs it was read from set aside; an empty text sets
        nothing aside): every stage is then a direction the model was trained on (text->image, text->audio). The
        default (:data:`PLAN_DEFAULT`).
        ``"none"``: every output from the inputs alone, in one loop.
        ``result.settings`` says which ran (``plan``) and, planned, ``text_stage`` (the text's sampler settings, its
        ``steps`` setting among them, the ``model_calls`` and ``forward_passes`` it took, words, token ids and whether
        they were a condition: an empty text is not; critique and refine read the outputs with them);
        ``forward_passes`` counts both stages.

        ``candidates`` > 1: draw that many (seeds ``seed``, ``seed + 1``, ...; one batched sampler call) and return
        the one that agrees best with the inputs, read back by the same model (the prompt's log-probability when
        the model reads it from each output: :func:`unimodal.inference.critique.agreement_score`).
        ``result.settings["candidates"]`` holds every candidate's seed, score and passes (``seeds``,
        ``agreement``, ``draw_passes``), how many were ``drawn`` and which was ``kept``; ``forward_passes`` counts
        all of them. Needs an input to agree with. ``agreement``: how each output is read back
        (:data:`~unimodal.inference.critique.AGREEMENT_READINGS`; None: :data:`AGREEMENT_DEFAULT`): ``"joint"``, every
        input token masked at once (one pass); ``"each"``, each word of a text input masked alone with the rest in
        view (a pass per token): the words that name the content decide, not how likely the prompt's wording is
        (``result.settings["candidates"]["reading"]``).

        ``accept_confidence`` (with ``candidates`` > 1): draw the first alone and keep it, drawing no more, when the
        model is sure of it: its confidence score (the mean log-probability of its tokens, each re-masked in 4
        interleaved groups: :func:`unimodal.inference.critique.confidence_scores`, 4 forward passes) is at least
        this; otherwise draw the rest and keep the best by agreement, as without it. On 96 test pictures that score
        told a right greedy caption from a wrong one with AUROC 0.99; reading 200 with ``candidates=8``,
        ``accept_confidence=-0.1`` gave the same verdicts as always drawing 8, at 3.45 draws a picture
        (docs/results.md, "Reading pictures").
        ``result.settings["candidates"]`` then also holds ``confidence`` and ``accept_confidence``; a first draw kept
        alone has ``drawn`` 1, ``seeds`` ``[seed]`` and no ``agreement`` (nothing was compared).

        ``accept_agreement`` (with ``candidates`` > 1; not beside ``accept_confidence``): draw one at a time, read
        each back as it comes (``agreement``'s reading) and keep the first whose agreement score is at least this,
        drawing no more; when none reaches it, the best of all ``candidates``. Drawing stops where the output already
        says what was asked and goes on where it does not (docs/results.md, "Drawing until the picture reads as
        asked"). ``result.settings["candidates"]`` holds the scores of the draws made (``drawn`` of them),
        ``accept_agreement`` and whether a draw reached it (``accepted``).

        ``refine`` > 0: then :meth:`refine` the output against the inputs for that many rounds with refine's own
        defaults, not the sampling settings given here (call :meth:`refine` to set those). The critic flags what to
        redo; a caption read from a picture or speech gets its own recipe, words it is unsure of redrawn at
        temperature 1 and a round kept only when the input reads back better (reading test pictures went 0.810 ->
        0.925 with 3 rounds at ~2x the passes, docs/critique.md). ``forward_passes`` counts the rounds too;
        ``result.settings["refine"]`` says what ran (critic, passes, why it stopped, rounds run and kept). ``refine=None`` (the
        default): speech alone (``to="audio"``) on a model whose critic head is trained is refined
        :data:`~unimodal.refine.SPEECH_REFINE_ROUNDS` rounds by its best critic (image->audio 0.715 -> 0.815 on
        the validation scenes at 1.5x the passes, docs/results.md, "Speech refined by its critic" and "The speech
        critic's stricter ear"); anything else
        is not refined (0).

        ``repair`` (a picture drawn from ``text`` or ``audio``): then read the picture back with the same model and
        change each colour, size or place it shows otherwise than the request by an instructed edit from the
        object's own pixels (:meth:`refine` with ``repair=True``; held-out colour+shape pairs 0.690 -> 0.865 at
        1.56x the passes, docs/critique.md, "Repair by reading back"), before any ``refine`` rounds.
        ``result.settings["repair"]`` holds the reading, the colours its pixels name otherwise, and each edit;
        ``forward_passes`` counts the reading.

        ``rivals`` (None: on, :data:`unimodal.rivals.RIVALS_DEFAULT`; the twin: off): a caption read from a picture
        that names two objects is checked against its rival, the same words with the relation turned around: the
        picture is read back from each (one pass each) and the caption it is likelier under is kept (test pictures
        read 0.805 -> 0.955, none broken: :mod:`unimodal.rivals`). It checks the caption asked for alone and the plan
        in words a picture's other outputs are made from (image->audio speaks the checked caption); not a caption drawn
        in one loop with other outputs (``plan="none"``), which were made with it.
        ``result.settings["rival_check"]`` (``settings["text_stage"]["rival_check"]`` for a plan) holds both
        captions, their scores and which was kept; ``forward_passes`` counts the check.

        ``rephrase`` (None: on, :data:`unimodal.phrasing.REPHRASE_DEFAULT`): speech made from a plan in words that is
        no output (image->audio) says the scene the plan states in the form the model speaks most clearly ("there is
        a ..."; :mod:`unimodal.phrasing`); ``settings["text_stage"]["rephrased"]`` holds the plan as read and as said.
        """
        refine = self.default_refine_rounds(to) if refine is None else check_refine_rounds(refine)
        check_repair_setting(repair)
        given = [m for m, v in (("text", text), ("image", image), ("audio", audio)) if v is not None]
        check_repair_request(repair, check_to(to), given)
        refused = twin_refuses({"refine": refine, "repair": repair}) if self.autoregressive else []
        if refused:
            raise SettingError(TWIN_REFUSALS[refused[0]])
        settings = {**settings, "rivals": resolve_rivals(rivals, self.autoregressive),
                    "rephrase": resolve_rephrase(rephrase)}
        result = self._generate_once(text, image, audio, to, steps, mode, tau, temperature, top_k, top_p, cfg, seed,
                                     max_text_tokens, max_audio_seconds, progress, candidates, plan,
                                     accept_confidence, agreement, settings, accept_agreement)
        if repair:  # the request it was drawn from: the words, else the speech (the model's transcript of it)
            request = {"text": text} if text is not None else {"audio": audio}
            repaired, trace = self.refine(result, **request, repair=True, rounds=refine,
                                          seed=result.settings.get("seed") or 0)
            repaired.settings = {**repaired.settings, "repair": trace["repair"]}
            return repaired
        # refine's own defaults, not the sampling settings above: those drew the output (a caption's temperature
        # > 0 for candidates, say), and the caption recipe's temperature 1 applies only where none is given
        return self._refined_all([{"text": text, "image": image, "audio": audio, "to": to}], [result], refine)[0]

    def _generate_once(self, text, image, audio, to, steps, mode, tau, temperature, top_k, top_p, cfg, seed,
                       max_text_tokens, max_audio_seconds, progress, candidates, plan, accept_confidence,
                       agreement, settings, accept_agreement=None) -> GenerationResult:
        request = dict(text=text, image=image, audio=audio, to=to, max_text_tokens=max_text_tokens,
                       max_audio_seconds=max_audio_seconds)
        sampling = dict(steps=steps, mode=mode, tau=tau, temperature=temperature, top_k=top_k, top_p=top_p, cfg=cfg,
                        plan=plan, **settings)
        accept_confidence = check_accept_confidence(accept_confidence, check_candidates(candidates))
        accept_agreement = check_accept_agreement(accept_agreement, candidates, accept_confidence)
        agreement = check_agreement(agreement, candidates)
        if candidates == 1:  # refined, if at all, by generate
            return self.generate_batch([request], seed=seed, progress=progress, refine=0, **sampling)[0]
        return self._best_of(request, candidates, seed, progress, sampling, accept_confidence, agreement=agreement,
                             accept_agreement=accept_agreement)

    def best_of(self, candidates: int, seed: int | None = 0, progress: bool = False, text=None, image=None,
                audio=None, to: str | Sequence[str] = "image", max_text_tokens: int | None = None,
                max_audio_seconds: float | None = None, agreement: str | None = None,
                **sampling) -> tuple[GenerationResult, list[GenerationResult]]:
        """What :meth:`generate` with ``candidates`` returns, before any refine (``generate`` refines speech by
        default: :meth:`default_refine_rounds`), and every draw it chose from (seed order; the kept
        one is the returned result itself, its ``forward_passes`` counting all draws and reads). For benchmarks
        that judge each draw: one run then gives the accuracy of best-of-k for every k up to ``candidates``
        (``unimodal eval --candidates N --every-draw``). ``sampling``: :meth:`generate`'s sampler settings.
        ``agreement`` chooses as in :meth:`generate`; every draw is also read the other ways
        (``settings["candidates"]["by_reading"]``: per reading, each draw's score and the passes of one read), so
        one run compares the readings as choosers (not counted in ``forward_passes``)."""
        request = dict(text=text, image=image, audio=audio, to=to, max_text_tokens=max_text_tokens,
                       max_audio_seconds=max_audio_seconds)
        if check_candidates(candidates) < 2:
            raise SettingError(f"best_of chooses among draws: candidates must be >= 2, got {candidates}")
        return self._best_of(request, candidates, seed, progress, sampling, keep_draws=True,
                             agreement=check_agreement(agreement, candidates))

    def _best_of(self, request: dict, candidates: int, seed: int | None, progress: bool,
                 sampling: Mapping, accept_confidence: float | None = None, keep_draws: bool = False,
                 agreement: str = AGREEMENT_DEFAULT, accept_agreement: float | None = None):
        """``candidates`` draws of one request, the one whose inputs the model reads back best (``agreement``:
        how) kept; with ``accept_confidence``, the first alone when its confidence score reaches it; with
        ``accept_agreement``, drawn and read one at a time, the first whose score reaches it.
        ``keep_draws``: return (the kept result, every draw) instead of the kept result alone, and read every draw
        in every reading."""
        from unimodal.inference.critique import (AGREEMENT_READINGS, DEFAULT_GROUPS, agreement_score,
                                                 confidence_scores, sample_score)
        from unimodal.refine import draft_of

        if self.autoregressive:
            raise SettingError(TWIN_REFUSALS["candidates"])
        inputs = {m: request[m] for m in MODALITIES if request.get(m) is not None}
        if not inputs:
            raise InputError("candidates > 1 keeps the output that agrees best with the inputs; an unconditional "
                             "request has none (give text, image or audio, or candidates=1)")
        check_draws_differ(candidates, self.draws_differ(request["to"], **sampling))
        seed = fresh_seed() if seed is None else check_seed(seed, error=SettingError)
        requests = [dict(request, seed=derived_seed(seed, k)) for k in range(candidates)]
        if accept_agreement is not None:
            return self._draw_until_agreed(requests, inputs, progress, sampling, agreement, accept_agreement)
        check, checked = {}, 0  # the first draw's confidence score, and its passes
        draws = self.generate_batch(requests if accept_confidence is None else requests[:1], progress=progress,
                                    refine=0, **sampling)
        with self._lock:
            drafts = [draft_of(self, draw, inputs) for draw in draws]  # each draw read with the inputs, once
        if accept_confidence is not None:
            with self._lock:
                scores, checked = confidence_scores(self.backbone, self.layout, drafts[0], DEFAULT_GROUPS)
            confidence = sample_score(scores)
            check = {"confidence": round(confidence, 6), "accept_confidence": accept_confidence}
            if confidence >= accept_confidence:
                first = draws[0]
                first.forward_passes += checked
                first.settings = {**first.settings, "candidates": {"n": candidates, "drawn": 1, "kept": 0,
                                                                   "seeds": [seed], "reading": agreement, **check}}
                return (first, draws) if keep_draws else first
            rest = self.generate_batch(requests[1:], progress=progress, refine=0, **sampling)
            with self._lock:
                drafts += [draft_of(self, draw, inputs) for draw in rest]
            draws += rest
        readings = AGREEMENT_READINGS if keep_draws else (agreement,)
        with self._lock:
            by_reading = {r: [agreement_score(self.backbone, self.layout, draft, reading=r) for draft in drafts]
                          for r in readings}
        read = by_reading[agreement]
        scores = [score for score, _ in read]
        kept = max(range(candidates), key=scores.__getitem__)
        passes = [d.forward_passes for d in draws]  # each draw's own, before the kept one counts them all
        best = draws[kept]
        best.forward_passes = sum(d.forward_passes for d in draws) + sum(calls for _, calls in read) + checked
        best.settings = {**best.settings, "candidates": {"n": candidates, "drawn": candidates, "kept": kept,
                         "seeds": [derived_seed(seed, k) for k in range(candidates)], "agreement": [round(v, 6) for v in scores],
                         "reading": agreement, "draw_passes": passes, **check}}
        if keep_draws:
            best.settings["candidates"]["by_reading"] = {
                r: {"agreement": [round(v, 6) for v, _ in reads], "read_passes": reads[0][1]}
                for r, reads in by_reading.items()}
        return (best, draws) if keep_draws else best

    def _draw_until_agreed(self, requests: Sequence[dict], inputs: dict, progress: bool, sampling: Mapping,
                           agreement: str, accept_agreement: float) -> GenerationResult:
        """Draw ``requests`` (one per seed) one at a time, each read back as it comes; keep the first whose
        agreement score reaches ``accept_agreement`` (the best of all when none does)."""
        from unimodal.inference.critique import agreement_score
        from unimodal.refine import draft_of

        draws, scores, read_passes = [], [], 0
        for request in requests:
            draw = self.generate_batch([request], progress=progress, refine=0, **sampling)[0]
            with self._lock:
                score, calls = agreement_score(self.backbone, self.layout, draft_of(self, draw, inputs),
                                               reading=agreement)
            draws.append(draw)
            scores.append(score)
            read_passes += calls
            if score >= accept_agreement:
                break
        accepted = scores[-1] >= accept_agreement
        kept = len(draws) - 1 if accepted else max(range(len(draws)), key=scores.__getitem__)
        best = draws[kept]
        passes = [d.forward_passes for d in draws]
        best.forward_passes = sum(passes) + read_passes
        best.settings = {**best.settings, "candidates": {
            "n": len(requests), "drawn": len(draws), "kept": kept, "seeds": [r["seed"] for r in requests[:len(draws)]],
            "agreement": [round(v, 6) for v in scores], "reading": agreement, "draw_passes": passes,
            "accept_agreement": accept_agreement, "accepted": accepted}}
        return best

    def default_refine_rounds(self, to: str | Sequence[str] = "image") -> int:
        """The rounds of refine :meth:`generate` runs on a request generating ``to`` when it is given none
        (``refine=None``): 2 for speech alone on a model whose critic head is trained, else 0
        (:func:`unimodal.refine.default_refine_rounds`)."""
        from unimodal.refine import default_refine_rounds

        return default_refine_rounds(self, check_to(to))

    def draws_differ(self, to: str | Sequence[str] = "image", **settings) -> bool:
        """Whether two seeds can give different outputs for a request generating ``to`` with these sampling
        settings (:meth:`generate`'s keywords; None or missing: the defaults for ``to``). False when sampling is
        greedy (temperature 0, no choice noise: the default for text), where ``candidates`` > 1 is refused."""
        settings = {k: v for k, v in settings.items() if k not in ("plan", "rivals", "rephrase")}
        return self._sampler_config(settings, self.scheduler.target_kind(check_to(to))).random

    def generate_batch(self, requests: Sequence[Mapping], progress: bool = False, errors: str = "raise",
                       plan: str = PLAN_DEFAULT, rivals: bool | None = None, rephrase: bool | None = None,
                       refine: int | None = None, **settings) -> list[GenerationResult | UnimodalError]:
        """Many requests in one batched sampler call; one :class:`GenerationResult` per request, in order.

        Each request is a dict with keys among ``text``, ``image``, ``audio`` (inputs), ``to``, ``seed``,
        ``max_text_tokens``, ``max_audio_seconds``; ``settings`` are :meth:`generate`'s sampling keywords,
        shared by all (``plan``, ``rivals``, ``rephrase`` and ``refine`` as there: ``refine=None`` refines each
        request's output as ``generate`` would, one request at a time after the batch). Request ``i`` without its own seed uses
        ``seed + i`` (wrapped below 2**62: :func:`unimodal.core.seeds.derived_seed`), so ``generate_batch`` gives
        what ``generate(seed=seed + i)`` gives one by one. Every request is
        checked and its inputs read before any sampling starts. ``errors="raise"`` (default): the first bad request raises
        its error; ``"return"``: a bad request's place in the list holds its error (a :class:`UnimodalError`) and
        the others their results, the same results they would get without it.
        """
        if errors not in ("raise", "return"):
            raise InputError(f"errors must be 'raise' or 'return', got {errors!r}")
        check_plan(plan)
        if refine is not None:
            check_refine_rounds(refine)
            if self.autoregressive and twin_refuses({"refine": refine}):
                raise SettingError(TWIN_REFUSALS["refine"])
        check, say = resolve_rivals(rivals, self.autoregressive), resolve_rephrase(rephrase)
        if isinstance(requests, Mapping) or not isinstance(requests, Sequence) or not requests:
            raise InputError("generate_batch takes a non-empty list of request dicts, e.g. "
                             "[{'text': 'a red circle', 'to': 'image'}]")
        self._sampler_config(settings)  # validates the settings before any input is read
        if "seed" in settings and settings["seed"] is None:  # a fresh seed, drawn once: a planned request's two
            settings = {**settings, "seed": fresh_seed()}  # stages share it, so the reported seed reruns both
        with self._lock:
            prepared = self._encode_inputs(self._prepare_all(requests, errors == "raise"), errors == "raise")
            ready = [item for item in prepared if isinstance(item, _Prepared)]
            results: list = list(prepared)  # errors stay in their place
            staged = [item for item in ready if plan != "none" and _plans_in_text(item)]
            stages = [item.text_stage(self.layout.target_segment("text")) for item in staged]
            plan_settings = {"seed": settings.get("seed", 0)}  # text's own defaults: the settings are the outputs'
            texts = dict(zip((item.index for item in staged), self._sample_prepared(stages, plan_settings, progress)))
            # a plan read from a picture is checked before anything is made from it
            texts = {item.index: self._rival_checked(item, texts[item.index], check) for item in staged}
            # and the words speech is made from, when no output, said in the form the model speaks best
            texts = {item.index: self._rephrased(item, texts[item.index], say) for item in staged}
            for item in staged:
                self._take_text(item, texts[item.index], alone=plan == "text-only")
            # plan "text-only": each output its own request, from the words alone (a trained text->X task)
            parts = {item.index: item.split() if item.index in texts and plan == "text-only" else [item]
                     for item in ready}
            sampled = iter(self._sample_prepared([p for item in ready for p in parts[item.index]], settings, progress))
            for item in ready:
                result = _merged([next(sampled) for _ in parts[item.index]])
                text = texts.get(item.index)
                if text is None and item.targets == ["text"]:  # a caption, made alone
                    result = self._rival_checked(item, result, check)
                results[item.index] = result if text is None else _joined(item, text, result, plan)
        return self._refined_all(requests, results, refine)

    def _refined_all(self, requests: Sequence[Mapping], results: list, refine: int | None) -> list:
        """``generate_batch``'s results, each refined as ``generate(refine=refine)`` refines it (None: the
        default for its outputs, :meth:`default_refine_rounds`); errors left in their place."""
        for index, (spec, result) in enumerate(zip(requests, results)):
            if isinstance(result, UnimodalError):
                continue
            rounds = self.default_refine_rounds(spec.get("to", "image")) if refine is None else refine
            if rounds:
                inputs = {m: spec[m] for m in MODALITIES if spec.get(m) is not None}
                results[index], _ = self.refine(result, **inputs, rounds=rounds,
                                                seed=result.settings.get("seed") or 0)
        return results

    def _sample_prepared(self, ready: list["_Prepared"], settings: Mapping, progress: bool) -> list[GenerationResult]:
        """A result for each prepared request, in order: requests that can share a sampler call share one."""
        results: dict[int, GenerationResult] = {}
        for (kind, steps, free_text), group in self._groups(ready, settings).items():
            own = self._free_text_settings(settings) if free_text else settings
            config = dataclasses.replace(self._sampler_config(own, kind), steps=steps)
            for item, result in zip(group, self._decode(group, config, progress)):
                results[id(item)] = result
        return [results[id(item)] for item in ready]

    def _rival_checked(self, item: "_Prepared", caption: GenerationResult, check: bool) -> GenerationResult:
        """``caption`` checked against its rival (:func:`unimodal.rivals.rival_checked`) when ``check`` and it was
        read from a picture, its ``settings["rivals"]`` saying whether; as it is when it was not read from one."""
        if not rivals_apply(item.conditions):
            return caption
        caption = dataclasses.replace(caption, settings={**caption.settings, "rivals": check})
        return rival_checked(self, item.conditions, caption) if check else caption

    def _rephrased(self, item: "_Prepared", plan: GenerationResult, say: bool) -> GenerationResult:
        """The plan in words of a request that speaks it without showing it (:func:`unimodal.phrasing.applies`) in
        the spoken form when ``say`` (its ``settings["rephrase"]`` saying whether); any other plan as it is."""
        if not phrasing_applies(item.targets, "text" in item.targets):
            return plan
        plan = dataclasses.replace(plan, settings={**plan.settings, "rephrase": say})
        return rephrased(self, plan) if say else plan

    def _take_text(self, item: "_Prepared", text: GenerationResult, alone: bool = False) -> None:
        """The second stage of a planned request: the text becomes a condition (its own ids; ``alone``: the only
        one, the inputs it was read from set aside), and leaves the targets when it was one."""
        item.text_was_target = "text" in item.targets
        item.targets = [m for m in item.targets if m != "text"]
        item.target_segments = [s for s in item.target_segments if s.modality != "text"]
        if text.text and text.text.strip():  # an empty text conditions nothing (and sets no input aside)
            words = torch.tensor(text.token_ids["text"], dtype=torch.long)
            item.conditions = {"text": words} if alone else {**item.conditions, "text": words}

    def _prepare_all(self, requests: Sequence, raise_errors: bool) -> list:
        """Each request checked and its inputs read (files, tokens), or, when not raising, its error."""
        prepared = []
        for index, spec in enumerate(requests):
            try:
                item = self._prepare(spec, index, len(requests) > 1)
                self._read_inputs(item)
            except UnimodalError as error:
                if raise_errors:
                    raise
                item = error
            prepared.append(item)
        return prepared

    def _groups(self, ready: list["_Prepared"], settings: Mapping) -> dict[tuple, list["_Prepared"]]:
        """Requests that can share one sampler call: the same per-target defaults and the same steps after
        capping (so a request gets the same tokens alone or in any batch), text from nothing apart (its own
        order and temperature)."""
        groups: dict[tuple, list[_Prepared]] = {}
        base_seed = settings.get("seed", 0)
        for item in ready:
            if item.seed is None and base_seed is not None:
                item.seed = derived_seed(base_seed, item.index)  # as one call would give it, whatever the grouping
            kind = self.scheduler.target_kind(item.targets)
            free_text = kind == "text" and not item.conditions
            own = self._free_text_settings(settings) if free_text else settings
            steps = self._capped_steps(item, self._sampler_config(own, kind), settings.get("steps") is not None)
            groups.setdefault((kind, steps, free_text), []).append(item)
        return groups

    def _free_text_settings(self, settings: Mapping) -> dict:
        """The settings of text from nothing: the caller's over the scheduler's ``unconditional_text`` (the
        autoregressive twin writes one token a step whatever the order: its own defaults alone)."""
        if self.autoregressive:
            return dict(settings)
        return self.scheduler.unconditional_text_settings(settings)

    def _capped_steps(self, item: "_Prepared", config: SamplerConfig, asked: bool) -> int:
        """``config.steps``, or the most steps that can each commit a token when there are more (the sampler
        would skip the rest), so ``result.settings`` says what ran. Steps the caller ``asked`` for are capped
        with a warning; a default (32 steps for a caption of 13 slots) quietly."""
        if self.autoregressive:
            return config.steps  # ignored by the twin, one token per call
        slots = sum(self.layout.max_content_len("image") if segment.modality == "image" else segment.slots
                    for segment in item.target_segments)  # the masked slots: an image's END is fixed
        limit = min(slots, config.block_length) if config.mode == "semi_ar" else slots
        if config.steps <= limit or not asked:
            return min(config.steps, limit)
        slots_kind = "slots of a block" if config.mode == "semi_ar" else "slots to fill"
        message = (f"{item.where}steps={config.steps} is more than the {limit} {slots_kind}; capped to {limit} "
                   f"(result.settings['steps']; result.steps counts the model calls made)")
        warnings.warn(message, StepsCappedWarning, stacklevel=5)
        item.notes.append(message)
        item.steps_requested = config.steps
        return limit

    def _decode(self, prepared: list["_Prepared"], config: SamplerConfig, progress: bool) -> list[GenerationResult]:
        decode = generate_autoregressive if self.autoregressive else sample
        model = _Stepping(self.backbone, progress, None if len(prepared) > 1 or config.mode == "semi_ar"
                          or self.autoregressive else config.steps)
        try:
            samples = decode(model, self.layout, [item.request() for item in prepared], config)
            model.finish()
        finally:
            model.close()
        return self._results(prepared, samples, config)

    # ---- settings and requests ------------------------------------------------------------------------------

    def _sampler_config(self, settings: Mapping, targets: str | None = None) -> SamplerConfig:
        unknown = sorted(set(settings) - set(SAMPLER_SETTINGS))
        if unknown:
            raise SettingError(f"unknown setting(s) {unknown}; accepted: {', '.join(SAMPLER_SETTINGS)}")
        seed = check_seed(settings.get("seed", 0), error=SettingError)
        values = {k: v for k, v in settings.items() if k != "seed" and v is not None}
        try:
            defaults = self.scheduler.target_defaults(targets)
            if self.autoregressive:  # the twin decodes one token per step, unguided: only these apply
                defaults = {k: v for k, v in defaults.items() if k in TWIN_SETTINGS}
            config = self.scheduler.sampler_config(**{**defaults, **values})
        except InputError as error:  # name the argument as the caller wrote it
            raise SettingError(str(error).replace("SamplerConfig.", "")) from None
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
        item = _Prepared(index, where, targets=check_to(spec.get("to", "image"), where))
        item.inputs = self._raw_inputs(spec, where)
        self._check_directions(item, where)
        item.seed = check_seed(spec.get("seed"), f"{where}seed")
        item.target_segments = [self._target_segment(m, spec, where) for m in item.targets]
        return item

    def _raw_inputs(self, spec: Mapping, where: str) -> dict:
        inputs = {m: spec.get(m) for m in MODALITIES if spec.get(m) is not None}
        text = inputs.get("text")
        if isinstance(text, str) and not text.strip():
            if len(inputs) == 1:
                raise EmptyInputError(f"{where}text is empty and there is no other input; give a non-empty prompt, "
                                 f"an image or audio, or no input at all for unconditional generation")
            del inputs["text"]  # an empty prompt beside another input means no prompt
        return inputs

    def _check_directions(self, item: "_Prepared", where: str) -> None:
        check_not_both(item.inputs, item.targets, where)
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

    def _read_inputs(self, item: "_Prepared") -> None:
        """Each input checked and read into what its codec encodes: a string, a uint8 image at the codec's size,
        a 16 kHz mono wave."""
        for modality, value in item.inputs.items():
            name = _name(item, modality)
            if modality == "text":
                item.native["text"] = as_text(value, name)
                self._warn_unknown_words(item, item.native["text"])
            elif modality == "image":
                item.native["image"] = as_image(value, self.image_codec.image_size, name)
            elif modality == "audio":
                item.native["audio"] = as_audio(value, name=name)
            else:
                raise InputError(f"{name}: the pipeline has no reader for {modality} inputs")

    def _warn_unknown_words(self, item: "_Prepared", text: str) -> None:
        """Warn (and note in the result) when a model that knows its training vocabulary gets other words:
        the shipped model draws "a white hexagon" as some colour and shape it knows."""
        vocabulary = self.config.vocabulary
        unknown = unknown_words(text, vocabulary["words"]) if vocabulary else []
        if not unknown:
            return
        known = "; ".join(f"{kind} {', '.join(vocabulary[kind])}" for kind in
                          ("colors", "shapes", "sizes", "positions", "relations", "digits") if vocabulary.get(kind))
        message = (f"{_name(item, 'text')} uses words this model never saw in training: "
                   f"{', '.join(map(repr, unknown))}; expect them to be ignored or drawn as something else. "
                   f"It knows {known}")
        warnings.warn(message, UnknownWordsWarning, stacklevel=5)
        item.notes.append(message)

    def _encode_inputs(self, prepared: list, raise_errors: bool = True) -> list:
        """The read inputs encoded, each modality in one call to its registered codec, then fitted to the
        layout. ``prepared`` may hold errors (kept in place); a request whose input does not fit becomes its
        error, or raises it when ``raise_errors``."""
        ready = [item for item in prepared if isinstance(item, _Prepared)]
        for modality, codec in self.codecs.items():
            having = [item for item in ready if modality in item.native]
            if having:
                for item, ids in zip(having, codec.encode([item.native[modality] for item in having])):
                    item.conditions[modality] = torch.as_tensor(ids).cpu()
        return [self._fitted(item, raise_errors) if isinstance(item, _Prepared) else item for item in prepared]

    def _fitted(self, item: "_Prepared", raise_errors: bool):
        """``item`` with each condition within the layout's length, or its error. A prompt too long is refused
        (cutting it changes what it asks for); audio too long is cut, as training cut it."""
        try:
            for modality, ids in item.conditions.items():
                longest = self.layout.max_content_len(modality)
                if len(ids) <= longest:
                    continue
                if modality == "text":
                    raise InputError(f"{_name(item, 'text')} is {len(ids)} tokens; this model reads at most "
                                     f"{longest}. Shorten the prompt")
                self._cut_condition(item, modality, longest)
        except UnimodalError as error:
            if raise_errors:
                raise
            return error
        return item

    def _cut_condition(self, item: "_Prepared", modality: str, longest: int) -> None:
        layout = self.layout
        if modality == "audio":
            warnings.warn(f"{_name(item, 'audio')} is {len(item.conditions['audio']) / layout.audio_frame_rate:.1f} "
                          f"s; the model reads its first {longest / layout.audio_frame_rate:.1f} s")
        item.notes.append(f"{modality} input cut to its first {longest} codes")
        item.conditions[modality] = item.conditions[modality][:longest]

    # ---- results --------------------------------------------------------------------------------------------

    def _results(self, prepared: list["_Prepared"], samples: list[SampleResult],
                 config: SamplerConfig) -> list[GenerationResult]:
        tokens = [_capped(item, result.tokens) for item, result in zip(prepared, samples)]
        outputs = self._decoded(tokens)
        results = []
        for index, (item, result) in enumerate(zip(prepared, samples)):
            confidence = result.confidence
            results.append(GenerationResult(
                **{modality: outputs[modality].get(index) for modality in self.codecs},
                sample_rate=self.audio_codec.sample_rate,
                token_ids={m: ids.tolist() for m, ids in tokens[index].items()},
                confidence={m: [float(c) for c in confidence[m][:len(ids)]] for m, ids in tokens[index].items()},
                forward_passes=result.forward_passes, steps=result.steps,
                settings=_settings(config, item, result, self.autoregressive)))
        return results

    def _decoded(self, tokens: list[dict[str, torch.Tensor]]) -> dict[str, dict[int, object]]:
        """Modality -> {sample index: output}: each modality's tokens decoded in one call to its codec; images
        as PIL images."""
        outputs: dict[str, dict[int, object]] = {}
        for modality, codec in self.codecs.items():
            rows = [index for index, sample in enumerate(tokens) if modality in sample]
            decoded = codec.decode([tokens[index][modality] for index in rows]) if rows else []
            public = Image.fromarray if modality == "image" else (lambda output: output)
            outputs[modality] = {index: public(output) for index, output in zip(rows, decoded)}
        return outputs

    # ---- self-critique: the loop lives in inference/critique.py and inference/refine.py ----------------------

    def critique(self, result, **kwargs):
        """Per-token scores, flagged regions (native units) and a heat map; see :func:`unimodal.refine.critique`."""
        from unimodal.refine import critique

        return critique(self, result, **kwargs)

    def refine(self, result, repair: bool = False, **kwargs):
        """Re-mask flagged regions and regenerate them: (result, trace); see :func:`unimodal.refine.refine`.
        ``repair=True`` (a picture): first read it back and change each colour, size or place the reading gets
        otherwise than the request by an instructed edit from the object's own pixels (the trace's ``repair``),
        then ``rounds`` rounds of refine (0 by default with ``repair``: the repair alone measured best);
        see :func:`unimodal.repair.refine_with_repair`."""
        if check_repair_setting(repair):
            from unimodal.repair import refine_with_repair

            return refine_with_repair(self, result, **kwargs)
        from unimodal.refine import refine

        return refine(self, result, **kwargs)

    def edit(self, content, region=None, instruction: str | None = None, **kwargs):
        """Described: regenerate ``region`` of ``content`` from a new description (``text=``); the edited result,
        see :func:`unimodal.refine.edit`. Instructed (``instruction="make the circle blue"``): plan, execute and
        check the edit; (the edited result, its trace), see :func:`unimodal.instructed.instructed_edit`."""
        if instruction is not None:
            from unimodal.instructed import instructed_edit

            return instructed_edit(self, content, instruction, region=region, **kwargs)
        if region is None:
            raise InputError("edit needs region= (a box, seconds or chars, with text= the new description) or "
                             "instruction= (e.g. 'make the circle blue')")
        # an instructed edit's keyword given a value is refused by name, before the content is read (not as an
        # unknown sampler setting); given None (its default, as a wrapper passing every keyword does) it is dropped
        instructed_only = sorted(key for key in set(kwargs) & INSTRUCTED_ONLY if kwargs[key] is not None)
        if instructed_only:
            raise InputError(f"{', '.join(instructed_only)} belong{'s' if len(instructed_only) == 1 else ''} to an "
                             f"instructed edit (instruction=...); a described edit (region= and text=) takes the "
                             f"region, the new description and sampler settings")
        kwargs = {key: value for key, value in kwargs.items() if key not in INSTRUCTED_ONLY}
        from unimodal.refine import edit

        return edit(self, content, region, **kwargs)


# ---- helpers ------------------------------------------------------------------------------------------------


class _Prepared:
    """One request as it is checked and encoded."""

    def __init__(self, index: int, where: str, targets: list[str]):
        self.index, self.where, self.targets = index, where, targets
        self.text_was_target = False  # a planned request: whether its text stage wrote one of its outputs
        self.inputs: dict = {}
        self.conditions: dict[str, torch.Tensor] = {}
        self.target_segments: list = []
        self.seed: int | None = None
        self.notes: list[str] = []
        self.native: dict[str, object] = {}  # each input as read, what its codec encodes
        self.steps_requested: int | None = None  # set when steps were capped

    def request(self) -> Request:
        conditions = [(m, self.conditions[m]) for m in MODALITIES if m in self.conditions]
        return Request(conditions, self.target_segments, seed=self.seed)

    def split(self) -> list["_Prepared"]:
        """One request per target segment, with the same conditions and seed (plan "text-only")."""
        parts = []
        for segment in self.target_segments:
            part = self._derived([segment])
            part.notes, part.steps_requested = list(self.notes), self.steps_requested
            parts.append(part)
        return parts or [self]

    def text_stage(self, full_text) -> "_Prepared":
        """The first stage of a planned request: its text alone (its own text target, else ``full_text``, a
        whole text segment), from the same inputs and seed."""
        return self._derived([s for s in self.target_segments if s.modality == "text"] or [full_text])

    def _derived(self, segments) -> "_Prepared":
        """A request of these target segments with this one's inputs, conditions and seed."""
        derived = _Prepared(self.index, self.where, [s.modality for s in segments])
        derived.inputs, derived.conditions, derived.native = self.inputs, dict(self.conditions), self.native
        derived.target_segments, derived.seed = list(segments), self.seed
        return derived


def _plans_in_text(item: _Prepared) -> bool:
    """Whether a request has a plan in words to write: no text input, and more to generate than text alone."""
    return "text" not in item.conditions and item.targets != ["text"]


def _summed(parts: Sequence[GenerationResult]) -> dict:
    """The settings that add up over a request's loops, in the order they ran: ``commits_per_step`` one loop after
    the other, ``guidance_passes`` added, ``notes`` joined (absent when none)."""
    summed = {"commits_per_step": [c for part in parts for c in part.settings["commits_per_step"]],
              "guidance_passes": sum(part.settings["guidance_passes"] for part in parts)}
    notes = [note for part in parts for note in part.settings.get("notes", [])]
    if notes:
        summed["notes"] = notes
    return summed


def _merged(parts: Sequence[GenerationResult]) -> GenerationResult:
    """One result from the outputs of a request sampled one output at a time: their outputs and tokens, costs
    added (``commits_per_step`` one after the other), the settings of the first (its output's defaults)."""
    if len(parts) == 1:
        return parts[0]
    first, token_ids, confidence = parts[0], {}, {}
    for part in parts:
        token_ids.update(part.token_ids)
        confidence.update(part.confidence)
    settings = {**first.settings, **_summed(parts), "to": [m for m in MODALITIES if m in token_ids]}
    pick = lambda name: next((getattr(p, name) for p in parts if getattr(p, name) is not None), None)  # noqa: E731
    return dataclasses.replace(first, text=pick("text"), image=pick("image"), audio=pick("audio"),
                               token_ids={m: token_ids[m] for m in MODALITIES if m in token_ids},
                               confidence={m: confidence[m] for m in MODALITIES if m in confidence},
                               forward_passes=sum(p.forward_passes for p in parts), steps=sum(p.steps for p in parts),
                               settings=settings)


def _joined(item: _Prepared, text: GenerationResult, rest: GenerationResult, plan: str = "text") -> GenerationResult:
    """One result from a planned request's two stages: the rest's outputs, and the text stage's text when it was
    an output; costs added (``commits_per_step``: the text stage's steps, then the rest's; ``guidance_passes`` of
    both); the settings of the second stage (the defaults of its first output) with what the text stage used."""
    settings = dict(rest.settings)
    stage = {k: text.settings.get(k) for k in (*TOKEN_SETTINGS, "guidance_passes", "rivals", "rival_check",
                                               "rephrase", "rephrased")
             if k in text.settings}
    settings.update(_summed([text, rest]), inputs=[m for m in MODALITIES if m in item.inputs], plan=plan,
                    text_stage=stage | {"forward_passes": text.forward_passes, "model_calls": text.steps, "text": text.text,
                                        "token_ids": text.token_ids["text"],
                                        "conditioned": bool(text.text and text.text.strip())})
    if item.text_was_target:
        settings["to"] = [m for m in MODALITIES if m in ("text", *rest.token_ids)]
    joined = dataclasses.replace(rest, forward_passes=text.forward_passes + rest.forward_passes,
                                 steps=text.steps + rest.steps, settings=settings)
    if item.text_was_target:
        joined = dataclasses.replace(joined, text=text.text, token_ids={"text": text.token_ids["text"], **rest.token_ids},
                                     confidence={"text": text.confidence["text"], **rest.confidence})
    return joined


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

    def finish(self) -> None:
        """The work is done: a bar that counted fewer model calls than its total (threshold decoding stops as
        soon as every slot is committed; a step that would commit nothing is skipped) ends full, at n/n."""
        if self._bar.total != self._bar.n:
            self._bar.total = self._bar.n
            self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


def _capped(item: _Prepared, tokens: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Text/audio content cut to the cap asked for: a target of n slots leaves its last one for END, but a
    model may fill every slot with content (an untrained one does)."""
    caps = {segment.modality: segment.slots - 1 for segment in item.target_segments if segment.modality != "image"}
    return {m: ids[:caps[m]] if m in caps else ids for m, ids in tokens.items()}


def _name(item: _Prepared, modality: str) -> str:
    return f"{item.where}{modality}"


def _checked_number(name: str, value, where: str, integer: bool = False):
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
        raise InputError(f"{where}{name} must be {'an int' if integer else 'a number'}, got {value!r}")
    return value


def _settings(config: SamplerConfig, item: _Prepared, result: SampleResult, autoregressive: bool = False) -> dict:
    if autoregressive:
        settings = {"decoding": "autoregressive", **{name: getattr(config, name) for name in TWIN_SETTINGS}}
    else:
        settings = {name: getattr(config, name) for name in TOKEN_SETTINGS}
    settings.update(seed=result.seed, guidance_passes=result.guidance_passes, to=list(item.targets),
                    inputs=[m for m in MODALITIES if m in item.conditions],
                    commits_per_step=list(result.commits_per_step))
    settings["plan"] = "none"  # a planned request's two stages are joined with plan "text"
    if item.steps_requested is not None:
        settings["steps_requested"] = item.steps_requested
    if item.notes:
        settings["notes"] = list(item.notes)
    return settings


def _vocabulary(folder: Path) -> dict | None:
    path = folder / VOCABULARY_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _training_task_weights(folder: Path) -> dict | None:
    path = folder / TRAINING_CONFIG
    if not path.is_file():
        return None
    try:
        weights = json.loads(path.read_text()).get("task_weights")
    except (json.JSONDecodeError, AttributeError) as error:
        raise DataError(f"{path} is not a valid training config: {error}") from error
    return {str(k): float(v) for k, v in weights.items()} if isinstance(weights, Mapping) else None


def _critic_trained(folder: Path) -> bool:
    """Whether the run that wrote these weights trained the critic head (``critic_trained`` in
    training_config.json; folders from before the critic objective have none: never trained)."""
    path = folder / TRAINING_CONFIG
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("critic_trained") is True
    except (json.JSONDecodeError, AttributeError) as error:
        raise DataError(f"{path} is not a valid training config: {error}") from error


__all__ = ["UniModal"]
