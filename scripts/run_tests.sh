#!/usr/bin/env bash
# The driver of `make test` (run after `make all`). Everywhere: the host unit tests of llama3.h and
# the trainer's bad-input errors. On a machine with a GPU, also: test_llama3 against PyTorch
# references (scripts/ref_llama3.py, written to ref/ when missing or older than the script) that
# exercise every path, the trainer itself on a reference's files, the training smoke run, and every
# dev/ kernel check. Ends with "N passed, M failed, K skipped" after the list of skipped parts and
# why; exits non-zero if anything failed.
#   LLAMA3_TEST_SHAPES="small"  leaves the 1B shape out (its reference writes ~30 GB to ref/)
#   LLAMA3_DEV_CHECKS=0         leaves the dev/ kernel checks out
#   LLAMA3_HOST_TESTS=0         leaves the host unit tests and the bad-input errors out (scripts/mutants.py
#                               --gpu_only: what the GPU tests alone catch)
#   LLAMA3_FAIL_FAST=1          stops after the first failing part (scripts/mutants.py)
set -u
cd "$(dirname "$0")/.."
passed=0
failed=0
skipped=()

finish() {
    for s in "${skipped[@]+"${skipped[@]}"}"; do echo "SKIPPED $s"; done
    echo "$passed passed, $failed failed, ${#skipped[@]} skipped"
    [ "$failed" -eq 0 ]
    exit
}
count_failure() {
    failed=$((failed + $1))
    if [ "$1" -gt 0 ] && [ "${LLAMA3_FAIL_FAST:-0}" = 1 ]; then finish; fi
}

# run NAME CMD...: a program that prints its own "N passed, M failed" line.
run() {
    local name=$1 out rc line p f
    shift
    echo "== $name: $*"
    out=$("$@" 2>&1)
    rc=$?
    echo "$out"
    line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    p=0 f=0
    if [ -n "$line" ]; then p=${line%% passed*}; f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/'); fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL $name exited with $rc"; fi
    if echo "$out" | grep -qE "ERROR: (Address|Leak)Sanitizer|runtime error:"; then f=$((f + 1)); echo "FAIL $name: a sanitizer report"; fi
    passed=$((passed + p))
    count_failure "$f"
}

# expect_error NAME FRAGMENT CMD...: the command must exit non-zero and say FRAGMENT.
expect_error() {
    local name=$1 frag=$2 out rc
    shift 2
    out=$("$@" 2>&1)
    rc=$?
    if [ "$rc" -ne 0 ] && echo "$out" | grep -qF -- "$frag"; then
        echo "ok   $name: $(echo "$out" | grep -F -- "$frag" | head -n 1)"
        passed=$((passed + 1))
    else
        echo "FAIL $name (exit $rc, wanted '$frag'): $(echo "$out" | head -n 3)"
        count_failure 1
    fi
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Every file of the hostile corpus through ./train_llama3 as a model and as a token file: each run
# must end with exactly one line on stderr, "error: ..." naming the file, and a non-zero exit,
# within 10 s (a FIFO must not block). No GPU needed: every check comes before the GPU.
corpus_through_trainer() {
    local f flag lines n=0 bad=""
    for f in "$tmp"/corpus/model_* "$tmp"/corpus/tokens_*; do
        [ -e "$f" ] || continue
        case $(basename "$f") in model_*) flag=--llmc_filepath ;; *) flag=--input_bin ;; esac
        n=$((n + 1))
        timeout 10 ./train_llama3 "$flag" "$f" > "$tmp/out" 2> "$tmp/err" && { bad="$bad $f(exit 0)"; continue; }
        lines=$(wc -l < "$tmp/err")
        if [ "$lines" -ne 1 ] || ! grep -q "^error: .*$f" "$tmp/err"; then bad="$bad $f($(head -c 200 "$tmp/err"))"; fi
    done
    if [ "$n" -gt 0 ] && [ -z "$bad" ]; then echo "ok   train_llama3 refuses each of the $n corpus files in one line naming it"
        passed=$((passed + 1)); else echo "FAIL train_llama3 on the hostile corpus ($n files):$bad"; count_failure 1; fi
}

