// test_llama3.cu: checks the trainer's own code paths against the PyTorch reference
// (scripts/ref_llama3.py: HF LlamaForCausalLM under bf16 autocast with fp32 master weights and AdamW).
//   ./test_llama3 REF [trainer switches, e.g. --shadow_weights 0]
//   ./test_llama3 --train_args REF      prints the train_llama3 flags that repeat REF's run
//   ./test_llama3 --log LOG.jsonl REF   every step's loss of a `train_llama3 --log_file` run against REF's
//   ./test_llama3 --sampling            the trainer's sampler on fixed logits (no reference): top-k and
//                                       the frequencies of softmax(logits / temperature), by chi-square
//   ./test_llama3 --classifier          the classifier in chunks against in one, on random inputs (no reference)
// REF is the prefix of a reference's files: REF_model.bin (its random model, seed format),
// REF_state.bin (layout at ref_state_read) and REF_tokens.bin (the token stream of its steps).
// The output ends with "N passed, M failed"; the exit code is M > 0. What runs:
//   rope       our llama3 inverse frequencies and the device cos/sin table against HF's
//   files      the batches the data loader stages from REF_tokens.bin (and the uint16 REF_tokens16.bin)
//              against PyTorch's, and the llm.c-format REF_model_llmc.bin against REF_model.bin
//   step 1     logits, loss and every gradient of the first step (all its micro-steps), the qkv
//              gradient apart per KV group: the q rows of the group's query heads, its k rows, v rows
//   AdamW path every step through train_step (AdamW overlapped with the backward, deferred into the
//              next step, replayed from the CUDA graph) with each gradient replaced by PyTorch's as
//              soon as the backward writes it [reference gradients]: each step's loss and the
//              weights after each step against torch.optim.AdamW's, then after the final flush the
//              weights and AdamW's m and v against torch's exp_avg and exp_avg_sq
//   train()    the training loop itself on REF_tokens.bin (data loader, batch staging, the final
//              flush), PyTorch's gradients again: each step's loss and the weights at the end
//   free run   every step on our own gradients: losses, and the weights after the last step; with
//              micro-steps also the gradients train_step accumulated in step 1
//   determinism the free run twice over 50 steps: bit-identical losses and weights
// Each check is counted once: rope, files and determinism run only when no switch is given, step 1
// only when a switch could change the forward or backward pass.
#define TESTING
#include "train_llama3.cu"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <vector>

#define STATE_MAGIC 20241129
#define STATE_VERSION 5

// ---- tolerances, fixed before measuring, and why ----
// Logits and gradients: both sides round every matmul operand and activation to bf16 (2^-9
// relative) in different orders (cuBLASLt vs PyTorch kernels, flash vs unfused attention); over
// 2L layers that compounds to about 1e-2.
static const double TOL_LOGITS = 2e-2, TOL_GRAD = 5e-2;
// [fp8] Gradients of --fp8 1 against PyTorch's torch._scaled_mm with the same recipe (small_fp8).
// Set after its first run, not before: the last layer's FP8 GEMMs agreed bit for bit or nearly
// (attn_out, gate_up, down: 0 to 2.4e-4), and the bf16-level differences that enter elsewhere
// (attention, norms) flip FP8 roundings as the gradient flows back, where one step of e5m2 is 25 %
// and of e4m3 12.5 %: layer 0's were 2e-2 to 7.9e-2 (q, k rows), against 5.6e-3 in bf16 (small_t64).
static const double TOL_GRAD_FP8 = 1e-1;
static double tol_grad(const Model* m) { return m->fp8 ? TOL_GRAD_FP8 : TOL_GRAD; }
// Logits against PyTorch in fp32: ours no further from them than 1.5x PyTorch's own bf16 autocast
// (two independent bf16 roundings of the same model should land alike).
static const double TOL_LOGITS_FP32_RATIO = 1.5;
// Loss of a step whose weights equal PyTorch's (step 1, and every step on PyTorch's gradients),
// absolute on ~7 (small) or ~12 (1B): the logits' bf16 error averaged over the batch.
static const double TOL_LOSS = 1e-2;
// Losses of steps 2..n on our own gradients, absolute. AdamW's first update is lr * g / |g| per
// element, so an element whose gradient is within rounding of zero moves by +-lr at random: the
// 1B model's step-2 loss moved by 1e-2 when only the RMSNorm kernels' fp32 summation order changed.
static const double TOL_LOSS_FREE = 3e-2;
// AdamW given PyTorch's gradients: ||ours - torch|| / ||torch's update of that step||. The same
// fp32 formula on the same gradients, so only fp32 rounding of p (about 1e-7 of |p|) remains
// against an update of about lr = 1e-3 per element.
static const double TOL_ADAMW = 1e-3;
// Weights after n steps on our own gradients, relative to the update p_n - p_0: Adam's division
// by |g| turns bf16-level gradient differences on near-zero gradients into +-lr moves (README).
static const double TOL_FREE_PARAMS = 2.5e-1;
// RoPE: HF computes the inverse frequencies in fp32 torch ops, we round a double: a few ulp
// (measured 2e-7 relative). The angle t * inv_freq (fp32) carries t times that, so cos and sin
// are compared to 1e-6 * (1 + angle): the ulp of the angle and of the result, with margin.
static const double TOL_ROPE_FREQ = 1e-6, TOL_ROPE_TABLE = 1e-6;
// The lr: the same double formula on both sides, ours rounded to fp32 (2^-24), torch's kept double.
static const double TOL_LR = 1e-6;
// Gradient norm on PyTorch's gradients (the reference-gradient path): the same values, ours
// rounded to bf16 where the matmul gradients are bf16 (unbiased, averaging out over ~1e6 squares)
// and summed in fp32 in another order.
static const double TOL_NORM = 1e-4;
// Gradient norm on our own gradients: the gradients' bf16-level differences (TOL_GRAD per tensor)
// average over the tensors' squares; relative.
static const double TOL_NORM_FREE = 1e-2;
// [fp8] The same two on our own gradients under --fp8 1 (a train_llama3 log against a reference of
// the same recipe: scripts/combinations.py --gpu), from TOL_GRAD_FP8, the gradients' bound per tensor,
// twice TOL_GRAD: the later losses within twice TOL_LOSS_FREE, the whole gradient's norm within the
// bound itself (| |g| - |g'| | <= |g - g'|, at most TOL_GRAD_FP8 |g'| when every tensor is within it).
static const double TOL_LOSS_FREE_FP8 = 2 * TOL_LOSS_FREE, TOL_NORM_FREE_FP8 = TOL_GRAD_FP8;
// AdamW's m and v after the last step on PyTorch's gradients, ||ours - torch's|| / ||torch's|| per
// tensor and layer: the same fp32 recurrences on the same gradients. What differs: our 1 - beta in
// fp32 (torch's fused kernel takes it in double: 2.4e-7 relative for 0.9 and 0.95), the FMAs' order
// and, with clipping, the scale from our norm (the same squares summed in another order, 1e-7 to
// 1e-6). So a few 1e-7 (a float64 replay of the reference's AdamW lands 2.3e-7 from torch's m and v);
// 1e-5 leaves room for the scale, and a clipping scale ignored puts m off by 3x to 5x.
static const double TOL_MOMENTS = 1e-5;
// Sampling: the chi-square bound that a correct sampler exceeds with probability 1e-6 per setting
// (z: the standard normal's 1 - 1e-6 quantile, for Wilson and Hilferty's approximation).
static const double SAMPLE_FALSE_ALARM_Z = 4.753424;

static int n_passed = 0, n_failed = 0;

static void check(bool ok, const char* what, double err, double tol) {
    printf("%s %-56s %.3e (tol %.1e)\n", ok ? "ok  " : "FAIL", what, err, tol);
    ok ? n_passed++ : n_failed++;
}

static void fail_exit(const char* msg) {
    fprintf(stderr, "%s\n", msg);
    exit(EXIT_FAILURE);
}

