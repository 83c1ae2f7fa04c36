#!/usr/bin/env bash
# usage: scripts/bench_compare.sh [REV | FOLDER] [--configs "B:T[:--flag=value[:--flag=value ...]] ..."]
# The trainer of another revision against this tree's, on the same GPU in one call: both built
# (train_llama3 only), then at each config each binary's 30 steps (median ms of steps 2..30, from
# --log_file), the two runs of a config back to back so that the board's clocks and power state
# are alike; one markdown table, new over old in the last column. For dev/PERF.md: a change keeps
# its speed, or the table shows what it costs.
#   REV       a revision of this repository (default HEAD: the last commit against the working tree)
#   FOLDER    the other tree instead (as `git archive REV | tar -x -C FOLDER` writes it), for a machine
#             that has the working tree but not the history (copied with its times, so a train_llama3
#             built there is used as it is)
#   --configs the configs (default: the three bench configs and the clipped B=4,T=64 run,
#             "4:64 4:1024 16:1024 4:64:--grad_clip=1")
# Example: scripts/bench_compare.sh HEAD~1 --configs "4:64 4:64:--optimizer_state=bf16"
set -u
. "$(dirname "$0")/cli.sh"
rev=""
configs="4:64 4:1024 16:1024 4:64:--grad_clip=1"
while [ $# -gt 0 ]; do
    case $1 in
        -h | --help) usage ;;
        --configs) needs_value "$@"; configs=$2; shift ;;
        -*) unknown_argument "$1" ;;
        *) [ -z "$rev" ] || unknown_argument "$1"; rev=$1 ;;
    esac
    shift
done
rev=${rev:-HEAD}
[ -d "$rev" ] && rev=$(realpath -- "$rev") # (the folder as given, from this cwd)
cd "$(dirname "$0")/.."
[ -d "$rev" ] || git rev-parse --verify --quiet "$rev^{commit}" > /dev/null ||
    bad_argument "$rev: neither a folder nor a revision of this repository"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -d "$rev" ]; then
    cp -a "$rev"/. "$tmp" || { echo "error: cannot copy the tree in $rev"; exit 1; }
else
    git archive "$rev" | tar -x -C "$tmp" || { echo "error: cannot export revision $rev"; exit 1; }
fi
make -s -C "$tmp" train_llama3 > "$tmp/build.log" 2>&1 &
old_build=$!
make -s train_llama3 || exit 1
wait "$old_build" || { echo "error: revision $rev does not build:"; tail -n 5 "$tmp/build.log"; exit 1; }

# median BIN B T [flags]: the median step time in ms (steps 2..30), or "fail".
median() {
    local bin=$1 B=$2 T=$3
    shift 3
    "$bin" --batch_size "$B" --sequence_length "$T" --total_batch_size $((B * T)) --num_iteration 30 \
        --log_file "$tmp/log.json" "$@" > "$tmp/run.log" 2>&1 || { echo fail; return; }
    tail -n +2 "$tmp/log.json" | sed -E 's/.*"ms": ([0-9.]+),.*/\1/' | sort -g |
        awk '{ ms[NR] = $1 } END { printf "%.2f\n", ms[int((NR + 1) / 2)] }'
}

echo "### $rev against this tree ($(date +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1))"
echo "| config | $rev ms/step | this tree ms/step | new / old |"
echo "|---|---|---|---|"
for c in $configs; do
    IFS=: read -r B T flags <<< "$c"
    IFS=: read -r -a flag_args <<< "$flags"
    old=$(median "$tmp/train_llama3" "$B" "$T" "${flag_args[@]}")
    new=$(median ./train_llama3 "$B" "$T" "${flag_args[@]}")
    echo "| B=$B T=$T ${flags:+${flags//:/ }} | $old | $new | $(awk -v a="$new" -v b="$old" 'BEGIN { if (b + 0 > 0 && a + 0 > 0) printf "%.3f", a / b; else print "-" }') |"
done
