#!/usr/bin/env bash
# usage: scripts/profile.sh [B T] [trainer flags...]     (default B=4 T=64, one micro-step per step)
# Step profile (a GPU, Nsight Compute's ncu and ./train_llama3): ncu times every kernel of a 3-step run,
# then scripts/profile_step.py groups the kernels of one step by what they do (GEMMs, attention,
# RMSNorm, AdamW, ...). The trainer flags are checked by ./train_llama3 before ncu starts.
#   PROFILE_CSV=PATH   keep ncu's output there (default: a temporary file, removed at the end)
# Example: scripts/profile.sh 4 1024 --recompute 1
set -eu
. "$(dirname "$0")/cli.sh"
for a in "$@"; do case $a in -h | --help) usage ;; esac; done
cd "$(dirname "$0")/.."
B=4 T=64
if [[ ${1:-} =~ ^[0-9]+$ ]]; then
    [[ ${2:-} =~ ^[0-9]+$ ]] || bad_argument "B $1 without T (--help)"
    B=$1 T=$2
    shift 2
fi
[ -x ./train_llama3 ] || { echo "profile.sh: ./train_llama3 is missing (make train_llama3)" >&2; exit 1; }
run=(./train_llama3 --batch_size "$B" --sequence_length "$T" --total_batch_size $((B * T)) --num_iteration 3
    --cuda_graph 0 "$@")
# The trainer checks its flags before it looks for a GPU: with none visible it stops there, writing nothing.
err=$(CUDA_VISIBLE_DEVICES='' "${run[@]}" 2>&1 > /dev/null) || true
[[ $err == *"no CUDA device found"* ]] || { echo "$err" >&2; exit 2; }
command -v ncu > /dev/null || { echo "profile.sh: ncu (Nsight Compute) is not on PATH" >&2; exit 1; }
csv=${PROFILE_CSV:-}
if [ -z "$csv" ]; then
    csv=$(mktemp)
    trap 'rm -f "$csv"' EXIT
fi

# --cuda_graph 0: graphs off, so that ncu sees each kernel as its own launch, in the order the code
# issues it (profile_step.py splits steps and forward/backward by that order).
# --clock-control none --cache-control none: by default ncu locks the clocks to base and flushes
# the caches before each kernel, which would misstate kernels as they run in a training step.
echo "profiling B=$B T=$T under ncu (kernels one at a time: slower than a plain run) ..." >&2
if ! ncu --metrics gpu__time_duration.sum --csv --clock-control none --cache-control none "${run[@]}" > "$csv"; then
    tail -n 20 "$csv" >&2
    echo "profile.sh: ncu or the trainer failed (the end of their output is above)" >&2
    exit 1
fi
python3 scripts/profile_step.py "$csv"
