#!/usr/bin/env bash
# usage: scripts/sanitize.sh      (make sanitize builds the trainer and dev/, then runs it; needs a GPU)
# compute-sanitizer's four tools over small-shape training runs and every
# dev/ kernel check (at its small shapes: dev/NAME --small). memcheck: out-of-bounds and misaligned accesses, and CUDA API errors; racecheck:
# shared-memory hazards; initcheck: reads of global memory nothing wrote; synccheck: barriers that
# not every thread reaches. Each report is attributed to the kernel it names: ours, or NVIDIA's
# libraries (cuBLASLt's GEMMs, CUB's sort), which are listed apart with the reason they are not ours.
# Says first how many runs (tools x cases) it makes and about how long they take on one H100 (each run's
# seconds measured there, dev/PERF.md), per tool: a call of 10 minutes takes a subset (SANITIZE_TOOLS,
# SANITIZE_CASES). Prints a line as each run ends, then a table of error counts per tool and case, and
# ends with one line: "N passed, M failed; reports in our kernels: TOOL N, ...; in NVIDIA's libraries:
# ..." (a run passes with zero reports in our kernels, finished within its time limit).
#   SANITIZE_TOOLS="memcheck racecheck"  a subset of the tools
#   SANITIZE_TIMEOUT=900                 seconds per case (initcheck and racecheck are the slow ones)
#   SANITIZE_JOBS=4                      cases run at once (timing is not measured), besides the racecheck
#                                        training runs, which have a pool of their own:
#   SANITIZE_HEAVY_JOBS=1                racecheck training runs at once (the two ranks count as one). Under
#                                        racecheck each trainer process's host memory grows 1.3-1.8 GB/s, and a
#                                        step of the small model takes about 25 s: alone on a 128 GiB H100
#                                        machine, 3 steps of --recompute 2 reached 128 GB and were killed, and so
#                                        was a rank of the two. So under racecheck the training runs take 2
#                                        steps (the eager step, then the graph's capture and replay) and the
#                                        ranks 1: racecheck looks for hazards inside each launch, and step 1
#                                        launches every kernel a rank has
#   SANITIZE_CASES="train_default dev_*"  a subset of the cases: names as in the table, or bash patterns
#   SANITIZE_OUT=DIR                     keep every sanitizer log there (default: a temporary folder)
#   SANITIZE_DRY_RUN=1                   print the runs and the estimate, and stop (no GPU needed)
# A value that is not one of these (an unknown tool or case, a count that is not a positive integer) is
# one line, exit 2, before anything runs. Takes no arguments.
# Example: SANITIZE_TOOLS=memcheck SANITIZE_CASES=train_default scripts/sanitize.sh
set -u
. "$(dirname "$0")/cli.sh"
no_arguments "$@"
cd "$(dirname "$0")/.."
TOOLS="memcheck racecheck initcheck synccheck"
tools=${SANITIZE_TOOLS:-$TOOLS}
for t in $tools; do [[ " $TOOLS " == *" $t "* ]] || bad_argument "SANITIZE_TOOLS: no tool '$t' (the tools: $TOOLS)"; done
for v in SANITIZE_JOBS SANITIZE_HEAVY_JOBS SANITIZE_TIMEOUT; do
    [[ ${!v:-1} =~ ^[1-9][0-9]*$ ]] || bad_argument "$v=${!v}: a positive whole number wanted"
done
[ -x ./train_llama3 ] || bad_argument "no ./train_llama3: make sanitize builds it (and dev/) first"
out=${SANITIZE_OUT:-${TMPDIR:-/tmp}/sanitize.$$}

# The small model (2 layers, C=256, vocab 1000) and its token file, from the PyTorch reference script
# (make test writes the same files; they are made here when missing), and two more of its shapes as
# model files alone: tied embeddings, and head_dim 128 (C=512, 4 heads; the same vocabulary).
ref_model() { # LAST NAME FLAGS...: ref/NAME_*.bin from ref_llama3.py, unless LAST (its last file) exists
    local last=$1 name=$2
    shift 2
    [ -f "ref/$last" ] && return
    python3 scripts/ref_llama3.py --name "$name" --out_dir ref "$@" > "$out/ref_$name.log" 2>&1 ||
        { echo "error: the model $name: $(tail -n 3 "$out/ref_$name.log")"; return 1; }
}
small="--llmc_filepath ref/small_t64_model.bin --input_bin ref/small_t64_tokens.bin --batch_size 4 --sequence_length 64"

