#!/usr/bin/env bash
# What checkpoints cost: the default LLaMA3.2-1B at B=4, T=64 for 150 steps, without checkpoints and
# with --checkpoint_every 50 (--checkpoint_keep 1; each save 18 GB: fp32 weights, AdamW m and v),
# in the same run of this script. Prints the median step time, the loop's wall time, and the step
# time of each step that followed a save (its AdamW waits for the save's copy to the host).
#   scripts/bench_checkpoint.sh [DIR]   DIR: where the checkpoints go (default: a folder in /tmp); needs 36 GB
set -u
cd "$(dirname "$0")/.."
dir=${1:-$(mktemp -d)}
out=$(mktemp -d)
trap 'rm -rf "$out" "$dir"/step_* "$dir"/latest' EXIT
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
