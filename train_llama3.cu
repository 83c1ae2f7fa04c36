// train_llama3.cu: LLaMA 3 training in bf16 mixed precision on one GPU, in one file.
// Read top to bottom in the order a step happens: model and buffers, forward, backward,
// optimizer, the step and its logging, main. Host-side C (config, formats, loader, CLI) is in
// llama3.h; every kernel and its launcher is in kernels.cuh.
//
// Precision follows PyTorch autocast(bfloat16) with fp32 master weights: matmuls take bf16
// operands (the Adam kernel's shadow copies of the weights) and accumulate in fp32; the residual
// stream, RMSNorm, softmax statistics, the loss and AdamW are fp32; the matmul weights' gradients
// are bf16 when one micro-step makes the step [bf16 grads], the other gradients fp32.
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.cuh"
#include "llama3.h"

#ifndef LLAMA3_NCCL
#define LLAMA3_NCCL 0 // make DATA_PARALLEL=1 sets 1: several ranks through NCCL
#endif

static_assert(4 * RMS_VEC * 1024 == LLAMA3_MAX_N_EMBD, "kernel_limits_check's n_embd bound is the RMSNorm row width");
static_assert(LLAMA3_MAX_TILED_ROWS == 65535 * FA_TILE && FA_TILE == FP8_TILE,
              "train_args_check's bounds on T and B*T are the tiles that 65535 blocks of a grid's y axis take");

#ifndef LLAMA3_NVTX
#define LLAMA3_NVTX 1
#endif
#if LLAMA3_NVTX
#include <nvtx3/nvToolsExt.h>
#define NVTX_PUSH(name) nvtxRangePushA(name)
#define NVTX_POP() nvtxRangePop()
#else
#define NVTX_PUSH(name)
#define NVTX_POP()
#endif

// ---- collectives [data parallel] ----
// The NCCL calls of the data-parallel step, each checked: in-place reduce-scatter (the average over
// the ranks onto each rank's part), in-place all-gather of the parts, and all-reduce. Built without
// NCCL, a run has one rank (rank_env_check refuses more) and none of them is called.
enum CommOp { COMM_SUM, COMM_AVG, COMM_MAX };
#if LLAMA3_NCCL
#include <nccl.h>
typedef ncclComm_t CommHandle;
static void nccl_check(ncclResult_t r, const char* what, const char* file, int line) {
    if (r == ncclSuccess) return;
    fprintf(stderr, "error: %sNCCL error at %s:%d: %s (%s)\n  in %s\n", rank_tag, file, line, ncclGetErrorString(r),
            ncclGetLastError(NULL), what);
    exit(EXIT_FAILURE);
}
#define NCCL_CHECK(call) nccl_check((call), #call, __FILE__, __LINE__)
template <typename T> static ncclDataType_t nccl_type();
template <> ncclDataType_t nccl_type<float>() { return ncclFloat32; }
template <> ncclDataType_t nccl_type<bf16>() { return ncclBfloat16; }
template <> ncclDataType_t nccl_type<int>() { return ncclInt32; }
template <> ncclDataType_t nccl_type<unsigned>() { return ncclUint32; }
template <> ncclDataType_t nccl_type<e4m3>() { return ncclUint8; } // (moved as bytes, never reduced)
static ncclRedOp_t nccl_op(CommOp op) { return op == COMM_SUM ? ncclSum : op == COMM_AVG ? ncclAvg : ncclMax; }

// Collectives issued between the two calls start together (one NCCL launch for a group's tensors).
static void comm_group(bool start) { NCCL_CHECK(start ? ncclGroupStart() : ncclGroupEnd()); }
// x[0 .. world*part): every rank's gradients in; the average of part `rank` out at x + rank*part.
template <typename T> static void reduce_scatter(CommHandle c, T* x, size_t part, int rank, cudaStream_t s) {
    NCCL_CHECK(ncclReduceScatter(x, x + (size_t)rank * part, part, nccl_type<T>(), ncclAvg, c, s));
}
// This rank's part in; every rank's part out, in order, at all (in place: mine = all + rank*part).
template <typename T> static void all_gather(CommHandle c, const T* mine, T* all, size_t part, cudaStream_t s) {
    NCCL_CHECK(ncclAllGather(mine, all, part, nccl_type<T>(), c, s));
}
template <typename T> static void all_reduce(CommHandle c, const T* x, T* out, size_t n, CommOp op, cudaStream_t s) {
    NCCL_CHECK(ncclAllReduce(x, out, n, nccl_type<T>(), nccl_op(op), c, s));
}
#else
typedef void* CommHandle;
[[noreturn]] static void no_collectives(void) {
    fprintf(stderr, "internal error: a collective in a train_llama3 built without NCCL\n");
    abort();
}
static void comm_group(bool) { no_collectives(); }
template <typename T> static void reduce_scatter(CommHandle, T*, size_t, int, cudaStream_t) { no_collectives(); }
template <typename T> static void all_gather(CommHandle, const T*, T*, size_t, cudaStream_t) { no_collectives(); }
template <typename T> static void all_reduce(CommHandle, const T*, T*, size_t, CommOp, cudaStream_t) { no_collectives(); }
#endif

// ---- activations ----
// Everything the backward pass reads is saved per layer; scratch is shared by all layers. Each
// buffer is a typed pointer, laid into one allocation by act_layout's table (a buffer's element
// size is its pointer's); each starts on a 256-byte boundary (cuBLASLt's preferred alignment).
// [recompute] With --recompute, a buffer the backward recomputes has one copy (not L) that every
// layer uses in turn (norms_copy, block_copy): 1 the normed inputs and act; 2 all (L) but resid.
typedef struct {
    float* resid;        // (L+1, N, C)  input of each layer; [L] feeds the final norm
    float* h;            // (L, N, C)    residual after attention
    float* rstd_attn;    // (L, N)
    float* rstd_ffn;     // (L, N)
    float* rstd_final;   // (N)
    bf16* normed_attn;   // (L, N, C)
    bf16* qkv_heads;     // (L, N * QKV) q (B,NH,T,HD) after RoPE, then k, v (B,KVH,T,HD)
    bf16* probs;         // (L, B, NH, T, T) causal softmax, unfused attention only; dS in backward
    float* lse;          // (L, B, NH, T) log2-sum-exp of each query row, flash attention only
    bf16* att_y;         // (L, N, C)    attention output, token-major
    bf16* normed_ffn;    // (L, N, C)
    bf16* gate_up;       // (L, N, 2F)
    bf16* act;           // (L, N, F)    silu(gate) * up
    bf16* normed_final;  // (N, C)
    bf16* logits;        // (head_rows, V) one classifier chunk's logits, its dlogits in place [chunked classifier]
    // scratch
    bf16* qkv;           // (N, QKV)     qkv GEMM output; dqkv in backward
    bf16* branch;        // (N, C)       o-proj / down output; gradients into norms in backward
    bf16* heads_o;       // (N, C)       unfused attention: output head-major; dO in backward
    float* scores;       // (B, NH, T, T) scores, unfused attention only; dP in backward
    float* dsum;         // (B, NH, T)   rowsum(dO * O), flash attention backward
    bf16* dheads;        // (N * QKV)    dq, dk, dv head-major
    float* dresid;       // (N, C)       gradient of the residual stream
    bf16* dresid_bf16;   // (N, C)       the same, rounded: the branch gradient the GEMMs read
    bf16* dact;          // (N, F)
    bf16* dgate_up;      // (N, 2F)
    float* dw_partial;   // (blocks, C)  RMSNorm weight-gradient partial sums
    float* losses;       // (grad_accum * N) per-token losses of the step
    int* doc_start;      // (N) [document mask] --doc_mask 1: each position's document start (DocSpans),
    int* doc_end;        // (N) and end, from the forward's inputs (every layer's attention reads them)
    float* rms_ops;      // (3, N, C)    --fused_rmsnorm 0 only: the separate ops' intermediates
    float* rms_rows;     // (2, N)       the same, per row
} Activations;

typedef struct {
    size_t field;      // offsetof(Activations, the buffer)
    size_t elem_bytes; // sizeof(*buffer)
    size_t count;      // elements
} ActRow;
#define ACT_ROW(name, n) {offsetof(Activations, name), sizeof(*((Activations*)0)->name), (n)}

// Lays every buffer into `block` (NULL: only measures) and returns the bytes they take.
static size_t act_layout(Activations* acts, unsigned char* block, const Llama3Config* c, int B, int T, int head_rows,
                         int grad_accum, int sms, bool flash, bool fused_rms, int recompute, bool doc_mask) {
    size_t N = (size_t)B * T, C = c->n_embd, L = c->n_layer, F = c->ffn_hidden, V = c->vocab_size;
    size_t DOC = doc_mask ? N : 0;
    size_t QKV = qkv_dim(c), ROWS = (size_t)B * c->n_head * T, ATT = flash ? 0 : ROWS * T, LSE = flash ? ROWS : 0;
    size_t LB = recompute >= RECOMPUTE_BLOCKS ? 1 : L, LN = recompute >= RECOMPUTE_NORMS ? 1 : L; // copies [recompute]
    const ActRow rows[] = {
        ACT_ROW(resid, (L + 1) * N * C), ACT_ROW(h, LB * N * C), ACT_ROW(rstd_attn, LB * N), ACT_ROW(rstd_ffn, LB * N),
        ACT_ROW(rstd_final, N), ACT_ROW(normed_attn, LN * N * C), ACT_ROW(qkv_heads, LB * N * QKV),
        ACT_ROW(probs, LB * ATT), ACT_ROW(lse, LB * LSE), ACT_ROW(att_y, LB * N * C), ACT_ROW(normed_ffn, LN * N * C),
        ACT_ROW(gate_up, LB * N * 2 * F), ACT_ROW(act, LN * N * F), ACT_ROW(normed_final, N * C),
        ACT_ROW(logits, (size_t)head_rows * V), ACT_ROW(qkv, N * QKV), ACT_ROW(branch, N * C), ACT_ROW(heads_o, N * C),
        ACT_ROW(scores, ATT), ACT_ROW(dsum, LSE), ACT_ROW(dheads, N * QKV), ACT_ROW(dresid, N * C),
        ACT_ROW(dresid_bf16, N * C), ACT_ROW(dact, N * F), ACT_ROW(dgate_up, N * 2 * F),
        ACT_ROW(dw_partial, (size_t)rms_bwd_blocks((int)N, sms) * C), ACT_ROW(losses, grad_accum * N),
        ACT_ROW(doc_start, DOC), ACT_ROW(doc_end, DOC), ACT_ROW(rms_ops, fused_rms ? 0 : 3 * N * C),
        ACT_ROW(rms_rows, fused_rms ? 0 : 2 * N)};
    static_assert(sizeof(rows) / sizeof(rows[0]) * sizeof(void*) == sizeof(Activations), "a row per buffer");
    size_t total = 0, i = 0;
    for (const ActRow& r : rows) {
        if (r.field != i++ * sizeof(void*)) { // each buffer once, in the struct's order
            fprintf(stderr, "act_layout: row %zu lays out buffer %zu of the struct\n", i - 1, r.field / sizeof(void*));
            exit(EXIT_FAILURE);
        }
        if (block) *(unsigned char**)((unsigned char*)acts + r.field) = block + total;
        total += (r.count * r.elem_bytes + 255) / 256 * 256;
    }
    return total;
}
#undef ACT_ROW

// ---- optimizer: AdamW, its state and its update ----
// AdamW as everything else uses it: the step updates a range of weights or [sparse rows] a table's
// touched rows; a checkpoint saves and loads its state; ZeRO gives it the state of a rank's runs
// only (`count` values, addressed by a state index); the NaN guard and clipping write skip and the
// clip scale into this step's hyperparameters (optimizer_hyper). Its two implementations are its
// moments' dtypes, fp32 or [bf16 moments] bf16 (--optimizer_state), one template each function.
// [offload] With --offload_optimizer 1 the moments live in pinned host memory mapped into the GPU's
// address space: the same kernels read and write them there over PCIe (the same bits, no copies to
// schedule), so a model whose state does not fit the GPU trains at the bus's speed for AdamW.
typedef struct {
    OptimConfig cfg;     // the schedule, betas, eps, weight decay, clipping, the moments' dtype
    size_t count;        // values of each moment: every weight, or [data parallel] this rank's runs
    void* moment[2];     // m and v, count values each of cfg.moments' dtype: device memory, or [offload] pinned
                         // host memory that the kernels reach through the same address
    AdamWHistory* hyper; // device: the hyperparameters of this step and the previous one
    int* steps;          // device: steps taken
    int sms;             // the GPU's multiprocessors (the kernels' float4 guard)
    bool vec4;           // float4 where aligned [float4 Adam] (off only in the ablation)
} Optimizer;

// Bytes of each moment (count values of --optimizer_state's dtype).
static size_t optimizer_moment_bytes(const Optimizer* o) { return o->count * moment_bytes(o->cfg.moments); }
// [offload] Pinned, mapped host memory (its host address is its device address: unified addressing).
static void* host_state_alloc(size_t bytes, const char* what) {
    void* p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped);
    if (e != cudaSuccess) {
        fprintf(stderr, "error: --offload_optimizer 1: cannot pin %.2f GiB of host memory for %s (%s)\n",
                bytes / 1073741824.0, what, cudaGetErrorString(e));
        exit(EXIT_FAILURE);
    }
    return p;
}
static void optimizer_alloc(Optimizer* o) {
    void* (*alloc)(size_t, const char*) = o->cfg.offload ? host_state_alloc : device_alloc;
    o->moment[0] = alloc(optimizer_moment_bytes(o), "AdamW m");
    o->moment[1] = alloc(optimizer_moment_bytes(o), "AdamW v");
    o->hyper = (AdamWHistory*)device_alloc(sizeof(AdamWHistory), "AdamW hyperparameters");
    o->steps = (int*)device_alloc(sizeof(int), "AdamW step counter");
}
static void optimizer_free(Optimizer* o) {
    for (void* p : o->moment) CUDA_CHECK(o->cfg.offload ? cudaFreeHost(p) : cudaFree(p));
    void* device[] = {o->hyper, o->steps};
    for (void* p : device) CUDA_CHECK(cudaFree(p));
}
// No step taken: moments, step counter and hyperparameters zero (called with the GPU idle,
// model_reset_training: [offload] no kernel is using the host moments).
static void optimizer_reset(const Optimizer* o) {
    for (void* p : o->moment)
        if (o->cfg.offload) memset(p, 0, optimizer_moment_bytes(o));
        else CUDA_CHECK(cudaMemset(p, 0, optimizer_moment_bytes(o)));
    CUDA_CHECK(cudaMemset(o->steps, 0, sizeof(int)));
    CUDA_CHECK(cudaMemset(o->hyper, 0, sizeof(AdamWHistory)));
}
// The step counter moves on and this step's hyperparameters are written, on the device (also the
// lr into `stats`): the first work of each step, so that a captured step replays unchanged [graphs].
static void optimizer_begin_step(const Optimizer* o, StepStats* stats, cudaStream_t s) {
    adamw_next_step(o->hyper, o->steps, o->cfg, stats, s);
}
// This step's hyperparameters (device; between steps the last step's), which the guards complete.
static AdamWParams* optimizer_hyper(const Optimizer* o) { return &o->hyper->latest; }
// The previous step's, which [deferred AdamW] updates left by it run with.
static const AdamWParams* optimizer_hyper_previous(const Optimizer* o) { return &o->hyper->previous; }

// f(m, v): the moments from state index `state` on, typed (float* or bf16*) for the AdamW kernels.
template <typename F> static void with_moments(const Optimizer* o, size_t state, F f) {
    if (o->cfg.moments == MOMENTS_BF16) f((bf16*)o->moment[0] + state, (bf16*)o->moment[1] + state);
    else f((float*)o->moment[0] + state, (float*)o->moment[1] + state);
}
// One update with hyperparameters h of n weights w (fp32 masters, or [bf16 weights] bf16; index
// element0 of the parameter block: the rounding stream's key) from their gradients (bf16 or fp32)
// and the state from index `state`, writing fp32 masters' bf16 copies to `shadow` (NULL: none);
// weight decay when `decay`.
template <typename W, typename G>
static void optimizer_update(const Optimizer* o, W* w, bf16* shadow, const G* grads, size_t n, size_t element0,
                             size_t state, bool decay, const AdamWParams* h, cudaStream_t s) {
    with_moments(o, state, [&](auto* am, auto* av) {
        if constexpr (std::is_same<W, bf16>::value) { // APPROX: rounded into bf16 at random anyway
            adamw_dense<false, true>(w, am, av, grads, (bf16*)NULL, n, element0, h, decay, o->sms, s, o->vec4);
        } else {
            BOOL_SWITCH(shadow != NULL, SHADOW, [&] {
                adamw_dense<SHADOW>(w, am, av, grads, shadow, n, element0, h, decay, o->sms, s, o->vec4);
            });
        }
    });
}
// [sparse rows] The update of the rows of `table` (C columns, element0 as above) named by a
// sorted token list (n_sorted entries, repeats included), whose state starts at `state`; the
// gradient rows are zeroed as they are read.
static void optimizer_update_rows(const Optimizer* o, float* table, float* grads, const int* sorted_tokens,
                                  int n_sorted, int C, size_t element0, size_t state, const AdamWParams* h,
                                  cudaStream_t s) {
    with_moments(o, state, [&](auto* am, auto* av) {
        adamw_sparse_rows(table, am, av, grads, sorted_tokens, n_sorted, C, element0, h, s, o->vec4);
    });
}
// [checkpoints] The state to host memory (m and v, optimizer_moment_bytes each), on stream s. [offload]
// CUDA runs a copy between two host buffers at once on the host, not in its stream's order: the save
// first waits for the stream's work (the step's AdamW, which may still be writing them), then copies.
static void optimizer_save(const Optimizer* o, void* host_m, void* host_v, cudaStream_t s) {
    size_t bytes = optimizer_moment_bytes(o);
    if (o->cfg.offload) {
        CUDA_CHECK(cudaStreamSynchronize(s));
        memcpy(host_m, o->moment[0], bytes), memcpy(host_v, o->moment[1], bytes);
        return;
    }
    CUDA_CHECK(cudaMemcpyAsync(host_m, o->moment[0], bytes, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaMemcpyAsync(host_v, o->moment[1], bytes, cudaMemcpyDeviceToHost, s));
}
// And back, as after `step` steps (before any step: no kernel is using them).
static void optimizer_load(const Optimizer* o, const void* host_m, const void* host_v, int step) {
    size_t bytes = optimizer_moment_bytes(o);
    if (o->cfg.offload) {
        memcpy(o->moment[0], host_m, bytes), memcpy(o->moment[1], host_v, bytes);
    } else {
        CUDA_CHECK(cudaMemcpy(o->moment[0], host_m, bytes, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(o->moment[1], host_v, bytes, cudaMemcpyHostToDevice));
    }
    CUDA_CHECK(cudaMemcpy(o->steps, &step, sizeof(int), cudaMemcpyHostToDevice));
}

// ---- model ----

// [deferred AdamW] What the last step left undone, set on the host as each step is launched: the
// AdamW of the plan's deferred groups, which the next step runs first (its forward waits for each
// group) or a flush applies; and a save's copy of the weights, which the next step's AdamW must
// wait for [checkpoints].
typedef struct {
    bool updates;          // the deferred groups' AdamW of the last step has not run
    cudaEvent_t* save_copy; // NULL: no save since the last step
} Pending;

// The step's schedule, fixed for the run but for what the last step left: when each AdamW update
// group runs (the plan, step_plan), the optimizer stream [streams] and the events that order it
// against the main stream, what is pending, and the captured step [graphs]. Its plan decides whether
// a step counts (counted_by); the functions from "optimizer: the step's updates" to "training step"
// launch every update and every collective of a step from it.
typedef struct {
    const StepPlan* plan;
    cudaStream_t opt_stream;           // AdamW and the collectives, at low priority
    cudaEvent_t grads_ready, opt_done; // the main stream's work so far; the optimizer stream's
    cudaEvent_t* group_updated;        // per update group: its deferred AdamW is done
    Pending pending;
    cudaGraphExec_t graph; // [graphs] captured at this process's second step (the first made every GEMM plan)
    int steps_run;         // steps this process has launched
} StepSchedule;

// The stream (at priority `priority`) and events of a schedule whose plan is set.
static void schedule_create(StepSchedule* s, int priority) {
    CUDA_CHECK(cudaStreamCreateWithPriority(&s->opt_stream, cudaStreamDefault, priority));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->grads_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->opt_done, cudaEventDisableTiming));
    s->group_updated = (cudaEvent_t*)malloc(s->plan->n_groups * sizeof(cudaEvent_t));
    for (int g = 0; g < s->plan->n_groups; g++)
        CUDA_CHECK(cudaEventCreateWithFlags(&s->group_updated[g], cudaEventDisableTiming));
}
// Drops the captured step: the next step runs eagerly, the one after is captured anew.
static void schedule_drop_graph(StepSchedule* s) {
    if (s->graph) CUDA_CHECK(cudaGraphExecDestroy(s->graph));
    s->graph = NULL;
}
static void schedule_free(StepSchedule* s) {
    schedule_drop_graph(s);
    CUDA_CHECK(cudaStreamDestroy(s->opt_stream));
    CUDA_CHECK(cudaEventDestroy(s->grads_ready));
    CUDA_CHECK(cudaEventDestroy(s->opt_done));
    for (int g = 0; g < s->plan->n_groups; g++) CUDA_CHECK(cudaEventDestroy(s->group_updated[g]));
    free(s->group_updated);
}

// [data parallel] This process's share of a run over several ranks.
typedef struct {
    int rank, world;
    CommHandle nccl;
    ZeroLayout zero;          // the runs of weights and AdamW state this rank updates (llama3.h)
    TokenSorter union_sorter; // [sparse rows] every rank's step inputs, sorted (world * n_step entries)
    int* all_tokens;          // device: every rank's step inputs, gathered
    float* union_grads;       // device: (world * n_step, C) the wte gradient rows of the union, averaged
    float* sumsq_total;       // [clipping] device: the norm's partial sums (sumsq_count) summed over the ranks
    int* count;               // device: one int summed over the ranks (ranks_sum)
    pthread_t watchdog;       // ends the process when the others stop answering (comm_start)
} Comm;

// [fp8] --fp8 1: the block linears' GEMMs (qkv, attn_out, gate_up, down) read FP8 operands
// (kernels.cuh [fp8]), each with its own dynamic tensorwise scale (the amax of the tensor as it is
// now). Each weight's e4m3 copy and its transpose are quantised from the bf16 shadow after every
// AdamW update of it ([data parallel] each rank quantises its part, the ranks all-gather the bytes and
// each transposes the whole: fp8_shard_amax). The forward quantises each GEMM input once, straight for its GEMM and
// transposed for the backward's weight gradient (kept per layer, with its scale); the backward
// quantises each output gradient, straight and transposed, in one pass. Amaxes come from a pass of
// their own, or (fp8_amax_fused) from the kernel that writes the tensor.
typedef struct {
    e4m3 *w, *w_t;       // the block linears' weights W (out, in) and W^T (in, out), each at its slice's
                         // fp8_weight_at (llama3.h tensor_table)
    Fp8Scale* w_scale;   // one per block linear weight, at its slice's fp8_slot
    e4m3* x;             // one forward GEMM's input (N, in)
    e4m3* x_t;           // every block linear's input transposed (in, N), made by the forward for the
                         // backward: layer l's [qkv's | attn_out's | gate_up's | down's] (fp8_input_t);
                         // [recompute] 2: one layer's, remade by the block's forward again
    unsigned char *dy, *dy_t; // one backward GEMM's output gradient (N, out) and its transpose (out, N),
                              // in grad_type
    cudaDataType grad_type;   // --fp8_grads: CUDA_R_8F_E5M2 or CUDA_R_8F_E4M3
    Fp8Scale* act_scale; // per fp8_slot: the input's and the output gradient's (fp8_act_scale),
                         // zeroed as the forward starts
} Fp8Buffers;