# Nothing is lost: no output is one of the inputs, and an output opens only after every input check.
files_never_lost() {
    local model="$tmp/corpus/model_llmc_bias_nonzero" keep="$tmp/keep.log" before
    cp "$tmp/corpus/valid_seed_valid" "$tmp/model.bin" && before=$(cksum < "$tmp/model.bin")
    expect_error "--log_file naming the model file" "is the same file as --llmc_filepath" \
        ./train_llama3 --llmc_filepath "$tmp/model.bin" --log_file "$tmp/model.bin"
    ln -sf "$tmp/model.bin" "$tmp/link.json"
    expect_error "--log_file through a link to the model file" "is the same file as --llmc_filepath" \
        ./train_llama3 --llmc_filepath "$tmp/model.bin" --log_file "$tmp/link.json"
    echo "an earlier run's log" > "$keep"
    expect_error "a run that fails on its token file" "cannot open token file" \
        ./train_llama3 --input_bin "$tmp/none.bin" --log_file "$keep"
    if [ "$(cksum < "$tmp/model.bin")" = "$before" ] && [ "$(cat "$keep")" = "an earlier run's log" ]; then
        echo "ok   the model file and an earlier log are unchanged after those runs"; passed=$((passed + 1))
    else echo "FAIL a refused run changed the model file or emptied an earlier log"; count_failure 1; fi
    expect_error "an llm.c bias that is not zero, before the GPU" "is not zero" ./train_llama3 --llmc_filepath "$model"
    expect_error "a token file through a pipe, <(cat ...)" "is a pipe or FIFO" \
        ./train_llama3 --input_bin <(cat data/tiny_shakespeare_val.bin)
    expect_error "an empty path" "--llmc_filepath: empty path" ./train_llama3 --llmc_filepath ""
}

# Broken checkpoints given to --resume: each one line before the GPU is touched (no GPU needed).
bad_checkpoints() {
    local c=$tmp/bad_ckpt
    mkdir -p "$c/step_00000005"
    echo step_00000005 > "$c/latest"
    expect_error "--resume: latest names a checkpoint without its files" "names an incomplete checkpoint" \
        ./train_llama3 --resume "$c"
    cp "$tmp/corpus/valid_seed_valid" "$c/step_00000005/model.bin"
    head -c 5000 /dev/urandom > "$c/step_00000005/state.bin"
    expect_error "--resume: a state file with a bad magic" "bad magic" ./train_llama3 --resume "$c"
    cp "$tmp/junk.bin" "$c/step_00000005/model.bin"
    expect_error "--resume: a checkpoint whose model.bin is not a model" "model.bin: bad magic" \
        ./train_llama3 --resume "$c/step_00000005"
    expect_error "--resume with --llmc_filepath" "cannot be used with it" \
        ./train_llama3 --resume "$c" --llmc_filepath "$c/step_00000005/model.bin"
}

