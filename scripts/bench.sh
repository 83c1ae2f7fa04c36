#!/usr/bin/env bash
# usage: scripts/bench.sh [--ablation] [--no-peers | --peers "eager compile cudagraphs"] [--configs "B:T ..."]
#                         [--flags "TRAINER FLAGS"] [--peer_flags "BENCH_TORCH FLAGS"] [--ranks N] [--shape 1b|3b|8b]
#                         [--write]
# Benchmark, one run on the current GPU: the trainer and its PyTorch peers (HF LlamaForCausalLM,
# bf16 autocast, fused AdamW: eager, torch.compile, torch.compile CUDA graphs; scripts/bench_torch.py,
# which needs torch) at the same configs (default "4:64 4:1024 16:1024"), then one markdown table:
# ms/step median and spread, tok/s, MFU, peak memory, and the peers' time over ours.
# --flags     also run the trainer with these flags at each config (e.g. "--grad_clip 1"): a row
#             "llama3.cu FLAGS" beside the plain one, its time over the plain run in the last column
# --ablation  also the seed report's configurations A..J (cumulative) and ours, at B=4,T=64, then each
#             setting of ./train_llama3 --list_switches that none of them covers, alone
# --peer_flags  also run each peer with these flags of bench_torch.py (e.g. "--fp8", the --fp8 1
#             recipe): a row "pytorch MODE FLAGS", timed against ours with --flags when given (--flags
#             "--fp8 1" --peer_flags "--fp8": both sides of FP8 in one call), else against plain ours
# --shape S   the model: the trainer's --shape (random init of LLaMA 3.2-1B, 3.2-3B tied, 3.1-8B) and
#             bench_torch.py's same shape (3b with --tied); MFU from the shape the trainer prints
# --ranks N   several GPUs of this machine: each implementation at one rank and at N ranks (one process
#             per GPU, B and T per GPU; ours through NCCL, launched with RANK/WORLD_SIZE/LOCAL_RANK; the
#             peers under DistributedDataParallel, bench_torch.py --ddp through torchrun; cudagraphs has
#             no N-rank row), with columns for the ranks, the throughput of N ranks over one rank's, and
#             the exposed communication (ms/step at N ranks minus at one). NCCL_NVLS_ENABLE=0 for both.
# --write     append the tables to dev/PERF.md with the date and this command line
# Steps: 30 trainer steps (median of steps 2..30), 20 PyTorch steps after 5 warm-up steps. Builds
# ./train_llama3 first (make).
# Example: scripts/bench.sh --configs "4:1024" --flags "--fp8 1" --peer_flags "--fp8"
set -u
. "$(dirname "$0")/cli.sh"
cd "$(dirname "$0")/.."
configs="4:64 4:1024 16:1024"
peers="eager compile cudagraphs"
ablation=0
write=0
flags=""
peer_flags=""
ranks=1
shape=1b
cmdline="scripts/bench.sh $*"
while [ $# -gt 0 ]; do
    case $1 in
        -h | --help) usage ;;
        --ablation) ablation=1 ;;
        --no-peers) peers="" ;;
        --write) write=1 ;;
        --peers | --configs | --flags | --peer_flags | --ranks | --shape) needs_value "$@" ;;&
        --peers) peers=$2; shift ;;
        --configs) configs=$2; shift ;;
        --flags) flags=$2; shift ;;
        --peer_flags) peer_flags=$2; shift ;;
        --ranks) ranks=$2; shift ;;
        --shape) shape=$2; shift ;;
        *) unknown_argument "$1" ;;
    esac
    shift
done
case $ranks in ''|*[!0-9]*|0) bad_argument "--ranks $ranks: want a number of GPUs, 1 or more" ;; esac
[ "$ablation" = 0 ] || [ "$ranks" = 1 ] || bad_argument "--ablation times one GPU: leave out --ranks"
if [ "$ranks" -gt 1 ]; then
    gpus=$(nvidia-smi -L 2> /dev/null | wc -l)
    [ "$gpus" -ge "$ranks" ] || { echo "--ranks $ranks: this machine has $gpus GPU(s), one per rank wanted"; exit 1; }
    export NCCL_NVLS_ENABLE=0 # (NVLink multicast off: the device tool's KINDS.md)
