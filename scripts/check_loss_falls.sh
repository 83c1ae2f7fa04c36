#!/usr/bin/env bash
# usage: scripts/check_loss_falls.sh        (make test runs it on a GPU machine; needs ./train_llama3)
# Smoke run: the default model and data (random init, embedded text, B=4 T=64, lr 1e-5) trained
# for 10 steps on one batch; the loss must fall by at least 1 nat. Takes no arguments; prints
# "N passed, M failed".

# Adam's first steps lower the loss by about lr * ||g||_1, a few tenths of a nat per step here, so
# over 9 updates the loss must fall by at least 1 nat.
set -u
. "$(dirname "$0")/cli.sh"
no_arguments "$@"
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
./train_llama3 --num_iteration 10 --overfit_single_batch 1 --log_file "$log" || { echo "0 passed, 1 failed"; exit 1; }
awk -F'"loss": ' '{split($2, a, ","); loss[NR] = a[1]} END {
    ok = NR == 10 && loss[10] < loss[1] - 1.0
    printf "%s loss step 1 %.4f -> step 10 %.4f\n", ok ? "ok  " : "FAIL", loss[1], loss[10]
    printf "%d passed, %d failed\n", ok, !ok
    exit !ok }' "$log"