# The host unit tests of llama3.h and the trainer's bad-input errors (no GPU needed).
host_tests() {
    LLAMA3_CORPUS_DIR="$tmp/corpus" run "host unit tests (llama3.h, ASan + UBSan) and the hostile corpus" \
        ./test_llama3_host
    corpus_through_trainer
    files_never_lost
    run "the scripts' file writing (scripts/safe_write.py)" python3 scripts/test_safe_write.py
    run "Hugging Face convert/export round trip" python3 scripts/test_hf_convert.py
    run "prepare_data.py: your own text and tokenizers" python3 scripts/test_prepare_data.py
    run "scripts/mutants.py: every mutant still plants its bug" python3 scripts/mutants.py --plant_check
    run "plot_log.py: a training log drawn, bad logs refused" python3 scripts/test_plot_log.py

    echo "== trainer bad-input errors"
    printf 'not a model file at all, just text padding it out to more than 1024 bytes %01100d' 0 > "$tmp/junk.bin"
    expect_error "unknown flag" "unknown flag '--bogus'" ./train_llama3 --bogus 1
    expect_error "bad value" "--batch_size: bad value 'x'" ./train_llama3 --batch_size x
    expect_error "missing model file" "cannot open model file" ./train_llama3 --llmc_filepath "$tmp/none.bin"
    expect_error "bad model magic" "bad magic" ./train_llama3 --llmc_filepath "$tmp/junk.bin"
    expect_error "missing token file" "cannot open token file" ./train_llama3 --input_bin "$tmp/none.bin"
    expect_error "bad token magic" "bad magic" ./train_llama3 --input_bin "$tmp/junk.bin"
    expect_error "sequence too long" "longer than the model allows" ./train_llama3 --sequence_length 8193
    expect_error "B*T not dividing total" "is not a multiple of" ./train_llama3 --batch_size 3
    expect_error "too few tokens" "not enough tokens for one batch" ./train_llama3 --input_bin data/tiny_shakespeare_val.bin --batch_size 8 --sequence_length 8192 --total_batch_size 65536
    expect_error "unwritable log file" "cannot open for writing" ./train_llama3 --log_file "$tmp/no/such/dir/log.json"
    bad_checkpoints
    # Every script the README names runs as it is named: executable, with a #! line.
    local s bad=""
    for s in $(grep -o 'scripts/[a-z_]*\.\(sh\|py\)' README.md | sort -u); do
        [ -x "$s" ] && head -n 1 "$s" | grep -q '^#!' || bad="$bad $s"
    done
    if [ -z "$bad" ]; then echo "ok   the README's scripts are executable"; passed=$((passed + 1)); else
        echo "FAIL the README names scripts that do not run as named:$bad"; count_failure 1; fi
    help_out=$(./train_llama3 --help 2>&1)
    if [ $? -eq 0 ] && echo "$help_out" | grep -q "^usage: "; then
        echo "ok   --help: the usage text, exit 0"
        passed=$((passed + 1))
    else
        echo "FAIL --help: no usage text, or a non-zero exit"
        count_failure 1
    fi
}
if [ "${LLAMA3_HOST_TESTS:-1}" = 0 ]; then
    skipped+=("host unit tests and the trainer's bad-input errors (left out by LLAMA3_HOST_TESTS=0)")
else
    host_tests
fi

# The references: name, then scripts/ref_llama3.py's arguments. Each exercises a path the others
# do not: one key tile (T=64, every switch), 16 key tiles of flash attention (T=1024, q and k
# initialised larger so that the softmax is peaked and its running max moves between tiles), B=8
# at two tiles, gradient accumulation (3 micro-steps per step), dense embedding AdamW, the 1B; and
# the real training loop's optimizer: a warmup + cosine schedule with gradient clipping that clips
# (norms ~3-5 against 1), with 3 micro-steps and linear decay, and with the dense embedding and wsd.
SMALL_REFS=(
    "small_sched --shape small --batch_size 4 --seq_len 64 --steps 5 --lr_schedule cosine --warmup_iters 2 --final_lr_frac 0.1 --grad_clip 1.0"
    "small_t64 --shape small --batch_size 4 --seq_len 64 --llmc"
    "small_t1024 --shape small --batch_size 2 --seq_len 1024 --qk_std 0.1"
    "small_b8 --shape small --batch_size 8 --seq_len 128"
    "small_accum --shape small --batch_size 4 --seq_len 64 --grad_accum 3"
    "small_dense --shape small --batch_size 4 --seq_len 64 --dense_embedding"
    "small_accum_clip --shape small --batch_size 4 --seq_len 64 --grad_accum 3 --lr_schedule linear --warmup_iters 1 --grad_clip 1.0"
    "small_dense_clip --shape small --batch_size 4 --seq_len 64 --steps 5 --dense_embedding --lr_schedule wsd --decay_frac 0.4 --grad_clip 1.0"
)
BIG_REF="1b --shape 1b --batch_size 4 --seq_len 64 --steps 2"
SWITCHES=("--flash_attention 0" "--shadow_weights 0" "--vector_adam 0" "--metadata_by_value 0"
    "--overlap_optimizer 0" "--bf16_grads 0" "--cuda_graph 0" "--fused_rmsnorm 0" "--deferred_adamw 0"
    "--deferred_adamw 1" "--delete_fills 0" "--grad_zeroing memset" "--grad_zeroing fill")
