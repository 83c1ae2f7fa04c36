// dev/attention.cu: causal GQA attention of one layer, forward and backward, as train_llama3.cu's
// attention_forward and attention_backward run it, on head-major bf16 q (B, NH, T, HD), k and v
// (B, KVH, T, HD), query head h reading kv head h / G (G = NH / KVH):
//   forward   S = q k^T / sqrt(HD), P = causal softmax(S) (bf16), o = P v, written token-major
//             att_y (B, T, NH*HD) for the out-projection GEMM
//   backward  from d_att_y (token-major): dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P dP)),
//             dQ = dS K / sqrt(HD), dK = dS^T Q / sqrt(HD), all three head-major bf16
// FLOPs, two counts for every version: the full T x T square that the unfused GEMMs compute, 4 B NH
// T^2 HD forward and 8 B NH T^2 HD backward (the rate column's first figure, and its % of the GEMM
// ceiling), and in brackets the causal half of those, as FlashAttention counts the forward (the
// causal mask zeroes half the square; flash attention skips the masked tiles). FlashAttention's
// benchmarks count a backward as 2.5 forwards (the recomputed S = q k^T too): 1.25x our bracket.
//
// build: make dev/attention
// run:   ./dev/attention          validate every version, then time them
//        ./dev/attention K        version K only
//        ./dev/attention --check  validate only, no timing (what `make test` runs)
//        ./dev/attention --sizes 1k,64k  time only the shapes of these T (of 64, 1k, 4k, 16k, 64k)
// scripts/bench_attention.sh runs it beside PyTorch's scaled_dot_product_attention, same shapes.
//
// versions (4 is the trainer's, called through ../kernels.cuh; its launcher is to take 5 on an
// sm_90 GPU at HD 64 and 128 once 5 has passed --check on one: kernels.cuh FLASH_WGMMA_IN_TRAINER;
// a new flash version is a launcher pair in FLASH and a label in LABELS):
//   1  unfused, K/V repeated: k and v copied per query head to (B, NH, T, HD), then batched
//      cuBLASLt GEMMs (matmul) of batch B*NH with M = T, fp32 scores and bf16 P in memory
//      (attention_softmax), o permuted to token-major (permute_heads); the backward sums dK, dV
//      of the G copies per kv head (each copy's kept in fp32: a key every query sees, such as key 0,
//      has per-head gradients of O(1) whose sum cancels to O(0.1), and bf16 copies put that sum
//      past the per-element bound in about 1 run in 17 by a numpy model of the roundings; it failed
//      one H100 run, seed 1796631429671228812). What an implementation without GQA stacking does.
//   2  unfused, stacked GQA: the trainer's --flash_attention 0 path, the same calls with the G
//      query heads of each (batch, kv head) stacked as G*T rows, batch B*KVH, M = G*T, no copies.
//   3  flash attention, scalar transposed tiles, no pipelining (flash3_attention_forward /
//      _backward, below): no T x T buffers, P recomputed in the backward; tiles go global ->
//      registers -> shared, the operands read transposed (V; Q, dO and K in the backward) a second
//      time from global memory into transposed copies by 2-byte shared stores; mma operands by
//      32-bit shared loads; every tile load -> __syncthreads -> compute -> __syncthreads.
//   4  flash attention (flash_attention_forward / _backward): version 3's math on row-major
//      tiles only, loaded once by cp.async and double-buffered, mma operands by ldmatrix (.trans
//      for the transposed ones), the tiles with the most causal work launched first; the
//      trainer's kernel.
//   5  flash attention for Hopper (flash_forward_wgmma / flash_backward_wgmma, sm_90a): version
//      4's math and tiles (128 queries or keys a block, two warpgroups of 64 rows) on wgmma
//      products, the tiles copied by TMA from a producer warp into mbarrier rings, the forward's
//      softmax overlapping the previous tile's P V product; HD 64 and 128 on an sm_90 GPU (not yet
//      run on one: written 2026-12-07, when no GPU could be started).
// timed: LLaMA3.2-1B's heads (NH 32, KVH 8, HD 64) at B=4, T=64 and B=16, T=1024, then the 1B's and
// LLaMA3.1-8B's heads (HD 64 and 128, NH 32, KVH 8) at T = 1k, 4k, 16k and 64k with 65,536 tokens
// each (B = 64, 16, 4, 1); versions 1 and 2 at the first two alone (their T x T buffers: 3 GiB at
// B=16, T=1024, 12 GiB at B=64, T=1k), version 3 at HD 64 alone; a row's median of 5 to 30 calls,
// as many as take about a second, after a warm-up call and one that sizes the run. Validated
// against an fp64 CPU reference (CPU_CASES, with what each guards) at B=2, T=17, NH 4, KVH 2, HD 32
// (one partial tile); B=4, T=64 (the 1B's heads); and with many key tiles at B=2, T=1024, NH 4,
// KVH 2, HD 64 and 128; B=1, T=1031, NH 4, KVH 1, HD 32; and B=1, T=1000 and 1090 with the keys
// ramped so that the softmax's running max moves often. At T=8192 (the 1B's and the 8B's heads,
// B=1) version 5 against version 4; with the timing, at B=16, T=1024 versions 2 on against 1.
// [document mask] (--doc_mask 1) DOC_CASES: rows of documents (BOS at random and at fixed places: tile
// boundaries, a document over many tiles, rows without BOS at 0), versions 1, 2, 4 and 5 against the
// reference masked to each query's document; version 3 runs unmasked only. The spans themselves
// (kernels.cuh doc_spans) against their definition, exactly, also on rows of 131000 tokens; and one
// document per row (no BOS) must give versions 4's and 5's unmasked outputs bit for bit.
#include "common.h"

typedef struct {
    bf16* heads;   // input: q (B, NH, T, HD), then k, v (B, KVH, T, HD)
    bf16* dy;      // input of the backward: d att_y, token-major (B, T, NH*HD)
    bf16* att_y;   // output of the forward: token-major (B, T, NH*HD)
    bf16* dheads;  // output of the backward: dq, dk, dv laid out like heads
    float* scores; // versions 1, 2: (B, NH, T, T) S; dP in the backward
    bf16* probs;   // versions 1, 2: (B, NH, T, T) P; dS after the backward
    bf16* o_heads; // versions 1, 2: (B, NH, T, HD) o; dO in the backward
    bf16 *k_rep, *v_rep;    // version 1: K and V per query head (B, NH, T, HD)
    float *dk_rep, *dv_rep; // version 1: their gradients per query head, fp32 until summed (B, NH, T, HD)
    float *lse2, *dsum; // versions 3, 4: (B, NH, T) log2-sum-exp of each query row, rowsum(dO * O)
    DocSpans docs;      // [document mask] input: each position's document (NULL pointers: plain causal; not owned)
} AttnBuffers;

static size_t qkv_elems(HeadShape sh) { return (size_t)sh.B * sh.T * (sh.NH + 2 * sh.KVH) * sh.HD; }
static size_t q_elems(HeadShape sh) { return (size_t)sh.B * sh.T * sh.NH * sh.HD; }
static size_t kv_elems(HeadShape sh) { return (size_t)sh.B * sh.T * sh.KVH * sh.HD; }
static size_t score_elems(HeadShape sh) { return (size_t)sh.B * sh.NH * sh.T * sh.T; }
static size_t row_elems(HeadShape sh) { return (size_t)sh.B * sh.NH * sh.T; }

template <typename T> static T* alloc_if(bool needed, size_t n) { return needed ? dev_alloc<T>(n) : NULL; }

