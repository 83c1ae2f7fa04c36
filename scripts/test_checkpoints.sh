#!/usr/bin/env bash
# GPU test of checkpoints on the small model (ref/small_t64's files, made by ref_llama3.py when
# missing), with the CUDA graph, deferred AdamW and sparse embedding on (the defaults):
#  - exact resume: 20 steps straight, 20 with a save every 5 steps, and 10 + --resume + 10 leave the
#    same bytes in step_00000020/model.bin and state.bin, and log the same losses;
#  - a resume with another B, and a fresh run into a folder holding a later checkpoint, are refused;
#  - SIGKILL while checkpoints are written (one every step, so the writer is nearly always busy):
#    latest still names a complete checkpoint, and a resume from it logs the losses the straight run
#    logged for the same steps.
# Ends with "N passed, M failed".
set -u
cd "$(dirname "$0")/.."
passed=0 failed=0
c=$(mktemp -d)
trap 'rm -rf "$c"' EXIT
if [ ! -f ref/small_t64_model.bin ] || [ ! -f ref/small_t64_tokens.bin ]; then
    mkdir -p ref
    python3 scripts/ref_llama3.py --name small_t64 --shape small --batch_size 4 --seq_len 64 --llmc \
        --out_dir ref > "$c/ref.log" 2>&1 || { echo "FAIL the small model: $(tail -n 3 "$c/ref.log")"; exit 1; }
fi
result() { # OK NAME DETAIL
    if [ "$1" = 1 ]; then echo "ok   $2"; passed=$((passed + 1)); else echo "FAIL $2: $3"; failed=$((failed + 1)); fi
}
train() { # LOG DIR FLAGS...: train_llama3 on the small model's tokens, logging to LOG, saving into DIR
    local log=$1 dir=$2
    shift 2
    ./train_llama3 --input_bin ref/small_t64_tokens.bin --learning_rate 1e-3 --log_file "$log" \
        --checkpoint_dir "$dir" "$@" > "$log.out" 2>&1
}
losses() { grep -o '"loss": [^,]*' "$@"; }
errors() { grep -h "error" "$@" | head -n 3 | tr '\n' ' '; }
model=(--llmc_filepath ref/small_t64_model.bin)

ok=1
train "$c/straight.jsonl" "$c/straight" "${model[@]}" --num_iteration 20 || ok=0
train "$c/every5.jsonl" "$c/every5" "${model[@]}" --num_iteration 20 --checkpoint_every 5 || ok=0
train "$c/split1.jsonl" "$c/split" "${model[@]}" --num_iteration 10 || ok=0
train "$c/split2.jsonl" "$c/split" --num_iteration 20 --resume "$c/split" || ok=0
for f in model.bin state.bin; do
    cmp -s "$c/straight/step_00000020/$f" "$c/every5/step_00000020/$f" || ok=0
    cmp -s "$c/straight/step_00000020/$f" "$c/split/step_00000020/$f" || ok=0
done
cmp -s <(losses "$c/straight.jsonl") <(losses "$c/every5.jsonl") || ok=0
cmp -s <(losses "$c/straight.jsonl") <(cat <(losses "$c/split1.jsonl") <(losses "$c/split2.jsonl")) || ok=0
[ "$(losses "$c/straight.jsonl" | wc -l)" -eq 20 ] || ok=0
result $ok "exact resume: 20 steps straight, with a save every 5, and 10 + resume + 10: the same model.bin, state.bin (m, v) and losses" \
    "$(errors "$c"/*.out)"

out=$(./train_llama3 --input_bin ref/small_t64_tokens.bin --resume "$c/split" --num_iteration 30 --batch_size 2 2>&1)
[[ $? -ne 0 && "$out" == *"--batch_size 2 differs from the checkpoint's 4"* ]] && ok=1 || ok=0
result $ok "a resume with another B is refused" "$out"
out=$(./train_llama3 "${model[@]}" --input_bin ref/small_t64_tokens.bin --checkpoint_dir "$c/split" --num_iteration 5 2>&1)
[[ $? -ne 0 && "$out" == *"already holds step_00000020"* ]] && ok=1 || ok=0
result $ok "a fresh run into a folder holding a later checkpoint is refused" "$out"

train "$c/long.jsonl" "$c/long" "${model[@]}" --num_iteration 3000
bad="" debris=0
for delay in 2 2.5 3; do
    dir=$c/kill_$delay
    ./train_llama3 "${model[@]}" --input_bin ref/small_t64_tokens.bin --learning_rate 1e-3 --checkpoint_dir "$dir" \
        --num_iteration 3000 --checkpoint_every 1 > "$c/kill.out" 2>&1 &
    pid=$!
    sleep "$delay"
    kill -9 "$pid" 2> /dev/null || bad="$bad ($delay s: finished before the kill)"
    wait "$pid" 2> /dev/null
    ls "$dir"/step_*/*.tmp.* > /dev/null 2>&1 && debris=$((debris + 1))
    step=$(sed -n 's/^step_0*\([0-9]*\)$/\1/p' "$dir/latest")
    n=$((step + 3))
    if ! train "$c/resumed.jsonl" "$dir" --num_iteration "$n" --resume "$dir"; then
        bad="$bad ($delay s: resume from step $step: $(errors "$c/resumed.jsonl.out"))"
        continue
    fi
    cmp -s <(losses "$c/resumed.jsonl") <(losses "$c/long.jsonl" | sed -n "$((step + 1)),${n}p") ||
        bad="$bad ($delay s: the losses after step $step differ)"
done
[ -z "$bad" ] && [ "$debris" -gt 0 ] && ok=1 || ok=0
result $ok "SIGKILL during saves (3 kills, $debris of them with a file half written): latest loads, the resumed losses match" \
    "$bad"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