# With clipping every AdamW group is deferred to the next step; these change where AdamW runs instead.
CLIP_SWITCHES=("--overlap_optimizer 0" "--cuda_graph 0" "--bf16_grads 0" "--grad_zeroing memset" "--vector_adam 0")

# make_refs SPEC...: writes each missing or stale reference, all at once; prints the names made.
make_refs() {
    local spec name pids=() names=()
    mkdir -p ref
    for spec in "$@"; do
        name=${spec%% *}
        if [ -f "ref/${name}_state.bin" ] && [ "ref/${name}_state.bin" -nt scripts/ref_llama3.py ]; then
            names+=("$name")
            continue
        fi
        # shellcheck disable=SC2086
        python3 scripts/ref_llama3.py --name ${spec} --out_dir ref > "ref/${name}.log" 2>&1 &
        pids+=($!)
        names+=("$name")
    done
    for pid in "${pids[@]+"${pids[@]}"}"; do wait "$pid" || true; done
    for name in "${names[@]}"; do
        if [ -f "ref/${name}_state.bin" ]; then echo "$name"; else
            echo "FAIL reference $name: $(tail -n 3 "ref/${name}.log")" >&2
        fi
    done
}

# trainer_run NAME REF MODEL TOKENS: ./train_llama3 on the reference's files with its flags, every
# step's loss from --log_file against PyTorch's.
trainer_run() {
    local name=$1 ref=$2 model=$3 tokens=$4 flags
    flags=$(./test_llama3 --train_args "ref/$ref") || { count_failure 1; return; }
    # shellcheck disable=SC2086
    run "$name: train_llama3" ./train_llama3 $flags --llmc_filepath "$model" --input_bin "$tokens" \
        --log_file "$tmp/$ref.jsonl"
    run "$name: its losses against PyTorch" ./test_llama3 --log "$tmp/$ref.jsonl" "ref/$ref"
}

# A model with one NaN weight (a final-norm weight: every logit NaN): each step is skipped by the
# NaN guard and shown as skipped, and --max_bad_steps of them in a row stop the run, non-zero.
nan_guard_stops() {
    python3 - "$1" "$tmp/nan_model.bin" <<'PY'
import sys, numpy as np
w = np.fromfile(sys.argv[1], dtype=np.float32)
h = w[:256].view(np.int32)  # seed header: [3] vocab, [7] n_embd
V, C = int(h[3]), int(h[7])
w[len(w) - V * C - C + 3] = np.nan  # final_norm precedes lm_head (V x C) at the end
w.tofile(sys.argv[2])
PY
    expect_error "NaN guard: a model with a NaN weight stops after --max_bad_steps 3 skipped steps" \
        "steps 1..3 had a non-finite loss or gradient norm" ./train_llama3 --llmc_filepath "$tmp/nan_model.bin" \
        --input_bin "$2" --num_iteration 20 --max_bad_steps 3
    if ./train_llama3 --llmc_filepath "$tmp/nan_model.bin" --input_bin "$2" --num_iteration 20 --grad_clip 1 \
        --max_bad_steps 3 2>/dev/null | grep -c "SKIPPED" | grep -qx 3; then
        echo "ok   NaN guard with clipping: 3 step lines say SKIPPED"; passed=$((passed + 1))
    else echo "FAIL NaN guard with clipping: not 3 step lines saying SKIPPED"; count_failure 1; fi
}