// A range of the parameter block kept in bf16, apart from its fp32 block (empty: none).
typedef struct {
    size_t begin, end;
} Bf16Range;

typedef struct {
    Llama3Config cfg;
    ParamLayout layout;
    TensorTable tab; // every weight slice's update group and slots (llama3.h tensor_table)
    Switches sw; // which optimisations are on (all, except in the ablation)
    int B, T, grad_accum, sms;
    int head_rows; // [chunked classifier] rows of a micro-batch the classifier takes at a time (classifier_rows)
    int recompute; // [recompute] --recompute: RECOMPUTE_NONE, _NORMS or _BLOCKS
    int doc_bos;   // [document mask] --doc_mask 1: the token that starts a document; -1: plain causal attention
    // one block each, parameter-sized (see llama3.h for the order)
    float* params; // fp32 master weights; [bf16 weights] all but the matmul weights' (see param_f32)
    float* grads;  // fp32; wte's rows are zero except those touched this step [sparse rows]. With
                   // bf16 grads it holds the others but grad_bf16's, packed (see grad_f32)
    bf16* grads_bf16;   // [bf16 grads] the gradients of the range grad_bf16, in its order; or NULL
    Bf16Range grad_bf16; // [bf16 grads] their range: the matmul weights, but the head when the classifier runs in
                         // chunks (its gradient sums them in fp32); empty when the gradients are all fp32
    Optimizer optim; // AdamW and its state: of every parameter, or [data parallel] of this rank's runs
    bf16* shadow;      // [shadow weights] bf16 copy of params[shadow_begin, matmul_end)
    bf16* cast_weight; // with shadow_weights off: one weight cast to bf16 just before its GEMM
    Activations acts;   // typed pointers into one block
    void* acts_block;
    size_t acts_bytes;
    int* tokens;          // device: the step's inputs (grad_accum*N) then targets (grad_accum*N)
    int32_t* tokens_host; // pinned staging, two steps' worth (double buffered)
    float* rope_cos;      // (T, HD/2)
    float* rope_sin;
    TokenSorter sorter;   // [sparse rows] sized for grad_accum*N tokens
    StepStats* stats;      // device: the step's loss, gradient norm, lr, NaN guard counts
    StepStats* stats_host; // pinned, two slots
    float* sumsq;          // [clipping] SUMSQ_BLOCKS partial sums of squares per gradient slice (sumsq_of)
    Gemm* gemm;            // cuBLASLt and its plans (made on each shape's first use)
    cudaStream_t stream;
    StepSchedule step; // when the step's work runs, on which stream, and what is pending
    HeadShape* shape_in_memory; // with metadata_by_value off: where shapes are copied before launches
    Comm* comm;                 // [data parallel] NULL: one rank
    Fp8Buffers* fp8;            // [fp8] NULL: --fp8 0
} Model;

static size_t param_offset(const Model* m, int tensor, int layer) {
    return m->layout.offset[tensor] + (size_t)layer * m->layout.layer_size[tensor];
}
// An fp32 block of every parameter but those of the range r (kept in bf16 elsewhere), packed: its
// elements, and the index of the parameter at `offset` (outside r).
static size_t f32_block_count(const ParamLayout* p, Bf16Range r) { return p->total - (r.end - r.begin); }
static size_t f32_block_index(Bf16Range r, size_t offset) {
    return offset >= r.end ? offset - (r.end - r.begin) : offset;
}
// [bf16 weights] --master_weights bf16: the matmul weights' bf16 copy (the shadow) is the only one.
static bool bf16_weights(const Model* m) { return m->optim.cfg.weights == WEIGHTS_BF16; }
static Bf16Range bf16_weight_range(const Model* m) {
    Bf16Range none = {0, 0}, matmuls = {m->layout.matmul_begin, m->layout.matmul_end};
    return bf16_weights(m) ? matmuls : none;
}
// The fp32 weight at `offset`: every parameter's, or with bf16 weights wte's and the norm weights'.
static float* param_f32(const Model* m, size_t offset) {
    return m->params + f32_block_index(bf16_weight_range(m), offset);
}
// The fp32 gradient at `offset`: every parameter's but [bf16 grads] grad_bf16's.
static float* grad_f32(const Model* m, size_t offset) { return m->grads + f32_block_index(m->grad_bf16, offset); }
// [bf16 grads] The bf16 gradient at `offset`, in grad_bf16.
static bf16* grad_bf16(const Model* m, size_t offset) { return m->grads_bf16 + (offset - m->grad_bf16.begin); }
// Whether the weight at `offset` is a matmul weight [lm_head, down]: not a tied wte, not a norm.
static bool is_matmul_weight(const Model* m, size_t offset) {
    return offset >= m->layout.matmul_begin && offset < m->layout.matmul_end;
}
// [bf16 grads] Whether the gradient at `offset` is bf16 (in grad_bf16).
static bool grad_is_bf16(const Model* m, size_t offset) {
    return offset >= m->grad_bf16.begin && offset < m->grad_bf16.end;
}
// Test seam [reference gradients]: called after the backward writes a gradient (count elements at
// parameter offset `offset`). test_llama3 defines it to overwrite them with PyTorch's, so that
// the optimizer path training runs (overlapped, deferred, replayed from the graph) is checked on
// the reference's own gradients; the trainer compiles it away.
#ifdef TESTING
static void grad_written(const Model* m, size_t offset, size_t count);
#else
static inline void grad_written(const Model*, size_t, size_t) {}
#endif
// [shadow weights] Whether the weight at `offset` has a bf16 shadow: a GEMM reads it.
static bool has_shadow(const Model* m, size_t offset) {
    return m->sw.shadow_weights && offset >= m->layout.shadow_begin && offset < m->layout.matmul_end;
}
// The bf16 weight a GEMM reads: the shadow copy, or (ablation) a cast of the fp32 master made now.
static const bf16* weight_bf16(const Model* m, int tensor, int layer) {
    size_t offset = m->layout.offset[tensor] + (size_t)layer * m->layout.layer_size[tensor];
    if (m->sw.shadow_weights) return m->shadow + (offset - m->layout.shadow_begin);
    cast_to_bf16(m->cast_weight, param_f32(m, offset), m->layout.layer_size[tensor], m->stream);
    return m->cast_weight;
}
// AdamW update groups, in the order the forward reads them: wte, layer l at 1 + l, then the head
// (final norm and lm_head); the table says which slices each holds (llama3.h tensor_table), the
// plan when each is updated (step_plan).
static int num_groups(const Model* m) { return m->step.plan->n_groups; }
static int head_group(const Model* m) { return num_groups(m) - 1; }
// Update group g's slices (indices into the table) in the order AdamW takes them; returns how many.
static int group_slices(const Model* m, int g, const int** slices) {
    *slices = m->tab.in_group + m->tab.group_start[g];
    return m->tab.group_start[g + 1] - m->tab.group_start[g];
}
// [deferred AdamW] Whether the plan defers update group g's AdamW to the next step.
static bool group_deferred(const Model* m, int g) { return m->step.plan->timing[g] == ADAMW_DEFERRED; }
// [clipping] The partial sums of squares of a gradient slice: SUMSQ_BLOCKS at its slot (the table's
// sumsq_slot).
static float* sumsq_of(const Model* m, int tensor, int layer) {
    return m->sumsq + (size_t)slice_of(&m->tab, tensor, layer)->sumsq_slot * SUMSQ_BLOCKS;
}
// All the partial sums: SUMSQ_BLOCKS for each slot; [data parallel] then as many for the slots'
// tails (rank 0 sums the tails, which every rank holds alike).
static size_t sumsq_slots(const Model* m) { return m->tab.n_sumsq_slots; }
static int world_of(const Model* m) { return m->comm ? m->comm->world : 1; }
static size_t sumsq_count(const Model* m) { return sumsq_slots(m) * SUMSQ_BLOCKS * (m->comm ? 2 : 1); }

// Bytes of bf16 weights: the shadow block, or the largest single weight a GEMM reads, to cast into
// (ablation; wte counts as a tied head's weight).
static size_t bf16_weight_bytes(const Model* m) {
    const ParamLayout* p = &m->layout;
    if (m->sw.shadow_weights) return (p->matmul_end - p->shadow_begin) * 2;
    size_t largest = 0;
    for (int j = 0; j < m->tab.n_slices; j++)
        if (m->tab.slice[j].out && m->tab.slice[j].n > largest) largest = m->tab.slice[j].n;
    return largest * 2;
}

// [bf16 grads] with one micro-step per step, the matmul weights' gradients are bf16: what PyTorch's
// autocast gives too (its bf16 GEMM writes them, then the weight cast's backward widens them to
// fp32), and 2 bytes less to write and to read per weight. Accumulating steps keep fp32, and so does
// [chunked classifier] the head's gradient when the classifier sums it over chunks (the block linears'
// stay bf16: one GEMM writes each).
static Bf16Range bf16_grad_range(const Model* m) {
    Bf16Range none = {0, 0}, r = {m->layout.matmul_begin, m->layout.matmul_end};
    if (!m->sw.bf16_grads || m->grad_accum > 1) return none;
    if (m->head_rows < m->B * m->T) r.begin = m->layout.offset[P_QKV]; // (a tied head's, wte's, is fp32 anyway)
    return r;
}
// Device bytes of the model's buffers, by the parts a flag changes (not the token buffers, RoPE
// table, sort scratch and the union's rows: a few MiB at the bench shapes).
typedef struct {
    size_t weights;     // fp32 masters, and the bf16 shadow (or the ablation's cast buffer)
    size_t moments;     // AdamW's m and v, this rank's share (ZeRO-1), of --optimizer_state's dtype (0: offloaded)
    size_t gradients;   // fp32, or bf16 for the matmul weights [bf16 grads]
    size_t activations; // what the backward reads, for B x T (and the scratch of one layer)
    size_t workspace;   // cuBLASLt's
    size_t fp8;         // [fp8] the weights' FP8 copies, the inputs' transposes, one GEMM's operands (0: --fp8 0)
    size_t host;        // [offload] pinned host memory: m and v (not counted in the GPU's total)
} MemoryParts;
// [recompute] The copy of a saved activation that layer l writes and its backward reads: the
// layer's own, or the one copy (0) that every layer recomputes in turn. norms_copy: normed_attn,
// normed_ffn, act (--recompute 1 or 2); block_copy: every other per-layer buffer but resid (2).
static size_t norms_copy(const Model* m, int l) { return m->recompute >= RECOMPUTE_NORMS ? 0 : l; }
static size_t block_copy(const Model* m, int l) { return m->recompute >= RECOMPUTE_BLOCKS ? 0 : l; }

// ---- fp8: the block linears' FP8 recipe (--fp8 1) ----
// Everything the recipe decides, in one place: its buffers and their sizes, its start, the weights'
// e4m3 copies, the operands' quantising and the FP8 GEMMs of the forward and the backward. The rest
// of the step asks fp8_linear and calls linear_forward/linear_backward, and passes the amax slots
// (fp8_producer_amax, fp8_norm_amax) to the kernels that fuse an amax; [data parallel] the sharded
// quantising is in the ZeRO-1 section (fp8_shard_*).

// The FP8 buffers' sizes (besides the table's weights and scales): the widest GEMM input (C
// or F), every layer's four inputs (3C + F each; one layer's under --recompute 2) and the widest
// output gradient (QKV or 2F; C, the others', is narrower than QKV) of N tokens.
static size_t fp8_input_count(const Model* m) {
    size_t N = (size_t)m->B * m->T, C = m->cfg.n_embd, F = m->cfg.ffn_hidden;
    return N * (C > F ? C : F);
}
static size_t fp8_layer_inputs_count(const Model* m) {
    int L = m->cfg.n_layer;
    size_t copies = block_copy(m, L - 1) + 1; // (the layers whose inputs are kept)
    return (size_t)m->B * m->T * (m->tab.fp8_input_cols / L) * copies;
}
static size_t fp8_grad_count(const Model* m) {
    size_t N = (size_t)m->B * m->T, F2 = 2 * (size_t)m->cfg.ffn_hidden, QKV = qkv_dim(&m->cfg);
    return N * (QKV > F2 ? QKV : F2);
}
static size_t fp8_scale_count(const Model* m) { return m->tab.n_fp8_slots; }
static size_t fp8_bytes(const Model* m) {
    if (!m->fp8) return 0;
    return 2 * m->tab.fp8_weights + fp8_input_count(m) + fp8_layer_inputs_count(m) +
           2 * fp8_grad_count(m) + 3 * fp8_scale_count(m) * sizeof(Fp8Scale);
}
// The FP8 buffers (Fp8Buffers), their scales 16-byte aligned as cuBLASLt needs (cudaMalloc's are).
static void fp8_alloc(Model* m) {
    Fp8Buffers* f = m->fp8;
    size_t W = m->tab.fp8_weights, X = fp8_input_count(m), D = fp8_grad_count(m);
    f->w = (e4m3*)device_alloc(2 * W, "fp8 weights");
    f->w_t = f->w + W;
    f->x = (e4m3*)device_alloc(X, "fp8 GEMM input");
    f->x_t = (e4m3*)device_alloc(fp8_layer_inputs_count(m), "fp8 transposed GEMM inputs");
    f->dy = (unsigned char*)device_alloc(2 * D, "fp8 output gradients");
    f->dy_t = f->dy + D;
    f->w_scale = (Fp8Scale*)device_alloc(3 * fp8_scale_count(m) * sizeof(Fp8Scale), "fp8 scales");
    f->act_scale = f->w_scale + fp8_scale_count(m);
}

// --fp8 1 for this model and batch (llama3.h fp8_check: what train_args_check refuses too, for
// test_llama3, which comes here without it), or the run stops here, before any output is opened.
// The output gradients in `grads` (--fp8_grads). fp8_gpu_check asks the GPU for FP8 tensor cores
// (compute capability 8.9: Ada, Hopper and later).
static void fp8_start(Model* m, int grads) {
    char err[L3_ERR_LEN];
    if (fp8_check(&m->cfg, (long long)m->B * m->T, &m->sw, err)) {
        fprintf(stderr, "error: %s\n", err);
        exit(EXIT_FAILURE);
    }
    m->fp8 = (Fp8Buffers*)calloc(1, sizeof(Fp8Buffers));
    m->fp8->grad_type = grads == FP8_GRADS_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}
// This GPU has FP8 tensor cores, or the run stops here.
static void fp8_gpu_check(void) {
    int device, major, minor;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    if (major * 10 + minor < 89) {
        fprintf(stderr, "error: --fp8 1 needs FP8 tensor cores (compute capability 8.9 or newer); this GPU has %d.%d\n",
                major, minor);
        exit(EXIT_FAILURE);
    }
}

// Whether a GEMM of this weight reads FP8: --fp8 1 and a block linear (the slice has an FP8 slot).
static bool fp8_linear(const Model* m, int tensor, int layer) {
    return m->fp8 && slice_of(&m->tab, tensor, layer)->fp8_slot >= 0;
}
static size_t fp8_weight_at(const Model* m, int tensor, int layer) {
    return slice_of(&m->tab, tensor, layer)->fp8_weight_at;
}
static Fp8Scale* fp8_weight_scale(const Model* m, int tensor, int layer) {
    return m->fp8->w_scale + slice_of(&m->tab, tensor, layer)->fp8_slot;
}
// A block linear's input, transposed (in, N), as the forward left it for the backward: layer l's
// qkv's, attn_out's and gate_up's N x C each, then down's N x F; [recompute] under --recompute 2
// layer 0's place for every layer, which the block's forward again in the backward rewrites.
static e4m3* fp8_input_t(const Model* m, int tensor, int layer) {
    return m->fp8->x_t + (size_t)m->B * m->T * slice_of(&m->tab, tensor, (int)block_copy(m, layer))->fp8_input_cols;
}
// The scale of a block linear's input (grad false) or output gradient (true) in layer `layer`.
static Fp8Scale* fp8_act_scale(const Model* m, int tensor, int layer, bool grad) {
    return m->fp8->act_scale + (size_t)slice_of(&m->tab, tensor, layer)->fp8_slot * 2 + grad;
}
// The operands whose amax the kernel writing them computes as it goes: the SwiGLU output (down's
// input) and its backward's (gate_up's output gradient), and [fused RMSNorm] the RMSNorm outputs
// (qkv's and gate_up's inputs) and its backward's bf16 gradient (attn_out's and down's output
// gradients). attn_out's input (attention's output) and qkv's output gradient (RoPE's backward),
// and under --fused_rmsnorm 0 the norms', get a pass of their own (fp8_quantize_operand).
static bool fp8_amax_fused(const Model* m, int tensor, bool grad) {
    if (grad ? tensor == P_GATE_UP : tensor == P_DOWN) return true;
    bool from_norm = grad ? tensor == P_ATTN_OUT || tensor == P_DOWN : tensor == P_QKV || tensor == P_GATE_UP;
    return from_norm && m->sw.fused_rmsnorm;
}
// Where the producing kernel puts that amax, or NULL (--fp8 0, or an operand without it).
static unsigned* fp8_producer_amax(const Model* m, int tensor, int layer, bool grad) {
    if (!fp8_linear(m, tensor, layer) || !fp8_amax_fused(m, tensor, grad)) return NULL;
    return &fp8_act_scale(m, tensor, layer, grad)->amax_bits;
}
// The RMSNorm `tensor` of `layer`'s: the forward's output is the next linear's input (attention
// norm: qkv, FFN norm: gate_up; the final norm's feeds the bf16 lm_head), the backward's the
// output gradient of the linear before it (FFN norm: attn_out; attention norm: the layer below's
// down, none below layer 0; final norm: the last layer's down).
static unsigned* fp8_norm_amax(const Model* m, int tensor, int layer, bool backward) {
    if (!backward && tensor == P_FINAL_NORM) return NULL;
    if (!backward) return fp8_producer_amax(m, tensor == P_ATTN_NORM ? P_QKV : P_GATE_UP, layer, false);
    if (tensor == P_FFN_NORM) return fp8_producer_amax(m, P_ATTN_OUT, layer, true);
    if (tensor == P_FINAL_NORM) return fp8_producer_amax(m, P_DOWN, m->cfg.n_layer - 1, true);
    return layer > 0 ? fp8_producer_amax(m, P_DOWN, layer - 1, true) : NULL;
}

// The e4m3 copies W and W^T of one block linear's weight from its bf16 shadow, on stream s: after
// AdamW has written the shadow, on AdamW's stream, so that the forward's wait for the update group
// [deferred AdamW] covers them too. 6 bytes per weight: the amax pass reads 2, quantize_fp8 4.
static void fp8_quantize_weight(const Model* m, int tensor, int layer, cudaStream_t s) {
    const TensorSlice* w_slice = slice_of(&m->tab, tensor, layer);
    const bf16* w = m->shadow + (w_slice->offset - m->layout.shadow_begin);
    Fp8Scale* scale = fp8_weight_scale(m, tensor, layer);
    size_t at = w_slice->fp8_weight_at;
    CUDA_CHECK(cudaMemsetAsync(scale, 0, sizeof(Fp8Scale), s));
    fp8_amax(scale, w, w_slice->n, m->sms, s);
    quantize_fp8(m->fp8->w + at, m->fp8->w_t + at, scale, w, w_slice->out, w_slice->in, s);
}
// Every block linear's, after the shadow was made or rewritten whole.
static void fp8_quantize_weights(const Model* m, cudaStream_t s) {
    for (int j = 0; j < m->tab.n_slices; j++) {
        const TensorSlice* w_slice = &m->tab.slice[j];
        if (w_slice->fp8_slot >= 0) fp8_quantize_weight(m, w_slice->tensor, w_slice->layer, s);
    }
}

// A block linear's input (grad false) or output gradient (true) x (N, width) bf16 of layer
// `layer`, with its scale: the amax (unless its producer made it), then straight into `out` and
// transposed into out_t (width, N) in one pass. On the main stream, after the GEMMs queued before
// it, which have read the scratch.
template <typename F8>
static void fp8_quantize_operand(const Model* m, int B, F8* out, F8* out_t, int tensor, int layer, bool grad,
                                 const bf16* x, int width) {
    int N = B * m->T;
    Fp8Scale* scale = fp8_act_scale(m, tensor, layer, grad);
    if (!fp8_amax_fused(m, tensor, grad)) fp8_amax(scale, x, (size_t)N * width, m->sms, m->stream);
    quantize_fp8(out, out_t, scale, x, N, width, m->stream);
}
// The activation scales start from zero in each forward (one memset of the step's 8 per layer):
// each amax is an atomicMax onto its slot, and a recomputed block's again is the same.
static void fp8_reset_scales(const Model* m) {
    if (m->fp8) CUDA_CHECK(cudaMemsetAsync(m->fp8->act_scale, 0, 2 * fp8_scale_count(m) * sizeof(Fp8Scale), m->stream));
}
// A block linear's input x (N, in) in e4m3, straight for the forward GEMM and transposed for
// the weight gradient (fp8_input_t).
static void fp8_quantize_input(const Model* m, int B, int tensor, int layer, const bf16* x, int in) {
    fp8_quantize_operand(m, B, m->fp8->x, fp8_input_t(m, tensor, layer), tensor, layer, false, x, in);
}

// A block linear's forward y (N, out) = x8 (N, in) @ W8^T, x and W in e4m3 (fp32 accumulation:
// with cuBLASLt's fast accumulation, torchao's forward, the comparison with PyTorch's own loses a
// digit, dev/PERF.md issue 24).
static void linear_forward_fp8(const Model* m, int B, bf16* y, const bf16* x, int tensor, int layer, int out, int in) {
    Fp8Buffers* f = m->fp8;
    fp8_quantize_input(m, B, tensor, layer, x, in);
    matmul_fp8(m->gemm, m->stream, y, f->x, CUDA_R_8F_E4M3, &fp8_act_scale(m, tensor, layer, false)->scale_inv,
               f->w + fp8_weight_at(m, tensor, layer), CUDA_R_8F_E4M3, &fp8_weight_scale(m, tensor, layer)->scale_inv,
               B * m->T, out, in, false);
}

