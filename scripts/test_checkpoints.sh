#!/usr/bin/env bash
# usage: scripts/test_checkpoints.sh     (make test runs it on a GPU machine; needs ./train_llama3)
# GPU test of checkpoints on the small model (ref/small_t64's files, written by scripts/ref_llama3.py
# when missing, which needs torch): exact resume, the log continued, bad resumes refused, bf16 moments,
# tied embeddings, SIGKILL during saves. Takes no arguments; its files go to a temporary folder.
# Prints "ok ..." or "FAIL ..." per check, then "N passed, M failed".

# The checks, with the CUDA graph, deferred AdamW and sparse embedding on (the defaults), on a warmup +
# cosine schedule with clipping that clips (so the lr of every step, and the norm, must resume right):
#  - exact resume: 20 steps straight, 20 with a save every 5 steps, and 10 (--stop_after 10) +
#    --resume + 10 leave the same bytes in step_00000020/model.bin and state.bin, and log the same
#    losses; the resumed run continues the first part's log, which then reads as the straight run's;
#  - a resume from step 10 of the run saved every 5 steps, into that run's full log: the log's
#    steps 11..20 are replaced, not repeated;
#  - a resume with another B, and a fresh run into a folder holding a later checkpoint, are refused;
#  - the same exact resume with --optimizer_state bf16 (its state file half the size), and its
#    checkpoint resumed with fp32 moments refused; and with --master_weights bf16;
#  - the same exact resume on a tied model (ref/small_tied's, or one ref_llama3.py --model_only writes),
#    with --fp8 1 at 2 micro-steps (compute capability 8.9+), and on 3 shard files (a resume on 2 of
#    them refused);
#  - SIGKILL while checkpoints are written (one every step, so the writer is nearly always busy),
#    0.3, 0.6 and 0.9 s after the first one is complete (and up to 6 kills more until one has left a
#    file half written, so that the check is known to see one): a resume from the folder takes its newest
#    complete checkpoint (latest's, or a newer one whose save was killed between state.bin and
#    latest) and logs the losses the straight run logged for the same steps.
set -u
. "$(dirname "$0")/cli.sh"
no_arguments "$@"
cd "$(dirname "$0")/.."
passed=0 failed=0
c=$(mktemp -d)
trap 'rm -rf "$c"' EXIT
if [ ! -f ref/small_t64_model.bin ] || [ ! -f ref/small_t64_tokens.bin ]; then
    python3 scripts/ref_llama3.py --name small_t64 --shape small --batch_size 4 --seq_len 64 --llmc \
        --out_dir ref > "$c/ref.log" 2>&1 || { echo "FAIL the small model: $(tail -n 3 "$c/ref.log")"; exit 1; }
fi
result() { # OK NAME DETAIL
    if [ "$1" = 1 ]; then echo "ok   $2"; passed=$((passed + 1)); else echo "FAIL $2: $3"; failed=$((failed + 1)); fi
}
# The schedule of every run here: warmup, cosine decay to 0.1 of the peak, clipping at 1 (the small
# model's norms are above it).
schedule=(--learning_rate 1e-3 --lr_schedule cosine --warmup_iters 3 --final_lr_frac 0.1 --grad_clip 1)
train() { # LOG DIR FLAGS...: train_llama3 on the small model's tokens, logging to LOG, saving into DIR
    local log=$1 dir=$2
    shift 2
    ./train_llama3 --input_bin ref/small_t64_tokens.bin "${schedule[@]}" --log_file "$log" --checkpoint_dir "$dir" \
        "$@" >> "$log.out" 2>&1
}
losses() { grep -o '"loss": [^,]*' "$@"; }
errors() { grep -h "error" "$@" | head -n 3 | tr '\n' ' '; }
model=(--llmc_filepath ref/small_t64_model.bin)

ok=1
train "$c/straight.jsonl" "$c/straight" "${model[@]}" --num_iteration 20 || ok=0
train "$c/every5.jsonl" "$c/every5" "${model[@]}" --num_iteration 20 --checkpoint_every 5 --checkpoint_keep 4 || ok=0
train "$c/split.jsonl" "$c/split" "${model[@]}" --num_iteration 20 --stop_after 10 || ok=0
[ "$(losses "$c/split.jsonl" | wc -l)" -eq 10 ] || ok=0
train "$c/split.jsonl" "$c/split" --num_iteration 20 --resume "$c/split" || ok=0
for f in model.bin state.bin; do
    cmp -s "$c/straight/step_00000020/$f" "$c/every5/step_00000020/$f" || ok=0
    cmp -s "$c/straight/step_00000020/$f" "$c/split/step_00000020/$f" || ok=0