# The val loss and samples read the weights between steps and leave training alone: 20 steps with
# --val_every 5 --sample_every 7 log the same losses as 20 steps without, bit for bit, with and
# without clipping (then every AdamW group is deferred); val at steps 5, 10, 15, 20, samples at 7, 14, 20.
eval_leaves_training() {
    local clip flags
    for clip in 0 1; do
        flags="--num_iteration 20 --lr_schedule cosine --warmup_iters 5 --learning_rate 1e-4 --grad_clip $clip"
        # shellcheck disable=SC2086
        ./train_llama3 $flags --log_file "$tmp/plain$clip.jsonl" > /dev/null 2>&1
        # shellcheck disable=SC2086
        ./train_llama3 $flags --val_every 5 --val_tokens 4096 --sample_every 7 --log_file "$tmp/eval$clip.jsonl" \
            > "$tmp/eval$clip.out" 2>&1
        if [ -s "$tmp/plain$clip.jsonl" ] && cmp -s <(grep -o '"loss": [^,]*' "$tmp/plain$clip.jsonl") \
            <(grep -o '"loss": [^,]*' "$tmp/eval$clip.jsonl") && [ "$(grep -c '"loss"' "$tmp/eval$clip.jsonl")" -eq 20 ] &&
            [ "$(grep -o '"step": [0-9]*, "loss": [^,]*, "lr": [^,]*, .*"val_loss"' "$tmp/eval$clip.jsonl" |
                grep -o '"step": [0-9]*' | tr -d '"step: ' | tr '\n' ' ')" = "5 10 15 20 " ] &&
            [ "$(grep -c '"sample_ids"' "$tmp/eval$clip.jsonl")" -eq 3 ] && grep -q "^sample at step 14" "$tmp/eval$clip.out"; then
            echo "ok   --val_every 5 --sample_every 7 (grad_clip $clip): the same 20 losses as without them"
            passed=$((passed + 1))
        else
            echo "FAIL --val_every/--sample_every (grad_clip $clip) changed the losses or did not log val and samples"
            tail -n 5 "$tmp/eval$clip.out"; count_failure 1
        fi
    done
}

# with_switches REF SWITCH...: test_llama3 on REF once per switch.
with_switches() {
    local ref=$1 switch
    shift
    for switch in "$@"; do
        # shellcheck disable=SC2086
        run "test_llama3 $ref $switch" ./test_llama3 "ref/$ref" $switch
    done
}

gpu_reference_tests() {
    local refs spec name specs=("${SMALL_REFS[@]}")
    case " ${LLAMA3_TEST_SHAPES:-small 1b} " in
        *" 1b "*) specs+=("$BIG_REF") ;;
        *) skipped+=("test_llama3 1b and its train_llama3 run (left out by LLAMA3_TEST_SHAPES)") ;;
    esac
    refs=" $(make_refs "${specs[@]}" | tr '\n' ' ') "
    for spec in "${specs[@]}"; do
        name=${spec%% *}
        if [[ "$refs" != *" $name "* ]]; then count_failure 1; continue; fi
        run "test_llama3 $name" ./test_llama3 "ref/$name"
        if [ "$name" = small_t64 ]; then
            with_switches "$name" "${SWITCHES[@]}"
            trainer_run "small_t64, seed model, uint32 tokens" small_t64 ref/small_t64_model.bin \
                ref/small_t64_tokens.bin
            trainer_run "small_t64, llm.c model, uint16 tokens" small_t64 ref/small_t64_model_llmc.bin \
                ref/small_t64_tokens16.bin
        fi
        [ "$name" = small_accum ] && trainer_run "small_accum, 3 micro-steps" small_accum \
            ref/small_accum_model.bin ref/small_accum_tokens.bin
        if [ "$name" = small_sched ]; then
            with_switches "$name" "${CLIP_SWITCHES[@]}"
            trainer_run "small_sched, cosine schedule and clipping" small_sched ref/small_sched_model.bin \
                ref/small_sched_tokens.bin
            nan_guard_stops ref/small_sched_model.bin ref/small_sched_tokens.bin
        fi
        [ "$name" = 1b ] && trainer_run "1b" 1b ref/1b_model.bin ref/1b_tokens.bin
    done
    run "checkpoints: exact resume, bad resumes, SIGKILL during saves" bash scripts/test_checkpoints.sh
    run "Hugging Face weights in and out of the trainer (scripts/test_hf_trainer.py)" python3 scripts/test_hf_trainer.py
}