// A block linear's output gradient dy (N, out) quantised, straight and transposed, in the
// format the GEMMs will read it as (Fp8Buffers.grad_type).
static void fp8_quantize_grad(const Model* m, int B, int tensor, int layer, const bf16* dy, int out) {
    Fp8Buffers* f = m->fp8;
    if (f->grad_type == CUDA_R_8F_E4M3)
        fp8_quantize_operand(m, B, (e4m3*)f->dy, (e4m3*)f->dy_t, tensor, layer, true, dy, out);
    else fp8_quantize_operand(m, B, (e5m2*)f->dy, (e5m2*)f->dy_t, tensor, layer, true, dy, out);
}
// A block linear's two backward GEMMs in FP8, in the NT layout its tensor cores take:
// dW (out, in) (+)= (dy^T)8 (x^T)8^T, and dx (N, in) = dy8 (W^T)8^T; dy in e5m2 (the range gradients
// need) or e4m3 (--fp8_grads), x and W in e4m3, x^T and its scale as this micro-step's forward made
// them (a recomputed x has the same bits). dW as weight_grad keeps it: bf16 written at one
// micro-step, else the fp32 sum that later micro-steps add onto (beta 1).
static void linear_backward_fp8(const Model* m, int B, int tensor, int layer, bf16* dx, const bf16* dy, int out, int in,
                                bool accumulate) {
    Fp8Buffers* f = m->fp8;
    int N = B * m->T;
    size_t offset = param_offset(m, tensor, layer);
    bool bf16_out = grad_is_bf16(m, offset);
    void* dw = bf16_out ? (void*)grad_bf16(m, offset) : (void*)grad_f32(m, offset);
    const float* s_dy = &fp8_act_scale(m, tensor, layer, true)->scale_inv;
    fp8_quantize_grad(m, B, tensor, layer, dy, out);
    matmul_fp8(m->gemm, m->stream, dw, f->dy_t, f->grad_type, s_dy, fp8_input_t(m, tensor, layer), CUDA_R_8F_E4M3,
               &fp8_act_scale(m, tensor, layer, false)->scale_inv, out, in, N, false, !bf16_out, accumulate ? 1.0f : 0.0f);
    grad_written(m, offset, (size_t)out * in);
    matmul_fp8(m->gemm, m->stream, dx, f->dy, f->grad_type, s_dy, f->w_t + fp8_weight_at(m, tensor, layer),
               CUDA_R_8F_E4M3, &fp8_weight_scale(m, tensor, layer)->scale_inv, N, in, out, false);
}

// ---- model: its memory, buffers and life ----

static MemoryParts memory_parts(const Model* m) {
    const ParamLayout* p = &m->layout;
    size_t f32_n = f32_block_count(p, m->grad_bf16); // the rest are bf16
    size_t moments = 2 * optimizer_moment_bytes(&m->optim);
    bool host = m->optim.cfg.offload;
    MemoryParts parts = {f32_block_count(p, bf16_weight_range(m)) * 4 + bf16_weight_bytes(m), host ? 0 : moments,
                         f32_n * 4 + (p->total - f32_n) * 2, m->acts_bytes, GEMM_WORKSPACE_BYTES, fp8_bytes(m),
                         host ? moments : 0};
    return parts;
}
static size_t memory_total(const MemoryParts* p) {
    return p->weights + p->moments + p->gradients + p->activations + p->workspace + p->fp8;
}
// What a run takes of the GPU beyond the CUDA context and its buffers (memory_parts): the kernels' code,
// loaded at first launch, cuBLASLt's and the CUDA graph's own memory, allocation rounding. At their peak,
// runs on an H100 took 0.84 to 1.31 GiB more than their parts, the context's 0.5 GiB included; the 3B at
// B=8, T=1024, 78.66 GiB of parts, passed a check without this and ran out of memory (2026-12-07).
#define RUN_OVERHEAD_BYTES ((size_t)1 << 30)
// What a run needs free on its GPU: its buffers and that overhead (check_fits, and --dry_run's verdicts).
static size_t memory_needed(const MemoryParts* p) { return memory_total(p) + RUN_OVERHEAD_BYTES; }
static void memory_print(FILE* f, const MemoryParts* p) {
    const double G = 1073741824.0;
    fprintf(f, "%.2f GiB: weights %.2f, AdamW m and v %.2f, gradients %.2f, activations %.2f, workspace %.2f",
            memory_total(p) / G, p->weights / G, p->moments / G, p->gradients / G, p->activations / G,
            p->workspace / G);
    if (p->fp8) fprintf(f, ", fp8 copies %.2f", p->fp8 / G);
    if (p->host) fprintf(f, "; in pinned host memory: AdamW m and v %.2f GiB", p->host / G);
}

// [recompute] The activations' bytes of this model and batch at --recompute `level`, with flash
// attention or (flash false) unfused.
static size_t acts_bytes_at(const Model* m, int level, bool flash) {
    Activations unused;
    return act_layout(&unused, NULL, &m->cfg, m->B, m->T, m->head_rows, m->grad_accum, m->sms, flash,
                      m->sw.fused_rmsnorm, level, m->doc_bos >= 0);
}
// [unfused attention] What --flash_attention 1 would free: the T x T scores and probabilities (0 with
// flash attention). At long T these outgrow everything else (at T = 131072 one layer's fp32 scores
// of the 1B's 32 heads take 2 TiB): the memory check names it first.
static size_t unfused_attention_bytes(const Model* m) {
    return m->sw.flash_attention ? 0 : m->acts_bytes - acts_bytes_at(m, m->recompute, true);
}
// [chunked classifier] One chunk's logits: head_rows x V bf16.
static size_t logits_bytes(const Model* m) { return (size_t)m->head_rows * m->cfg.vocab_size * sizeof(bf16); }

// The flags that would shrink this model's memory `parts` (llama3.h fit_advice), into advice[n].
static void model_fit_advice(const Model* m, const MemoryParts* parts, char* advice, size_t n) {
    const double G = 1073741824.0;
    const ParamLayout* p = &m->layout;
    FitAdvice f = {.moments = m->optim.cfg.moments, .recompute = m->recompute, .fp8 = m->fp8 != NULL,
                   .weights = m->optim.cfg.weights, .masters_gib = (p->matmul_end - p->matmul_begin) * 4 / G,
                   .offload = m->optim.cfg.offload, .moments_gib = parts->moments / G,
                   .acts_blocks_gib = acts_bytes_at(m, RECOMPUTE_BLOCKS, m->sw.flash_attention) / G,
                   .fp8_gib = parts->fp8 / G, .unfused_gib = unfused_attention_bytes(m) / G,
                   .head_rows = m->head_rows, .logits_gib = logits_bytes(m) / G};
    fit_advice(&f, advice, n);
}

// Stops when the model's buffers do not fit in the GPU's free memory, naming the parts and the
// flags that shrink the largest of them ([offload] or the host's memory the moments).
static void check_fits(const Model* m) {
    MemoryParts parts = memory_parts(m);
    char err[L3_ERR_LEN];
    if (offload_check(parts.host, (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE), err)) {
        fprintf(stderr, "error: %s\n", err);
        exit(EXIT_FAILURE);
    }
    size_t free_b, total_b;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (memory_needed(&parts) <= free_b) return;
    fprintf(stderr, "out of GPU memory: the model needs ");
    memory_print(stderr, &parts);
    char advice[1024];
    model_fit_advice(m, &parts, advice, sizeof(advice));
    fprintf(stderr, ", and %.2f GiB for code and libraries; %.2f GiB free. Smaller: %s\n",
            RUN_OVERHEAD_BYTES / 1073741824.0, free_b / 1073741824.0, advice);
    exit(EXIT_FAILURE);
}

// The (T, HD/2) cos and sin tables of RoPE for the run's T (not the model's max_seq_len), computed
// on the host once.
static void rope_upload(Model* m) {
    size_t half = m->cfg.n_embd / m->cfg.n_head / 2, n = (size_t)m->T * half;
    float* table = (float*)malloc(sizeof(float) * 2 * n);
    rope_table(&m->cfg, m->T, table, table + n);
    m->rope_cos = (float*)device_alloc(sizeof(float) * 2 * n, "rope table");
    m->rope_sin = m->rope_cos + n;
    CUDA_CHECK(cudaMemcpy(m->rope_cos, table, sizeof(float) * 2 * n, cudaMemcpyHostToDevice));
    free(table);
}

// Buffers of the token sort [sparse rows] for up to n tokens: sorted ids and positions, the
// 0..n-1 values, and CUB's scratch.
static void sorter_create(TokenSorter* ts, size_t n, int vocab_size) {
    ts->sorted_tokens = (int*)device_alloc(n * 3 * sizeof(int), "token sort");
    ts->sorted_positions = ts->sorted_tokens + n;
    int* iota = ts->sorted_tokens + 2 * n;
    int* iota_host = (int*)malloc(n * sizeof(int));
    for (size_t i = 0; i < n; i++) iota_host[i] = (int)i;
    CUDA_CHECK(cudaMemcpy(iota, iota_host, n * sizeof(int), cudaMemcpyHostToDevice));
    free(iota_host);
    ts->iota = iota;
    for (ts->end_bit = 1; (1 << ts->end_bit) < vocab_size; ts->end_bit++) {}
    ts->temp = NULL;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, ts->temp_bytes, ts->sorted_tokens, ts->sorted_tokens, ts->iota,
                                               ts->sorted_positions, (int)n, 0, ts->end_bit));
    ts->temp = device_alloc(ts->temp_bytes, "token sort scratch");
}

// The model's device buffers: weights, gradients, AdamW state, bf16 weights, activations, tokens
// and the step's small state.
static void model_alloc(Model* m) {
    size_t P = m->layout.total, n_step = (size_t)m->grad_accum * m->B * m->T;
    m->params = (float*)device_alloc(f32_block_count(&m->layout, bf16_weight_range(m)) * 4, "fp32 weights");
    size_t grads_f32_n = f32_block_count(&m->layout, m->grad_bf16);
    m->grads = (float*)device_alloc(grads_f32_n * 4, "fp32 gradients");
    if (grads_f32_n < P) m->grads_bf16 = (bf16*)device_alloc((P - grads_f32_n) * 2, "bf16 gradients");
    optimizer_alloc(&m->optim);
    size_t bf16_bytes = bf16_weight_bytes(m);
    if (m->sw.shadow_weights) m->shadow = (bf16*)device_alloc(bf16_bytes, "bf16 shadow weights");
    else m->cast_weight = (bf16*)device_alloc(bf16_bytes, "bf16 weight cast buffer");
    if (!m->sw.metadata_by_value) m->shape_in_memory = (HeadShape*)device_alloc(sizeof(HeadShape), "shape metadata");
    m->acts_block = device_alloc(m->acts_bytes, "activations");
    act_layout(&m->acts, (unsigned char*)m->acts_block, &m->cfg, m->B, m->T, m->head_rows, m->grad_accum, m->sms,
               m->sw.flash_attention, m->sw.fused_rmsnorm, m->recompute, m->doc_bos >= 0);
    m->tokens = (int*)device_alloc(2 * n_step * sizeof(int), "tokens");
    CUDA_CHECK(cudaMallocHost(&m->tokens_host, 2 * 2 * n_step * sizeof(int32_t)));
    CUDA_CHECK(cudaMallocHost(&m->stats_host, 2 * sizeof(StepStats)));
    m->stats = (StepStats*)device_alloc(sizeof(StepStats), "step statistics");
    m->sumsq = (float*)device_alloc(sumsq_count(m) * sizeof(float), "gradient norm partial sums");
    if (m->fp8) fp8_alloc(m);
}

// [streams] The step's own stream outranks the optimizer's: when both have blocks ready, the SMs
// take the backward's first and AdamW (with its ~35 GB of streaming) fills what is left.
static void model_streams(Model* m) {
    int prio_low, prio_high;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&prio_low, &prio_high));
    CUDA_CHECK(cudaStreamCreateWithPriority(&m->stream, cudaStreamDefault, prio_high));
    schedule_create(&m->step, prio_low);
}

// [data parallel] The buffers of the step's collectives: the norm's summed partial sums and [sparse
// rows] the union of the ranks' tokens with its gradient rows.
static void comm_alloc(Model* m) {
    Comm* c = m->comm;
    size_t n_all = (size_t)c->world * m->grad_accum * m->B * m->T;
    c->sumsq_total = (float*)device_alloc(sumsq_count(m) * sizeof(float), "gradient norm sums of the ranks");
    c->count = (int*)device_alloc(sizeof(int), "a count of the ranks");
    if (!m->sw.sparse_embedding) return;
    sorter_create(&c->union_sorter, n_all, m->cfg.vocab_size);
    c->all_tokens = (int*)device_alloc(n_all * sizeof(int), "every rank's tokens");
    c->union_grads = (float*)device_alloc(n_all * m->cfg.n_embd * sizeof(float), "the union's wte gradient rows");
}

// A fresh optimizer on the weights as they are: AdamW's m, v and step counter, every gradient
// (wte's rows are kept zero from here on [sparse rows]), the norm's partial sums (slots a launch
// leaves unused stay 0), the statistics and the pending state zeroed, and the CUDA graph dropped
// (the next step runs eagerly and the one after is captured anew). model_create ends with it; the
// test calls it between its runs.
static void model_reset_training(Model* m) {
    CUDA_CHECK(cudaDeviceSynchronize());
    schedule_drop_graph(&m->step);
    size_t P = m->layout.total, grads_f32_n = f32_block_count(&m->layout, m->grad_bf16);
    optimizer_reset(&m->optim);
    CUDA_CHECK(cudaMemset(m->grads, 0, grads_f32_n * 4));
    if (m->grads_bf16) CUDA_CHECK(cudaMemset(m->grads_bf16, 0, (P - grads_f32_n) * 2));
    CUDA_CHECK(cudaMemset(m->sumsq, 0, sumsq_count(m) * sizeof(float)));
    CUDA_CHECK(cudaMemset(m->stats, 0, sizeof(StepStats)));
    m->step.pending.updates = false, m->step.pending.save_copy = NULL;
    m->step.steps_run = 0;
}

// What a model of config `cfg` for the run `run` (llama3.h RunConfig: its micro-batch and
// micro-steps, recompute, the classifier's chunks, FP8, optimizer and switches) on this rank of
// `comm` (NULL: one rank) is, decided on the host: its layout and table, the step's plan, the
// activations' layout (for a GPU of `sms` multiprocessors), and so its memory (memory_parts). No
// buffer yet: model_create allocates them; --dry_run prints the memory of a model sized alone
// (model_host_free).
static void model_size(Model* m, const Llama3Config* cfg, const RunConfig* run, Comm* comm, int sms) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg, m->sw = switches_for_model(run->sw, cfg);
    m->B = run->B, m->T = run->T, m->grad_accum = run->grad_accum, m->recompute = run->recompute;
    m->doc_bos = run->doc_mask ? run->bos : -1;
    m->head_rows = classifier_rows((long long)m->B * m->T, cfg->vocab_size, run->classifier_chunk);
    m->comm = comm, m->sms = sms;
    if (run->fp8) fp8_start(m, run->fp8_grads);
    const Switches* sw = &m->sw; // (as they apply to this model)
    m->layout = param_layout(cfg);
    m->tab = tensor_table(cfg);
    m->grad_bf16 = bf16_grad_range(m);
    if (comm) comm->zero = zero_layout(&m->layout, comm->rank, comm->world, sw->sparse_embedding);
    m->optim.cfg = *run->opt, m->optim.sms = sms, m->optim.vec4 = sw->vector_adam != 0;
    m->optim.count = comm ? comm->zero.state_total : m->layout.total;
    char err[L3_ERR_LEN];
    if (kernel_limits_check(cfg, sw->flash_attention, "model", err)) { // test_llama3 comes here without train_args_check
        fprintf(stderr, "%s\n", err);
        exit(EXIT_FAILURE);
    }
    StepPlan* plan = (StepPlan*)malloc(sizeof(StepPlan));
    *plan = step_plan(sw, &m->optim.cfg, cfg->n_layer, comm ? comm->world : 1);
    m->step.plan = plan;
    m->acts_bytes = act_layout(&m->acts, NULL, cfg, m->B, m->T, m->head_rows, m->grad_accum, m->sms,
                               sw->flash_attention, sw->fused_rmsnorm, m->recompute, m->doc_bos >= 0);
}
// What model_size allocated on the host.
static void model_host_free(Model* m) {
    free(m->fp8);
    free((void*)m->step.plan);
    tensor_table_free(&m->tab);
}

// Everything of a model (model_size) on this GPU, its weights still to be set (model_init_random or
// model_load).
static HeadShape head_shape(const Model* m, int B); // in the forward section
static void model_create(Model* m, const Llama3Config* cfg, const RunConfig* run, Comm* comm) {
    if (run->fp8) fp8_gpu_check();
    int device, sms;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    model_size(m, cfg, run, comm, sms);
    check_fits(m);
    model_alloc(m);
    model_streams(m);
    rope_upload(m);
    sorter_create(&m->sorter, (size_t)m->grad_accum * m->B * m->T, cfg->vocab_size);
    if (comm) comm_alloc(m);
    m->gemm = (Gemm*)malloc(sizeof(Gemm));
    gemm_create(m->gemm);
    flash_uses_wgmma(head_shape(m, m->B)); // the launcher's choice, here: its probe's one sync before any capture
    model_reset_training(m);
}

static void model_free(Model* m) {
    gemm_destroy(m->gemm);
    if (m->fp8) {
        void* fp8_device[] = {m->fp8->w, m->fp8->x, m->fp8->x_t, m->fp8->dy, m->fp8->w_scale};
        for (void* p : fp8_device) CUDA_CHECK(cudaFree(p));
    }
    optimizer_free(&m->optim);
    void* device[] = {m->params,     m->grads,      m->grads_bf16, m->shadow,        m->cast_weight,
                      m->shape_in_memory, m->acts_block, m->tokens,   m->stats,     m->sumsq,
                      m->rope_cos,   m->sorter.sorted_tokens, m->sorter.temp};
    for (size_t i = 0; i < sizeof(device) / sizeof(device[0]); i++) CUDA_CHECK(cudaFree(device[i]));
    CUDA_CHECK(cudaFreeHost(m->tokens_host));
    CUDA_CHECK(cudaFreeHost(m->stats_host));
    CUDA_CHECK(cudaStreamDestroy(m->stream));
    schedule_free(&m->step);
    free(m->gemm);
    model_host_free(m);
    if (!m->comm) return;
    void* comm_device[] = {m->comm->sumsq_total, m->comm->count, m->comm->all_tokens, m->comm->union_grads,
                           m->comm->union_sorter.sorted_tokens, m->comm->union_sorter.temp};
    for (size_t i = 0; i < sizeof(comm_device) / sizeof(comm_device[0]); i++) CUDA_CHECK(cudaFree(comm_device[i]));
}

// [bf16 weights] The matmul weights' bf16 copy, which is then the only one (the shadow's range from
// matmul_begin).
static bf16* bf16_weights_ptr(const Model* m) { return m->shadow + (m->layout.matmul_begin - m->layout.shadow_begin); }

// The bf16 shadow of the matmul weights, made once after the masters are set; from then on the
// Adam kernel rewrites it in the same pass as the masters [shadow weights]. [bf16 weights] Only a
// tied wte's: the matmul weights were set in bf16.
static void model_sync_shadow(Model* m) {
    if (!m->sw.shadow_weights) return;
    const ParamLayout* p = &m->layout;
    size_t end = bf16_weights(m) ? p->matmul_begin : p->matmul_end;
    cast_to_bf16(m->shadow, param_f32(m, p->shadow_begin), end - p->shadow_begin, m->stream);
    if (m->fp8) fp8_quantize_weights(m, m->stream);
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
}

// Random init: N(0, 0.02) for wte and every matrix, 1 for the norm weights; [bf16 weights] the matmul
// weights drawn from the same elements of the stream, rounded to bf16.
static void model_init_random(Model* m, uint64_t seed) {
    ParamLayout* p = &m->layout;
    if (bf16_weights(m)) {
        init_params(m->params, p->matmul_begin, 0.0f, 0.02f, seed, m->stream);
        size_t n = p->matmul_end - p->matmul_begin;
        init_params(bf16_weights_ptr(m), n, 0.0f, 0.02f, seed, m->stream, p->matmul_begin);
    } else {
        init_params(m->params, p->norm_begin, 0.0f, 0.02f, seed, m->stream);
    }
    init_params(param_f32(m, p->norm_begin), p->total - p->norm_begin, 1.0f, 0.0f, seed, m->stream);
    model_sync_shadow(m);
}

// Where a model file's fp32 weights go, chunk by chunk: the fp32 block, and [bf16 weights] the
// matmul weights to their bf16 copy, rounded to nearest even on the host (through `staging`).
typedef struct {
    const Model* m;
    uint16_t* staging; // pinned, a chunk's bf16 (NULL without bf16 weights)
} DeviceSink;
static void device_sink(void* ctx, size_t offset, const float* src, size_t count) {
    const DeviceSink* d = (const DeviceSink*)ctx;
    const ParamLayout* p = &d->m->layout;
    size_t end = offset + count, cut[4] = {offset, p->matmul_begin, p->matmul_end, end};
    for (int k = 1; k < 3; k++) cut[k] = cut[k] < offset ? offset : cut[k] > end ? end : cut[k];
    for (int k = 0; k < 3; k++) { // the chunk before, inside and after the matmul weights
        size_t a = cut[k], n = cut[k + 1] - cut[k];
        if (n == 0) continue;
        const float* from = src + (a - offset);
        if (k == 1 && d->staging) {
            for (size_t i = 0; i < n; i++) d->staging[i] = bf16_nearest_even(from[i]);
            bf16* to = bf16_weights_ptr(d->m) + (a - p->matmul_begin);
            CUDA_CHECK(cudaMemcpy(to, d->staging, n * sizeof(bf16), cudaMemcpyHostToDevice));
        } else {
            CUDA_CHECK(cudaMemcpy(param_f32(d->m, a), from, n * sizeof(float), cudaMemcpyHostToDevice));
        }
    }
}

static int model_load(Model* m, const char* path, ModelFileFormat fmt, char* err) {
    const size_t chunk = 16 << 20; // floats per read
    float* buf;
    CUDA_CHECK(cudaMallocHost(&buf, chunk * sizeof(float)));
    DeviceSink sink = {m, NULL};
    if (bf16_weights(m)) CUDA_CHECK(cudaMallocHost(&sink.staging, chunk * sizeof(uint16_t)));
    int rc = model_file_load(path, &m->cfg, fmt, buf, chunk, device_sink, &sink, err);
    CUDA_CHECK(cudaFreeHost(buf));
    if (sink.staging) CUDA_CHECK(cudaFreeHost(sink.staging));
    if (rc == 0) model_sync_shadow(m);
    return rc;
}

// ---- forward ----

static HeadShape head_shape(const Model* m, int B) {
    HeadShape sh = {B, m->T, m->cfg.n_head, m->cfg.n_kv_head, m->cfg.n_embd / m->cfg.n_head};
    return sh;
}
// [document mask] Each position's document as the forward's doc_spans wrote it for its inputs, which
// every attention forward and backward of the pass reads (the recomputed ones too); NULL pointers
// without --doc_mask 1.
static DocSpans doc_mask_spans(const Model* m) {
    DocSpans d = {NULL, NULL};
    if (m->doc_bos >= 0) d.start = m->acts.doc_start, d.end = m->acts.doc_end;
    return d;
}

// y (N, out) = x (N, in) @ W^T: a linear layer's forward, bf16 (W the layer's bf16 weight), or [fp8]
// for a block linear in FP8.
static void linear_forward(const Model* m, int B, bf16* y, const bf16* x, int tensor, int layer, int out, int in) {
    if (fp8_linear(m, tensor, layer)) return linear_forward_fp8(m, B, y, x, tensor, layer, out, in);
    matmul(m->gemm, m->stream, y, x, weight_bf16(m, tensor, layer), B * m->T, out, in, false, true, false);
}