# Every switch off: the last setting of each that ./train_llama3 --list_switches prints (for
# grad_zeroing that is fill, whose fill kernels are ours to check; memset is the driver's; for
# deferred_adamw 1, which has no effect once overlap_optimizer is 0).
all_off=$(./train_llama3 --list_switches | awk '{ if (!($1 in v)) order[++n] = $1; v[$1] = $2 }
    END { for (i = 1; i <= n; i++) printf " %s %s", order[i], v[order[i]] }')
[ -n "$all_off" ] || { echo "error: ./train_llama3 --list_switches printed no switches"; exit 1; }

# Cases: name, then the command. The training runs cover every kernel of the step: the default (CUDA
# graph replayed from step 2, deferred and overlapped AdamW, sparse embedding, flash attention, fused
# RMSNorm, bf16 weight gradients); the other paths with AdamW still overlapping the backward (2
# micro-steps accumulating fp32 gradients, unfused attention, separate RMSNorm ops, dense embedding
# AdamW, scalar AdamW, fills); every switch off (also casts before the GEMMs, shapes copied to the
# device, AdamW after the backward); the modes: tied embeddings (with 2 micro-steps), head_dim 128,
# recompute 1 and 2 (with bf16 AdamW moments and clipping), FP8 block linears with either gradient
# format (compute capability 8.9+), bf16 weights without fp32 masters, AdamW's state in host memory
# (--offload_optimizer 1: the kernels' reads and writes of mapped host memory), document masks (--doc_mask 1 with
# the small vocabulary's most frequent token as BOS: many short documents, 2 micro-steps), and two ranks sharing the GPU
# (ZeRO-1, and again under FP8 with bf16 weights; a trainer built with
# NCCL >= 2.30, each rank under the tool: compute-sanitizer follows the launcher's children; a rank
# that fails ends the other, which would otherwise wait in NCCL until --nccl_timeout).
tokens="--input_bin ref/small_t64_tokens.bin"
ranks() { # FLAGS...: the command of two ranks of the small model, with FLAGS
    echo "env NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_NVLS_ENABLE=0 bash -c 'for r in 0 1; do RANK=\$r WORLD_SIZE=2\
 LOCAL_RANK=\$r ./train_llama3 $small --num_iteration 3 --grad_clip 1 $* --nccl_timeout 240 --rendezvous file:$out/rdv.\$\$ & done;\
 wait -n || { kill \$(jobs -p) 2> /dev/null; wait; exit 1; }; wait -n'"
}
cases=("train_default ./train_llama3 $small --num_iteration 3 --total_batch_size 256"
    "train_other_paths ./train_llama3 $small --num_iteration 2 --total_batch_size 512 --flash_attention 0\
 --fused_rmsnorm 0 --sparse_embedding 0 --vector_adam 0 --delete_fills 0 --grad_zeroing fill --cuda_graph 0"
    "train_all_off ./train_llama3 $small --num_iteration 2 --total_batch_size 512$all_off"
    "train_tied ./train_llama3 --llmc_filepath ref/sanitize_tied_model.bin $tokens --batch_size 4 --sequence_length 64\
 --num_iteration 3 --total_batch_size 512"
    "train_hd128 ./train_llama3 --llmc_filepath ref/sanitize_hd128_model.bin $tokens --batch_size 1 --sequence_length 256\
 --num_iteration 3"
    "train_recompute1 ./train_llama3 $small --num_iteration 3 --recompute 1 --optimizer_state bf16 --grad_clip 1"
    "train_recompute2 ./train_llama3 $small --num_iteration 3 --recompute 2 --optimizer_state bf16 --total_batch_size 512"
    "train_fp8 ./train_llama3 $small --num_iteration 3 --fp8 1"
    "train_fp8_e4m3 ./train_llama3 $small --num_iteration 3 --fp8 1 --fp8_grads e4m3 --recompute 2"
    "train_bf16_weights ./train_llama3 $small --num_iteration 3 --master_weights bf16 --optimizer_state bf16 --grad_clip 1\
 --total_batch_size 512"
    "train_offload ./train_llama3 $small --num_iteration 3 --offload_optimizer 1 --grad_clip 1"
    "train_doc_mask ./train_llama3 $small --num_iteration 3 --doc_mask 1 --bos_id 1 --total_batch_size 512"
    "train_chunked ./train_llama3 $small --num_iteration 3 --classifier_chunk 100 --grad_clip 1"
    "train_ranks $(ranks)")
# the ranks under FP8 with bf16 weights (compute capability 8.9+): the e4m3 all-gather and its transpose,
# the bf16 weights' own gather
fp8_gpu && cases+=("train_ranks_fp8 $(ranks --fp8 1 --master_weights bf16 --optimizer_state bf16)")
for src in dev/*.cu; do
    [ "$src" = dev/nccl.cu ] && continue
    cases+=("dev_$(basename "${src%.cu}") ${src%.cu} --small")
done
# dev/nccl (built when make found NCCL): its two ranks forked, sharing the GPU as the trainer's do.
[ -x dev/nccl ] && cases+=("dev_nccl env NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_NVLS_ENABLE=0 dev/nccl --check --ranks 2")
names=("${cases[@]%% *}")
read -r -a patterns <<< "${SANITIZE_CASES:-}" # (read leaves the patterns unexpanded)
# picked NAME: a pattern of SANITIZE_CASES takes the case (without any, every case is taken)
picked() {
    local p
    [ ${#patterns[@]} -eq 0 ] && return
    # shellcheck disable=SC2053 # ($p unquoted: a pattern)
    for p in "${patterns[@]}"; do [[ $1 == $p ]] && return; done
    return 1
}
for p in "${patterns[@]+"${patterns[@]}"}"; do
    # shellcheck disable=SC2053
    for c in "${names[@]}"; do [[ $c == $p ]] && continue 2; done
    bad_argument "SANITIZE_CASES: no case '$p' here (the cases: ${names[*]})"
done

run_case() { # TOOL NAME CMD...: one case under one tool; writes NAME.TOOL.log, .rc and .seconds
    local tool=$1 name=$2 t0=$SECONDS
    shift 2
    # dev/gemm's version 2 validates eight of cuBLASLt's candidate kernels at B=16,T=1024 sizes: only
    # library code, and hours under the slower tools; they check its version 1 (the trainer's matmul).
    [ "$name" = dev_gemm ] && [ "$tool" != memcheck ] && set -- "$@" 1
    # NCCL's SIMPLE-protocol kernels sync groups of warps with barriers that synccheck reports as
    # divergent (7,680 reports in ncclDevFunc_ReduceScatter_PreMulSum_bf16_RING_SIMPLE, 2026-12-07): a
    # library's, not ours. Under synccheck dev/nccl runs NCCL's LL protocol, as the small trainer's do.
    [ "$name" = dev_nccl ] && [ "$tool" = synccheck ] && export NCCL_PROTO=LL
    # --nvtx: matmul() marks each GEMM output written (NVTX's memory extension), for initcheck.
    timeout "${SANITIZE_TIMEOUT:-900}" compute-sanitizer --tool "$tool" --target-processes all --nvtx true --print-limit 100000 \
        --log-file "$out/$name.$tool.log" "$@" > "$out/$name.$tool.stdout" 2>&1
    echo $? > "$out/$name.$tool.rc"
    echo $((SECONDS - t0)) > "$out/$name.$tool.seconds"
    python3 scripts/sanitize_report.py "$out" "$tool" --case "$name"
}
export -f run_case
export out
# Two pools at once: the racecheck training runs (heavy: racecheck's memory per process; the ranks'
# case first, the longest) in SANITIZE_HEAVY_JOBS slots, everything else in SANITIZE_JOBS slots.
jobs_of() { # heavy|light: that pool's jobs, one a line
    local tool c name
    for tool in $tools; do
        for c in "${cases[@]}"; do
            name=${c%% *}
            picked "$name" || continue
            if [ "$tool" = racecheck ] && [[ $name == train_* ]]; then [ "$1" = heavy ] || continue
            else [ "$1" = light ] || continue; fi
            if [ "$tool" = racecheck ] && [[ $name == train_ranks* ]]; then echo "$tool ${c//--num_iteration 3/--num_iteration 1}"
            elif [ "$tool" = racecheck ] && [[ $name == train_* ]]; then echo "$tool ${c//--num_iteration 3/--num_iteration 2}"
            else echo "$tool $c"; fi
        done
    done | awk '$2 ~ /^train_ranks/ { print; next } { rest[++n] = $0 }
        END { for (i = 1; i <= n; i++) print rest[i] }'
}
pool() { # heavy|light SLOTS
    jobs_of "$1" | tr '\n' '\0' | xargs -0 -r -P "$2" -I{} bash -c 'run_case {}'
}

# Seconds of a run on one H100 (2026-12-06 and 07, dev/PERF.md; several at once), for the estimate: per
# tool a dev/ check's and a training run's, then the runs that take much longer (racecheck's dev_sample
# ran into its 520 s limit and synccheck's dev_fp8_gemm into 470 s: counted at them).
H100_SECONDS="memcheck dev_ 15 train_ 6 train_ranks 14 dev_embedding 62 dev_fp8_gemm 56 dev_gemm 62
initcheck dev_ 27 train_ 10 train_ranks 41 dev_embedding 68 dev_fp8_gemm 56 dev_nccl 60 dev_sample 124
synccheck dev_ 15 train_ 8 train_ranks 23 dev_embedding 49 dev_fp8_gemm 470 dev_sample 62
racecheck dev_ 60 train_ 65 train_ranks 90 dev_attention 211 dev_cast 270 dev_embedding 102 dev_fp8_gemm 269
racecheck dev_grad_norm 355 dev_nccl 100 dev_rmsnorm 195 dev_sample 520 dev_zeroing 106"
# estimate: the runs' count and the minutes they take on one H100, in all and per tool alone: the
# longest of the heavy pool's, the light pool's shared by its slots, and the light pool's longest run.
estimate() {
    { jobs_of heavy | sed 's/^/heavy /'; jobs_of light | sed 's/^/light /'; } |
        awk -v table="$H100_SECONDS" -v tools="$tools" -v light_slots="${SANITIZE_JOBS:-4}" \
            -v heavy_slots="${SANITIZE_HEAVY_JOBS:-1}" '
        BEGIN { n = split(table, rows, "\n")
                for (i = 1; i <= n; i++) { k = split(rows[i], f, " "); for (j = 2; j < k; j += 2) s[f[1] " " f[j]] = f[j + 1] } }
        function secs(tool, name) { # the case exactly, else its kind (the name up to its first _)
            if ((tool " " name) in s) return s[tool " " name]
            if (name ~ /^train_ranks/) return s[tool " train_ranks"]
            return s[tool " " substr(name, 1, index(name, "_"))] }
        function minutes(k, m) {
            m = heavy[k] / heavy_slots
            if (light[k] / light_slots > m) m = light[k] / light_slots
            if (longest[k] > m) m = longest[k]
            return m / 60 }
        { t = secs($2, $3); runs++
          for (k = 0; k < 2; k++) { key = k ? $2 : "all"
              if ($1 == "heavy") heavy[key] += t; else { light[key] += t; if (t > longest[key]) longest[key] = t } } }
        END { printf "%d runs, about %.0f min on one H100 (%d at once, and %d racecheck training run); alone:", runs, minutes("all"), light_slots, heavy_slots
              n = split(tools, list, " "); for (i = 1; i <= n; i++) printf "%s %s %.0f min", (i > 1 ? "," : ""), list[i], minutes(list[i])
              print "" }'
}
echo "scripts/sanitize.sh: $(estimate)"
if [ "${SANITIZE_DRY_RUN:-0}" = 1 ]; then { jobs_of heavy; jobs_of light; } | awk '{ print "run", $1, $2 }'; exit 0; fi

command -v compute-sanitizer > /dev/null || { echo "error: compute-sanitizer is not on the PATH"; exit 1; }
nvidia-smi -L > /dev/null 2>&1 || { echo "error: make sanitize needs a GPU (nvidia-smi finds none)"; exit 1; }
mkdir -p "$out" ref
# the three at once: each is mostly the start of PyTorch (one after another: about 45 s on the H100 machine)
ref_model small_t64_tokens.bin small_t64 --shape small --batch_size 4 --seq_len 64 --llmc &
ref_model sanitize_tied_model.bin sanitize_tied --shape small --tied --model_only &
ref_model sanitize_hd128_model.bin sanitize_hd128 --shape small_hd128 --rope_factor 8 --model_only &
for _ in 1 2 3; do wait -n || exit 1; done
pool heavy "${SANITIZE_HEAVY_JOBS:-1}" &
pool light "${SANITIZE_JOBS:-4}"
wait

python3 scripts/sanitize_report.py "$out" $tools
