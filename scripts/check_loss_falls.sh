#!/usr/bin/env bash
# Smoke run of the default configuration (random init, embedded data, B=4 T=64, lr 1e-5):
# 10 steps, then the mean loss of the last 3 steps must be below the first step's loss.
set -u
log=$(mktemp)
trap 'rm -f "$log"' EXIT
./train_llama3 --num_iteration 10 --log_file "$log" || { echo "0 passed, 1 failed"; exit 1; }
awk -F'"loss": ' '{split($2, a, ","); loss[NR] = a[1]} END {
    last = (loss[NR] + loss[NR-1] + loss[NR-2]) / 3
    ok = NR == 10 && last < loss[1]
    printf "%s loss step 1 %.4f -> mean of steps 8..10 %.4f\n", ok ? "ok  " : "FAIL", loss[1], last
    printf "%d passed, %d failed\n", ok, !ok
    exit !ok }' "$log"
