#!/usr/bin/env bash
# usage: scripts/run_tests.sh      (takes no arguments; make test runs it after make all)
# Example: LLAMA3_TEST_SHAPES=small scripts/run_tests.sh
# The driver of `make test` (run after `make all`). Everywhere: the scripts' Python packages
# installed when missing (requirements.txt), the host unit tests of llama3.h, the scripts' tests,
# the trainer's bad-input errors and the README's flag tables against its --help. On a machine with
# a GPU, also: test_llama3 against PyTorch references (scripts/ref_llama3.py, written to ref/ when
# missing or older than the script) that exercise every path, the trainer itself on a reference's
# files, the training runs, and every dev/ kernel check. Independent parts run at once (several fit
# on the GPU together), each into its own output, printed with a line of its counts and time in the
# order they started, as soon as it and those before it have ended. Ends with "N passed, M failed, K
# skipped" after the list of skipped parts and why (without a GPU, also that the GPU parts' skips are
# expected there and how to run them); exits non-zero if anything failed.
#   LLAMA3_TEST_LOG=FILE        (make test) the whole output goes to FILE, and the screen gets a line per
#                               part, the first 10 FAIL lines, the skipped parts and the summary
#   LLAMA3_BUILD_SECONDS=N      (make test) the build's time, which the "test time:" line adds in
#   LLAMA3_TEST_SHAPES="small"  leaves the 1B shape out (its reference writes ~42 GB to ref/)
#   LLAMA3_DEV_CHECKS=0         leaves the dev/ kernel checks out
#   LLAMA3_HOST_TESTS=0         leaves the host unit tests and the bad-input errors out (scripts/mutants.py
#                               --gpu_only: what the GPU tests alone catch)
#   LLAMA3_GPU_TESTS=0          leaves the GPU parts out on a GPU machine (scripts/mutants.py --host_only)
#   LLAMA3_FAIL_FAST=1          stops at the first failing part (scripts/mutants.py)
#   LLAMA3_MUTANT=NAME          this tree carries a planted bug: the mutants plant check is left out (scripts/mutants.py)
#   LLAMA3_TEST_JOBS=N          parts run at once (default: the CPU cores, at most 8)
set -u
. "$(dirname "$0")/cli.sh"
no_arguments "$@"
cd "$(dirname "$0")/.."
passed=0
failed=0
skipped=()
NO_GPU="(no GPU on this machine)" # the reason of the GPU parts skipped on a machine without one (finish counts them)
jobs_max=${LLAMA3_TEST_JOBS:-$(n=$(nproc 2>/dev/null || echo 2); echo $((n < 8 ? n : 8)))}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
t_start=$SECONDS
# The screen is fd 3: with LLAMA3_TEST_LOG, stdout and stderr go to the log and `show` prints a line to
# both; without, fd 3 is /dev/null and the output is the whole output.
if [ -n "${LLAMA3_TEST_LOG:-}" ]; then exec 3>&1 >> "$LLAMA3_TEST_LOG" 2>&1; else exec 3> /dev/null; fi
# (not `tee /dev/fd/3`: tee opens that path anew, truncating a screen that is a file: `make test > out`)
show() {
    printf '%s\n' "$@"
    printf '%s\n' "$@" >&3
}
# show_failures FILE: its FAIL lines to the screen too, the first 10 of the run (all are in the log).
fails_shown=0
show_failures() {
    local line
    while IFS= read -r line; do
        fails_shown=$((fails_shown + 1))
        if [ "$fails_shown" -le 10 ]; then echo "   $line" >&3
        elif [ "$fails_shown" = 11 ]; then echo "   (more FAIL lines in $LLAMA3_TEST_LOG)" >&3; fi
    done < <(grep -a '^FAIL' "$1")
}

