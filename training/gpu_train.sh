#!/usr/bin/env bash
# Train the model on a bare GPU machine from a pack, in one command, and leave only what must come back.
#
#   training/gpu_train.sh --pack FILE.pack.safetensors --out DIR [--wheels DIR] [--minutes M] [--device cuda] [--twin]
#                         [-- extra `python -m unimodal.training.train` arguments, e.g. --preset small --batch-size 512]
#
# --twin: the minutes are shared by two runs with the same arguments, one after the other: the diffusion model, then
# its autoregressive twin (`--objective ar` added), each with half the budget: the twin bar of issue 13 read at equal
# GPU time on the same pack. The twin's shards come back in DIR/twin/weights and its files under twin/ in meta.tar
# (a `small` model is 3 shards: 3 + 3 + meta.tar, inside the 8 files a call returns).
#
# A run that fails before saving anything (a compiler failure in its set-up) is tried once more without torch.compile
# in the time left. The machine needs Python with PyTorch, accelerate and safetensors; diffusers (and anything else missing) comes
# as wheels in --wheels, installed into a private folder. Nothing is downloaded. The run trains for at most
# --minutes of wall clock (the step count is fitted to that budget after 30 timed steps), saves EMA weights
# in float16 safetensors shards of at most 16 MB (under 16 MiB), and writes into --out at most 8 files, none over 16 MiB:
#   DIR/weights/*.safetensors         the backbone's shards
#   DIR/meta.tar                      model/ (configs, layout, shard index), history.json, train.log, summary.json
# Back on a machine with the codecs (docs/gpu.md):
#   mkdir -p run && tar -xf DIR/meta.tar -C run && cp DIR/weights/* run/model/backbone/
#   unimodal export-model --model run/model --codecs unimodal/default_model --int8 --out NEW_MODEL
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pack="" out="" wheels="" minutes=8 device=cuda twin=0
while [ $# -gt 0 ]; do
  case "$1" in
    --pack) pack="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --wheels) wheels="$2"; shift 2 ;;
    --minutes) minutes="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --twin) twin=1; shift ;;
    --) shift; break ;;
    *) echo "gpu_train.sh: unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
done
[ -f "$pack" ] || { echo "gpu_train.sh: --pack must name a pack file (unimodal data pack), got '$pack'" >&2; exit 2; }
[ -n "$out" ] || { echo "gpu_train.sh: --out DIR is required" >&2; exit 2; }
mkdir -p "$out/weights"
work="$(mktemp -d)"
log="$work/train.log"

python="${PYTHON:-python3}"  # the interpreter that has PyTorch (PYTHON overrides)
if [ -n "$wheels" ]; then
  site="$work/site"
  shopt -s nullglob
  files=("$wheels"/*.whl)
  if [ ${#files[@]} -gt 0 ]; then
    PIP_ROOT_USER_ACTION=ignore "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "${files[@]}"
    echo "installed ${#files[@]} wheel(s) from $wheels"
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$repo"
"$python" - <<'EOF'
import importlib.util, sys
missing = [m for m in ("torch", "accelerate", "safetensors", "diffusers", "numpy", "tqdm") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_train.sh: missing Python packages {missing}: bring their wheels with --wheels DIR")
import torch
print(f"torch {torch.__version__}, CUDA {torch.cuda.is_available()}"
      + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""))
EOF

train() {  # train NAME MINUTES [extra arguments]: one run into $work/NAME
  local name="$1" budget="$2"; shift 2
  "$python" -m unimodal.training.train --data "$pack" --out "$work/$name" --device "$device" --max-minutes "$budget" \
    --fit-steps --shard-mb 16 --half-weights --val-every 500 --checkpoint-every 1000000 "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}
run_once() {  # run_once NAME MINUTES [extra arguments]: a run, tried again without the compiler if it died unsaved
  local name="$1" budget="$2"; shift 2
  local started status spent left label="run"
  [ "$name" = run ] || label="$name run"
  started=$(date +%s)
  train "$name" "$budget" "$@"
  status=$?
  # A run that died before it saved anything (the first GPU run did, in torch.compile's set-up) is tried once more
  # without the compiler, in the time left, rather than coming back empty.
  spent=$(( $(date +%s) - started ))
  if [ "$status" -ne 0 ] && [ ! -f "$work/$name/history.json" ] && [[ " $* " != *" --no-compile "* ]]; then
    left=$("$python" -c "left = round($budget - $spent / 60 - 0.5, 2); print(left if left >= 1 else '')")
    if [ -n "$left" ]; then  # at least a minute left for the second try
      echo "gpu_train.sh: the $label failed after ${spent}s before saving anything; again without torch.compile for $left min" | tee -a "$log"
      rm -rf "$work/$name"
      train "$name" "$left" "$@" --no-compile
      status=$?
    fi
  fi
  "$python" -m unimodal.training.bench summarize "$work/$name" --json "$work/$name/summary.json" 2>&1 | tee -a "$log" || true
  return "$status"
}
set +e
if [ "$twin" = 1 ]; then
  started=$(date +%s)
  half=$("$python" -c "print(round($minutes / 2, 2))")
  echo "gpu_train.sh: --twin: the diffusion model for $half min, then its autoregressive twin in the time left" | tee -a "$log"
  run_once run "$half" "$@"
  status=$?
  left=$("$python" -c "print(round($minutes - ($(date +%s) - $started) / 60, 2))")
  run_once twin "$left" "$@" --objective ar
  twin_status=$?
  [ "$status" -ne 0 ] || status=$twin_status
else
  run_once run "$minutes" "$@"
  status=$?
fi
set -e

# What comes back: the shards, and everything else in one tar (the machine returns at most 8 files).
collect() {  # collect NAME SHARDS_DIR TAR_PREFIX: NAME's shards into SHARDS_DIR, its other files staged for the tar
  local name="$1" shards="$2" prefix="$3"
  mkdir -p "$shards" "$work/meta/$prefix"
  if [ -d "$work/$name/model/backbone" ]; then
    mv "$work/$name/model/backbone/"*.safetensors "$shards/"
  fi
  (cd "$work/$name" && cp -r $(ls -d model history.json val_loss.png summary.json 2>/dev/null) "$work/meta/$prefix/") || true
}
collect run "$out/weights" .
[ "$twin" = 1 ] && collect twin "$out/twin/weights" twin
cp "$log" "$work/meta/train.log"
tar -cf "$out/meta.tar" -C "$work/meta" .
files=$(find "$out" -type f | wc -l)
[ "$files" -le 8 ] || echo "gpu_train.sh: WARNING: $files files in $out, more than the 8 a device call returns" | tee -a "$log"
echo "gpu_train.sh: $(ls "$out/weights" | wc -l) weight shard(s)$([ "$twin" = 1 ] && echo ", the twin's $(ls "$out/twin/weights" | wc -l)") and meta.tar in $out (exit $status)"
exit "$status"
