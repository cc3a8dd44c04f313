"""Train the audio codec (``tokenizers_mm.audio``) from scratch on phonetically diverse eSpeak speech.

Why not captions alone: a codec trained only on the caption grammar memorises its few hundred words and
garbles everything else (measured: Whisper WER ~1.0 on ordinary sentences). The training pool mixes Faker
English sentences and paragraphs, lines of random frequent English words (wordfreq) and random scene/digit
captions drawn from the grammar (never the built test split), each spoken by a random eSpeak voice.

The pool (``pool_size`` clips, a pure function of the seed) is synthesised once and cached as log-mel in the
run folder; every batch is then a pure function of (seed, step): random clips, random crops of
``crop_frames`` mel frames, short clips padded with digital silence (which maps to the silence code).

Two phases, as for the image codec: encoder, codebook and decoder together, then for the last
``decoder_finetune_fraction`` of the steps only the decoder, on frozen codes.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from tokenizers_mm.audio import AudioCodec, AudioVQModel, MelFrontend, pad_frames, trim_silence
from training.checkpoint import load_checkpoint, save_atomic
from unimodal.errors import DataError

DEFAULT_MODEL = dict(encoder_channels=192, decoder_channels=256, dilations=(1, 3), num_down=2, embed_dim=16,
                     num_codes=512)
EVAL_SENTENCE_SEED = 987_654  # Faker seed of the unseen ordinary sentences in evaluate_audio_codec


@dataclass
class AudioCodecTrainConfig:
    steps: int = 2000
    batch_size: int = 32
    lr: float = 1e-3
    warmup: int = 200
    decoder_finetune_fraction: float = 0.2
    crop_frames: int = 160  # 2.56 s of mel frames (62.5 per second); a multiple of the codec's 4
    pool_size: int = 4000
    mix: tuple[float, float, float] = (0.45, 0.25, 0.30)  # Faker text, wordfreq word lines, grammar captions
    seed: int = 0
    checkpoint_every: int = 200
    bf16: bool = True  # measured on the CPU: 2x faster than float32 for this model
    model: dict = field(default_factory=lambda: dict(DEFAULT_MODEL))


# ------------------------------------------------------------------------------------------------ training data

def _grammar_caption(rng: np.random.Generator) -> str:
    from training.data.scenes import sample_attributes
    from unimodal import grammar

    if rng.random() < 0.15:
        return grammar.digit_caption(int(rng.integers(10)), int(rng.integers(len(grammar.DIGIT_TEMPLATES))))
    attrs = sample_attributes(rng, heldout=bool(rng.random() < 0.1))
    return grammar.scene_caption(attrs, int(rng.integers(100)))


def pool_texts(cfg: AudioCodecTrainConfig) -> list[str]:
    """The ``pool_size`` training texts: a pure function of the seed."""
    from tokenizers_mm.text import faker_corpus
    from wordfreq import top_n_list

    rng = np.random.default_rng([cfg.seed, 1])
    kinds = rng.choice(3, size=cfg.pool_size, p=np.asarray(cfg.mix) / sum(cfg.mix))
    faker = iter(faker_corpus(int((kinds == 0).sum()), seed=cfg.seed + 1))
    words = top_n_list("en", 20_000)
    texts = []
    for kind in kinds:
        if kind == 0:
            texts.append(next(faker))
        elif kind == 1:
            texts.append(" ".join(words[i] for i in rng.integers(len(words), size=int(rng.integers(3, 13)))))
        else:
            texts.append(_grammar_caption(rng))
    return texts


def build_pool(cfg: AudioCodecTrainConfig, frontend: MelFrontend, silence_log_mel: float,
               progress: bool = True) -> list[torch.Tensor]:
    """Speak every pool text with a random voice -> trimmed log-mel (n_mels, T) float16 tensors."""
    from training.data.speech import Voice, synthesize
    from unimodal.errors import SpeechSynthesisError

    pool = []
    for i, text in enumerate(tqdm(pool_texts(cfg), desc="speaking the pool", disable=not progress, mininterval=10)):
        try:
            wave = synthesize(text, Voice.random(np.random.default_rng([cfg.seed, 2, i])))
        except SpeechSynthesisError:
            continue  # eSpeak said nothing for this text (e.g. only symbols)
        log_mel = trim_silence(frontend.log_mel(torch.from_numpy(wave)), silence_log_mel)
        pool.append(log_mel.half())
    if not pool:
        raise DataError("eSpeak produced no training speech")
    return pool


def load_or_build_pool(cfg: AudioCodecTrainConfig, model: AudioVQModel, path: Path, progress: bool):
    if path.exists():
        state = load_checkpoint(path)
        if state["key"] == [cfg.seed, cfg.pool_size, list(cfg.mix)]:
            return state["pool"]
    pool = build_pool(cfg, model.frontend(), model.config.silence_log_mel, progress)
    save_atomic({"key": [cfg.seed, cfg.pool_size, list(cfg.mix)], "pool": pool}, path)
    return pool


def training_batch(cfg: AudioCodecTrainConfig, step: int, pool: list[torch.Tensor]) -> torch.Tensor:
    """(B, n_mels, crop_frames) float32 log-mel: random crops of random pool clips, padded with silence."""
    rng = np.random.default_rng([cfg.seed, step])
    crops = []
    for index in rng.integers(len(pool), size=cfg.batch_size):
        clip = pool[index]
        start = int(rng.integers(max(1, clip.shape[1] - cfg.crop_frames + 1)))
        crop = clip[:, start:start + cfg.crop_frames].float()
        crops.append(F.pad(crop, (0, cfg.crop_frames - crop.shape[1]), value=math.log(1e-5)))
    return torch.stack(crops)


# ----------------------------------------------------------------------------------------------------- training

def _lr(cfg: AudioCodecTrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _freeze_codes(model: AudioVQModel) -> None:
    """Phase 2: only the decoder keeps training."""
    for module in (model.encoder, model.quantize):
        module.requires_grad_(False)
        module.eval()


def train_audio_codec(out_dir: str | Path, cfg: AudioCodecTrainConfig | None = None, resume: bool = False,
                      progress: bool = True) -> AudioCodec:
    out_dir = Path(out_dir)
    ckpt_path = out_dir / "checkpoint.pt"
    if resume and ckpt_path.exists():
        state = load_checkpoint(ckpt_path)
        cfg = AudioCodecTrainConfig(**state["config"])
    else:
        cfg, state = cfg or AudioCodecTrainConfig(), None
    torch.manual_seed(cfg.seed)
    model = AudioVQModel(**cfg.model)
    pool = load_or_build_pool(cfg, model, out_dir / "pool.pt", progress)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    finetune_from = int(cfg.steps * (1 - cfg.decoder_finetune_fraction))
    model.train()
    if start >= finetune_from:
        _freeze_codes(model)
    bar = tqdm(range(start, cfg.steps), desc="audio codec", disable=not progress, initial=start, total=cfg.steps,
               mininterval=15)
    for step in bar:
        if step == finetune_from:
            _freeze_codes(model)
        for group in optimizer.param_groups:
            group["lr"] = _lr(cfg, step)
        log_mel = training_batch(cfg, step, pool)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            recon, commit_loss, _ = model.reconstruct(log_mel)
        target, recon = model.normalize(log_mel), recon.float()
        l1 = F.l1_loss(recon, target)
        loss = l1 + F.mse_loss(recon, target) + commit_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.4f}", l1_db=f"{l1.item() * model.config.mel_std * 4.343:.2f}",
                        alive=f"{model.quantize.usage():.2f}",
                        sec_s=f"{log_mel.shape[0] * log_mel.shape[2] / 62.5 / (time.perf_counter() - t0):.0f}")
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            save_atomic({"config": asdict(cfg), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "step": step + 1}, ckpt_path)
    codec = AudioCodec(model.eval())
    codec.save_pretrained(out_dir / "codec")
    return codec


# --------------------------------------------------------------------------------------------------- evaluation

def unseen_sentences(n: int) -> list[str]:
    """``n`` ordinary English sentences the codec never heard (Faker with a seed no training run uses)."""
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(EVAL_SENTENCE_SEED)
    return [fake.sentence(nb_words=int(8 + i % 5)) for i in range(n)]


def _speak_all(texts: list[str], seed: int) -> list[np.ndarray]:
    from training.data.speech import Voice, synthesize

    return [synthesize(t, Voice.random(np.random.default_rng([seed, i]))) for i, t in enumerate(texts)]


def _test_captions(n: int, data: str | Path | None) -> tuple[list[str], list[np.ndarray]]:
    from training.data import BuiltDataset
    from unimodal.paths import data_dir

    folder = Path(data) if data else data_dir("scenes", 2000, 0)
    if not folder.is_dir():
        raise DataError(f"no built scenes data at {folder}; run `unimodal data build scenes --n 2000` first")
    split = BuiltDataset(folder, "test")
    samples = [split[i] for i in range(min(n, len(split)))]
    return [s.text for s in samples], [np.asarray(s.audio, np.float32) for s in samples]


def _wer_rows(judge, texts: list[str], versions: dict[str, list[np.ndarray]]) -> dict:
    from inference.judges import word_error_rate

    rows = {}
    for name, clips in versions.items():
        hyps = judge.transcribe_many(clips)
        rows[name] = {"wer": round(word_error_rate(texts, hyps), 4), "examples": hyps[:3]}
    return rows


def _write_wavs(out: Path, kind: str, versions: dict[str, list[np.ndarray]], count: int = 3) -> None:
    import soundfile

    for name, clips in versions.items():
        for i, clip in enumerate(clips[:count]):
            soundfile.write(out / f"{kind}-{i}-{name}.wav", clip, 16_000)


def evaluate_audio_codec(codec_dir: str | Path, n: int = 300, out: str | Path | None = None,
                         data: str | Path | None = None) -> dict:
    """Whisper WER of original / Griffin-Lim alone / codec on ``n`` test captions and ``n`` unseen sentences,
    codes per second and codebook usage; writes ``report.json`` and a few WAVs to ``out`` when given."""
    from inference.judges import SpeechJudge

    codec = AudioCodec.from_pretrained(codec_dir)
    judge = SpeechJudge()
    sets = {"test_captions": _test_captions(n, data)}
    sentences = unseen_sentences(n)
    sets["unseen_sentences"] = (sentences, _speak_all(sentences, EVAL_SENTENCE_SEED))
    report = {"codec": str(codec_dir), "n": n, "frame_rate": codec.frame_rate, "codebook_size": codec.codebook_size}
    all_codes, seconds = [], 0.0
    for kind, (texts, originals) in sets.items():
        codes = codec.encode(originals)
        all_codes += codes
        seconds += sum(len(a) for a in originals) / codec.sample_rate
        versions = {"original": originals, "griffin_lim": codec.griffin_lim_only(originals),
                    "codec": codec.decode(codes)}
        report[kind] = _wer_rows(judge, texts, versions)
        if out is not None:
            Path(out).mkdir(parents=True, exist_ok=True)
            _write_wavs(Path(out), kind, versions)
    used = torch.cat(all_codes).unique()
    report["codes_per_second"] = round(sum(len(c) for c in all_codes) / seconds, 2)
    report["codebook_usage"] = round(len(used) / codec.codebook_size, 4)
    report["targets"] = {
        "captions_codec_le_original_plus_0.10": report["test_captions"]["codec"]["wer"]
        <= report["test_captions"]["original"]["wer"] + 0.10,
        "sentences_codec_le_griffin_lim_plus_0.10": report["unseen_sentences"]["codec"]["wer"]
        <= report["unseen_sentences"]["griffin_lim"]["wer"] + 0.10}
    if out is not None:
        (Path(out) / "report.json").write_text(json.dumps(report, indent=2))
    return report