finish() {
    local s n_gpu=0
    for s in "${skipped[@]+"${skipped[@]}"}"; do
        show "SKIPPED $s"
        [[ $s == *"$NO_GPU" ]] && n_gpu=$((n_gpu + 1))
    done
    if [ "$n_gpu" -gt 0 ]; then # (the sentence a user without a GPU reads: nothing is wrong)
        local others=$((${#skipped[@]} - n_gpu))
        show "$n_gpu of the ${#skipped[@]} skipped parts are the GPU parts, skipped as expected on a machine without a GPU$(
            [ "$others" -gt 0 ] && echo " (the other $others say why)")." \
            "To run them: \`make test\` on a machine with a CUDA GPU (compute capability 8.0 or newer) and python3" \
            "with torch and transformers (requirements-gpu.txt)."
    fi
    local secs=$((SECONDS - t_start)) build=${LLAMA3_BUILD_SECONDS:-}
    show "test time: ${build:+$((build + secs)) s (build $build s, tests }$secs s${build:+)}"
    [ -z "${LLAMA3_TEST_LOG:-}" ] || show "the whole output: $LLAMA3_TEST_LOG"
    show "$passed passed, $failed failed, ${#skipped[@]} skipped"
    [ "$failed" -eq 0 ]
    exit
}
count_failure() { failed=$((failed + $1)); }

# run NAME CMD...: a program that prints its own "N passed, M failed" line; its "skipped: ..." lines
# are counted as skipped parts.
run() {
    local name=$1 out rc line p f s
    shift
    echo "== $name: $*"
    out=$("$@" 2>&1)
    rc=$?
    echo "$out"
    line=$(echo "$out" | grep -aE '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    p=0 f=0
    if [ -n "$line" ]; then p=${line%% passed*}; f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/'); fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL $name exited with $rc"; fi
    if echo "$out" | grep -qE "ERROR: (Address|Leak)Sanitizer|runtime error:"; then f=$((f + 1)); echo "FAIL $name: a sanitizer report"; fi
    while IFS= read -r s; do skipped+=("${s#skipped: } ($name)"); done < <(echo "$out" | grep -a '^skipped: ')
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
        echo "ok   $name: $(echo "$out" | grep -aF -- "$frag" | head -n 1)"
        passed=$((passed + 1))
    else
        echo "FAIL $name (exit $rc, wanted '$frag'): $(echo "$out" | head -n 3 | one_line)"
        count_failure 1
    fi
}

# check OK NAME DETAIL: one pass or failure of a test written inline.
check() {
    if [ "$1" = 1 ]; then echo "ok   $2"; passed=$((passed + 1)); else echo "FAIL $2${3:+: $(one_line <<< "$3")}"; count_failure 1; fi
}
# one_line: its input's lines joined by " | ", so that a FAIL line that quotes output stays one line.
one_line() { sed ':a;N;$!ba;s/\n/ | /g'; }

# ---- parts: independent pieces run at once ----
# part NAME FUNC ARGS...: FUNC runs in the background with its own counts, its output to a file;
# collect prints the parts in the order they were started, with their times, and adds the counts.
part_names=() part_pids=()
part() {
    local name=$1 k=${#part_names[@]}
    shift
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
    collect ready
    (
        passed=0 failed=0 skipped=()
        start=$SECONDS
        "$@"
        echo "@@part $passed $failed $((SECONDS - start))"
        for s in "${skipped[@]+"${skipped[@]}"}"; do echo "@@skip $s"; done
    ) > "$tmp/part$k.out" 2>&1 &
    part_names+=("$name") part_pids+=($!)
    echo "-- start $name at $((SECONDS - t_start)) s"
}
# part_line NAME PASSED FAILED SKIPPED SECONDS: a part's line, what went wrong first.
part_line() {
    local counts="$2 passed"
    [ "$3" -gt 0 ] && counts="$3 FAILED, $counts"
    [ "$4" -gt 0 ] && counts="$counts, $4 skipped"
    [ "$2$3" = 00 ] && [ "$4" -gt 0 ] && counts="skipped"
    echo "-- part $1: $counts, $5 s"
}
# collect [ready]: prints the parts not yet printed, in the order they started, and adds their
# counts; with "ready", only up to the first one still running (so the output streams).
collected=0
collect() {
    local k out sum p f secs n_skip
    for ((k = collected; k < ${#part_names[@]}; k++)); do
        if [ "${1:-}" = ready ] && kill -0 "${part_pids[$k]}" 2> /dev/null; then break; fi
        wait "${part_pids[$k]}" 2> /dev/null # (one that wait -n took already has ended)
        out="$tmp/part$k.out"
        grep -av '^@@' "$out" # (-a: a line with bytes that are not text is printed, not dropped)
        sum=$(grep -a '^@@part ' "$out" | tail -n 1)
        if [ -z "$sum" ]; then echo "FAIL part ${part_names[$k]} ended without its counts" | tee -a "$out"; p=0 f=1 secs=0
        else read -r _ p f secs <<< "$sum"; fi
        n_skip=$(grep -ac '^@@skip ' "$out")
        show "$(part_line "${part_names[$k]}" "$p" "$f" "$n_skip" "$secs")"
        show_failures "$out"
        passed=$((passed + p)) failed=$((failed + f))
        while IFS= read -r s; do skipped+=("${s#@@skip }"); done < <(grep -a '^@@skip ' "$out")
        collected=$((k + 1))
        if [ "$f" -gt 0 ] && [ "${LLAMA3_FAIL_FAST:-0}" = 1 ]; then finish; fi
    done
}
# Waits for the parts running now (one that needs the GPU to itself starts after).
drain() { while [ -n "$(jobs -rp)" ]; do wait -n; done; }

# ---- the scripts' Python packages ----
# requirements.txt (the scripts: numpy, safetensors, tiktoken, matplotlib, pyarrow) and, on a GPU machine,
# requirements-gpu.txt (torch and transformers, for the reference): installed with pip only when
# one is missing, so a machine that has them all needs no network. A part that still lacks one
# says "skipped: ..." and is counted as skipped.
missing_packages() { # FILE: the distributions it names that python3 does not have
    python3 - "$1" <<'PY' 2>/dev/null || echo "(python3 failed)"
import re, sys
from importlib import metadata
for line in open(sys.argv[1]):
    name = re.split(r"[<>=!~;\[ #]", line.strip(), maxsplit=1)[0]
    if name:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            print(name)
PY
}
python_deps() {
    local list=requirements.txt want out
    nvidia-smi -L > /dev/null 2>&1 && [ "${LLAMA3_GPU_TESTS:-1}" != 0 ] && list="$list requirements-gpu.txt"
    for f in $list; do
        want=$(missing_packages "$f" | tr '\n' ' ')
        [ -z "${want// /}" ] && continue
        show "== installing the Python packages of $f that are missing: $want"
        if ! out=$(python3 -m pip install --quiet --disable-pip-version-check --retries 2 --timeout 15 -r "$f" 2>&1); then
            show "$(echo "$out" | tail -n 3 | sed 's/^/   /')" "   pip could not install them: the tests that need them are skipped"
        fi
    done
}

# ---- host parts (no GPU needed) ----

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
    [ "$n" -gt 0 ] && [ -z "$bad" ] && ok=1 || ok=0
    check $ok "train_llama3 refuses each of the $n corpus files in one line naming it" "$bad"
}

# The corpus's launch environments and output paths (test_llama3_host.c's LAUNCHER_CASES and
# OUTPUT_CASES that it refuses) through ./train_llama3 --dry_run 1: each refused in one line before the
# GPU, "error: " and the first variable (env_LABEL: NAME=VALUE lines, every other launcher variable
# unset) or the first flag and its path (output_LABEL: one argument a line).
launch_and_outputs_through_trainer() {
    local f n=0 bad="" expect args unset rc
    mapfile -t unset < "$tmp/corpus/env_unset"
    for f in "$tmp"/corpus/env_* "$tmp"/corpus/output_*; do
        [ "${f##*/}" = env_unset ] && continue
        mapfile -t args < "$f"
        n=$((n + 1))
        if [[ ${f##*/} == env_* ]]; then # (named: one of its variables, NAME=VALUE)
            env "${unset[@]}" "${args[@]}" ./train_llama3 --dry_run 1 > "$tmp/out" 2> "$tmp/err"
            rc=$? expect=$(grep -oF -f "$f" "$tmp/err" | head -n 1)
        else
            ./train_llama3 --dry_run 1 "${args[@]}" > "$tmp/out" 2> "$tmp/err"
            rc=$? expect="error: ${args[0]} ${args[1]}"
        fi
        [ "$rc" -ne 0 ] && [ -n "$expect" ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -q "^error: " "$tmp/err" &&
            grep -qF -- "$expect" "$tmp/err" || bad="$bad ${f##*/}($(head -c 200 "$tmp/err"))"
    done
    [ "$n" -gt 20 ] && [ -z "$bad" ] && ok=1 || ok=0
    check $ok "train_llama3 refuses each of the corpus's $n launch environments and output paths in one line" "$bad"
}

# The dry run names the rank and its launcher, and each output with its verdict (one line each); the
# checks make nothing.
dry_run_lines() {
    local out ok
    mkdir -p "$tmp/dry" && out=$(env RANK=0 WORLD_SIZE=1 ./train_llama3 "${TINY[@]}" --dry_run 1 \
        --log_file "$tmp/dry/run.jsonl" --checkpoint_dir "$tmp/dry/ck" --save_hf "$tmp/dry/hf" 2>&1)
    [ "$(head -n 1 <<< "$out")" = "rank 0 of 1 (from torchrun: RANK=0 WORLD_SIZE=1)" ] &&
        grep -qF "output: --log_file $tmp/dry/run.jsonl (a new file; the JSON log): can be written" <<< "$out" &&
        grep -qE "^output: --checkpoint_dir $tmp/dry/ck \(a new folder; 1 checkpoint of 0.19 MiB at once, 0.19 MiB of [0-9.]+ [GM]iB free\): can be written$" <<< "$out" &&
        grep -qE "^output: --save_hf $tmp/dry/hf \(a new folder; the Hugging Face folder, 0.0[0-9] MiB of [0-9.]+ [GM]iB free\): can be written$" <<< "$out" &&
        [ -z "$(ls -A "$tmp/dry")" ] && ok=1 || ok=0
    check $ok "--dry_run 1: the rank's line, then a line per output (log, checkpoints, HF folder) that can be written; nothing made" \
        "$(grep -E '^(rank|output)' <<< "$out")"
}

# Nothing is lost: no output is one of the inputs, and an output opens only after every input check.
files_never_lost() {
    local model="$tmp/corpus/model_llmc_bias_nonzero" keep="$tmp/keep.log" before ok
    cp "$tmp/corpus/valid_seed_valid" "$tmp/model.bin" && before=$(cksum < "$tmp/model.bin")
    expect_error "--log_file naming the model file" "is the same file as --llmc_filepath" \
        ./train_llama3 --llmc_filepath "$tmp/model.bin" --log_file "$tmp/model.bin"
    ln -sf "$tmp/model.bin" "$tmp/link.json"
    expect_error "--log_file through a link to the model file" "is the same file as --llmc_filepath" \
        ./train_llama3 --llmc_filepath "$tmp/model.bin" --log_file "$tmp/link.json"
    echo "an earlier run's log" > "$keep"
    expect_error "a run that fails on its token file" "cannot open token file" \
        ./train_llama3 --input_bin "$tmp/none.bin" --log_file "$keep"
    [ "$(cksum < "$tmp/model.bin")" = "$before" ] && [ "$(cat "$keep")" = "an earlier run's log" ] && ok=1 || ok=0
    check $ok "the model file and an earlier log are unchanged after those runs"
    expect_error "an llm.c bias that is not zero, before the GPU" "is not zero" ./train_llama3 --llmc_filepath "$model"
    expect_error "a token file through a pipe, <(cat ...)" "is a pipe or FIFO" \
        ./train_llama3 --input_bin <(cat data/tiny_shakespeare_val.bin)
    expect_error "an empty path" "--llmc_filepath: empty path" ./train_llama3 --llmc_filepath ""
}

# A run that stops after its inputs and outputs passed, where the GPU is looked at (none visible): an
# earlier log and the checkpoint folder are untouched, and stdout reaches a file a line at a time, so
# the step-free setup lines come before the error (block buffering would write them at exit, after
# it). The corpus's tiny model (TINY), whose checkpoints fit any disk; on a GPU machine also the 1B with
# a batch too large for its memory.
gpu_failure_loses_nothing() {
    local keep="$tmp/gpu_keep.log" ck="$tmp/gpu_ckpt" ok
    echo "an earlier run's log" > "$keep"
    CUDA_VISIBLE_DEVICES= ./train_llama3 "${TINY[@]}" --log_file "$keep" --checkpoint_dir "$ck" > "$tmp/gpu_fail.out" 2>&1
    [ $? -ne 0 ] && [ "$(cat "$keep")" = "an earlier run's log" ] && [ ! -e "$ck" ] && ok=1 || ok=0
    check $ok "a run that stops with 'no CUDA device found' leaves an earlier --log_file as it was and creates no --checkpoint_dir" \
        "$(tail -n 2 "$tmp/gpu_fail.out")"
    grep -q '^model: ' "$tmp/gpu_fail.out" && tail -n 1 "$tmp/gpu_fail.out" | grep -qF "no CUDA device found" && ok=1 || ok=0
    check $ok "stdout is line-buffered into a file: the setup lines come before the error on stderr" \
        "$(head -c 300 "$tmp/gpu_fail.out")"
    nvidia-smi -L > /dev/null 2>&1 || return
    ./train_llama3 --batch_size 32 --sequence_length 8192 --num_iteration 1 --log_file "$keep" > "$tmp/oom.out" 2>&1
    [ $? -ne 0 ] && [ "$(cat "$keep")" = "an earlier run's log" ] && tail -n 1 "$tmp/oom.out" | grep -qF "out of GPU memory" &&
        ok=1 || ok=0
    check $ok "a run that stops with 'out of GPU memory' leaves an earlier --log_file as it was" "$(tail -n 2 "$tmp/oom.out")"
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
    expect_error "--resume with --hf_dir" "cannot be used with it" ./train_llama3 --resume "$c" --hf_dir "$tmp"
}

# What a user types: each error one line on stderr that names the flag (and a near miss), the total
# batch following B and T, the val split of a user's token file.
user_errors() {
    local err ok
    ./train_llama3 --num_iterations 5 > /dev/null 2> "$tmp/typo.err"
    err=$(cat "$tmp/typo.err")
    [ "$(wc -l < "$tmp/typo.err")" -eq 1 ] && [[ "$err" == *"did you mean --num_iteration?"* && "$err" == *"--help"* ]] &&
        ok=1 || ok=0
    check $ok "a flag error is one line with a near miss and where the flags are listed" "$err"
    expect_error "unknown flag" "unknown flag '--bogus'" ./train_llama3 --bogus 1
    expect_error "bad value" "--batch_size: bad value 'x'" ./train_llama3 --batch_size x
    # (the data-parallel build wants the rendezvous; the one-GPU build trains no second rank)
    local refusal="rank 1 of 2 ranks"
    trainer_nccl_lib > /dev/null && refusal="--rendezvous file:PATH or tcp:HOST:PORT is needed"
    expect_error "a process of torchrun (RANK, WORLD_SIZE) without a rendezvous: refused, not trained twice" "$refusal" \
        env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 ./train_llama3
    expect_error "B*T not dividing the total batch: what to pass" "pass 512 (2 micro-steps)" \
        ./train_llama3 --batch_size 4 --total_batch_size 300
    expect_error "--val_every with a token file that has no val split beside it" "pass --val_bin" \
        ./train_llama3 --input_bin data/tiny_shakespeare_val.bin --val_every 5
    if ! nvidia-smi -L > /dev/null 2>&1; then
        # These pass every input check and stop only at the GPU.
        expect_error "--batch_size 8 --sequence_length 1024 alone pass the checks" "no CUDA device found" \
            ./train_llama3 --batch_size 8 --sequence_length 1024
        expect_error "no GPU: CUDA's own error and the compute capability needed" "compute capability 8.0 or newer" \
            ./train_llama3
    fi
    # --shape: the random init's shape, printed before the GPU is looked at (none visible here)
    local out
    out=$(CUDA_VISIBLE_DEVICES= ./train_llama3 --shape 3b 2>&1)
    [[ "$out" == *"LLaMA 3.2-3B shape"* && "$out" == *"n_layer 28 | n_head 24 | n_kv_head 8"* &&
        "$out" == *"n_embd 3072 | head_dim 128 | ffn_hidden 8192"* && "$out" == *"(factor 32) | tied 1"* ]] && ok=1 || ok=0
    check $ok "--shape 3b: LLaMA 3.2-3B's shape, tied, RoPE factor 32" "$(head -n 3 <<< "$out")"
    out=$(CUDA_VISIBLE_DEVICES= ./train_llama3 --shape 8b 2>&1)
    [[ "$out" == *"LLaMA 3.1-8B shape"* && "$out" == *"n_layer 32 | n_head 32 | n_kv_head 8"* &&
        "$out" == *"n_embd 4096 | head_dim 128 | ffn_hidden 14336"* && "$out" == *"(factor 8) | tied 0"* ]] && ok=1 || ok=0
    check $ok "--shape 8b: LLaMA 3.1-8B's shape, untied, RoPE factor 8" "$(head -n 3 <<< "$out")"
    expect_error "--shape beside a model file: refused before the file is read" "--shape 8b: --llmc_filepath gives" \
        ./train_llama3 --shape 8b --llmc_filepath "$tmp/none.bin"
    # [document mask] the setup names the documents' BOS; one past the vocabulary is refused
    out=$(./train_llama3 --doc_mask 1 --dry_run 1 2>&1)
    [[ "$out" == *"documents: each starts at token 128000, attention within each"* ]] && ok=1 || ok=0
    check $ok "--doc_mask 1: the setup names the documents' BOS, LLaMA 3's 128000" "$(grep -m 1 documents <<< "$out")"
    expect_error "--bos_id past the vocabulary" "--bos_id 200000 is past the vocabulary (128256 tokens)" \
        ./train_llama3 --doc_mask 1 --bos_id 200000
    if command -v cuobjdump > /dev/null; then
        cuobjdump --list-ptx train_llama3 2>&1 | grep -q 'sm_80\|compute_80' && ok=1 || ok=0
        check $ok "train_llama3 carries compute_80 PTX, which the driver compiles for GPUs newer than the build" \
            "$(cuobjdump --list-ptx train_llama3 2>&1 | head -n 3)"
    else
        skipped+=("train_llama3 carries PTX for newer GPUs (no cuobjdump on this machine)")
    fi
}

# The trainer's bad-input errors, in one part (they read the corpus the host unit tests wrote).
trainer_errors() {
    # TINY: the corpus's tiny model (C 32, 4 heads of 8: unfused attention) on 2,000 tokens of its 64
    python3 -c 'import struct, sys; open(sys.argv[1], "wb").write(struct.pack("<256i", 20240801, 7, 2000, *[0] * 253)
                + struct.pack("<2000I", *[i % 64 for i in range(2000)]))' "$tmp/tiny_tokens.bin"
    TINY=(--llmc_filepath "$tmp/corpus/valid_seed_valid" --input_bin "$tmp/tiny_tokens.bin" --flash_attention 0)
    corpus_through_trainer
    launch_and_outputs_through_trainer
    dry_run_lines
    files_never_lost
    gpu_failure_loses_nothing
    printf 'not a model file at all, just text padding it out to more than 1024 bytes %01100d' 0 > "$tmp/junk.bin"
    expect_error "missing model file" "cannot open model file" ./train_llama3 --llmc_filepath "$tmp/none.bin"
    expect_error "bad model magic" "bad magic" ./train_llama3 --llmc_filepath "$tmp/junk.bin"
    expect_error "missing token file" "cannot open token file" ./train_llama3 --input_bin "$tmp/none.bin"
    expect_error "bad token magic" "bad magic" ./train_llama3 --input_bin "$tmp/junk.bin"
    expect_error "sequence too long" "longer than the model allows" ./train_llama3 --sequence_length 131073
    expect_error "too few tokens" "not enough tokens for one batch" ./train_llama3 --input_bin data/tiny_shakespeare_val.bin --batch_size 8 --sequence_length 8192 --total_batch_size 65536
    expect_error "unwritable log file" "--log_file $tmp/no/such/dir/log.json: cannot be written: its folder $tmp/no/such/dir does not exist" \
        ./train_llama3 --log_file "$tmp/no/such/dir/log.json"
    expect_error "a directory as --log_file, before the GPU" "--log_file $tmp: is a directory, not a file to write" \
        ./train_llama3 --log_file "$tmp"
    printf 'a text file, 42 bytes, where one was meant' > "$tmp/text42.txt"
    expect_error "a 42-byte text file as --input_bin" "not a token file (42 bytes, shorter than the 1024-byte header)" \
        ./train_llama3 --input_bin "$tmp/text42.txt"
    # shards and the eval file, before the GPU
    expect_error "a glob of no token file" "no file matches" ./train_llama3 --input_bin "$tmp/none_*.bin"
    expect_error "a list with a missing shard" "$tmp/none.bin: cannot open token file" \
        ./train_llama3 --input_bin "data/tiny_shakespeare_val.bin,$tmp/none.bin"
    python3 -c 'import struct, sys; open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, 300, *[0] * 253)
                + struct.pack("<300H", *range(300)))' "$tmp/gpt2.bin"
    expect_error "a shard of another token format" "one token format per list" \
        ./train_llama3 --input_bin "data/tiny_shakespeare_val.bin,$tmp/gpt2.bin"
    expect_error "--eval_every without --eval_file" "--eval_every takes --eval_file" ./train_llama3 --eval_every 5
    expect_error "a model file as --eval_file" "bad magic" \
        ./train_llama3 --eval_file "$tmp/junk.bin" --eval_every 5
    # a Hugging Face folder (--hf_dir), before the GPU (its reader's own cases: scripts/test_hf_convert.py)
    expect_error "--hf_dir and --llmc_filepath together" "give the model one way" \
        ./train_llama3 --hf_dir "$tmp" --llmc_filepath "$tmp/junk.bin"
    expect_error "--hf_dir naming a folder that does not exist" "$tmp/Llama-3.2-1B: no such folder" \
        ./train_llama3 --hf_dir "$tmp/Llama-3.2-1B"
    expect_error "--hf_dir naming a folder without config.json" "$tmp: no config.json" ./train_llama3 --hf_dir "$tmp"
    expect_error "--hf_dir with --shape" "--shape 8b: --hf_dir gives the model's shape" \
        ./train_llama3 --hf_dir "$tmp" --shape 8b
    expect_error "--save_hf naming the --hf_dir folder" "is the --hf_dir folder, an input" \
        ./train_llama3 --hf_dir "$tmp" --save_hf "$tmp/"
    expect_error "--save_hf naming a file" "--save_hf $tmp/junk.bin: cannot be written: $tmp/junk.bin is a regular file, not a folder" \
        ./train_llama3 --save_hf "$tmp/junk.bin"
    expect_error "--save_hf in a folder that does not exist" "--save_hf $tmp/none/out: cannot be written: its folder $tmp/none does not exist" \
        ./train_llama3 --save_hf "$tmp/none/out"
    expect_error "--save_hf_checkpoints without --checkpoint_dir" "--save_hf_checkpoints 1 takes --checkpoint_dir" \
        ./train_llama3 --save_hf_checkpoints 1
    expect_error "--save_hf_dtype float32 without an HF folder to write" "--save_hf_dtype float32 takes --save_hf" \
        ./train_llama3 --save_hf_dtype float32
    expect_error "an unquoted glob, expanded by the shell: quote it" "unexpected argument 'data/tiny_shakespeare_val.bin' after --input_bin data/tiny_shakespeare_train.bin: a path flag takes one value; quote a glob" \
        ./train_llama3 --input_bin data/tiny_shakespeare_*.bin
    bad_checkpoints
    user_errors
    # Every script the README names runs as it is named: executable, with a #! line.
    local s bad="" ok
    for s in $(grep -o 'scripts/[a-z_]*\.\(sh\|py\)' README.md | sort -u); do
        [ -x "$s" ] && head -n 1 "$s" | grep -q '^#!' || bad="$bad $s"
    done
    [ -z "$bad" ] && ok=1 || ok=0
    check $ok "the README's scripts are executable" "the README names scripts that do not run as named:$bad"
    ./train_llama3 --help 2>&1 | grep -q "^usage: " && ok=1 || ok=0
    check $ok "--help: the usage text, exit 0"
}

host_unit_tests() {
    LLAMA3_CORPUS_DIR="$tmp/corpus" run "host unit tests (llama3.h, ASan + UBSan) and the hostile corpus" \
        ./test_llama3_host
    trainer_errors
}

# The README's flag tables are ./train_llama3 --help's (scripts/flag_table.py: a stale table, or one
# without its markers, is one line and exit 1; --write mends it), and the switch lists of the GPU
# parts are ./train_llama3 --list_switches's.
flag_tables() {
    local out ok readme="$tmp/README.md"
    echo "== flag table: scripts/flag_table.py against ./train_llama3 --help, the switch lists against --list_switches"
    out=$(python3 scripts/flag_table.py --check README.md 2>&1) && ok=1 || ok=0
    check "$ok" "README.md's flag tables are ./train_llama3 --help's (scripts/flag_table.py --check)" "$out"
    # shellcheck disable=SC2016 # (the backquotes are the table's)
    sed 's/^| `--batch_size N` | [^|]*|/| `--batch_size N` | 8 |/' README.md > "$readme"
    expect_error "flag_table.py --check: a stale table, the line named" "$readme line" \
        python3 scripts/flag_table.py --check "$readme"
    python3 scripts/flag_table.py --write "$readme" > /dev/null && cmp -s README.md "$readme" && ok=1 || ok=0
    check "$ok" "flag_table.py --write mends the stale table and nothing else"
    grep -v '^<!-- end of flag table -->$' README.md > "$readme"
    expect_error "flag_table.py --check: a README without its end marker" "occurs 0 times" \
        python3 scripts/flag_table.py --check "$readme"
    switch_lists
    readme_recipes
    combination_table
    dry_run_memory
}

# --dry_run 1 prints the run's memory without a GPU (the GPU part compares it with the run's), and a
# rank of two holds its share of AdamW's state (ZeRO-1), less than one rank's whole.
dry_run_memory() {
    local one two flags="--dry_run 1 --batch_size 16 --sequence_length 1024 --total_batch_size 32768" ok
    # shellcheck disable=SC2086
    one=$(./train_llama3 $flags 2>&1)
    echo "$one" | grep -q '^memory: [0-9.]* GiB: weights' && echo "$one" | grep -q '^dry run: ' && ok=1 || ok=0
    check $ok "--dry_run 1: the memory by part, and the dry run's line, without a GPU" "$(echo "$one" | tail -n 2)"
    local big
    big=$(./train_llama3 --dry_run 1 --shape 8b --batch_size 1 --sequence_length 2048 --total_batch_size 65536 \
        --optimizer_state bf16 --recompute 1 2>&1)
    echo "$one" | grep -q '^fits, with 1.00 GiB for code and libraries: 80 GB (H100, about 79 GiB free) yes, 141 GB (H200, about 139 GiB free) yes$' &&
        echo "$big" | grep -q '^fits, [^:]*: 80 GB ([^)]*) no, 141 GB ([^)]*) yes. Smaller: --master_weights bf16 (frees the fp32 masters. 27.96 GiB), --recompute 2' &&
        ok=1 || ok=0
    check $ok "--dry_run 1 says which card each fits: the 1B at B=16, T=1024 both, the 8B recipe only 141 GB, and what shrinks it" \
        "$(echo "$one" | grep '^fits') | $(echo "$big" | grep '^fits')"
    # What a run takes beyond its buffers counts: the 3B at B=8, T=1024 (78.66 GiB of buffers) passed the
    # check without it and ran out of memory at the start on an H100 (2026-12-07).
    local edge
    edge=$(./train_llama3 --dry_run 1 --shape 3b --batch_size 8 --sequence_length 1024 --total_batch_size 65536 2>&1)
    echo "$edge" | grep -q '^memory: 78.66 GiB' && echo "$edge" | grep -q '^fits, [^:]*: 80 GB ([^)]*) no' && ok=1 || ok=0
    check $ok "--dry_run 1: the 3B at B=8, T=1024 with fp32 state, 78.66 GiB of buffers, does not fit 80 GB" \
        "$(echo "$edge" | grep -E '^(memory|fits)')"
    # [bf16 weights] The 8B's matmul weights without fp32 masters (6.98 G weights, 4 bytes each) and
    # --recompute 2: the recipe's 32 micro-steps of B=1, T=2048 on an 80 GB card.
    local lean
    lean=$(./train_llama3 --dry_run 1 --shape 8b --batch_size 1 --sequence_length 2048 --total_batch_size 65536 \
        --optimizer_state bf16 --recompute 2 --master_weights bf16 2>&1)
    echo "$lean" | grep -q '^fits, [^:]*: 80 GB ([^)]*) yes' && ok=1 || ok=0
    check $ok "--dry_run 1: the 8B recipe with --master_weights bf16 --recompute 2 fits 80 GB" "$(echo "$lean" | grep -E '^(memory|fits)')"
    # [long context] The 1B at T = 131072, B = 1: its classifier in 8 chunks of 16384 rows (3.91 GiB of logits, not
    # all rows' 31.3), 202.55 GiB in all, and the advice: --recompute 2 (which alone fits it on 80 GB) and a
    # smaller classifier chunk; unfused, the T x T buffers named first.
    local long unfused
    long=$(./train_llama3 --dry_run 1 --batch_size 1 --sequence_length 131072 2>&1)
    echo "$long" | grep -q '^classifier: 131072 rows in 8 chunks of 16384, logits 3.91 GiB$' &&
        echo "$long" | grep -q '^memory: 202.55 GiB' &&
        echo "$long" | grep -q '^fits, [^:]*: 80 GB ([^)]*) no, 141 GB ([^)]*) no. Smaller: .*--recompute 2 (activations 40.70 GiB), .*--classifier_chunk 4096 (frees 2.94 GiB of logits), a smaller --batch_size or --sequence_length' &&
        ./train_llama3 --dry_run 1 --batch_size 1 --sequence_length 131072 --recompute 2 2>&1 | grep -q '^fits, [^:]*: 80 GB ([^)]*) yes' &&
        ok=1 || ok=0
    check $ok "--dry_run 1 at T = 131072: the classifier in 8 chunks, the memory and what shrinks it (--recompute 2 fits 80 GB)" \
        "$(echo "$long" | grep -E '^(memory|classifier|fits)')"
    unfused=$(./train_llama3 --dry_run 1 --batch_size 1 --sequence_length 131072 --flash_attention 0 2>&1)
    echo "$unfused" | grep -q '^fits, [^:]*: 80 GB ([^)]*) no, 141 GB ([^)]*) no. Smaller: --flash_attention 1 (frees the unfused attention.s T x T scores and probabilities, 18431.73 GiB)' &&
        ok=1 || ok=0
    check $ok "--dry_run 1 --flash_attention 0 at T = 131072: --flash_attention 1 named first, with the T x T buffers' GiB" \
        "$(echo "$unfused" | grep '^fits' | cut -c 1-300)"
    # [offload] --offload_optimizer 1 moves m and v out of the GPU's total into pinned host memory.
    local host
    # shellcheck disable=SC2086
    host=$(./train_llama3 $flags --offload_optimizer 1 2>&1)
    gpu_total() { echo "$1" | grep -o '^memory: [0-9.]*' | grep -o '[0-9.]*$'; }
    moments() { echo "$1" | grep -o 'AdamW m and v [0-9.]*' | head -n 1 | grep -o '[0-9.]*$'; }
    awk -v g1="$(gpu_total "$one")" -v g2="$(gpu_total "$host")" -v m="$(moments "$one")" \
        -v h="$(echo "$host" | grep -o 'in pinned host memory: AdamW m and v [0-9.]*' | grep -o '[0-9.]*$')" \
        'BEGIN { exit !(m > 0 && h == m && g1 - g2 > m - 0.02 && g1 - g2 < m + 0.02) }' && ok=1 || ok=0
    check $ok "--dry_run 1 --offload_optimizer 1: AdamW's m and v ($(moments "$one") GiB) leave the GPU's total for pinned host memory" \
        "$(echo "$host" | grep '^memory')"
    # shellcheck disable=SC2086
    two=$(RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 ./train_llama3 $flags --rendezvous tcp:localhost:29601 2>&1)
    if echo "$two" | grep -q 'built without NCCL'; then echo "skipped: --dry_run 1 of a rank of two (train_llama3 built without NCCL)"; return; fi
    awk -v a="$(moments "$two")" -v b="$(moments "$one")" 'BEGIN { exit !(a > 0 && a < b) }' && ok=1 || ok=0
    check $ok "--dry_run 1 as rank 0 of 2: AdamW's m and v $(moments "$two") GiB, this rank's share of one rank's $(moments "$one") GiB" \
        "$(echo "$two" | tail -n 2)"
    # [fp8] The ranks all-gather the block linears' e4m3 copies, not their bf16 ones: one byte less per
    # weight of the 1B's block linears, 16 layers of qkv (3072 x 2048), attn_out (2048 x 2048), gate_up
    # (16384 x 2048) and down (2048 x 8192).
    local fp8 gathered
    # shellcheck disable=SC2086
    fp8=$(RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 ./train_llama3 $flags --fp8 1 --rendezvous tcp:localhost:29601 2>&1)
    gathered() { echo "$1" | grep -o '[0-9.]* GiB of weights gathered' | grep -o '^[0-9.]*'; }
    awk -v bf16="$(gathered "$two")" -v fp8="$(gathered "$fp8")" -v w=$((16 * (3072 + 2048 + 16384 + 8192) * 2048)) \
        'BEGIN { less = w / 1073741824; exit !(fp8 > 0 && bf16 - fp8 > less - 0.002 && bf16 - fp8 < less + 0.002) }' && ok=1 || ok=0
    check $ok "--dry_run 1 as rank 0 of 2: --fp8 1 gathers $(gathered "$fp8") GiB of weights a step, bf16 $(gathered "$two"): the block linears' one byte less a weight" \
        "$(echo "$fp8" | grep collectives)"
}

# The README's table of which modes combine is the trainer's own verdicts (--dry_run 1 on each cell),
# and a row that no longer says what the trainer says is named: against a stand-in trainer that refuses
# every cell (each README row is then stale; 324 starts of a shell, not of the trainer). A trainer built
# without NCCL cannot judge the ranks cells: skipped.
combination_table() {
    local out rc refuses="$tmp/refuses_every_cell"
    out=$(python3 scripts/combinations.py --check README.md 2>&1)
    rc=$?
    if [ "$rc" = 3 ]; then echo "$out"; return; fi
    check $((rc == 0)) "README.md's combination table is ./train_llama3 --dry_run 1's (scripts/combinations.py --check)" "$out"
    printf '#!/bin/sh\necho "error: a stand-in that refuses every cell" >&2\nexit 1\n' > "$refuses" && chmod +x "$refuses"
    expect_error "combinations.py --check: a row the trainer does not give, the line named" \
        "first difference at README.md line" python3 scripts/combinations.py --binary "$refuses" --check README.md
}

# The README's recipes (scripts/test_recipes.sh --list, which make test-recipes runs on a GPU): each
# parses, and on a machine without a GPU each ./train_llama3 command that needs no file an earlier
# command makes passes every check before the GPU (its flags and values) and stops only for want of it.
readme_recipes() {
    local list n cmd out ok
    list=$(bash scripts/test_recipes.sh --list 2>&1)
    n=$(echo "$list" | grep -c '^recipe ')
    ! echo "$list" | grep -q '^error ' && [ "$n" -ge 6 ] && ok=1 || ok=0
    check $ok "the README's $n recipes parse (scripts/test_recipes.sh --list)" "$(echo "$list" | grep -v '^cmd ' | head -n 3)"
    recipe_checks
    nvidia-smi -L > /dev/null 2>&1 && return
    mkdir -p "$tmp/recipes" && ln -sf "$PWD/train_llama3" "$tmp/recipes/"
    while IFS= read -r cmd; do
        out=$(cd "$tmp/recipes" && timeout 60 bash -c "$cmd" 2>&1)
        # (or every check but the free space of a disk too small for the recipe's checkpoints)
        echo "$out" | grep -q "^error: no CUDA device found\|^error: --checkpoint_dir .* free, and the run writes up to" &&
            ok=1 || ok=0
        check $ok "a recipe's flags pass every check before the GPU: ${cmd:0:70}..." "$(echo "$out" | grep -m 1 '^error')"
    done < <(echo "$list" | sed -n 's/^cmd \(\.\/train_llama3 .*\)/\1/p' | grep -v -- '--resume\|--llmc_filepath\|--hf_dir')
}

# The checks test_recipes.sh makes of a recipe's outputs pass on a folder holding what the recipe
# leaves (log lines as the trainer writes them: a due val loss in the step's line, a sample's line after
# it), and fail on one whose log repeats a step (a resume that logged step 1000 twice).
recipe_checks() {
    local d=$tmp/recipe_outputs ok s
    mkdir -p "$d/ckpt/step_00002000" "$d/my-llama"
    for s in $(seq 1 2000); do echo "{\"step\": $s, \"loss\": 5.1, \"lr\": 3e-4, \"ms\": 17.9}"; done > "$d/parts.jsonl"
    # the first recipe's last step: its val loss in the step's line, then its sample's line
    sed '$ s/, "ms"/, "val_loss": 5.6, "ms"/' "$d/parts.jsonl" > "$d/run.jsonl"
    echo '{"step": 2000, "sample_ids": [128000, 12]}' >> "$d/run.jsonl"
    for s in $(seq 1 199); do echo "{\"step\": $s, \"loss\": 3.2}"; done > "$d/mine.jsonl"
    echo '{"step": 200, "loss": 3.2, "val_loss": 3.3}' >> "$d/mine.jsonl"
    head -n 99 "$d/mine.jsonl" > "$d/long.jsonl" && echo '{"step": 100, "loss": 3.1, "val_loss": 3.2}' >> "$d/long.jsonl"
    touch "$d/ckpt/step_00002000/state.bin" && echo x > "$d/run.png"
    for s in config.json model.safetensors tokenizer.json; do echo x > "$d/my-llama/$s"; done
    ok=1
    for s in embedded resume finetune longcontext; do bash scripts/test_recipes.sh --check $s "$d" || ok=0; done
    sed -i '1000p' "$d/parts.jsonl"
    ! bash scripts/test_recipes.sh --check resume "$d" || ok=0
    check $ok "test_recipes.sh's output checks pass on whole outputs (embedded, resume, finetune, longcontext) and fail on a log with a step twice"
}

# switch_lists: --list_switches gives the settings of every switch, and each of CLIP_SWITCHES and
# TIED_SWITCHES is one.
switch_lists() {
    local s bad="" ok
    for s in "${CLIP_SWITCHES[@]}" "${TIED_SWITCHES[@]}"; do grep -qxF -- "$s" <<< "$ALL_SWITCHES" || bad="$bad '$s'"; done
    [ -n "$ALL_SWITCHES" ] && [ -n "${SWITCHES[0]:-}" ] && [ -z "$bad" ] && ok=1 || ok=0
    check "$ok" "./train_llama3 --list_switches: ${#SWITCHES[@]} settings for small_t64, and each of CLIP_SWITCHES and TIED_SWITCHES" \
        "not among them:${bad:- (it printed nothing)}"
}

# bench_torch.py --ddp (the PyTorch DDP peer of scripts/bench.sh --ranks) on the CPU: two gloo ranks
# through torchrun train the small shape on their own tokens; the script stops when their weights
# differ after the steps (gradients not averaged across the ranks).
ddp_peer_on_cpu() {
    local out ok
    echo "== bench_torch.py --ddp --device cpu: two ranks through torchrun"
    out=$(OMP_NUM_THREADS=2 timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node 2 \
        scripts/bench_torch.py --ddp --device cpu --shape small --batch_size 2 --seq_len 32 --steps 2 --warmup 1 2>&1)
    grep -q '"ranks_agree": true' <<< "$out" && ok=1 || ok=0
    check $ok "bench_torch.py --ddp: two gloo ranks of PyTorch's DDP peer, on the CPU, end with the same weights" \
        "$(grep -m 2 -iE 'error|Traceback' <<< "$out")"
}

# make test's screen as scripts/check_test_output.py checks it (.ci/run checks the real one): a made-up
# screen of two parts passes, and each fault of issue 65 fails with its check named: a progress line, the
# parts out of their start order, a test time without the build's, 65 lines.
screen_checks() {
    local d=$tmp/screen ok=1 fault want
    mkdir -p "$d"
    printf -- '-- start %s at 0 s\n' "host" "flag table" > "$d/log"
    cat > "$d/good" <<'EOF'
build: make train_llama3 test_llama3_host compile-check, 2 at once
-- build: 20 targets, 80 s
-- part host: 3 passed, 50 s
-- part flag table: 1 FAILED, 2 passed, 1 skipped, 40 s
   FAIL a check
SKIPPED a GPU part (no GPU on this machine)
SKIPPED a script's part (flag table)
test time: 170 s (build 80 s, tests 90 s)
the whole output: build/make_test.log
5 passed, 1 failed, 2 skipped
EOF
    python3 scripts/check_test_output.py "$d/good" "$d/log" > "$d/good.out" 2>&1 || ok=0
    sed '3a encoded 0.0 of 0.0 MB (22 %)' "$d/good" > "$d/progress"
    awk 'NR == 3 { first = $0; next } NR == 6 { print first } { print }' "$d/good" > "$d/order"
    sed 's/^test time: .*/test time: 90 s/' "$d/good" > "$d/time"
    { seq -f '   FAIL detail %g' 55; cat "$d/good"; } > "$d/long"
    for fault in "progress:every line is one" "order:a line per part" "time:one test time line" "long:65 lines"; do
        want=${fault#*:} fault=${fault%%:*}
        ! python3 scripts/check_test_output.py "$d/$fault" "$d/log" > "$d/$fault.out" 2>&1 &&
            grep -q "^FAIL $want" "$d/$fault.out" || ok=0
    done
    check $ok "check_test_output.py passes a made-up make test screen, fails one with a progress line, parts out of order, no build time, 65 lines" \
        "$(cat "$d"/*.out | grep -v '^ok')"
}

# make sanitize's parts that need no GPU: scripts/sanitize_report.py on made-up compute-sanitizer logs (a
# report in a kernel of ours, a race inside cuBLASLt's, a clean run, one out of time), and sanitize.sh's
# settings: a wrong tool, case or count refused in one line, exit 2; SANITIZE_DRY_RUN=1 its runs and estimate.
sanitize_checks() {
    local d=$tmp/sanitize ok out n_dev
    mkdir -p "$d"
    printf '========= ERROR SUMMARY: 0 errors\n' > "$d/train_default.memcheck.log"
    printf '%s\n' "========= Invalid __global__ read of size 4 bytes" "=========     at void rope_kernel(float *)+0x1a0" \
        "========= ERROR SUMMARY: 1 error" > "$d/dev_rope.memcheck.log"
    printf '%s\n' "========= Error: Race reported between Write access at void nvjet_sm90_tst(int)+0x10" \
        "========= RACECHECK SUMMARY: 1 hazard displayed" > "$d/dev_cast.racecheck.log"
    : > "$d/dev_sample.racecheck.log"
    echo 124 > "$d/dev_sample.racecheck.rc"
    for f in train_default.memcheck dev_rope.memcheck dev_cast.racecheck; do echo 0 > "$d/$f.rc"; echo 7 > "$d/$f.seconds"; done
    out=$(python3 scripts/sanitize_report.py "$d" memcheck racecheck 2>&1)
    [ $? = 1 ] && grep -q '^| memcheck | dev_rope | 1 | 0 | FAIL | 7 |$' <<< "$out" && grep -q '| dev_sample | 0 | 0 | timed out |' <<< "$out" &&
        [ "$(tail -n 1 <<< "$out")" = "2 passed, 2 failed; reports in our kernels: memcheck 1, racecheck 0; in NVIDIA's libraries: memcheck 0, racecheck 1" ] &&
        [ "$(python3 scripts/sanitize_report.py "$d" racecheck --case dev_cast)" = "racecheck dev_cast: ok, 0 reports in our kernels, 1 in NVIDIA's libraries, 7 s" ] &&
        ok=1 || ok=0
    check $ok "sanitize_report.py on made-up logs: ours FAIL, the library's race ok, the time limit named; one summary line of each tool's reports" "$out"
    expect_error "SANITIZE_TOOLS with no such tool" "SANITIZE_TOOLS: no tool 'memchek'" env SANITIZE_TOOLS=memchek bash scripts/sanitize.sh
    expect_error "SANITIZE_CASES with no such case" "SANITIZE_CASES: no case 'train_nope*'" env SANITIZE_CASES="dev_* train_nope*" bash scripts/sanitize.sh
    expect_error "SANITIZE_JOBS 0" "SANITIZE_JOBS=0: a positive whole number" env SANITIZE_JOBS=0 bash scripts/sanitize.sh
    out=$(SANITIZE_DRY_RUN=1 SANITIZE_TOOLS="memcheck racecheck" SANITIZE_CASES="train_default dev_*" bash scripts/sanitize.sh 2>&1)
    n_dev=$(ls dev/*.cu | grep -vc nccl)
    [ -x dev/nccl ] && n_dev=$((n_dev + 1))
    grep -q "^scripts/sanitize.sh: $((2 * (n_dev + 1))) runs, about [0-9]* min on one H100 .*; alone: memcheck [0-9]* min, racecheck [0-9]* min$" <<< "$out" &&
        [ "$(grep -c '^run ' <<< "$out")" = $((2 * (n_dev + 1))) ] && grep -q '^run racecheck train_default$' <<< "$out" && ok=1 || ok=0
    check $ok "SANITIZE_DRY_RUN=1: the runs of two tools over train_default and dev_* ($((2 * (n_dev + 1)))), the minutes in all and per tool, no GPU" "$out"
}

test_driver_checks() {
    screen_checks
    sanitize_checks
}

host_parts() {
    part "host unit tests and the trainer's bad-input errors" host_unit_tests
    part "flag table" flag_tables
    part "safe_write.py" run "the scripts' file writing (scripts/safe_write.py)" python3 scripts/test_safe_write.py
    part "convert/export" run "Hugging Face convert/export round trip" python3 scripts/test_hf_convert.py
    part "RoPE at long T" run "llama3.h's RoPE against transformers' at every position up to 131,071 (scripts/test_rope.py)" \
        python3 scripts/test_rope.py
    part "prepare_data.py" run "prepare_data.py: your own text and tokenizers" python3 scripts/test_prepare_data.py
    if [ -n "${LLAMA3_MUTANT:-}" ]; then # (its own planted code is gone from this copy: the check would catch every mutant)
        skipped+=("scripts/mutants.py --plant_check (this copy carries the mutant $LLAMA3_MUTANT)")
    else
        part "mutants plant check" run "scripts/mutants.py: every mutant still plants its bug" \
            python3 scripts/mutants.py --plant_check
    fi
    part "plot_log.py" run "plot_log.py: a training log drawn, bad logs refused" python3 scripts/test_plot_log.py
    part "scripts' --help" run "every script's --help and a bad argument: usage or one line, nothing done (scripts/test_help.py)" \
        python3 scripts/test_help.py
    part "make test's screen, make sanitize's settings and report" test_driver_checks
    if python3 -c "import torch, transformers" > /dev/null 2>&1; then
        part "bench_torch.py --ddp" ddp_peer_on_cpu
    else
        skipped+=("bench_torch.py --ddp: PyTorch's DDP peer on the CPU (python3 has no torch and transformers)")
    fi
}

# ---- GPU parts ----

# The references: name, then scripts/ref_llama3.py's arguments. Each exercises a path the others
# do not: one key tile (T=64, every switch), 16 key tiles of flash attention (T=1024, q and k
# initialised larger so that the softmax is peaked and its running max moves between tiles), B=8
# at two tiles with a vocabulary of 8000 (the cross-entropy's rows longer than its block's 4096-logit
# stride), gradient accumulation (3 micro-steps per step), dense embedding AdamW, the 1B; and the
# real training loop's optimizer: a warmup + cosine schedule with gradient clipping that clips
# (norms 4 to 7 against 1) at eps 1e-3, where Adam's update depends on the gradient's scale (at
# 1e-8 it hardly sees the clipping), with 3 micro-steps and linear decay, and with the dense
# embedding and wsd; tied embeddings (wte also the head's weight), alone and with 3 micro-steps,
# clipping and a cosine schedule; head_dim 128 (C 512, 4 heads, 2 KV heads) at T=1024, its q and k
# init scaled so that the scores spread as small_t1024's (std about 2.5: the softmax not flat), with
# Llama-3.1's RoPE factor 8 (the 8B's head_dim and RoPE; small_t64, written in llm.c's format too,
# has llm.c's 8 as well: ref_llama3.py --llmc; the others have 3.2's 32); documents packed in each
# row at T=128 (two tiles), attention masked to each (ref_llama3.py --docs, the trainer's --doc_mask 1:
# BOS at a tile boundary, one document over both tiles, a row without BOS after 0 and one without BOS
# at 0, laid out on other rows each step, the val loss on step 3's documents); long sequences: T=4096
# (one row, 64 key tiles) at each head_dim the flash kernels take, 32, 64 (the 1B's) and 128, and
# T=32768 (past the 8192 positions of llama3 RoPE's original context) on the small model against
# PyTorch's memory-efficient SDPA (causal by is_causal, no T x T mask in memory); and on a GPU
# with FP8 tensor cores, the block linears in FP8 (torch._scaled_mm, the trainer's --fp8 1 recipe).
SMALL_REFS=(
    "small_sched --shape small --batch_size 4 --seq_len 64 --steps 5 --lr_schedule cosine --warmup_iters 2 --final_lr_frac 0.1 --grad_clip 1.0 --eps 1e-3"
    "small_t64 --shape small --batch_size 4 --seq_len 64 --llmc"
    "small_t1024 --shape small --batch_size 2 --seq_len 1024 --qk_std 0.1"
    "small_hd128 --shape small_hd128 --batch_size 2 --seq_len 1024 --qk_std 0.07 --rope_factor 8"
    "small_b8 --shape small --batch_size 8 --seq_len 128 --vocab 8000"
    "small_accum --shape small --batch_size 4 --seq_len 64 --grad_accum 3"
    "small_dense --shape small --batch_size 4 --seq_len 64 --dense_embedding"
    "small_accum_clip --shape small --batch_size 4 --seq_len 64 --grad_accum 3 --lr_schedule linear --warmup_iters 1 --grad_clip 1.0"
    "small_dense_clip --shape small --batch_size 4 --seq_len 64 --steps 5 --dense_embedding --lr_schedule wsd --decay_frac 0.4 --grad_clip 1.0"
    "small_tied --shape small --batch_size 4 --seq_len 64 --tied"
    "small_tied_accum_clip --shape small --batch_size 4 --seq_len 64 --grad_accum 3 --tied --lr_schedule cosine --warmup_iters 1 --grad_clip 1.0"
    "small_docs --shape small --batch_size 4 --seq_len 128 --docs"
    "small_t4096 --shape small --batch_size 1 --seq_len 4096 --qk_std 0.1"
    "small_hd64_t4096 --shape small_hd64 --batch_size 1 --seq_len 4096 --qk_std 0.1"
    "small_hd128_t4096 --shape small_hd128 --batch_size 1 --seq_len 4096 --qk_std 0.07 --rope_factor 8"
    "small_t32768 --shape small --batch_size 1 --seq_len 32768 --qk_std 0.1 --attention efficient"
)
# [fp8] compute capability 8.9 or newer (Ada, Hopper): torch._scaled_mm and the trainer's --fp8 1
if fp8_gpu; then
    SMALL_REFS+=("small_fp8 --shape small --batch_size 4 --seq_len 64 --steps 5 --fp8"
                 "small_fp8_e4m3 --shape small --batch_size 4 --seq_len 64 --steps 5 --fp8 --fp8_grads e4m3"
                 "small_fp8_accum --shape small --batch_size 4 --seq_len 64 --steps 5 --fp8 --grad_accum 3 --grad_clip 1.0"
                 "small_fp8_unfused --shape small --batch_size 4 --seq_len 64 --steps 5 --fp8 --attention unfused")
fi
# The trainer's flags that a reference was made for (test_llama3 and train_llama3 on it take them too).
ref_flags() {
    case $1 in
    small_fp8 | small_fp8_accum) echo "--fp8 1" ;;
    small_fp8_e4m3) echo "--fp8 1 --fp8_grads e4m3" ;;
    small_fp8_unfused) echo "--fp8 1 --flash_attention 0" ;;
    esac
}
BIG_REF="1b --shape 1b --batch_size 4 --seq_len 64 --steps 2"
# Every setting of the switches other than their defaults, from the trainer (llama3.h LLAMA3_SWITCHES),
# each a test_llama3 run on small_t64; all but --sparse_embedding 0: test_llama3 takes the embedding's
# AdamW from the reference, and small_dense is the dense embedding's own reference.
ALL_SWITCHES=$(./train_llama3 --list_switches 2> /dev/null | grep -v '^$')
mapfile -t SWITCHES < <(grep -v -e '^--sparse_embedding ' -e '^$' <<< "$ALL_SWITCHES")
# With clipping every AdamW group is deferred to the next step; these change where AdamW runs instead
# (a hand-picked few of the settings, each of which must be one: switch_lists).
CLIP_SWITCHES=("--overlap_optimizer 0" "--cuda_graph 0" "--bf16_grads 0" "--grad_zeroing memset" "--vector_adam 0")
# A tied wte is the head GEMM's weight and gradient too: the switches that change how those are read,
# written or zeroed (the bf16 cast of the weight, fp32 gradients, AdamW after the backward).
TIED_SWITCHES=("--shadow_weights 0" "--bf16_grads 0" "--grad_zeroing memset" "--overlap_optimizer 0")
# [fp8] Every setting of SWITCHES beside --fp8 1 on small_fp8, but --shadow_weights 0 (the FP8 copies are
# quantised from the shadow: the trainer refuses it with --fp8 1) and --flash_attention 0, whose reference
# is small_fp8_unfused: FP8 rounds the attention output to e4m3, so the unfused attention's bf16-level
# difference from PyTorch's fused one became whole e4m3 steps against small_fp8 (logits 4.6e-2 against
# 7.9e-5 with flash attention, H100 2026-12-07); against its own reference, logits 0 (H100 2026-12-07).
mapfile -t FP8_SWITCHES < <(printf '%s\n' "${SWITCHES[@]:-}" | grep -v -e '^--shadow_weights 0$' -e '^--flash_attention 0$' -e '^$')

# make_refs SPEC...: writes each missing or stale reference, all at once.
make_refs() {
    local spec name pids=()
    mkdir -p ref
    for spec in "$@"; do
        name=${spec%% *}
        [ -f "ref/${name}_state.bin" ] && [ "ref/${name}_state.bin" -nt scripts/ref_llama3.py ] && continue
        # shellcheck disable=SC2086
        python3 scripts/ref_llama3.py --name ${spec} --out_dir ref > "ref/${name}.log" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]+"${pids[@]}"}"; do wait "$pid"; done
    for spec in "$@"; do
        name=${spec%% *}
        [ -f "ref/${name}_state.bin" ] || echo "FAIL reference $name: $(tail -n 3 "ref/${name}.log")"
    done
}
has_ref() { [ -f "ref/$1_state.bin" ] || { echo "FAIL reference $1 is missing"; count_failure 1; false; }; }

# trainer_run NAME REF MODEL TOKENS: ./train_llama3 on the reference's files with its flags, every
# step's loss from --log_file against PyTorch's.
trainer_run() {
    local name=$1 ref=$2 model=$3 tokens=$4 flags log
    log="$tmp/$(basename "$model" .bin)_$(basename "$tokens" .bin).jsonl" # (parts on one reference run at once)
    has_ref "$ref" || return
    flags=$(./test_llama3 --train_args "ref/$ref") || { count_failure 1; return; }
    # shellcheck disable=SC2086
    run "$name: train_llama3" ./train_llama3 $flags $(ref_flags "$ref") --llmc_filepath "$model" --input_bin "$tokens" \
        --log_file "$log"
    run "$name: its losses against PyTorch" ./test_llama3 --log "$log" "ref/$ref"
}

# runs_alike REF MICRO FLAG "VALUES" FLAGS...: 6 steps of REF's model at its B and T, MICRO micro-steps each,
# with clipping, FLAGS and FLAG at each of VALUES, into $runs<value>(.jsonl, .out, /) (the command but the
# model file, the value and the outputs in `alike`); appends to `detail` what differs from the first
# value's run: a failed run, other losses or norms, model.bin or state.bin (same_as_run).
runs_alike() {
    local ref=$1 micro=$2 flag=$3 values=$4 v first="" bt b t
    shift 4
    runs="$tmp/${flag#--}_${ref}_$micro$(echo "$*" | tr -dc 'a-z0-9')"
    bt=$(./test_llama3 --train_args "ref/$ref" | grep -o -- '--batch_size [0-9]* --sequence_length [0-9]*') ||
        { detail+=" test_llama3 --train_args ref/$ref failed"; return; }
    read -r _ b _ t <<< "$bt"
    # shellcheck disable=SC2206
    alike=(./train_llama3 --input_bin "ref/${ref}_tokens.bin" $bt --total_batch_size $((micro * b * t))
        --num_iteration 6 --learning_rate 1e-3 --grad_clip 1 "$@")
    for v in $values; do
        "${alike[@]}" --llmc_filepath "ref/${ref}_model.bin" "$flag" "$v" --log_file "$runs$v.jsonl" --checkpoint_dir "$runs$v" > "$runs$v.out" 2>&1 ||
            detail+=" $flag $v: $(grep -m 1 error "$runs$v.out")"
        [ -n "$first" ] || { first=$v; continue; }
        same_as_run "$runs$v" "$runs$first" "$flag $v"
    done
    [ "$(grep -c '"loss"' "$runs$first.jsonl" 2> /dev/null)" = 6 ] || detail+=" not 6 steps logged"
}
# same_as_run RUN FIRST WHAT: appends to `detail` whether RUN's log has other losses or norms than FIRST's,
# or its step-6 checkpoint another model.bin or state.bin.
same_as_run() {
    cmp -s <(grep -o '"\(loss\|grad_norm\)": [^,]*' "$1.jsonl") <(grep -o '"\(loss\|grad_norm\)": [^,]*' "$2.jsonl") ||
        detail+=" $3: other losses or norms"
    for f in model.bin state.bin; do cmp -s "$1/step_00000006/$f" "$2/step_00000006/$f" || detail+=" $3: other $f"; done
}
# [recompute] --recompute 1 and 2 recompute in the backward, with the same kernels on the same
# inputs, what --recompute 0 keeps: 6 steps of REF's model at its B and T, of MICRO micro-steps
# each (1: bf16 matmul gradients; 2: fp32, accumulated), with clipping (each step's norm logged), log
# the same losses and norms and leave the same model.bin and state.bin, bit for bit; the
# activations printed at start shrink from level to level. (Not with --fused_rmsnorm 0, whose
# norm-weight gradients are summed by atomicAdd in arrival order, rmsnorm_backward_ops: its runs
# differ in the last bits from each other, recomputed or not.)
recompute_same() { # REF MICRO FLAGS...
    local ref=$1 micro=$2 detail="" runs alike acts=()
    shift 2
    has_ref "$ref" || return
    runs_alike "$ref" "$micro" --recompute "0 1 2" "$@"
    read -r -a acts <<< "$(grep -m 1 '^activations at --recompute' "${runs}0.out" | cut -d : -f 2 | tr -d ',MiB')"
    awk -v a="${acts[0]}" -v b="${acts[1]}" -v c="${acts[2]}" 'BEGIN { exit !(a > b && b > c) }' ||
        detail+=" activations ${acts[*]:-(not printed)} MiB do not shrink"
    check $((${#detail} == 0)) "--recompute 0, 1, 2 on $ref, $micro micro-step(s)${1:+, $*}: the same 6 losses and norms, model.bin and state.bin, bit for bit (activations ${acts[*]:-} MiB)" "$detail"
}

# [offload] --offload_optimizer 1 runs the same AdamW kernels on m and v in pinned host memory: the
# same 6 losses and norms, model.bin and state.bin as on the GPU, bit for bit (with a checkpoint at
# step 3 too, whose copies read the host memory); and stopped after step 3 and resumed (the load writes
# the host memory), the same again.
offload_same() { # REF MICRO FLAGS...
    local ref=$1 micro=$2 detail="" runs alike parts resume
    shift 2
    has_ref "$ref" || return
    runs_alike "$ref" "$micro" --offload_optimizer "0 1" --checkpoint_every 3 "$@"
    grep -q 'in pinned host memory: AdamW m and v' "${runs}1.out" || detail+=" no host memory printed"
    parts="${runs}_resumed"
    for resume in "--llmc_filepath ref/${ref}_model.bin --stop_after 3" "--resume $parts"; do
        # shellcheck disable=SC2086
        "${alike[@]}" --offload_optimizer 1 $resume --log_file "$parts.jsonl" --checkpoint_dir "$parts" >> "$parts.out" 2>&1 ||
            detail+=" offloaded, $resume: $(grep -m 1 error "$parts.out")"
    done
    same_as_run "$parts" "${runs}1" "offloaded, 3 steps and resumed"
    check $((${#detail} == 0)) "--offload_optimizer 1 on $ref, $micro micro-step(s)${1:+, $*}: the same 6 losses and norms, model.bin and state.bin as on the GPU, bit for bit, straight and resumed after step 3" "$detail"
}

# A model with one NaN weight (a final-norm weight: every logit NaN): each step is skipped by the
# NaN guard and shown as skipped, --max_bad_steps of them in a row stop the run, non-zero; its log
# is JSON (null for the non-finite loss and norm) that Python's json module reads and plot_log.py draws.
nan_guard_stops() {
    local ok
    has_ref small_sched || return
    python3 - ref/small_sched_model.bin "$tmp/nan_model.bin" <<'PY'
import sys, numpy as np
w = np.fromfile(sys.argv[1], dtype=np.float32)
h = w[:256].view(np.int32)  # seed header: [3] vocab, [7] n_embd
V, C = int(h[3]), int(h[7])
w[len(w) - V * C - C + 3] = np.nan  # final_norm precedes lm_head (V x C) at the end
w.tofile(sys.argv[2])
PY
    expect_error "NaN guard: a model with a NaN weight stops after --max_bad_steps 3 skipped steps" \
        "steps 1..3 had a non-finite loss or gradient norm" ./train_llama3 --llmc_filepath "$tmp/nan_model.bin" \
        --input_bin ref/small_sched_tokens.bin --num_iteration 20 --max_bad_steps 3
    ./train_llama3 --llmc_filepath "$tmp/nan_model.bin" --input_bin ref/small_sched_tokens.bin --num_iteration 20 \
        --grad_clip 1 --max_bad_steps 3 --log_file "$tmp/nan.jsonl" 2> /dev/null | grep -c "SKIPPED" | grep -qx 3 &&
        ok=1 || ok=0
    check $ok "NaN guard with clipping: 3 step lines say SKIPPED"
    python3 - "$tmp/nan.jsonl" <<'PY' > "$tmp/nan_json.out" 2>&1
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert len(rows) == 3 and all(r["skipped"] == 1 and r["loss"] is None and r["grad_norm"] is None for r in rows), rows
PY
    [ $? -eq 0 ] && python3 scripts/plot_log.py "$tmp/nan.jsonl" "$tmp/nan.png" >> "$tmp/nan_json.out" 2>&1 &&
        [ -s "$tmp/nan.png" ] && ok=1 || ok=0
    check $ok "the NaN-guard run's log: 3 JSON lines with null loss and grad_norm (json.loads), drawn by plot_log.py" \
        "$(head -n 2 "$tmp/nan.jsonl"; tail -n 2 "$tmp/nan_json.out")"
}

# The val loss and samples read the weights between steps and leave training alone: 20 steps with
# --val_every 5 --sample_every 7 log the same losses as 20 steps without, bit for bit, with and
# without clipping (then every AdamW group is deferred); val at steps 5, 10, 15, 20, samples at 7, 14, 20.
eval_leaves_training() {
    local clip=$1 flags ok
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
        ok=1
    else ok=0; tail -n 5 "$tmp/eval$clip.out"; fi
    check $ok "--val_every 5 --sample_every 7 (grad_clip $clip): the same 20 losses as without them"
}

# The default trainer (1B shape, B=4, T=64): its smoke run, the errors it meets on the GPU, two runs
# that must repeat each other, a bigger batch given by B and T alone.
default_runs() {
    local ok run
    run "training smoke run (10 steps, loss must fall)" bash scripts/check_loss_falls.sh
    expect_error "a log that cannot be written stops the run" "--log_file /dev/full: write failed" \
        ./train_llama3 --num_iteration 3 --log_file /dev/full
    expect_error "no GPU visible: CUDA's own error named" "cudaErrorNoDevice" env CUDA_VISIBLE_DEVICES= ./train_llama3
    ./train_llama3 --batch_size 8 --num_iteration 1 > "$tmp/bt.out" 2>&1 && grep -q "grad_accum 1" "$tmp/bt.out" &&
        ok=1 || ok=0
    check $ok "--batch_size 8 alone trains (one micro-step of 512 tokens)" "$(tail -n 2 "$tmp/bt.out")"
    # --dry_run's memory is the one the run prints once the GPU is there, within 0.01 GiB (the dry run
    # sizes one scratch of a few MiB for an H100's 132 SMs; this GPU's may have other)
    local dry
    dry=$(./train_llama3 --batch_size 8 --dry_run 1 2>&1 | grep '^memory')
    awk -v a="${dry#memory: }" -v b="$(grep '^memory' "$tmp/bt.out" | sed 's/^memory: //')" \
        'BEGIN { d = a - b; exit !(a > 0 && d < 0.015 && d > -0.015) }' && ok=1 || ok=0
    check $ok "--dry_run 1 prints the memory the run prints on the GPU" "dry run: $dry; run: $(grep '^memory' "$tmp/bt.out")"
    # Two processes, the same seed and flags (graph, deferred AdamW, sparse embedding on): every
    # logged loss the same (test_llama3 compares weights and losses bit for bit).
    # On failure: each run's exit code and last line (one that did not finish), and the first losses
    # that differ.
    local codes="" detail=""
    for run in 1 2; do
        ./train_llama3 --num_iteration 50 --log_file "$tmp/det$run.jsonl" > "$tmp/det$run.out" 2>&1
        codes+=" $?"
    done
    det_losses() { grep -o '"step": [0-9]*, "loss": [^,]*' "$tmp/det$1.jsonl" 2> /dev/null; }
    [ "$(det_losses 1 | wc -l)" -eq 50 ] && [ "$(det_losses 1)" = "$(det_losses 2)" ] && ok=1 || ok=0
    [ $ok = 1 ] || detail="exit codes$codes; last lines: $(tail -n 1 "$tmp/det1.out") | $(tail -n 1 "$tmp/det2.out");\
 first difference: $(diff <(det_losses 1) <(det_losses 2) | grep '^[<>]' | head -n 2 | tr '\n' ' ')"
    check $ok "two runs of 50 steps with the same seed log the same losses" "$detail"
}

# with_switch REF SWITCH: test_llama3 on REF with one switch off.
with_switch() {
    [ -n "$2" ] || { echo "FAIL test_llama3 $1 with an empty switch (./train_llama3 --list_switches printed none)"; count_failure 1; return; }
    has_ref "$1" || return
    local flags
    flags=$(ref_flags "$1")
    # shellcheck disable=SC2086
    run "test_llama3 $1${flags:+ $flags} $2" ./test_llama3 "ref/$1" $flags $2
}
# shellcheck disable=SC2046
test_ref() { has_ref "$1" && run "test_llama3 $1 $(ref_flags "$1")" ./test_llama3 "ref/$1" $(ref_flags "$1"); }

# The GPU parts that need no reference: they run while the references are written.
gpu_parts_without_refs() {
    part "sampling" run "test_llama3 --sampling: sampled tokens in the top-k set, frequencies by chi-square" \
        ./test_llama3 --sampling
    part "bf16 moments" run "test_llama3 --bf16_moments: AdamW with bf16 m and v against float64, stochastic rounding" \
        ./test_llama3 --bf16_moments
    part "classifier chunks" run "test_llama3 --classifier: the classifier in chunks (a ragged last one) against in one" \
        ./test_llama3 --classifier
    part "default trainer runs" default_runs
    part "eval leaves training, no clipping" eval_leaves_training 0
    part "eval leaves training, clipping" eval_leaves_training 1
    if python3 -c "import torch, transformers" > /dev/null 2>&1; then
        part "HF weights through the trainer" run "Hugging Face weights in and out of the trainer (scripts/test_hf_trainer.py)" \
            python3 scripts/test_hf_trainer.py
        part "HF weights through the trainer, bf16 weights" run "Hugging Face weights in and out of a run with bf16 weights" \
            python3 scripts/test_hf_trainer.py --trainer_flags "--master_weights bf16 --optimizer_state bf16"
        if two_ranks_missing > /dev/null; then
            skipped+=("the combination table's cells against PyTorch, scripts/combinations.py --gpu ($(two_ranks_missing))")
        else
            part "combinations against PyTorch" run "the combination table's cells against PyTorch (scripts/combinations.py --gpu)" \
                python3 scripts/combinations.py --gpu "$tmp/combinations"
        fi
    fi
    if [ "${LLAMA3_DEV_CHECKS:-1}" = 0 ]; then
        skipped+=("dev/ kernel checks (left out by LLAMA3_DEV_CHECKS=0)")
    else
        for bin in $dev_binaries; do part "$bin" run "$bin --check" "$bin" --check; done
        # The collectives of two ranks; with one GPU they share it, which dev/nccl takes only from
        # NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1 (else it says "skipped:").
        # The data-parallel trainer with two ranks (make builds it when it finds NCCL; NCCL >= 2.30 to share one GPU).
        if two_ranks_missing > /dev/null; then
            skipped+=("two ranks of the data-parallel trainer, scripts/test_ranks.sh ($(two_ranks_missing))")
        else
            part "two ranks" run "two ranks of the data-parallel trainer (scripts/test_ranks.sh)" bash scripts/test_ranks.sh
        fi
        if [ -x dev/nccl ]; then
            part "dev/nccl" run "dev/nccl --check --ranks 2" env NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_NVLS_ENABLE=0 \
                dev/nccl --check --ranks 2
        else
            skipped+=("dev/nccl --check --ranks 2 (make found no NCCL: NCCL_HOME, the CUDA toolkit or PyTorch's wheel)")
        fi
    fi
}

# The NCCL library train_llama3 loads (built with the data-parallel step); fails when it loads none.
trainer_nccl_lib() { ldd ./train_llama3 2> /dev/null | awk '/libnccl/ { print $3; found = 1 } END { exit !found }'; }

# The version code of the NCCL that train_llama3 loads (0: none), as its ncclGetVersion says.
nccl_version() {
    local lib
    lib=$(trainer_nccl_lib)
    python3 -c "import ctypes, sys; v = ctypes.c_int(); ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v)); print(v.value)" \
        "$lib" 2> /dev/null || echo 0
}

# Why two ranks of train_llama3 cannot run here (exit 0), or nothing (exit 1): built without NCCL, or
# one GPU and an NCCL older than 2.30, which cannot share it.
two_ranks_missing() {
    if ! trainer_nccl_lib > /dev/null; then
        echo "train_llama3 built without NCCL: make found none, or DATA_PARALLEL=0"
    elif nvidia-smi -L 2> /dev/null | awk 'END { exit NR > 1 }' && [ "$(nccl_version)" -lt 23000 ]; then
        echo "one GPU, and NCCL $(nccl_version) < 2.30 cannot share it"
    else
        return 1
    fi
}

# The parts on the references, each test_llama3 run its own part.
gpu_parts_on_refs() {
    local spec name s
    fp8_gpu || skipped+=("test_llama3 and train_llama3 on small_fp8, small_fp8_e4m3, small_fp8_accum and small_fp8_unfused (--fp8 1 needs compute capability 8.9 or newer; this GPU has less)")
    for spec in "${SMALL_REFS[@]}"; do
        name=${spec%% *}
        part "test_llama3 $name" test_ref "$name"
        case $name in
        small_t64)
            for s in "${SWITCHES[@]:-}"; do part "test_llama3 $name $s" with_switch "$name" "$s"; done
            part "train_llama3 small_t64 seed/uint32" trainer_run "small_t64, seed model, uint32 tokens" small_t64 \
                ref/small_t64_model.bin ref/small_t64_tokens.bin
            part "train_llama3 small_t64 llm.c/uint16" trainer_run "small_t64, llm.c model, uint16 tokens" small_t64 \
                ref/small_t64_model_llmc.bin ref/small_t64_tokens16.bin
            part "recompute small_t64" recompute_same small_t64 1
            part "recompute small_t64 accumulated" recompute_same small_t64 2
            part "recompute small_t64 unfused attention" recompute_same small_t64 2 --flash_attention 0
            part "offload small_t64" offload_same small_t64 1
            part "offload small_t64 bf16 weights" offload_same small_t64 2 --optimizer_state bf16 --master_weights bf16
            for s in "--recompute 1" "--recompute 2" "--classifier_chunk 100"; do part "test_llama3 $name $s" with_switch "$name" "$s"; done
            part "checkpoints" run "checkpoints: exact resume on a decaying schedule with clipping, the log continued, bad resumes, SIGKILL during saves" \
                bash scripts/test_checkpoints.sh ;;
        small_accum)
            part "train_llama3 small_accum" trainer_run "small_accum, 3 micro-steps" small_accum \
                ref/small_accum_model.bin ref/small_accum_tokens.bin
            part "test_llama3 $name --classifier_chunk 100" with_switch "$name" "--classifier_chunk 100" ;;
        small_t1024) part "recompute small_t1024" recompute_same small_t1024 1 ;;
        small_docs)
            for s in "--flash_attention 0" "--recompute 2"; do part "test_llama3 $name $s" with_switch "$name" "$s"; done
            part "train_llama3 small_docs" trainer_run "small_docs, documents masked" small_docs \
                ref/small_docs_model.bin ref/small_docs_tokens.bin ;;
        small_fp8)
            for s in "${FP8_SWITCHES[@]:-}"; do part "test_llama3 $name $s" with_switch "$name" "$s"; done
            part "train_llama3 small_fp8" trainer_run "small_fp8, the block linears in FP8" small_fp8 \
                ref/small_fp8_model.bin ref/small_fp8_tokens.bin
            part "recompute small_fp8 accumulated" recompute_same small_fp8 2 --fp8 1 ;;
        small_fp8_accum) part "train_llama3 small_fp8_accum" trainer_run "small_fp8_accum, FP8 with 3 micro-steps" \
            small_fp8_accum ref/small_fp8_accum_model.bin ref/small_fp8_accum_tokens.bin ;;
        small_fp8_e4m3) part "train_llama3 small_fp8_e4m3" trainer_run "small_fp8_e4m3, FP8 with e4m3 gradients" \
            small_fp8_e4m3 ref/small_fp8_e4m3_model.bin ref/small_fp8_e4m3_tokens.bin ;;
        small_tied)
            part "recompute small_tied" recompute_same small_tied 2
            part "test_llama3 $name --classifier_chunk 100" with_switch "$name" "--classifier_chunk 100"
            for s in "${TIED_SWITCHES[@]}"; do part "test_llama3 $name $s" with_switch "$name" "$s"; done
            part "train_llama3 small_tied" trainer_run "small_tied, tied embeddings" small_tied \
                ref/small_tied_model.bin ref/small_tied_tokens.bin ;;
        small_sched)
            for s in "${CLIP_SWITCHES[@]}"; do part "test_llama3 $name $s" with_switch "$name" "$s"; done
            part "train_llama3 small_sched" trainer_run "small_sched, cosine schedule and clipping" small_sched \
                ref/small_sched_model.bin ref/small_sched_tokens.bin
            part "NaN guard" nan_guard_stops ;;
        esac
    done
}

# The GPU parts that python3 without torch cannot run, for the skipped list.
GPU_REF_PARTS=("test_llama3 against the PyTorch references (small T=64 with every switch, T=1024, B=8,"\
" 3 micro-steps, dense embedding, schedules with clipping, tied embeddings, head_dim 128, documents masked,"\
" T=4096 at head_dim 32, 64 and 128, T=32768, FP8 block linears with every switch, 1B)"
    "train_llama3 on the references' files (seed and llm.c models, uint32 and uint16 tokens, 3 micro-steps, clipping)"
    "the NaN guard on a poisoned reference model, and its JSON log read and drawn"
    "checkpoints: exact resume, the log continued, SIGKILL during saves (scripts/test_checkpoints.sh)"
    "Hugging Face model -> convert -> train -> export -> HF, untied, tied and with bf16 weights (scripts/test_hf_trainer.py)"
    "the combination table's cells against PyTorch (scripts/combinations.py --gpu)")

# refs_wait PID OUTPUT: waits for make_refs and counts the references it could not write.
refs_wait() {
    wait "$1" 2> /dev/null
    cat "$2"
    show_failures "$2"
    count_failure "$(grep -c '^FAIL' "$2")"
}

# LLAMA3_TEST_SHAPES picks the references: the small ones, the 1B (written while the small parts
# run, then compared with the GPU to itself), or both.
gpu_tests() {
    local shapes=" ${LLAMA3_TEST_SHAPES:-small 1b} " small_pid big_pid
    [[ $shapes == *" small "* ]] || skipped+=("test_llama3 on the small references (left out by LLAMA3_TEST_SHAPES)")
    [[ $shapes == *" 1b "* ]] || skipped+=("test_llama3 1b and its train_llama3 run (left out by LLAMA3_TEST_SHAPES)")
    if ! python3 -c "import torch, transformers" > /dev/null 2>&1; then
        for s in "${GPU_REF_PARTS[@]}"; do skipped+=("$s (GPU present, but python3 has no torch and transformers)"); done
        gpu_parts_without_refs
        return
    fi
    [[ $shapes == *" small "* ]] && { make_refs "${SMALL_REFS[@]}" > "$tmp/refs_small.out" 2>&1 & small_pid=$!; }
    [[ $shapes == *" 1b "* ]] && { make_refs "$BIG_REF" > "$tmp/refs_1b.out" 2>&1 & big_pid=$!; }
    gpu_parts_without_refs
    if [[ $shapes == *" small "* ]]; then
        refs_wait "$small_pid" "$tmp/refs_small.out"
        gpu_parts_on_refs
    fi
    if [[ $shapes == *" 1b "* ]]; then
        refs_wait "$big_pid" "$tmp/refs_1b.out"
        drain # the 1B comparison takes the GPU's memory to itself
        part "test_llama3 1b" test_ref 1b
        part "train_llama3 1b" trainer_run "1b" 1b ref/1b_model.bin ref/1b_tokens.bin
    fi
}

python_deps
dev_binaries=$(ls dev/*.cu 2>/dev/null | sed 's/\.cu$//' | grep -v '^dev/nccl$')
if [ "${LLAMA3_HOST_TESTS:-1}" = 0 ]; then
    skipped+=("host unit tests and the trainer's bad-input errors (left out by LLAMA3_HOST_TESTS=0)")
else
    host_parts
fi
if ! nvidia-smi -L > /dev/null 2>&1; then
    for s in "${GPU_REF_PARTS[@]}"; do skipped+=("$s $NO_GPU"); done
    skipped+=("test_llama3 --sampling: the sampler's top-k set and frequencies on fixed logits $NO_GPU"
        "test_llama3 --bf16_moments: AdamW with bf16 m and v against float64 $NO_GPU"
        "test_llama3 --classifier: the classifier in chunks against in one $NO_GPU"
        "training smoke run, /dev/full, no visible GPU, B and T alone $NO_GPU"
        "two runs of 50 steps log the same losses $NO_GPU"
        "--val_every and --sample_every leave the 20 losses unchanged, with and without clipping $NO_GPU")
    for bin in $dev_binaries dev/nccl; do skipped+=("$bin --check $NO_GPU"); done
    skipped+=("two ranks of the data-parallel trainer, scripts/test_ranks.sh $NO_GPU")
elif [ "${LLAMA3_GPU_TESTS:-1}" = 0 ]; then
    skipped+=("every GPU part (left out by LLAMA3_GPU_TESTS=0)")
else
    gpu_tests
fi
collect
finish