// The unfused attention's GEMMs, batched over (batch, kv head): the G query heads that share a kv
// head are G*T rows of one matrix, so GQA repeats no K or V. Per batch entry q, o, dq and dO are
// (G*T, HD), k, v, dk and dv (T, HD), scores, P, dP and dS (G*T, T).
typedef struct {
    int G, T, HD, batch;
    long long rows, keys, probs; // the strides of the (G*T, HD), (T, HD) and (G*T, T) matrices
} AttnGemm;
static AttnGemm attn_gemm(const Model* m, int B) {
    HeadShape sh = head_shape(m, B);
    int G = sh.NH / sh.KVH;
    AttnGemm g = {G, sh.T, sh.HD, sh.B * sh.KVH, (long long)G * sh.T * sh.HD, (long long)sh.T * sh.HD,
                  (long long)G * sh.T * sh.T};
    return g;
}
// (G*T, T) fp32 = alpha * rows (G*T, HD) @ keys^T (T, HD): scores = q k^T / sqrt(HD), dP = dO v^T.
static void attn_scores_gemm(const Model* m, int B, float* out, const bf16* rows, const bf16* keys, float alpha) {
    AttnGemm g = attn_gemm(m, B);
    matmul(m->gemm, m->stream, out, rows, keys, g.G * g.T, g.T, g.HD, false, true, true, alpha, 0.0f, g.batch, g.rows,
           g.keys, g.probs);
}
// (G*T, HD) = alpha * P (G*T, T) @ x (T, HD), bf16: o = P v, dq = dS k / sqrt(HD).
static void attn_mix_gemm(const Model* m, int B, bf16* out, const bf16* probs, const bf16* x, float alpha) {
    AttnGemm g = attn_gemm(m, B);
    matmul(m->gemm, m->stream, out, probs, x, g.G * g.T, g.HD, g.T, false, false, false, alpha, 0.0f, g.batch, g.probs,
           g.keys, g.rows);
}
// (T, HD) = alpha * P^T (T, G*T) @ y (G*T, HD), bf16, summing over the G query heads: dv = P^T dO,
// dk = dS^T q / sqrt(HD).
static void attn_mix_t_gemm(const Model* m, int B, bf16* out, const bf16* probs, const bf16* y, float alpha) {
    AttnGemm g = attn_gemm(m, B);
    matmul(m->gemm, m->stream, out, probs, y, g.T, g.HD, g.G * g.T, true, false, false, alpha, 0.0f, g.batch, g.probs,
           g.rows, g.keys);
}

// Causal GQA attention of one layer on head-major q, k, v into token-major att_y[l]: flash
// attention, or (--flash_attention 0) unfused: scores = q k^T / sqrt(HD) (fp32), P = softmax
// (bf16), o = P v. [document mask] Within each query's document with --doc_mask 1.
static void attention_forward(const Model* m, int B, int l) {
    HeadShape sh = head_shape(m, B);
    size_t N = (size_t)sh.B * sh.T, copy = block_copy(m, l);
    bf16* q = m->acts.qkv_heads + copy * N * qkv_dim(&m->cfg);
    bf16 *k = q + N * m->cfg.n_embd, *v = k + N * sh.KVH * sh.HD;
    bf16* att_y = m->acts.att_y + copy * N * m->cfg.n_embd;
    DocSpans docs = doc_mask_spans(m);
    if (m->sw.flash_attention) {
        flash_attention_forward(att_y, m->acts.lse + copy * sh.B * sh.NH * sh.T, q, k, v, sh, docs, m->stream);
        return;
    }
    bf16* probs = m->acts.probs + copy * sh.B * sh.NH * sh.T * sh.T;
    attn_scores_gemm(m, B, m->acts.scores, q, k, 1.0f / sqrtf((float)sh.HD));
    attention_softmax(false, probs, m->acts.scores, sh, docs.start, m->stream);
    attn_mix_gemm(m, B, m->acts.heads_o, probs, v, 1.0f);
    permute_heads(false, att_y, m->acts.heads_o, sh, m->stream, m->shape_in_memory);
}

// The --fused_rmsnorm 0 ops' scratch buffers.
static RmsScratch rms_scratch(const Model* m, int B) {
    size_t NC = (size_t)B * m->T * m->cfg.n_embd, N = (size_t)B * m->T;
    RmsScratch s = {{m->acts.rms_ops, m->acts.rms_ops + NC, m->acts.rms_ops + 2 * NC},
                    {m->acts.rms_rows, m->acts.rms_rows + N}};
    return s;
}
// One RMSNorm, with the residual add first when branch != NULL: the fused kernel, or (ablation,
// --fused_rmsnorm 0) the separate ops autograd would run.
static void norm_forward(const Model* m, int B, int tensor, int layer, float* resid_out, bf16* normed, float* rstd,
                         const float* resid_in, const bf16* branch) {
    int N = B * m->T, C = m->cfg.n_embd;
    const float* weight = param_f32(m, param_offset(m, tensor, layer));
    if (m->sw.fused_rmsnorm) {
        rmsnorm_forward(resid_out, normed, rstd, resid_in, branch, weight, N, C, m->cfg.norm_eps, m->stream,
                        fp8_norm_amax(m, tensor, layer, false));
    } else {
        RmsScratch s = rms_scratch(m, B);
        rmsnorm_forward_ops(resid_out, normed, rstd, resid_in, branch, weight, N, C, m->cfg.norm_eps, &s, m->stream);
    }
}

// One transformer block. Its first RMSNorm also adds the previous block's MLP output into the
// residual stream (resid[l] = h[l-1] + branch) [fused RMSNorm]. [recompute] again (--recompute 2,
// just before the block's backward): from the saved resid[l], whose RMSNorm gives the same bits as
// the fused add's, up to act; the down projection's output (the next block's input) is not needed,
// [fp8] but its input's transpose is (down's weight gradient reads it: one layer's is kept).
static void block_forward(const Model* m, int B, int l, bool again) {
    const Llama3Config* c = &m->cfg;
    int N = B * m->T, C = c->n_embd, F = c->ffn_hidden, QKV = qkv_dim(c);
    size_t NC = (size_t)N * C, copy = block_copy(m, l);
    float* resid = m->acts.resid + l * NC;
    float* h = m->acts.h + copy * NC;
    bf16* normed_attn = m->acts.normed_attn + norms_copy(m, l) * NC;
    bf16* branch = m->acts.branch;
    float* rstd_attn = m->acts.rstd_attn + copy * N;
    if (again || l == 0) norm_forward(m, B, P_ATTN_NORM, l, NULL, normed_attn, rstd_attn, resid, NULL);
    else
        norm_forward(m, B, P_ATTN_NORM, l, resid, normed_attn, rstd_attn, m->acts.h + block_copy(m, l - 1) * NC, branch);
    bf16* qkv = m->acts.qkv;
    linear_forward(m, B, qkv, normed_attn, P_QKV, l, QKV, C);
    bf16* q = m->acts.qkv_heads + copy * N * QKV;
    rope_permute(false, qkv, q, q + NC, q + NC + (size_t)N * (QKV - C) / 2, m->rope_cos, m->rope_sin, head_shape(m, B),
                 m->stream, m->shape_in_memory);
    attention_forward(m, B, l);
    linear_forward(m, B, branch, m->acts.att_y + copy * NC, P_ATTN_OUT, l, C, C);
    bf16* normed_ffn = m->acts.normed_ffn + norms_copy(m, l) * NC;
    norm_forward(m, B, P_FFN_NORM, l, h, normed_ffn, m->acts.rstd_ffn + copy * N, resid, branch);
    bf16* gate_up = m->acts.gate_up + copy * N * 2 * F;
    linear_forward(m, B, gate_up, normed_ffn, P_GATE_UP, l, 2 * F, C);
    bf16* act = m->acts.act + norms_copy(m, l) * N * F;
    swiglu(false, act, NULL, gate_up, N, F, m->stream, fp8_producer_amax(m, P_DOWN, l, false));
    if (!again) linear_forward(m, B, branch, act, P_DOWN, l, C, F);
    else if (fp8_linear(m, P_DOWN, l)) fp8_quantize_input(m, B, P_DOWN, l, act, F); // [fp8] its transpose, for dW
}

// [deferred AdamW] With after_deferred (the previous step left its deferred groups' AdamW to this
// one), the forward reads update group g only once that update of it is done.
static void wait_for_update(const Model* m, int g, bool after_deferred) {
    if (after_deferred && group_deferred(m, g))
        CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->step.group_updated[g]));
}

// inputs: B rows of T token ids on the device (B at most the model's: sampling runs one row).
// Leaves the final norm's output (B*T, C) in acts.normed_final: the classifier's input. [document
// mask] With --doc_mask 1 it first finds every position's document in the inputs, for the pass's
// attention (training, the val loss, the eval and sampling alike: a row is split into documents
// wherever it holds BOS).
static void forward(const Model* m, int B, const int* inputs, bool after_deferred) {
    NVTX_PUSH("forward");
    const Llama3Config* c = &m->cfg;
    int N = B * m->T, C = c->n_embd, L = c->n_layer;
    size_t NC = (size_t)N * C;
    fp8_reset_scales(m);
    if (m->doc_bos >= 0) doc_spans(m->acts.doc_start, m->acts.doc_end, inputs, B, m->T, m->doc_bos, m->stream);
    wait_for_update(m, 0, after_deferred);
    embedding_forward(m->acts.resid, inputs, param_f32(m, m->layout.offset[P_WTE]), N, C, m->stream);
    for (int l = 0; l < L; l++) {
        wait_for_update(m, 1 + l, after_deferred);
        block_forward(m, B, l, false);
    }
    wait_for_update(m, head_group(m), after_deferred);
    norm_forward(m, B, P_FINAL_NORM, 0, m->acts.resid + L * NC, m->acts.normed_final, m->acts.rstd_final,
                 m->acts.h + block_copy(m, L - 1) * NC, m->acts.branch);
    NVTX_POP();
}

// Weight gradient of a linear layer y = x W^T over `rows` rows: dW (out, in) (+)= dy^T x, bf16 [bf16
// grads] or fp32. The first micro-step writes (beta 0), later ones accumulate: no zeroing of grads
// needed. The caller tells the test seam once the gradient is whole (grad_written).
static void weight_grad(const Model* m, int rows, int tensor, int layer, const bf16* dy, const bf16* x, int out, int in,
                        bool accumulate) {
    size_t offset = param_offset(m, tensor, layer);
    bool bf16_out = grad_is_bf16(m, offset);
    void* dw = bf16_out ? (void*)grad_bf16(m, offset) : (void*)grad_f32(m, offset);
    matmul(m->gemm, m->stream, dw, dy, x, out, in, rows, true, false, !bf16_out, 1.0f, accumulate ? 1.0f : 0.0f);
}
// Input gradient of a linear layer over `rows` rows: dx (rows, in) = dy (rows, out) @ W (out, in), bf16.
static void input_grad(const Model* m, int rows, bf16* dx, const bf16* dy, const bf16* w, int out, int in) {
    matmul(m->gemm, m->stream, dx, dy, w, rows, in, out, false, false, false);
}

// ---- classifier: the lm_head, the loss and the head's backward, chunk by chunk ----
// [chunked classifier] The logits of all N = B*T rows would take N x V bf16 (16.8 GB at B=1, T=65536
// on LLaMA 3's vocabulary), so the head takes head_rows rows at a time (llama3.h classifier_rows: all
// N while they take at most 4 GiB, as at every bench config). Each chunk: its logits (one GEMM), the
// losses and dlogits over them in place (cross_entropy), and when training the head's two backward
// GEMMs on those dlogits, dW (+)= dlogits^T x and dx = dlogits W, before the next chunk's logits
// overwrite them. So the head's backward runs here, fused with the loss, and backward() starts from
// its dx. Rows are independent in all four; only dW sums over them, chunk after chunk.

// The logits of `rows` rows of normed_final from row `first` into acts.logits, with the head's bf16
// weight w: bf16 (rows, V).
static void head_logits(const Model* m, const bf16* w, int first, int rows) {
    int C = m->cfg.n_embd;
    matmul(m->gemm, m->stream, m->acts.logits, m->acts.normed_final + (size_t)first * C, w, rows, m->cfg.vocab_size,
           C, false, true, false);
}

// Micro-step `micro`'s per-token losses (acts.losses from micro * N), chunk by chunk, dlogits scaled for
// the mean over the whole step's tokens; with `grads` also the head's gradients: its weight's (the
// first chunk writes unless `accumulate`, the later ones add) and the final norm's output gradient
// into acts.branch (reads the head's shadow: before its AdamW). The chunks depend on B and T only,
// so a captured step replays them.
static void classifier(const Model* m, int B, const int* targets, int micro, bool grads, bool accumulate) {
    int N = B * m->T, C = m->cfg.n_embd, V = m->cfg.vocab_size, head = m->layout.head;
    int rows = m->head_rows < N ? m->head_rows : N; // (sampling's forward of one row: T rows)
    const bf16* w = weight_bf16(m, head, 0);
    for (int first = 0; first < N; first += rows) {
        int n = N - first < rows ? N - first : rows;
        head_logits(m, w, first, n);
        cross_entropy(m->acts.logits, m->acts.losses + (size_t)micro * N + first, targets + first, n, V,
                      1.0f / ((float)N * m->grad_accum), m->stream);
        if (!grads) continue;
        const bf16* x = m->acts.normed_final + (size_t)first * C;
        weight_grad(m, n, head, 0, m->acts.logits, x, V, C, accumulate || first > 0);
        input_grad(m, n, m->acts.branch + (size_t)first * C, m->acts.logits, w, V, C);
    }
    // [tied embeddings] a tied wte's gradient is whole only once the embedding backward has added its rows
    if (grads && head != P_WTE) grad_written(m, m->layout.offset[head], m->layout.size[head]);
}

// ---- backward ----

// Both gradients of a block linear y = x W^T from dy: the weight's (written, or accumulated onto the
// earlier micro-steps') and dx.
static void linear_backward(const Model* m, int B, int tensor, int layer, bf16* dx, const bf16* dy, const bf16* x,
                            int out, int in, bool accumulate) {
    if (fp8_linear(m, tensor, layer)) return linear_backward_fp8(m, B, tensor, layer, dx, dy, out, in, accumulate);
    weight_grad(m, B * m->T, tensor, layer, dy, x, out, in, accumulate);
    grad_written(m, param_offset(m, tensor, layer), (size_t)out * in);
    input_grad(m, B * m->T, dx, dy, weight_bf16(m, tensor, layer), out, in);
}

// Backward of one RMSNorm: dresid (+)= its input gradient, dresid_bf16 = the same rounded, and
// the weight gradient written or accumulated.
static void norm_backward(const Model* m, int B, int tensor, int layer, const float* x, const float* rstd,
                          bool accumulate_dx, bool accumulate) {
    int N = B * m->T, C = m->cfg.n_embd;
    float *dw = grad_f32(m, param_offset(m, tensor, layer)), *weight = param_f32(m, param_offset(m, tensor, layer));
    if (m->sw.fused_rmsnorm) {
        rmsnorm_backward(m->acts.dresid, m->acts.dresid_bf16, dw, m->acts.dw_partial,
                         m->acts.branch, x, weight, rstd, N, C, accumulate_dx, accumulate, m->sms, m->stream,
                         fp8_norm_amax(m, tensor, layer, true));
    } else {
        RmsScratch s = rms_scratch(m, B);
        rmsnorm_backward_ops(m->acts.dresid, m->acts.dresid_bf16, dw, m->acts.branch, x, weight,
                             rstd, N, C, accumulate_dx, accumulate, &s, m->stream);
    }
    grad_written(m, param_offset(m, tensor, layer), C);
}

// Attention backward from dy (token-major gradient of att_y[l]) to dq, dk, dv (head-major, in
// acts.dheads). Unfused: dO = dy head-major, dV = P^T dO, dP = dO V^T, dS = softmax'(P, dP) over P,
// dQ = dS K / sqrt(HD), dK = dS^T Q / sqrt(HD); the G query heads of a kv head are G*T rows of one
// GEMM, so dK and dV sum over them as K = G*T. [document mask] Within the forward's documents.
static void attention_backward(const Model* m, int B, int l, bf16* dy) {
    HeadShape sh = head_shape(m, B);
    size_t N = (size_t)sh.B * sh.T, C = m->cfg.n_embd, KVD = (size_t)sh.KVH * sh.HD, copy = block_copy(m, l);
    bf16* q = m->acts.qkv_heads + copy * N * qkv_dim(&m->cfg);
    bf16 *k = q + N * C, *v = k + N * KVD;
    bf16 *dq = m->acts.dheads, *dk = dq + N * C, *dv = dk + N * KVD;
    DocSpans docs = doc_mask_spans(m);
    if (m->sw.flash_attention) {
        flash_attention_backward(dq, dk, dv, m->acts.dsum, dy, m->acts.att_y + copy * N * C, q, k, v,
                                 m->acts.lse + copy * sh.B * sh.NH * sh.T, sh, docs, m->stream);
        return;
    }
    bf16 *probs = m->acts.probs + copy * sh.B * sh.NH * sh.T * sh.T, *dout = m->acts.heads_o;
    float scale = 1.0f / sqrtf((float)sh.HD);
    permute_heads(true, dy, dout, sh, m->stream, m->shape_in_memory);
    attn_mix_t_gemm(m, B, dv, probs, dout, 1.0f);
    attn_scores_gemm(m, B, m->acts.scores, dout, v, 1.0f); // dP
    attention_softmax(true, probs, m->acts.scores, sh, docs.start, m->stream); // dS over P
    attn_mix_gemm(m, B, dq, probs, k, scale);
    attn_mix_t_gemm(m, B, dk, probs, q, scale);
}

// Ablation only (--delete_fills 0): zero n bf16 that the next kernel overwrites whole, as the
// seed's framework did in front of its Mask, Tril, RepeatInterleave and Transpose backward until
// its "P0" change deleted those Fill(0) calls. Their counterparts here: the attention backward
// (causal mask, GQA head sums) and the head permute's backward.
static void redundant_fill(const Model* m, bf16* buf, size_t n) {
    if (!m->sw.delete_fills) fill(buf, n, 0.0f, m->stream);
}

// [recompute] --recompute 1: each of a layer's RMSNorm and SwiGLU outputs again from its saved input,
// into the one copy, just before the weight gradient that reads it (the same kernels as the
// forward's on the same inputs: the same bits). 2: block_forward has just made them.
// [fp8] Not under --fp8 1: the block linears' weight gradients read the inputs' FP8 transposes that
// the forward kept, so nothing reads these.
static void recompute_norm(const Model* m, int B, int tensor, int l) {
    if (m->recompute != RECOMPUTE_NORMS || m->fp8) return;
    size_t N = (size_t)B * m->T, NC = N * m->cfg.n_embd;
    if (tensor == P_ATTN_NORM)
        norm_forward(m, B, tensor, l, NULL, m->acts.normed_attn, m->acts.rstd_attn + l * N, m->acts.resid + l * NC, NULL);
    else norm_forward(m, B, tensor, l, NULL, m->acts.normed_ffn, m->acts.rstd_ffn + l * N, m->acts.h + l * NC, NULL);
}
static void recompute_act(const Model* m, int B, int l) {
    if (m->recompute != RECOMPUTE_NORMS || m->fp8) return;
    int N = B * m->T, F = m->cfg.ffn_hidden;
    swiglu(false, m->acts.act, NULL, m->acts.gate_up + (size_t)l * N * 2 * F, N, F, m->stream);
}

// One block in reverse. On entry dresid holds the gradient of the block's output and
// dresid_bf16 its rounded copy; on exit they hold the gradient of its input.
static void block_backward(const Model* m, int B, int l, bool accumulate) {
    const Llama3Config* c = &m->cfg;
    int N = B * m->T, C = c->n_embd, F = c->ffn_hidden, QKV = qkv_dim(c);
    size_t NC = (size_t)N * C, copy = block_copy(m, l), ncopy = norms_copy(m, l);
    bf16 *dresid_bf16 = m->acts.dresid_bf16, *dbranch = m->acts.branch;
    if (m->recompute == RECOMPUTE_BLOCKS) block_forward(m, B, l, true); // (branch and qkv are free here)
    // MLP: down, SwiGLU, gate_up, ffn norm
    bf16 *dact = m->acts.dact, *dgate_up = m->acts.dgate_up;
    recompute_act(m, B, l);
    linear_backward(m, B, P_DOWN, l, dact, dresid_bf16, m->acts.act + ncopy * N * F, C, F, accumulate);
    swiglu(true, dgate_up, dact, m->acts.gate_up + copy * N * 2 * F, N, F, m->stream,
           fp8_producer_amax(m, P_GATE_UP, l, true));
    recompute_norm(m, B, P_FFN_NORM, l);
    linear_backward(m, B, P_GATE_UP, l, dbranch, dgate_up, m->acts.normed_ffn + ncopy * NC, 2 * F, C, accumulate);
    norm_backward(m, B, P_FFN_NORM, l, m->acts.h + copy * NC, m->acts.rstd_ffn + copy * N, true, accumulate);
    // attention: out projection, heads, RoPE, qkv, attention norm
    linear_backward(m, B, P_ATTN_OUT, l, dbranch, dresid_bf16, m->acts.att_y + copy * NC, C, C, accumulate);
    bf16 *dheads = m->acts.dheads, *dqkv = m->acts.qkv;
    redundant_fill(m, dheads, (size_t)N * QKV);
    attention_backward(m, B, l, dbranch);
    redundant_fill(m, dqkv, (size_t)N * QKV);
    rope_permute(true, dqkv, dheads, dheads + NC, dheads + NC + (size_t)N * (QKV - C) / 2, m->rope_cos, m->rope_sin,
                 head_shape(m, B), m->stream, m->shape_in_memory);
    recompute_norm(m, B, P_ATTN_NORM, l);
    linear_backward(m, B, P_QKV, l, dbranch, dqkv, m->acts.normed_attn + ncopy * NC, QKV, C, accumulate);
    norm_backward(m, B, P_ATTN_NORM, l, m->acts.resid + l * NC, m->acts.rstd_attn + copy * N, true, accumulate);
}

static void adamw_tensor(const Model* m, int tensor, int layer, const AdamWParams* h, cudaStream_t s); // in the optimizer section
static void grad_sum_squares(const Model* m, int tensor, int layer, cudaStream_t s);
static void shard_sum_squares(const Model* m, int tensor, int layer, cudaStream_t s);
static void shard_group_reduce(const Model* m, const int* slices, int n);
static void shard_group_update(const Model* m, const int* slices, int n, const AdamWParams* h);

// [streams] With AdamW overlapped (the plan's ADAMW_OVERLAPPED groups), it runs on the optimizer
// stream as soon as the backward pass has written a group of gradients (lm_head first, then layer
// by layer), filling the bandwidth the backward's small kernels leave idle (at low priority: B=4,
// T=64 15.29 -> 14.46 ms, dev/PERF.md). This orders the optimizer stream after everything the
// main stream has issued.
static void optimizer_stream_waits(const Model* m) {
    CUDA_CHECK(cudaEventRecord(m->step.grads_ready, m->stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->step.opt_stream, m->step.grads_ready));
}
// The other way: the main stream waits for everything the optimizer stream has issued.
static void main_stream_waits(const Model* m) {
    CUDA_CHECK(cudaEventRecord(m->step.opt_done, m->step.opt_stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->step.opt_done));
}