// Every version's buffers; with unfused false the flash versions' alone (at T = 64k the unfused
// versions' T x T buffers would take hundreds of GiB), the others NULL.
static AttnBuffers attn_alloc(HeadShape sh, bool unfused = true) {
    size_t QKV = qkv_elems(sh), Q = q_elems(sh), S = score_elems(sh);
    AttnBuffers b = {dev_alloc<bf16>(QKV), dev_alloc<bf16>(Q), dev_alloc<bf16>(Q), dev_alloc<bf16>(QKV),
                     alloc_if<float>(unfused, S), alloc_if<bf16>(unfused, S), alloc_if<bf16>(unfused, Q),
                     alloc_if<bf16>(unfused, Q), alloc_if<bf16>(unfused, Q), alloc_if<float>(unfused, Q),
                     alloc_if<float>(unfused, Q), dev_alloc<float>(row_elems(sh)), dev_alloc<float>(row_elems(sh))};
    return b;
}
static void attn_free(AttnBuffers& b) {
    void* all[] = {b.heads, b.dy,    b.att_y,  b.dheads, b.scores, b.probs, b.o_heads,
                   b.k_rep, b.v_rep, b.dk_rep, b.dv_rep, b.lse2,   b.dsum};
    for (void* p : all) CUDA_CHECK(cudaFree(p));
}
// Every buffer a version writes, NaN before a validation run.
static void attn_poison(const AttnBuffers& b, HeadShape sh) {
    dev_poison(b.att_y, q_elems(sh)), dev_poison(b.dheads, qkv_elems(sh));
    dev_poison(b.lse2, row_elems(sh)), dev_poison(b.dsum, row_elems(sh));
    if (!b.scores) return; // (allocated without the unfused versions' buffers)
    dev_poison(b.scores, score_elems(sh)), dev_poison(b.probs, score_elems(sh)), dev_poison(b.o_heads, q_elems(sh));
    dev_poison(b.k_rep, q_elems(sh)), dev_poison(b.v_rep, q_elems(sh));
    dev_poison(b.dk_rep, q_elems(sh)), dev_poison(b.dv_rep, q_elems(sh));
}

// ---- version 1: K and V repeated per query head ----

// k_rep, v_rep (B, NH, T, HD) = k, v (B, KVH, T, HD), each kv head copied for its G query heads.
__global__ void repeat_kv_kernel(bf16* k_rep, bf16* v_rep, const bf16* k, const bf16* v, HeadShape sh) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, head = (size_t)sh.T * sh.HD;
    if (i >= (size_t)sh.B * sh.NH * head) return;
    size_t bh = i / head, b = bh / sh.NH, h = bh % sh.NH;
    size_t src = (b * sh.KVH + h / (sh.NH / sh.KVH)) * head + i % head;
    k_rep[i] = k[src], v_rep[i] = v[src];
}

// dk, dv (B, KVH, T, HD) = dk_rep, dv_rep summed over the G query heads of each kv head (the
// repeat's backward), in fp32, then bf16: rounded once, as the stacked versions' GEMMs round them.
__global__ void sum_kv_heads_kernel(bf16* dk, bf16* dv, const float* dk_rep, const float* dv_rep, HeadShape sh) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, head = (size_t)sh.T * sh.HD;
    if (i >= (size_t)sh.B * sh.KVH * head) return;
    int G = sh.NH / sh.KVH;
    size_t bj = i / head, b = bj / sh.KVH, j = bj % sh.KVH, first = (b * sh.NH + j * G) * head + i % head;
    float sum_k = 0.0f, sum_v = 0.0f;
    for (int g = 0; g < G; g++)
        sum_k += dk_rep[first + g * head], sum_v += dv_rep[first + g * head];
    dk[i] = __float2bfloat16_rn(sum_k), dv[i] = __float2bfloat16_rn(sum_v);
}

static void forward_repeated(Gemm* g, const AttnBuffers& b, HeadShape sh) {
    int T = sh.T, HD = sh.HD, batch = sh.B * sh.NH;
    bf16 *q = b.heads, *k = q + q_elems(sh), *v = k + kv_elems(sh);
    long long s = (long long)T * HD, sp = (long long)T * T;
    repeat_kv_kernel<<<ceil_div(q_elems(sh), 256), 256>>>(b.k_rep, b.v_rep, k, v, sh);
    LAUNCH_CHECK();
    matmul(g, 0, b.scores, q, b.k_rep, T, T, HD, false, true, true, 1.0f / sqrtf((float)HD), 0.0f, batch, s, s, sp);
    attention_softmax(false, b.probs, b.scores, sh, b.docs.start, 0);
    matmul(g, 0, b.o_heads, b.probs, b.v_rep, T, HD, T, false, false, false, 1.0f, 0.0f, batch, sp, s, s);
    permute_heads(false, b.att_y, b.o_heads, sh, 0);
}

static void backward_repeated(Gemm* g, const AttnBuffers& b, HeadShape sh) {
    int T = sh.T, HD = sh.HD, batch = sh.B * sh.NH;
    bf16 *q = b.heads, *dq = b.dheads, *dk = dq + q_elems(sh), *dv = dk + kv_elems(sh), *dout = b.o_heads;
    long long s = (long long)T * HD, sp = (long long)T * T;
    float scale = 1.0f / sqrtf((float)HD);
    permute_heads(true, b.dy, dout, sh, 0);
    matmul(g, 0, b.dv_rep, b.probs, dout, T, HD, T, true, false, true, 1.0f, 0.0f, batch, sp, s, s);
    matmul(g, 0, b.scores, dout, b.v_rep, T, T, HD, false, true, true, 1.0f, 0.0f, batch, s, s, sp);
    attention_softmax(true, b.probs, b.scores, sh, b.docs.start, 0);
    matmul(g, 0, dq, b.probs, b.k_rep, T, HD, T, false, false, false, scale, 0.0f, batch, sp, s, s);
    matmul(g, 0, b.dk_rep, b.probs, q, T, HD, T, true, false, true, scale, 0.0f, batch, sp, s, s);
    sum_kv_heads_kernel<<<ceil_div(kv_elems(sh), 256), 256>>>(dk, dv, b.dk_rep, b.dv_rep, sh);
    LAUNCH_CHECK();
}

// ---- version 2: stacked GQA, train_llama3.cu's attention_forward / _backward with --flash_attention 0 ----

static void forward_stacked(Gemm* g, const AttnBuffers& b, HeadShape sh) {
    int G = sh.NH / sh.KVH, T = sh.T, HD = sh.HD, batch = sh.B * sh.KVH;
    bf16 *q = b.heads, *k = q + q_elems(sh), *v = k + kv_elems(sh);
    long long sq = (long long)G * T * HD, skv = (long long)T * HD, sp = (long long)G * T * T;
    matmul(g, 0, b.scores, q, k, G * T, T, HD, false, true, true, 1.0f / sqrtf((float)HD), 0.0f, batch, sq, skv, sp);
    attention_softmax(false, b.probs, b.scores, sh, b.docs.start, 0);
    matmul(g, 0, b.o_heads, b.probs, v, G * T, HD, T, false, false, false, 1.0f, 0.0f, batch, sp, skv, sq);
    permute_heads(false, b.att_y, b.o_heads, sh, 0);
}