fi
make -s train_llama3 || exit 1
# The shape's config as the trainer prints it before it looks for a GPU (none visible here): its
# matmul weights (the blocks' and the head's) give the FLOPs per token.
start=$(CUDA_VISIBLE_DEVICES= ./train_llama3 --shape "$shape" 2>&1)
dims=$(grep '^| ' <<< "$start" | tr '|' '\n')
field() { awk -v k="$1" '$1 == k { print $2 }' <<< "$dims"; }
L=$(field n_layer) C=$(field n_embd) NH=$(field n_head) KVH=$(field n_kv_head) F=$(field ffn_hidden) V=$(field vocab_size)
[ -n "$L" ] && [ -n "$V" ] || { echo "--shape $shape: ./train_llama3 printed no config: $(tail -n 1 <<< "$start")"; exit 1; }
matmul_weights=$((L * (C * (C + 2 * C * KVH / NH) + C * C + 3 * C * F) + V * C))
peer_shape="--shape $shape"
[ "$(field tied)" = 1 ] && peer_shape="$peer_shape --tied"
if [ "$ranks" -gt 1 ] && ! ldd ./train_llama3 | grep -q libnccl; then
    echo "--ranks $ranks: ./train_llama3 was built without NCCL (make found none, or DATA_PARALLEL=0)"; exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The seed report's configurations A..J (G and I are its baselines), cumulative as in its table, then
# ours. Each entry: row|label|the flags that turn off what this row adds. A row runs with the
# off-flags of every later row, latest first, so that where two rows set one flag (grad_zeroing:
# fill before E, memset before E') the earlier row's value comes last and wins.
ABLATION=(
    "A|baseline: every optimisation off|"
    "B|+ shadow weights (cast fused into AdamW)|--shadow_weights 0"
    "C|+ float4 AdamW|--vector_adam 0"
    "D|+ redundant fills deleted (before the attention and head-permute backward outputs)|--delete_fills 0"
    "E|+ memset instead of fill kernels|--grad_zeroing fill"
    "E'|+ no zeroing at all (first gradient GEMM writes)|--grad_zeroing memset"
    "F|+ shapes by value (no per-launch H2D)|--metadata_by_value 0"
    "H|+ fused RMSNorm (one kernel each way, residual add inside)|--fused_rmsnorm 0"
    "J|+ sparse embedding rows, lazy AdamW|--sparse_embedding 0"
    "K|+ AdamW overlapping the backward (second stream, lower priority)|--overlap_optimizer 0"
    "L|+ flash attention|--flash_attention 0"
    "M|+ bf16 weight gradients, as autocast rounds them|--bf16_grads 0"
    "N|+ the step replayed from one CUDA graph|--cuda_graph 0"
    "O|+ AdamW of layers 0..11 deferred into the next forward (all on)|--deferred_adamw 0"
)
# The switches' settings other than their defaults, from the trainer (llama3.h LLAMA3_SWITCHES): each
# row's flags must be one of them (a renamed switch stops the script instead of dropping out of the
# table), and every setting no row covers gets a row of its own after them, run alone (every other
# optimisation on), labelled with the setting.
settings=$(./train_llama3 --list_switches) || { echo "error: ./train_llama3 --list_switches failed"; exit 1; }
n_seed=${#ABLATION[@]}
for entry in "${ABLATION[@]}"; do
    off=${entry##*|}
    if [ -n "$off" ] && ! grep -qxF -- "$off" <<< "$settings"; then
        echo "error: ABLATION row ${entry%%|*} of scripts/bench.sh turns off '$off', which is not a setting of" \
            "./train_llama3 --list_switches: update the row"
        exit 1
    fi
done
while IFS= read -r setting; do
    printf '%s\n' "${ABLATION[@]##*|}" | grep -qxF -- "$setting" || ABLATION+=("alone|$setting|$setting")
done <<< "$settings"
# ablation_flags I: the trainer flags of row I (0-based): a seed row's and every later seed row's, or
# an added row's own.
ablation_flags() {
    local k flags=""
    if [ "$1" -ge "$n_seed" ]; then echo "${ABLATION[$1]##*|}"; return; fi
    for ((k = n_seed - 1; k > $1; k--)); do flags="$flags ${ABLATION[$k]##*|}"; done
    echo "$flags"
}

# FLOP per token: 6 * matmul weights + 12 * L * C * T (attention), against 989 TFLOP/s.
mfu() {
    awk -v tok_s="$1" -v T="$2" -v W="$matmul_weights" -v L="$L" -v C="$C" \
        'BEGIN { printf "%.1f%%", 100 * tok_s * (6 * W + 12 * L * C * T) / 989e12 }'
}

# ours N B T [flags...]: N ranks (one process per GPU) of B x T tokens each, one micro-step; prints
# "ms ms_min ms_max tok_s peak_mib" from rank 0's JSON log (steps 2..30; tok/s of all ranks), or "fail".
ours() {
    local n=$1 B=$2 T=$3 r ok=1 pids=() rdv
    shift 3
    rm -f "$tmp/log.json"
    if [ "$n" = 1 ]; then
        ./train_llama3 --shape "$shape" --batch_size "$B" --sequence_length "$T" --total_batch_size $((B * T)) \
            --num_iteration 30 --log_file "$tmp/log.json" "$@" > "$tmp/train.log" 2>&1 || ok=0
    else
        rdv=$(mktemp -u "$tmp/rdv.XXXXXX") # (a name no earlier run used: the file must not exist yet)
        for ((r = 0; r < n; r++)); do
            RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r ./train_llama3 --shape "$shape" --batch_size "$B" --sequence_length "$T" \
                --total_batch_size $((B * T * n)) --num_iteration 30 --rendezvous "file:$rdv" \
                --log_file "$tmp/log.json" "$@" > "$tmp/train.r$r.log" 2>&1 &
            pids+=($!)
        done
        for r in "${pids[@]}"; do wait "$r" || ok=0; done
    fi
    [ "$ok" = 1 ] || { echo "fail"; return; }
    tail -n +2 "$tmp/log.json" | sed -E 's/.*"ms": ([0-9.]+), "tok_per_s": ([0-9.]+), "peak_mib": ([0-9.]+).*/\1 \3/' |
        sort -g | awk -v tok=$((B * T * n)) '{ ms[NR] = $1; if ($2 > peak) peak = $2 } END { m = ms[int((NR + 1) / 2)];
            printf "%.2f %.2f %.2f %.0f %.0f\n", m, ms[1], ms[NR], tok / (m / 1000), peak }'
}

# peer N MODE B T [flags...]: PyTorch's peer at N ranks (N > 1: DDP under torchrun), as ours prints
# it, or "fail: " and its last line of errors.
peer() {
    local n=$1 mode=$2 B=$3 T=$4 t0=$SECONDS j
    shift 4
    if [ "$n" = 1 ]; then
        # shellcheck disable=SC2086 # (peer_shape: two flags)
        j=$(python3 scripts/bench_torch.py $peer_shape --mode "$mode" --batch_size "$B" --seq_len "$T" "$@" \
            2> "$tmp/torch.err" | tail -n 1)
    else
        # shellcheck disable=SC2086
        j=$(python3 -m torch.distributed.run --standalone --nproc_per_node "$n" scripts/bench_torch.py --ddp \
            $peer_shape --mode "$mode" --batch_size "$B" --seq_len "$T" "$@" 2> "$tmp/torch.err" | tail -n 1)
    fi
    echo "pytorch $mode $*, $n rank(s), B=$B T=$T: $((SECONDS - t0)) s wall (compilation included)" >&2
    [ -n "$j" ] || { echo "fail: $(tail -n 1 "$tmp/torch.err")"; return; }
    echo "$j" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["ms"], d["ms_min"], d["ms_max"], d["tok_s"], d["peak_mib"])'
}

