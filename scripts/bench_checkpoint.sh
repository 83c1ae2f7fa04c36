#!/usr/bin/env bash
# usage: scripts/bench_checkpoint.sh [DIR]     (a GPU and ./train_llama3)
# What checkpoints cost: the default LLaMA3.2-1B at B=4, T=64 for 150 steps, without checkpoints and
# with --checkpoint_every 50 (--checkpoint_keep 1; each save 18 GB: fp32 weights, AdamW m and v),
# in the same run of this script. Prints the median step time, the loop's wall time, and the step
# time of each step that followed a save (its AdamW waits for the save's copy to the host).
#   DIR   where the checkpoints go, a new or empty folder (default: a new folder in /tmp); needs 36 GB.
#         The checkpoints are deleted at the end, and DIR too unless it was there before.
# Example: scripts/bench_checkpoint.sh /scratch/ckpt_bench
set -u
. "$(dirname "$0")/cli.sh"
case ${1:-} in -h | --help) usage ;; -?*) unknown_argument "$1" ;; esac
[ $# -le 1 ] || unknown_argument "$2"
# Only what this script made is deleted at the end: DIR must not exist, or be an empty folder.
dir=${1:-}
if [ -n "$dir" ] && [ -e "$dir" ] && { [ ! -d "$dir" ] || [ -n "$(ls -A "$dir")" ]; }; then
    bad_argument "$dir: not a new or empty folder (the checkpoints written there are deleted at the end)"
fi
made=""
if [ -z "$dir" ]; then dir=$(mktemp -d) made=1; elif [ ! -e "$dir" ]; then made=1; fi
dir=$(realpath -m -- "$dir") # (the path as given, from this cwd)
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out" "$dir"/step_* "$dir"/latest; [ -z "$made" ] || rmdir "$dir" 2> /dev/null' EXIT
./train_llama3 --num_iteration 150 --log_file "$out/plain.jsonl" > "$out/plain.txt" 2>&1 || { tail -3 "$out/plain.txt"; exit 1; }
./train_llama3 --num_iteration 150 --log_file "$out/ckpt.jsonl" --checkpoint_dir "$dir" --checkpoint_every 50 \
    --checkpoint_keep 1 > "$out/ckpt.txt" 2>&1 || { tail -3 "$out/ckpt.txt"; exit 1; }
for run in plain ckpt; do
    echo "$run: $(grep -E '^steady state' "$out/$run.txt" | sed 's/, [0-9]* tok.*//') | $(grep '^wall time' "$out/$run.txt")"
done
for step in 50 51 52 100 101 102 150; do
    echo "step $step: $(grep "\"step\": $step," "$out/plain.jsonl" | grep -o '"ms": [0-9.]*') without," \
        "$(grep "\"step\": $step," "$out/ckpt.jsonl" | grep -o '"ms": [0-9.]*') with checkpoints"
done