done
cmp -s <(losses "$c/straight.jsonl") <(losses "$c/every5.jsonl") || ok=0
[ "$(losses "$c/straight.jsonl" | wc -l)" -eq 20 ] || ok=0
result $ok "exact resume on a cosine schedule with clipping: 20 steps straight, with a save every 5, and 10 (--stop_after) + resume + 10: the same model.bin, state.bin (m, v) and losses" \
    "$(errors "$c"/*.out)"
cmp -s <(losses "$c/straight.jsonl") <(losses "$c/split.jsonl") && ok=1 || ok=0
result $ok "the resumed run continues the first part's --log_file: its 20 losses are the straight run's" \
    "$(losses "$c/split.jsonl" | wc -l) loss lines"
train "$c/every5.jsonl" "$c/again" --num_iteration 20 --resume "$c/every5/step_00000010" && \
    cmp -s <(losses "$c/straight.jsonl") <(losses "$c/every5.jsonl") && ok=1 || ok=0
result $ok "a resume from step 10 into the full log of 20 steps replaces its steps 11..20 (20 loss lines, the straight run's)" \
    "$(losses "$c/every5.jsonl" | wc -l) loss lines; $(errors "$c/every5.jsonl.out")"

out=$(./train_llama3 --input_bin ref/small_t64_tokens.bin --resume "$c/split" --num_iteration 30 --batch_size 2 2>&1)
[[ $? -ne 0 && "$out" == *"--batch_size 2 differs from the checkpoint's 4"* ]] && ok=1 || ok=0
result $ok "a resume with another B is refused" "$out"
out=$(./train_llama3 "${model[@]}" --input_bin ref/small_t64_tokens.bin --checkpoint_dir "$c/split" --num_iteration 5 2>&1)
[[ $? -ne 0 && "$out" == *"already holds step_00000020"* ]] && ok=1 || ok=0
result $ok "a fresh run into a folder holding a later checkpoint is refused" "$out"

# [bf16 moments] --optimizer_state bf16: its rounding stream is keyed by the step, so a resume
# repeats the straight run; the state file holds bf16 m and v (half the fp32 file's arrays), and
# resuming it with fp32 moments is refused.
bf16=(--optimizer_state bf16 --num_iteration 20)
train "$c/b_straight.jsonl" "$c/b_straight" "${model[@]}" "${bf16[@]}" && \
    train "$c/b_split.jsonl" "$c/b_split" "${model[@]}" "${bf16[@]}" --stop_after 10 && \
    train "$c/b_split.jsonl" "$c/b_split" "${bf16[@]}" --resume "$c/b_split" && ok=1 || ok=0
for f in model.bin state.bin; do cmp -s "$c/b_straight/step_00000020/$f" "$c/b_split/step_00000020/$f" || ok=0; done
cmp -s <(losses "$c/b_straight.jsonl") <(losses "$c/b_split.jsonl") || ok=0
fp32_state=$(stat -c %s "$c/straight/step_00000020/state.bin")
bf16_state=$(stat -c %s "$c/b_straight/step_00000020/state.bin" 2> /dev/null || echo 0)
[ $((bf16_state - 256)) -eq $(((fp32_state - 256) / 2)) ] || ok=0
result $ok "--optimizer_state bf16: 10 + resume + 10 give the straight run's model.bin, state.bin and losses; its state file's arrays are half the fp32 one's" \
    "$(errors "$c"/b_*.out) state.bin $bf16_state bytes (fp32: $fp32_state)"
out=$(./train_llama3 --input_bin ref/small_t64_tokens.bin --resume "$c/b_split/step_00000010" --num_iteration 20 2>&1)
[[ $? -ne 0 && "$out" == *"saved in bf16: resume with --optimizer_state bf16"* ]] && ok=1 || ok=0
result $ok "a bf16-moments checkpoint resumed with fp32 moments is refused" "$out"

