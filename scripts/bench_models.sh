#!/usr/bin/env bash
# usage: scripts/bench_models.sh [--shapes "1b 3b 8b"] [--steps N] [--tokens N] [--torch] [--torch_accum N]
# The model family on this GPU, one call: the 1B, 3B and 8B (random init, --shape), each in bf16 and
# with --fp8 1, at --tokens tokens per optimizer step (default 524288, 0.5M: llm.q's and real runs'
# step) and T=1024 (the 8B: 2048). For each the trainer's --dry_run 1 picks what fits this card: the
# first of the default flags, then --optimizer_state bf16, then also --master_weights bf16 (each of
# these is faster than the one before it: fewer bytes for AdamW), then with --recompute 1, then with
# --offload_optimizer 1 (at 0.5M tokens a step AdamW's trip over PCIe, predicted about 1 % of the 8B's
# step, costs less than recomputing: dev/PERF.md) and --recompute 0, 1, 2, with the
# largest B of 16, 8, 4, 2, 1 (micro-steps make up the step) whose memory the dry run says fits the
# card's class (80 GB or 141 GB, from nvidia-smi). Then N steps (default 3; the median of steps
# 2..N) on a file of random token ids; one markdown table: ms/step, tok/s, MFU as the trainer prints
# it, peak memory, the flags, and FP8's tok/s over bf16's. A model that fits no way is a row with
# the dry run's advice.
#   --torch          also PyTorch beside each bf16 row, in the same call: scripts/bench_torch.py --mode
#                    compile (HF LlamaForCausalLM, the same shape, tied or not, B and T) with the row's recipe as far
#                    as PyTorch has it: --master_weights bf16 (torchao's stochastically rounded AdamW,
#                    requirements-bench.txt) where the row has bf16 weights, --checkpointing where it
#                    recomputes or offloads (its memory was tight); 1 warm-up step, then the median of 2;
#                    where PyTorch runs out of memory, half the batch and twice the micro-steps, down to
#                    B=1 (then the row says so); the table adds its tok/s and flags, and ours over it
#   --torch_accum N  PyTorch's micro-steps per optimizer step (default: the row's, the same tokens a
#                    step); fewer to save time, which gives PyTorch's AdamW a larger share of its step
# Example: scripts/bench_models.sh --shapes "1b 3b" --steps 4
set -u
. "$(dirname "$0")/cli.sh"
cd "$(dirname "$0")/.."
shapes="1b 3b 8b" steps=3 tokens=524288 torch=0 torch_accum=""
while [ $# -gt 0 ]; do
    case $1 in
        -h | --help) usage ;;
        --shapes | --steps | --tokens | --torch_accum) needs_value "$@" ;;&
        --shapes) shapes=$2; shift ;;
        --steps) steps=$2; shift ;;
        --tokens) tokens=$2; shift ;;
        --torch) torch=1 ;;
        --torch_accum) torch_accum=$2; shift ;;
        *) unknown_argument "$1" ;;
    esac
    shift
done
for s in $shapes; do case $s in 1b | 3b | 8b) ;; *) bad_argument "--shapes: '$s' is none of 1b, 3b, 8b" ;; esac; done
case $steps in '' | *[!0-9]* | 0 | 1) bad_argument "--steps $steps: want 2 or more (the median skips step 1)" ;; esac
case $tokens in '' | *[!0-9]* | 0) bad_argument "--tokens $tokens: want a number of tokens" ;; esac
case $torch_accum in '') ;; *[!0-9]* | 0*) bad_argument "--torch_accum $torch_accum: want 1 or more" ;; esac
for s in $shapes; do
    T=$([ "$s" = 8b ] && echo 2048 || echo 1024)
    [ $((tokens % T)) = 0 ] || bad_argument "--tokens $tokens: not a whole number of the $s's sequences of $T tokens"