static void backward_stacked(Gemm* g, const AttnBuffers& b, HeadShape sh) {
    int G = sh.NH / sh.KVH, T = sh.T, HD = sh.HD, batch = sh.B * sh.KVH;
    bf16 *q = b.heads, *k = q + q_elems(sh), *v = k + kv_elems(sh);
    bf16 *dq = b.dheads, *dk = dq + q_elems(sh), *dv = dk + kv_elems(sh), *dout = b.o_heads;
    long long sq = (long long)G * T * HD, skv = (long long)T * HD, sp = (long long)G * T * T;
    float scale = 1.0f / sqrtf((float)HD);
    permute_heads(true, b.dy, dout, sh, 0);
    matmul(g, 0, dv, b.probs, dout, T, HD, G * T, true, false, false, 1.0f, 0.0f, batch, sp, sq, skv);
    matmul(g, 0, b.scores, dout, v, G * T, T, HD, false, true, true, 1.0f, 0.0f, batch, sq, skv, sp);
    attention_softmax(true, b.probs, b.scores, sh, b.docs.start, 0);
    matmul(g, 0, dq, b.probs, k, G * T, HD, T, false, false, false, scale, 0.0f, batch, sp, skv, sq);
    matmul(g, 0, dk, b.probs, q, T, HD, G * T, true, false, false, scale, 0.0f, batch, sp, sq, skv);
}

// ---- version 3: flash attention, scalar transposed tiles, no pipelining ----
// The trainer's kernels before version 4, with its launchers' signatures; they share with it
// FA_TILE, FA_THREADS, the mma and packing helpers, the math between the products (the forward's
// online softmax and its output rows, the backward's P and dS), the row stores, and the dsum kernel.

__device__ inline uint32_t ld_bf16x2(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Rows [row0, row0 + 64) of a (rows x HD) bf16 matrix with row stride `stride` into shared
// memory, row-major [64][HD + 8] or transposed [HD][64 + 8] (the +8 staggers banks); rows past
// `rows` read as zeros.
template <int HD, bool TRANSPOSE>
__device__ inline void flash3_load_tile(bf16* tile, const bf16* src, size_t stride, int row0, int rows) {
    for (int i = threadIdx.x; i < FA_TILE * HD / 8; i += FA_THREADS) {
        int r = i / (HD / 8), col = i % (HD / 8) * 8;
        Vec16<bf16> x;
        *reinterpret_cast<int4*>(&x) = make_int4(0, 0, 0, 0);
        if (row0 + r < rows) x = load16(src + (size_t)(row0 + r) * stride + col);
        if (TRANSPOSE)
            for (int e = 0; e < 8; e++) tile[(col + e) * (FA_TILE + 8) + r] = x.v[e];
        else
            store16(tile + r * (HD + 8) + col, x);
    }
}

// This warp's 16 rows of a row-major tile as A fragments, one per 16 columns.
template <int HD>
__device__ inline void flash3_a_fragments(uint32_t (*a)[4], const bf16* tile) {
    const int ld = HD + 8, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
    const bf16* rows = tile + (threadIdx.x / 32) * 16 * ld;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        a[kk][0] = ld_bf16x2(rows + g * ld + kk * 16 + 2 * c);
        a[kk][1] = ld_bf16x2(rows + (g + 8) * ld + kk * 16 + 2 * c);
        a[kk][2] = ld_bf16x2(rows + g * ld + kk * 16 + 8 + 2 * c);
        a[kk][3] = ld_bf16x2(rows + (g + 8) * ld + kk * 16 + 8 + 2 * c);
    }
}

// acc[n] (16 x 8 tile n of a 16 x 64 result) += A (16 x HD, fragments) @ tile^T, where tile is a
// row-major [64][HD + 8] tile: B[k][n] = tile[n][k], contiguous pairs along k.
template <int HD>
__device__ inline void flash3_mma_a_tileT(float (*acc)[4], const uint32_t (*a)[4], const bf16* tile) {
    const int ld = HD + 8, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < FA_TILE / 8; n++)
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            mma_bf16_16816(acc[n], a[kk], ld_bf16x2(tile + (n * 8 + g) * ld + kk * 16 + 2 * c),
                           ld_bf16x2(tile + (n * 8 + g) * ld + kk * 16 + 8 + 2 * c));
}

// acc[d] (16 x 8 tile d of a 16 x HD result) += P (16 x 64, held as the C fragments p) @ M, where
// M (64 x HD) is given transposed: tileT [HD][64 + 8]. P is rounded to bf16 here.
template <int HD>
__device__ inline void flash3_mma_c_tileT(float (*acc)[4], const float (*p)[4], const bf16* tileT) {
    const int ld = FA_TILE + 8, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < FA_TILE / 16; j++) {
        uint32_t a[4] = {pack_bf16x2(p[2 * j][0], p[2 * j][1]), pack_bf16x2(p[2 * j][2], p[2 * j][3]),
                         pack_bf16x2(p[2 * j + 1][0], p[2 * j + 1][1]), pack_bf16x2(p[2 * j + 1][2], p[2 * j + 1][3])};
#pragma unroll
        for (int d = 0; d < HD / 8; d++)
            mma_bf16_16816(acc[d], a, ld_bf16x2(tileT + (d * 8 + g) * ld + j * 16 + 2 * c),
                           ld_bf16x2(tileT + (d * 8 + g) * ld + j * 16 + 8 + 2 * c));
    }
}

// Forward: grid (T/64 query tiles, B*NH), 128 threads. out token-major bf16, lse2 (B*NH*T) fp32.
template <int HD>
__global__ void __launch_bounds__(FA_THREADS)
    flash3_forward_kernel(bf16* out, float* lse2, const bf16* q, const bf16* k, const bf16* v, HeadShape sh,
                          float scale_log2) {
    __shared__ alignas(16) bf16 q_tile[FA_TILE * (HD + 8)], k_tile[FA_TILE * (HD + 8)], vt_tile[HD * (FA_TILE + 8)];
    const int T = sh.T, qt = blockIdx.x, bh = blockIdx.y, b = bh / sh.NH, h = bh % sh.NH;
    const size_t kv_head = ((size_t)b * sh.KVH + h / (sh.NH / sh.KVH)) * T * HD;
    int row[2], first_key[2] = {0, 0};
    frag_rows(row, qt * FA_TILE);
    flash3_load_tile<HD, false>(q_tile, q + (size_t)bh * T * HD, HD, qt * FA_TILE, T);
    __syncthreads();
    uint32_t qa[HD / 16][4];
    flash3_a_fragments<HD>(qa, q_tile);
    float o[HD / 8][4] = {}, row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
    for (int kt = 0; kt <= qt; kt++) {
        __syncthreads(); // everyone is done with the previous K/V tile
        flash3_load_tile<HD, false>(k_tile, k + kv_head, HD, kt * FA_TILE, T);
        flash3_load_tile<HD, true>(vt_tile, v + kv_head, HD, kt * FA_TILE, T);
        __syncthreads();
        float s[FA_TILE / 8][4] = {};
        flash3_mma_a_tileT<HD>(s, qa, k_tile);
        mask_scores<FA_TILE>(s, first_key, row, kt * FA_TILE);
        float correction[2];
        softmax_tile<FA_TILE>(s, row_max, row_sum, scale_log2, correction);
        rescale_rows<HD>(o, correction);
        flash3_mma_c_tileT<HD>(o, s, vt_tile);
    }
    store_forward_rows<HD>(out, lse2, o, row_max, row_sum, row, sh, bh);
}