# row CONFIG IMPL "ms min max tok_s peak" T OURS_MS [N ONE]: one table row; with --ranks, N is the
# row's ranks and ONE the same implementation's result at one rank (scaling and exposed communication).
row() {
    local c=$1 impl=$2 T=$4 ours_ms=$5 n=${6:-1} one=${7:-} cols=""
    if [ "$ranks" -gt 1 ]; then
        cols=" $n | | |"
        if [ "$n" -gt 1 ] && [ "${one#fail}" = "$one" ] && [ "${3#fail}" = "$3" ]; then
            cols=$(awk -v n="$n" -v r="$3" -v o="$one" 'BEGIN { split(r, a, " "); split(o, b, " ");
                printf " %d | %.2fx | %.2f ms |", n, a[4] / b[4], a[1] - b[1] }')
        fi
    fi
    if [ "${3#fail}" != "$3" ]; then echo "| $c | $impl |$cols ${3/fail/failed} | | | | | |"; return; fi
    set -- $3
    printf "| %s | %s |%s %.2f | %.2f-%.2f | %.0f | %s | %.0f MiB | %s |\n" "$c" "$impl" "$cols" "$1" "$2" "$3" "$4" \
        "$(mfu "$(awk -v t="$4" -v n="$n" 'BEGIN { print t / n }')" "$T")" "$5" \
        "$(awk -v a="$1" -v b="$ours_ms" 'BEGIN { printf "%.2fx", a / b }')"
}

