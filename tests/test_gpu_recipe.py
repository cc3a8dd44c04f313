"""The GPU training recipe, end to end on the CPU at toy size, on a machine that has only what a bare GPU
machine has: the project's other dependencies (eSpeak, soundfile, Faker, the judges...) cannot be imported,
extra packages come as wheels from a folder."""

import json
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import run_group

REPO = Path(__file__).resolve().parents[1]
NOT_ON_A_BARE_GPU_MACHINE = ["soundfile", "espeakng_loader", "faker", "wordfreq", "faster_whisper", "jiwer", "mcp"]

BLOCKER = f'''
import sys
BLOCKED = {NOT_ON_A_BARE_GPU_MACHINE!r}
class _NotHere:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(name + " is not on a bare GPU machine")
sys.meta_path.insert(0, _NotHere())
'''


def _dummy_wheel(folder: Path) -> Path:
    """A one-module wheel written by hand (no build tools, no network): stands for the wheels (diffusers...)
    a GPU machine is given."""
    import zipfile

    wheels = folder / "wheels"
    wheels.mkdir()
    info = "gpu_wheel_probe-1.0.dist-info"
    files = {"gpu_wheel_probe/__init__.py": "VALUE = 7\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: gpu-wheel-probe\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(wheels / "gpu_wheel_probe-1.0-py3-none-any.whl", "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return wheels


@pytest.mark.slow
def test_gpu_script_trains_a_model_and_its_twin_from_a_pack_and_returns_at_most_eight_files(tiny_codec_dir, tiny_scenes, tmp_path):
    from unimodal.training.export import export_model
    from unimodal.training.pack import build_pack

    pack = build_pack([str(tiny_scenes)], tiny_codec_dir, tmp_path / "data.pack.safetensors", progress=False)
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "sitecustomize.py").write_text(BLOCKER)
    wheels = _dummy_wheel(tmp_path)
    out = tmp_path / "OUT"
    # The interpreter fails each first training run as the first GPU run failed (in torch.compile's set-up, before
    # anything was saved): the script must train again without the compiler, in the time left; --twin trains the
    # autoregressive twin after the diffusion model, each in half the minutes.
    python = tmp_path / "python-failing-compiled-runs"
    python.write_text(f"""#!/bin/bash
if [[ " $* " == *" unimodal.training.train "* && " $* " != *" --no-compile "* ]]; then
  echo "simulated compiler failure" >&2; exit 1
fi
exec {sys.executable} "$@"
""")
    python.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin:" + str(Path(sys.executable).parent), "HOME": str(tmp_path),
           "PYTHONPATH": str(tmp_path / "bare"), "OMP_NUM_THREADS": "1", "PYTHON": str(python)}
    cmd = ["bash", str(REPO / "training" / "gpu_train.sh"), "--pack", str(pack), "--out", str(out), "--wheels",
           str(wheels), "--minutes", "6", "--device", "cpu", "--twin", "--", "--preset", "tiny", "--steps", "3",
           "--batch-size", "4", "--no-bf16", "--val-every", "2", "--workers", "1", "--audio-position-rate", "auto"]
    result = run_group(cmd, timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "installed 1 wheel(s)" in result.stdout and "tokens/s" in result.stdout and "MFU" in result.stdout
    assert result.stdout.count("again without torch.compile") == 2 and "simulated compiler failure" in result.stdout
    assert "the run failed" in result.stdout and "the twin run failed" in result.stdout
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(p.stat().st_size <= 16 * 2**20 for p in files)
    run = tmp_path / "restored"
    run.mkdir()
    with tarfile.open(out / "meta.tar") as tar:
        tar.extractall(run, filter="data")
    for shard in (out / "weights").iterdir():
        shard.rename(run / "model" / "backbone" / shard.name)
    for shard in (out / "twin" / "weights").iterdir():
        shard.rename(run / "twin" / "model" / "backbone" / shard.name)
    for folder in (run, run / "twin"):
        history = json.loads((folder / "history.json").read_text())
        summary = json.loads((folder / "summary.json").read_text())
        assert [h["step"] for h in history] == [1, 2, 3] and summary["tokens_per_s"] > 0 and 0 < summary["mfu"] < 1
    from unimodal.backbone.dit import DiT

    assert not DiT.from_pretrained(run / "model" / "backbone").config.causal
    assert DiT.from_pretrained(run / "twin" / "model" / "backbone").config.causal
    shipped = export_model(run / "model", tmp_path / "shipped", codecs=tiny_codec_dir)
    from unimodal.pipeline import UniModal

    pipe = UniModal.from_pretrained(shipped)
    assert pipe.generate(text="a red circle", to="image", steps=2, seed=0).image is not None
    # a rate measured on the pack travels with the model: the codecs' layout lacks it and still fits
    from unimodal.tokenizers_mm.layout import Layout

    assert 0 < Layout.load(shipped).audio_position_rate < 1
    assert pipe.generate(text="a red circle", to="audio", steps=2, seed=0).audio is not None