// dK, dV: grid (T/64 key tiles, B*KVH), 128 threads; each warp owns 16 keys and loops over the
// G query heads sharing them and every query tile at or after its keys (causal).
template <int HD>
__global__ void __launch_bounds__(FA_THREADS)
    flash3_backward_dkv_kernel(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                               const float* lse2, const float* dsum, HeadShape sh, float scale_log2, float scale) {
    __shared__ alignas(16) bf16 q_tile[FA_TILE * (HD + 8)], qt_tile[HD * (FA_TILE + 8)],
        do_tile[FA_TILE * (HD + 8)], dot_tile[HD * (FA_TILE + 8)];
    __shared__ float lse_tile[FA_TILE], dsum_tile[FA_TILE];
    const int T = sh.T, kt = blockIdx.x, b = blockIdx.y / sh.KVH, kvh = blockIdx.y % sh.KVH, G = sh.NH / sh.KVH;
    const size_t kv_head = (size_t)blockIdx.y * T * HD;
    int key[2], last_query[2] = {T - 1, T - 1};
    frag_rows(key, kt * FA_TILE);
    flash3_load_tile<HD, false>(q_tile, k + kv_head, HD, kt * FA_TILE, T); // staging for K and V fragments
    flash3_load_tile<HD, false>(do_tile, v + kv_head, HD, kt * FA_TILE, T);
    __syncthreads();
    uint32_t ka[HD / 16][4], va[HD / 16][4];
    flash3_a_fragments<HD>(ka, q_tile);
    flash3_a_fragments<HD>(va, do_tile);
    float dk_acc[HD / 8][4] = {}, dv_acc[HD / 8][4] = {};
    for (int head = kvh * G; head < (kvh + 1) * G; head++) {
        const size_t bh = (size_t)b * sh.NH + head;
        const bf16* dout_head = dout + (size_t)b * T * sh.NH * HD + head * HD;
        for (int qt = kt; qt * FA_TILE < T; qt++) {
            __syncthreads();
            flash3_load_tile<HD, false>(q_tile, q + bh * T * HD, HD, qt * FA_TILE, T);
            flash3_load_tile<HD, true>(qt_tile, q + bh * T * HD, HD, qt * FA_TILE, T);
            flash3_load_tile<HD, false>(do_tile, dout_head, (size_t)sh.NH * HD, qt * FA_TILE, T);
            flash3_load_tile<HD, true>(dot_tile, dout_head, (size_t)sh.NH * HD, qt * FA_TILE, T);
            if (threadIdx.x < FA_TILE) {
                int t = qt * FA_TILE + threadIdx.x;
                lse_tile[threadIdx.x] = t < T ? lse2[bh * T + t] : 0.0f;
                dsum_tile[threadIdx.x] = t < T ? dsum[bh * T + t] : 0.0f;
            }
            __syncthreads();
            float p[FA_TILE / 8][4] = {}, dp[FA_TILE / 8][4] = {};
            flash3_mma_a_tileT<HD>(p, ka, q_tile);   // S^T = K Q^T, rows are keys
            flash3_mma_a_tileT<HD>(dp, va, do_tile); // dP^T = V dO^T
            softmax_backward_tile<FA_TILE, true>(p, dp, key, last_query, qt * FA_TILE, scale_log2, lse_tile, dsum_tile);
            flash3_mma_c_tileT<HD>(dv_acc, p, dot_tile); // dV += P^T dO
            flash3_mma_c_tileT<HD>(dk_acc, dp, qt_tile); // dK += dS^T Q
        }
    }
    store_head_rows<HD>(dk + kv_head, dk_acc, key, T, scale);
    store_head_rows<HD>(dv + kv_head, dv_acc, key, T, 1.0f);
}

// dQ: grid (T/64 query tiles, B*NH), 128 threads; each warp owns 16 queries and loops over the
// key tiles up to its own (causal), recomputing P and dS.
template <int HD>
__global__ void __launch_bounds__(FA_THREADS)
    flash3_backward_dq_kernel(bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                              const float* lse2, const float* dsum, HeadShape sh, float scale_log2, float scale) {
    __shared__ alignas(16) bf16 k_tile[FA_TILE * (HD + 8)], kt_tile[HD * (FA_TILE + 8)], v_tile[FA_TILE * (HD + 8)];
    const int T = sh.T, qt = blockIdx.x, bh = blockIdx.y, b = bh / sh.NH, h = bh % sh.NH;
    const size_t kv_head = ((size_t)b * sh.KVH + h / (sh.NH / sh.KVH)) * T * HD;
    int row[2], first_key[2] = {0, 0};
    frag_rows(row, qt * FA_TILE);
    flash3_load_tile<HD, false>(k_tile, q + (size_t)bh * T * HD, HD, qt * FA_TILE, T); // staging for Q and dO
    flash3_load_tile<HD, false>(v_tile, dout + (size_t)b * T * sh.NH * HD + h * HD, (size_t)sh.NH * HD, qt * FA_TILE, T);
    __syncthreads();
    uint32_t qa[HD / 16][4], doa[HD / 16][4];
    flash3_a_fragments<HD>(qa, k_tile);
    flash3_a_fragments<HD>(doa, v_tile);
    float lse[2], dsum_row[2], dq_acc[HD / 8][4] = {};
    for (int r = 0; r < 2; r++) {
        lse[r] = row[r] < T ? lse2[(size_t)bh * T + row[r]] : 0.0f;
        dsum_row[r] = row[r] < T ? dsum[(size_t)bh * T + row[r]] : 0.0f;
    }
    for (int kt = 0; kt <= qt; kt++) {
        __syncthreads();
        flash3_load_tile<HD, false>(k_tile, k + kv_head, HD, kt * FA_TILE, T);
        flash3_load_tile<HD, true>(kt_tile, k + kv_head, HD, kt * FA_TILE, T);
        flash3_load_tile<HD, false>(v_tile, v + kv_head, HD, kt * FA_TILE, T);
        __syncthreads();
        float p[FA_TILE / 8][4] = {}, dp[FA_TILE / 8][4] = {};
        flash3_mma_a_tileT<HD>(p, qa, k_tile);   // S = Q K^T
        flash3_mma_a_tileT<HD>(dp, doa, v_tile); // dP = dO V^T
        softmax_backward_tile<FA_TILE, false>(p, dp, first_key, row, kt * FA_TILE, scale_log2, lse, dsum_row); // P, dS
        flash3_mma_c_tileT<HD>(dq_acc, dp, kt_tile); // dQ += dS K
    }
    store_head_rows<HD>(dq + (size_t)bh * T * HD, dq_acc, row, T, scale);
}

// out (token-major) and lse2 (B*NH*T) from head-major q, k, v.
static void flash3_attention_forward(bf16* out, float* lse2, const bf16* q, const bf16* k, const bf16* v, HeadShape sh,
                                     DocSpans, cudaStream_t s) {
    dim3 grid(ceil_div(sh.T, FA_TILE), sh.B * sh.NH);
    float scale_log2 = 1.4426950408889634f / sqrtf((float)sh.HD);
    if (sh.HD == 64) flash3_forward_kernel<64><<<grid, FA_THREADS, 0, s>>>(out, lse2, q, k, v, sh, scale_log2);
    else flash3_forward_kernel<32><<<grid, FA_THREADS, 0, s>>>(out, lse2, q, k, v, sh, scale_log2);
    LAUNCH_CHECK();
}