done
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2> /dev/null | head -n 1)
[ -n "$mib" ] || { echo "error: scripts/bench_models.sh needs a GPU (nvidia-smi finds none)"; exit 1; }
card=$([ "$mib" -gt 100000 ] && echo "141 GB" || echo "80 GB")
make -s train_llama3 || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Random LLaMA-3 ids, a step and a token more than one step (prepare_data.py's format: a 1024-byte
# header, magic 20240801, version 7, the count, then uint32 ids).
data=$tmp/random_tokens.bin
python3 - "$data" $((tokens + 1)) << 'PY' || exit 1
import sys
import numpy as np
n = int(sys.argv[2])
header = np.zeros(256, np.int32)
header[:3] = [20240801, 7, n]
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    f.write(np.random.default_rng(0).integers(0, 128256, n, dtype=np.uint32).tobytes())
PY

# fitting SHAPE T FLAGS...: "B|flags" of the first setting the dry run says fits this card, or
# "none|advice" with the dry run's advice for the largest setting.
fitting() {
    local shape=$1 T=$2 extra b out=""
    shift 2
    local w="--optimizer_state bf16 --master_weights bf16"
    local o="$w --offload_optimizer 1"
    for extra in "" "--optimizer_state bf16" "$w" "$w --recompute 1" "$o" "$o --recompute 1" "$o --recompute 2"; do
        for b in 16 8 4 2 1; do
            [ $((tokens % (b * T))) = 0 ] || continue
            # shellcheck disable=SC2086
            out=$(./train_llama3 --dry_run 1 --shape "$shape" --batch_size $b --sequence_length "$T" \
                --total_batch_size "$tokens" --input_bin "$data" $extra "$@" 2>&1) || { echo "none|${out##*error: }"; return; }
            if grep -q "$card ([^)]*) yes" <<< "$out"; then echo "$b|$extra"; return; fi
        done
    done
    echo "none|$(grep -o 'Smaller: .*' <<< "$out")"
}

# torch_peer SHAPE B T MICRO_STEPS FLAGS: "tok/s|PyTorch's flags" of bench_torch.py with the row's recipe
# as far as PyTorch has it, at the row's B or, where PyTorch runs out of memory, the largest half of it
# that fits with as many more micro-steps (the same tokens a step); or "failed|why".
torch_peer() {
    local shape=$1 b=$2 T=$3 micro=${torch_accum:-$4} flags=$5 peer out err=$tmp/torch_peer.err recipe=""
    # tied as the trainer's model of that shape is (its dry run's config line: the 3B is, as released)
    ./train_llama3 --dry_run 1 --shape "$shape" --input_bin "$data" 2>&1 | grep -q '| tied 1 |' && recipe+=" --tied"
    [[ $flags == *"--master_weights bf16"* ]] && recipe+=" --master_weights bf16"
    [[ $flags == *--recompute* || $flags == *--offload_optimizer* ]] && recipe+=" --checkpointing"
    while [ "$b" -ge 1 ]; do
        peer="--mode compile --batch_size $b --accum $micro$recipe"
        # shellcheck disable=SC2086
        # (its JSON line on stdout; torch's and torchao's warnings on stderr)
        if out=$(python3 scripts/bench_torch.py --shape "$shape" --seq_len "$T" $peer --steps 2 --warmup 1 2> "$err") &&
            out=$(grep '^{' <<< "$out" | tail -n 1 | python3 -c 'import json, sys; print(round(json.load(sys.stdin)["tok_s"]))'); then
            echo "$out|$peer"
            return
        fi
        grep -q OutOfMemoryError "$err" || break
        b=$((b / 2)) micro=$((micro * 2))
    done
    # why: the script's own one-line error, else the traceback's last exception line, else stderr's last line
    echo "failed|$({ grep -E '^(error: |[A-Za-z_.]*(Error|Exception)\b)' "$err" || tail -n 1 "$err"; } | tail -n 1 | tr -d '|')"
}

rows=()
for shape in $shapes; do
    T=$([ "$shape" = 8b ] && echo 2048 || echo 1024)
    bf16_tok_s=""
    for precision in bf16 fp8; do
        p_flags=$([ $precision = fp8 ] && echo "--fp8 1")
        # shellcheck disable=SC2086
        pick=$(fitting "$shape" "$T" $p_flags)
        b=${pick%%|*} extra=${pick#*|}
        if [ "$b" = none ]; then
            rows+=("| $shape | $precision | does not fit this $card card. $extra | | | | | | | |")
            continue
        fi
        log=$tmp/${shape}_$precision.txt
        # shellcheck disable=SC2086
        ./train_llama3 --shape "$shape" --batch_size "$b" --sequence_length "$T" --total_batch_size "$tokens" \
            --num_iteration "$steps" --input_bin "$data" $extra $p_flags > "$log" 2>&1 ||
            { rows+=("| $shape | $precision | B=$b, T=$T ${extra:+$extra }$p_flags failed: $(grep -m 1 error "$log") | | | | | | | |"); continue; }
        line=$(grep '^steady state' "$log")
        ms=$(grep -o 'median [0-9.]* ms' <<< "$line" | cut -d' ' -f2)
        tok_s=$(grep -o '[0-9]* tok/s' <<< "$line" | cut -d' ' -f1)
        mfu=$(grep -o 'MFU [0-9.]*%' <<< "$line" | cut -d' ' -f2)
        peak=$(grep -o 'peak [0-9]* MiB' <<< "$line" | cut -d' ' -f2)
        ratio="" peer=""
        [ $precision = bf16 ] && bf16_tok_s=$tok_s
        [ $precision = fp8 ] && [ -n "$bf16_tok_s" ] && ratio=$(awk -v a="$tok_s" -v b="$bf16_tok_s" 'BEGIN { printf "%.2fx", a / b }')
        if [ "$torch" = 1 ] && [ $precision = bf16 ]; then
            peer=$(torch_peer "$shape" "$b" "$T" $((tokens / (b * T))) "$extra")
            case $peer in
                failed*) peer="| PyTorch ${peer#failed|} | |" ;;
                *) peer="| ${peer%%|*} (${peer#*|}) | $(awk -v a="$tok_s" -v b="${peer%%|*}" 'BEGIN { printf "%.2fx", a / b }') |" ;;
            esac
        fi
        rows+=("| $shape | $precision | B=$b, T=$T, $((tokens / (b * T))) micro-steps ${extra:+$extra }$p_flags | $ms | $tok_s | $mfu | $(awk -v p="$peak" 'BEGIN { printf "%.1f", p / 1024 }') GiB | $ratio ${peer:-| | |}")
    done
done
echo "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1), $(date -u +%F), $tokens tokens per step, $steps steps (median of 2..$steps)${torch_accum:+; PyTorch at $torch_accum micro-steps a step}"
echo "| model | precision | batch and flags | ms/step | tok/s | MFU | peak | FP8 over bf16 | PyTorch tok/s | over PyTorch |"
echo "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