// [streams] The step's last backward has just written the gradients of n `slices` (table indices,
// of one update group). On the optimizer stream, as the plan has it: [data parallel] sharded, their
// reduction over the ranks first; with clipping their sums of squares (AdamW then waits for the
// global norm), else their AdamW if it is overlapped or sharded.
static void gradients_done(const Model* m, const int* slices, int n) {
    const StepPlan* p = m->step.plan;
    AdamWTiming timing = p->timing[m->tab.slice[slices[0]].group];
    if (timing != ADAMW_OVERLAPPED && timing != ADAMW_SHARDED && !p->measure_norm) return;
    optimizer_stream_waits(m);
    if (timing == ADAMW_SHARDED) shard_group_reduce(m, slices, n);
    if (timing == ADAMW_SHARDED && !p->measure_norm)
        return shard_group_update(m, slices, n, optimizer_hyper(&m->optim));
    for (int i = 0; i < n; i++) {
        const TensorSlice* g = &m->tab.slice[slices[i]];
        if (timing == ADAMW_SHARDED) shard_sum_squares(m, g->tensor, g->layer, m->step.opt_stream);
        else if (p->measure_norm) grad_sum_squares(m, g->tensor, g->layer, m->step.opt_stream);
        else adamw_tensor(m, g->tensor, g->layer, optimizer_hyper(&m->optim), m->step.opt_stream);
    }
}

// From the final norm's output gradient (acts.branch, the classifier's) to every weight gradient
// but the head's (the classifier's too): the head's group is handed on first. accumulate: add to
// the gradients of earlier micro-steps of this step instead of overwriting them. to_optimizer: the
// step's last micro-step, whose gradients go to the optimizer group by group as they are written.
static void backward(const Model* m, int B, const int* inputs, bool accumulate, bool to_optimizer) {
    NVTX_PUSH("backward");
    const Llama3Config* c = &m->cfg;
    int N = B * m->T, C = c->n_embd, L = c->n_layer;
    size_t NC = (size_t)N * C;
    const int* first = m->tab.first; // (a tensor's layer-0 slice: a list of one)
    auto done = [&](const int* slices, int n) {
        if (to_optimizer) gradients_done(m, slices, n);
    };
    // [tied embeddings] a tied head is wte: its gradient is done only once the embedding's rows are added, last
    if (m->layout.head == P_LM_HEAD) done(&first[P_LM_HEAD], 1);
    norm_backward(m, B, P_FINAL_NORM, 0, m->acts.resid + L * NC, m->acts.rstd_final, false, accumulate);
    done(&first[P_FINAL_NORM], 1);
    for (int l = L - 1; l >= 0; l--) {
        block_backward(m, B, l, accumulate);
        const int* layer_slices;
        int n = group_slices(m, 1 + l, &layer_slices);
        done(layer_slices, n);
    }
    token_sort(&m->sorter, inputs, N, m->stream);
    embedding_backward(grad_f32(m, m->layout.offset[P_WTE]), m->acts.dresid, &m->sorter, N, C, m->stream);
    grad_written(m, m->layout.offset[P_WTE], m->layout.size[P_WTE]);
    if (to_optimizer && m->grad_accum > 1) // [sparse rows] the rows of all micro-steps: AdamW's and the norm's
        token_sort(&m->sorter, m->tokens, m->grad_accum * N, m->stream);
    done(&first[P_WTE], 1);
    NVTX_POP();
}

// ---- optimizer: the step's updates ----

// The optimizer's update of params[begin, end) with hyperparameters h (device), from the gradients
// as the backward wrote them (bf16 or fp32) and the state from index `state` (begin with one rank;
// [data parallel] the rank's run, zero_run), writing the bf16 shadow where the range holds matmul
// weights; weight decay on all but the norm weights (as llm.c and the Hugging Face Trainer decay).
// [bf16 weights] The matmul weights are updated in their bf16 copy. The range lies within the
// matmul weights, the norm weights, or wte.
static void adamw_range(const Model* m, size_t begin, size_t end, size_t state, const AdamWParams* h, cudaStream_t s) {
    bool decay = begin < m->layout.norm_begin;
    bf16* shadow = has_shadow(m, begin) ? m->shadow + (begin - m->layout.shadow_begin) : NULL;
    auto update = [&](auto* w, bf16* copy) {
        if (grad_is_bf16(m, begin))
            optimizer_update(&m->optim, w, copy, grad_bf16(m, begin), end - begin, begin, state, decay, h, s);
        else
            optimizer_update(&m->optim, w, copy, grad_f32(m, begin), end - begin, begin, state, decay, h, s);
    };
    if (bf16_weights(m) && is_matmul_weight(m, begin)) update(shadow, NULL);
    else update(param_f32(m, begin), shadow);
}

// wte: lazy AdamW over the rows this step touched [sparse rows] (sorted by the backward), or dense.
static void adamw_embedding(const Model* m, const AdamWParams* h, cudaStream_t s) {
    size_t wte = m->layout.offset[P_WTE];
    if (!m->sw.sparse_embedding) {
        adamw_range(m, wte, wte + m->layout.size[P_WTE], wte, h, s);
        return;
    }
    optimizer_update_rows(&m->optim, param_f32(m, wte), grad_f32(m, wte), m->sorter.sorted_tokens,
                          m->grad_accum * m->B * m->T, m->cfg.n_embd, wte, wte, h, s);
}

static void adamw_tensor(const Model* m, int tensor, int layer, const AdamWParams* h, cudaStream_t s) {
    if (tensor == P_WTE) return adamw_embedding(m, h, s);
    size_t begin = param_offset(m, tensor, layer);
    adamw_range(m, begin, begin + m->layout.layer_size[tensor], begin, h, s);
    if (fp8_linear(m, tensor, layer)) fp8_quantize_weight(m, tensor, layer, s); // [fp8] from the new shadow
}

// ---- data parallel: the sharded optimizer (ZeRO-1) ----
// [data parallel] Under several ranks each update group's gradients are averaged over the ranks onto
// each rank's part of every tensor slice (llama3.h zero_layout) as soon as the last backward has
// written them, on the optimizer stream; each rank updates its part (and the few-element tail every
// rank owns) with its own share of AdamW's state, and the parts' new weights are all-gathered. The
// embedding's sparse rows instead go through the union of the rows every rank touched.

// [clipping] The sum of squares of the n gradients at parameter offset `offset` (bf16 or fp32, as
// the backward wrote them) into `partial`.
static void sum_squares_at(const Model* m, float* partial, size_t offset, size_t n, cudaStream_t s) {
    if (grad_is_bf16(m, offset)) sum_squares(partial, grad_bf16(m, offset), n, s);
    else sum_squares(partial, grad_f32(m, offset), n, s);
}
static bool sparse_wte(const Model* m, int tensor) { return tensor == P_WTE && m->sw.sparse_embedding; }
static int n_union(const Model* m) { return m->comm->world * m->grad_accum * m->B * m->T; }

// [sparse rows] The wte gradient rows any rank touched, averaged over the ranks: every rank's step
// inputs gathered and sorted (the union, repeats included), each row copied to the slot of its first
// sorted entry, one all-reduce of the slots (world * n_step rows, not the table), and back. Every
// rank then holds the same rows and updates them alike (its wte state is the whole table).
static void reduce_union_rows(const Model* m) {
    const Comm* c = m->comm;
    int n_step = m->grad_accum * m->B * m->T, C = m->cfg.n_embd;
    float* table = grad_f32(m, m->layout.offset[P_WTE]);
    all_gather(c->nccl, m->tokens, c->all_tokens, n_step, m->step.opt_stream); // (the step's inputs come first)
    token_sort(&c->union_sorter, c->all_tokens, n_union(m), m->step.opt_stream);
    union_rows<true>(table, c->union_grads, c->union_sorter.sorted_tokens, n_union(m), C, m->step.opt_stream);
    all_reduce(c->nccl, c->union_grads, c->union_grads, (size_t)n_union(m) * C, COMM_AVG, m->step.opt_stream);
    union_rows<false>(table, c->union_grads, c->union_sorter.sorted_tokens, n_union(m), C, m->step.opt_stream);
}

// The average over the ranks of tensor `tensor`'s slice of `layer`: reduce-scattered onto the parts
// in place (bf16 or fp32, as the backward wrote it), the tail all-reduced.
static void shard_reduce(const Model* m, int tensor, int layer) {
    const Comm* c = m->comm;
    size_t offset = param_offset(m, tensor, layer);
    RangeShard sh = c->zero.shard[tensor];
    auto reduce = [&](auto* g) {
        if (sh.part) reduce_scatter(c->nccl, g, sh.part, c->rank, m->step.opt_stream);
        if (sh.tail) all_reduce(c->nccl, g + c->world * sh.part, g + c->world * sh.part, sh.tail, COMM_AVG, m->step.opt_stream);
    };
    if (grad_is_bf16(m, offset)) reduce(grad_bf16(m, offset));
    else reduce(grad_f32(m, offset));
}

// x's parts of `part` elements, each rank's own at rank * part, all-gathered in place on the optimizer stream.
template <typename T> static void all_gather_parts(const Model* m, T* x, size_t part) {
    all_gather(m->comm->nccl, x + (size_t)m->comm->rank * part, x, part, m->step.opt_stream);
}

// f(run, which) for each of this rank's non-empty runs of the slice: its part (which 0), then the tail (1).
template <typename F> static void each_own_run(const Model* m, int tensor, int layer, F f) {
    for (int which = 0; which < 2; which++) {
        ShardRun r = zero_run(&m->comm->zero, &m->layout, tensor, layer, which);
        if (r.n) f(r, which);
    }
}

// This rank's AdamW of the slice: its part and the tail, or [sparse rows] the union's rows.
static void shard_adamw(const Model* m, int tensor, int layer, const AdamWParams* h) {
    const Comm* c = m->comm;
    if (sparse_wte(m, tensor)) {
        size_t wte = m->layout.offset[P_WTE], state = c->zero.state_offset[P_WTE];
        optimizer_update_rows(&m->optim, param_f32(m, wte), grad_f32(m, wte), c->union_sorter.sorted_tokens, n_union(m),
                              m->cfg.n_embd, wte, state, h, m->step.opt_stream);
        return;
    }
    each_own_run(m, tensor, layer,
                 [&](ShardRun r, int) { adamw_range(m, r.param, r.param + r.n, r.state, h, m->step.opt_stream); });
}

// The ranks' new parts of the slice, all-gathered in place: the bf16 shadow of a matmul weight (the
// GEMMs read it; the fp32 masters of other ranks' parts go stale, and nothing reads them), or [fp8]
// a block linear's e4m3 copy instead (its GEMMs read only that: 1 byte per weight, not 2; the
// other ranks' parts of its shadow go stale too); the fp32 weights of a norm or of a dense wte (read
// as they are); a tied wte both (the head GEMMs read its shadow, the embedding lookup its fp32 rows).
typedef struct {
    bool fp8, shadow, fp32; // the e4m3 copy, the bf16 shadow, the fp32 weights
} GatheredCopies;
static GatheredCopies gathered_copies(const Model* m, int tensor, int layer) {
    size_t offset = param_offset(m, tensor, layer);
    GatheredCopies g;
    g.fp8 = fp8_linear(m, tensor, layer);
    g.shadow = !g.fp8 && has_shadow(m, offset);
    g.fp32 = !is_matmul_weight(m, offset);
    return g;
}
static void shard_gather(const Model* m, int tensor, int layer) {
    size_t part = m->comm->zero.shard[tensor].part, offset = param_offset(m, tensor, layer);
    if (!part) return;
    GatheredCopies g = gathered_copies(m, tensor, layer);
    if (g.fp8) all_gather_parts(m, m->fp8->w + fp8_weight_at(m, tensor, layer), part);
    if (g.shadow) all_gather_parts(m, m->shadow + (offset - m->layout.shadow_begin), part);
    if (g.fp32) all_gather_parts(m, param_f32(m, offset), part);
}

// [fp8] The FP8 copy of a block linear under ZeRO-1, in three steps around two collectives, equal bit
// for bit to fp8_quantize_weight on the whole gathered shadow (a max is exact in any order; each
// byte depends only on its element and the scale): this rank's amax of its part and of the tail
// (which every rank updated alike), all-reduced (MAX) to one scale; the part and tail quantised
// (their bytes then all-gathered by shard_gather); after the gather, the transpose of the whole.
static void fp8_shard_amax(const Model* m, int tensor, int layer) {
    Fp8Scale* scale = fp8_weight_scale(m, tensor, layer);
    CUDA_CHECK(cudaMemsetAsync(scale, 0, sizeof(Fp8Scale), m->step.opt_stream));
    each_own_run(m, tensor, layer, [&](ShardRun r, int) {
        fp8_amax(scale, m->shadow + (r.param - m->layout.shadow_begin), r.n, m->sms, m->step.opt_stream);
    });
}
static void fp8_shard_scale_reduce(const Model* m, int tensor, int layer) {
    unsigned* amax = &fp8_weight_scale(m, tensor, layer)->amax_bits; // bits of a float >= 0: max as unsigned
    all_reduce(m->comm->nccl, amax, amax, 1, COMM_MAX, m->step.opt_stream);
}
static void fp8_shard_quantize(const Model* m, int tensor, int layer) {
    size_t begin = param_offset(m, tensor, layer), at = fp8_weight_at(m, tensor, layer);
    each_own_run(m, tensor, layer, [&](ShardRun r, int) {
        quantize_fp8_range(m->fp8->w + at + (r.param - begin), fp8_weight_scale(m, tensor, layer),
                           m->shadow + (r.param - m->layout.shadow_begin), r.n, m->sms, m->step.opt_stream);
    });
}
static void fp8_shard_transpose(const Model* m, int tensor, int layer) {
    const TensorSlice* w_slice = slice_of(&m->tab, tensor, layer);
    size_t at = w_slice->fp8_weight_at;
    transpose_fp8(m->fp8->w_t + at, m->fp8->w + at, w_slice->out, w_slice->in, m->step.opt_stream);
}

// The reduction of n slices of an update group (one NCCL launch for them; wte's union has kernels
// between its collectives, so it runs alone).
static void shard_group_reduce(const Model* m, const int* slices, int n) {
    const TensorSlice* s = m->tab.slice;
    if (sparse_wte(m, s[slices[0]].tensor)) return reduce_union_rows(m);
    comm_group(true);
    for (int i = 0; i < n; i++) shard_reduce(m, s[slices[i]].tensor, s[slices[i]].layer);
    comm_group(false);
}
// Their AdamW on this rank's parts, then their all-gathers (one NCCL launch). [fp8] Before the
// gathers, the block linears' FP8 copies of the parts with the scale of the whole weight (one
// all-reduce of the amaxes for the group: every rank's weight scales are the same); after, their
// transposes.
static void shard_group_update(const Model* m, const int* slices, int n, const AdamWParams* h) {
    const TensorSlice* s = m->tab.slice;
    auto each_fp8 = [&](void (*f)(const Model*, int, int)) {
        for (int i = 0; i < n; i++)
            if (fp8_linear(m, s[slices[i]].tensor, s[slices[i]].layer)) f(m, s[slices[i]].tensor, s[slices[i]].layer);
    };
    for (int i = 0; i < n; i++) shard_adamw(m, s[slices[i]].tensor, s[slices[i]].layer, h);
    if (m->fp8) {
        each_fp8(fp8_shard_amax);
        comm_group(true);
        each_fp8(fp8_shard_scale_reduce);
        comm_group(false);
        each_fp8(fp8_shard_quantize);
    }
    comm_group(true);
    for (int i = 0; i < n; i++) shard_gather(m, s[slices[i]].tensor, s[slices[i]].layer);
    comm_group(false);
    each_fp8(fp8_shard_transpose);
}

// [clipping] This rank's sums of squares of the slice: its part into the slot, the tail (rank 0's
// alone: every rank holds the same) into the slot's twin in the second half, the union's wte rows
// (rank 0's alone). clip_guard then reads the ranks' sums (norm_all_reduce).
static void shard_sum_squares(const Model* m, int tensor, int layer, cudaStream_t s) {
    const Comm* c = m->comm;
    float* partial = sumsq_of(m, tensor, layer);
    if (sparse_wte(m, tensor)) {
        if (c->rank == 0)
            sum_squares_rows(partial, grad_f32(m, m->layout.offset[P_WTE]), c->union_sorter.sorted_tokens, n_union(m),
                             m->cfg.n_embd, s);
        return;
    }
    each_own_run(m, tensor, layer, [&](ShardRun r, int which) {
        float* into = partial + which * sumsq_slots(m) * SUMSQ_BLOCKS;
        if (which == 0 || c->rank == 0) sum_squares_at(m, into, r.param, r.n, s);
    });
}

// [clipping] Under several ranks, once the norm is known: every group's sharded update.
static void shard_update_after_norm(const Model* m) {
    for (int g = 0; g < num_groups(m); g++) {
        const int* slices;
        int n = group_slices(m, g, &slices);
        shard_group_update(m, slices, n, optimizer_hyper(&m->optim));
    }
}

// [clipping] The global norm and clipping scale, on the optimizer stream after the last sums; under
// several ranks from every rank's partial sums, summed out of place (a rank's own slots keep only its
// sums: the slots a rank never writes stay zero).
static void norm_guard(const Model* m) {
    const float* partial = m->sumsq;
    if (m->step.plan->world > 1) {
        all_reduce(m->comm->nccl, m->sumsq, m->comm->sumsq_total, sumsq_count(m), COMM_SUM, m->step.opt_stream);
        partial = m->comm->sumsq_total;
    }
    clip_guard(optimizer_hyper(&m->optim), m->stats, partial, (int)sumsq_count(m), m->optim.cfg.grad_clip,
               m->step.opt_stream);
}

// [data parallel] The NaN guard's inputs agreed on: the step's loss averaged over the ranks and the
// skip flag of any rank, on the optimizer stream before any AdamW of the step; the count follows
// (clip_guard counts instead when the norm is measured).
static void ranks_agree_on_loss(const Model* m) {
    const Comm* c = m->comm;
    optimizer_stream_waits(m);
    comm_group(true);
    all_reduce(c->nccl, &m->stats->loss, &m->stats->loss, 1, COMM_AVG, m->step.opt_stream);
    int* skip = &optimizer_hyper(&m->optim)->skip;
    all_reduce(c->nccl, skip, skip, 1, COMM_MAX, m->step.opt_stream);
    comm_group(false);
    if (m->step.plan->counted_by == COUNTED_AFTER_RANKS)
        count_step_after(optimizer_hyper(&m->optim), m->stats, m->step.opt_stream);
}

// [clipping] On one rank, the sum of squares of one gradient tensor into its slot's partial sums: bf16
// or fp32, and wte's touched rows only [sparse rows] (several ranks: shard_sum_squares).
static void grad_sum_squares(const Model* m, int tensor, int layer, cudaStream_t s) {
    size_t offset = param_offset(m, tensor, layer), n = m->layout.layer_size[tensor];
    float* partial = sumsq_of(m, tensor, layer);
    if (tensor == P_WTE && m->sw.sparse_embedding)
        sum_squares_rows(partial, grad_f32(m, offset), m->sorter.sorted_tokens, m->grad_accum * m->B * m->T,
                         m->cfg.n_embd, s);
    else
        sum_squares_at(m, partial, offset, n, s);
}

// AdamW after the backward pass (the step begun by optimizer_begin_step), in three launches over
// the parameter block's ranges: matmul weights (writing their shadows), norm weights, and wte.
static void optimizer_step(const Model* m) {
    NVTX_PUSH("optimizer");
    const ParamLayout* p = &m->layout;
    const AdamWParams* h = optimizer_hyper(&m->optim);
    adamw_range(m, p->matmul_begin, p->matmul_end, p->matmul_begin, h, m->stream);
    adamw_range(m, p->norm_begin, p->total, p->norm_begin, h, m->stream);
    adamw_embedding(m, h, m->stream);
    if (m->fp8) fp8_quantize_weights(m, m->stream);
    NVTX_POP();
}

// One update group's AdamW (see update groups at head_group).
static void adamw_group(const Model* m, int g, const AdamWParams* h, cudaStream_t s) {
    const int* slices;
    int n = group_slices(m, g, &slices);
    for (int i = 0; i < n; i++) {
        const TensorSlice* w = &m->tab.slice[slices[i]];
        adamw_tensor(m, w->tensor, w->layer, h, s);
    }
}

// [deferred AdamW] The updates of the plan's deferred groups, which the previous step left, in the
// order the forward reads them, with hyperparameters h; after each group an event that the forward
// waits on before reading it. At the start of a step they run on the optimizer stream beside the
// forward, whose small GEMMs leave most of the bandwidth idle, instead of as the tail of the
// previous step's AdamW, which the whole forward had to wait for. With clipping every group is
// deferred: no update may start before the backward has given the global norm.
static void adamw_deferred(const Model* m, const AdamWParams* h, cudaStream_t s) {
    for (int g = 0; g < m->step.plan->n_groups; g++) {
        if (!group_deferred(m, g)) continue;
        adamw_group(m, g, h, s);
        CUDA_CHECK(cudaEventRecord(m->step.group_updated[g], s));
    }
}

// [deferred AdamW] Applies what the last step deferred, between steps, with that step's
// hyperparameters (`latest`), so that the weights are whole for whatever reads them: a save, the
// val loss, a sample, the end of the run. Nothing is pending after it, so the next step runs
// eagerly (the graph holds the steady state, whose first work would apply them again).
static void optimizer_flush(Model* m) {
    if (!m->step.pending.updates) return;
    adamw_deferred(m, optimizer_hyper(&m->optim), m->stream);
    m->step.pending.updates = false;
}

// ---- training step ----

// Ablation only (--grad_zeroing memset|fill): zero every gradient tensor, layer by layer, before
// the step, as a framework that accumulates into .grad does; the trainer's own path writes the
// first micro-step's gradients with beta 0 instead and zeroes nothing.
static void zero_grads(const Model* m) {
    const ParamLayout* p = &m->layout;
    bool fill_kernels = m->sw.grad_zeroing == GRAD_ZERO_FILL;
    for (int t = P_LM_HEAD; t < NUM_PARAM_TENSORS; t++)
        for (size_t off = p->offset[t]; off < p->offset[t] + p->size[t]; off += p->layer_size[t]) {
            size_t n = p->layer_size[t];
            if (grad_is_bf16(m, off)) {
                bf16* g = grad_bf16(m, off);
                if (fill_kernels) fill(g, n, 0.0f, m->stream);
                else CUDA_CHECK(cudaMemsetAsync(g, 0, n * 2, m->stream));
            } else if (fill_kernels) {
                fill(grad_f32(m, off), n, 0.0f, m->stream);
            } else {
                CUDA_CHECK(cudaMemsetAsync(grad_f32(m, off), 0, n * 4, m->stream));
            }
        }
}

// Micro-step `micro` of the step: forward (the first waits for each group the previous step
// deferred), the classifier (the per-token losses and, chunk by chunk with them, the head's
// gradients), and the backward from there, accumulating onto the earlier micro-steps' gradients.
// The last also takes the step's mean loss and its NaN guard (before any AdamW of the step), and
// with to_optimizer its backward hands each group's gradients on as the plan has it (the test's
// gradient check runs the micro-steps without).
static void micro_step(const Model* m, int micro, bool to_optimizer) {
    int N = m->B * m->T, n_step = m->grad_accum * N;
    const int* inputs = m->tokens + (size_t)micro * N;
    bool last = micro == m->grad_accum - 1, accumulate = micro > 0 || m->sw.grad_zeroing != GRAD_ZERO_NONE;
    forward(m, m->B, inputs, micro == 0 && m->step.pending.updates);
    // (after the forward's wait for wte's deferred AdamW, which reads this gradient; before a tied head adds to it)
    bool head_writes_wte = m->cfg.tied_embeddings && !accumulate; // [tied embeddings] with beta 0, every row
    if (micro == 0 && !m->sw.sparse_embedding && !head_writes_wte) // dense wte gradient: re-zeroed every step
        CUDA_CHECK(cudaMemsetAsync(grad_f32(m, m->layout.offset[P_WTE]), 0, m->layout.size[P_WTE] * 4, m->stream));
    classifier(m, m->B, m->tokens + n_step + (size_t)micro * N, micro, true, accumulate);
    if (last)
        loss_guard(optimizer_hyper(&m->optim), m->stats, m->acts.losses, n_step,
                   m->step.plan->counted_by == COUNTED_BY_LOSS_GUARD, m->stream);
    if (last && m->step.plan->world > 1) ranks_agree_on_loss(m);
    if (last && m->step.pending.save_copy) CUDA_CHECK(cudaStreamWaitEvent(m->stream, *m->step.pending.save_copy));
    backward(m, m->B, inputs, accumulate, last && to_optimizer);
}