// dq, dk, dv (head-major) from dout and out (token-major) and the forward's lse2; dsum is scratch
// of B*NH*T floats.
static void flash3_attention_backward(bf16* dq, bf16* dk, bf16* dv, float* dsum, const bf16* dout, const bf16* out,
                                      const bf16* q, const bf16* k, const bf16* v, const float* lse2, HeadShape sh,
                                      DocSpans, cudaStream_t s) {
    attention_row_dot(dsum, dout, out, sh, s);
    float scale = 1.0f / sqrtf((float)sh.HD), scale_log2 = 1.4426950408889634f * scale;
    dim3 grid_kv(ceil_div(sh.T, FA_TILE), sh.B * sh.KVH), grid_q(ceil_div(sh.T, FA_TILE), sh.B * sh.NH);
    if (sh.HD == 64) {
        flash3_backward_dkv_kernel<64><<<grid_kv, FA_THREADS, 0, s>>>(dk, dv, q, k, v, dout, lse2, dsum, sh, scale_log2, scale);
        LAUNCH_CHECK();
        flash3_backward_dq_kernel<64><<<grid_q, FA_THREADS, 0, s>>>(dq, q, k, v, dout, lse2, dsum, sh, scale_log2, scale);
    } else {
        flash3_backward_dkv_kernel<32><<<grid_kv, FA_THREADS, 0, s>>>(dk, dv, q, k, v, dout, lse2, dsum, sh, scale_log2, scale);
        LAUNCH_CHECK();
        flash3_backward_dq_kernel<32><<<grid_q, FA_THREADS, 0, s>>>(dq, q, k, v, dout, lse2, dsum, sh, scale_log2, scale);
    }
    LAUNCH_CHECK();
}

// ---- versions 3 and up: flash attention (4 the trainer's on sm_80, 5 on sm_90) ----

// Versions 4 and 5 as the launcher flash_attention_forward / _backward would pick them.
static void forward_mma(bf16* out, float* lse2, const bf16* q, const bf16* k, const bf16* v, HeadShape sh,
                        DocSpans docs, cudaStream_t s) {
    flash_forward_mma(out, lse2, q, k, v, sh, docs, s);
}
static void backward_mma(bf16* dq, bf16* dk, bf16* dv, float* dsum, const bf16* dout, const bf16* out, const bf16* q,
                         const bf16* k, const bf16* v, const float* lse2, HeadShape sh, DocSpans docs, cudaStream_t s) {
    attention_row_dot(dsum, dout, out, sh, s);
    flash_backward_mma(dq, dk, dv, dsum, dout, q, k, v, lse2, sh, docs, s);
}
static void forward_wgmma(bf16* out, float* lse2, const bf16* q, const bf16* k, const bf16* v, HeadShape sh,
                          DocSpans docs, cudaStream_t s) {
    if (sh.HD == 64) flash_forward_wgmma<64>(out, lse2, q, k, v, sh, docs, s);
    else flash_forward_wgmma<128>(out, lse2, q, k, v, sh, docs, s);
}
static void backward_wgmma(bf16* dq, bf16* dk, bf16* dv, float* dsum, const bf16* dout, const bf16* out, const bf16* q,
                           const bf16* k, const bf16* v, const float* lse2, HeadShape sh, DocSpans docs, cudaStream_t s) {
    attention_row_dot(dsum, dout, out, sh, s);
    if (sh.HD == 64) flash_backward_wgmma<64>(dq, dk, dv, dsum, dout, q, k, v, lse2, sh, docs, s);
    else flash_backward_wgmma<128>(dq, dk, dv, dsum, dout, q, k, v, lse2, sh, docs, s);
}

// Version 3 + i's launchers, FLASH[i], each pair with the trainer's signatures (kernels.cuh's
// flash_attention_forward and _backward). A new version is a pair here and a label.
static const struct {
    decltype(&flash_attention_forward) forward;
    decltype(&flash_attention_backward) backward;
} FLASH[] = {
    {flash3_attention_forward, flash3_attention_backward},
    {forward_mma, backward_mma},
    {forward_wgmma, backward_wgmma},
};
constexpr int N_VERSIONS = 2 + sizeof(FLASH) / sizeof(FLASH[0]);

// (Version 3 has no document mask: it runs plain causal attention whatever b.docs holds.)
static void forward_flash(int version, const AttnBuffers& b, HeadShape sh) {
    bf16 *q = b.heads, *k = q + q_elems(sh), *v = k + kv_elems(sh);
    FLASH[version - 3].forward(b.att_y, b.lse2, q, k, v, sh, b.docs, 0);
}

static void backward_flash(int version, const AttnBuffers& b, HeadShape sh) {
    bf16 *q = b.heads, *k = q + q_elems(sh), *v = k + kv_elems(sh);
    bf16 *dq = b.dheads, *dk = dq + q_elems(sh), *dv = dk + kv_elems(sh);
    FLASH[version - 3].backward(dq, dk, dv, b.dsum, b.dy, b.att_y, q, k, v, b.lse2, sh, b.docs, 0);
}

// Version 3 takes HD 32 or 64 (its static tiles pass 48 KB at 128), version 5 HD 64 or 128 on an
// sm_90 GPU (flash_wgmma_takes); the others take 32, 64 or 128.
static bool version_takes(int version, HeadShape sh) {
    if (version == 3) return sh.HD <= 64;
    if (version == 5) return flash_wgmma_takes(sh);
    return true;
}

static void attention_version(int version, bool backward, Gemm* g, const AttnBuffers& b, HeadShape sh) {
    if (version == 1 && !backward) forward_repeated(g, b, sh);
    else if (version == 1) backward_repeated(g, b, sh);
    else if (version == 2 && !backward) forward_stacked(g, b, sh);
    else if (version == 2) backward_stacked(g, b, sh);
    else if (!backward) forward_flash(version, b, sh);
    else backward_flash(version, b, sh);
}

// ---- CPU reference (fp64) ----

// Query row t of one head: o_row = P v; dq_row, and the row's terms added into dk, dv (fp64).
// D = rowsum(P * dP) = rowsum(dO * O) as the version forms it (ramp_keys): flash from O rounded to
// bf16 (the saved att_y it reads), the unfused versions from P rounded to bf16 (the P they keep).
// q, k, v point at the head's (T, HD) matrices, dOt at row t of dO; p and dp are T-long scratch.
// Keys in the outer loop, so every inner loop walks a row of k, v, dk or dv contiguously. The row
// sees keys first..t: first is 0, or [document mask] the start of t's document.
static void attention_row_cpu(float* o_row, float* dq_row, double* dk, double* dv, const float* q, const float* k,
                              const float* v, const float* dOt, int t, int first, int HD, double* p, double* dp,
                              bool flash) {
    double scale = 1.0 / sqrt((double)HD), mx = -INFINITY, sum = 0.0, dot = 0.0;
    double o[128] = {}, dq[128] = {}; // HD <= 128: flash attention takes 32, 64 or 128
    const float* qt = q + (size_t)t * HD;
    for (int u = first; u <= t; u++) {
        double s = 0.0;
        for (int d = 0; d < HD; d++) s += (double)qt[d] * k[(size_t)u * HD + d];
        p[u] = s * scale;
        mx = std::max(mx, p[u]);
    }
    for (int u = first; u <= t; u++) {
        p[u] = exp(p[u] - mx);
        sum += p[u];
    }
    for (int u = first; u <= t; u++) {
        p[u] /= sum;
        dp[u] = 0.0;
        for (int d = 0; d < HD; d++) {
            dp[u] += (double)dOt[d] * v[(size_t)u * HD + d];
            o[d] += p[u] * v[(size_t)u * HD + d];
        }
    }
    if (flash) for (int d = 0; d < HD; d++) dot += (double)dOt[d] * bf16_round((float)o[d]);
    else for (int u = first; u <= t; u++) dot += bf16_round((float)p[u]) * dp[u];
    for (int u = first; u <= t; u++) {
        double ds = p[u] * (dp[u] - dot); // dS of key u
        const float* ku = k + (size_t)u * HD;
        for (int d = 0; d < HD; d++) {
            dq[d] += ds * ku[d];
            dk[(size_t)u * HD + d] += ds * scale * qt[d];
            dv[(size_t)u * HD + d] += p[u] * dOt[d];
        }
    }
    for (int d = 0; d < HD; d++) {
        o_row[d] = (float)o[d];
        dq_row[d] = (float)(dq[d] * scale);
    }
}

