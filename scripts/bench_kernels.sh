#!/usr/bin/env bash
# usage: scripts/bench_kernels.sh      (make bench-kernels builds dev/ and runs it; needs a GPU)
# Every dev/ microbenchmark (validate, then time), then one markdown table of all their rows.
# Takes no arguments; exits non-zero when a benchmark's validation failed.
set -u
. "$(dirname "$0")/cli.sh"
no_arguments "$@"
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for src in dev/*.cu; do
    bin=${src%.cu}
    echo "== $bin"
    "$bin" > "$out/$(basename "$bin").log" 2>&1 || status=1
    grep -E "passed, [0-9]+ failed$|^FAIL" "$out/$(basename "$bin").log"
done
echo
echo "### Kernel table ($(date +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1), make bench-kernels)"
echo
grep -h "^ceiling" "$out"/*.log | sort -u
echo
echo "| kernel | version | size | ms (median) | rate | of ceiling | check |"
echo "|---|---|---|---|---|---|---|"
cat "$out"/*.log | grep "^| " | grep -vE "^\| kernel \||^\|---"
exit $status
