#!/usr/bin/env bash
# Prepare everything a GPU machine needs to train the model, in one ignored folder of the repository (.gpu/):
#   .gpu/train.pack.safetensors   every split of scenes (--scenes N) and digits, tokenised with the shipped codecs
#                                 (or the codec set --codecs names: a recipe experiment's codec); the digits'
#                                 training samples drawn --digits-weight times an epoch (default 4: ~15% of
#                                 the samples beside 32,000 training scenes, r10's share, at which it drew
#                                 digits at 0.96; at weight 1, g1's 4%, 0.32; at weight 16, 42%, a CPU
#                                 fine-tune's captions from nothing turned to digits and joint fell)
#                                 --clear-scenes N adds N more scenes (seed 1) spoken in the clear voice set
#                                 (`unimodal data build --voices clear`: the voices the speech judge hears best,
#                                 0.765 of test captions heard right against 0.515 for the varied ones)
#   .gpu/wheels/                  diffusers (the version installed here) and what it needs that the machine lacks
# then print the command that runs training/gpu_train.sh there. Run it from the repository root, on a machine
# where `pip install -e .` has been done; the data build takes ~15 min for 40,000 scenes on two idle cores and
# is cached under ~/.cache/unimodal (a complete build with the same settings is reused: `data build --reuse`).
#
#   training/gpu_prepare.sh [--scenes 40000] [--clear-scenes 0] [--digits-weight 4] [--codecs FOLDER] [--out .gpu]
set -euo pipefail
scenes=40000 clear_scenes=0 out=.gpu codecs= digits_weight=4
while [ $# -gt 0 ]; do
  case "$1" in
    --scenes) scenes="$2"; shift 2 ;;
    --clear-scenes) clear_scenes="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --codecs) codecs="$2"; shift 2 ;;
    --digits-weight) digits_weight="$2"; shift 2 ;;
    *) echo "gpu_prepare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
cd "$(git rev-parse --show-toplevel)"
grep -qxF "/$out/" .git/info/exclude 2>/dev/null || echo "/$out/" >> .git/info/exclude
mkdir -p "$out/wheels"

scenes_dir=$(unimodal data build scenes --n "$scenes" --reuse | tail -n 1)
digits_dir=$(unimodal data build digits --reuse | tail -n 1)
clear_dir=
if [ "$clear_scenes" != 0 ]; then
  clear_dir=$(unimodal data build scenes --n "$clear_scenes" --seed 1 --voices clear --reuse | tail -n 1)
fi
unimodal data pack --data "$scenes_dir${clear_dir:+,$clear_dir},$digits_dir:$digits_weight" ${codecs:+--codecs "$codecs"} --out "$out/train.pack.safetensors"

# The GPU machine runs Python 3.12 with PyTorch, accelerate, transformers, safetensors and huggingface_hub;
# diffusers and importlib_metadata come as wheels (pure Python: one file serves any platform).
version=$(python -c "import diffusers; print(diffusers.__version__)")
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$out/wheels" \
  "diffusers==$version" importlib_metadata
du -sh "$out"
# what a call carries: the tracked tree and the carried folder, against the 64 MiB limit
tree_bytes=$(git ls-files -z | xargs -0 du -cb | tail -n 1 | cut -f1)
out_bytes=$(du -sb "$out" | cut -f1)
carried_mib=$(( (tree_bytes + out_bytes) / 1048576 ))
fit="under the 64 MiB a call carries"
if [ "$carried_mib" -ge 64 ]; then
  # what the run does not read: the shipped codecs (it reads only the backbone and layout of --init-from) and the
  # committed result files; each is named only if it is needed to fit
  codec_bytes=$(du -scb unimodal/default_model/audio unimodal/default_model/image unimodal/default_model/text 2>/dev/null | tail -n 1 | cut -f1)
  results_bytes=$(git ls-files -z docs/results | xargs -0 du -cb | tail -n 1 | cut -f1)
  without_codecs_mib=$(( (tree_bytes + out_bytes - codec_bytes) / 1048576 ))
  if [ "$without_codecs_mib" -lt 64 ]; then
    move="unimodal/default_model/{audio,image,text}"
  else
    move="unimodal/default_model/{audio,image,text} and docs/results ($(( (tree_bytes + out_bytes - codec_bytes - results_bytes) / 1048576 )) MiB left)"
  fi
  fit="OVER the 64 MiB a call carries: move $move out for the call and \`git checkout\` them after (the run reads neither; docs/gpu.md)"
fi
cat <<EOF

Ready. On a lent GPU (device tool), one of:
  continue the shipped model (it travels with the tree: ${carried_mib} MiB with $out, $fit):
    run: bash training/gpu_train.sh --pack $out/train.pack.safetensors --wheels $out/wheels --out \$OUT --minutes 8.4 -- --preset small --init-from unimodal/default_model --batch-size 512 --steps 20000 --lr 1e-3 --warmup 200
         carry: ["$out"], timeout_s: 600
  or from scratch, with the shipped model moved out of the tree for the call (not needed there):
    mv unimodal/default_model /tmp/
    run: bash training/gpu_train.sh --pack $out/train.pack.safetensors --wheels $out/wheels --out \$OUT --minutes 8.4 -- --preset small --batch-size 256 --steps 20000 --lr 1.5e-3 --warmup 300
         carry: ["$out"], timeout_s: 600
    git checkout unimodal/default_model
  or the twin bar (issue 13): the same from scratch, with the autoregressive twin trained after it in half the minutes:
    run: bash training/gpu_train.sh --pack $out/train.pack.safetensors --wheels $out/wheels --out \$OUT --minutes 8.4 --twin -- --preset small --batch-size 256 --steps 20000 --lr 1.5e-3 --warmup 300 --audio-position-rate auto
         carry: ["$out"], timeout_s: 600
Then docs/gpu.md: restore the model from the returned files and export it with the codecs it was packed with
(unimodal export-model ... --codecs ${codecs:-unimodal/default_model}).
EOF