// att_y and dheads (dq, dk, dv head-major) from heads and dy (att_y and dy token-major), with D as
// flash attention (flash) or the unfused versions form it. [document mask] doc_start (B*T; NULL:
// plain causal): each query's first key.
static void attention_cpu(std::vector<float>& att_y, std::vector<float>& dheads, const std::vector<float>& heads,
                          const std::vector<float>& dy, HeadShape sh, bool flash, const int* doc_start) {
    int T = sh.T, HD = sh.HD, G = sh.NH / sh.KVH;
    size_t Q = q_elems(sh), KV = kv_elems(sh), head = (size_t)T * HD;
    std::vector<double> dkv(2 * KV, 0.0), p(T), dp(T); // dk then dv
    for (int b = 0; b < sh.B; b++)
        for (int h = 0; h < sh.NH; h++) {
            size_t qh = ((size_t)b * sh.NH + h) * head, kvh = ((size_t)b * sh.KVH + h / G) * head;
            for (int t = 0; t < T; t++) {
                size_t token_row = ((size_t)b * T + t) * sh.NH * HD + h * HD; // (b, t, head h) token-major
                int first = doc_start ? doc_start[(size_t)b * T + t] : 0;
                attention_row_cpu(&att_y[token_row], &dheads[qh + (size_t)t * HD], &dkv[kvh], &dkv[KV + kvh],
                                  &heads[qh], &heads[Q + kvh], &heads[Q + KV + kvh], &dy[token_row], t, first, HD,
                                  p.data(), dp.data(), flash);
            }
        }
    for (size_t i = 0; i < 2 * KV; i++) dheads[Q + i] = (float)dkv[i];
}

// ---- checks ----

// ||got - ref|| / ||ref|| <= tol over n elements (NaN fails), counted with dev_check's totals.
static bool check_rel_l2(const char* what, const float* got, const float* ref, size_t n, double tol) {
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        err += d * d, norm += (double)ref[i] * ref[i];
    }
    double rel = sqrt(err / norm);
    bool ok = rel <= tol;
    printf("%s %-52s relative L2 error %.2e (tol %.0e)\n", ok ? "ok  " : "FAIL", what, rel, tol);
    ok ? dev_passed++ : dev_failed++;
    return ok;
}

// The forward's att_y and the backward's dq, dk, dv of `got` against `ref`: relative L2 always,
// per element too when `per_element`.
static bool check_outputs(const char* tag, const std::vector<float>* got, const std::vector<float>* ref, HeadShape sh,
                          bool per_element) {
    size_t Q = q_elems(sh), KV = kv_elems(sh);
    const char* names[4] = {"att_y", "dq", "dk", "dv"};
    size_t begin[4] = {0, 0, Q, Q + KV}, count[4] = {Q, Q, KV, KV};
    bool ok = true;
    char what[128];
    for (int i = 0; i < 4; i++) {
        const float *g = got[i > 0].data() + begin[i], *r = ref[i > 0].data() + begin[i];
        snprintf(what, sizeof(what), "%s B=%d T=%d %s", tag, sh.B, sh.T, names[i]);
        if (per_element) ok &= dev_check(what, g, r, count[i], 2e-2f, 2e-2f);
        ok &= check_rel_l2(what, g, r, count[i], 1e-2);
    }
    return ok;
}

// Forward then backward of one version on b's inputs, outputs poisoned first: {att_y, dheads}.
static void run_version(int version, Gemm* g, const AttnBuffers& b, HeadShape sh, std::vector<float>* out) {
    attn_poison(b, sh);
    attention_version(version, false, g, b, sh);
    out[0] = from_bf16(dev_download(b.att_y, q_elems(sh)));
    attention_version(version, true, g, b, sh);
    out[1] = from_bf16(dev_download(b.dheads, qkv_elems(sh)));
}

// Keys at position t scaled by 1 + t / (T - 1), 1 to 2 along the sequence: the scores' spread
// grows with the key position, so a row's max moves at more of its key tiles (36% of the tiles
// after the first at T 1024, against 20% for N(0, 1) keys) and by larger steps, each one a rescale
// of the running sum and output. Scaling q and k alone would not move it more often (for
// identically distributed scores, tile j holds a new max with chance 1/(j + 1) at any scale), and
// x3 (scores of std 9, P nearly one-hot) fails the per-element tolerance with no bug: the backward
// takes D = rowsum(dO * O) from the bf16 O, as FlashAttention-2 does, and that rounding reaches dQ
// and dK (a CPU model of the kernels' roundings: 264 of 131k dQ elements over, up to 2.4x the
// bound). At this ramp the same rounding took one dQ element of 256k to 1.06x the bound on the
// H200 (2026-12-04, DEV_SEED=1796370792274684903, versions 3 and 4 alike; 1 and 2, whose D is
// rowsum(P * dP) of their bf16 P, met the bound at that element when the reference took D from the
// bf16 O), so the reference forms D as each version does (attention_row_cpu): in a numpy model of
// the flash roundings over 16 seeds the worst dQ element fell from 0.53 to 0.32 of the bound.
static void ramp_keys(std::vector<float>& heads, HeadShape sh) {
    float* k = heads.data() + q_elems(sh);
    for (size_t i = 0; i < kv_elems(sh); i++) {
        int t = (int)(i / sh.HD % sh.T);
        k[i] *= 1.0f + (float)t / (sh.T - 1);
    }
}

// A count of elements that must be 0 (mismatches), printed and counted as dev_check's lines are.
static bool check_none_differ(const char* what, size_t differ, size_t n) {
    printf("%s %-52s %zu of %zu elements differ (tol 0)\n", differ ? "FAIL" : "ok  ", what, differ, n);
    differ ? dev_failed++ : dev_passed++;
    return differ == 0;
}

// [document mask] The documents of a validation run: each position's start on the host (the
// reference's first key of each query), the spans on the device (the versions'), and whether every
// row is one document (no BOS at all).
typedef struct {
    std::vector<int> start;
    DocSpans spans;
    bool whole_rows;
} DocRun;

// [document mask] One document per row: a flash version (4 or 5) with the spans (its outputs in
// `masked`) and without them must agree bit for bit, since the mask then keeps every key and skips
// no tile.
static bool same_as_unmasked(int version, Gemm* g, AttnBuffers b, HeadShape sh, const std::vector<float>* masked) {
    std::vector<float> plain[2];
    char what[64];
    b.docs = DocSpans{NULL, NULL};
    run_version(version, g, b, sh, plain);
    size_t differ = 0, n = masked[0].size() + masked[1].size();
    for (int i = 0; i < 2; i++)
        for (size_t j = 0; j < masked[i].size(); j++) differ += memcmp(&masked[i][j], &plain[i][j], 4) != 0;
    snprintf(what, sizeof(what), "v%d one document per row vs no mask, bit for bit", version);
    return check_none_differ(what, differ, n);
}

