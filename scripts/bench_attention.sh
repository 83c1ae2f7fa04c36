#!/usr/bin/env bash
# usage: scripts/bench_attention.sh [--sizes T,T,...]
# Attention on this GPU, one call: ./dev/attention (built first by make; validates every version, then
# times them) and its PyTorch peer scripts/bench_attention.py (scaled_dot_product_attention on its fastest
# backend; needs torch) on the same shapes: the 1B's B=4,T=64 and B=16,T=1024, then the 1B's and the 8B's
# heads at T = 1k, 4k, 16k and 64k, 65,536 tokens each. Prints dev/attention's checks, PyTorch's backend
# choices, both tables as one, then one row per shape and direction: our fastest version and PyTorch's, each
# with ms and causal TFLOP/s (the bracket of the rate column), and PyTorch's time over ours (above 1: ours
# is faster).
#   --sizes T,T,...  only the shapes of these T (of 64, 1k, 4k, 16k, 64k; 1k = 1024), on both sides
# Exits non-zero when dev/attention's validation failed or a side did not run.
# Example: scripts/bench_attention.sh --sizes 1k,64k
set -u
. "$(dirname "$0")/cli.sh"
cd "$(dirname "$0")/.."
sizes=""
while [ $# -gt 0 ]; do
    case $1 in
        -h | --help) usage ;;
        --sizes) needs_value "$@" ;;&
        --sizes) sizes="--sizes $2"; shift ;;
        *) unknown_argument "$1" ;;
    esac
    shift
done
[[ -z $sizes || ${sizes#--sizes } =~ ^[0-9]+k?(,[0-9]+k?)*$ ]] || bad_argument "$sizes: want T,T,... (e.g. 1k,64k)"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
make dev/attention > "$out/build.log" 2>&1 || { cat "$out/build.log"; echo "make dev/attention failed"; exit 1; }
status=0
echo "== ./dev/attention $sizes"
# shellcheck disable=SC2086 # ($sizes: none, or --sizes and its list)
./dev/attention $sizes > "$out/ours.log" 2>&1 || { status=1; tail -n 3 "$out/ours.log"; }
grep -E "passed, [0-9]+ failed$|^FAIL" "$out/ours.log"
echo "== python3 scripts/bench_attention.py $sizes"
# shellcheck disable=SC2086
python3 scripts/bench_attention.py $sizes > "$out/torch.log" 2>&1 || status=1
grep -vE "^\||^ceiling" "$out/torch.log" # (its torch and GPU, each shape's backends, or its error)
echo
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "### Attention ($(date +%F), $gpu, scripts/bench_attention.sh $sizes)"
echo
grep -h "^ceiling" "$out/ours.log" "$out/torch.log"
echo
echo "| kernel | version | size | ms (median) | rate | of ceiling | check |"
echo "|---|---|---|---|---|---|---|"
grep -h "^| attention" "$out/ours.log" "$out/torch.log"
echo
echo "| attention | size | ours, fastest | ms | causal TFLOP/s | PyTorch sdpa | ms | causal TFLOP/s | PyTorch / ours |"
echo "|---|---|---|---|---|---|---|---|---|"
# Per (direction, size) in our table's order: our fastest row, PyTorch's row (none: dashes).
awk -F ' *[|] *' '
    /^[|] attention/ {
        key = $2 " | " $4
        causal = $6
        sub(/.*[(]causal /, "", causal)
        sub(/[)].*/, "", causal)
        if (FILENAME == ARGV[1] && (!(key in ours_ms) || $5 + 0 < ours_ms[key])) {
            if (!(key in ours_ms)) order[n++] = key
            ours_ms[key] = $5 + 0
            ours_version[key] = $3
            ours_causal[key] = causal
        } else if (FILENAME == ARGV[2]) {
            backend = $3
            sub(/^torch sdpa [(]/, "", backend)
            sub(/[)]$/, "", backend)
            torch_ms[key] = $5 + 0
            torch_backend[key] = backend
            torch_causal[key] = causal
        }
    }
    END {
        for (i = 0; i < n; i++) {
            k = order[i]
            printf "| %s | %s | %.4f | %s | ", k, ours_version[k], ours_ms[k], ours_causal[k]
            if (!(k in torch_ms)) print "- | - | - | - |"
            else printf "%s | %.4f | %s | %.2f |\n", torch_backend[k], torch_ms[k], torch_causal[k],
                        torch_ms[k] / ours_ms[k]
        }
    }' "$out/ours.log" "$out/torch.log"
exit $status