// Everything of one optimizer step after its tokens are on the device, as the plan has it: the
// AdamW the previous step deferred (on the optimizer stream, beside this step's forward), the
// micro-steps (the last one's backward overlapping AdamW or the norm's sums), then with clipping
// the global norm, the main stream joining the optimizer stream, and AdamW after the backward.
// Launches only, on a const Model: no field of the Model changes in here, since the same launches
// are captured once and replayed [graphs] (only the GEMM plan cache behind m->gemm grows on a
// shape's first use, which the eager first step makes); no host sync, and every value that changes
// per step lives on the device.
static void step_work(const Model* m) {
    const StepPlan* p = m->step.plan;
    optimizer_begin_step(&m->optim, m->stats, m->stream);
    if (m->step.pending.updates)
        optimizer_stream_waits(m), adamw_deferred(m, optimizer_hyper_previous(&m->optim), m->step.opt_stream);
    if (m->sw.grad_zeroing != GRAD_ZERO_NONE) zero_grads(m);
    for (int micro = 0; micro < m->grad_accum; micro++) micro_step(m, micro, true);
    if (p->measure_norm) norm_guard(m);
    if (p->measure_norm && p->world > 1) shard_update_after_norm(m);
    // The optimizer stream worked in the backward: the next forward needs every weight not deferred.
    if (p->measure_norm || !p->after_backward) main_stream_waits(m);
    if (p->after_backward) optimizer_step(m);
}

// [graphs] step_work recorded once into a CUDA graph (both streams: the optimizer stream forks
// and joins through events) and from then on launched as one unit: the step's hundreds of
// launches cost the host one call, and the GPU starts each kernel without waiting for the host.
static void capture_step(Model* m) {
    cudaGraph_t graph;
    CUDA_CHECK(cudaStreamBeginCapture(m->stream, cudaStreamCaptureModeThreadLocal));
    step_work(m);
    CUDA_CHECK(cudaStreamEndCapture(m->stream, &graph));
    // Each kernel node keeps the priority of the stream it was captured from (the optimizer's is
    // low); without this flag the whole graph would run at the priority of the launch stream.
    CUDA_CHECK(cudaGraphInstantiateWithFlags(&m->step.graph, graph, cudaGraphInstantiateFlagUseNodePriority));
    CUDA_CHECK(cudaGraphDestroy(graph));
}

// [graphs] The state every step but the first starts from when nothing reads the weights between
// steps, and so the one the graph is captured in: the last step's deferred updates pending (if the
// plan defers any), no save's copy running. Any other step runs eagerly.
static bool pending_is_steady(const Model* m) {
    return m->step.pending.updates == m->step.plan->any_deferred && !m->step.pending.save_copy;
}

// Optimizer step t on the batches already staged in tokens_host slot `slot`: one host-to-device
// copy of the step's tokens, the step's work (from the graph when planned and steady, else
// eagerly), what it leaves pending, and its StepStats copied to pinned memory (read a step later,
// never waited on here). No host sync.
static void train_step(Model* m, int slot) {
    NVTX_PUSH("step");
    size_t n_step = (size_t)m->grad_accum * m->B * m->T;
    CUDA_CHECK(cudaMemcpyAsync(m->tokens, m->tokens_host + slot * 2 * n_step, 2 * n_step * sizeof(int),
                               cudaMemcpyHostToDevice, m->stream));
    if (m->step.plan->use_graph && m->step.steps_run > 0 && pending_is_steady(m)) { // (the first step makes the GEMM plans)
        if (!m->step.graph) capture_step(m);
        CUDA_CHECK(cudaGraphLaunch(m->step.graph, m->stream));
    } else {
        step_work(m);
    }
    m->step.pending.updates = m->step.plan->any_deferred;
    m->step.pending.save_copy = NULL;
    m->step.steps_run++;
    CUDA_CHECK(cudaMemcpyAsync(m->stats_host + slot, m->stats, sizeof(StepStats), cudaMemcpyDeviceToHost, m->stream));
    NVTX_POP();
}

// The loader's next micro-batch; a shard it cannot read (vanished, changed, a token past the
// vocab) ends the run here, named.
static void next_batch(DataLoader* loader, int32_t* inputs, int32_t* targets) {
    char err[L3_ERR_LEN];
    if (loader_next(loader, inputs, targets, err) == 0) return;
    fprintf(stderr, "error: %s%s\n", rank_tag, err);
    exit(EXIT_FAILURE);
}
// Fills staging slot `slot` with the next grad_accum batches: inputs first, then targets.
static void stage_batches(Model* m, DataLoader* loader, int slot) {
    size_t N = (size_t)m->B * m->T, n_step = m->grad_accum * N;
    int32_t* base = m->tokens_host + (size_t)slot * 2 * n_step;
    for (int micro = 0; micro < m->grad_accum; micro++) next_batch(loader, base + micro * N, base + n_step + micro * N);
}

// The weights in a model file's order, fp32, into host[0, total) on stream s: the fp32 block's
// pieces, and [bf16 weights] the matmul weights' bf16 into the upper half of their range's bytes,
// which weights_widen turns into floats once the copy is done.
static void weights_to_host(const Model* m, float* host, cudaStream_t s) {
    const ParamLayout* p = &m->layout;
    if (!bf16_weights(m)) {
        CUDA_CHECK(cudaMemcpyAsync(host, m->params, p->total * sizeof(float), cudaMemcpyDeviceToHost, s));
        return;
    }
    size_t n = p->matmul_end - p->matmul_begin, after = p->total - p->matmul_end;
    CUDA_CHECK(cudaMemcpyAsync(host, m->params, p->matmul_begin * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaMemcpyAsync((unsigned char*)(host + p->matmul_begin) + 2 * n, bf16_weights_ptr(m), n * sizeof(bf16),
                               cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaMemcpyAsync(host + p->matmul_end, param_f32(m, p->matmul_end), after * sizeof(float),
                               cudaMemcpyDeviceToHost, s));
}
static void weights_widen(const ParamLayout* p, bool bf16_weights, float* host) {
    if (bf16_weights) widen_bf16_upper_half(host + p->matmul_begin, p->matmul_end - p->matmul_begin);
}

// ---- checkpoints ----
// [checkpoints] A save applies the deferred AdamW updates (the saved weights are the true weights
// after the step), copies the weights and AdamW's m and v to pinned host memory on a side stream,
// and hands them to a host thread that writes the files (llama3.h: checkpoint_write_model, _hf, _state) while the
// next steps run. The next step waits for the copy only before its AdamW, which rewrites what is
// being copied; the copy of a 1B model (18 GB) runs at PCIe speed, the files at the disk's.

typedef struct {
    const CheckpointConfig* ckpt; // where (dir) and how many to keep
    bool hf_bf16;                 // [--save_hf_checkpoints] hf/'s dtype (--save_hf_dtype)
    const char* hf_tokenizer;     // and the tokenizer files' folder (--hf_dir; NULL: none)
    Llama3Config cfg;
    bool bf16_weights;             // [bf16 weights] params holds the matmul weights as weights_to_host leaves them
    size_t n_params, state_floats; // floats of the weights, and values of m and v on this rank
    size_t moments_bytes;          // bytes of each of m and v (their dtype's)
    float* params;        // pinned host copies of one save ([data parallel] params: rank 0's only)
    void *adam_m, *adam_v; // (fp32 or bf16, as the run's --optimizer_state)
    cudaStream_t stream;
    cudaEvent_t flushed, copied;
    pthread_t writer;
    bool writing;
    CheckpointState st;
    int failed; // set by the writer thread (atomic access)
    char err[L3_ERR_LEN];
} Saver;

static void saver_create(Saver* s, const Model* m, const TrainArgs* a) {
    memset(s, 0, sizeof(*s));
    s->ckpt = &a->ckpt, s->cfg = m->cfg, s->n_params = m->layout.total, s->bf16_weights = bf16_weights(m);
    s->hf_bf16 = a->loop.save_hf_dtype == HF_DTYPE_BF16, s->hf_tokenizer = a->loop.hf_dir;
    s->state_floats = m->optim.count, s->moments_bytes = optimizer_moment_bytes(&m->optim);
    void** host[3] = {(void**)&s->params, &s->adam_m, &s->adam_v};
    bool writes_model = !m->comm || m->comm->rank == 0;
    size_t bytes[3] = {writes_model ? s->n_params * sizeof(float) : 0, s->moments_bytes, s->moments_bytes};
    for (int i = 0; i < 3; i++)
        if (bytes[i] && cudaMallocHost(host[i], bytes[i]) != cudaSuccess) {
            fprintf(stderr, "error: --checkpoint_dir: cannot allocate %.2f GiB of pinned host memory for a save\n",
                    (bytes[0] + bytes[1] + bytes[2]) / 1073741824.0);
            exit(EXIT_FAILURE);
        }
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->flushed, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->copied, cudaEventDisableTiming));
}

// The weights' host copy as floats, once copied ([bf16 weights] widened where weights_to_host left bf16).
static void saver_weights_ready(Saver* s) {
    ParamLayout p = param_layout(&s->cfg);
    weights_widen(&p, s->bf16_weights, s->params);
}