// Fresh N(0, 1) q, k, v and d att_y (keys ramped when `ramped`) against the fp64 reference.
// Tolerances: P, dS and every output are bf16 (2^-8 relative rounding each at most) with fp32
// accumulation, about 1e-2 relative L2 error at most; per element atol 2e-2 rtol 2e-2 (the
// outputs are O(0.1..1) here). They hold at long T too: an output's rounding errors are relative
// to its own terms and do not grow with the number of tiles (the CPU model above: relative L2
// 2e-3 to 3e-3 at T 1024, the worst element at 0.6 of the per-element bound). [document mask]
// docs (NULL: plain causal): the reference and versions 1, 2 and 4 within each query's document.
static void validate_cpu(HeadShape sh, bool ramped, Gemm* g, const DevArgs& a, bool* ok, const DocRun* docs = NULL) {
    std::vector<float> heads = random_normal(qkv_elems(sh));
    if (ramped) ramp_keys(heads, sh);
    heads = from_bf16(to_bf16(heads));
    std::vector<float> dy = from_bf16(to_bf16(random_normal(q_elems(sh))));
    std::vector<float> ref[2][2], got[2]; // [flash]: D as versions 1, 2 or 3, 4 form it
    for (int flash = 0; flash < 2; flash++) {
        ref[flash][0].resize(q_elems(sh)), ref[flash][1].resize(qkv_elems(sh));
        attention_cpu(ref[flash][0], ref[flash][1], heads, dy, sh, flash, docs ? docs->start.data() : NULL);
    }
    AttnBuffers b = attn_alloc(sh);
    upload_into(b.heads, heads);
    upload_into(b.dy, dy);
    if (docs) b.docs = docs->spans;
    char tag[48];
    for (int version = 1; version <= N_VERSIONS; version++) {
        if (!dev_selected(a, version) || !version_takes(version, sh) || (docs && version == 3)) continue;
        run_version(version, g, b, sh, got);
        snprintf(tag, sizeof(tag), "v%d vs CPU%s%s", version, ramped ? ", ramped K" : "", docs ? ", documents" : "");
        ok[version] &= check_outputs(tag, got, ref[version >= 3], sh, true);
        if (docs && docs->whole_rows && version >= 4) ok[version] &= same_as_unmasked(version, g, b, sh, got);
    }
    attn_free(b);
}

// Where the CPU is too slow: each later version that takes the shape against version `ref` on the
// same random inputs, relative L2 1e-2 (they differ in summation order and where P and dS are
// rounded): at B=16, T=1024 against version 1 (unfused), at long T against version 4 (the unfused
// versions' T x T buffers do not fit there).
static void validate_versions(HeadShape sh, int ref_version, Gemm* g, bool* ok) {
    AttnBuffers b = attn_alloc(sh, ref_version <= 2);
    fill_normal(b.heads, qkv_elems(sh)), fill_normal(b.dy, q_elems(sh));
    std::vector<float> ref[2], got[2];
    run_version(ref_version, g, b, sh, ref);
    char tag[32];
    for (int version = ref_version + 1; version <= N_VERSIONS; version++) {
        if (!version_takes(version, sh) || (version <= 2 && ref_version > 2)) continue;
        run_version(version, g, b, sh, got);
        snprintf(tag, sizeof(tag), "v%d vs v%d", version, ref_version);
        bool same = check_outputs(tag, got, ref, sh, false);
        ok[ref_version] &= same, ok[version] &= same;
    }
    attn_free(b);
}

// ---- [document mask] documents ----

#define DOC_BOS 1 // the token that starts a document here (the kernels only compare ids)

// B rows of T token ids: DOC_BOS at random about once in `every` positions (0: never) and at each
// position of `at` (-1: none) of every row, 0 elsewhere.
static std::vector<int> doc_tokens(int B, int T, int every, const int* at) {
    std::vector<int> tokens((size_t)B * T, 0);
    for (size_t i = 0; i < tokens.size(); i++) {
        int t = (int)(i % T);
        bool fixed = at[0] == t || at[1] == t || at[2] == t || at[3] == t;
        if (fixed || (every && rng_u32() % every == 0)) tokens[i] = DOC_BOS;
    }
    return tokens;
}

// DocSpans by their definition: start[t] the last BOS at or before t (0 if none), end[t] the first
// BOS after t (T if none), row by row.
static void doc_spans_cpu(std::vector<int>& start, std::vector<int>& end, const std::vector<int>& tokens, int B,
                          int T) {
    for (size_t row = 0; row < (size_t)B * T; row += T) {
        for (int t = 0, s = 0; t < T; t++) start[row + t] = s = tokens[row + t] == DOC_BOS ? t : s;
        for (int t = T - 1, e = T; t >= 0; t--) {
            end[row + t] = e;
            if (tokens[row + t] == DOC_BOS) e = t;
        }
    }
}

// kernels.cuh doc_spans on the ids, its outputs poisoned first, against doc_spans_cpu, exactly. Leaves
// the spans on the device in spans (start, then end: 2 B*T ints) and the starts on the host in start.
static bool check_doc_spans(const std::vector<int>& tokens, int B, int T, int* spans, std::vector<int>& start) {
    size_t N = (size_t)B * T, differ = 0;
    std::vector<int> end(N);
    start.resize(N);
    doc_spans_cpu(start, end, tokens, B, T);
    int* ids = dev_upload(tokens);
    dev_poison(spans, 2 * N);
    doc_spans(spans, spans + N, ids, B, T, DOC_BOS, 0);
    std::vector<int> got = dev_download(spans, 2 * N);
    for (size_t i = 0; i < N; i++) differ += (got[i] != start[i]) + (got[N + i] != end[i]);
    CUDA_CHECK(cudaFree(ids));
    char what[64];
    snprintf(what, sizeof(what), "doc_spans B=%d T=%d vs their definition", B, T);
    return check_none_differ(what, differ, 2 * N);
}

// Rows of documents, each against the reference masked to its documents, and what each guards: a BOS
// at random about once in `every` positions (0: none) and at each of `at` (-1: none) in every row.
static const struct {
    HeadShape sh;
    int every, at[4];
} DOC_CASES[] = {
    {{2, 17, 4, 2, 32}, 0, {3, 9, 16, -1}},         // one partial tile: documents inside it, one of the last key
    {{2, 1024, 4, 2, 64}, 0, {-1, -1, -1, -1}},     // one document per row: the plain outputs bit for bit
    {{2, 1024, 4, 2, 64}, 24, {64, 128, 129, -1}},  // many short documents (about 24 keys), tiles 1 and 2 each
                                                    // starting one: the skipping's tile boundaries
    {{1, 1031, 4, 1, 32}, 0, {63, 65, 200, -1}},    // no BOS at 0; key 63's document ends at 65, in the next
                                                    // query tile; one of 831 keys over 14 tiles; ragged tail
    {{2, 1024, 4, 2, 128}, 40, {64, 127, -1, -1}},  // HD 128 (dK/dV's K and V read from shared memory)
};

// [document mask] One layout of DOC_CASES: its spans (check_doc_spans), then the versions on them
// against the masked reference (validate_cpu).
static void validate_docs(HeadShape sh, int every, const int* at, Gemm* g, const DevArgs& a, bool* ok) {
    size_t N = (size_t)sh.B * sh.T;
    std::vector<int> tokens = doc_tokens(sh.B, sh.T, every, at);
    int* spans = dev_alloc<int>(2 * N);
    DocRun docs = {{}, {spans, spans + N}, std::find(tokens.begin(), tokens.end(), DOC_BOS) == tokens.end()};
    ok[4] &= check_doc_spans(tokens, sh.B, sh.T, spans, docs.start);
    validate_cpu(sh, false, g, a, ok, &docs);
    CUDA_CHECK(cudaFree(spans));
}

