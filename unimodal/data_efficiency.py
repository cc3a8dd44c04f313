"""Data efficiency under repetition: masked diffusion vs its autoregressive twin on a small, repeated subset.

``unimodal bench data-efficiency`` trains both objectives on the same first ``subset`` training samples for
many epochs (same backbone preset, batch, learning rate and task mixture), keeps the EMA model at each epoch
milestone (1, 2, 4, ... epochs) and the held-out (validation) loss at every epoch, then judges every kept
model with ``unimodal eval``'s judges on the same test cases. One run per objective, snapshots along it: a
model "after 4 epochs" is the 4-epoch point of a 64-epoch schedule (learning rate still high), which is how
the curves should be read.

Held-out losses are computed on the live weights at every epoch; the judged snapshots are EMA weights
(decay 0.99), the models a user would get.

The two losses are not on one scale (the diffusion loss is an ELBO over masked tokens, the twin's a
next-token cross-entropy), so each is plotted against itself: what matters is whether it keeps falling or
turns up (overfitting). Judged accuracy is on one scale for both.

Every training run and every judged snapshot is cached in the output folder, so a killed job resumes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from unimodal.training.train import OBJECTIVES  # masked diffusion, then its autoregressive twin
from unimodal.core.paths import report_json
from unimodal.core.figures import pyplot, save_figure


@dataclass
class EfficiencyConfig:
    data: str = "scenes"
    subset: int = 1000
    epochs: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    preset: str = "mini"
    batch_size: int = 32
    lr: float = 1e-3
    tasks: dict = field(default_factory=lambda: {"text->image": 1.0, "image->text": 1.0})
    eval_n: int = 64
    eval_steps: int = 16  # diffusion sampler steps (the twin takes one per token)
    seed: int = 0

    def __post_init__(self):
        from unimodal.core.errors import InputError

        for name in ("subset", "batch_size", "eval_n", "eval_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"data efficiency: {name} must be a positive int, got {value!r}")
        if not self.epochs or any(not isinstance(e, int) or e < 1 for e in self.epochs):
            raise InputError(f"data efficiency: epochs must be positive ints, got {self.epochs!r}")

    def steps_at(self, epoch: int) -> int:
        return max(1, round(epoch * self.subset / self.batch_size))

    def epoch_of(self, step: int) -> float:
        return step * self.batch_size / self.subset


def train_both(cfg: EfficiencyConfig, codec_dir: str | Path, out: Path, progress: bool = True) -> dict[str, Path]:
    """One resumable training run per objective; returns each run folder."""
    from unimodal.training.train import TrainConfig, train

    runs = {}
    total = cfg.steps_at(max(cfg.epochs))
    for objective in OBJECTIVES:
        run = out / objective
        train_cfg = TrainConfig(preset=cfg.preset, steps=total, batch_size=cfg.batch_size, lr=cfg.lr,
                                warmup=min(100, total // 10), task_weights=dict(cfg.tasks), objective=objective,
                                train_subset=cfg.subset, snapshots=sorted({cfg.steps_at(e) for e in cfg.epochs}),
                                val_every=cfg.steps_at(1), checkpoint_every=max(1, cfg.steps_at(1)),
                                ema_decay=0.99, seed=cfg.seed)
        if not (run / "model").is_dir():
            train(run, [d for d in cfg.data.split(",") if d], codec_dir, train_cfg, resume=True, progress=progress)
        runs[objective] = run
    return runs


def judge_snapshots(cfg: EfficiencyConfig, runs: dict[str, Path], out: Path, progress: bool = True) -> dict:
    """Judged accuracy of every snapshot (cached in ``out/judged.json``)."""
    from unimodal.inference.evaluate import Judges, evaluate
    from unimodal.eval_cases import load_cases
    from unimodal.pipeline import UniModal

    cache_path = out / "judged.json"
    judged = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    cases, _ = load_cases(cfg.data, "test", cfg.eval_n, speech=False)
    judges = Judges()
    for objective, run in runs.items():
        for epoch in cfg.epochs:
            key = f"{objective}/{epoch}"
            if key in judged:
                continue
            pipe = UniModal.from_pretrained(run / f"model-step{cfg.steps_at(epoch)}")
            settings = {"temperature": 0.0} | ({} if pipe.autoregressive else {"steps": cfg.eval_steps})
            report = evaluate(pipe, cases, list(cfg.tasks), settings, seed=cfg.seed, judges=judges,
                              progress=progress)
            judged[key] = {d: f.get("accuracy") for d, f in report["figures"].items()}
            cache_path.write_text(json.dumps(judged, indent=1))
    return judged


def held_out_losses(cfg: EfficiencyConfig, runs: dict[str, Path]) -> dict:
    """Per objective and task: (epoch, validation loss) at every validation point of the run."""
    curves = {}
    for objective, run in runs.items():
        history = json.loads((run / "history.json").read_text())
        for record in history:
            for task, loss in (record.get("val") or {}).items():
                curves.setdefault(objective, {}).setdefault(task, []).append((cfg.epoch_of(record["step"]), loss))
    return curves


def plot(report: dict, path: Path) -> Path:
    plt = pyplot()

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for objective, style in zip(OBJECTIVES, ("-", "--")):
        for index, (task, points) in enumerate(report["held_out_loss"].get(objective, {}).items()):
            axis = axes[0] if objective == "diffusion" else axes[1]
            axis.plot(*zip(*points), style, color=f"C{index}", label=task)
        for index, task in enumerate(report["config"]["tasks"]):
            points = [(int(key.split("/")[1]), value.get(task)) for key, value in report["judged"].items()
                      if key.startswith(objective + "/") and value.get(task) is not None]
            if points:
                axes[2].plot(*zip(*sorted(points)), style, marker="o", color=f"C{index}", label=f"{objective} {task}")
    titles = ("diffusion: held-out ELBO per token", "AR twin: held-out next-token CE", "judged accuracy (test)")
    for axis, title in zip(axes, titles):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("epochs over the subset")
        axis.set_title(title, fontsize=10)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    axes[2].set_ylim(-0.02, 1.02)
    figure.suptitle(f"{report['config']['subset']} {report['config']['data']} samples repeated, preset "
                    f"{report['config']['preset']}", fontsize=11)
    return save_figure(figure, path)


def run_data_efficiency(cfg: EfficiencyConfig, codec_dir: str | Path, out: str | Path, progress: bool = True) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _claim(out, cfg)
    runs = train_both(cfg, codec_dir, out, progress)
    report = {"config": asdict(cfg), "steps_per_epoch": cfg.steps_at(1),
              "held_out_loss": held_out_losses(cfg, runs), "judged": judge_snapshots(cfg, runs, out, progress)}
    (out / "data_efficiency.json").write_text(report_json(report))
    plot(report, out / "data_efficiency.png")
    return report


def _claim(out: Path, cfg: EfficiencyConfig) -> None:
    """``out/config.json`` records what the cached runs and verdicts in ``out`` belong to; another config is
    refused instead of silently mixing results."""
    from unimodal.core.errors import InputError

    path, mine = out / "config.json", json.loads(json.dumps(asdict(cfg)))
    if path.is_file():
        theirs = json.loads(path.read_text())
        if theirs != mine:
            changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            raise InputError(f"{out} holds a data-efficiency run with other settings ({', '.join(changed)}); "
                             f"use another --out or the same settings")
    else:
        path.write_text(json.dumps(mine, indent=1))


def format_report(report: dict) -> str:
    tasks = list(report["config"]["tasks"])
    lines = [f"{'epochs':>6}  " + "  ".join(f"{o + ' ' + t:>24}" for o in OBJECTIVES for t in tasks)]
    for epoch in report["config"]["epochs"]:
        cells = []
        for objective in OBJECTIVES:
            for task in tasks:
                value = report["judged"].get(f"{objective}/{epoch}", {}).get(task)
                cells.append(f"{'-' if value is None else f'{value:.3f}':>24}")
        lines.append(f"{epoch:>6}  " + "  ".join(cells))
    lines.append("judged accuracy on the test split; held-out losses per epoch in data_efficiency.json / .png")
    return "\n".join(lines)


__all__ = ["EfficiencyConfig", "format_report", "run_data_efficiency"]