// The writer thread: waits for the copy, writes the checkpoint, then deletes what --checkpoint_keep
// no longer keeps (only now that the newer one is complete).
// [--save_hf_checkpoints] The save's hf/ folder, from its host copy of the weights (0: none asked).
static int saver_write_hf(const Saver* s, char* err) {
    if (!s->ckpt->hf) return 0;
    return checkpoint_write_hf(s->ckpt->dir, s->st.step, &s->cfg, s->params, s->hf_bf16, s->hf_tokenizer, err);
}
static void* saver_write(void* arg) {
    Saver* s = (Saver*)arg;
    char err[L3_ERR_LEN];
    int rc = -1;
    bool copied = cudaEventSynchronize(s->copied) == cudaSuccess;
    if (!copied) snprintf(err, sizeof(err), "the copy to the host failed");
    else saver_weights_ready(s);
    if (copied && checkpoint_write_model(s->ckpt->dir, &s->cfg, s->st.step, s->params, err) == 0 &&
        saver_write_hf(s, err) == 0 && checkpoint_write_state(s->ckpt->dir, &s->st, s->adam_m, s->adam_v, err) == 0)
        rc = checkpoint_prune(s->ckpt->dir, s->st.step, s->ckpt->keep, err);
    if (rc) {
        snprintf(s->err, sizeof(s->err), "%s", err);
        __atomic_store_n(&s->failed, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

// Waits for the writer of the previous save; a failed write stops the run.
static void saver_join(Saver* s) {
    if (s->writing) pthread_join(s->writer, NULL);
    s->writing = false;
    if (__atomic_load_n(&s->failed, __ATOMIC_ACQUIRE)) {
        fprintf(stderr, "error: checkpoint not saved: %s\n", s->err);
        exit(EXIT_FAILURE);
    }
}

// [data parallel] [checkpoints] Every part's fp32 weights all-gathered, for model.bin (between steps
// the matmul weights' masters are current only in each rank's own parts); [bf16 weights] their bf16
// copies, the only ones (under FP8 the step gathers the FP8 copies, not these).
static void gather_masters(const Model* m) {
    optimizer_stream_waits(m);
    comm_group(true);
    for (int j = 0; j < m->tab.n_slices; j++) {
        const TensorSlice* w = &m->tab.slice[j];
        size_t part = m->comm->zero.shard[w->tensor].part;
        if (!is_matmul_weight(m, w->offset) || !part) continue;
        if (bf16_weights(m)) all_gather_parts(m, m->shadow + (w->offset - m->layout.shadow_begin), part);
        else all_gather_parts(m, param_f32(m, w->offset), part);
    }
    comm_group(false);
    main_stream_waits(m);
}

// [data parallel] The sum over the ranks of one int of each (a barrier too: every rank waits here).
static int ranks_sum(const Model* m, int value) {
    int* sum = m->comm->count;
    CUDA_CHECK(cudaMemcpy(sum, &value, sizeof(int), cudaMemcpyHostToDevice));
    all_reduce(m->comm->nccl, sum, sum, 1, COMM_SUM, m->step.opt_stream);
    CUDA_CHECK(cudaMemcpyAsync(&value, sum, sizeof(int), cudaMemcpyDeviceToHost, m->step.opt_stream));
    CUDA_CHECK(cudaStreamSynchronize(m->step.opt_stream));
    return value;
}

// [data parallel] A save of several ranks, written while the run waits: rank 0's model.bin and the
// other ranks' state_rank files, a barrier that counts the ranks whose write failed, then rank 0's
// state.bin and latest (a folder is complete only once every rank's share is on disk).
static void checkpoint_save_ranks(Model* m, Saver* s) {
    const Comm* c = m->comm;
    char err[L3_ERR_LEN] = "";
    CUDA_CHECK(cudaEventSynchronize(s->copied));
    if (c->rank == 0) saver_weights_ready(s);
    int rc = c->rank == 0 ? checkpoint_write_model(s->ckpt->dir, &s->cfg, s->st.step, s->params, err) ||
                                saver_write_hf(s, err)
                          : checkpoint_write_rank(s->ckpt->dir, &s->st, s->adam_m, s->adam_v, err);
    if (rc) fprintf(stderr, "error: %scheckpoint not saved: %s\n", rank_tag, err);
    int failed = ranks_sum(m, rc != 0);
    if (failed) {
        fprintf(stderr, "error: %scheckpoint of step %d not saved: %d rank%s could not write %s share\n", rank_tag,
                s->st.step, failed, failed > 1 ? "s" : "", failed > 1 ? "their" : "its");
        exit(EXIT_FAILURE);
    }
    if (c->rank == 0 && (checkpoint_write_state(s->ckpt->dir, &s->st, s->adam_m, s->adam_v, err) ||
                         checkpoint_prune(s->ckpt->dir, s->st.step, s->ckpt->keep, err))) {
        fprintf(stderr, "error: %scheckpoint not saved: %s\n", rank_tag, err);
        exit(EXIT_FAILURE);
    }
    m->step.pending.save_copy = NULL; // (copied already)
}

// Saves the state after step `step` (launched, maybe still running). No host sync here with one
// rank; [data parallel] several ranks write while they wait (checkpoint_save_ranks).
static void checkpoint_save(Model* m, Saver* s, const TrainArgs* a, const DataLoader* loader, int step) {
    saver_join(s); // the host buffers are free again
    optimizer_flush(m);
    if (m->comm) gather_masters(m);
    CUDA_CHECK(cudaEventRecord(s->flushed, m->stream));
    CUDA_CHECK(cudaStreamWaitEvent(s->stream, s->flushed));
    if (s->params) weights_to_host(m, s->params, s->stream);
    optimizer_save(&m->optim, s->adam_m, s->adam_v, s->stream);
    CUDA_CHECK(cudaEventRecord(s->copied, s->stream));
    m->step.pending.save_copy = &s->copied;
    s->st = checkpoint_state_make(a, step, s->n_params, s->state_floats, loader);
    if (m->comm) return checkpoint_save_ranks(m, s);
    if (pthread_create(&s->writer, NULL, saver_write, s) != 0) {
        fprintf(stderr, "error: checkpoint: cannot start the writer thread\n");
        exit(EXIT_FAILURE);
    }
    s->writing = true;
}

static void saver_free(Saver* s) {
    saver_join(s);
    CUDA_CHECK(cudaFreeHost(s->params));
    CUDA_CHECK(cudaFreeHost(s->adam_m));
    CUDA_CHECK(cudaFreeHost(s->adam_v));
    CUDA_CHECK(cudaStreamDestroy(s->stream));
    CUDA_CHECK(cudaEventDestroy(s->flushed));
    CUDA_CHECK(cudaEventDestroy(s->copied));
}

// Resume: the checkpoint's AdamW state (this rank's share: its own state file, of the same number
// of ranks, resume_check) and step counter (the weights were loaded as a model file).
static void checkpoint_restore(Model* m, const char* state_path, const CheckpointState* st) {
    const Optimizer* o = &m->optim;
    size_t P = m->layout.total, n = o->count;
    char err[L3_ERR_LEN], mine[L3_PATH_LEN];
    CheckpointState own;
    int rank = m->comm ? m->comm->rank : 0;
    if (rank_state_path(state_path, rank, mine, err) || state_header_read(mine, P, &own, err)) {
        fprintf(stderr, "error: %s%s\n", rank_tag, err);
        exit(EXIT_FAILURE);
    }
    if (own.rank != rank || own.state_floats != n || own.moments != o->cfg.moments) {
        fprintf(stderr, "error: %s%s: holds rank %d's %llu values of AdamW's state (%s); this rank (%d) has %zu (%s)\n",
                rank_tag, mine, own.rank, (unsigned long long)own.state_floats, own.moments ? "bf16" : "fp32", rank, n,
                o->cfg.moments ? "bf16" : "fp32");
        exit(EXIT_FAILURE);
    }
    size_t bytes = optimizer_moment_bytes(o);
    unsigned char* host = (unsigned char*)malloc(2 * bytes);
    if (!host) {
        fprintf(stderr, "error: --resume: cannot allocate %.2f GiB of host memory for AdamW's state\n",
                2.0 * bytes / 1073741824.0);
        exit(EXIT_FAILURE);
    }
    if (state_arrays_read(mine, n, moment_bytes(o->cfg.moments), host, host + bytes, err)) {
        fprintf(stderr, "error: %s%s\n", rank_tag, err);
        exit(EXIT_FAILURE);
    }
    optimizer_load(o, host, host + bytes, st->step);
    free(host);
}

// [data parallel] x (one float on the device, written on the main stream) averaged over the ranks,
// on the optimizer stream like every collective, and the main stream after it.
static void ranks_average(const Model* m, float* x) {
    optimizer_stream_waits(m);
    all_reduce(m->comm->nccl, x, x, 1, COMM_AVG, m->step.opt_stream);
    main_stream_waits(m);
}

// --save_hf: the weights after the run's last step as a Hugging Face folder (llama3.h hf_save),
// written by rank 0 (under ZeRO the ranks' parts gathered first) with --hf_dir's tokenizer files. A
// write that fails ends every rank, rank 0 with its message.
static void save_hf(Model* m, const TrainArgs* a) {
    optimizer_flush(m);
    if (m->comm) gather_masters(m);
    char err[L3_ERR_LEN] = "";
    int rc = 0;
    if (!m->comm || m->comm->rank == 0) {
        size_t bytes = m->layout.total * sizeof(float);
        float* host = (float*)malloc(bytes);
        if (!host) rc = l3_fail(err, "--save_hf %s: no host memory for the weights (%zu bytes)", a->loop.save_hf, bytes);
        if (host) {
            weights_to_host(m, host, m->stream);
            CUDA_CHECK(cudaStreamSynchronize(m->stream));
            weights_widen(&m->layout, bf16_weights(m), host);
            rc = hf_save(a->loop.save_hf, &m->cfg, host, a->loop.save_hf_dtype == HF_DTYPE_BF16, a->loop.hf_dir, err);
        }
        free(host);
    }
    int failed = m->comm ? ranks_sum(m, rc != 0) : rc != 0;
    if (rc) fprintf(stderr, "error: %s%s\n", rank_tag, err);
    if (failed) exit(EXIT_FAILURE);
    printf("saved %s: model.safetensors (%s), config.json%s\n", a->loop.save_hf,
           a->loop.save_hf_dtype == HF_DTYPE_BF16 ? "bfloat16" : "float32",
           a->loop.hf_dir ? ", and the tokenizer files --hf_dir has" : "");
}

// ---- validation and sampling ----
// Both read the weights after a step: they first apply what the step deferred (optimizer_flush;
// the next step then runs eagerly), run forward passes on their own tokens into the activation
// buffers (the next step recomputes all of them), and leave the data position, the AdamW state
// and the CUDA graph as they were.

typedef struct {
    int* tokens;       // device: each batch's inputs (B*T), then its targets (B*T)
    int n_batches;
    float* batch_loss; // device: each batch's mean loss, then [n_batches] the mean over them
} ValData;

// The first val_tokens tokens of the val data (whole batches of B*T; fewer if the files are short),
// staged on the device once; [data parallel] this rank's slice of them (loader_next), N ranks
// reading val_tokens / N each.
static void val_create(ValData* v, const Model* m, DataLoader* loader, int val_tokens) {
    size_t N = (size_t)m->B * m->T, have = loader_groups(loader), want = (size_t)val_tokens / (N * loader->cfg.world);
    v->n_batches = (int)(want < have ? want : have);
    if (v->n_batches < 1) v->n_batches = 1; // loader_init checked that one batch fits
    int32_t* host = (int32_t*)malloc(v->n_batches * 2 * N * sizeof(int32_t));
    for (int i = 0; i < v->n_batches; i++) next_batch(loader, host + i * 2 * N, host + i * 2 * N + N);
    v->tokens = (int*)device_alloc(v->n_batches * 2 * N * sizeof(int), "val tokens");
    v->batch_loss = (float*)device_alloc((v->n_batches + 1) * sizeof(float), "val losses");
    CUDA_CHECK(cudaMemcpy(v->tokens, host, v->n_batches * 2 * N * sizeof(int), cudaMemcpyHostToDevice));
    free(host);
}
static void val_free(ValData* v) {
    CUDA_CHECK(cudaFree(v->tokens));
    CUDA_CHECK(cudaFree(v->batch_loss));
}

// Mean loss over the val batches, forward only. Waits for the GPU (between steps, not in one).
static float val_loss(Model* m, ValData* v) {
    NVTX_PUSH("val");
    size_t N = (size_t)m->B * m->T;
    optimizer_flush(m);
    for (int i = 0; i < v->n_batches; i++) {
        forward(m, m->B, v->tokens + i * 2 * N, false);
        classifier(m, m->B, v->tokens + i * 2 * N + N, 0, false, false); // (also writes dlogits: unused)
        mean(v->batch_loss + i, m->acts.losses, (int)N, m->stream);
    }
    mean(v->batch_loss + v->n_batches, v->batch_loss, v->n_batches, m->stream);
    if (m->comm) ranks_average(m, v->batch_loss + v->n_batches); // [data parallel] each rank's val slice
    float loss;
    CUDA_CHECK(cudaMemcpyAsync(&loss, v->batch_loss + v->n_batches, sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    NVTX_POP();
    return loss;
}

// [eval] The multiple-choice eval (--eval_file, llama3.h EvalSet): every ending of an example is
// one row (its context, then the ending), B rows to a forward (the rows of several examples, or one
// example's over several forwards), and each row's mean loss over its ending's tokens, from the
// per-token losses on the host; the ending of lowest mean loss is the pick. [data parallel] Rank r
// scores examples r, r + world, ...; the ranks sum their right picks.
typedef struct {
    const EvalSet* set;
    int n_examples; // scored each time: --eval_examples, at most the set's
    int* tokens;    // device: one forward's inputs (B*T), then its targets
    int32_t* host;  // the same, staged
    float* losses;  // host: one forward's per-token losses (B*T)
    int *from, *to; // host: each row's positions whose targets are its ending's tokens (B each)
} EvalData;

static void eval_create(EvalData* e, const Model* m, const EvalSet* set, int n_examples) {
    size_t N = (size_t)m->B * m->T;
    e->set = set, e->n_examples = n_examples > 0 && n_examples < set->n ? n_examples : set->n;
    e->tokens = (int*)device_alloc(2 * N * sizeof(int), "eval tokens");
    e->host = (int32_t*)malloc(2 * N * sizeof(int32_t)), e->losses = (float*)malloc(N * sizeof(float));
    e->from = (int*)malloc(m->B * sizeof(int)), e->to = (int*)malloc(m->B * sizeof(int));
}
static void eval_destroy(EvalData* e) {
    CUDA_CHECK(cudaFree(e->tokens));
    free(e->host), free(e->losses), free(e->from), free(e->to);
}

// One forward of `rows` rows from this rank's row first_row on (its row k: ending k % E of its
// example k / E, the set's rank + (k / E) * world); each row's mean loss over its ending's tokens
// into mean_loss[k].
static void eval_forward(Model* m, const EvalData* e, int first_row, int rows, int rank, int world, double* mean_loss) {
    const EvalSet* s = e->set;
    int T = m->T, E = s->n_endings;
    size_t N = (size_t)m->B * T;
    int *from = e->from, *to = e->to;
    memset(e->host, 0, 2 * N * sizeof(int32_t));
    for (int r = 0; r < rows; r++) {
        int row = first_row + r, example = rank + (row / E) * world;
        eval_row(s, example, row % E, T, e->host + (size_t)r * T, e->host + N + (size_t)r * T, &from[r], &to[r]);
    }
    CUDA_CHECK(cudaMemcpyAsync(e->tokens, e->host, 2 * N * sizeof(int), cudaMemcpyHostToDevice, m->stream));
    forward(m, m->B, e->tokens, false);
    classifier(m, m->B, e->tokens + N, 0, false, false); // (also writes dlogits: unused)
    CUDA_CHECK(cudaMemcpyAsync(e->losses, m->acts.losses, N * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    for (int r = 0; r < rows; r++) {
        double sum = 0;
        for (int t = from[r]; t < to[r]; t++) sum += e->losses[(size_t)r * T + t];
        mean_loss[first_row + r] = sum / (to[r] - from[r]);
    }
}

// The share of the first n_examples examples whose pick is the label. Waits for the GPU.
static float eval_accuracy(Model* m, const EvalData* e) {
    NVTX_PUSH("eval");
    optimizer_flush(m);
    int rank = m->comm ? m->comm->rank : 0, world = world_of(m), E = e->set->n_endings;
    int mine = e->n_examples > rank ? (e->n_examples - rank + world - 1) / world : 0, rows = mine * E;
    double* mean_loss = (double*)malloc(sizeof(double) * (rows ? rows : 1));
    for (int first = 0; first < rows; first += m->B)
        eval_forward(m, e, first, rows - first < m->B ? rows - first : m->B, rank, world, mean_loss);
    int right = 0;
    for (int j = 0; j < mine; j++)
        right += eval_pick(mean_loss + (size_t)j * E, E) == eval_label(e->set, rank + j * world);
    free(mean_loss);
    if (m->comm) right = ranks_sum(m, right);
    NVTX_POP();
    return (float)right / e->n_examples;
}

typedef struct {
    const EvalConfig* cfg; // sample_tokens per sample, temperature (0: greedy), top_k
    int bos;               // the first token (llama3.h bos_token; 0 where there is none)
    int* seq;              // device: the sequence being generated (T ids; unwritten positions 0)
    uint64_t rng;          // the host's own generator (splitmix64): training draws nothing from it
} Sampler;

static float next_uniform(uint64_t* state) { // splitmix64, top 24 bits: [0, 1)
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return (float)((z ^ (z >> 31)) >> 40) / 16777216.0f;
}

// Generates cfg->sample_tokens tokens after s->bos into
// ids[0..sample_tokens]: one forward pass of one sequence (B = 1, the same T) per token, the next id
// drawn on the device from the logits of the last position alone (the forward of one row writes the
// first T rows of the activation buffers).
static void sample_ids(Model* m, Sampler* s, int* ids) {
    NVTX_PUSH("sample");
    int T = m->T, V = m->cfg.vocab_size;
    optimizer_flush(m);
    ids[0] = s->bos;
    CUDA_CHECK(cudaMemsetAsync(s->seq, 0, T * sizeof(int), m->stream));
    CUDA_CHECK(cudaMemcpyAsync(s->seq, ids, sizeof(int), cudaMemcpyHostToDevice, m->stream));
    for (int pos = 0; pos < s->cfg->sample_tokens; pos++) {
        forward(m, 1, s->seq, false);
        head_logits(m, weight_bf16(m, m->layout.head, 0), pos, 1);
        sample_token(s->seq + pos + 1, m->acts.logits, V, s->cfg->temperature, s->cfg->top_k, next_uniform(&s->rng),
                     m->stream);
    }
    CUDA_CHECK(cudaMemcpyAsync(ids, s->seq, (s->cfg->sample_tokens + 1) * sizeof(int), cudaMemcpyDeviceToHost, m->stream));
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    NVTX_POP();
}

// ---- training loop ----

// Tokens of one optimizer step, on all ranks.
static double tokens_per_step(const Model* m) { return (double)m->grad_accum * m->B * m->T * world_of(m); }

static double median(double* v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) { double t = v[j]; v[j] = v[j - 1], v[j - 1] = t; }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// What the loop needs besides the model: the data, the outputs, and the optional parts.
typedef struct {
    DataLoader* loader;
    FILE* json; // NULL: no --log_file; closed at the end
    Saver* saver;   // NULL: no --checkpoint_dir
    ValData* val;   // NULL: no --val_every
    EvalData* eval; // NULL: no --eval_file
    Sampler* sampler; // NULL: no --sample_every
    const Vocab* vocab; // decodes samples
} TrainIO;

// The val loss and the eval accuracy after a step; NaN: not measured.
typedef struct {
    float val_loss, eval_acc;
} Measured;

typedef struct {
    cudaEvent_t start[2], end[2];
    double* ms;
    FILE* json;
    const char* json_path;
    double mem_mib, wall_start;
    int first, logged; // the run's first step; the last step logged
    Measured got[2];   // what was measured after the step in that slot (NaN: nothing)
    StepStats last;    // the last step logged
    Measured last_got; // the last of each measure
} StepLog;

// A write to the JSON log failed (a full disk, /dev/full): the run stops, since a log that ends
// early would read as a shorter run.
static void log_write_failed(const char* path) {
    fprintf(stderr, "error: --log_file %s: write failed: %s\n", path, strerror(errno));
    exit(EXIT_FAILURE);
}

// Step t's line on stdout and in the JSON log.
static void print_step(const Model* m, StepLog* lg, const TrainArgs* a, int t, const StepStats* st, double ms,
                       const Measured* got) {
    double tok_s = tokens_per_step(m) / (ms / 1000.0), elapsed = monotonic_seconds() - lg->wall_start;
    double eta = elapsed / (t - lg->first + 1) * (last_step(a) - t);
    printf("step %4d/%d | loss %.6f | lr %.2e", t, a->optim.sched.total, st->loss, st->lr);
    if (a->optim.grad_clip > 0) printf(" | norm %.4f", st->grad_norm);
    if (got->val_loss == got->val_loss) printf(" | val %.6f", got->val_loss);
    if (got->eval_acc == got->eval_acc) printf(" | eval %.4f", got->eval_acc);
    printf(" | %.2f ms | %.0f tok/s | peak %.0f MiB | %.0f s, ETA %.0f s", ms, tok_s, lg->mem_mib, elapsed, eta);
    if (st->skipped) printf(" | SKIPPED (non-finite loss or norm; %d in a row)", st->bad_in_row);
    printf("\n");
    if (!lg->json) return;
    char loss[32], lr[32], norm[32], vloss[32], extra[128] = ""; // a non-finite value is JSON's null
    int len = a->optim.grad_clip > 0 ? snprintf(extra, sizeof(extra), ", \"grad_norm\": %s",
                                          json_number(norm, sizeof(norm), "%.6g", st->grad_norm)) : 0;
    if (got->val_loss == got->val_loss)
        len += snprintf(extra + len, sizeof(extra) - len, ", \"val_loss\": %s",
                        json_number(vloss, sizeof(vloss), "%.6f", got->val_loss));
    if (got->eval_acc == got->eval_acc)
        snprintf(extra + len, sizeof(extra) - len, ", \"eval_acc\": %.6f", got->eval_acc);
    if (fprintf(lg->json, "{\"step\": %d, \"loss\": %s, \"lr\": %s%s, \"skipped\": %d, \"ms\": %.3f, "
                "\"tok_per_s\": %.1f, \"peak_mib\": %.0f}\n", t, json_number(loss, sizeof(loss), "%.6f", st->loss),
                json_number(lr, sizeof(lr), "%.6g", st->lr), extra, st->skipped, ms, tok_s, lg->mem_mib) < 0 ||
        fflush(lg->json) != 0)
        log_write_failed(lg->json_path);
}

// Waits for step t (staged in slot t % 2) to finish, prints its line, and stops the run when the
// NaN guard has skipped --max_bad_steps steps in a row (the weights are then those of the last
// good step, and so is any checkpoint written since: skipped steps change nothing).
static void log_step(Model* m, StepLog* lg, const TrainArgs* a, Saver* saver, int t) {
    int slot = t % 2;
    CUDA_CHECK(cudaEventSynchronize(lg->end[slot]));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, lg->start[slot], lg->end[slot]));
    lg->ms[t - 1] = ms;
    // Device memory in use, the most seen so far: the buffers are all allocated before step 1, but
    // the CUDA graph's own memory arrives while step 2 is captured and instantiated.
    size_t free_b, total_b;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    lg->mem_mib = fmax(lg->mem_mib, (total_b - free_b) / 1048576.0);
    StepStats st = m->stats_host[slot];
    const Measured* got = &lg->got[slot];
    print_step(m, lg, a, t, &st, ms, got);
    lg->last = st, lg->logged = t;
    if (got->val_loss == got->val_loss) lg->last_got.val_loss = got->val_loss;
    if (got->eval_acc == got->eval_acc) lg->last_got.eval_acc = got->eval_acc;
    if (st.bad_in_row < a->loop.max_bad_steps) return;
    if (saver) saver_join(saver);
    fprintf(stderr, "error: steps %d..%d had a non-finite loss or gradient norm (--max_bad_steps %d): stopping; their "
            "updates were skipped, the weights are step %d's%s\n", t - st.bad_in_row + 1, t, a->loop.max_bad_steps,
            t - st.bad_in_row, saver ? " (checkpoints written since hold them too)" : "");
    exit(EXIT_FAILURE);
}

// Every `every` steps and after this invocation's last (every 0: never).
static bool due(int every, int t, const TrainArgs* a) { return every > 0 && (t % every == 0 || t == last_step(a)); }
// A checkpoint is also written after this invocation's last step when --checkpoint_every is 0.
static bool checkpoint_due(const TrainArgs* a, int t) { return t == last_step(a) || due(a->ckpt.every, t, a); }

// A sample after step t: printed decoded, and its ids as one JSON line.
static void log_sample(Model* m, const StepLog* lg, const TrainIO* io, int t) {
    int n = io->sampler->cfg->sample_tokens + 1, *ids = (int*)malloc(n * sizeof(int));
    sample_ids(m, io->sampler, ids);
    printf("sample at step %d (%s): ", t, io->sampler->cfg->temperature > 0 ? "sampled" : "greedy");
    vocab_print(stdout, io->vocab, ids, n);
    printf("\n");
    if (lg->json) {
        if (fprintf(lg->json, "{\"step\": %d, \"sample_ids\": [", t) < 0) log_write_failed(lg->json_path);
        for (int i = 0; i < n; i++)
            if (fprintf(lg->json, "%s%d", i ? ", " : "", ids[i]) < 0) log_write_failed(lg->json_path);
        if (fprintf(lg->json, "]}\n") < 0 || fflush(lg->json) != 0) log_write_failed(lg->json_path);
    }
    free(ids);
}

// The val loss, the eval accuracy and a sample after step t, when due; the step's line first (all
// wait for the GPU).
static void evaluate(Model* m, StepLog* lg, const TrainArgs* a, const TrainIO* io, int t) {
    bool val = io->val && due(a->eval.val_every, t, a), scored = io->eval && due(a->eval.eval_every, t, a);
    bool sample = io->sampler && due(a->eval.sample_every, t, a);
    if (!val && !scored && !sample) return;
    Measured* got = &lg->got[t % 2];
    if (val) got->val_loss = val_loss(m, io->val);
    if (scored) got->eval_acc = eval_accuracy(m, io->eval);
    log_step(m, lg, a, io->saver, t);
    got->val_loss = got->eval_acc = NAN;
    if (sample) log_sample(m, lg, io, t);
}

// Model FLOPs per token of a training step (forward and backward, PaLM's appendix B): 6 per
// matmul weight (lm_head included; not the embedding lookup) plus attention's 12 * L * T * C.
static double flops_per_token(const Model* m) {
    const ParamLayout* p = &m->layout;
    return 6.0 * (p->matmul_end - p->shadow_begin) + 12.0 * m->cfg.n_layer * m->T * m->cfg.n_embd;
}
// Dense bf16 peak of this rank's GPU from its name (0: not known here).
static double peak_flops(void) {
    cudaDeviceProp prop;
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    if (strstr(prop.name, "H100") || strstr(prop.name, "H200")) return 989.4e12;
    if (strstr(prop.name, "A100")) return 312e12;
    return 0;
}

// The end of the run: tokens, time, throughput, MFU, the last losses.
static void print_summary(const Model* m, const StepLog* lg, const TrainArgs* a, double wall) {
    int n = last_step(a) - lg->first + 1;
    double tokens = n * tokens_per_step(m), tok_s = tokens / wall, peak = peak_flops();
    printf("done: %d steps, %.0f tokens in %.1f s, %.0f tok/s", n, tokens, wall, tok_s);
    if (peak > 0) printf(", MFU %.1f%%", 100.0 * flops_per_token(m) * tok_s / (peak * world_of(m)));
    printf(" | last loss %.6f", lg->last.loss);
    if (lg->last_got.val_loss == lg->last_got.val_loss) printf(", val %.6f", lg->last_got.val_loss);
    if (lg->last_got.eval_acc == lg->last_got.eval_acc) printf(", eval %.4f", lg->last_got.eval_acc);
    if (lg->last.skipped_total) printf(" | %d steps skipped (non-finite)", lg->last.skipped_total);
    printf("\n");
    if (n > 1) {
        double* ms = (double*)malloc((n - 1) * sizeof(double));
        memcpy(ms, lg->ms + lg->first, (n - 1) * sizeof(double));
        double med = median(ms, n - 1), med_tok_s = tokens_per_step(m) / (med / 1000.0);
        printf("steady state (steps %d..%d): median %.2f ms/step, %.0f tok/s", lg->first + 1, last_step(a), med,
               med_tok_s);
        if (peak > 0) printf(", MFU %.1f%%", 100.0 * flops_per_token(m) * med_tok_s / (peak * world_of(m)));
        printf(", peak %.0f MiB\n", lg->mem_mib);
        free(ms);
    }
}

// [data parallel] The loop's sign of progress for the watchdog (comm_start): the last step done, and
// when (monotonic ms).
static uint64_t heartbeat_ms; // when the loop last made progress (monotonic ms; __atomic)
static int heartbeat_step;
static void heartbeat(int step) {
    __atomic_store_n(&heartbeat_step, step, __ATOMIC_RELAXED);
    __atomic_store_n(&heartbeat_ms, (uint64_t)(monotonic_seconds() * 1000), __ATOMIC_RELEASE);
}

// The training loop from step `first` (1, or the step after a resumed checkpoint) to last_step(a)
// (the schedule runs to --num_iteration either way). Each step's line is printed while the next
// step runs.
static void train(Model* m, const TrainArgs* a, const TrainIO* io, int first) {
    StepLog lg = {};
    lg.ms = (double*)calloc(a->optim.sched.total, sizeof(double));
    lg.json = io->json, lg.json_path = a->loop.log_file, lg.first = first, lg.logged = first - 1;
    lg.got[0] = lg.got[1] = lg.last_got = Measured{NAN, NAN};
    for (int s = 0; s < 2; s++) CUDA_CHECK(cudaEventCreate(&lg.start[s])), CUDA_CHECK(cudaEventCreate(&lg.end[s]));
    lg.wall_start = monotonic_seconds();
    int last = last_step(a);
    for (int t = first; t <= last; t++) {
        int slot = t % 2;
        CUDA_CHECK(cudaEventSynchronize(lg.end[slot])); // step t-2 used this staging slot
        stage_batches(m, io->loader, slot);
        CUDA_CHECK(cudaEventRecord(lg.start[slot], m->stream));
        train_step(m, slot);
        if (io->saver && checkpoint_due(a, t)) checkpoint_save(m, io->saver, a, io->loader, t);
        CUDA_CHECK(cudaEventRecord(lg.end[slot], m->stream));
        if (lg.logged < t - 1) log_step(m, &lg, a, io->saver, t - 1);
        evaluate(m, &lg, a, io, t);
        heartbeat(t); // [data parallel] the watchdog's sign of progress
    }
    if (lg.logged < last) log_step(m, &lg, a, io->saver, last);
    optimizer_flush(m); // (nothing left after a save of the last step)
    if (io->saver) saver_join(io->saver), printf("checkpoint: %s/step_%08d\n", a->ckpt.dir, last);
    double wall = monotonic_seconds() - lg.wall_start;
    printf("wall time of the loop: %.3f s for %d steps%s\n", wall, last - first + 1,
           io->saver ? " (the last checkpoint written included)" : "");
    print_summary(m, &lg, a, wall);
    if (lg.json && fclose(lg.json) != 0) log_write_failed(lg.json_path);
    for (int s = 0; s < 2; s++) {
        CUDA_CHECK(cudaEventDestroy(lg.start[s]));
        CUDA_CHECK(cudaEventDestroy(lg.end[s]));
    }
    free(lg.ms);
}

#ifndef TESTING
// ---- main ----

// The default data set, linked into the binary (see the Makefile): LLaMA-3 tokens of
// tiny shakespeare, so that `./train_llama3` runs with no files at all.
extern "C" const unsigned char _binary_data_tiny_shakespeare_train_bin_start[];
extern "C" const unsigned char _binary_data_tiny_shakespeare_train_bin_end[];
extern "C" const unsigned char _binary_data_tiny_shakespeare_val_bin_start[];
extern "C" const unsigned char _binary_data_tiny_shakespeare_val_bin_end[];
// The LLaMA-3 vocabulary as bytes (scripts/prepare_data.py), for printing samples.
extern "C" const unsigned char _binary_data_llama3_vocab_bin_start[];
extern "C" const unsigned char _binary_data_llama3_vocab_bin_end[];

// One line on stderr, and for a command-line error where to find the flags.
static void die(const char* msg, const char* prog, bool usage) {
    if (usage) fprintf(stderr, "error: %s%s (%s --help lists the flags)\n", rank_tag, msg, prog);
    else fprintf(stderr, "error: %s%s\n", rank_tag, msg);
    exit(EXIT_FAILURE);
}

// A flag's token files (its value `spec`: a file, a glob or a list), or (spec NULL) the embedded
// split [begin, end), parsed into `embedded`; no token file may be the --log_file.
static void open_source(TokenSource* s, TokenData* embedded, const char* flag, const char* spec,
                        const unsigned char* begin, const unsigned char* end, const char* embedded_name,
                        const TrainArgs* a, int vocab_size) {
    char err[L3_ERR_LEN];
    if (spec ? token_source_open(s, spec, flag, vocab_size, err)
             : tokens_parse(embedded, begin, end - begin, embedded_name, vocab_size, err))
        die(err, "", false);
    if (!spec) token_source_memory(s, embedded, embedded_name, vocab_size);
    if (a->loop.log_file && source_holds(s, a->loop.log_file)) {
        snprintf(err, sizeof(err), "--log_file %s is one of %s %s, an input: not overwritten", a->loop.log_file, flag,
                 spec);
        die(err, "", false);
    }
}

// What main needs of the inputs: the model (its file, or none: random init), for a resume the
// checkpoint's state file and header, the val data and the vocabulary when used.
typedef struct {
    const char* model_path; // --hf_dir, --llmc_filepath, the checkpoint's model.bin, or NULL
    char resume_model[L3_PATH_LEN], resume_state[L3_PATH_LEN];
    CheckpointState st;
    const char* val_path; // --val_bin, the NAME_val.bin beside --input_bin, or NULL: the embedded val split
    char val_beside[L3_PATH_LEN];
    TokenSource train_source, val_source; // val: with --val_every
    TokenData train_embedded, val_embedded; // the embedded splits, when used
    DataLoader val_loader;
    EvalSet eval_set; // with --eval_file
    Vocab vocab; // with --sample_every
    Output outputs[MAX_OUTPUTS]; // this rank's outputs, each checked writable
    int n_outputs;
} RunInputs;

// The val data (--val_bin or the embedded val split) and the vocabulary, when the run uses them.
static void check_eval_inputs(const TrainArgs* a, const Llama3Config* cfg, RunInputs* in, const char* prog) {
    char err[L3_ERR_LEN];
    if (a->eval.val_every) {
        in->val_path = a->eval.val_bin;
        if (!a->eval.val_bin && a->loop.input_bin) {
            if (val_path_beside(a->loop.input_bin, in->val_beside, err)) die(err, prog, false);
            in->val_path = in->val_beside;
        }
        open_source(&in->val_source, &in->val_embedded, "--val_bin", in->val_path,
                    _binary_data_tiny_shakespeare_val_bin_start, _binary_data_tiny_shakespeare_val_bin_end,
                    "embedded data/tiny_shakespeare_val.bin", a, cfg->vocab_size);
        LoaderConfig lc = loader_config(a, false);
        if (loader_init(&in->val_loader, &in->val_source, &lc, err)) die(err, prog, false);
    }
    if (a->eval.eval_file && eval_read(&in->eval_set, a->eval.eval_file, cfg->vocab_size, a->loop.sequence_length, err))
        die(err, prog, false);
    const unsigned char* v = _binary_data_llama3_vocab_bin_start;
    if (a->eval.sample_every &&
        vocab_parse(&in->vocab, v, _binary_data_llama3_vocab_bin_end - v, "embedded data/llama3_vocab.bin", err))
        die(err, prog, false);
}

// Every input, checked before the GPU is touched: no output names an input, the model file (header,
// size, llm.c's biases), a resumed checkpoint (its files, and that it continues this run), the flags
// against the model, the token file and enough tokens for one batch, that the checkpoint folder
// holds no later checkpoint of another run, and that every output can be written. Nothing is
// written here (open_outputs does that).
static void check_inputs(const TrainArgs* a, Llama3Config* cfg, ModelFileFormat* fmt, DataLoader* loader,
                         RunInputs* in, const char* prog) {
    char err[L3_ERR_LEN];
    if (outputs_check(a, err) || shape_args_check(a, err)) die(err, prog, false);
    in->model_path = a->loop.hf_dir ? a->loop.hf_dir : a->loop.llmc_filepath;
    if (a->ckpt.resume) {
        if (checkpoint_resolve(a->ckpt.resume, in->resume_model, in->resume_state, err))
            die(err, prog, false);
        in->model_path = in->resume_model;
    }
    if (a->loop.hf_dir) {
        HfModel hf;
        if (hf_model_open(a->loop.hf_dir, &hf, err)) die(err, prog, false);
        *cfg = hf.cfg, *fmt = MODEL_FILE_HF;
        hf_model_free(&hf);
    } else if (in->model_path && (model_header_read(in->model_path, cfg, fmt, err) ||
                                  model_file_check(in->model_path, cfg, *fmt, err))) {
        die(err, prog, false);
    }
    if (a->ckpt.resume && state_header_read(in->resume_state, param_layout(cfg).total, &in->st, err)) die(err, prog, false);
    if (train_args_check(a, cfg, err)) die(err, prog, false);
    open_source(&in->train_source, &in->train_embedded, "--input_bin", a->loop.input_bin,
                _binary_data_tiny_shakespeare_train_bin_start, _binary_data_tiny_shakespeare_train_bin_end,
                "embedded data/tiny_shakespeare_train.bin", a, cfg->vocab_size);
    LoaderConfig lc = loader_config(a, true);
    if (loader_init(loader, &in->train_source, &lc, err)) die(err, prog, false);
    if (a->ckpt.resume) {
        LoaderPos at = {in->st.loader_epoch, in->st.loader_shard, in->st.loader_group};
        if (resume_check(&in->st, a, &in->train_source, a->ckpt.resume, err) || loader_seek(loader, at, err))
            die(err, prog, false);
    }
    check_eval_inputs(a, cfg, in, prog);
    int start = a->ckpt.resume ? in->st.step : 0;
    if ((a->ckpt.dir && checkpoint_dir_check(a->ckpt.dir, start, err)) ||
        outputs_writable(a, cfg, start, in->outputs, &in->n_outputs, err))
        die(err, prog, false);
}

// The NCCL version of the library loaded (0 without NCCL).
static int nccl_version(void) {
    int v = 0;
#if LLAMA3_NCCL
    NCCL_CHECK(ncclGetVersion(&v));
#endif
    return v;
}

// The GPU, before anything is allocated on it: one that is there (CUDA's own error named when not),
// this rank's (its local rank's; two ranks may share one only as NCCL allows), of a compute
// capability the build runs on, with this build's kernels loadable on it.
static void gpu_start(const RankEnv* ranks, const char* prog) {
    char err[L3_ERR_LEN];
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        snprintf(err, sizeof(err), "no CUDA device found (%s: %s); train_llama3 needs an NVIDIA GPU of compute "
                 "capability %d.%d or newer", e != cudaSuccess ? cudaGetErrorName(e) : "cudaGetDeviceCount",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices", LLAMA3_MIN_COMPUTE_CAPABILITY / 10,
                 LLAMA3_MIN_COMPUTE_CAPABILITY % 10);
        die(err, prog, false);
    }
    int device = 0;
    const char* shared = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    if (rank_device(ranks, n_dev, shared && !strcmp(shared, "1") && nccl_version() >= 23000, &device, err))
        die(err, prog, false);
    CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    if (gpu_check(prop.major, prop.minor, prop.name, err)) die(err, prog, false);
    cudaFuncAttributes attr;
    if ((e = cudaFuncGetAttributes(&attr, init_params_kernel<float>)) != cudaSuccess) {
        snprintf(err, sizeof(err), "GPU %d (%s, compute capability %d.%d): this build has no kernels for it (%s); "
                 "rebuild with make GENCODE=\"-gencode arch=compute_%d%d,code=sm_%d%d\"", device, prop.name, prop.major,
                 prop.minor, cudaGetErrorString(e), prop.major, prop.minor, prop.major, prop.minor);
        die(err, prog, false);
    }
}

// ---- data parallel: the ranks' start and watchdog ----
// [data parallel] Every wait on the other ranks ends after --nccl_timeout with a message naming what
// did not come: the rendezvous (llama3.h), NCCL's start (in a thread the main thread waits for), and
// each step (a watchdog thread: NCCL's asynchronous error, or no step finished in time, as when a
// rank died and the others wait in a collective). It aborts the communicator and ends the process.

#if LLAMA3_NCCL
typedef struct {
    Comm* comm;
    ncclUniqueId id;
    int device;
    ncclResult_t result;
    int done; // __atomic
} NcclStart;

static void* nccl_start_thread(void* arg) {
    NcclStart* st = (NcclStart*)arg;
    cudaSetDevice(st->device); // (a thread's own current device)
    st->result = ncclCommInitRank(&st->comm->nccl, st->comm->world, st->id, st->comm->rank);
    __atomic_store_n(&st->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int watchdog_timeout_s; // --nccl_timeout
static int watchdog_ending;    // __atomic: at the last barrier; a rank past it may close its connections
static int watchdog_stop;      // __atomic: the run is over

static void* watchdog_thread(void* arg) {
    const Comm* c = (const Comm*)arg;
    while (!__atomic_load_n(&watchdog_stop, __ATOMIC_ACQUIRE)) {
        usleep(200 * 1000);
        ncclResult_t async;
        const char* why = NULL;
        char msg[256];
        if (!__atomic_load_n(&watchdog_ending, __ATOMIC_ACQUIRE) && ncclCommGetAsyncError(c->nccl, &async) == ncclSuccess &&
            async != ncclSuccess && async != ncclInProgress) {
            snprintf(msg, sizeof(msg), "NCCL failed: %s (another rank stopped?)", ncclGetErrorString(async));
            why = msg;
        }
        double idle = monotonic_seconds() - __atomic_load_n(&heartbeat_ms, __ATOMIC_ACQUIRE) / 1000.0;
        if (!why && idle > watchdog_timeout_s) {
            snprintf(msg, sizeof(msg), "no step finished for %d s after step %d (--nccl_timeout): another rank stopped "
                     "or hangs", watchdog_timeout_s, __atomic_load_n(&heartbeat_step, __ATOMIC_RELAXED));
            why = msg;
        }
        if (!why) continue;
        fprintf(stderr, "error: %s%s\n", rank_tag, why);
        ncclCommAbort(c->nccl);
        _exit(EXIT_FAILURE);
    }
    return NULL;
}

// This rank's communicator: rank 0's NCCL id handed out by the rendezvous (with the configuration
// hash every rank must match), NCCL's start within the timeout, the rendezvous file removed once
// every rank has joined, and the watchdog started.
static Comm* comm_start(const RankEnv* ranks, const TrainArgs* a, const Llama3Config* cfg, const char* prog) {
    char err[L3_ERR_LEN];
    RendezvousSpec spec;
    static NcclStart st; // (read by its thread after a timeout: not on the stack)
    st.comm = (Comm*)calloc(1, sizeof(Comm));
    st.comm->rank = ranks->rank, st.comm->world = ranks->world;
    CUDA_CHECK(cudaGetDevice(&st.device));
    if (rendezvous_parse(a->dist.rendezvous, &spec, err)) die(err, prog, false);
    if (ranks->rank == 0) NCCL_CHECK(ncclGetUniqueId(&st.id));
    static_assert(sizeof(ncclUniqueId) == RENDEZVOUS_ID_BYTES, "NCCL's id is the rendezvous's 128 bytes");
    if (rendezvous(&spec, ranks->rank, ranks->world, run_config_hash(a, cfg), (unsigned char*)&st.id,
                   a->dist.timeout_s, err))
        die(err, prog, false);
    pthread_t t;
    if (pthread_create(&t, NULL, nccl_start_thread, &st) != 0) die("cannot start a thread for NCCL's start", prog, false);
    double end = monotonic_seconds() + a->dist.timeout_s;
    while (!__atomic_load_n(&st.done, __ATOMIC_ACQUIRE)) {
        if (monotonic_seconds() > end) {
            fprintf(stderr, "error: %sNCCL's start did not complete within %d s (--nccl_timeout): not every rank "
                    "joined (one that stopped says why)\n", rank_tag, a->dist.timeout_s);
            _exit(EXIT_FAILURE); // (the thread waits in NCCL)
        }
        usleep(10 * 1000);
    }
    pthread_join(t, NULL);
    NCCL_CHECK(st.result);
    if (ranks->rank == 0 && !spec.tcp) unlink(spec.path); // every rank has read it
    watchdog_timeout_s = a->dist.timeout_s;
    heartbeat(0);
    if (pthread_create(&st.comm->watchdog, NULL, watchdog_thread, st.comm) != 0)
        die("cannot start the watchdog thread", prog, false);
    printf("ranks: %d, NCCL %d, ZeRO-1 over the ranks (the rendezvous by %s)\n", ranks->world, nccl_version(),
           spec.tcp ? "tcp" : "file");
    return st.comm;
}
// The run is over on this rank: a last barrier (an all-reduce every rank reaches after its last
// step; a rank that passed it may close its connections, which the watchdog no longer takes for a
// failure, but it still bounds the wait), then the watchdog stopped and the communicator.
static void comm_end(Comm* c) {
    int* one = (int*)device_alloc(sizeof(int), "the last barrier");
    CUDA_CHECK(cudaMemset(one, 0, sizeof(int)));
    __atomic_store_n(&watchdog_ending, 1, __ATOMIC_RELEASE);
    heartbeat(__atomic_load_n(&heartbeat_step, __ATOMIC_RELAXED)); // (the barrier waits for the slowest rank)
    all_reduce(c->nccl, one, one, 1, COMM_SUM, 0);
    CUDA_CHECK(cudaStreamSynchronize(0));
    CUDA_CHECK(cudaFree(one));
    __atomic_store_n(&watchdog_stop, 1, __ATOMIC_RELEASE);
    pthread_join(c->watchdog, NULL);
    NCCL_CHECK(ncclCommDestroy(c->nccl));
    free(c);
}
#else
static Comm* comm_start(const RankEnv*, const TrainArgs*, const Llama3Config*, const char* prog) {
    die("internal error: several ranks in a train_llama3 built without NCCL", prog, false); // (rank_env_check)
    return NULL;
}
static void comm_end(Comm*) {}
#endif

// The outputs, opened only once everything that can fail before step 1 has passed (inputs, GPU,
// memory, the model loaded): the checkpoint folder, and the JSON log (returned; NULL: none), which
// a resumed run continues (log_open).
static FILE* open_outputs(const TrainArgs* a, const RunInputs* in, const char* prog) {
    char err[L3_ERR_LEN];
    if (a->ckpt.dir && make_dir(a->ckpt.dir, err)) die(err, prog, false);
    FILE* log_json = NULL;
    if (a->loop.log_file && !(log_json = log_open(a->loop.log_file, a->ckpt.resume ? in->st.step : 0, err))) die(err, prog, false);
    return log_json;
}

// The run's inputs and the model as created: what the log's reader needs to repeat the run.
static void print_setup(const TrainArgs* a, const Llama3Config* cfg, ModelFileFormat fmt, const RunInputs* in) {
    if (in->model_path) printf("model: %s, %s format\n", in->model_path, model_format_name(fmt));
    else printf("model: %s shape, random init (seed %llu)\n", SHAPE_NAMES[a->loop.shape], a->loop.seed);
    if (a->ckpt.resume)
        printf("resume: %s at step %d, data position: epoch %llu, shard %llu, step %llu of the shard\n",
               in->resume_state, in->st.step, (unsigned long long)in->st.loader_epoch,
               (unsigned long long)in->st.loader_shard, (unsigned long long)in->st.loader_group);
    config_print(stdout, cfg);
    const TokenSource* s = &in->train_source;
    printf("data: %s, %zu tokens", a->loop.input_bin ? a->loop.input_bin : "embedded tiny shakespeare (LLaMA-3 tokens)",
           s->total);
    if (s->n > 1) printf(" in %d files", s->n);
    printf(", %s\n", a->loop.shuffle ? "shuffled per epoch (--shuffle 1)" : "in order (--shuffle 0)");
    if (a->loop.doc_mask) // [document mask]
        printf("documents: each starts at token %d, attention within each (training, val loss, eval and samples "
               "alike); positions absolute\n", bos_token(&a->loop, cfg));
    outputs_print(stdout, in->outputs, in->n_outputs);
}
// [data parallel] The buffer bytes of one rank's collectives in an optimizer step (NCCL's count times
// the element size; a ring moves about (world - 1) / world of each across the links): the gradients
// reduce-scattered (bf16 or fp32, as the backward writes them; a tail all-reduced) and the weights
// all-gathered (matmul weights' bf16 shadows or [fp8] the block linears' e4m3 copies, fp32 norms,
// both for a tied wte), and for the sparse embedding the union's rows.
static void print_comm_bytes(const Model* m) {
    const Comm* c = m->comm;
    double reduced = 0, gathered = 0, fp8_saved = 0;
    for (int j = 0; j < m->tab.n_slices; j++) {
        const TensorSlice* w = &m->tab.slice[j];
        RangeShard sh = c->zero.shard[w->tensor];
        if (sparse_wte(m, w->tensor)) {
            reduced += (double)n_union(m) * m->cfg.n_embd * 4;
            continue;
        }
        reduced += (double)w->n * (grad_is_bf16(m, w->offset) ? 2 : 4);
        if (!sh.part) continue;
        double gathered_n = (double)sh.part * c->world;
        GatheredCopies g = gathered_copies(m, w->tensor, w->layer); // (shard_gather's)
        gathered += gathered_n * (g.fp8 + 2 * g.shadow + 4 * g.fp32);
        if (g.fp8) fp8_saved += gathered_n; // (a bf16 copy's 2 bytes a weight)
    }
    printf("collectives per optimizer step on each rank: %.3f GiB of gradients reduced, %.3f GiB of weights gathered",
           reduced / 1073741824.0, gathered / 1073741824.0);
    if (fp8_saved) printf(" (the block linears as e4m3: %.3f GiB less than their bf16 copies)", fp8_saved / 1073741824.0);
    printf("\n");
}

// The model as created: its size and memory, every flag's value, and the step's plan (which
// optimisations take effect for this model and batch, and when each AdamW group runs).
// [chunked classifier] Its chunks for the micro-batch, and their logits' memory.
static void print_classifier(const Model* m) {
    long long N = (long long)m->B * m->T, chunks = (N + m->head_rows - 1) / m->head_rows;
    printf("classifier: %lld rows in %lld chunk%s of %d, logits %.2f GiB\n", N, chunks, chunks > 1 ? "s" : "",
           m->head_rows, logits_bytes(m) / 1073741824.0);
}
// The model's memory on each GPU by part (`parts`), and its activations at each --recompute level.
static void print_memory(const Model* m, const MemoryParts* parts) {
    printf("memory: ");
    memory_print(stdout, parts);
    bool flash = m->sw.flash_attention;
    printf("\nactivations at --recompute 0, 1, 2: %.1f, %.1f, %.1f MiB\n",
           acts_bytes_at(m, RECOMPUTE_NONE, flash) / 1048576.0, acts_bytes_at(m, RECOMPUTE_NORMS, flash) / 1048576.0,
           acts_bytes_at(m, RECOMPUTE_BLOCKS, flash) / 1048576.0);
    print_classifier(m);
}
static void print_model(const Model* m, const TrainArgs* a) {
    printf("params: %zu | B %d | T %d | grad_accum %d | lr %g | wd %g\n", m->layout.total, m->B, m->T, m->grad_accum,
           m->optim.cfg.sched.peak_lr, m->optim.cfg.weight_decay);
    MemoryParts parts = memory_parts(m);
    print_memory(m, &parts);
    train_args_print(stdout, a);
    printf("in effect: bf16_grads %d", m->grad_bf16.end > m->grad_bf16.begin);
    if (m->grad_bf16.begin > m->layout.matmul_begin) printf(" (not lm_head's: it sums the classifier's chunks in fp32)");
    printf(", attention %s", !m->sw.flash_attention                  ? "unfused (cuBLASLt and a softmax kernel)"
                             : flash_uses_wgmma(head_shape(m, m->B)) ? "flash, TMA + wgmma (sm_90a)"
                                                                     : "flash, mma.sync");
    if (a->sw.sparse_embedding && !m->sw.sparse_embedding) // [tied embeddings] (switches_for_model)
        printf(", sparse_embedding 0: tied embeddings, the head GEMM writes every row of wte's gradient");
    printf("\n");
    step_plan_print(stdout, m->step.plan);
    if (m->comm) // [data parallel] what ZeRO-1 saves on each GPU
        printf("ZeRO-1 over %d ranks: AdamW's m and v %.2f GiB on each rank (%.2f GiB on one; the embedding's state "
               "%s)\n", m->comm->world, 2.0 * optimizer_moment_bytes(&m->optim) / 1073741824.0,
               2.0 * m->layout.total * moment_bytes(m->optim.cfg.moments) / 1073741824.0,
               m->sw.sparse_embedding ? "whole on every rank: its sparse rows are updated by all" : "sharded too");
    if (m->comm) print_comm_bytes(m);
}

// --dry_run 1, once the flags and inputs passed their checks: the model as model_create would size it
// on this rank and its memory (on a GPU of DRY_RUN_SMS multiprocessors, which size one scratch of a
// few MiB), with no GPU started and nothing written.
#define DRY_RUN_SMS 132 // an H100 SXM's
static int dry_run(const TrainArgs* a, const Llama3Config* cfg, const RankEnv* ranks) {
    Comm shard = {}; // [data parallel] the rank and world alone: this rank's share of AdamW's state
    shard.rank = ranks->rank, shard.world = ranks->world;
    RunConfig run = run_config(a, cfg);
    Model m;
    model_size(&m, cfg, &run, ranks->world > 1 ? &shard : NULL, DRY_RUN_SMS);
    MemoryParts parts = memory_parts(&m);
    print_memory(&m, &parts);
    if (m.comm) print_comm_bytes(&m);
    // What a run finds free on each card, smallest first: an H100's 79.65 GiB less the 0.5-0.6 GiB that
    // the CUDA context took in runs on 2026-12-06; an H200's about 139 GiB as its machine's notes give it.
    const struct { const char* card; double gib; } cards[] = {{"80 GB (H100, about 79 GiB free)", 79.0},
                                                              {"141 GB (H200, about 139 GiB free)", 139.0}};
    double need = memory_needed(&parts) / 1073741824.0;
    printf("fits, with %.2f GiB for code and libraries: ", RUN_OVERHEAD_BYTES / 1073741824.0);
    for (size_t i = 0; i < sizeof(cards) / sizeof(cards[0]); i++)
        printf("%s%s %s", i ? ", " : "", cards[i].card, need <= cards[i].gib ? "yes" : "no");
    char advice[1024];
    model_fit_advice(&m, &parts, advice, sizeof(advice));
    if (need > cards[0].gib) printf(". Smaller: %s", advice);
    printf("\n");
    model_host_free(&m);
    printf("dry run: the flags, inputs and outputs pass every check made before the GPU; nothing was written\n");
    return 0;
}

// The launcher's rank variables, through getenv (rank_env_read takes a lookup so that the host tests
// can give it their own).
static const char* env_lookup(const char* name) { return getenv(name); }

// The weights: a model file, a checkpoint (with its AdamW state and data position), or random init.
static void model_start(Model* m, const TrainArgs* a, ModelFileFormat fmt, RunInputs* in, const char* prog) {
    char err[L3_ERR_LEN];
    if (in->model_path) {
        if (model_load(m, in->model_path, fmt, err)) die(err, prog, false);
    } else {
        model_init_random(m, a->loop.seed);
    }
    if (a->ckpt.resume) checkpoint_restore(m, in->resume_state, &in->st);
}

int main(int argc, char** argv) {
    char err[L3_ERR_LEN];
    setvbuf(stdout, NULL, _IOLBF, 0); // a line at a time under tee, nohup or a scheduler, in order with stderr
    RankEnv ranks;
    char env_err[L3_ERR_LEN];
    int env_bad = rank_env_read(env_lookup, &ranks, env_err); // (refused after --help: one rank meanwhile)
    TrainArgs a;
    if (train_args_parse(&a, argc, argv, ranks.world, err)) die(err, argv[0], true);
    if (a.help || a.list_switches) {
        a.help ? print_usage(stdout, argv[0]) : print_switches(stdout);
        return 0;
    }
    if (env_bad) die(env_err, argv[0], false);
    if (rank_env_check(&ranks, LLAMA3_NCCL ? INT_MAX : 1, err)) die(err, argv[0], false);
    a.loop.rank = ranks.rank;
    if (ranks.world > 1) snprintf(rank_tag, sizeof(rank_tag), "rank %d: ", ranks.rank);
    if (ranks.rank > 0 && !freopen("/dev/null", "w", stdout)) die("cannot silence stdout", argv[0], false); // rank 0 prints
    rank_env_print(stdout, &ranks);
    Llama3Config cfg = family_config(a.loop.shape); // (a model file's header replaces it)
    ModelFileFormat fmt = MODEL_FILE_SEED;
    DataLoader loader;
    static RunInputs in; // (two paths of 4 KB: not on the stack)
    check_inputs(&a, &cfg, &fmt, &loader, &in, argv[0]);
    print_setup(&a, &cfg, fmt, &in);
    if (a.loop.dry_run) return dry_run(&a, &cfg, &ranks);
    gpu_start(&ranks, argv[0]);
    Comm* comm = ranks.world > 1 ? comm_start(&ranks, &a, &cfg, argv[0]) : NULL;

    Model m;
    RunConfig run = run_config(&a, &cfg);
    model_create(&m, &cfg, &run, comm);
    print_model(&m, &a);
    model_start(&m, &a, fmt, &in, argv[0]);
    static Saver saver;
    ValData val;
    EvalData eval;
    int bos = bos_token(&a.loop, &cfg);
    Sampler sampler = {&a.eval, bos >= 0 ? bos : 0, NULL, a.loop.seed ^ 0x5a4d504cULL};
    TrainIO io = {&loader, NULL, a.ckpt.dir ? &saver : NULL, a.eval.val_every ? &val : NULL,
                  a.eval.eval_file ? &eval : NULL, a.eval.sample_every && ranks.rank == 0 ? &sampler : NULL,
                  &in.vocab}; // (samples: rank 0's)
    if (io.saver) saver_create(&saver, &m, &a);
    if (io.val) {
        val_create(&val, &m, &in.val_loader, a.eval.val_tokens);
        printf("val: %d batches of %d x %d from %s\n", val.n_batches, m.B, m.T,
               in.val_path ? in.val_path : "the embedded val split");
    }
    if (io.eval) {
        eval_create(&eval, &m, &in.eval_set, a.eval.eval_examples);
        printf("eval: %d examples of %d endings from %s\n", eval.n_examples, in.eval_set.n_endings, a.eval.eval_file);
    }
    if (io.sampler) sampler.seq = (int*)device_alloc(m.T * sizeof(int), "sample tokens");
    if (ranks.rank == 0) io.json = open_outputs(&a, &in, argv[0]); // (several ranks: no checkpoints yet)
    train(&m, &a, &io, a.ckpt.resume ? in.st.step + 1 : 1);
    if (a.loop.save_hf) save_hf(&m, &a);
    if (io.saver) saver_free(&saver);
    if (io.val) val_free(&val), loader_free(&in.val_loader), token_source_free(&in.val_source);
    if (io.eval) eval_destroy(&eval), eval_free(&in.eval_set);
    if (io.sampler) CUDA_CHECK(cudaFree(sampler.seq)), vocab_free(&in.vocab);
    model_free(&m);
    loader_free(&loader), token_source_free(&in.train_source);
    tokens_free(&in.train_embedded), tokens_free(&in.val_embedded);
    if (comm) comm_end(comm);
    return 0;
}
#endif