// [document mask] doc_spans alone on 2 rows of 131000 tokens: 32 chunks of its scan, the last ragged;
// BOS about every 5000, on both sides of the first chunk boundary (4095, 4096) and at the last position.
static bool check_long_spans(void) {
    const int B = 2, T = 131000, at[4] = {4095, 4096, T - 1, -1};
    std::vector<int> tokens = doc_tokens(B, T, 5000, at), start;
    int* spans = dev_alloc<int>(2 * tokens.size());
    bool ok = check_doc_spans(tokens, B, T, spans, start);
    CUDA_CHECK(cudaFree(spans));
    return ok;
}

// ---- timing ----

static const char* LABELS[] = {"1 unfused, repeated K/V", "2 unfused, stacked GQA", "3 flash, scalar transposed tiles",
                               "4 flash, cp.async + ldmatrix (sm_80)", "5 flash, TMA + wgmma (sm_90)"};
static_assert(sizeof(LABELS) / sizeof(LABELS[0]) == N_VERSIONS, "a label for every version");

// The 1B's B=4,T=64 and B=16,T=1024 (the rows dev/PERF.md's history compares), then the 1B's and the
// 8B's heads (NH 32, KVH 8; HD 64 and 128) at T = 1k, 4k, 16k and 64k, 65,536 tokens each.
static std::vector<HeadShape> timed_shapes(void) {
    std::vector<HeadShape> shapes = {{4, 64, 32, 8, 64}, {16, 1024, 32, 8, 64}};
    for (int HD : {64, 128})
        for (int T : {1024, 4096, 16384, 65536}) shapes.push_back({65536 / T, T, 32, 8, HD});
    return shapes;
}

// The unfused versions are timed where their T x T buffers (fp32 S and bf16 P, 6 bytes a score)
// take 4 GiB at most: the two 1B rows (3 GiB at B=16,T=1024). At 65,536 tokens they would take
// 12 GiB at T=1k, 48 at T=4k: the trainer's --flash_attention 0 is a short-T path.
static bool unfused_timed(HeadShape sh) {
    return score_elems(sh) * (sizeof(float) + sizeof(bf16)) <= ((size_t)4 << 30);
}

// The median of fn: one warm-up call and one timed call that sizes the run, then repetitions for
// about a second of calls (30 at most; 5 at least, for the long calls at T = 64k).
template <typename F> static double median_ms_sized(F fn) {
    double first = median_ms(fn, 1, 1);
    return median_ms(fn, 0, 30 * first < 1000.0 ? 30 : std::max(5, (int)(1000.0 / first)));
}

// Versions 1 and 2 overwrite P with dS in the backward, so their timed repetitions run on the
// previous repetition's dS: no kernel does data-dependent work, so the values do not change the
// time. Rotation is sized by the inputs and outputs alone (q, k, v, att_y): what flash attention
// moves; the unfused versions' T x T buffers only add to that. FLOPs: the full T x T square that
// the unfused GEMMs compute, 4 B NH T^2 HD forward and twice that backward, then in brackets the
// causal half (FlashAttention's count: flash attention skips the masked tiles).
static void time_versions(HeadShape sh, Gemm* g, const DevArgs& a, const bool* ok) {
    int sets = rotations(2 * (qkv_elems(sh) + q_elems(sh)));
    std::vector<AttnBuffers> b(sets);
    for (auto& s : b) {
        s = attn_alloc(sh, unfused_timed(sh));
        fill_normal(s.heads, qkv_elems(sh)), fill_normal(s.dy, q_elems(sh));
    }
    double flops = 4.0 * sh.B * sh.NH * (double)sh.T * sh.T * sh.HD;
    char size[48];
    snprintf(size, sizeof(size), "B=%d T=%d HD %d", sh.B, sh.T, sh.HD);
    for (int version = 1; version <= N_VERSIONS; version++) {
        bool timed = version_takes(version, sh) && (version > 2 || unfused_timed(sh));
        if (!dev_selected(a, version) || !timed) continue;
        for (int backward = 0; backward <= 1; backward++) {
            if (backward) // P (lse2 for flash, version 1's K, V copies) from the forward
                for (auto& s : b) attention_version(version, false, g, s, sh);
            int r = 0;
            double ms = median_ms_sized([&] { attention_version(version, backward, g, b[r++ % sets], sh); });
            double f = backward ? 2 * flops : flops;
            print_row(backward ? "attention backward" : "attention forward", LABELS[version - 1], size, ms, 0.0, f,
                      ok[version], f / 2);
        }
    }
    for (auto& s : b) attn_free(s);
}

// The shapes validated against the fp64 CPU reference (about a second of CPU in all), and what
// each guards beyond the ones before it.
static const struct {
    HeadShape sh;
    bool ramped; // keys scaled 1 to 2 along T (ramp_keys)
} CPU_CASES[] = {
    {{2, 17, 4, 2, 32}, false},   // one partial tile: the causal mask and the rows and keys past T
    {{4, 64, 32, 8, 64}, false},  // one full tile of the 1B's heads (NH 32, KVH 8, HD 64)
    {{2, 1024, 4, 2, 64}, false}, // 16 tiles: the double-buffered K/V and Q/dO prefetch, tiles past
                                  // the diagonal skipped, dQ and dK, dV summed over many tiles
    {{1, 1031, 4, 1, 32}, false}, // 17 tiles, the last of 7 rows: the ragged tail after many tiles,
                                  // G = 4 query heads per kv head summed into dK, dV
    {{1, 1000, 4, 4, 64}, true},  // the online softmax's rescale, the row max moving often; HD 64
                                  // with a ragged tail (40 rows), G = 1
    {{2, 1024, 4, 2, 128}, false}, // HD 128: 16 tiles, dK/dV's K and V read from shared memory
    {{1, 1090, 6, 2, 128}, true},  // HD 128 with a ragged tail (2 rows), G = 3, the row max moving
};

int main(int argc, char** argv) {
    std::vector<HeadShape> timed = timed_shapes();
    std::vector<long> lengths; // --sizes picks sequence lengths
    for (const auto& sh : timed)
        if (std::find(lengths.begin(), lengths.end(), sh.T) == lengths.end()) lengths.push_back(sh.T);
    DevArgs a = dev_args(argc, argv, N_VERSIONS, lengths);
    static Gemm g; // the trainer's matmul() state; large (its plan table): not on the stack
    gemm_create(&g);
    bool ok[N_VERSIONS + 1];
    std::fill(ok, ok + N_VERSIONS + 1, true);
    const HeadShape b16t1024 = {16, 1024, 32, 8, 64};
    for (const auto& c : CPU_CASES) validate_cpu(c.sh, c.ramped, &g, a, ok);
    for (const auto& c : DOC_CASES) validate_docs(c.sh, c.every, c.at, &g, a, ok);
    ok[4] &= check_long_spans();
    if (a.version == 0) // the wgmma kernels' 64 key tiles of 128 at long T, at the 1B's and the 8B's heads
        for (int HD : {64, 128}) validate_versions({1, 8192, 32, 8, HD}, 4, &g, ok);
    if (!a.check_only) {
        if (a.version == 0) validate_versions(b16t1024, 1, &g, ok);
        gemm_ceiling_tflops(); // measured before the table, so its line does not split it
        print_header();
        for (const auto& sh : timed)
            if (dev_size_selected(a, sh.T)) time_versions(sh, &g, a, ok);
    }
    gemm_destroy(&g);
    return dev_finish();
}