# [bf16 weights] --master_weights bf16 (with bf16 moments): the matmul weights' stochastic rounding is
# keyed by the step too, and model.bin holds them widened to fp32 exactly: a resume repeats the
# straight run.
weights=(--optimizer_state bf16 --master_weights bf16 --num_iteration 20)
train "$c/w_straight.jsonl" "$c/w_straight" "${model[@]}" "${weights[@]}" && \
    train "$c/w_split.jsonl" "$c/w_split" "${model[@]}" "${weights[@]}" --stop_after 10 && \
    train "$c/w_split.jsonl" "$c/w_split" "${weights[@]}" --resume "$c/w_split" && ok=1 || ok=0
for f in model.bin state.bin; do cmp -s "$c/w_straight/step_00000020/$f" "$c/w_split/step_00000020/$f" || ok=0; done
cmp -s <(losses "$c/w_straight.jsonl") <(losses "$c/w_split.jsonl") || ok=0
[ "$(losses "$c/w_straight.jsonl" | wc -l)" -eq 20 ] || ok=0
result $ok "--master_weights bf16: 10 + resume + 10 give the straight run's model.bin, state.bin and losses" "$(errors "$c"/w_*.out)"

# [tied embeddings] wte also the head's weight, its AdamW dense (sparse_embedding off): the same exact resume.
tied_model=ref/small_tied_model.bin
if [ ! -f "$tied_model" ]; then
    tied_model=$c/tied_model.bin
    python3 scripts/ref_llama3.py --name tied --shape small --tied --model_only --out_dir "$c" > "$c/tied_ref.log" 2>&1
fi
tied=(--num_iteration 20)
train "$c/t_straight.jsonl" "$c/t_straight" --llmc_filepath "$tied_model" "${tied[@]}" && \
    train "$c/t_split.jsonl" "$c/t_split" --llmc_filepath "$tied_model" "${tied[@]}" --stop_after 10 && \
    train "$c/t_split.jsonl" "$c/t_split" "${tied[@]}" --resume "$c/t_split" && ok=1 || ok=0
for f in model.bin state.bin; do cmp -s "$c/t_straight/step_00000020/$f" "$c/t_split/step_00000020/$f" || ok=0; done
cmp -s <(losses "$c/t_straight.jsonl") <(losses "$c/t_split.jsonl") || ok=0
result $ok "tied embeddings: 10 + resume + 10 give the straight run's model.bin, state.bin and losses" \
    "$(errors "$c"/t_*.out "$c"/tied_ref.log 2> /dev/null)"

# [fp8] --fp8 1 with 2 micro-steps (compute capability 8.9+): a resume remakes the weights' FP8 copies
# from the loaded shadow, as the straight run made them after its update: the same exact resume.
if fp8_gpu; then
    fp8=(--fp8 1 --total_batch_size 512 --num_iteration 20)
    train "$c/f_straight.jsonl" "$c/f_straight" "${model[@]}" "${fp8[@]}" && \
        train "$c/f_split.jsonl" "$c/f_split" "${model[@]}" "${fp8[@]}" --stop_after 10 && \
        train "$c/f_split.jsonl" "$c/f_split" "${fp8[@]}" --resume "$c/f_split" && ok=1 || ok=0
    for f in model.bin state.bin; do cmp -s "$c/f_straight/step_00000020/$f" "$c/f_split/step_00000020/$f" || ok=0; done
    cmp -s <(losses "$c/f_straight.jsonl") <(losses "$c/f_split.jsonl") || ok=0
    result $ok "--fp8 1 with 2 micro-steps: 10 + resume + 10 give the straight run's model.bin, state.bin and losses" \
        "$(errors "$c"/f_*.out)"
else
    echo "skipped: the FP8 exact resume (--fp8 1 needs compute capability 8.9 or newer)"
fi

# [shards] The small model's tokens as 3 shard files, read shuffled (the default): 20 steps straight and
# 10 + resume + 10 cross the shards' and the epochs' ends alike; a resume on 2 of the shards is refused.
python3 - "$c" <<'PY'
import sys
import numpy as np
tokens = np.fromfile("ref/small_t64_tokens.bin", dtype="<u4", offset=1024)
for i, part in enumerate(np.array_split(tokens, 3)):
    header = np.zeros(256, "<i4")
    header[:3] = [20240801, 7, len(part)]
    open(f"{sys.argv[1]}/shard_{i}.bin", "wb").write(header.tobytes() + part.astype("<u4").tobytes())
