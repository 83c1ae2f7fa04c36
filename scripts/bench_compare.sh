#!/usr/bin/env bash
# usage: scripts/bench_compare.sh [REV | FOLDER] [--bits] [--configs "B:T[:--flag=value[:--flag=value ...]] ..."]
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
#   --bits    instead of timing: whether a change left the numbers alone. Each config runs 6 steps of
#             each binary with a checkpoint at the last, and the table says whether the logged losses,
#             norms and learning rates are the same text, model.bin the same bytes and state.bin's m
#             and v too (its 256-byte header names its version). A revision from before --shuffle reads
#             its token file in order: this tree's trainer then runs with --shuffle 0.
#             The default configs then use the small reference model (ref/small_t64_*, made by make
#             test): one micro-step, 2 (accumulating), clipping, --recompute 2 with bf16 moments, FP8
#             (on a GPU of compute capability 8.9+).
# Example: scripts/bench_compare.sh HEAD~1 --configs "4:64 4:64:--optimizer_state=bf16"
set -u
. "$(dirname "$0")/cli.sh"
rev="" bits=0
configs=""
while [ $# -gt 0 ]; do
    case $1 in
        -h | --help) usage ;;
        --bits) bits=1 ;;
        --configs) needs_value "$@"; configs=$2; shift ;;
        -*) unknown_argument "$1" ;;
        *) [ -z "$rev" ] || unknown_argument "$1"; rev=$1 ;;
    esac
    shift
done
rev=${rev:-HEAD}
small="--llmc_filepath=ref/small_t64_model.bin:--input_bin=ref/small_t64_tokens.bin"
[ "$bits" = 0 ] || configs=${configs:-"4:64:$small 4:64:$small:--total_batch_size=512 4:64:$small:--grad_clip=1\
 4:64:$small:--recompute=2:--optimizer_state=bf16 4:64:$small:--fp8=1"}
configs=${configs:-"4:64 4:1024 16:1024 4:64:--grad_clip=1"}
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
# A revision from before --shuffle reads its token file in order: this tree's trainer then does too.
in_order=()
"$tmp/train_llama3" --help 2>&1 | grep -q -- "--shuffle" || in_order=(--shuffle 0)

# median BIN B T [flags]: the median step time in ms (steps 2..30), or "fail".
median() {
    local bin=$1 B=$2 T=$3
    shift 3
    "$bin" --batch_size "$B" --sequence_length "$T" --total_batch_size $((B * T)) --num_iteration 30 \
        --log_file "$tmp/log.json" "$@" > "$tmp/run.log" 2>&1 || { echo fail; return; }
    tail -n +2 "$tmp/log.json" | sed -E 's/.*"ms": ([0-9.]+),.*/\1/' | sort -g |
        awk '{ ms[NR] = $1 } END { printf "%.2f\n", ms[int((NR + 1) / 2)] }'
}

# bits_run BIN DIR B T [flags]: BIN's 6 steps into DIR: the log, and the last step's checkpoint.
bits_run() {
    local bin=$1 dir=$2 B=$3 T=$4
    shift 4
    rm -rf "$dir" && mkdir -p "$dir" &&
        "$bin" --batch_size "$B" --sequence_length "$T" --num_iteration 6 --log_file "$dir/log.json" \
            --checkpoint_dir "$dir/ckpt" "$@" > "$dir/run.log" 2>&1
}
# same A B [SKIP]: "same", "differ", or "fail" when either is missing; SKIP: bytes not compared at the start.
same() {
    if [ ! -s "$1" ] || [ ! -s "$2" ]; then echo fail; elif cmp -s -i "${3:-0}" "$1" "$2"; then echo same; else echo differ; fi
}
if [ "$bits" = 1 ]; then
    echo "### $rev against this tree, bit for bit ($(date +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1))"
    echo "| config | losses, norms, lr | model.bin | state.bin's m and v |"
    echo "|---|---|---|---|"
    differ=0
    for c in $configs; do
        IFS=: read -r B T flags <<< "$c"
        IFS=: read -r -a flag_args <<< "$flags"
        for side in old new; do
            if [ $side = new ]; then
                bits_run ./train_llama3 "$tmp/$side" "$B" "$T" "${flag_args[@]}" "${in_order[@]+"${in_order[@]}"}"
            else
                bits_run "$tmp/train_llama3" "$tmp/$side" "$B" "$T" "${flag_args[@]}"
            fi
            # the step lines without their times (ms, tok/s) and memory
            sed -E 's/, "ms":.*//' "$tmp/$side/log.json" > "$tmp/$side/numbers" 2> /dev/null
        done
        row=""
        for f in numbers ckpt/step_00000006/model.bin ckpt/step_00000006/state.bin; do
            r=$(same "$tmp/old/$f" "$tmp/new/$f" "$([ "${f##*/}" = state.bin ] && echo 256)") # (the header: its version's)
            [ "$r" = same ] || differ=1
            row="$row | $r"
        done
        echo "| B=$B T=$T ${flags:+${flags//:/ }}$row |"
    done
    exit $differ
fi
echo "### $rev against this tree ($(date +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1))"
echo "| config | $rev ms/step | this tree ms/step | new / old |"
echo "|---|---|---|---|"
for c in $configs; do
    IFS=: read -r B T flags <<< "$c"
    IFS=: read -r -a flag_args <<< "$flags"
    old=$(median "$tmp/train_llama3" "$B" "$T" "${flag_args[@]}")
    new=$(median ./train_llama3 "$B" "$T" "${flag_args[@]}" "${in_order[@]+"${in_order[@]}"}")
    echo "| B=$B T=$T ${flags:+${flags//:/ }} | $old | $new | $(awk -v a="$new" -v b="$old" 'BEGIN { if (b + 0 > 0 && a + 0 > 0) printf "%.3f", a / b; else print "-" }') |"
done
