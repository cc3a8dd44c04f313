#!/usr/bin/env bash
# Train the model on a bare GPU machine from a pack, in one command, and leave only what must come back.
#
#   training/gpu_train.sh --pack FILE.pack.safetensors --out DIR [--wheels DIR] [--minutes M] [--device cuda]
#                         [-- extra `python -m unimodal.training.train` arguments, e.g. --preset small --batch-size 512]
#
# A run that fails before saving anything (a compiler failure in its set-up) is tried once more without torch.compile
# in the time left. The machine needs Python with PyTorch, accelerate and safetensors; diffusers (and anything else missing) comes
# as wheels in --wheels, installed into a private folder. Nothing is downloaded. The run trains for at most
# --minutes of wall clock (the step count is fitted to that budget after 30 timed steps), saves EMA weights
# in float16 safetensors shards of at most 15 MB, and writes into --out at most 8 files, none over 16 MiB:
#   DIR/weights/*.safetensors         the backbone's shards
#   DIR/meta.tar                      model/ (configs, layout, shard index), history.json, train.log, summary.json
# Back on a machine with the codecs (docs/gpu.md):
#   mkdir -p run && tar -xf DIR/meta.tar -C run && cp DIR/weights/* run/model/backbone/
#   unimodal export-model --model run/model --codecs unimodal/default_model --int8 --out NEW_MODEL
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pack="" out="" wheels="" minutes=8 device=cuda
while [ $# -gt 0 ]; do
  case "$1" in
    --pack) pack="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --wheels) wheels="$2"; shift 2 ;;
    --minutes) minutes="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
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

train() {  # train MINUTES [extra arguments]
  local budget="$1"; shift
  "$python" -m unimodal.training.train --data "$pack" --out "$work/run" --device "$device" --max-minutes "$budget" \
    --fit-steps --shard-mb 15 --half-weights --val-every 500 --checkpoint-every 1000000 "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}
started=$(date +%s)
set +e
train "$minutes" "$@"
status=$?
# A run that died before it saved anything (the first GPU run did, in torch.compile's set-up) is tried once more
# without the compiler, in the time left, rather than coming back empty.
spent=$(( $(date +%s) - started ))
if [ "$status" -ne 0 ] && [ ! -f "$work/run/history.json" ] && [[ " $* " != *" --no-compile "* ]]; then
  left=$("$python" -c "left = round($minutes - $spent / 60 - 0.5, 2); print(left if left >= 1 else '')")
  if [ -n "$left" ]; then  # at least a minute left for the second try
    echo "gpu_train.sh: the run failed after ${spent}s before saving anything; again without torch.compile for $left min" | tee -a "$log"
    rm -rf "$work/run"
    train "$left" "$@" --no-compile
    status=$?
  fi
fi
set -e
"$python" -m unimodal.training.bench summarize "$work/run" --json "$work/summary.json" 2>&1 | tee -a "$log" || true

# What comes back: the shards, and everything else in one tar (the machine returns at most 8 files).
if [ -d "$work/run/model/backbone" ]; then
  mv "$work/run/model/backbone/"*.safetensors "$out/weights/"
fi
tar -cf "$out/meta.tar" -C "$work/run" $(cd "$work/run" && ls -d model history.json val_loss.png 2>/dev/null) \
  -C "$work" train.log $(cd "$work" && ls summary.json 2>/dev/null)
echo "gpu_train.sh: $(ls "$out/weights" | wc -l) weight shard(s) and meta.tar in $out (exit $status)"
exit "$status"