PY
sharded() { # LOG DIR FLAGS...: train() on the shards
    local log=$1 dir=$2
    shift 2
    ./train_llama3 --input_bin "$c/shard_*.bin" "${schedule[@]}" --log_file "$log" --checkpoint_dir "$dir" "$@" \
        >> "$log.out" 2>&1
}
sharded "$c/s_straight.jsonl" "$c/s_straight" "${model[@]}" --num_iteration 20 && \
    sharded "$c/s_split.jsonl" "$c/s_split" "${model[@]}" --num_iteration 20 --stop_after 10 && \
    sharded "$c/s_split.jsonl" "$c/s_split" --num_iteration 20 --resume "$c/s_split" && ok=1 || ok=0
for f in model.bin state.bin; do cmp -s "$c/s_straight/step_00000020/$f" "$c/s_split/step_00000020/$f" || ok=0; done
cmp -s <(losses "$c/s_straight.jsonl") <(losses "$c/s_split.jsonl") || ok=0
cmp -s <(losses "$c/s_straight.jsonl") <(losses "$c/straight.jsonl") && ok=0 # (another order than the one file's)
result $ok "3 shards, shuffled: 10 + resume + 10 give the straight run's model.bin, state.bin and losses (another order than the one file's)" \
    "$(errors "$c"/s_*.out)"
out=$(./train_llama3 --input_bin "$c/shard_[01].bin" --resume "$c/s_split/step_00000010" --num_iteration 20 2>&1)
[[ $? -ne 0 && "$out" == *"differs from the checkpoint's token data (3 files"* ]] && ok=1 || ok=0
result $ok "a resume on 2 of the 3 shards is refused" "$out"

train "$c/long.jsonl" "$c/long" "${model[@]}" --num_iteration 3000
bad="" debris=0 kills=0
# Each kill comes a while after the first checkpoint is complete (latest written), not after a fixed
# time from the start, which on a loaded machine can fall before the first save. At least 3 kills, and
# more (up to 9) until one has landed while a file was half written: in one whole make test on an H100,
# all 3 kills fell between two saves.
for delay in 0.3 0.6 0.9 0.45 0.75 0.15 1.05 0.2 0.5; do
    [ "$kills" -ge 3 ] && [ "$debris" -gt 0 ] && break
    kills=$((kills + 1))
    dir=$c/kill_$delay
    ./train_llama3 "${model[@]}" --input_bin ref/small_t64_tokens.bin "${schedule[@]}" --checkpoint_dir "$dir" \
        --num_iteration 3000 --checkpoint_every 1 > "$c/kill.out" 2>&1 &
    pid=$!
    for _ in $(seq 300); do [ -e "$dir/latest" ] && break; sleep 0.1; done
    sleep "$delay"
    kill -9 "$pid" 2> /dev/null || bad="$bad ($delay s: finished before the kill)"
    wait "$pid" 2> /dev/null
    ls "$dir"/step_*/*.tmp.* > /dev/null 2>&1 && debris=$((debris + 1))
    newest=$(ls -d "$dir"/step_*/state.bin | tail -n 1)
    step=$(echo "$newest" | sed -n 's|.*/step_0*\([0-9]*\)/state.bin$|\1|p')
    n=$((step + 3))
    rm -f "$c/resumed.jsonl"
    if ! train "$c/resumed.jsonl" "$dir" --num_iteration 3000 --stop_after "$n" --resume "$dir"; then
        bad="$bad ($delay s: resume from step $step: $(errors "$c/resumed.jsonl.out"))"
        continue
    fi
    cmp -s <(losses "$c/resumed.jsonl") <(losses "$c/long.jsonl" | sed -n "$((step + 1)),${n}p") ||
        bad="$bad ($delay s: the losses after step $step differ)"
done
[ "$debris" -gt 0 ] || bad="$bad (none of the $kills kills landed while a file was half written)"
[ -z "$bad" ] && ok=1 || ok=0
result $ok "SIGKILL during saves ($kills kills, $debris of them with a file half written): the newest complete checkpoint loads, the resumed losses match" \
    "$bad"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