dev_binaries=$(ls dev/*.cu 2>/dev/null | sed 's/\.cu$//')
if nvidia-smi -L >/dev/null 2>&1; then
    if python3 -c "import torch, transformers" >/dev/null 2>&1; then
        gpu_reference_tests
    else
        skipped+=("test_llama3 against every reference, and train_llama3 on their files (GPU present, but"\
" python3 has no torch and transformers for the reference)")
    fi
    expect_error "out of GPU memory" "out of GPU memory" ./train_llama3 --batch_size 32 --sequence_length 8192 --total_batch_size 262144 --num_iteration 1
    expect_error "a log that cannot be written stops the run" "--log_file /dev/full: write failed" \
        ./train_llama3 --num_iteration 3 --log_file /dev/full
    run "training smoke run (10 steps, loss must fall)" bash scripts/check_loss_falls.sh
    eval_leaves_training
    # Two processes, the same seed and flags (the default 1B at B=4, T=64: graph, deferred AdamW, sparse
    # embedding on): every logged loss the same (test_llama3 compares weights and losses bit for bit).
    for run in 1 2; do ./train_llama3 --num_iteration 50 --log_file "$tmp/det$run.jsonl" > /dev/null 2>&1; done
    if [ -s "$tmp/det1.jsonl" ] && cmp -s <(grep -o '"loss": [^,]*' "$tmp/det1.jsonl") \
        <(grep -o '"loss": [^,]*' "$tmp/det2.jsonl") && [ "$(wc -l < "$tmp/det1.jsonl")" -eq 50 ]; then
        echo "ok   two runs of 50 steps log the same losses"; passed=$((passed + 1))
    else echo "FAIL two runs of 50 steps with the same seed log different losses"; count_failure 1; fi
    if [ "${LLAMA3_DEV_CHECKS:-1}" = 0 ]; then
        skipped+=("dev/ kernel checks (left out by LLAMA3_DEV_CHECKS=0)")
    else
        for bin in $dev_binaries; do run "$bin --check" "$bin" --check; done
    fi
else
    skipped+=("test_llama3 against the PyTorch references (small T=64 with every switch, T=1024, B=8,"\
" 3 micro-steps, dense embedding, schedules with clipping, the NaN guard, 1B) (no GPU on this machine)"
        "train_llama3 on the references' files (seed and llm.c models, uint32 and uint16 tokens) (no GPU on this machine)"
        "out-of-memory error (no GPU on this machine)" "training smoke run (no GPU on this machine)"
        "a log that cannot be written (/dev/full) stops the run (no GPU on this machine)"
        "two runs of 50 steps log the same losses (no GPU on this machine)"
        "--val_every and --sample_every leave the 20 losses unchanged, with and without clipping (no GPU on this machine)"
        "checkpoints: exact resume, SIGKILL during saves (no GPU on this machine)"
        "Hugging Face model -> convert -> train -> export -> HF (scripts/test_hf_trainer.py) (no GPU on this machine)")
    for bin in $dev_binaries; do skipped+=("$bin --check (no GPU on this machine)"); done
fi
finish