# One config at one rank, and with --ranks at N too: ours, ours with --flags, then each peer (and
# with --peer_flags); each row's last column against ours (with --flags for a --peer_flags row,
# when both are given) at the same ranks.
config_rows() {
    local B=$1 T=$2 c="B=$1, T=$2" o oN of ofN p r rN pf base baseN
    o=$(ours 1 "$B" "$T") of=$o
    row "$c" "llama3.cu" "$o" "$T" "${o%% *}" 1
    if [ "$ranks" -gt 1 ]; then oN=$(ours "$ranks" "$B" "$T") ofN=$oN; row "$c" "llama3.cu" "$oN" "$T" "${oN%% *}" "$ranks" "$o"; fi
    if [ -n "$flags" ]; then
        # shellcheck disable=SC2086 # (the flags split into words)
        of=$(ours 1 "$B" "$T" $flags)
        row "$c" "llama3.cu $flags" "$of" "$T" "${o%% *}" 1
        # shellcheck disable=SC2086
        [ "$ranks" -gt 1 ] && ofN=$(ours "$ranks" "$B" "$T" $flags) && row "$c" "llama3.cu $flags" "$ofN" "$T" "${oN%% *}" "$ranks" "$of"
    fi
    for p in $peers; do
        for pf in "" ${peer_flags:+"$peer_flags"}; do
            base=$o baseN=${oN:-}
            [ -n "$pf" ] && base=$of baseN=${ofN:-}
            # shellcheck disable=SC2086
            r=$(peer 1 "$p" "$B" "$T" $pf)
            row "$c" "pytorch $p${pf:+ $pf}" "$r" "$T" "${base%% *}" 1
            if [ "$ranks" -gt 1 ] && [ "$p" != cudagraphs ]; then
                # shellcheck disable=SC2086
                rN=$(peer "$ranks" "$p" "$B" "$T" $pf)
                row "$c" "pytorch $p${pf:+ $pf} DDP" "$rN" "$T" "${baseN%% *}" "$ranks" "$r"
            fi
        done
    done
}

{
    echo "### Trainer vs PyTorch ($(date +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)$([ "$ranks" -gt 1 ] && echo " x $ranks"), --shape $shape)"
    echo
    echo "\`$cmdline\`. Peak memory: ours is device memory in use (cudaMemGetInfo, CUDA context included),"
    echo "PyTorch's is torch.cuda.max_memory_allocated. Last column: that row's ms/step over ours."
    if [ "$ranks" -gt 1 ]; then
        echo "B and T per GPU; tok/s of all GPUs, MFU per GPU; rank 0's step times and memory. Scaling: tok/s over the"
        echo "same implementation's at one rank; exposed communication: its ms/step at N ranks minus at one."
        echo "Last column against ours at the same ranks."
        echo
        echo "| config | implementation | ranks | scaling | exposed comm | ms/step | spread | tok/s | MFU | peak memory | time vs ours |"
        echo "|---|---|---|---|---|---|---|---|---|---|---|"
    else
        echo
        echo "| config | implementation | ms/step | spread | tok/s | MFU | peak memory | time vs ours |"
        echo "|---|---|---|---|---|---|---|---|"
    fi
    for c in $configs; do config_rows "${c%%:*}" "${c##*:}"; done
} | tee "$tmp/table.md"

if [ "$ablation" = 1 ]; then
    {
        echo
        echo "### Ablation at B=4, T=64 ($(date +%F)): the seed report's configurations, cumulative"
        echo
        echo "Rows G and I of the seed report are baselines (F and H again); the seed measured D and E against C."
        [ "${#ABLATION[@]}" -gt "$n_seed" ] &&
            echo "Rows \"alone\": a setting of \`--list_switches\` that no seed row covers, with every other optimisation on."
        echo
        echo "| row | configuration | ms/step | spread | tok/s | MFU | peak memory | time vs A |"
        echo "|---|---|---|---|---|---|---|---|"
        base=""
        for i in "${!ABLATION[@]}"; do
            IFS='|' read -r id label _ <<< "${ABLATION[$i]}"
            o=$(ours 1 4 64 $(ablation_flags "$i"))
            [ -z "$base" ] && base=${o%% *}
            row "$id" "$label" "$o" 64 "$base"
        done
    } | tee -a "$tmp/table.md"
fi
if [ "$write" = 1 ]; then { echo; cat "$tmp/table.md"; } >> dev/PERF.md && echo "appended to dev/PERF.md"; fi
