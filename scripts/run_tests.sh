#!/usr/bin/env bash
# The driver of `make test` (run after `make all`). Everywhere: the host unit tests of llama3.h
# and the trainer's bad-input errors. On a machine with a GPU, also: the PyTorch reference
# comparison (test_llama3) on the small and the 1B shape, the training smoke run, and every dev/
# kernel check. Ends with "N passed, M failed"; exits non-zero if anything failed.
# LLAMA3_TEST_SHAPES="small" skips the 1B comparison (it writes ~24 GB of reference files).
set -u
cd "$(dirname "$0")/.."
passed=0
failed=0
skipped=()

# run NAME CMD...: a program that prints its own "N passed, M failed" line.
run() {
    local name=$1 out rc line p f
    shift
    echo "== $name: $*"
    out=$("$@" 2>&1)
    rc=$?
    echo "$out"
    line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    p=0 f=0
    if [ -n "$line" ]; then p=${line%% passed*}; f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed$/\1/'); fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL $name exited with $rc"; fi
    passed=$((passed + p))
    failed=$((failed + f))
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
        failed=$((failed + 1))
    fi
}

run "host unit tests (llama3.h)" ./test_llama3_host

echo "== trainer bad-input errors"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
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
help_out=$(./train_llama3 --help 2>&1)
if [ $? -eq 0 ] && echo "$help_out" | grep -q "^usage: "; then
    echo "ok   --help: the usage text, exit 0"
    passed=$((passed + 1))
else
    echo "FAIL --help: no usage text, or a non-zero exit"
    failed=$((failed + 1))
fi

if nvidia-smi -L >/dev/null 2>&1; then
    if ! python3 -c "import torch, transformers" >/dev/null 2>&1; then
        skipped+=("test_llama3 (python3 with torch and transformers is needed for the reference)")
    else
        for shape in ${LLAMA3_TEST_SHAPES:-small 1b}; do
            if [ ! -f "ref/${shape}_state.bin" ]; then
                python3 scripts/ref_llama3.py --shape "$shape" --out_dir ref || { failed=$((failed + 1)); continue; }
            fi
            run "test_llama3 $shape" ./test_llama3 "ref/${shape}_model.bin" "ref/${shape}_state.bin"
        done
        # Each optimisation switched off alone (small shape); the dense embedding against a dense reference.
        if [ -f ref/small_state.bin ]; then
            for switch in "--flash_attention 0" "--shadow_weights 0" "--vector_adam 0" "--metadata_by_value 0" "--overlap_optimizer 0" \
                "--bf16_grads 0" "--cuda_graph 0" "--fused_rmsnorm 0" "--deferred_adamw 0" "--deferred_adamw 1" \
                "--delete_fills 0" \
                "--grad_zeroing memset" "--grad_zeroing fill"; do
                run "test_llama3 small $switch" ./test_llama3 ref/small_model.bin ref/small_state.bin $switch
            done
            [ -f ref/small_dense_state.bin ] || python3 scripts/ref_llama3.py --shape small --dense_embedding --out_dir ref
            run "test_llama3 small, dense embedding AdamW" ./test_llama3 ref/small_model.bin ref/small_dense_state.bin
        fi
    fi
    expect_error "out of GPU memory" "out of GPU memory" ./train_llama3 --batch_size 32 --sequence_length 8192 --total_batch_size 262144 --num_iteration 1
    run "training smoke run (10 steps, loss must fall)" bash scripts/check_loss_falls.sh
    for bin in $(ls dev/*.cu 2>/dev/null | sed 's/\.cu$//'); do run "$bin --check" "$bin" --check; done
else
    skipped+=("test_llama3 small and 1b (PyTorch comparison), and small with each optimisation off" \
        "out-of-memory error" "training smoke run")
    for bin in $(ls dev/*.cu 2>/dev/null | sed 's/\.cu$//'); do skipped+=("$bin --check"); done
fi

for s in "${skipped[@]+"${skipped[@]}"}"; do echo "SKIPPED (no GPU on this machine): $s"; done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