// ||ours - want|| / ||ref - base|| (base NULL: / ||ref||), over n elements; NaN never passes.
static double rel_err(const float* ours, const float* want, const float* ref, const float* base, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (ours[i] != ours[i]) return INFINITY;
        double d = (double)ours[i] - want[i], u = (double)ref[i] - (base ? base[i] : 0.0f);
        num += d * d;
        den += u * u;
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

// ---- the reference ----
// State file: 256 int32 header: [0] magic 20241129, [1] version 4, [2] B, [3] T, [4] n_steps,
// [5] vocab_size, [6] 1 if the embedding was updated by lazy (row-sparse) AdamW, 0 if dense,
// [7] grad_accum (micro-steps per step), [8] lr schedule (LR_CONSTANT..LR_WSD), [9] warmup steps,
// [10] 1 if attention was masked to each document (--docs, the trainer's --doc_mask 1), [11] then BOS's id;
// float32 at [16] lr (peak), [17] beta1, [18] beta2, [19] eps, [20] weight_decay, [21] grad_clip
// (0: none), [22] final_lr_frac, [23] decay_frac. Then int32 inputs and targets (n_steps,
// grad_accum, B*T) each; fp32 HF RoPE inv_freq (HD/2), cos and sin (T, HD/2) each; step 1's first
// micro-batch logits (B*T, V) under bf16 autocast and the same in plain fp32; per step t =
// 1..n_steps two parameter-sized blocks in the seed file's tensor order: the step's gradients
// (before clipping), the parameters after its AdamW; then two more after the last step: AdamW's
// exp_avg and exp_avg_sq (the lazy embedding's own, 0 in the rows no step touched); last the
// n_steps losses (each the mean over the step's micro-batches), gradient norms (clip_grad_norm_'s,
// 0 without clipping) and lrs.
typedef struct {
    char model[512], state[512], tokens[512], tokens16[512], model_llmc[512]; // the last two may not exist
    Llama3Config cfg;
    ModelFileFormat fmt;
    size_t n_params;
    int B, T, n_steps, sparse_embedding, grad_accum;
    int doc_bos;     // [document mask] the token that starts a document; -1: plain causal attention
    OptimConfig opt; // its AdamW, schedule and clipping
    float *grad_norms, *lrs;
    int32_t *inputs, *targets;
    float *inv_freq, *rope_cos, *rope_sin;
    float *logits, *logits_fp32, *losses;
    size_t steps_offset;   // byte offset of step 1's gradient block
    size_t moments_offset; // byte offset of exp_avg after the last step (exp_avg_sq follows)
} Ref;

static void read_exact(FILE* f, void* dst, size_t bytes, const char* path) {
    if (fread(dst, 1, bytes, f) != bytes) {
        fprintf(stderr, "%s: truncated\n", path);
        exit(EXIT_FAILURE);
    }
}
static void* read_array(FILE* f, size_t bytes, const char* path) {
    void* p = malloc(bytes ? bytes : 1);
    read_exact(f, p, bytes, path);
    return p;
}

static void ref_state_read(Ref* r) {
    FILE* f = fopen(r->state, "rb");
    if (!f) { fprintf(stderr, "%s: cannot open\n", r->state); exit(EXIT_FAILURE); }
    int32_t h[256];
    read_exact(f, h, sizeof(h), r->state);
    if (h[0] != STATE_MAGIC || h[1] != STATE_VERSION || h[5] != r->cfg.vocab_size) {
        fprintf(stderr, "%s: not a version-%d reference state for this model (regenerate it)\n", r->state,
                STATE_VERSION);
        exit(EXIT_FAILURE);
    }
    r->B = h[2];
    r->T = h[3];
    r->n_steps = h[4];
    r->sparse_embedding = h[6];
    r->grad_accum = h[7];
    r->doc_bos = h[10] ? h[11] : -1;
    memcpy(&r->opt.sched.peak_lr, &h[16], 4);
    memcpy(&r->opt.beta1, &h[17], 4);
    memcpy(&r->opt.beta2, &h[18], 4);
    memcpy(&r->opt.eps, &h[19], 4);
    memcpy(&r->opt.weight_decay, &h[20], 4);
    memcpy(&r->opt.grad_clip, &h[21], 4);
    r->opt.sched.kind = h[8], r->opt.sched.warmup = h[9], r->opt.sched.total = r->n_steps;
    memcpy(&r->opt.sched.final_frac, &h[22], 4);
    memcpy(&r->opt.sched.decay_frac, &h[23], 4);
    size_t bt = (size_t)r->B * r->T, toks = (size_t)r->n_steps * r->grad_accum * bt, V = r->cfg.vocab_size;
    size_t half = r->cfg.n_embd / r->cfg.n_head / 2;
    r->inputs = (int32_t*)read_array(f, toks * 4, r->state);
    r->targets = (int32_t*)read_array(f, toks * 4, r->state);
    r->inv_freq = (float*)read_array(f, half * 4, r->state);
    r->rope_cos = (float*)read_array(f, r->T * half * 4, r->state);
    r->rope_sin = (float*)read_array(f, r->T * half * 4, r->state);
    r->logits = (float*)read_array(f, bt * V * 4, r->state);
    r->logits_fp32 = (float*)read_array(f, bt * V * 4, r->state);
    r->steps_offset = 1024 + 2 * toks * 4 + (half + 2 * r->T * half) * 4 + 2 * bt * V * 4;
    r->moments_offset = r->steps_offset + 2 * (size_t)r->n_steps * r->n_params * 4;
    size_t losses_offset = r->moments_offset + 2 * r->n_params * 4;
    if (fseeko(f, (off_t)losses_offset, SEEK_SET) != 0) { fprintf(stderr, "%s: truncated\n", r->state); exit(1); }
    r->losses = (float*)read_array(f, r->n_steps * 4, r->state);
    r->grad_norms = (float*)read_array(f, r->n_steps * 4, r->state);
    r->lrs = (float*)read_array(f, r->n_steps * 4, r->state);
    fclose(f);
    if (file_size_of(r->state) != (long long)(losses_offset + 3 * r->n_steps * 4)) {
        fprintf(stderr, "%s: size does not match its header\n", r->state);
        exit(EXIT_FAILURE);
    }
}

static void ref_open(Ref* r, const char* prefix) {
    snprintf(r->model, sizeof(r->model), "%s_model.bin", prefix);
    snprintf(r->state, sizeof(r->state), "%s_state.bin", prefix);
    snprintf(r->tokens, sizeof(r->tokens), "%s_tokens.bin", prefix);
    snprintf(r->tokens16, sizeof(r->tokens16), "%s_tokens16.bin", prefix);
    snprintf(r->model_llmc, sizeof(r->model_llmc), "%s_model_llmc.bin", prefix);
    char err[L3_ERR_LEN];
    r->fmt = MODEL_FILE_SEED;
    if (model_header_read(r->model, &r->cfg, &r->fmt, err)) fail_exit(err);
    r->n_params = param_layout(&r->cfg).total;
    ref_state_read(r);
}

static size_t grads_offset(const Ref* r, int step) {
    return r->steps_offset + 2 * (size_t)(step - 1) * r->n_params * 4;
}

static void host_sink(void* ctx, size_t offset, const float* src, size_t count) {
    memcpy((float*)ctx + offset, src, count * sizeof(float));
}

// The floats of a file's segments into our parameter layout on the host.
static float* load_params(const Ref* r, const char* path, SegmentList s) {
    float* out = (float*)malloc(r->n_params * sizeof(float));
    float* buf = (float*)malloc((16 << 20) * sizeof(float));
    char err[L3_ERR_LEN];
    if (segments_load(path, &s, buf, 16 << 20, host_sink, out, err)) fail_exit(err);
    free(s.seg);
    free(buf);
    return out;
}
static float* ref_grads(const Ref* r, int step) {
    return load_params(r, r->state, seed_file_segments(&r->cfg, grads_offset(r, step)));
}
// PyTorch's parameters after `step` steps; step 0: the model file.
static float* ref_params(const Ref* r, int step) {
    if (step == 0) return load_params(r, r->model, seed_file_segments(&r->cfg, 1024));
    return load_params(r, r->state, seed_file_segments(&r->cfg, grads_offset(r, step) + r->n_params * 4));
}
// PyTorch's AdamW moments after the last step: which 0 exp_avg (m), 1 exp_avg_sq (v).
static float* ref_moments(const Ref* r, int which) {
    return load_params(r, r->state, seed_file_segments(&r->cfg, r->moments_offset + which * r->n_params * 4));
}

static float* to_host(const float* device, size_t n) {
    float* h = (float*)malloc(n * sizeof(float));
    CUDA_CHECK(cudaMemcpy(h, device, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// ---- checks over the parameter block ----

// The qkv block of layer l (rows [Q | K | V] x C) per KV group g: the q rows of its G query heads,
// its k rows, its v rows. A 10 % error in dQ or dK hides in the whole block, whose norm the v rows
// dominate.
static void check_qkv_groups(const Model* m, const char* what, int l, const float* ours, const float* ref,
                             double tol) {
    const Llama3Config* c = &m->cfg;
    size_t C = c->n_embd, HD = C / c->n_head, G = c->n_head / c->n_kv_head, KVD = c->n_kv_head * HD;
    size_t base = m->layout.offset[P_QKV] + (size_t)l * m->layout.layer_size[P_QKV];
    for (int g = 0; g < c->n_kv_head; g++) {
        const size_t first_row[3] = {g * G * HD, C + g * HD, C + KVD + g * HD}, rows[3] = {G * HD, HD, HD};
        const char* part[3] = {"q", "k", "v"};
        for (int i = 0; i < 3; i++) {
            size_t off = base + first_row[i] * C, n = rows[i] * C;
            char name[96];
            snprintf(name, sizeof(name), "%s qkv[%d] %s rows of kv group %d", what, l, part[i], g);
            double e = rel_err(ours + off, ref + off, ref + off, NULL, n);
            check(e <= tol, name, e, tol);
        }
    }
}

// Per tensor from `first` on and per layer: ||ours - ref|| / ||ref - base|| (base NULL: / ||ref||);
// the qkv gradient per KV group when qkv_groups.
static void check_blocks(const Model* m, const char* what, const float* ours, const float* ref, const float* base,
                         double tol, bool qkv_groups, int first = P_WTE) {
    const ParamLayout* p = &m->layout;
    for (int t = first; t < NUM_PARAM_TENSORS; t++)
        for (int l = 0; l < p->slices[t]; l++) {
            if (qkv_groups && t == P_QKV) {
                check_qkv_groups(m, what, l, ours, ref, tol);
                continue;
            }
            size_t off = p->offset[t] + (size_t)l * p->layer_size[t], n = p->layer_size[t];
            char name[96];
            snprintf(name, sizeof(name), "%s %s[%d]", what, PARAM_NAMES[t], l);
            double e = rel_err(ours + off, ref + off, ref + off, base ? base + off : NULL, n);
            check(e <= tol, name, e, tol);
        }
}

// The weights after step t on PyTorch's gradients, per tensor and layer, against torch's p_t
// (`cur`), except the groups whose AdamW the plan defers into the next step while that is pending
// [deferred AdamW]: those must still hold p_{t-1} (`prev`). Errors relative to the step's update
// cur - prev. After a flush nothing is pending.
static void check_step_weights(const Model* m, const char* what, const float* ours, const float* prev,
                               const float* cur) {
    for (int j = 0; j < m->tab.n_slices; j++) {
        const TensorSlice* w = &m->tab.slice[j];
        size_t off = w->offset;
        bool deferred = m->step.pending.updates && group_deferred(m, w->group);
        char name[96];
        snprintf(name, sizeof(name), "%s %s[%d]%s", what, PARAM_NAMES[w->tensor], w->layer,
                 deferred ? " (deferred: p_t-1)" : "");
        double e = rel_err(ours + off, (deferred ? prev : cur) + off, cur + off, prev + off, w->n);
        check(e <= TOL_ADAMW, name, e, TOL_ADAMW);
    }
}

static uint16_t bf16_bits_rne(float x) { // host round-to-nearest-even, as __float2bfloat16_rn
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// [shadow weights] The shadow block is bf16(master) exactly after AdamW wrote both.
static void check_shadow(Model* m, const float* params) {
    size_t n_shadow = m->layout.matmul_end - m->layout.shadow_begin, mismatched = 0;
    uint16_t* shadow = (uint16_t*)malloc(n_shadow * 2);
    CUDA_CHECK(cudaMemcpy(shadow, m->shadow, n_shadow * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n_shadow; i++) mismatched += shadow[i] != bf16_bits_rne(params[m->layout.shadow_begin + i]);
    check(mismatched == 0, "shadow == bf16(params) (mismatches)", (double)mismatched, 0);
    free(shadow);
}

// AdamW's m and v against torch's exp_avg and exp_avg_sq after the last step (the reference keeps
// only those), per tensor and layer. With the lazy embedding only touched rows are non-zero, on
// both sides.
static void check_moments(const Model* m, const Ref* r) {
    const float* ours_device[2] = {(float*)m->optim.moment[0], (float*)m->optim.moment[1]}; // (fp32 moments)
    const char* what[2] = {"adamw m after flush", "adamw v after flush"};
    for (int i = 0; i < 2; i++) {
        float *ours = to_host(ours_device[i], m->layout.total), *torch = ref_moments(r, i);
        check_blocks(m, what[i], ours, torch, NULL, TOL_MOMENTS, false);
        free(ours);
        free(torch);
    }
}

// [sparse rows] The sparse AdamW zeroes the gradient rows it used: wte's gradient is all zero.
static void check_wte_grad_zero(Model* m) {
    float* grads = to_host(m->grads + m->layout.offset[P_WTE], m->layout.size[P_WTE]);
    size_t nonzero = 0;
    for (size_t i = 0; i < m->layout.size[P_WTE]; i++) nonzero += grads[i] != 0.0f;
    check(nonzero == 0, "wte grad zero after sparse AdamW (nonzero)", (double)nonzero, 0);
    free(grads);
}

// ---- [reference gradients] ----
// PyTorch's gradients of every step on the device, fp32 in our parameter order, step t at
// (t - 1) * n_params. While set, grad_written (the trainer's test seam) overwrites each gradient
// the backward writes with step t's, t read from the device step counter so that a replayed
// graph takes each step's own. NULL: the backward's own gradients stay.
static float* ref_grads_device = NULL;

__device__ inline void store_grad(float* g, float v) { *g = v; }
__device__ inline void store_grad(bf16* g, float v) { *g = __float2bfloat16_rn(v); } // exact: autocast's are bf16
template <typename G>
__global__ void copy_ref_grad_kernel(G* grad, const float* ref_steps, size_t step_stride, const int* step, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) store_grad(grad + i, ref_steps[(size_t)(*step - 1) * step_stride + i]);
}

static void grad_written(const Model* m, size_t offset, size_t count) {
    if (!ref_grads_device) return;
    const ParamLayout* p = &m->layout;
    const float* src = ref_grads_device + offset;
    unsigned blocks = ceil_div(count, 256);
    if (grad_is_bf16(m, offset))
        copy_ref_grad_kernel<<<blocks, 256, 0, m->stream>>>(grad_bf16(m, offset), src, p->total, m->optim.steps, count);
    else
        copy_ref_grad_kernel<<<blocks, 256, 0, m->stream>>>(grad_f32(m, offset), src, p->total, m->optim.steps, count);
    LAUNCH_CHECK();
}

static void use_ref_grads(const Ref* r) {
    size_t P = r->n_params;
    CUDA_CHECK(cudaMalloc(&ref_grads_device, (size_t)r->n_steps * P * sizeof(float)));
    for (int t = 1; t <= r->n_steps; t++) {
        float* g = ref_grads(r, t);
        CUDA_CHECK(cudaMemcpy(ref_grads_device + (size_t)(t - 1) * P, g, P * sizeof(float), cudaMemcpyHostToDevice));
        free(g);
    }
}
static void use_own_grads(void) {
    CUDA_CHECK(cudaFree(ref_grads_device));
    ref_grads_device = NULL;
}

// ---- runs ----

// Back to the model file's weights and a fresh optimizer (the trainer's own reset, which also drops
// the CUDA graph, so that the next run captures its own with or without the seam's copies).
static void reset_training(Model* m, const Ref* r) {
    char err[L3_ERR_LEN];
    model_reset_training(m);
    if (model_load(m, r->model, r->fmt, err)) fail_exit(err);
}

// Step `step`'s micro-batches into staging slot `slot`: all inputs, then all targets.
static void stage_ref_batch(Model* m, const Ref* r, int step, int slot) {
    size_t n_step = (size_t)r->grad_accum * r->B * r->T;
    int32_t* dst = m->tokens_host + (size_t)slot * 2 * n_step;
    memcpy(dst, r->inputs + step * n_step, n_step * 4);
    memcpy(dst + n_step, r->targets + step * n_step, n_step * 4);
}

// Optimizer step t through the training path on the reference's step `batch`; returns its
// statistics (loss, gradient norm, lr, NaN guard).
static StepStats run_step(Model* m, const Ref* r, int t, int batch) {
    int slot = t % 2;
    stage_ref_batch(m, r, batch, slot);
    m->stats_host[slot].loss = m->stats_host[slot].lr = NAN; // poison: a step that does not copy them back fails
    train_step(m, slot);
    CUDA_CHECK(cudaDeviceSynchronize());
    return m->stats_host[slot];
}

// Step t's gradient norm (with clipping) and lr against PyTorch's: clip_grad_norm_'s norm to
// `norm_tol` relative, LambdaLR's lr to TOL_LR of the peak lr.
static void check_norm_lr(const char* what, const Ref* r, int t, const StepStats* st, double norm_tol) {
    char name[128];
    if (r->opt.grad_clip > 0) {
        double e = fabs(st->grad_norm - r->grad_norms[t - 1]) / r->grad_norms[t - 1];
        snprintf(name, sizeof(name), "%s step %d grad norm (ours %.6f ref %.6f)", what, t, st->grad_norm,
                 r->grad_norms[t - 1]);
        check(e <= norm_tol, name, e, norm_tol);
    }
    double e = fabs(st->lr - r->lrs[t - 1]) / r->opt.sched.peak_lr; // (relative to the peak: the last step's lr may be 0)
    snprintf(name, sizeof(name), "%s step %d lr (ours %.6g ref %.6g)", what, t, st->lr, r->lrs[t - 1]);
    check(e <= TOL_LR, name, e, TOL_LR);
}

static void check_loss(const char* what, int t, float loss, float ref, double tol) {
    char name[96];
    snprintf(name, sizeof(name), "%s step %d loss (ours %.5f ref %.5f)", what, t, loss, ref);
    check(fabsf(loss - ref) <= tol, name, fabsf(loss - ref), tol);
}

// The inverse frequencies (host) and the cos/sin table the kernels read (device) against HF's.
static void test_rope(Model* m, const Ref* r) {
    int half = m->cfg.n_embd / m->cfg.n_head / 2;
    float* inv_freq = (float*)malloc(half * sizeof(float));
    rope_inv_freq(&m->cfg, inv_freq);
    double freq_err = 0.0, table_err = 0.0;
    for (int i = 0; i < half; i++)
        freq_err = fmax(freq_err, fabs((double)inv_freq[i] - r->inv_freq[i]) / r->inv_freq[i]);
    float* table = to_host(m->rope_cos, 2 * (size_t)r->T * half); // cos, then sin
    for (int t = 0; t < r->T; t++)
        for (int i = 0; i < half; i++) {
            size_t k = (size_t)t * half + i;
            double bound = TOL_ROPE_TABLE * (1.0 + t * (double)r->inv_freq[i]);
            double e = fmax(fabs(table[k] - r->rope_cos[k]), fabs(table[(size_t)r->T * half + k] - r->rope_sin[k]));
            table_err = fmax(table_err, e != e ? INFINITY : e / bound);
        }
    check(freq_err <= TOL_ROPE_FREQ, "rope inv_freq vs HF llama3 (max rel)", freq_err, TOL_ROPE_FREQ);
    check(table_err <= 1.0, "rope cos/sin table vs HF (max err / 1e-6(1+angle))", table_err, 1.0);
    free(inv_freq);
    free(table);
}

// The trainer's data loader over a token file of the reference (B and T as its steps), in order as
// PyTorch reads it (--shuffle 0).
static void open_loader(const Ref* r, const char* path, TokenSource* source, DataLoader* loader) {
    char err[L3_ERR_LEN];
    LoaderConfig c = {r->B, r->T, r->grad_accum, 0, 1, 0, 0, 0};
    if (token_source_open(source, path, "--input_bin", r->cfg.vocab_size, err) || loader_init(loader, source, &c, err))
        fail_exit(err);
}
static void close_loader(TokenSource* source, DataLoader* loader) { loader_free(loader), token_source_free(source); }

// The data path of train(): the loader over a token file, staged by stage_batches, gives exactly
// PyTorch's batches at every step (mismatched token ids counted).
static void check_token_file(Model* m, const Ref* r, const char* path) {
    char name[96];
    TokenSource source;
    DataLoader loader;
    open_loader(r, path, &source, &loader);
    size_t n_step = (size_t)r->grad_accum * r->B * r->T, mismatched = 0;
    for (int t = 0; t < r->n_steps; t++) {
        stage_batches(m, &loader, 0);
        for (size_t i = 0; i < n_step; i++) {
            mismatched += m->tokens_host[i] != r->inputs[t * n_step + i];
            mismatched += m->tokens_host[n_step + i] != r->targets[t * n_step + i];
        }
    }
    snprintf(name, sizeof(name), "batches staged from %s (mismatched ids)", path);
    check(mismatched == 0, name, (double)mismatched, 0);
    close_loader(&source, &loader);
}

// The reference's token files (uint32; uint16 when written) and, when written, its llm.c-format
// model, which must load to the seed-format model's weights bit for bit.
static void test_files(Model* m, const Ref* r) {
    check_token_file(m, r, r->tokens);
    if (file_size_of(r->tokens16) >= 0) check_token_file(m, r, r->tokens16);
    if (file_size_of(r->model_llmc) < 0) return;
    char err[L3_ERR_LEN];
    Llama3Config cfg;
    ModelFileFormat fmt;
    if (model_header_read(r->model_llmc, &cfg, &fmt, err)) fail_exit(err);
    float *seed = ref_params(r, 0), *llmc = load_params(r, r->model_llmc, llmc_file_segments(&r->cfg, 2048, 4));
    size_t mismatched = fmt == MODEL_FILE_LLMC ? 0 : r->n_params;
    for (size_t i = 0; i < r->n_params; i++) mismatched += memcmp(&seed[i], &llmc[i], 4) != 0;
    check(mismatched == 0, "llm.c-format model == seed-format model (mismatches)", (double)mismatched, 0);
    free(seed);
    free(llmc);
}

// The first micro-batch's logits, from the normed_final its forward left, chunk by chunk as the
// classifier makes them [chunked classifier], against PyTorch's.
static void check_logits(Model* m, const Ref* r) {
    size_t N = (size_t)r->B * r->T, V = m->cfg.vocab_size, n = N * V;
    bf16* logits_bf16 = (bf16*)malloc(n * 2);
    for (size_t first = 0; first < N; first += m->head_rows) {
        size_t rows = std::min<size_t>(m->head_rows, N - first);
        head_logits(m, weight_bf16(m, m->layout.head, 0), (int)first, (int)rows);
        CUDA_CHECK(cudaMemcpy(logits_bf16 + first * V, m->acts.logits, rows * V * 2, cudaMemcpyDeviceToHost));
    }
    float* logits = (float*)malloc(n * 4);
    for (size_t i = 0; i < n; i++) logits[i] = __bfloat162float(logits_bf16[i]);
    double err = rel_err(logits, r->logits, r->logits, NULL, n);
    check(err <= TOL_LOGITS, "logits", err, TOL_LOGITS);
    double ours = rel_err(logits, r->logits_fp32, r->logits_fp32, NULL, n);
    double torch = rel_err(r->logits, r->logits_fp32, r->logits_fp32, NULL, n);
    printf("     logits against PyTorch fp32: ours %.3e, PyTorch bf16 autocast %.3e\n", ours, torch);
    check(ours <= TOL_LOGITS_FP32_RATIO * torch, "logits vs fp32, ours / PyTorch bf16", ours / torch,
          TOL_LOGITS_FP32_RATIO);
    free(logits_bf16);
    free(logits);
}

// Every gradient as fp32 in parameter order: the fp32 block, and with [bf16 grads] the bf16 block of
// grad_bf16's range widened.
static float* grads_to_host(Model* m) {
    const ParamLayout* p = &m->layout;
    if (!m->grads_bf16) return to_host(m->grads, p->total);
    float* g = (float*)malloc(p->total * sizeof(float));
    size_t begin = m->grad_bf16.begin, end = m->grad_bf16.end, n = end - begin;
    CUDA_CHECK(cudaMemcpy(g, m->grads, begin * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(g + end, grad_f32(m, end), (p->total - end) * 4, cudaMemcpyDeviceToHost));
    bf16* h = (bf16*)malloc(n * 2);
    CUDA_CHECK(cudaMemcpy(h, m->grads_bf16, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) g[begin + i] = __bfloat162float(h[i]);
    free(h);
    return g;
}

// Step 1's forward and backward over all its micro-steps, the trainer's micro_step without the
// optimizer: the first micro-batch's logits (a forward of its own, since the micro-step turns them
// into dlogits), the step's loss, every gradient (accumulated over the micro-steps).
// [fp8] Each micro-step quantises its activations and gradients with amaxes of its own: the scales
// after the last micro-step run after the first are the scales of the last one run alone (the
// step's tokens on the device, the gradients written over).
static void check_fp8_scales_per_micro_step(Model* m, const Ref* r) {
    size_t n = 2 * fp8_scale_count(m);
    int last = r->grad_accum - 1;
    std::vector<Fp8Scale> alone(n), after_first(n);
    micro_step(m, last, false);
    CUDA_CHECK(cudaMemcpy(alone.data(), m->fp8->act_scale, n * sizeof(Fp8Scale), cudaMemcpyDeviceToHost));
    micro_step(m, 0, false);
    micro_step(m, last, false);
    CUDA_CHECK(cudaMemcpy(after_first.data(), m->fp8->act_scale, n * sizeof(Fp8Scale), cudaMemcpyDeviceToHost));
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) differ += memcmp(&alone[i], &after_first[i], sizeof(Fp8Scale)) != 0;
    check(differ == 0, "fp8: the last micro-step's scales after the first's are its own alone (scales that differ)",
          (double)differ, 0);
}

static void test_step1(Model* m, const Ref* r) {
    size_t n_step = (size_t)r->grad_accum * r->B * r->T;
    reset_training(m, r);
    stage_ref_batch(m, r, 0, 0);
    CUDA_CHECK(cudaMemcpy(m->tokens, m->tokens_host, 2 * n_step * 4, cudaMemcpyHostToDevice));
    forward(m, m->B, m->tokens, false);
    check_logits(m, r);
    for (int micro = 0; micro < r->grad_accum; micro++) micro_step(m, micro, false);
    StepStats st;
    CUDA_CHECK(cudaMemcpy(&st, m->stats, sizeof(st), cudaMemcpyDeviceToHost));
    check_loss("first", 1, st.loss, r->losses[0], TOL_LOSS);
    float *grads = grads_to_host(m), *ref = ref_grads(r, 1);
    check_blocks(m, "grad", grads, ref, NULL, tol_grad(m), true);
    free(grads);
    free(ref);
    if (m->fp8 && r->grad_accum > 1) check_fp8_scales_per_micro_step(m, r);
}

// [fp8] The FP8 copies W, W^T and the weight scales are those of the current shadow: each is remade
// after its weight's update (quantised again here, they must not change).
static void check_fp8_weights_fresh(Model* m) {
    size_t bytes = 2 * m->tab.fp8_weights, scales = fp8_scale_count(m);
    std::vector<unsigned char> kept(bytes), again(bytes);
    std::vector<Fp8Scale> kept_scales(scales), again_scales(scales);
    CUDA_CHECK(cudaMemcpy(kept.data(), m->fp8->w, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(kept_scales.data(), m->fp8->w_scale, scales * sizeof(Fp8Scale), cudaMemcpyDeviceToHost));
    fp8_quantize_weights(m, m->stream);
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    CUDA_CHECK(cudaMemcpy(again.data(), m->fp8->w, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(again_scales.data(), m->fp8->w_scale, scales * sizeof(Fp8Scale), cudaMemcpyDeviceToHost));
    size_t differ = 0;
    for (size_t i = 0; i < bytes; i++) differ += kept[i] != again[i];
    differ += memcmp(kept_scales.data(), again_scales.data(), scales * sizeof(Fp8Scale)) != 0;
    check(differ == 0, "fp8: the weights' FP8 copies and scales are the updated shadow's (bytes that differ)",
          (double)differ, 0);
}

// Every step through train_step on PyTorch's gradients: loss and weights after each step (the
// deferred layers still at p_{t-1}), then after the flush, the shadow, wte's gradient, m and v.
static void test_adamw_path(Model* m, const Ref* r) {
    reset_training(m, r);
    use_ref_grads(r);
    float* prev = ref_params(r, 0);
    for (int t = 1; t <= r->n_steps; t++) {
        StepStats st = run_step(m, r, t, t - 1);
        check_loss("adamw path", t, st.loss, r->losses[t - 1], TOL_LOSS);
        check_norm_lr("adamw path", r, t, &st, TOL_NORM);
        float *ours = to_host(m->params, m->layout.total), *cur = ref_params(r, t);
        char what[48];
        snprintf(what, sizeof(what), "adamw step %d", t);
        check_step_weights(m, what, ours, prev, cur);
        free(ours);
        free(prev);
        prev = cur;
    }
    optimizer_flush(m); // [deferred AdamW] the last step's deferred layers
    CUDA_CHECK(cudaDeviceSynchronize());
    float *ours = to_host(m->params, m->layout.total), *before = ref_params(r, r->n_steps - 1);
    check_step_weights(m, "adamw after flush", ours, before, prev); // prev: p_n
    if (m->sw.shadow_weights) check_shadow(m, ours);
    if (m->fp8) check_fp8_weights_fresh(m);
    if (m->sw.sparse_embedding) check_wte_grad_zero(m);
    use_own_grads();
    free(ours);
    free(before);
    free(prev);
    check_moments(m, r); // (after the frees: the 1B's blocks are 6 GB each)
}

// Every step's loss in a train() JSON log (one line per step, in order) against the reference's:
// step 1 within TOL_LOSS, later steps within `later_tol`.
// The steps of a train_llama3 JSON log against the reference's: each loss (step 1 within TOL_LOSS,
// the later ones within later_tol) and, when the reference clips, each gradient norm (relative,
// within norm_tol: the trainer logs its norm then). Ends with one line of the largest errors
// (scripts/combinations.py --gpu reads it).
static void check_log(const char* log_path, const char* what, const Ref* r, double later_tol, double norm_tol) {
    FILE* f = fopen(log_path, "r");
    if (!f) fail_exit("cannot open the log file");
    char line[512], name[64];
    int step, n = 0, lines = 0; // n: lines that are steps 1, 2, ... in order
    float loss;
    double worst_loss = 0, worst_norm = 0;
    while (fgets(line, sizeof(line), f)) {
        lines++;
        if (sscanf(line, "{\"step\": %d, \"loss\": %f", &step, &loss) != 2 || step != n + 1 || step > r->n_steps)
            continue;
        check_loss(what, step, loss, r->losses[step - 1], step == 1 ? TOL_LOSS : later_tol);
        double e = fabs((double)loss - r->losses[step - 1]);
        if (!(e <= worst_loss)) worst_loss = e; // (a NaN stays)
        const char* norm_at = strstr(line, "\"grad_norm\": ");
        if (r->opt.grad_clip > 0) {
            float norm = norm_at ? strtof(norm_at + 13, NULL) : NAN, ref = r->grad_norms[step - 1];
            e = fabs((double)norm - ref) / ref;
            char norm_name[96];
            snprintf(norm_name, sizeof(norm_name), "%s step %d grad norm (ours %.6f ref %.6f)", what, step, norm, ref);
            check(e <= norm_tol, norm_name, e, norm_tol);
            if (!(e <= worst_norm)) worst_norm = e;
        }
        n++;
    }
    fclose(f);
    snprintf(name, sizeof(name), "%s logged steps 1..%d, nothing else (lines)", what, r->n_steps);
    check(n == r->n_steps && lines == n, name, lines, r->n_steps);
    printf("largest errors: loss %.3e (tol %g, step 1: %g), grad_norm %.3e (tol %g%s)\n", worst_loss, later_tol,
           TOL_LOSS, worst_norm, norm_tol, r->opt.grad_clip > 0 ? "" : ": not logged, no clipping");
}

// The "val_loss" of step `step` in a train() JSON log; NaN if that line has none.
static float logged_val_loss(const char* log_path, int step) {
    FILE* f = fopen(log_path, "r");
    char line[512], key[32];
    float val = NAN;
    snprintf(key, sizeof(key), "{\"step\": %d,", step);
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, key, strlen(key)) && strstr(line, "\"val_loss\": "))
            val = strtof(strstr(line, "\"val_loss\": ") + 12, NULL);
    if (f) fclose(f);
    return val;
}

// --val_every through train(): the val data is step 3's batch, so the val loss after step 2 (the
// weights p_2, the deferred updates applied) is PyTorch's step-3 loss. One micro-step per step only
// (a step's loss is then one batch's).
static void val_of_step3(const Ref* r, TokenData* val_tokens, TokenSource* val_source, DataLoader* val_loader) {
    size_t N = (size_t)r->B * r->T;
    char err[L3_ERR_LEN];
    val_tokens->n_tokens = N + 1;
    val_tokens->tokens = (uint32_t*)malloc((N + 1) * sizeof(uint32_t));
    memcpy(val_tokens->tokens, r->inputs + 2 * N, N * sizeof(uint32_t));
    val_tokens->tokens[N] = (uint32_t)r->targets[2 * N + N - 1];
    token_source_memory(val_source, val_tokens, "step 3's batch", r->cfg.vocab_size);
    LoaderConfig c = {r->B, r->T, 1, 0, 1, 0, 0, 0};
    if (loader_init(val_loader, val_source, &c, err)) fail_exit(err);
}

// train() itself on the reference's token file, on PyTorch's gradients: the losses it logs, the
// weights it leaves, and with one micro-step per step the val loss after step 2.
static void test_train_loop(Model* m, const Ref* r) {
    char log_path[] = "/tmp/test_llama3_log_XXXXXX";
    TokenSource source;
    DataLoader loader;
    open_loader(r, r->tokens, &source, &loader);
    int fd = mkstemp(log_path);
    FILE* log = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!log) fail_exit("cannot create a temporary log file");
    TrainArgs a = train_args_default();
    a.optim = r->opt; // (what train() prints and logs)
    a.loop.log_file = log_path; // for train()'s write-error message
    reset_training(m, r);
    use_ref_grads(r);
    TrainIO io = {&loader, log, NULL, NULL, NULL, NULL, NULL};
    TokenData val_tokens = {};
    TokenSource val_source;
    DataLoader val_loader;
    ValData val;
    bool with_val = r->grad_accum == 1 && r->n_steps >= 3;
    if (with_val) {
        val_of_step3(r, &val_tokens, &val_source, &val_loader);
        val_create(&val, m, &val_loader, r->B * r->T);
        io.val = &val, a.eval.val_every = 2;
    }
    train(m, &a, &io, 1); // closes the log
    CUDA_CHECK(cudaDeviceSynchronize());
    use_own_grads();
    check_log(log_path, "train()", r, TOL_LOSS, TOL_NORM_FREE);
    if (with_val) {
        check_loss("train() val loss after", 2, logged_val_loss(log_path, 2), r->losses[2], TOL_LOSS);
        val_free(&val);
        close_loader(&val_source, &val_loader);
        tokens_free(&val_tokens);
    }
    unlink(log_path);
    float *ours = to_host(m->params, m->layout.total), *prev = ref_params(r, r->n_steps - 1);
    float* last = ref_params(r, r->n_steps);
    check_step_weights(m, "train() weights", ours, prev, last);
    free(ours);
    free(prev);
    free(last);
    close_loader(&source, &loader);
}

// Every step on our own gradients: the losses, and the weights after the last step and the flush.
// With micro-steps, also the gradients step 1 accumulated in train_step's own loop (test_step1
// runs its own; wte's rows are zeroed again by the sparse AdamW, so wte is left out then).
static void test_free_run(Model* m, const Ref* r) {
    reset_training(m, r);
    for (int t = 1; t <= r->n_steps; t++) {
        StepStats st = run_step(m, r, t, t - 1);
        check_loss("free run", t, st.loss, r->losses[t - 1], t == 1 ? TOL_LOSS : TOL_LOSS_FREE);
        check_norm_lr("free run", r, t, &st, TOL_NORM_FREE);
        if (t > 1 || r->grad_accum == 1) continue;
        float *grads = grads_to_host(m), *ref = ref_grads(r, 1);
        int first = r->sparse_embedding ? P_LM_HEAD : P_WTE;
        check_blocks(m, "free run step 1 grad", grads, ref, NULL, tol_grad(m), false, first);
        free(grads);
        free(ref);
    }
    optimizer_flush(m);
    CUDA_CHECK(cudaDeviceSynchronize());
    float *ours = to_host(m->params, m->layout.total), *p0 = ref_params(r, 0), *last = ref_params(r, r->n_steps);
    check_blocks(m, "free run weights", ours, last, p0, TOL_FREE_PARAMS, false);
    free(ours);
    free(p0);
    free(last);
}

// Determinism: the free run twice from the same start over `steps` steps (the reference's batches
// in turn), bit for bit: every step's loss and the weights after the flush, with the CUDA graph,
// deferred AdamW and sparse embedding as configured. No kernel adds with atomics, so nothing may
// differ.
static void test_determinism(Model* m, const Ref* r, int steps) {
    size_t P = m->layout.total, losses_differ = 0, weights_differ = 0;
    float* losses = (float*)malloc(2 * steps * sizeof(float));
    float* weights[2];
    for (int run = 0; run < 2; run++) {
        reset_training(m, r);
        for (int t = 1; t <= steps; t++) losses[run * steps + t - 1] = run_step(m, r, t, (t - 1) % r->n_steps).loss;
        optimizer_flush(m);
        CUDA_CHECK(cudaDeviceSynchronize());
        weights[run] = to_host(m->params, P);
    }
    for (int t = 0; t < steps; t++) losses_differ += memcmp(&losses[t], &losses[steps + t], 4) != 0;
    for (size_t i = 0; i < P; i++) weights_differ += memcmp(&weights[0][i], &weights[1][i], 4) != 0;
    char name[96];
    snprintf(name, sizeof(name), "determinism: %d steps twice, losses that differ", steps);
    check(losses_differ == 0, name, (double)losses_differ, 0);
    snprintf(name, sizeof(name), "determinism: %d steps twice, weights that differ", steps);
    check(weights_differ == 0, name, (double)weights_differ, 0);
    free(losses);
    free(weights[0]);
    free(weights[1]);
}

// NaN guard: a step whose loss (and, with clipping, gradient norm) is not finite changes no weight
// and no AdamW state, is counted, and the next step trains again. The NaN comes from one final-norm
// weight (fp32, read by every position: every logit turns NaN), restored after the step.
static void test_nan_guard(Model* m, const Ref* r) {
    size_t P = m->layout.total, at = m->layout.offset[P_FINAL_NORM] + 3, changed = 0;
    reset_training(m, r);
    run_step(m, r, 1, 0);
    optimizer_flush(m); // the weights whole, the next step eager
    CUDA_CHECK(cudaDeviceSynchronize());
    float *p0 = to_host(m->params, P), *m0 = to_host((float*)m->optim.moment[0], P), *v0 = to_host((float*)m->optim.moment[1], P);
    float nan = NAN, good = p0[at];
    CUDA_CHECK(cudaMemcpy(m->params + at, &nan, 4, cudaMemcpyHostToDevice));
    StepStats bad = run_step(m, r, 2, 1 % r->n_steps);
    optimizer_flush(m);
    CUDA_CHECK(cudaMemcpy(m->params + at, &good, 4, cudaMemcpyHostToDevice));
    float *p1 = to_host(m->params, P), *m1 = to_host((float*)m->optim.moment[0], P), *v1 = to_host((float*)m->optim.moment[1], P);
    for (size_t i = 0; i < P; i++)
        changed += memcmp(&p0[i], &p1[i], 4) || memcmp(&m0[i], &m1[i], 4) || memcmp(&v0[i], &v1[i], 4);
    check(bad.skipped == 1 && bad.bad_in_row == 1 && bad.skipped_total == 1,
          "NaN guard: the poisoned step is skipped and counted (its loss is NaN)", bad.loss, 0);
    check(changed == 0, "NaN guard: weights, m and v as before the skipped step (elements that differ)",
          (double)changed, 0);
    StepStats next = run_step(m, r, 3, 2 % r->n_steps);
    check(!next.skipped && next.bad_in_row == 0 && isfinite(next.loss), "NaN guard: the next step trains (its loss)",
          next.loss, 0);
    for (float* b : {p0, m0, v0, p1, m1, v1}) free(b);
}

// ---- sampling: the trainer's sampler on fixed logits (no reference) ----
// sample_token (kernels.cuh) with next_uniform's draws (the trainer's generator), one launch per
// draw as sample_ids does, on one row of V logits: logit i is -rank(i) / 16 in bf16 (exact and
// distinct for ranks below 256), rank(i) = 7919 i mod V (7919 is prime: a permutation), so that
// the likely tokens lie scattered over the row. V = 10000: the weights pass gives 625 threads (20
// warps, the last part-filled) a chunk of two 8-wide loads each (the 1B's 128256: 16 loads), and
// the strided argmax and top-k passes take two loads on 226 threads. 40000 draws per setting.
#define SAMPLE_V 10000
#define SAMPLE_DRAWS 40000

// softmax(logits / temperature) over the logits >= the top_k-th largest (all for top_k 0; ties
// kept), 0 elsewhere: what sample_token documents, in double.
static std::vector<double> sampling_probs(const std::vector<float>& logits, float temperature, int top_k) {
    std::vector<float> sorted(logits);
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    float threshold = top_k > 0 && top_k < (int)logits.size() ? sorted[top_k - 1] : -INFINITY;
    std::vector<double> p(logits.size());
    double sum = 0.0;
    for (size_t i = 0; i < p.size(); i++) {
        p[i] = logits[i] >= threshold ? exp((logits[i] - sorted[0]) / (double)temperature) : 0.0;
        sum += p[i];
    }
    for (double& q : p) q /= sum;
    return p;
}

// Pearson's chi-square of the counts of n draws against n p over the tokens with p > 0; the
// tokens that expect fewer than 5 draws are pooled into one bin, with the next least likely until
// the pool expects at least 5. *bins: the bins compared.
static double chi_square(const std::vector<int>& counts, const std::vector<double>& p, int n, int* bins) {
    std::vector<int> order;
    for (int i = 0; i < (int)p.size(); i++)
        if (p[i] > 0.0) order.push_back(i);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] < p[b]; });
    double pool_e = 0.0, pool_o = 0.0, chi2 = 0.0;
    size_t j = 0;
    for (; j < order.size() && (n * p[order[j]] < 5.0 || (pool_e > 0.0 && pool_e < 5.0)); j++)
        pool_e += n * p[order[j]], pool_o += counts[order[j]];
    if (pool_e > 0.0) chi2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
    *bins = (pool_e > 0.0) + (int)(order.size() - j);
    for (; j < order.size(); j++) {
        double e = n * p[order[j]], d = counts[order[j]] - e;
        chi2 += d * d / e;
    }
    return chi2;
}

// The chi-square of df degrees of freedom that a correct sampler exceeds with probability 1e-6, by
// Wilson and Hilferty: (chi2 / df)^(1/3) is nearly normal, mean 1 - 2 / (9 df), variance 2 / (9 df).
// In this tail it is 0.2 % (df 99) to 2.6 % (df 9) above the exact quantile: slightly conservative.
static double chi_square_bound(int df) {
    double s = 2.0 / (9.0 * df);
    return df * pow(1.0 - s + SAMPLE_FALSE_ALARM_Z * sqrt(s), 3.0);
}

// n draws from the device row, each with the next uniform of *rng; the tokens, on the host.
static std::vector<int> sample_draws(const bf16* row, int V, float temperature, int top_k, int n, uint64_t* rng) {
    int* tokens;
    CUDA_CHECK(cudaMalloc(&tokens, n * sizeof(int)));
    for (int i = 0; i < n; i++) sample_token(tokens + i, row, V, temperature, top_k, next_uniform(rng), 0);
    std::vector<int> out(n);
    CUDA_CHECK(cudaMemcpy(out.data(), tokens, n * sizeof(int), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(tokens));
    return out;
}

// One setting: no draw outside the top-k set (p 0 there), and the counts against p by chi-square.
static void check_sampling(const bf16* row, const std::vector<float>& logits, float temperature, int top_k,
                           uint64_t* rng) {
    int V = (int)logits.size(), outside = 0, bins;
    std::vector<double> p = sampling_probs(logits, temperature, top_k);
    std::vector<int> counts(V, 0);
    for (int token : sample_draws(row, V, temperature, top_k, SAMPLE_DRAWS, rng)) {
        if (token >= 0 && token < V && p[token] > 0.0) counts[token]++;
        else outside++;
    }
    double chi2 = chi_square(counts, p, SAMPLE_DRAWS, &bins), bound = chi_square_bound(bins - 1);
    char name[96];
    snprintf(name, sizeof(name), "sampling T %.1f top_k %d: draws outside the top-k set", temperature, top_k);
    check(outside == 0, name, outside, 0);
    snprintf(name, sizeof(name), "sampling T %.1f top_k %d: chi-square, %d bins (1e-6 bound)", temperature, top_k,
             bins);
    check(chi2 <= bound, name, chi2, bound);
}

// The settings: all V at T 1 (no top-k pass), top-k at T below and above 1, and a larger k. A
// float64 replay of this test puts a correct sampler at 0.15 to 0.53 of each bound; a temperature
// ignored at 79x (T 0.5) and 6x (T 2), top_k + 1 kept at 421 and 3063 draws outside, top_k - 1 at
// 8x and 83x, a uniform over [0, 2) at 2000x and more. The generator's seed is fixed.
static int test_sampling(void) {
    const struct { float temperature; int top_k; } settings[] = {{1.0f, 0}, {0.5f, 20}, {2.0f, 10}, {0.8f, 100}};
    std::vector<float> logits(SAMPLE_V);
    std::vector<bf16> row_host(SAMPLE_V);
    for (int i = 0; i < SAMPLE_V; i++) {
        long long rank = 7919LL * i % SAMPLE_V;
        row_host[i] = __float2bfloat16_rn((float)-rank / 16.0f);
        logits[i] = __bfloat162float(row_host[i]);
    }
    bf16* row;
    CUDA_CHECK(cudaMalloc(&row, SAMPLE_V * sizeof(bf16)));
    CUDA_CHECK(cudaMemcpy(row, row_host.data(), SAMPLE_V * sizeof(bf16), cudaMemcpyHostToDevice));
    uint64_t rng = 1234;
    for (const auto& s : settings) check_sampling(row, logits, s.temperature, s.top_k, &rng);
    CUDA_CHECK(cudaFree(row));
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed > 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

// ---- [bf16 moments]: the trainer's AdamW with bf16 m and v, against float64 (no reference file) ----
// adamw_dense (the trainer's launcher) with bf16 moments and fp32 gradients, on fresh random inputs
// of the 1B's scales (p ~ N(0, 0.02), g ~ N(0, 1e-3), m = bf16 of N(0, 1e-3), v = bf16 of
// U[1e-8, 1e-6]), n = 1,000,003 (float4 with a scalar tail), m, v and p poisoned, step 10 of
// AdamW(1e-3, (0.9, 0.999), 1e-8, wd 0.1). The reference is the update in float64 from the same
// inputs. Checks:
//  - p within 1e-6 (relative to its scale): the update reads m and v in fp32, before they are rounded.
//  - m and v: each stored value within one bf16 ulp of the float64 one (one of its two neighbours).
//  - no stagnation: v = 1e-6 with g = 1e-6 moves by -1e-9 a step, 0.13 of a bf16 ulp; rounding to
//    nearest keeps every v as it was, stochastic rounding moves their mean by the float64 change,
//    within 5 % (its noise at this n is 0.3 %).
//  - a rerun of the step writes the same bits; the next step (t + 1, the same hyperparameters
//    otherwise) draws other rounding bits: at least 10 % of the m values differ (expected about 1/3).
#define MOMENTS_N 1000003
static const double TOL_BF16_MOMENTS_P = 1e-6, TOL_STAGNATION = 5e-2, MIN_NEW_BITS = 0.1;

struct MomentBuffers {
    float *params, *grads;
    bf16 *m, *v;
};
// p, g (fp32) and m, v (bf16 of the floats given) on the device.
static MomentBuffers moments_upload(const std::vector<float>& p, const std::vector<float>& g,
                                    const std::vector<float>& m, const std::vector<float>& v) {
    MomentBuffers b;
    size_t n = p.size();
    CUDA_CHECK(cudaMalloc(&b.params, n * 4));
    CUDA_CHECK(cudaMalloc(&b.grads, n * 4));
    CUDA_CHECK(cudaMalloc(&b.m, n * 2));
    CUDA_CHECK(cudaMalloc(&b.v, n * 2));
    std::vector<bf16> m16(n), v16(n);
    for (size_t i = 0; i < n; i++) m16[i] = __float2bfloat16_rn(m[i]), v16[i] = __float2bfloat16_rn(v[i]);
    CUDA_CHECK(cudaMemcpy(b.params, p.data(), n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b.grads, g.data(), n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b.m, m16.data(), n * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b.v, v16.data(), n * 2, cudaMemcpyHostToDevice));
    return b;
}
static std::vector<float> bf16_to_host(const bf16* d, size_t n) {
    std::vector<bf16> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++) f[i] = __bfloat162float(h[i]);
    return f;
}
// One AdamW step on b with hyperparameters h (host), as the trainer launches it (bf16 moments).
static void moments_step(const MomentBuffers& b, size_t n, const AdamWParams& h) {
    AdamWParams* hd;
    CUDA_CHECK(cudaMalloc(&hd, sizeof(h)));
    CUDA_CHECK(cudaMemcpy(hd, &h, sizeof(h), cudaMemcpyHostToDevice));
    int sms;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    adamw_dense<false>(b.params, b.m, b.v, b.grads, (bf16*)NULL, n, 0, hd, true, sms, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaFree(hd));
}
static void moments_free(MomentBuffers& b) {
    for (void* p : {(void*)b.params, (void*)b.grads, (void*)b.m, (void*)b.v}) CUDA_CHECK(cudaFree(p));
}
// A bf16 ulp at x: 2^(e - 8) for |x| in [2^(e-1), 2^e) (8 significant bits).
static double bf16_ulp(double x) {
    int e;
    frexp(x, &e);
    return ldexp(1.0, e - 8);
}
static float bf16_rt(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
static std::vector<float> normal_vector(size_t n, float std, uint64_t* rng) {
    std::vector<float> x(n);
    for (float& e : x) e = std * (float)(sqrt(-2.0 * log(next_uniform(rng) + 1e-300)) * cos(6.283185307179586 * next_uniform(rng)));
    return x;
}

// The float64 AdamW of element i (dev/common.h adamw_cpu's order), moments read as given.
static void adamw_f64(double* p, double* m, double* v, double g, const OptimConfig& o, int t) {
    double step_size = o.sched.peak_lr / (1.0 - pow((double)o.beta1, t)), corr2 = sqrt(1.0 - pow((double)o.beta2, t));
    *p -= (double)o.sched.peak_lr * o.weight_decay * *p;
    *m = (double)o.beta1 * *m + (1.0 - o.beta1) * g;
    *v = (double)o.beta2 * *v + (1.0 - o.beta2) * g * g;
    *p -= step_size * *m / (sqrt(*v) / corr2 + o.eps);
}

static int test_bf16_moments(void) {
    const size_t n = MOMENTS_N;
    OptimConfig o = {};
    o.sched.kind = LR_CONSTANT, o.sched.total = 100, o.sched.peak_lr = 1e-3f;
    o.beta1 = 0.9f, o.beta2 = 0.999f, o.eps = 1e-8f, o.weight_decay = 0.1f;
    const int t = 10;
    AdamWParams h = adamw_params_at(o, t), next = h;
    next.t = t + 1;
    uint64_t rng = 4242;
    std::vector<float> p = normal_vector(n, 0.02f, &rng), g = normal_vector(n, 1e-3f, &rng),
                       m = normal_vector(n, 1e-3f, &rng), v(n);
    for (float& e : v) e = 1e-8f + (float)next_uniform(&rng) * (1e-6f - 1e-8f);
    for (size_t i = 0; i < n; i++) m[i] = bf16_rt(m[i]), v[i] = bf16_rt(v[i]);
    MomentBuffers b = moments_upload(p, g, m, v); // (in place: every value must move as the reference's)
    moments_step(b, n, h);
    float* got_p = to_host(b.params, n);
    std::vector<float> got_m = bf16_to_host(b.m, n), got_v = bf16_to_host(b.v, n);
    double p_err = 0.0;
    size_t far_m = 0, far_v = 0;
    for (size_t i = 0; i < n; i++) {
        double pi = p[i], mi = m[i], vi = v[i];
        adamw_f64(&pi, &mi, &vi, g[i], o, t);
        p_err = fmax(p_err, fabs(got_p[i] - pi) / 0.02);
        far_m += !(fabs(got_m[i] - mi) <= bf16_ulp(mi)), far_v += !(fabs(got_v[i] - vi) <= bf16_ulp(vi));
    }
    free(got_p);
    check(p_err <= TOL_BF16_MOMENTS_P, "bf16 moments: p against float64 (largest error / 0.02)", p_err, TOL_BF16_MOMENTS_P);
    check(far_m == 0, "bf16 moments: m values more than one bf16 ulp from float64", (double)far_m, 0);
    check(far_v == 0, "bf16 moments: v values more than one bf16 ulp from float64", (double)far_v, 0);
    // the rerun and the next step, from the same inputs
    std::vector<float> again_m, next_m;
    for (int k = 0; k < 2; k++) {
        moments_free(b);
        b = moments_upload(p, g, m, v);
        moments_step(b, n, k ? next : h);
        (k ? next_m : again_m) = bf16_to_host(b.m, n);
    }
    size_t rerun_differs = 0, next_differs = 0;
    for (size_t i = 0; i < n; i++) rerun_differs += again_m[i] != got_m[i], next_differs += next_m[i] != got_m[i];
    check(rerun_differs == 0, "bf16 moments: the same step twice, m values that differ", (double)rerun_differs, 0);
    check((double)next_differs / n >= MIN_NEW_BITS, "bf16 moments: step t + 1 rounds anew, fraction of m that differs (at least)",
          (double)next_differs / n, MIN_NEW_BITS);
    moments_free(b);
    // stagnation: v = bf16(1e-6), g = +-1e-6
    std::vector<float> v_small(n, bf16_rt(1e-6f)), g_small(n);
    for (size_t i = 0; i < n; i++) g_small[i] = (i % 2 ? 1e-6f : -1e-6f);
    b = moments_upload(p, g_small, m, v_small);
    moments_step(b, n, h);
    std::vector<float> v_after = bf16_to_host(b.v, n);
    double moved = 0.0, want = 0.0;
    for (size_t i = 0; i < n; i++) {
        double pi = p[i], mi = m[i], vi = v_small[i];
        adamw_f64(&pi, &mi, &vi, g_small[i], o, t);
        moved += (double)v_after[i] - v_small[i], want += vi - v_small[i];
    }
    double stagnation = fabs(moved / want - 1.0);
    check(stagnation <= TOL_STAGNATION, "bf16 moments: v's mean step of 0.13 ulp kept (|mean / float64's - 1|)", stagnation,
          TOL_STAGNATION);
    moments_free(b);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed > 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

// ---- [chunked classifier]: in chunks against in one (no reference file) ----
// The trainer's classifier (its head GEMM, cross-entropy and the head's two backward GEMMs, as the
// training step runs them) on LLaMA 3.2-1B's head (C 2048, V 128256; a tied model of one layer with bf16
// moments, 5 GiB, since make test runs it beside other parts on the GPU) for B x T =
// 2 x 1000 rows of fresh random normed_final (N(0, 1) in bf16) and targets: once in one chunk of all
// 2000 rows, then in chunks of 512 (the last one 464: ragged) and of 500 (four even ones), each run's
// outputs poisoned first (losses NaN, d normed_final NaN, the head's gradient NaN). Gradients fp32
// (--bf16_grads 0: the head's sum over chunks is fp32 in training too). Rows are independent in the
// logits GEMM and the cross-entropy, and the logits GEMM has some thousand output tiles at any row count
// (no split over C), so the losses must be those of one chunk bit for bit. d normed_final = dlogits W
// sums over V = 128256 per row, which cuBLASLt may split (split-K) for a chunk of few output tiles, in
// another order than for 2000 rows: its fp32 sums then differ by fp32 rounding, which moves their bf16
// rounding by at most one bf16 ulp. The head's gradient sums over the rows, chunk after chunk: the same
// exact products (bf16 x bf16 in fp32) added in another order, a few fp32 ulp (about 1e-6 of its norm):
// TOL_CLASSIFIER_DW leaves a hundredfold; a chunk lost or written over the others is 1e-1 and more.
#define CLASSIFIER_B 2
#define CLASSIFIER_T 1000
static const double TOL_CLASSIFIER_DW = 1e-4;

struct ClassifierOut {
    std::vector<float> losses, dw;
    std::vector<bf16> dx;
};
// The classifier with grads in chunks of `rows` (the model was sized for one chunk of all rows, so
// its logits buffer holds any smaller chunk), its outputs poisoned first.
static ClassifierOut classifier_run(Model* m, const int* targets, int rows) {
    size_t N = (size_t)m->B * m->T, C = m->cfg.n_embd, W = m->layout.size[m->layout.head];
    float* dw = grad_f32(m, m->layout.offset[m->layout.head]);
    m->head_rows = rows;
    CUDA_CHECK(cudaMemset(m->acts.losses, 0xFF, N * sizeof(float)));
    CUDA_CHECK(cudaMemset(m->acts.branch, 0xFF, N * C * sizeof(bf16)));
    CUDA_CHECK(cudaMemset(dw, 0xFF, W * sizeof(float)));
    classifier(m, m->B, targets, 0, true, false);
    CUDA_CHECK(cudaDeviceSynchronize());
    ClassifierOut out = {std::vector<float>(N), std::vector<float>(W), std::vector<bf16>(N * C)};
    CUDA_CHECK(cudaMemcpy(out.losses.data(), m->acts.losses, N * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(out.dw.data(), dw, W * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(out.dx.data(), m->acts.branch, N * C * sizeof(bf16), cudaMemcpyDeviceToHost));
    return out;
}

// Chunks of `rows` against one chunk: losses bit for bit, d normed_final within one bf16 ulp (and how
// many differ at all), the head's gradient within TOL_CLASSIFIER_DW.
static void check_chunks(Model* m, const int* targets, const ClassifierOut& whole, int rows) {
    ClassifierOut part = classifier_run(m, targets, rows);
    size_t losses_differ = 0, dx_differ = 0, dx_far = 0, N = whole.losses.size();
    for (size_t i = 0; i < N; i++) losses_differ += memcmp(&part.losses[i], &whole.losses[i], 4) != 0;
    for (size_t i = 0; i < whole.dx.size(); i++) {
        float a = __bfloat162float(part.dx[i]), b = __bfloat162float(whole.dx[i]);
        dx_differ += memcmp(&part.dx[i], &whole.dx[i], 2) != 0;
        dx_far += !(fabs(a - b) <= bf16_ulp(fmax(fabs(a), fabs(b)))); // (a NaN is far)
    }
    char name[128];
    int n_chunks = (int)((N + rows - 1) / rows), last = (int)(N - (size_t)(n_chunks - 1) * rows);
    snprintf(name, sizeof(name), "classifier in %d chunks of %d (the last %d): losses that differ", n_chunks, rows,
             last);
    check(losses_differ == 0, name, (double)losses_differ, 0);
    snprintf(name, sizeof(name), "classifier, chunks of %d: d normed_final over one bf16 ulp off (%zu differ)", rows,
             dx_differ);
    check(dx_far == 0, name, (double)dx_far, 0);
    double e = rel_err(part.dw.data(), whole.dw.data(), whole.dw.data(), NULL, whole.dw.size());
    snprintf(name, sizeof(name), "classifier, chunks of %d: the head's gradient (rel L2)", rows);
    check(e <= TOL_CLASSIFIER_DW, name, e, TOL_CLASSIFIER_DW);
}

static int test_classifier(void) {
    Llama3Config c = family_config(SHAPE_1B);
    c.n_layer = 1, c.tied_embeddings = 1;
    TrainArgs a = train_args_default();
    a.sw.bf16_grads = 0, a.optim.moments = MOMENTS_BF16;
    RunConfig run = {CLASSIFIER_B, CLASSIFIER_T, 1, RECOMPUTE_NONE, 0, 0, FP8_GRADS_E5M2, &a.optim, &a.sw};
    Model m;
    model_create(&m, &c, &run, NULL);
    model_init_random(&m, 1234);
    int N = CLASSIFIER_B * CLASSIFIER_T;
    init_params(m.acts.normed_final, (size_t)N * c.n_embd, 0.0f, 1.0f, 4321, m.stream);
    uint64_t rng = 99;
    std::vector<int> targets(N);
    for (int& t : targets) t = (int)(next_uniform(&rng) * c.vocab_size);
    int* targets_device;
    CUDA_CHECK(cudaMalloc(&targets_device, N * sizeof(int)));
    CUDA_CHECK(cudaMemcpy(targets_device, targets.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    ClassifierOut whole = classifier_run(&m, targets_device, N);
    double mean = 0;
    for (float l : whole.losses) mean += l / N;
    printf("     one chunk of %d rows: mean loss %.4f (ln V = %.4f)\n", N, mean, log((double)c.vocab_size));
    check_chunks(&m, targets_device, whole, 512);
    check_chunks(&m, targets_device, whole, 500);
    CUDA_CHECK(cudaFree(targets_device));
    model_free(&m);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed > 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

// ---- the trainer's own runs ----

// The flags that make train_llama3 repeat the reference's steps (its files are given apart).
static int print_train_args(const char* prefix) {
    Ref r;
    ref_open(&r, prefix);
    TrainArgs a = train_args_default(); // (for the schedule's name)
    a.optim.sched.kind = r.opt.sched.kind;
    char schedule[32];
    flag_format(&a, flag_find("--lr_schedule"), schedule, sizeof(schedule));
    printf("--batch_size %d --sequence_length %d --total_batch_size %d --num_iteration %d --learning_rate %.9g "
           "--beta1 %.9g --beta2 %.9g --eps %.9g --weight_decay %.9g --sparse_embedding %d --lr_schedule %s "
           "--warmup_iters %d --final_lr_frac %.9g --decay_frac %.9g --grad_clip %.9g --shuffle 0",
           r.B, r.T, r.grad_accum * r.B * r.T, r.n_steps, r.opt.sched.peak_lr, r.opt.beta1, r.opt.beta2, r.opt.eps, r.opt.weight_decay,
           r.sparse_embedding, schedule, r.opt.sched.warmup, r.opt.sched.final_frac, r.opt.sched.decay_frac, r.opt.grad_clip);
    if (r.doc_bos >= 0) printf(" --doc_mask 1 --bos_id %d", r.doc_bos);
    printf("\n");
    return 0;
}

// Every step's loss (and norm) in a train_llama3 JSON log against the reference's (the trainer's own
// gradients); flags: the run's, of which --fp8 1 picks the FP8 tolerances.
static int compare_log(const char* log_path, const char* prefix, int n_flags, char** flags) {
    char err[L3_ERR_LEN];
    TrainArgs a;
    if (train_args_parse(&a, n_flags + 1, flags - 1, 1, err)) fail_exit(err); // (flags[-1] stands in for the program)
    Ref r;
    ref_open(&r, prefix);
    if (a.loop.fp8) check_log(log_path, "train_llama3", &r, TOL_LOSS_FREE_FP8, TOL_NORM_FREE_FP8);
    else check_log(log_path, "train_llama3", &r, TOL_LOSS_FREE, TOL_NORM_FREE);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed > 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

// Whether the flags leave the forward and backward passes as by default: no --recompute, --fp8 or
// --classifier_chunk, and every switch the table marks SWITCH_PASSES at its default (the others only
// change when and how AdamW runs).
static bool forward_backward_default(const TrainArgs* a) {
    Switches d = train_args_default().sw;
    for (int i = 0; i < NUM_FLAGS; i++)
        if (FLAGS[i].scope == SWITCH_PASSES && switch_value(&a->sw, &FLAGS[i]) != switch_value(&d, &FLAGS[i]))
            return false;
    return a->loop.recompute == RECOMPUTE_NONE && !a->loop.fp8 && !a->loop.classifier_chunk;
}

int main(int argc, char** argv) {
    if (argc == 3 && !strcmp(argv[1], "--train_args")) return print_train_args(argv[2]);
    if (argc >= 4 && !strcmp(argv[1], "--log")) return compare_log(argv[2], argv[3], argc - 4, argv + 4);
    if (argc == 2 && !strcmp(argv[1], "--sampling")) return test_sampling();
    if (argc == 2 && !strcmp(argv[1], "--bf16_moments")) return test_bf16_moments();
    if (argc == 2 && !strcmp(argv[1], "--classifier")) return test_classifier();
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: %s REF [switches, --recompute N, --classifier_chunk N] | --train_args REF | --log "
                "LOG.jsonl REF [the run's flags] | --sampling | --bf16_moments | --classifier\n", argv[0]);
        return EXIT_FAILURE;
    }
    char err[L3_ERR_LEN];
    TrainArgs a; // only its optimisation switches and --recompute are used; argv[1] stands in for the program name
    if (train_args_parse(&a, argc - 1, argv + 1, 1, err)) fail_exit(err);
    Ref r;
    ref_open(&r, argv[1]);
    a.sw.sparse_embedding = r.sparse_embedding; // the reference decides how the embedding is updated
    printf("model %s\n", r.model);
    config_print(stdout, &r.cfg);
    printf("reference: B %d T %d, %d steps of %d micro-steps, lr %g wd %g betas %g %g eps %g, %s embedding AdamW\n",
           r.B, r.T, r.n_steps, r.grad_accum, r.opt.sched.peak_lr, r.opt.weight_decay, r.opt.beta1, r.opt.beta2, r.opt.eps,
           r.sparse_embedding ? "lazy" : "dense");
    printf("reference schedule %d warmup %d final_lr_frac %g decay_frac %g, grad_clip %g\n", r.opt.sched.kind,
           r.opt.sched.warmup, r.opt.sched.final_frac, r.opt.sched.decay_frac, r.opt.grad_clip);
    if (r.doc_bos >= 0) printf("reference attention masked to each document, documents start at token %d\n", r.doc_bos);
    if (r.opt.grad_clip > 0) { // a reference whose norms never exceed the clip would not test clipping
        float most = 0;
        for (int t = 0; t < r.n_steps; t++) most = fmaxf(most, r.grad_norms[t]);
        check(most > r.opt.grad_clip, "the reference clips: its largest gradient norm over --grad_clip", most / r.opt.grad_clip,
              1.0);
    }
    Model m;
    RunConfig run = {r.B, r.T, r.grad_accum, a.loop.recompute, a.loop.classifier_chunk, a.loop.fp8, a.loop.fp8_grads,
                     &r.opt, &a.sw, r.doc_bos >= 0, r.doc_bos};
    model_create(&m, &r.cfg, &run, NULL);
    printf("flags given: %d | bf16 grads %d | recompute %d | classifier chunks of %d rows\n", argc - 2,
           m.grads_bf16 != NULL, m.recompute, m.head_rows);
    step_plan_print(stdout, m.step.plan);
    if (argc == 2) {
        test_rope(&m, &r);
        test_files(&m, &r);
    } else {
        printf("     rope and files: not run again (no switch changes them)\n");
    }
    if (argc == 2 || !forward_backward_default(&a)) test_step1(&m, &r);
    else printf("     step 1: not run again (these switches change only the optimizer)\n");
    test_adamw_path(&m, &r);
    test_train_loop(&m, &r);
    test_free_run(&m, &r);
    if (argc == 2) test_determinism(&m, &r, 50), test_nan_guard(&m, &r);
    model_free(&m);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed > 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
