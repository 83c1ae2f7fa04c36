// kernels.cuh: every CUDA kernel of the LLaMA 3 trainer and its launcher, in the order a
// training step uses them. Activations are bf16 except the residual stream (fp32, as in PyTorch
// autocast, where the embedding, the residual adds and RMSNorm stay fp32). Weights are read by
// the GEMMs as bf16 shadow copies; norms, Adam and the embedding read the fp32 masters.
// Each seed-report optimisation is tagged in brackets, e.g. [shadow weights], [sparse rows]; so
// are ours past the report, e.g. [bf16 grads], [graphs].
#pragma once
#include <cublasLt.h>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cuda.h> // CUtensorMap (the sm_90 attention's TMA; the driver is reached through the runtime)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#ifndef LLAMA3_NVTX
#define LLAMA3_NVTX 1
#endif
#if LLAMA3_NVTX
#include <nvtx3/nvToolsExtMemCudaRt.h>
#endif
#include <stdint.h>
#include <type_traits>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama3.h" // OptimConfig, LrSchedule and lr_at, evaluated on the device

typedef __nv_bfloat16 bf16;

// ---- error checks ----

// "rank 1: " before the errors of a process of several ranks (the trainer sets it once), else "".
static char rank_tag[32] = "";
static void cuda_check(cudaError_t e, const char* what, const char* file, int line) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "error: %sCUDA error at %s:%d: %s\n  in %s\n", rank_tag, file, line, cudaGetErrorString(e), what);
    exit(EXIT_FAILURE);
}
static void cublas_check(cublasStatus_t s, const char* what, const char* file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "error: %scuBLAS error at %s:%d: status %d\n  in %s\n", rank_tag, file, line, (int)s, what);
    exit(EXIT_FAILURE);
}
#define CUDA_CHECK(call) cuda_check((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) cublas_check((call), #call, __FILE__, __LINE__)
#define LAUNCH_CHECK() cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// cudaMalloc with the amount named when the GPU is out of memory.
static void* device_alloc(size_t bytes, const char* what) {
    void* p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        (void)cudaGetLastError(); // clears the failed allocation's error, so that the query below runs
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) free_b = total_b = 0; // prints 0 of 0
        fprintf(stderr, "%sout of GPU memory: %s needs %.2f GiB, %.2f GiB free of %.2f GiB (%s)\n", rank_tag, what,
                bytes / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0, cudaGetErrorString(e));
        exit(EXIT_FAILURE);
    }
    return p;
}

static inline unsigned ceil_div(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }
static inline bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

// A runtime bool as a template parameter (flash-attention's static_switch.h): runs the lambda
// with CONST_NAME a constexpr true or false, so a launcher names its kernel once,
// kernel<CONST_NAME>, instead of one launch line or ternary per instance. Nest it for two bools.
#define BOOL_SWITCH(COND, CONST_NAME, ...)            \
    [&] {                                             \
        if (COND) {                                   \
            constexpr static bool CONST_NAME = true;  \
            return __VA_ARGS__();                     \
        } else {                                      \
            constexpr static bool CONST_NAME = false; \
            return __VA_ARGS__();                     \
        }                                             \
    }()
// The head dim of a flash attention launch, 32, 64 or 128 (llama3.h kernel_limits_check refuses
// others), as the constexpr CONST_NAME in the lambda: the one place a head dim becomes a template.
#define HEADDIM_SWITCH(HEAD_DIM, CONST_NAME, ...)   \
    [&] {                                           \
        if (HEAD_DIM == 32) {                       \
            constexpr static int CONST_NAME = 32;   \
            return __VA_ARGS__();                   \
        } else if (HEAD_DIM == 64) {                \
            constexpr static int CONST_NAME = 64;   \
            return __VA_ARGS__();                   \
        } else {                                    \
            constexpr static int CONST_NAME = 128;  \
            return __VA_ARGS__();                   \
        }                                           \
    }()

// ---- device helpers ----

__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Sum, or max with MAX, over the block (blockDim.x a multiple of 32); every thread gets the result.
template <bool MAX> __device__ inline float block_reduce(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads(); // a previous call may still be reading partial
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? partial[lane] : MAX ? -INFINITY : 0.0f;
    return MAX ? warp_max(v) : warp_sum(v);
}
__device__ inline float block_sum(float v) { return block_reduce<false>(v); }
__device__ inline float block_max(float v) { return block_reduce<true>(v); }
// [fp8] *amax_bits = max(*amax_bits, the block's largest m), m >= 0: one atomicMax per block on the
// float's bits (non-negative floats order as unsigned integers). Every thread of the block calls it.
__device__ inline void block_amax(unsigned* amax_bits, float m) {
    m = block_max(m);
    if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
}

// 16 bytes moved by one 128-bit load or store: 8 bf16 or 4 floats.
template <typename T> struct alignas(16) Vec16 {
    static constexpr int N = 16 / sizeof(T);
    T v[N];
};
template <typename T> __device__ inline Vec16<T> load16(const T* p) {
    Vec16<T> r;
    *reinterpret_cast<int4*>(&r) = *reinterpret_cast<const int4*>(p);
    return r;
}
template <typename T> __device__ inline void store16(T* p, const Vec16<T>& r) {
    *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(&r);
}
// 4 bf16 (8 bytes) <-> 4 floats, for rows read as float4 alongside.
__device__ inline float4 bf16x4_to_float4(uint2 u) {
    __nv_bfloat162 a = *reinterpret_cast<__nv_bfloat162*>(&u.x), b = *reinterpret_cast<__nv_bfloat162*>(&u.y);
    return make_float4(__low2float(a), __high2float(a), __low2float(b), __high2float(b));
}
__device__ inline float4 load_bf16x4(const bf16* p) { return bf16x4_to_float4(*reinterpret_cast<const uint2*>(p)); }
__device__ inline void store_bf16x4(bf16* p, float4 f) {
    __nv_bfloat162 a = __floats2bfloat162_rn(f.x, f.y), b = __floats2bfloat162_rn(f.z, f.w);
    uint2 u = make_uint2(*reinterpret_cast<unsigned*>(&a), *reinterpret_cast<unsigned*>(&b));
    *reinterpret_cast<uint2*>(p) = u;
}
__device__ inline float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ inline float silu(float x) { return x / (1.0f + expf(-x)); }

// ---- init ----

// Counter-based normal sample for element i of a seeded stream (splitmix64 hash + Box-Muller):
// the same seed gives the same model on any grid shape.
__device__ inline float normal_at(uint64_t seed, uint64_t i) {
    uint64_t z = mix64(seed + (i + 1) * 0x9E3779B97F4A7C15ull);
    float u1 = ((uint32_t)z + 0.5f) * 2.3283064e-10f, u2 = ((uint32_t)(z >> 32) + 0.5f) * 2.3283064e-10f;
    return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

// params[i] = mean + std * N(0,1) over one tensor, element `first` + i of the seed's stream; used
// once at start (random init: std 0.02 for matrices, mean 1 std 0 for norm weights), never inside a
// step. T float, or [bf16 weights] bf16: the fp32 init's value rounded to nearest, so that a run of
// bf16 weights starts from the bf16 copy of the fp32 run's.
template <typename T>
__global__ void init_params_kernel(T* params, size_t first, size_t n, float mean, float std, uint64_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) params[i] = (T)(mean + (std > 0.0f ? std * normal_at(seed, first + i) : 0.0f));
}
template <typename T>
static void init_params(T* params, size_t n, float mean, float std, uint64_t seed, cudaStream_t s, size_t first = 0) {
    if (n == 0) return;
    init_params_kernel<<<ceil_div(n, 256), 256, 0, s>>>(params, first, n, mean, std, seed);
    LAUNCH_CHECK();
}

// bf16 copy of fp32 weights; used once after loading the masters (Adam keeps them in sync after).
__global__ void cast_to_bf16_kernel(bf16* out, const float* in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}
static void cast_to_bf16(bf16* out, const float* in, size_t n, cudaStream_t s) {
    if (n == 0) return;
    cast_to_bf16_kernel<<<ceil_div(n, 256), 256, 0, s>>>(out, in, n);
    LAUNCH_CHECK();
}

// The seed's starting point for zeroing, kept for the ablation (--grad_zeroing fill) and
// dev/zeroing.cu: one launch per buffer, writing zeros that a cudaMemsetAsync writes without a
// kernel, and that the trainer normally never writes at all (its first gradient GEMM uses beta 0).
template <typename T> __global__ void fill_kernel(T* out, size_t n, float value) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (T)value;
}
template <typename T> static void fill(T* out, size_t n, float value, cudaStream_t s) {
    fill_kernel<<<ceil_div(n, 256), 256, 0, s>>>(out, n, value);
    LAUNCH_CHECK();
}

// ---- embedding ----

// resid[n, :] = wte[tokens[n], :] in fp32 (PyTorch's embedding is not autocast).
// One thread moves 16 bytes; C % 4 == 0.
__global__ void embedding_forward_kernel(float* resid, const int* tokens, const float* wte, int N, int C) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= (size_t)N * C) return;
    size_t n = i / C, c = i % C;
    store16(resid + i, load16(wte + (size_t)tokens[n] * C + c));
}
static void embedding_forward(float* resid, const int* tokens, const float* wte, int N, int C, cudaStream_t s) {
    embedding_forward_kernel<<<ceil_div((size_t)N * C / 4, 256), 256, 0, s>>>(resid, tokens, wte, N, C);
    LAUNCH_CHECK();
}

// [sparse rows] Sorting the batch's token ids (stable, with their positions) puts equal ids next
// to each other: the first of each run is that row's owner. This gives the deduplicated row list
// on the device, in a fixed order, with no atomics, no count to read back, and no host sync.
typedef struct {
    int* sorted_tokens;    // (n) ids ascending
    int* sorted_positions; // (n) where each came from, ascending within equal ids
    const int* iota;       // (n) 0..n-1, the values being sorted
    void* temp;
    size_t temp_bytes;
    int end_bit; // bits needed for vocab_size - 1
} TokenSorter;

static void token_sort(const TokenSorter* ts, const int* tokens, int n, cudaStream_t s) {
    size_t temp_bytes = ts->temp_bytes; // (CUB takes it by reference)
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ts->temp, temp_bytes, tokens, ts->sorted_tokens, ts->iota,
                                               ts->sorted_positions, n, 0, ts->end_bit, s));
}

__device__ inline bool owns_row(const int* sorted_tokens, int j) {
    return j == 0 || sorted_tokens[j - 1] != sorted_tokens[j];
}

// [sparse rows] dwte[row] += sum of dresid over the positions holding that row's token, in
// position order (deterministic). dwte is persistent and zero outside the rows touched this
// step; the sparse Adam zeroes those rows again. Block j handles sorted entry j if it owns it;
// each thread owns 4 columns and walks the run of positions with 4 row loads in flight, so a
// frequent token (a thousand positions in real text) is one long streaming read, not a chain of
// dependent loads.
__global__ void embedding_backward_kernel(float* dwte, const float* dresid, const int* sorted_tokens,
                                          const int* sorted_positions, int N, int C) {
    int j = blockIdx.x;
    if (!owns_row(sorted_tokens, j)) return;
    int tok = sorted_tokens[j], end = j + 1;
    while (end < N && sorted_tokens[end] == tok) end++;
    for (int c = threadIdx.x * 4; c < C; c += blockDim.x * 4) {
        Vec16<float> acc = load16(dwte + (size_t)tok * C + c), d[4];
        int k = j;
        for (; k + 4 <= end; k += 4) {
#pragma unroll
            for (int u = 0; u < 4; u++) d[u] = load16(dresid + (size_t)sorted_positions[k + u] * C + c);
#pragma unroll
            for (int u = 0; u < 4; u++)
                for (int e = 0; e < 4; e++) acc.v[e] += d[u].v[e];
        }
        for (; k < end; k++) {
            d[0] = load16(dresid + (size_t)sorted_positions[k] * C + c);
            for (int e = 0; e < 4; e++) acc.v[e] += d[0].v[e];
        }
        store16(dwte + (size_t)tok * C + c, acc);
    }
}
static void embedding_backward(float* dwte, const float* dresid, const TokenSorter* ts, int N, int C, cudaStream_t s) {
    int threads = C / 4 < 1024 ? C / 4 : 1024; // one float4 column group per thread
    embedding_backward_kernel<<<N, threads, 0, s>>>(dwte, dresid, ts->sorted_tokens, ts->sorted_positions, N, C);
    LAUNCH_CHECK();
}

// [data parallel] [sparse rows] Between the wte gradient table and a block of one row per entry of
// the sorted union of every rank's tokens, so that one all-reduce of that block (not of the table)
// sums the rows any rank touched. GATHER: the owning entry of each row copies the table's row into
// its slot (zero where this rank did not touch the row: the table is zero there) and the other
// entries' slots are zeroed; else the summed slots go back into the table. C % 4 == 0 (the
// embedding kernels' requirement too).
template <bool GATHER> __global__ void union_rows_kernel(float* table, float* block, const int* sorted_tokens, int C) {
    int j = blockIdx.x;
    bool owner = owns_row(sorted_tokens, j);
    float* row = table + (size_t)sorted_tokens[j] * C;
    float* slot = block + (size_t)j * C;
    for (int c = threadIdx.x * 4; c < C; c += blockDim.x * 4) {
        if (GATHER) store16(slot + c, owner ? load16(row + c) : Vec16<float>{});
        else if (owner) store16(row + c, load16(slot + c));
    }
}
template <bool GATHER> static void union_rows(float* table, float* block, const int* sorted_tokens, int n, int C,
                                              cudaStream_t s) {
    int threads = C / 4 < 1024 ? C / 4 : 1024;
    union_rows_kernel<GATHER><<<n, threads, 0, s>>>(table, block, sorted_tokens, C);
    LAUNCH_CHECK();
}

// ---- document masks ----

// [document mask] cub::BlockScan's prefix callback for a row scanned chunk by chunk: the block's first
// warp calls it with each chunk's max and receives the max of the chunks before, which the scan of the
// chunk starts from.
struct RunningMax {
    int carry;
    __device__ int operator()(int chunk_max) {
        int before = carry;
        carry = max(carry, chunk_max);
        return before;
    }
};
struct MaxOf {
    __device__ int operator()(int a, int b) const { return max(a, b); }
};

#define SPAN_THREADS 1024
#define SPAN_ITEMS 4 // consecutive positions per thread: a chunk of the row is 4096 positions

// [document mask] The document spans of every position of a row of token ids (DocSpans, below): blockIdx.y
// 0 writes start[t], an inclusive max scan of (t if BOS at t, else 0); 1 writes end[t], the same max scan
// run from the row's end over mirrored indices i = T - 1 - t (BOS at t gives i, else -1), exclusive of t
// itself, mirrored back (T when no BOS follows). One block of 1024 threads per (row, scan) walks the row
// in chunks of 4096 positions, each a cub::BlockScan that starts from the chunks before (RunningMax):
// O(T) per row for any T (131072 is 32 chunks), reading the ids twice and writing 2 B*T ints.
__global__ void __launch_bounds__(SPAN_THREADS) doc_spans_kernel(int* start, int* end, const int* tokens, int T,
                                                                  int bos) {
    typedef cub::BlockScan<int, SPAN_THREADS> Scan;
    __shared__ typename Scan::TempStorage scratch;
    const bool to_end = blockIdx.y == 1;
    const int none = to_end ? -1 : 0;
    const size_t row = (size_t)blockIdx.x * T;
    int* span = (to_end ? end : start) + row;
    auto position = [&](int i) { return to_end ? T - 1 - i : i; }; // of scan index i
    RunningMax before = {none};
    for (int chunk = 0; chunk < T; chunk += SPAN_THREADS * SPAN_ITEMS) {
        const int i0 = chunk + threadIdx.x * SPAN_ITEMS;
        int seen[SPAN_ITEMS], scanned[SPAN_ITEMS];
        for (int j = 0; j < SPAN_ITEMS; j++)
            seen[j] = i0 + j < T && tokens[row + position(i0 + j)] == bos ? i0 + j : none;
        if (to_end) Scan(scratch).ExclusiveScan(seen, scanned, MaxOf(), before);
        else Scan(scratch).InclusiveScan(seen, scanned, MaxOf(), before);
        __syncthreads(); // (the next chunk's scan reuses the scratch)
        for (int j = 0; j < SPAN_ITEMS; j++)
            if (i0 + j < T) span[position(i0 + j)] = position(scanned[j]);
    }
}
// start and end (B*T each) of B rows of T token ids whose documents begin at token `bos`.
static void doc_spans(int* start, int* end, const int* tokens, int B, int T, int bos, cudaStream_t s) {
    doc_spans_kernel<<<dim3(B, 2), SPAN_THREADS, 0, s>>>(start, end, tokens, T, bos);
    LAUNCH_CHECK();
}

// ---- RMSNorm ----

// [row in registers] The fused RMSNorm kernels give a row to one block of rms_threads(C) threads,
// C/8 rounded up to whole warps (256 at C = 2048), each thread holding RMS_VEC float4 column
// groups c = (threadIdx.x + k * blockDim.x) * 4, so every load is a warp-wide 512-byte run. All
// of a row's loads are issued before its block sum: one memory round trip per row, nothing read
// twice, and enough blocks to fill every SM even at N = 256 rows.
#define RMS_VEC 2
static int rms_threads(int C) { return ((C / 4 + RMS_VEC - 1) / RMS_VEC + 31) / 32 * 32; }
__device__ inline int rms_col(int k) { return (threadIdx.x + k * blockDim.x) * 4; }
__device__ inline float4 zero4() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
// float4 rows need C % 4 == 0; a block holds at most 1024 threads.
static void rms_check_width(const char* who, int C) {
    if (C % 4 == 0 && C <= 4 * RMS_VEC * 1024) return;
    fprintf(stderr, "%s: C = %d must be a multiple of 4 and at most %d\n", who, C, 4 * RMS_VEC * 1024);
    exit(EXIT_FAILURE);
}

// [fused RMSNorm] One block per row: (optionally) the residual add h = resid_in + branch, then
// rstd = 1/sqrt(mean(h^2) + eps) and normed = bf16(w * (h * rstd)), the rounding PyTorch autocast
// applies at the next matmul. Reads 4C (+2C) bytes, writes 2C (+4C): one pass instead of the
// seed's pow, mean, add, rsqrt, mul, mul (six kernels) plus the residual add; h stays in
// registers between the sum of squares and the output. Grid: N blocks of rms_threads(C).
// [fp8] amax_bits != NULL: also the largest |normed| onto it (block_amax), for the FP8 GEMM that
// reads normed; rounding to bf16 keeps order, so it is the rounded largest |w * h * rstd|.
template <bool ADD_BRANCH>
__global__ void __launch_bounds__(1024)
    rmsnorm_forward_kernel(float* resid_out, bf16* normed, float* rstd_out, unsigned* amax_bits, const float* resid_in,
                           const bf16* branch, const float* weight, int C, float eps) {
    size_t base = (size_t)blockIdx.x * C;
    float4 h[RMS_VEC], w[RMS_VEC];
    uint2 b[RMS_VEC]; // 4 bf16 of the branch, widened once every load is in flight
#pragma unroll
    for (int k = 0; k < RMS_VEC; k++) { // loads only: arithmetic here would hold back the next group's
        int c = rms_col(k);
        h[k] = w[k] = zero4(), b[k] = make_uint2(0, 0);
        if (c >= C) continue;
        h[k] = *reinterpret_cast<const float4*>(resid_in + base + c);
        w[k] = *reinterpret_cast<const float4*>(weight + c);
        if (ADD_BRANCH) b[k] = *reinterpret_cast<const uint2*>(branch + base + c);
    }
    float sum_sq = 0.0f;
#pragma unroll
    for (int k = 0; k < RMS_VEC; k++) {
        int c = rms_col(k);
        if (ADD_BRANCH) {
            float4 bf = bf16x4_to_float4(b[k]);
            h[k] = make_float4(h[k].x + bf.x, h[k].y + bf.y, h[k].z + bf.z, h[k].w + bf.w);
            if (c < C) *reinterpret_cast<float4*>(resid_out + base + c) = h[k];
        }
        sum_sq += h[k].x * h[k].x + h[k].y * h[k].y + h[k].z * h[k].z + h[k].w * h[k].w;
    }
    float rstd = rsqrtf(block_sum(sum_sq) / C + eps), amax = 0.0f;
#pragma unroll
    for (int k = 0; k < RMS_VEC; k++) {
        int c = rms_col(k);
        if (c >= C) continue;
        float4 o = make_float4(w[k].x * (h[k].x * rstd), w[k].y * (h[k].y * rstd), w[k].z * (h[k].z * rstd),
                               w[k].w * (h[k].w * rstd));
        store_bf16x4(normed + base + c, o);
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w))));
    }
    if (threadIdx.x == 0) rstd_out[blockIdx.x] = rstd;
    if (amax_bits) block_amax(amax_bits, round_bf16(amax)); // (uniform: every thread of the block takes it)
}
// branch == NULL: plain RMSNorm of resid_in (resid_out unused). amax_bits: NULL, or [fp8] where
// the largest |normed| goes (atomicMax onto what is there).
static void rmsnorm_forward(float* resid_out, bf16* normed, float* rstd, const float* resid_in, const bf16* branch,
                            const float* weight, int N, int C, float eps, cudaStream_t s, unsigned* amax_bits = NULL) {
    rms_check_width("rmsnorm_forward", C);
    BOOL_SWITCH(branch != NULL, ADD_BRANCH, [&] {
        rmsnorm_forward_kernel<ADD_BRANCH>
            <<<N, rms_threads(C), 0, s>>>(resid_out, normed, rstd, amax_bits, resid_in, branch, weight, C, eps);
    });
    LAUNCH_CHECK();
}

// [fused RMSNorm] Backward of normed = w * x * rstd, one block (rms_threads(C)) per range of rows,
// the whole block on one row at a time:
//   dn = dy * w,  dx = rstd * (dn - n * mean(dn * n)),  n = x * rstd,
// added into the fp32 residual gradient (or written, for the final norm) and also stored as
// bf16: the branch-output gradient the next GEMMs read. A row's dy, x and old dresid are all
// loaded before its block sum [row in registers]: one round trip per row, 16 bytes per element.
// dw is summed over the block's rows in registers and written once per block to dw_partial
// (gridDim x C); column_sum finishes it. __launch_bounds__(1024) caps registers at 64, so at
// C = 2048 RMS_BWD_BLOCKS_PER_SM blocks of 256 threads are resident on each SM. [fp8] amax_bits
// != NULL: the largest |dresid_bf16| of the block's rows onto it, for the FP8 GEMM that reads it.
#define RMS_BWD_BLOCKS_PER_SM 4
__global__ void __launch_bounds__(1024)
    rmsnorm_backward_kernel(float* dresid, bf16* dresid_bf16, float* dw_partial, unsigned* amax_bits,
                            const bf16* dnormed, const float* x, const float* weight, const float* rstd, int N, int C,
                            int rows_per_block, bool accumulate) {
    float amax = 0.0f;
    float4 w[RMS_VEC], dw[RMS_VEC];
#pragma unroll
    for (int k = 0; k < RMS_VEC; k++) {
        int c = rms_col(k);
        w[k] = c < C ? *reinterpret_cast<const float4*>(weight + c) : zero4();
        dw[k] = zero4();
    }
    int row_end = min(N, (blockIdx.x + 1) * rows_per_block);
    for (int row = blockIdx.x * rows_per_block; row < row_end; row++) {
        size_t base = (size_t)row * C;
        float r = rstd[row], dot = 0.0f;
        float4 n[RMS_VEC], old[RMS_VEC];
        uint2 dy_bf16[RMS_VEC];
#pragma unroll
        for (int k = 0; k < RMS_VEC; k++) { // loads only: arithmetic here would hold back the next group's
            int c = rms_col(k);
            n[k] = old[k] = zero4(), dy_bf16[k] = make_uint2(0, 0);
            if (c >= C) continue;
            dy_bf16[k] = *reinterpret_cast<const uint2*>(dnormed + base + c);
            n[k] = *reinterpret_cast<const float4*>(x + base + c);
            if (accumulate) old[k] = *reinterpret_cast<const float4*>(dresid + base + c);
        }
        float4 dn[RMS_VEC];
#pragma unroll
        for (int k = 0; k < RMS_VEC; k++) {
            float4 dy = bf16x4_to_float4(dy_bf16[k]);
            n[k] = make_float4(n[k].x * r, n[k].y * r, n[k].z * r, n[k].w * r);
            dn[k] = make_float4(dy.x * w[k].x, dy.y * w[k].y, dy.z * w[k].z, dy.w * w[k].w);
            dot += dn[k].x * n[k].x + dn[k].y * n[k].y + dn[k].z * n[k].z + dn[k].w * n[k].w;
            dw[k].x += dy.x * n[k].x, dw[k].y += dy.y * n[k].y, dw[k].z += dy.z * n[k].z, dw[k].w += dy.w * n[k].w;
        }
        float mean_dot = block_sum(dot) / C;
#pragma unroll
        for (int k = 0; k < RMS_VEC; k++) {
            int c = rms_col(k);
            if (c >= C) continue;
            float4 d = make_float4(r * (dn[k].x - n[k].x * mean_dot), r * (dn[k].y - n[k].y * mean_dot),
                                   r * (dn[k].z - n[k].z * mean_dot), r * (dn[k].w - n[k].w * mean_dot));
            if (accumulate) d = make_float4(old[k].x + d.x, old[k].y + d.y, old[k].z + d.z, old[k].w + d.w);
            *reinterpret_cast<float4*>(dresid + base + c) = d;
            store_bf16x4(dresid_bf16 + base + c, d);
            amax = fmaxf(amax, fmaxf(fmaxf(fabsf(d.x), fabsf(d.y)), fmaxf(fabsf(d.z), fabsf(d.w))));
        }
    }
    if (amax_bits) block_amax(amax_bits, round_bf16(amax)); // (uniform, as in the forward)
#pragma unroll
    for (int k = 0; k < RMS_VEC; k++) {
        int c = rms_col(k);
        if (c < C) *reinterpret_cast<float4*>(dw_partial + (size_t)blockIdx.x * C + c) = dw[k];
    }
}

// out[c] (+)= sum over rows of partial[row, c], the rows summed in a fixed order (deterministic).
// Block (8, 32): 8 float4 column groups (128 bytes of a row) by 32 row slices; each thread sums
// every 32nd row with its loads unrolled so several are in flight (the partials were just
// written and sit in L2), then each of the first 32 threads adds up one column's 32 slices.
// Grid: C / 32 blocks.
__global__ void __launch_bounds__(256) column_sum_kernel(float* out, const float* partial, int rows, int C,
                                                         bool accumulate) {
    __shared__ float4 slice[32][8];
    int c = (blockIdx.x * 8 + threadIdx.x) * 4;
    float4 sum = zero4();
    if (c < C) {
#pragma unroll 8
        for (int r = threadIdx.y; r < rows; r += 32) {
            float4 p = *reinterpret_cast<const float4*>(partial + (size_t)r * C + c);
            sum = make_float4(sum.x + p.x, sum.y + p.y, sum.z + p.z, sum.w + p.w);
        }
    }
    slice[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    int t = threadIdx.y * 8 + threadIdx.x, col = blockIdx.x * 32 + t;
    if (t >= 32 || col >= C) return;
    const float* s = reinterpret_cast<const float*>(slice); // row y of slice: the block's 32 columns
    float total = 0.0f;
    for (int y = 0; y < 32; y++) total += s[y * 32 + t];
    out[col] = accumulate ? out[col] + total : total;
}

// Rows per block so that RMS_BWD_BLOCKS_PER_SM blocks run per SM (at N = 256 one row each, so
// every SM has work); dw_partial must hold rms_bwd_blocks x C.
static int rms_bwd_blocks(int N, int sms) {
    int rows = (N + RMS_BWD_BLOCKS_PER_SM * sms - 1) / (RMS_BWD_BLOCKS_PER_SM * sms);
    return (N + rows - 1) / rows;
}
static void rmsnorm_backward(float* dresid, bf16* dresid_bf16, float* dweight, float* dw_partial, const bf16* dnormed,
                             const float* x, const float* weight, const float* rstd, int N, int C, bool accumulate_dx,
                             bool accumulate_dw, int sms, cudaStream_t s, unsigned* amax_bits = NULL) {
    rms_check_width("rmsnorm_backward", C);
    int blocks = rms_bwd_blocks(N, sms), rows = (N + blocks - 1) / blocks;
    rmsnorm_backward_kernel<<<blocks, rms_threads(C), 0, s>>>(dresid, dresid_bf16, dw_partial, amax_bits, dnormed, x,
                                                              weight, rstd, N, C, rows, accumulate_dx);
    LAUNCH_CHECK();
    column_sum_kernel<<<ceil_div(C, 32), dim3(8, 32), 0, s>>>(dweight, dw_partial, blocks, C, accumulate_dw);
    LAUNCH_CHECK();
}

// ---- RMSNorm as separate ops (the ablation's --fused_rmsnorm 0; dev/rmsnorm version 1) ----
// What PyTorch autograd runs for the composite RMSNorm, the seed's starting point: one kernel per
// op, every intermediate in global memory: forward pow, mean, add eps, rsqrt, mul (x * rstd), mul
// (w * that, rounded to bf16), 26 bytes per element against the fused kernel's 6; backward the
// chain in reverse, 64 bytes per element against 16. Elementwise kernels take one element per
// thread (blocks of 256), row kernels one block per row. Scratch: three (N, C) and two (N) fp32
// buffers, reused across the ops (see the launchers).
typedef struct {
    float* nc[3];  // (N, C) each
    float* row[2]; // (N) each
} RmsScratch;


// pow(x, 2): sq = x * x.
__global__ void square_kernel(float* sq, const float* x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) sq[i] = x[i] * x[i];
}
// mean over C: mean[row] = sum_c in[row, c] / C.
__global__ void row_mean_kernel(float* mean, const float* in, int C) {
    const float* row = in + (size_t)blockIdx.x * C;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) sum += row[c];
    sum = block_sum(sum);
    if (threadIdx.x == 0) mean[blockIdx.x] = sum / C;
}
// out = in + s.
__global__ void add_scalar_kernel(float* out, const float* in, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] + s;
}
// out = 1 / sqrt(in).
__global__ void rsqrt_kernel(float* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = rsqrtf(in[i]);
}
// (N, C) tensor times a broadcast vector: out[r, c] = a[r, c] * b[PER_ROW ? r : c]. A bf16 TOut
// rounds to nearest even, the rounding autocast applies before the next matmul.
template <typename TOut, bool PER_ROW>
__global__ void mul_broadcast_kernel(TOut* out, const float* a, const float* b, int N, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    out[i] = a[i] * b[PER_ROW ? i / C : i % C];
}

// mul backward with b broadcast down the rows (b[c]): grad_a = g * b[c], and grad_b[c] += g * a by
// atomicAdd into a zero-filled buffer (the seed's BinaryBwd scatter for a broadcast operand).
__global__ void mul_backward_cols_kernel(float* grad_a, float* grad_b, const bf16* grad, const float* a,
                                         const float* b, int N, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    float g = __bfloat162float(grad[i]);
    grad_a[i] = g * b[i % C];
    atomicAdd(grad_b + i % C, g * a[i]);
}
// mul backward with b broadcast along each row (b[r]): grad_a = g * b[r], and grad_b[r] = sum over
// the row of g * a, one block per row (a row reduction, like the forward's mean).
__global__ void mul_backward_rows_kernel(float* grad_a, float* grad_b, const float* grad, const float* a,
                                         const float* b, int C) {
    size_t row = (size_t)blockIdx.x * C;
    float b_row = b[blockIdx.x], sum = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        grad_a[row + c] = grad[row + c] * b_row;
        sum += grad[row + c] * a[row + c];
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) grad_b[blockIdx.x] = sum;
}
// rsqrt backward: d_in = d_out * -0.5 * out^3 (out = in^-1/2). The eps add passes its gradient on.
__global__ void rsqrt_backward_kernel(float* d_in, const float* d_out, const float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d_in[i] = d_out[i] * -0.5f * out[i] * out[i] * out[i];
}
// mean backward: every element of row r gets d_mean[r] / C.
__global__ void mean_backward_kernel(float* d_in, const float* d_mean, int N, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)N * C) d_in[i] = d_mean[i / C] / C;
}
// pow(x, 2) backward: dx = d_sq * 2x.
__global__ void square_backward_kernel(float* dx, const float* d_sq, const float* x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dx[i] = d_sq[i] * 2.0f * x[i];
}
// x's two gradient paths (through x * rstd and through pow) summed into the residual gradient,
// written or added (accumulate), and its bf16 copy for the next GEMMs.
__global__ void add_grads_kernel(float* dresid, bf16* dresid_bf16, const float* dx_mul, const float* dx_pow, size_t n,
                                 bool accumulate) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float d = dx_mul[i] + dx_pow[i] + (accumulate ? dresid[i] : 0.0f);
    dresid[i] = d;
    dresid_bf16[i] = __float2bfloat16_rn(d);
}

// resid_out = resid_in + branch (fp32 + bf16): the residual add the fused kernel folds in.
__global__ void residual_add_kernel(float* resid_out, const float* resid_in, const bf16* branch, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) resid_out[i] = resid_in[i] + __bfloat162float(branch[i]);
}

// rmsnorm_forward's outputs (same arguments) from the separate ops, plus the residual add as its
// own kernel.
static void rmsnorm_forward_ops(float* resid_out, bf16* normed, float* rstd, const float* resid_in, const bf16* branch,
                                const float* weight, int N, int C, float eps, const RmsScratch* scratch,
                                cudaStream_t s) {
    size_t NC = (size_t)N * C;
    unsigned grid = ceil_div(NC, 256);
    const float* x = resid_in;
    if (branch) {
        residual_add_kernel<<<grid, 256, 0, s>>>(resid_out, resid_in, branch, NC);
        LAUNCH_CHECK();
        x = resid_out;
    }
    float *sq = scratch->nc[0], *n = scratch->nc[1], *mean = scratch->row[0], *mean_eps = scratch->row[1];
    square_kernel<<<grid, 256, 0, s>>>(sq, x, NC);
    LAUNCH_CHECK();
    row_mean_kernel<<<N, 256, 0, s>>>(mean, sq, C);
    LAUNCH_CHECK();
    add_scalar_kernel<<<ceil_div(N, 256), 256, 0, s>>>(mean_eps, mean, eps, N);
    LAUNCH_CHECK();
    rsqrt_kernel<<<ceil_div(N, 256), 256, 0, s>>>(rstd, mean_eps, N);
    LAUNCH_CHECK();
    mul_broadcast_kernel<float, true><<<grid, 256, 0, s>>>(n, x, rstd, N, C);
    LAUNCH_CHECK();
    mul_broadcast_kernel<bf16, false><<<grid, 256, 0, s>>>(normed, n, weight, N, C);
    LAUNCH_CHECK();
}

// rmsnorm_backward's outputs from the forward ops' chain in reverse: normed = w * n, n = x * rstd,
// rstd = rsqrt(mean + eps), mean = mean(sq), sq = x^2. n, which autograd would have saved, is
// recomputed first; dw is summed by atomics into a zeroed (or, accumulating, the old) dweight.
static void rmsnorm_backward_ops(float* dresid, bf16* dresid_bf16, float* dweight, const bf16* dnormed, const float* x,
                                 const float* weight, const float* rstd, int N, int C, bool accumulate_dx,
                                 bool accumulate_dw, const RmsScratch* scratch, cudaStream_t s) {
    size_t NC = (size_t)N * C;
    unsigned grid = ceil_div(NC, 256);
    // n dies after the weight's mul backward, dn after the rows' one: d_sq and dx_pow take their place
    float *n = scratch->nc[0], *dn = scratch->nc[1], *dx_mul = scratch->nc[2], *d_sq = dn, *dx_pow = n;
    float *d_rstd = scratch->row[0], *d_mean = scratch->row[1];
    mul_broadcast_kernel<float, true><<<grid, 256, 0, s>>>(n, x, rstd, N, C);
    LAUNCH_CHECK();
    if (!accumulate_dw) CUDA_CHECK(cudaMemsetAsync(dweight, 0, C * sizeof(float), s));
    mul_backward_cols_kernel<<<grid, 256, 0, s>>>(dn, dweight, dnormed, n, weight, N, C);
    LAUNCH_CHECK();
    mul_backward_rows_kernel<<<N, 256, 0, s>>>(dx_mul, d_rstd, dn, x, rstd, C);
    LAUNCH_CHECK();
    rsqrt_backward_kernel<<<ceil_div(N, 256), 256, 0, s>>>(d_mean, d_rstd, rstd, N);
    LAUNCH_CHECK();
    mean_backward_kernel<<<grid, 256, 0, s>>>(d_sq, d_mean, N, C);
    LAUNCH_CHECK();
    square_backward_kernel<<<grid, 256, 0, s>>>(dx_pow, d_sq, x, NC);
    LAUNCH_CHECK();
    add_grads_kernel<<<grid, 256, 0, s>>>(dresid, dresid_bf16, dx_mul, dx_pow, NC, accumulate_dx);
    LAUNCH_CHECK();
}

// ---- RoPE and head layout ----

// [by-value metadata] Shapes travel as a struct kernel argument (constant bank), never as
// small host-to-device copies. SHAPE_IN_MEMORY reads them from device memory instead, written by a
// pageable cudaMemcpyAsync before each launch: the seed's starting point, kept for the ablation.
typedef struct {
    int B, T, NH, KVH, HD;
} HeadShape;

// [document mask] Where each position's document starts and ends in its packed row (--doc_mask 1):
// start[b*T + t] = the last position <= t of row b holding BOS (0 if none), end[b*T + t] = the first
// position > t holding BOS (T if none). Query t sees key u iff start[t] <= u <= t; equivalently key u
// is seen by the queries t in [u, end[u]). NULL pointers: plain causal attention.
typedef struct { const int* start; const int* end; } DocSpans;

// The launchers' metadata path: by value (shape_in_memory NULL) or copied to shape_in_memory first.
static void stage_shape(HeadShape* shape_in_memory, const HeadShape& sh, cudaStream_t s) {
    if (shape_in_memory)
        CUDA_CHECK(cudaMemcpyAsync(shape_in_memory, &sh, sizeof(sh), cudaMemcpyHostToDevice, s));
}

// [fused RoPE] Between the qkv GEMM's token-major layout (B*T, [Q | K | V]) and the head-major
// layouts the attention GEMMs want: q (B, NH, T, HD), k and v (B, KVH, T, HD), with llama3 RoPE
// on q and k (rotary pairs adjacent, Meta order). INVERSE runs the backward: rotate by -angle and
// scatter back to token-major. One thread moves 8 bf16 (4 pairs); HD % 8 == 0 keeps them in a head.
// Products are rounded before the add (__fmul_rn) as PyTorch's q*cos + rotate_half(q)*sin does.
template <bool INVERSE, bool SHAPE_IN_MEMORY>
__global__ void rope_permute_kernel(bf16* token_major, bf16* q, bf16* k, bf16* v, const float* rope_cos,
                                    const float* rope_sin, HeadShape shape, const HeadShape* shape_in_memory) {
    const HeadShape sh = SHAPE_IN_MEMORY ? *shape_in_memory : shape;
    int C = sh.NH * sh.HD, KVD = sh.KVH * sh.HD, QKV = C + 2 * KVD;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= (size_t)sh.B * sh.T * QKV) return;
    int n = i / QKV, e = i % QKV, b = n / sh.T, t = n % sh.T;
    bf16* head_major;
    int rotate = e < C + KVD;
    if (e < C) head_major = q + (((size_t)b * sh.NH + e / sh.HD) * sh.T + t) * sh.HD + e % sh.HD;
    else if (e < C + KVD) e -= C, head_major = k + (((size_t)b * sh.KVH + e / sh.HD) * sh.T + t) * sh.HD + e % sh.HD;
    else e -= C + KVD, head_major = v + (((size_t)b * sh.KVH + e / sh.HD) * sh.T + t) * sh.HD + e % sh.HD;
    Vec16<bf16> src = load16(INVERSE ? head_major : token_major + i), dst;
    if (rotate) {
        int pair = (e % sh.HD) / 2;
        size_t at = (size_t)t * (sh.HD / 2) + pair;
        Vec16<float> cs = load16(rope_cos + at), sn = load16(rope_sin + at);
        for (int p = 0; p < 4; p++) {
            float x0 = __bfloat162float(src.v[2 * p]), x1 = __bfloat162float(src.v[2 * p + 1]);
            float c = cs.v[p], s = INVERSE ? -sn.v[p] : sn.v[p];
            dst.v[2 * p] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(x0, c), __fmul_rn(-x1, s)));
            dst.v[2 * p + 1] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s)));
        }
    } else {
        dst = src;
    }
    store16(INVERSE ? token_major + i : head_major, dst);
}
static void rope_permute(bool inverse, bf16* token_major, bf16* q, bf16* k, bf16* v, const float* rope_cos,
                         const float* rope_sin, HeadShape sh, cudaStream_t s, HeadShape* shape_in_memory = NULL) {
    unsigned grid = ceil_div((size_t)sh.B * sh.T * (sh.NH + 2 * sh.KVH) * sh.HD / 8, 256);
    stage_shape(shape_in_memory, sh, s);
    BOOL_SWITCH(inverse, INVERSE, [&] {
        BOOL_SWITCH(shape_in_memory != NULL, SHAPE_IN_MEMORY, [&] {
            rope_permute_kernel<INVERSE, SHAPE_IN_MEMORY>
                <<<grid, 256, 0, s>>>(token_major, q, k, v, rope_cos, rope_sin, sh, shape_in_memory);
        });
    });
    LAUNCH_CHECK();
}

// Between (B, T, NH*HD) token-major and (B, NH, T, HD) head-major, 16 bytes per thread:
// attention output into the out-projection GEMM, and its gradient back.
template <bool TO_HEADS, bool SHAPE_IN_MEMORY>
__global__ void permute_heads_kernel(bf16* token_major, bf16* head_major, HeadShape shape,
                                     const HeadShape* shape_in_memory) {
    const HeadShape sh = SHAPE_IN_MEMORY ? *shape_in_memory : shape;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    int C = sh.NH * sh.HD;
    if (i >= (size_t)sh.B * sh.T * C) return;
    int n = i / C, e = i % C, b = n / sh.T, t = n % sh.T;
    size_t h = (((size_t)b * sh.NH + e / sh.HD) * sh.T + t) * sh.HD + e % sh.HD;
    if (TO_HEADS) store16(head_major + h, load16(token_major + i));
    else store16(token_major + i, load16(head_major + h));
}
static void permute_heads(bool to_heads, bf16* token_major, bf16* head_major, HeadShape sh, cudaStream_t s,
                          HeadShape* shape_in_memory = NULL) {
    unsigned grid = ceil_div((size_t)sh.B * sh.T * sh.NH * sh.HD / 8, 256);
    stage_shape(shape_in_memory, sh, s);
    BOOL_SWITCH(to_heads, TO_HEADS, [&] {
        BOOL_SWITCH(shape_in_memory != NULL, SHAPE_IN_MEMORY, [&] {
            permute_heads_kernel<TO_HEADS, SHAPE_IN_MEMORY><<<grid, 256, 0, s>>>(token_major, head_major, sh,
                                                                                 shape_in_memory);
        });
    });
    LAUNCH_CHECK();
}

// ---- attention softmax ----
// The attention GEMMs run per (batch, kv head) with the G = NH/KVH query heads that share it
// stacked as G*T rows, so GQA needs no repeated K/V. Scores are fp32 (B*NH*T rows of T, in (b, head,
// t) order), already scaled by 1/sqrt(HD) in the GEMM; row r is query position r % T of batch row
// r / (NH*T). [document mask] doc_start (B*T; NULL: plain causal): a row's keys begin at its query's
// document start (DocSpans.start), not at 0; P and dS are zero before it as above the diagonal.

// The first key of softmax row `row` (query t = row % T): its document's start, or 0.
__device__ inline int softmax_first_key(const int* doc_start, size_t row, int NH, int T) {
    return doc_start ? doc_start[row / ((size_t)NH * T) * T + row % T] : 0;
}

// Causal softmax, one warp per row: P = exp(s - max) / sum over keys in [first, t], zeros elsewhere,
// written as bf16 (the precision of P in the P @ V GEMM, as in flash attention).
__global__ void attention_softmax_kernel(bf16* probs, const float* scores, const int* doc_start, size_t rows, int NH,
                                         int T) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T, first = softmax_first_key(doc_start, row, NH, T);
    const float* s = scores + (size_t)row * T;
    float mx = -INFINITY;
    for (int c = first + lane; c <= t; c += 32) mx = fmaxf(mx, s[c]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int c = first + lane; c <= t; c += 32) sum += expf(s[c] - mx);
    float inv = 1.0f / warp_sum(sum);
    bf16* p = probs + (size_t)row * T;
    for (int c = lane; c < T; c += 32)
        p[c] = __float2bfloat16_rn(c >= first && c <= t ? expf(s[c] - mx) * inv : 0.0f);
}

// Softmax backward, one warp per row: dS = P * (dP - sum_c P*dP), written as bf16 over P
// (P of this layer is not needed after it). Zeros outside the keys [first, t].
__global__ void attention_softmax_backward_kernel(bf16* probs_to_dscores, const float* dprobs, const int* doc_start,
                                                  size_t rows, int NH, int T) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T, first = softmax_first_key(doc_start, row, NH, T);
    bf16* p = probs_to_dscores + (size_t)row * T;
    const float* dp = dprobs + (size_t)row * T;
    float dot = 0.0f;
    for (int c = first + lane; c <= t; c += 32) dot += __bfloat162float(p[c]) * dp[c];
    dot = warp_sum(dot);
    for (int c = lane; c < T; c += 32)
        p[c] = __float2bfloat16_rn(c >= first && c <= t ? __bfloat162float(p[c]) * (dp[c] - dot) : 0.0f);
}

// The softmax of the B*NH*T score rows of shape sh (backward: its gradient over P), documents as doc_start has them.
static void attention_softmax(bool backward, bf16* probs, const float* scores_or_dprobs, HeadShape sh,
                              const int* doc_start, cudaStream_t s) {
    const int warps = 8;
    const size_t rows = (size_t)sh.B * sh.NH * sh.T;
    if (backward)
        attention_softmax_backward_kernel<<<ceil_div(rows, warps), warps * 32, 0, s>>>(probs, scores_or_dprobs,
                                                                                      doc_start, rows, sh.NH, sh.T);
    else
        attention_softmax_kernel<<<ceil_div(rows, warps), warps * 32, 0, s>>>(probs, scores_or_dprobs, doc_start, rows,
                                                                              sh.NH, sh.T);
    LAUNCH_CHECK();
}

// ---- flash attention ----
// Causal GQA attention that never writes the T x T scores: per 64-query tile, K/V tiles stream
// through shared memory, scores and an online softmax live in registers, and P (bf16) feeds the
// P @ V tensor-core product directly from the score registers (FlashAttention-2). The forward
// saves only the per-row log-sum-exp (base 2). The backward recomputes P: one kernel per key
// tile accumulates dK and dV (looping over the G query heads of its KV head, so GQA needs no
// atomics), one kernel per query tile accumulates dQ. Both are deterministic.
// q, k, v, dq, dk, dv are head-major (B, H, T, HD); the output and its gradient are token-major
// (B, T, NH*HD), as the out-projection GEMM reads and writes them. HD is 32, 64 or 128.
// Version 4 (dev/attention.cu keeps version 3: transposed tiles by scalar stores, no pipelining):
//   [cp.async double buffer] every tile lands in shared memory once, row-major [64][HD + 8], by
//   16-byte cp.async copies that bypass registers; the next streamed tile (K/V in the forward
//   and dQ kernels, Q/dO in the dK/dV kernel) is in flight while the current one is used.
//   [ldmatrix] every mma operand comes from those row-major tiles by ldmatrix, .trans where the
//   product needs the tile transposed (V in P V, dO in P^T dO, Q in dS^T Q, K in dS K).
//   [longest first] the tiles with the most causal work are launched first, so that the
//   shortest ones fill the tail of the grid.
//
// Tensor-core fragments of mma.sync m16n8k16 (bf16 in, fp32 accumulate), lane = 4*g + c:
//   A 16x16: a0 = A[g][2c, 2c+1], a1 = A[g+8][2c, 2c+1], a2 = A[g][2c+8, 2c+9], a3 = A[g+8][2c+8, 2c+9]
//   B 16x8 : b0 = B[2c, 2c+1][g], b1 = B[2c+8, 2c+9][g]
//   C 16x8 : c0, c1 = C[g][2c, 2c+1], c2, c3 = C[g+8][2c, 2c+1]
// A C fragment pair of 8-column tiles (n = 2j, 2j+1) is exactly the A fragment of columns
// 16j..16j+15, which is how P and dS go from one product into the next without shared memory.
// ldmatrix.x4 reads four 8x8 bf16 matrices M0..M3: lane 8i + r gives the address of row r of Mi
// (16 bytes, 16-byte aligned) and register i receives Mi[g][2c, 2c+1]; with .trans it receives
// Mi[2c, 2c+1][g], a column pair. Here the lanes always point at one 16x16 block of a row-major
// tile, lane l at block row l % 16, block column 8 * (l / 16): M0, M1, M2, M3 are the block's
// top-left, bottom-left, top-right and bottom-right quarters. For block rows R.., columns C..:
//   plain,  block = A (rows m, columns k):  r0, r1, r2, r3 = a0, a1, a2, a3
//   plain,  block = B^T (rows n, columns k): (r0, r2) = (b0, b1) of columns n = R..R+7,
//                                            (r1, r3) = (b0, b1) of n = R+8..R+15
//   .trans, block = B (rows k, columns n):   (r0, r1) = (b0, b1) of n = C..C+7,
//                                            (r2, r3) = (b0, b1) of n = C+8..C+15
// The 8 bf16 of padding per row put the 8 rows of one matrix (stride 272, 144 or 80 bytes) in the 8
// distinct 16-byte bank groups: ldmatrix never conflicts (nor, at HD 64, the cp.async stores).

#define FA_TILE 64     // queries or keys per tile
#define FA_THREADS 128 // 4 warps, 16 rows each
static_assert(FA_THREADS == 2 * FA_TILE, "a query tile's lse2 and dsum rows take one copy per thread");

// [dynamic shared memory] The flash kernels' tiles, laid out in this one dynamic buffer by each
// kernel (flash_smem gives its size): at HD 128 a double buffer of K/V tiles is 68 KB, past the
// 48 KB that static shared memory allows.
extern __shared__ __align__(16) unsigned char flash_shared[];

__device__ inline void mma_bf16_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ inline uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
__device__ inline float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ inline float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Four 8x8 bf16 matrices from shared memory, as the note above lays out; .trans reads each
// matrix transposed.
__device__ inline void ldmatrix_x4(uint32_t* r, const bf16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(row)));
}
__device__ inline void ldmatrix_x4_trans(uint32_t* r, const bf16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(row)));
}
// This lane's ldmatrix address in the 16x16 block at (row0, col0) of a row-major [64][HD + 8]
// tile: block row lane % 16, block column 8 * (lane / 16).
template <int HD>
__device__ inline const bf16* block_row(const bf16* tile, int row0, int col0) {
    const int lane = threadIdx.x % 32;
    return tile + (row0 + lane % 16) * (HD + 8) + col0 + lane / 16 * 8;
}

// 16 bytes global -> shared, not through registers (.cg: cached in L2 only). !valid copies no
// byte and zero-fills the 16 (src-size 0); src must still be a mapped address.
__device__ inline void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
}
// 4 bytes (.ca: the form that copies fewer than 16), zero-filled when !valid.
__device__ inline void cp_async4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(valid ? 4 : 0));
}
// Closes this thread's copies issued so far into one group.
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits for all of this thread's groups; a __syncthreads after it publishes every thread's copies.
__device__ inline void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Issues the copies of rows [row0, row0 + 64) of a (rows x HD) bf16 matrix with row stride
// `stride` into a row-major [64][HD + 8] shared tile; rows past `rows` are zero-filled. Eight
// consecutive threads copy one row's 128 (HD 64) bytes: coalesced.
template <int HD>
__device__ inline void load_tile_async(bf16* tile, const bf16* src, size_t stride, int row0, int rows) {
#pragma unroll
    for (int pass = 0; pass < FA_TILE * HD / 8 / FA_THREADS; pass++) {
        int i = pass * FA_THREADS + threadIdx.x, r = i / (HD / 8), col = i % (HD / 8) * 8;
        bool inside = row0 + r < rows;
        cp_async16(tile + r * (HD + 8) + col, src + (inside ? (size_t)(row0 + r) * stride + col : 0), inside);
    }
}

// One key tile of a kv head, K and V rows: the forward and dQ kernels stream them through two.
template <int HD> struct alignas(16) KeyTile {
    bf16 k[FA_TILE * (HD + 8)], v[FA_TILE * (HD + 8)];
    // Issues and commits the copies of key tile kt; k_head, v_head point at the head's row 0.
    __device__ void load(const bf16* k_head, const bf16* v_head, int kt, int T) {
        load_tile_async<HD>(k, k_head, HD, kt * FA_TILE, T);
        load_tile_async<HD>(v, v_head, HD, kt * FA_TILE, T);
        cp_async_commit();
    }
};

// One query tile of a query head for the dK/dV kernel: Q and dO rows, and the forward's lse2
// and the row terms dsum of those queries (threads 0..63 copy lse2, 64..127 dsum).
template <int HD> struct alignas(16) QueryTile {
    bf16 q[FA_TILE * (HD + 8)], dout[FA_TILE * (HD + 8)];
    float lse2[FA_TILE], dsum[FA_TILE];
    // Issues and commits the copies of query tile qt; the pointers are at the head's row 0.
    __device__ void load(const bf16* q_head, const bf16* dout_head, size_t dout_stride, const float* lse2_head,
                         const float* dsum_head, int qt, int T) {
        load_tile_async<HD>(q, q_head, HD, qt * FA_TILE, T);
        load_tile_async<HD>(dout, dout_head, dout_stride, qt * FA_TILE, T);
        const int j = threadIdx.x % FA_TILE, t = qt * FA_TILE + j;
        const float* src = threadIdx.x < FA_TILE ? lse2_head : dsum_head;
        cp_async4((threadIdx.x < FA_TILE ? lse2 : dsum) + j, src + (t < T ? t : 0), t < T);
        cp_async_commit();
    }
};

// This warp's 16 rows of a row-major tile as A fragments, one per 16 columns. With w = 16 * warp:
// lanes 0-7 point at rows w..w+7, columns 16kk..16kk+7 (a0); 8-15 at rows w+8..w+15, the same
// columns (a1); 16-23 at rows w..w+7, columns 16kk+8..16kk+15 (a2); 24-31 at rows w+8.., those (a3).
template <int HD>
__device__ inline void a_fragments(uint32_t (*a)[4], const bf16* tile) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) ldmatrix_x4(a[kk], block_row<HD>(tile, threadIdx.x / 32 * 16, kk * 16));
}

// The A operand that every product of a flash kernel's loop shares: this warp's 16 rows of a
// resident tile (Q; K or V; Q or dO) as the fragments of a_fragments, held in registers (HD / 4
// of them), or with FROM_SMEM read again from the tile by one ldmatrix per k step.
template <int HD, bool FROM_SMEM> struct ResidentRows {
    uint32_t a[HD / 16][4];
    __device__ explicit ResidentRows(const bf16* tile) { a_fragments<HD>(a, tile); }
    __device__ void fragment(uint32_t* r, int kk) const {
        for (int i = 0; i < 4; i++) r[i] = a[kk][i];
    }
};
template <int HD> struct ResidentRows<HD, true> {
    const bf16* tile;
    __device__ explicit ResidentRows(const bf16* t) : tile(t) {}
    __device__ void fragment(uint32_t* r, int kk) const {
        ldmatrix_x4(r, block_row<HD>(tile, threadIdx.x / 32 * 16, kk * 16));
    }
};

// acc[n] (16 x 8 tile n of a 16 x 64 result) += A (16 x HD, ResidentRows) @ tile^T, where tile is a
// row-major [64][HD + 8] tile: B[k][n] = tile[n][k], so b0 of n tile n = tile[8n+g][2c, 2c+1]
// (k step kk adds 16kk to the column) is row g of a plain 8x8 matrix. One ldmatrix per 16x16
// block: lanes 0-7 point at tile rows 8n..8n+7, columns 16kk..16kk+7 (b0 of n tile n); 8-15 at
// rows 8n+8..8n+15, the same columns (b0 of n + 1); 16-23 at rows 8n..8n+7, columns
// 16kk+8..16kk+15 (b1 of n); 24-31 at rows 8n+8..8n+15, those columns (b1 of n + 1).
template <int HD, bool FROM_SMEM>
__device__ inline void mma_a_tileT(float (*acc)[4], const ResidentRows<HD, FROM_SMEM>& rows, const bf16* tile) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t a[4];
        rows.fragment(a, kk);
#pragma unroll
        for (int n = 0; n < FA_TILE / 8; n += 2) {
            uint32_t b[4]; // b[0], b[2]: b0, b1 of n tile n; b[1], b[3]: b0, b1 of n tile n + 1
            ldmatrix_x4(b, block_row<HD>(tile, n * 8, kk * 16));
            mma_bf16_16816(acc[n], a, b[0], b[2]);
            mma_bf16_16816(acc[n + 1], a, b[1], b[3]);
        }
    }
}

// The A fragment of columns 16j..16j+15 of a 16-row tile held as C fragments (those of columns
// 8(2j).. and 8(2j+1)..: a C fragment pair is an A fragment), rounded to bf16: P and dS going from
// one product into the next without shared memory.
__device__ inline void c_to_a_fragment(uint32_t* a, const float (*c)[4], int j) {
    a[0] = pack_bf16x2(c[2 * j][0], c[2 * j][1]), a[1] = pack_bf16x2(c[2 * j][2], c[2 * j][3]);
    a[2] = pack_bf16x2(c[2 * j + 1][0], c[2 * j + 1][1]), a[3] = pack_bf16x2(c[2 * j + 1][2], c[2 * j + 1][3]);
}

// acc[d] (16 x 8 tile d of a 16 x HD result) += P (16 x 64, held as the C fragments p) @ tile,
// tile row-major [64][HD + 8]: B[k][n] = tile[k][n], so b0 of n tile d at k step j =
// tile[16j+2c, 16j+2c+1][8d+g] is a column pair of an 8x8 matrix: ldmatrix.trans. Lanes 0-7 point
// at tile rows 16j..16j+7, columns 8d..8d+7 (b0 of n tile d); 8-15 at rows 16j+8..16j+15, the
// same columns (b1 of d); 16-23 at rows 16j..16j+7, columns 8d+8..8d+15 (b0 of d + 1); 24-31 at
// rows 16j+8..16j+15, those columns (b1 of d + 1). P is rounded to bf16 here.
template <int HD>
__device__ inline void mma_c_tile(float (*acc)[4], const float (*p)[4], const bf16* tile) {
#pragma unroll
    for (int j = 0; j < FA_TILE / 16; j++) {
        uint32_t a[4];
        c_to_a_fragment(a, p, j);
#pragma unroll
        for (int d = 0; d < HD / 8; d += 2) {
            uint32_t b[4]; // b[0], b[1]: b0, b1 of n tile d; b[2], b[3]: b0, b1 of n tile d + 1
            ldmatrix_x4_trans(b, block_row<HD>(tile, j * 16, d * 8));
            mma_bf16_16816(acc[d], a, b[0], b[1]);
            mma_bf16_16816(acc[d + 1], a, b[2], b[3]);
        }
    }
}

// Column index of element e of C fragment n (8 columns each) within its tile.
__device__ inline int frag_col(int n, int e) { return n * 8 + 2 * (threadIdx.x % 4) + (e & 1); }
// The two rows of a tile starting at row0 whose C fragments this thread holds (elements 0, 1 and
// 2, 3): warp w of its group of four (a flash kernel's block, or a wgmma warpgroup) owns rows
// 16w..16w+15, lane 4g + c rows 16w + g and 16w + g + 8.
__device__ inline void frag_rows(int* row, int row0) {
    row[0] = row0 + (int)threadIdx.x % 128 / 32 * 16 + (int)threadIdx.x % 32 / 4;
    row[1] = row[0] + 8;
}

// [causal] What a tile's row r sees: the columns [lo[r], hi[r]]. A query row sees the keys from
// its document's start (0 without a document mask) to itself; a key row (the dK/dV kernels') the
// queries from itself to its document's last one, at most T - 1. Scores outside become -inf.
template <int COLS> __device__ inline void mask_scores(float (*s)[4], const int* lo, const int* hi, int col0) {
#pragma unroll
    for (int n = 0; n < COLS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = col0 + frag_col(n, e);
            if (col < lo[e >> 1] || col > hi[e >> 1]) s[n][e] = -INFINITY;
        }
}

// [online softmax] One key tile of the forward (FlashAttention-2), in registers: S (this warp's 16
// query rows x COLS keys, unscaled C fragments, masked to -inf) becomes P = exp2(S * scale_log2 -
// max); the running row max moves to the tile's, the running sums are rescaled by correction =
// exp2(old max - new max) before P is added, and the output accumulator must be too (rescale_rows:
// apart, so that the wgmma kernel can do it once its P V product of the last tile has landed).
template <int COLS>
__device__ inline void softmax_tile(float (*s)[4], float* row_max, float* row_sum, float scale_log2, float* correction) {
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < COLS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s[n][e] *= scale_log2;
            tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[n][e]);
        }
    float base[2];
    for (int r = 0; r < 2; r++) {
        float new_max = fmaxf(row_max[r], quad_max(tile_max[r]));
        base[r] = new_max == -INFINITY ? 0.0f : new_max; // a row with no key yet
        correction[r] = exp2f(row_max[r] - base[r]);
        row_max[r] = new_max, row_sum[r] *= correction[r];
    }
#pragma unroll
    for (int n = 0; n < COLS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[n][e] = exp2f(s[n][e] - base[e >> 1]), row_sum[e >> 1] += s[n][e];
}
// o (this warp's 16 rows x HD, C fragments) times its rows' softmax_tile corrections.
template <int HD> __device__ inline void rescale_rows(float (*o)[4], const float* correction) {
#pragma unroll
    for (int d = 0; d < HD / 8; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[d][e] *= correction[e >> 1];
}

// The forward's end: this thread's rows of o / rowsum (bf16) into token-major out (B, T, NH*HD) and
// their log2-sum-exp into lse2 (B*NH*T); rows past T are skipped. bh = b * NH + h.
template <int HD>
__device__ inline void store_forward_rows(bf16* out, float* lse2, const float (*o)[4], const float* row_max,
                                          const float* row_sum, const int* row, HeadShape sh, int bh) {
    const int c = threadIdx.x % 4, b = bh / sh.NH, h = bh % sh.NH;
    for (int r = 0; r < 2; r++) {
        float sum = quad_sum(row_sum[r]); // before the skip: a warp's rows may straddle T
        if (row[r] >= sh.T) continue;
        bf16* dst = out + ((size_t)b * sh.T + row[r]) * sh.NH * HD + h * HD + 2 * c;
        for (int d = 0; d < HD / 8; d++)
            *reinterpret_cast<uint32_t*>(dst + d * 8) = pack_bf16x2(o[d][2 * r] / sum, o[d][2 * r + 1] / sum);
        if (c == 0) lse2[(size_t)bh * sh.T + row[r]] = row_max[r] + log2f(sum);
    }
}

// [recomputed P] P and dS of one 16 x COLS tile of the backward, in place of S (unscaled, in p)
// and dP (in dp): P = exp2(S * scale_log2 - lse2) and dS = P * (dP - dsum) where row r sees the
// column (lo[r] <= column <= hi[r], as mask_scores), else 0 (by a select: lse2 and dsum of rows
// past T may be anything). Rows are queries (the dQ products; lse2, dsum per row r, the columns
// keys from col0) or, with ROWS_ARE_KEYS, keys (the transposed products S^T, dP^T of dK and dV;
// lse2, dsum per column j of the tile, the columns queries from col0).
template <int COLS, bool ROWS_ARE_KEYS>
__device__ inline void softmax_backward_tile(float (*p)[4], float (*dp)[4], const int* lo, const int* hi, int col0,
                                             float scale_log2, const float* lse2, const float* dsum) {
#pragma unroll
    for (int n = 0; n < COLS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e >> 1, j = frag_col(n, e), col = col0 + j, i = ROWS_ARE_KEYS ? j : r;
            const bool visible = col >= lo[r] && col <= hi[r];
            p[n][e] = visible ? exp2f(p[n][e] * scale_log2 - lse2[i]) : 0.0f;
            dp[n][e] = visible ? p[n][e] * (dp[n][e] - dsum[i]) : 0.0f;
        }
}

// Rows row[0], row[1] (those < T) of a 16 x HD C-fragment accumulator, times scale, as bf16 rows of
// a head-major (T, HD) matrix: the backward's dQ, dK, dV.
template <int HD>
__device__ inline void store_head_rows(bf16* head, const float (*acc)[4], const int* row, int T, float scale) {
    const int c = threadIdx.x % 4;
    for (int r = 0; r < 2; r++) {
        if (row[r] >= T) continue;
        bf16* dst = head + (size_t)row[r] * HD + 2 * c;
        for (int d = 0; d < HD / 8; d++)
            *reinterpret_cast<uint32_t*>(dst + d * 8) = pack_bf16x2(acc[d][2 * r] * scale, acc[d][2 * r + 1] * scale);
    }
}

// [document mask] The first position of the document of position t of batch row b, where the keys
// its query sees start (0 without the mask, or for a t past T: such a row keeps its keys, and so a
// finite softmax, as without the mask).
template <bool DOC_MASK> __device__ inline int doc_first(DocSpans docs, int b, int t, int T) {
    return DOC_MASK && t < T ? docs.start[(size_t)b * T + t] : 0;
}
// The last position of the document of position t, the last query that sees key t (T - 1 without
// the mask, or for a t past T).
template <bool DOC_MASK> __device__ inline int doc_last(DocSpans docs, int b, int t, int T) {
    return DOC_MASK && t < T ? docs.end[(size_t)b * T + t] - 1 : T - 1;
}

// The first key each of this thread's query rows sees, and the first key tile the query tile qt
// needs: its first query's document start's (starts only grow along t). Without the mask: 0, no loads.
template <bool DOC_MASK>
__device__ inline int doc_first_keys(int* first_key, const int* row, DocSpans docs, int b, int qt, int T) {
    for (int r = 0; r < 2; r++) first_key[r] = doc_first<DOC_MASK>(docs, b, row[r], T);
    return doc_first<DOC_MASK>(docs, b, qt * FA_TILE, T) / FA_TILE;
}

// The last query each of this thread's key rows is seen by, and how many query tiles from its own
// the key tile kt needs: up to the tile of its last key's document end (ends only grow along t).
// Without the mask: T - 1, every tile to the last, no loads.
template <bool DOC_MASK>
__device__ inline int doc_query_tiles(int* last_query, const int* key, DocSpans docs, int b, int kt, int T) {
    for (int r = 0; r < 2; r++) last_query[r] = doc_last<DOC_MASK>(docs, b, key[r], T);
    return doc_last<DOC_MASK>(docs, b, min(kt * FA_TILE + FA_TILE - 1, T - 1), T) / FA_TILE + 1 - kt;
}

// Forward: grid (B*NH, T/64 query tiles, the last tile, with the most keys, first), 128 threads,
// each warp 16 queries; K/V tiles double-buffered. out token-major bf16, lse2 (B*NH*T) fp32.
// [document mask] DOC_MASK: the key tiles from the one that holds the tile's first document start on
// (those before it are skipped: a sequence of short documents costs less than a long one), and each
// key before its query's document start masked.
template <int HD, bool DOC_MASK>
__global__ void __launch_bounds__(FA_THREADS)
    flash_forward_kernel(bf16* out, float* lse2, const bf16* q, const bf16* k, const bf16* v, HeadShape sh,
                         DocSpans docs, float scale_log2) {
    KeyTile<HD>* kv = reinterpret_cast<KeyTile<HD>*>(flash_shared); // [2]
    const int T = sh.T, qt = gridDim.y - 1 - blockIdx.y, bh = blockIdx.x, b = bh / sh.NH, h = bh % sh.NH;
    const size_t kv_head = ((size_t)b * sh.KVH + h / (sh.NH / sh.KVH)) * T * HD;
    int row[2], first_key[2];
    frag_rows(row, qt * FA_TILE);
    const int kt0 = doc_first_keys<DOC_MASK>(first_key, row, docs, b, qt, T);
    load_tile_async<HD>(kv[1].k, q + (size_t)bh * T * HD, HD, qt * FA_TILE, T); // Q, staged where tile 1 goes
    kv[0].load(k + kv_head, v + kv_head, kt0, T);
    cp_async_wait_all();
    __syncthreads();
    const ResidentRows<HD, false> qa(kv[1].k);
    float o[HD / 8][4] = {}, row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
    for (int kt = kt0; kt <= qt; kt++) {
        const int buf = (kt - kt0) % 2; // (tile kt0 in kv[0]: kv[1] held Q until the registers took it)
        cp_async_wait_all();
        __syncthreads(); // tile kt landed for all threads, and all are done with kv[buf ^ 1]
        if (kt < qt) kv[buf ^ 1].load(k + kv_head, v + kv_head, kt + 1, T);
        const KeyTile<HD>& tile = kv[buf];
        float s[FA_TILE / 8][4] = {};
        mma_a_tileT(s, qa, tile.k);
        if (kt == qt || DOC_MASK) mask_scores<FA_TILE>(s, first_key, row, kt * FA_TILE); // (keys past T: past rows < T)
        float correction[2];
        softmax_tile<FA_TILE>(s, row_max, row_sum, scale_log2, correction);
        rescale_rows<HD>(o, correction);
        mma_c_tile<HD>(o, s, tile.v);
    }
    store_forward_rows<HD>(out, lse2, o, row_max, row_sum, row, sh, bh);
}

// D[b, h, t] = sum over HD of dO * O (bf16 inputs, fp32 sum): the softmax backward's row term.
// One thread per (token, head) row; both token-major.
__global__ void attention_row_dot_kernel(float* dsum, const bf16* dout, const bf16* out, HeadShape sh) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; // (b, t, h)
    if (i >= (size_t)sh.B * sh.T * sh.NH) return;
    int h = i % sh.NH, t = i / sh.NH % sh.T, b = i / ((size_t)sh.NH * sh.T);
    float sum = 0.0f;
    for (int d = 0; d < sh.HD; d += 8) {
        Vec16<bf16> x = load16(dout + i * sh.HD + d), y = load16(out + i * sh.HD + d);
        for (int e = 0; e < 8; e++) sum += __bfloat162float(x.v[e]) * __bfloat162float(y.v[e]);
    }
    dsum[((size_t)b * sh.NH + h) * sh.T + t] = sum;
}

// [K/V from shared memory] The dK/dV kernel's per-thread registers at HD 128: dK and dV
// accumulators 2 * HD / 2 = 128, P^T and dP^T 2 * 32 = 64, and K, V held as fragments 2 * HD / 4 =
// 64 more: past the 255 a thread may have (ptxas spilled 332 bytes). So at HD 128 K and V stay in a
// KeyTile after the two QueryTiles and each product reads its A fragments from there by ldmatrix
// (one more per 16 keys x 16 columns of HD, beside the 4 of Q or dO); at HD 32 and 64 they are
// staged where step 1 goes and held in registers.
template <int HD> constexpr bool DKV_KV_FROM_SMEM = HD > 64;

// dK, dV: grid (B*KVH, T/64 key tiles, tile 0, with the most queries, first), 128 threads; each
// warp owns 16 keys. The G query heads sharing them times the query tiles at or after them
// (causal) stream through two double-buffered QueryTiles, step i = head i / tiles, tile i % tiles.
// [document mask] DOC_MASK: the query tiles only up to the one that holds the last key's document end
// - 1, and each query at or past its key's document end masked.
template <int HD, bool DOC_MASK>
__global__ void __launch_bounds__(FA_THREADS)
    flash_backward_dkv_kernel(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                              const float* lse2, const float* dsum, HeadShape sh, DocSpans docs, float scale_log2,
                              float scale) {
    QueryTile<HD>* qs = reinterpret_cast<QueryTile<HD>*>(flash_shared); // [2]
    const int T = sh.T, kt = blockIdx.y, b = blockIdx.x / sh.KVH, kvh = blockIdx.x % sh.KVH, G = sh.NH / sh.KVH;
    int key[2], last_query[2];
    frag_rows(key, kt * FA_TILE);
    const int tiles = doc_query_tiles<DOC_MASK>(last_query, key, docs, b, kt, T), steps = G * tiles;
    const size_t kv_head = (size_t)blockIdx.x * T * HD;
    auto load_step = [&](int i) { // issues and commits step i's copies into qs[i % 2]
        const int head = kvh * G + i / tiles;
        const size_t bh = (size_t)b * sh.NH + head;
        qs[i % 2].load(q + bh * T * HD, dout + (size_t)b * T * sh.NH * HD + head * HD, (size_t)sh.NH * HD,
                       lse2 + bh * T, dsum + bh * T, kt + i % tiles, T);
    };
    KeyTile<HD>* kept = reinterpret_cast<KeyTile<HD>*>(qs + 2); // K and V at HD 128
    bf16* k_rows = DKV_KV_FROM_SMEM<HD> ? kept->k : qs[1].q;      // else staged where step 1 goes
    bf16* v_rows = DKV_KV_FROM_SMEM<HD> ? kept->v : qs[1].dout;
    load_tile_async<HD>(k_rows, k + kv_head, HD, kt * FA_TILE, T);
    load_tile_async<HD>(v_rows, v + kv_head, HD, kt * FA_TILE, T);
    load_step(0);
    cp_async_wait_all();
    __syncthreads();
    const ResidentRows<HD, DKV_KV_FROM_SMEM<HD>> ka(k_rows), va(v_rows);
    float dk_acc[HD / 8][4] = {}, dv_acc[HD / 8][4] = {};
    for (int i = 0; i < steps; i++) {
        cp_async_wait_all();
        __syncthreads(); // step i landed for all threads, and all are done with qs[(i + 1) % 2]
        if (i + 1 < steps) load_step(i + 1);
        const QueryTile<HD>& tile = qs[i % 2];
        const int qt = kt + i % tiles;
        float p[FA_TILE / 8][4] = {}, dp[FA_TILE / 8][4] = {};
        mma_a_tileT(p, ka, tile.q);     // S^T = K Q^T, rows are keys
        mma_a_tileT(dp, va, tile.dout); // dP^T = V dO^T
        softmax_backward_tile<FA_TILE, true>(p, dp, key, last_query, qt * FA_TILE, scale_log2, tile.lse2, tile.dsum);
        mma_c_tile<HD>(dv_acc, p, tile.dout); // dV += P^T dO
        mma_c_tile<HD>(dk_acc, dp, tile.q);   // dK += dS^T Q
    }
    store_head_rows<HD>(dk + kv_head, dk_acc, key, T, scale);
    store_head_rows<HD>(dv + kv_head, dv_acc, key, T, 1.0f);
}

// dQ: grid (B*NH, T/64 query tiles, the last first), 128 threads; each warp owns 16 queries and
// loops over the key tiles up to its own (causal), double-buffered, recomputing P and dS.
// [document mask] DOC_MASK: as the forward, from the key tile of the tile's first document start.
template <int HD, bool DOC_MASK>
__global__ void __launch_bounds__(FA_THREADS)
    flash_backward_dq_kernel(bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                             const float* lse2, const float* dsum, HeadShape sh, DocSpans docs, float scale_log2,
                             float scale) {
    KeyTile<HD>* kv = reinterpret_cast<KeyTile<HD>*>(flash_shared); // [2]
    const int T = sh.T, qt = gridDim.y - 1 - blockIdx.y, bh = blockIdx.x, b = bh / sh.NH, h = bh % sh.NH;
    const size_t kv_head = ((size_t)b * sh.KVH + h / (sh.NH / sh.KVH)) * T * HD;
    int row[2], first_key[2];
    frag_rows(row, qt * FA_TILE);
    const int kt0 = doc_first_keys<DOC_MASK>(first_key, row, docs, b, qt, T);
    load_tile_async<HD>(kv[1].k, q + (size_t)bh * T * HD, HD, qt * FA_TILE, T); // Q and dO, staged where tile 1 goes
    load_tile_async<HD>(kv[1].v, dout + (size_t)b * T * sh.NH * HD + h * HD, (size_t)sh.NH * HD, qt * FA_TILE, T);
    kv[0].load(k + kv_head, v + kv_head, kt0, T);
    cp_async_wait_all();
    __syncthreads();
    const ResidentRows<HD, false> qa(kv[1].k), doa(kv[1].v);
    float lse[2], dsum_row[2], dq_acc[HD / 8][4] = {};
    for (int r = 0; r < 2; r++) {
        lse[r] = row[r] < T ? lse2[(size_t)bh * T + row[r]] : 0.0f;
        dsum_row[r] = row[r] < T ? dsum[(size_t)bh * T + row[r]] : 0.0f;
    }
    for (int kt = kt0; kt <= qt; kt++) {
        const int buf = (kt - kt0) % 2; // (tile kt0 in kv[0]: kv[1] held Q and dO until the registers took them)
        cp_async_wait_all();
        __syncthreads(); // tile kt landed for all threads, and all are done with kv[buf ^ 1]
        if (kt < qt) kv[buf ^ 1].load(k + kv_head, v + kv_head, kt + 1, T);
        const KeyTile<HD>& tile = kv[buf];
        float p[FA_TILE / 8][4] = {}, dp[FA_TILE / 8][4] = {};
        mma_a_tileT(p, qa, tile.k);   // S = Q K^T
        mma_a_tileT(dp, doa, tile.v); // dP = dO V^T
        softmax_backward_tile<FA_TILE, false>(p, dp, first_key, row, kt * FA_TILE, scale_log2, lse, dsum_row); // P, dS
        mma_c_tile<HD>(dq_acc, dp, tile.k); // dQ += dS K
    }
    store_head_rows<HD>(dq + (size_t)bh * T * HD, dq_acc, row, T, scale);
}

// Bytes of flash_shared: two KeyTiles for the forward and dQ kernels; for the dK/dV kernel
// (DKV) two QueryTiles and, at HD 128, the KeyTile of its K and V.
template <int HD, bool DKV> constexpr size_t flash_smem() {
    if (!DKV) return 2 * sizeof(KeyTile<HD>);
    return 2 * sizeof(QueryTile<HD>) + (DKV_KV_FROM_SMEM<HD> ? sizeof(KeyTile<HD>) : 0);
}

// Launches a flash kernel of THREADS threads with SMEM bytes of flash_shared; the first launch of
// each kernel raises its dynamic shared memory limit to SMEM (the default is 48 KB).
template <auto KERNEL, size_t SMEM, int THREADS, class... Args>
static void flash_launch(dim3 grid, cudaStream_t s, Args... args) {
    static const cudaError_t raised = cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    CUDA_CHECK(raised);
    KERNEL<<<grid, THREADS, SMEM, s>>>(args...);
    LAUNCH_CHECK();
}

// The mma.sync kernels' forward: any GPU of sm_80 or newer, HD 32, 64 or 128 (dev/attention version 4).
static void flash_forward_mma(bf16* out, float* lse2, const bf16* q, const bf16* k, const bf16* v, HeadShape sh,
                              DocSpans docs, cudaStream_t s) {
    dim3 grid(sh.B * sh.NH, ceil_div(sh.T, FA_TILE));
    float scale_log2 = 1.4426950408889634f / sqrtf((float)sh.HD);
    HEADDIM_SWITCH(sh.HD, HD, [&] {
        BOOL_SWITCH(docs.start != NULL, DOC_MASK, [&] {
            flash_launch<flash_forward_kernel<HD, DOC_MASK>, flash_smem<HD, false>(), FA_THREADS>(
                grid, s, out, lse2, q, k, v, sh, docs, scale_log2);
        });
    });
}

// The mma.sync kernels' backward (dsum from attention_row_dot first).
static void flash_backward_mma(bf16* dq, bf16* dk, bf16* dv, const float* dsum, const bf16* dout, const bf16* q,
                               const bf16* k, const bf16* v, const float* lse2, HeadShape sh, DocSpans docs,
                               cudaStream_t s) {
    float scale = 1.0f / sqrtf((float)sh.HD), scale_log2 = 1.4426950408889634f * scale;
    dim3 grid_kv(sh.B * sh.KVH, ceil_div(sh.T, FA_TILE)), grid_q(sh.B * sh.NH, ceil_div(sh.T, FA_TILE));
    HEADDIM_SWITCH(sh.HD, HD, [&] {
        BOOL_SWITCH(docs.start != NULL, DOC_MASK, [&] {
            flash_launch<flash_backward_dkv_kernel<HD, DOC_MASK>, flash_smem<HD, true>(), FA_THREADS>(
                grid_kv, s, dk, dv, q, k, v, dout, lse2, dsum, sh, docs, scale_log2, scale);
            flash_launch<flash_backward_dq_kernel<HD, DOC_MASK>, flash_smem<HD, false>(), FA_THREADS>(
                grid_q, s, dq, q, k, v, dout, lse2, dsum, sh, docs, scale_log2, scale);
        });
    });
}

// dsum (B*NH*T) = rowsum(dO * O) for the backward, from the token-major dout and out.
static void attention_row_dot(float* dsum, const bf16* dout, const bf16* out, HeadShape sh, cudaStream_t s) {
    attention_row_dot_kernel<<<ceil_div((size_t)sh.B * sh.T * sh.NH, 256), 256, 0, s>>>(dsum, dout, out, sh);
    LAUNCH_CHECK();
}

// ---- flash attention on Hopper (sm_90a): TMA, wgmma, warp specialisation ----
// The same three kernels as above (the forward; dK and dV per key tile; dQ per query tile), the
// same math between the products (mask_scores, online_softmax_tile, softmax_backward_tile, the row
// stores), on Hopper's own units, as FlashAttention 3 does:
//   [TMA] one producer thread copies every tile global -> shared with cp.async.bulk.tensor, one
//   instruction per 64-column block (rows past T zero-filled by the copy engine), into a ring of
//   stages; each stage completes on an mbarrier the consumers wait on, and their arrivals on a
//   second mbarrier free it for the next copy. No thread of the block waits for a copy it does not use.
//   [wgmma] two consumer warpgroups (4 warps each) own 64 rows apiece and multiply with wgmma,
//   asynchronous products of 64 x N x 16 by the 4 warps together: S = Q K^T with both operands in
//   shared memory, P V (and the backward's dS K, P^T dO, dS^T Q) with P or dS straight from the
//   score registers.
//   [warp specialisation] the producer warpgroup gives its registers back (setmaxnreg) to the
//   consumers (240 a thread), whose accumulators and scores need over 200.
// wgmma's accumulator, per warp of a warpgroup, is the m16n8 C fragment layout of the mma.sync
// kernels repeated along N (warp w of the group holds rows 16w..16w+15), and its A operand from
// registers is the m16n8k16 A fragment: the softmax code and c_to_a_fragment serve both families.
// Shared tiles are [rows][64] blocks of 64 columns (128 bytes a row) in the 128-byte swizzle that
// TMA writes and wgmma reads: 16-byte chunk c of row r sits at chunk c ^ (r % 8), in 1024-byte
// atoms of 8 rows, so that neither the copy nor the products meet bank conflicts.
// Built for sm_90a only (wgmma and setmaxnreg); the launchers use it where flash_wgmma_built().

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA90_DEVICE 1
#else
#define FA90_DEVICE 0
#endif
#define FA90_THREADS 384 // warpgroup 0 the producer, 1 and 2 the consumers
#define FA90_WG_ROWS 64  // rows (queries, or keys in dK/dV) of one consumer warpgroup
#define FA90_TILE 128    // rows of a block: the two consumer warpgroups' (and a streamed K/V tile's)
#define FA90_STEP 64     // queries per streamed step of the dK/dV kernel
#define FA90_STAGES 2    // depth of each ring of streamed tiles

__device__ inline uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// mbarriers: a count of arrivals plus, with expect_tx, bytes that TMA copies must deliver; a wait
// names the phase (its parity) it waits to see completed.
__device__ inline void mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ inline void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ inline void mbar_arrive_expect(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ inline void mbar_wait(uint64_t* bar, int parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(smem_addr(bar)), "r"(parity)
                     : "memory");
}

// [TMA] One box of a 4-d tensor map into shared memory at dst, its bytes counted on bar.
__device__ inline void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(
                     smem_addr(dst)),
                 "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

// [warp specialisation] Registers per thread from here on, for the whole warpgroup.
template <int REGS> __device__ inline void regs_release() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS> __device__ inline void regs_claim() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// A wgmma shared-memory operand: start address, the byte offsets between 64-column blocks (lbo)
// and between 8-row groups (sbo), and the 128-byte swizzle.
__device__ inline uint64_t wgmma_desc(const bf16* start, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((smem_addr(start) & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 |
           1ull << 62;
}

// ROWS x HD bf16 in shared memory as HD / 64 blocks of [ROWS][64], 128-byte swizzled.
template <int ROWS, int HD> struct alignas(1024) SwizzledTile {
    bf16 block[HD / 64][ROWS * 64];
    static constexpr uint32_t BYTES = ROWS * HD * 2;
    // Issues the copies of rows c1.. of the map's tensor (c2, c3 its other coordinates), counted on bar.
    __device__ void load(const CUtensorMap* map, uint64_t* bar, int c1, int c2, int c3) {
        for (int i = 0; i < HD / 64; i++) tma_load(block[i], map, bar, 64 * i, c1, c2, c3);
    }
    // Rows row0.. (64 of an A operand, or all ROWS of a B) by columns 16kk..16kk+15, the K of a
    // product that sums over HD (S = Q K^T, dP = dO V^T): K-major, each row's 16 columns in one block.
    __device__ uint64_t k_major(int row0, int kk) const {
        return wgmma_desc(&block[kk / 4][row0 * 64 + kk % 4 * 16], 16, 1024);
    }
    // Rows 16j..16j+15 by all HD columns, the B of a product that sums over rows (P V, dS K, P^T dO,
    // dS^T Q): MN-major, N running along a row and across the blocks.
    __device__ uint64_t mn_major(int j) const { return wgmma_desc(&block[0][j * 16 * 64], ROWS * 128, 1024); }
};

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N of this warpgroup's committed groups of products are still running.
template <int N = 0> __device__ inline void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

#define WG_ACC8(i) \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_ACC32 WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24)
#define WG_ACC64 WG_ACC32, WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56)
#define WG_REGS32                                                                                                      \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_REGS64                                                                                                      \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "   \
    "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// acc (64 x N, the C fragments of this warp's 16 rows) (+)= A B^T over 16 columns of K, both from
// shared memory, K-major (a_desc: the warpgroup's 64 rows, b_desc: N rows). Issued, not waited for.
template <int N> __device__ inline void wgmma_ss(float (*acc)[4], uint64_t a_desc, uint64_t b_desc, bool accumulate) {
    float* d = &acc[0][0];
    if constexpr (N == 64)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_REGS32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                     : WG_ACC32
                     : "l"(a_desc), "l"(b_desc), "r"((int)accumulate)
                     : "memory");
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_REGS64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                     : WG_ACC64
                     : "l"(a_desc), "l"(b_desc), "r"((int)accumulate)
                     : "memory");
}
// acc (64 x N) += A B over 16 rows of K: A from registers (this warp's A fragment a), B from shared
// memory MN-major (b_desc, the transposed operand). Issued, not waited for.
template <int N> __device__ inline void wgmma_rs(float (*acc)[4], const uint32_t* a, uint64_t b_desc) {
    float* d = &acc[0][0];
    if constexpr (N == 64)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_REGS32
                     ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                     : WG_ACC32
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1)
                     : "memory");
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_REGS64
                     ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                     : WG_ACC64
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1)
                     : "memory");
}

// acc (64 x N) = this warpgroup's 64 rows of `rows` (from row0) times the N rows of `cols`,
// transposed, summed over HD: S = Q K^T, dP = dO V^T, or the dK/dV kernel's S^T, dP^T. Issued.
template <int N, int HD, int R1, int R2>
__device__ inline void wgmma_rows_cols(float (*acc)[4], const SwizzledTile<R1, HD>& rows, int row0,
                                       const SwizzledTile<R2, HD>& cols) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) wgmma_ss<N>(acc, rows.k_major(row0, kk), cols.k_major(0, kk), kk > 0);
}
// The A fragments of a 64 x COLS product operand held as C fragments (P, dS), rounded to bf16.
template <int COLS> __device__ inline void a_fragments_of(uint32_t (*a)[4], const float (*c)[4]) {
#pragma unroll
    for (int j = 0; j < COLS / 16; j++) c_to_a_fragment(a[j], c, j);
}
// acc (64 x HD) += A (64 x COLS, this warp's A fragments a) times the COLS rows of `tile`: O += P V,
// dQ += dS K, dV += P^T dO, dK += dS^T Q. Issued. (Registers a wgmma reads are written before its fence.)
template <int COLS, int HD, int R>
__device__ inline void wgmma_mix(float (*acc)[4], const uint32_t (*a)[4], const SwizzledTile<R, HD>& tile) {
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < COLS / 16; j++) wgmma_rs<HD>(acc, a[j], tile.mn_major(j));
}
// The same with A given as C fragments p, formed into A fragments first.
template <int COLS, int HD, int R>
__device__ inline void wgmma_mix(float (*acc)[4], const float (*p)[4], const SwizzledTile<R, HD>& tile) {
    uint32_t a[COLS / 16][4];
    a_fragments_of<COLS>(a, p);
    wgmma_mix<COLS>(acc, a, tile);
}

// The dynamic shared memory of a wgmma kernel as its tile struct, on a 1024-byte boundary (the
// swizzle's atom; the launch asks for 1 KB more than the struct).
template <class Tiles> __device__ inline Tiles& tiles_at_1k() {
    return *reinterpret_cast<Tiles*>((reinterpret_cast<uintptr_t>(flash_shared) + 1023) & ~(uintptr_t)1023);
}

#define FA90_CONSUMERS 256 // threads of the two consumer warpgroups: each arrives on a free barrier

// Thread 0 has set the block's mbarriers up: makes them visible to every thread and to the copy engine.
__device__ inline void barriers_ready() {
    if (threadIdx.x == 0) asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncthreads();
}
// Stage and phase parity of the i-th use of a ring of FA90_STAGES: a consumer waits for parity
// (i / STAGES) & 1 of its full barrier; the producer for the opposite parity of its free barrier,
// which a fresh barrier reports complete, so the first pass over the ring does not wait.
__device__ inline int ring_stage(int i) { return i % FA90_STAGES; }
__device__ inline int ring_parity(int i) { return (i / FA90_STAGES) & 1; }

// Key tiles [first, last] of KEYS keys for a block of 128 queries from q0: causal, and from the first
// query's document start (the forward's and the dQ kernel's loop).
struct KeyRange {
    int first, last;
};
template <bool DOC_MASK, int KEYS> __device__ inline KeyRange key_range(DocSpans docs, int b, int q0, int T) {
    return KeyRange{doc_first<DOC_MASK>(docs, b, q0, T) / KEYS, (min(q0 + FA90_TILE, T) - 1) / KEYS};
}

// The forward's and dQ kernel's producer: key tiles j of the range (Tiles::KEYS rows each) into the
// ring, K and V on barriers of their own.
template <int HD, class Tiles>
__device__ inline void stream_key_tiles(Tiles& sm, const CUtensorMap* k_map, const CUtensorMap* v_map, KeyRange keys,
                                        int kvh, int b) {
    for (int j = keys.first; j <= keys.last; j++) {
        const int i = j - keys.first, s = ring_stage(i);
        mbar_wait(&sm.kv_free[s], ring_parity(i) ^ 1);
        mbar_arrive_expect(&sm.k_full[s], sm.k[s].BYTES);
        sm.k[s].load(k_map, &sm.k_full[s], j * Tiles::KEYS, kvh, b);
        mbar_arrive_expect(&sm.v_full[s], sm.v[s].BYTES);
        sm.v[s].load(v_map, &sm.v_full[s], j * Tiles::KEYS, kvh, b);
    }
}

// Thread 0's set-up of a query block's barriers (the forward's and dQ's), then barriers_ready: the
// block's own rows' (one arrival, the producer's), and for each stage of the key ring K's and V's
// (the producer's) and its free barrier (every consumer thread's).
template <class Tiles> __device__ inline void init_key_ring(Tiles& sm) {
    if (threadIdx.x == 0) {
        mbar_init(&sm.rows_full, 1);
        for (int s = 0; s < FA90_STAGES; s++)
            mbar_init(&sm.k_full[s], 1), mbar_init(&sm.v_full[s], 1), mbar_init(&sm.kv_free[s], FA90_CONSUMERS);
    }
    barriers_ready();
}

template <int HD> struct ForwardTiles {
    static constexpr int KEYS = FA90_TILE;
    SwizzledTile<FA90_TILE, HD> q, k[FA90_STAGES], v[FA90_STAGES];
    uint64_t rows_full, k_full[FA90_STAGES], v_full[FA90_STAGES], kv_free[FA90_STAGES];
};

// One consumer warpgroup of the forward: its 64 queries from row0 (q0 the block's first) through
// the n key tiles, FlashAttention-2's loop with the softmax of tile i overlapping the P V product of
// tile i - 1 (FlashAttention 3's intra-warpgroup pipelining): step i issues S_i = Q K_i^T, then
// O += P_{i-1} V_{i-1}, waits for S_i alone (the older group), runs its softmax, and waits for P V
// before it rescales O and rounds P_i into the A fragments pa that the product read until then.
// The diagonal tile and any tile below a query's document start are masked.
template <int HD, bool DOC_MASK>
__device__ inline void forward_rows(ForwardTiles<HD>& sm, KeyRange keys, int q0, int row0, bf16* out, float* lse2,
                                    HeadShape sh, DocSpans docs, int bh, float scale_log2) {
    const int T = sh.T, b = bh / sh.NH, n = keys.last - keys.first + 1;
    int row[2], first_key[2];
    frag_rows(row, row0);
    for (int r = 0; r < 2; r++) first_key[r] = doc_first<DOC_MASK>(docs, b, row[r], T);
    const int last_first_key = doc_first<DOC_MASK>(docs, b, min(row0 + FA90_WG_ROWS, T) - 1, T); // the largest
    float o[HD / 8][4] = {}, row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f}, correction[2];
    float sc[FA90_TILE / 8][4];
    uint32_t pa[FA90_TILE / 16][4];
    auto scores = [&](int i) { // S_i = Q K_i^T, issued
        mbar_wait(&sm.k_full[ring_stage(i)], ring_parity(i));
        wgmma_rows_cols<FA90_TILE>(sc, sm.q, row0 - q0, sm.k[ring_stage(i)]);
        wgmma_commit();
    };
    auto mix = [&](int i) { // O += P_i V_i, issued
        mbar_wait(&sm.v_full[ring_stage(i)], ring_parity(i));
        wgmma_mix<FA90_TILE>(o, pa, sm.v[ring_stage(i)]);
        wgmma_commit();
    };
    auto softmax = [&](int i) { // S_i to P_i in place, with the rows' corrections
        const int key0 = (keys.first + i) * FA90_TILE;
        if (key0 + FA90_TILE - 1 > row0 || key0 < last_first_key) mask_scores<FA90_TILE>(sc, first_key, row, key0);
        softmax_tile<FA90_TILE>(sc, row_max, row_sum, scale_log2, correction);
    };
    mbar_wait(&sm.rows_full, 0);
    scores(0);
    wgmma_wait<0>();
    softmax(0);
    a_fragments_of<FA90_TILE>(pa, sc); // (o is 0: nothing to rescale)
    for (int i = 1; i < n; i++) {
        scores(i);
        mix(i - 1);
        wgmma_wait<1>();
        softmax(i);
        wgmma_wait<0>();
        mbar_arrive(&sm.kv_free[ring_stage(i - 1)]);
        rescale_rows<HD>(o, correction);
        a_fragments_of<FA90_TILE>(pa, sc);
    }
    mix(n - 1);
    wgmma_wait<0>();
    mbar_arrive(&sm.kv_free[ring_stage(n - 1)]);
    store_forward_rows<HD>(out, lse2, o, row_max, row_sum, row, sh, bh);
}

// Forward: grid (B*NH, T/128 query tiles, the last first), 384 threads. The producer copies the
// block's 128 queries once and streams the key tiles of its causal range through the ring (K and
// V on their own barriers, so that S = Q K^T starts before V lands); each consumer warpgroup runs
// forward_rows for its 64 queries.
template <int HD, bool DOC_MASK>
__global__ void __launch_bounds__(FA90_THREADS, 1)
    flash_forward_wgmma_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                               const __grid_constant__ CUtensorMap v_map, bf16* out, float* lse2, HeadShape sh,
                               DocSpans docs, float scale_log2) {
#if FA90_DEVICE
    ForwardTiles<HD>& sm = tiles_at_1k<ForwardTiles<HD>>();
    const int q0 = (gridDim.y - 1 - blockIdx.y) * FA90_TILE, bh = blockIdx.x, b = bh / sh.NH, h = bh % sh.NH;
    const KeyRange keys = key_range<DOC_MASK, FA90_TILE>(docs, b, q0, sh.T);
    init_key_ring(sm);
    if (threadIdx.x < 128) {
        regs_release<24>();
        if (threadIdx.x == 0) {
            mbar_arrive_expect(&sm.rows_full, sm.q.BYTES);
            sm.q.load(&q_map, &sm.rows_full, q0, h, b);
            stream_key_tiles<HD>(sm, &k_map, &v_map, keys, h / (sh.NH / sh.KVH), b);
        }
    } else {
        regs_claim<240>();
        const int row0 = q0 + (threadIdx.x / 128 - 1) * FA90_WG_ROWS;
        forward_rows<HD, DOC_MASK>(sm, keys, q0, row0, out, lse2, sh, docs, bh, scale_log2);
    }
#endif
}

template <int HD> struct DkvTiles {
    SwizzledTile<FA90_TILE, HD> k, v;
    SwizzledTile<FA90_STEP, HD> q[FA90_STAGES], dout[FA90_STAGES];
    float lse2[FA90_STAGES][FA90_STEP], dsum[FA90_STAGES][FA90_STEP];
    uint64_t kv_full, step_full[FA90_STAGES], step_free[FA90_STAGES];
};

// The steps of a dK/dV block of keys from k0: for each of the G query heads sharing its kv head,
// the 64-query tiles from the first key to the last key's document end (causal).
struct QuerySteps {
    int first_tile, tiles, count;
    __device__ int head(int kvh, int G, int i) const { return kvh * G + i / tiles; }
    __device__ int t0(int i) const { return (first_tile + i % tiles) * FA90_STEP; }
};
template <bool DOC_MASK> __device__ inline QuerySteps query_steps(DocSpans docs, int b, int k0, HeadShape sh) {
    const int first = k0 / FA90_STEP, tiles = doc_last<DOC_MASK>(docs, b, k0 + FA90_TILE - 1, sh.T) / FA90_STEP - first + 1;
    return QuerySteps{first, tiles, sh.NH / sh.KVH * tiles};
}

// The dK/dV producer warp: K and V once (lane 0), then each step's Q and dO by TMA (lane 0) and its
// lse2 and dsum rows by the 32 lanes' loads (0 past T), all on the step's barrier.
template <int HD>
__device__ inline void stream_query_steps(DkvTiles<HD>& sm, const CUtensorMap* q_map, const CUtensorMap* dout_map,
                                          const float* lse2, const float* dsum, QuerySteps steps, int kvh, int b,
                                          HeadShape sh) {
    const int lane = threadIdx.x % 32, G = sh.NH / sh.KVH;
    for (int i = 0; i < steps.count; i++) {
        const int s = ring_stage(i), head = steps.head(kvh, G, i), t0 = steps.t0(i);
        mbar_wait(&sm.step_free[s], ring_parity(i) ^ 1);
        if (lane == 0) {
            mbar_arrive_expect(&sm.step_full[s], 2 * sm.q[s].BYTES);
            sm.q[s].load(q_map, &sm.step_full[s], t0, head, b);
            sm.dout[s].load(dout_map, &sm.step_full[s], head, t0, b); // (token-major: head before t)
        }
        const size_t rows = ((size_t)b * sh.NH + head) * sh.T;
        for (int j = lane; j < FA90_STEP; j += 32) {
            sm.lse2[s][j] = t0 + j < sh.T ? lse2[rows + t0 + j] : 0.0f;
            sm.dsum[s][j] = t0 + j < sh.T ? dsum[rows + t0 + j] : 0.0f;
        }
        mbar_arrive(&sm.step_full[s]);
    }
}

// One consumer warpgroup of dK/dV: its 64 keys from key0 (k0 the block's first) against every
// step's queries, P^T and dS^T recomputed; a step none of its keys see runs masked to zeros (a
// branch around wgmma would serialize the products).
template <int HD, bool DOC_MASK>
__device__ inline void dkv_rows(DkvTiles<HD>& sm, QuerySteps steps, int k0, int key0, bf16* dk, bf16* dv, HeadShape sh,
                                DocSpans docs, float scale_log2, float scale) {
    const int b = blockIdx.x / sh.KVH;
    int key[2], last_query[2];
    frag_rows(key, key0);
    for (int r = 0; r < 2; r++) last_query[r] = doc_last<DOC_MASK>(docs, b, key[r], sh.T);
    float dk_acc[HD / 8][4] = {}, dv_acc[HD / 8][4] = {};
    mbar_wait(&sm.kv_full, 0);
    for (int i = 0; i < steps.count; i++) {
        const int s = ring_stage(i), t0 = steps.t0(i);
        float p[FA90_STEP / 8][4], dp[FA90_STEP / 8][4];
        mbar_wait(&sm.step_full[s], ring_parity(i));
        wgmma_rows_cols<FA90_STEP>(p, sm.k, key0 - k0, sm.q[s]);     // S^T = K Q^T, rows are keys
        wgmma_rows_cols<FA90_STEP>(dp, sm.v, key0 - k0, sm.dout[s]); // dP^T = V dO^T
        wgmma_commit();
        wgmma_wait();
        softmax_backward_tile<FA90_STEP, true>(p, dp, key, last_query, t0, scale_log2, sm.lse2[s], sm.dsum[s]);
        uint32_t pa[FA90_STEP / 16][4], dsa[FA90_STEP / 16][4];
        a_fragments_of<FA90_STEP>(pa, p);
        a_fragments_of<FA90_STEP>(dsa, dp);
        wgmma_mix<FA90_STEP>(dv_acc, pa, sm.dout[s]); // dV += P^T dO
        wgmma_mix<FA90_STEP>(dk_acc, dsa, sm.q[s]);   // dK += dS^T Q
        wgmma_commit();
        wgmma_wait();
        mbar_arrive(&sm.step_free[s]);
    }
    const size_t kv_head = (size_t)blockIdx.x * sh.T * HD;
    store_head_rows<HD>(dk + kv_head, dk_acc, key, sh.T, scale);
    store_head_rows<HD>(dv + kv_head, dv_acc, key, sh.T, 1.0f);
}

// dK, dV: grid (B*KVH, T/128 key tiles, tile 0 first), 384 threads; each consumer warpgroup owns 64
// keys (dkv_rows), the producer warp streams the query steps (stream_query_steps).
template <int HD, bool DOC_MASK>
__global__ void __launch_bounds__(FA90_THREADS, 1)
    flash_backward_dkv_wgmma_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                    const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap dout_map,
                                    bf16* dk, bf16* dv, const float* lse2, const float* dsum, HeadShape sh,
                                    DocSpans docs, float scale_log2, float scale) {
#if FA90_DEVICE
    DkvTiles<HD>& sm = tiles_at_1k<DkvTiles<HD>>();
    const int k0 = blockIdx.y * FA90_TILE, b = blockIdx.x / sh.KVH, kvh = blockIdx.x % sh.KVH;
    const QuerySteps steps = query_steps<DOC_MASK>(docs, b, k0, sh);
    if (threadIdx.x == 0) {
        mbar_init(&sm.kv_full, 1);
        for (int s = 0; s < FA90_STAGES; s++) // a step's copies (lane 0's arrival) and its rows (32 lanes')
            mbar_init(&sm.step_full[s], 1 + 32), mbar_init(&sm.step_free[s], FA90_CONSUMERS);
    }
    barriers_ready();
    if (threadIdx.x < 128) {
        regs_release<24>();
        if (threadIdx.x == 0) {
            mbar_arrive_expect(&sm.kv_full, 2 * sm.k.BYTES);
            sm.k.load(&k_map, &sm.kv_full, k0, kvh, b);
            sm.v.load(&v_map, &sm.kv_full, k0, kvh, b);
        }
        if (threadIdx.x < 32) stream_query_steps<HD>(sm, &q_map, &dout_map, lse2, dsum, steps, kvh, b, sh);
    } else {
        regs_claim<240>();
        const int key0 = k0 + (threadIdx.x / 128 - 1) * FA90_WG_ROWS;
        dkv_rows<HD, DOC_MASK>(sm, steps, k0, key0, dk, dv, sh, docs, scale_log2, scale);
    }
#endif
}

// dQ's tiles: key tiles of 64 rows, so that S, dP (KEYS / 2 registers each) and the dQ accumulator
// (HD / 2) fit a thread's registers with room for the products to stay asynchronous.
template <int HD> struct DqTiles {
    static constexpr int KEYS = 64;
    SwizzledTile<FA90_TILE, HD> q, dout;
    SwizzledTile<KEYS, HD> k[FA90_STAGES], v[FA90_STAGES];
    uint64_t rows_full, k_full[FA90_STAGES], v_full[FA90_STAGES], kv_free[FA90_STAGES];
};

// One consumer warpgroup of dQ: its 64 queries from row0 through the key tiles, P and dS
// recomputed, dQ += dS K.
template <int HD, bool DOC_MASK>
__device__ inline void dq_rows(DqTiles<HD>& sm, KeyRange keys, int q0, int row0, bf16* dq, const float* lse2,
                               const float* dsum, HeadShape sh, DocSpans docs, int bh, float scale_log2, float scale) {
    const int T = sh.T, b = bh / sh.NH;
    int row[2], first_key[2];
    frag_rows(row, row0);
    float lse[2], dsum_row[2], dq_acc[HD / 8][4] = {};
    for (int r = 0; r < 2; r++) {
        first_key[r] = doc_first<DOC_MASK>(docs, b, row[r], T);
        lse[r] = row[r] < T ? lse2[(size_t)bh * T + row[r]] : 0.0f;
        dsum_row[r] = row[r] < T ? dsum[(size_t)bh * T + row[r]] : 0.0f;
    }
    mbar_wait(&sm.rows_full, 0);
    for (int j = keys.first; j <= keys.last; j++) {
        const int i = j - keys.first, s = ring_stage(i);
        constexpr int KEYS = DqTiles<HD>::KEYS;
        float p[KEYS / 8][4], dp[KEYS / 8][4];
        mbar_wait(&sm.k_full[s], ring_parity(i));
        wgmma_rows_cols<KEYS>(p, sm.q, row0 - q0, sm.k[s]); // S = Q K^T
        mbar_wait(&sm.v_full[s], ring_parity(i));
        wgmma_rows_cols<KEYS>(dp, sm.dout, row0 - q0, sm.v[s]); // dP = dO V^T
        wgmma_commit();
        wgmma_wait();
        softmax_backward_tile<KEYS, false>(p, dp, first_key, row, j * KEYS, scale_log2, lse, dsum_row);
        wgmma_mix<KEYS>(dq_acc, dp, sm.k[s]); // dQ += dS K
        wgmma_commit();
        wgmma_wait();
        mbar_arrive(&sm.kv_free[s]);
    }
    store_head_rows<HD>(dq + (size_t)bh * T * HD, dq_acc, row, T, scale);
}

// dQ: grid (B*NH, T/128 query tiles, the last first), 384 threads. The producer copies the block's
// Q and dO once and streams the key tiles of its causal range as the forward's does; each consumer
// warpgroup runs dq_rows for its 64 queries.
template <int HD, bool DOC_MASK>
__global__ void __launch_bounds__(FA90_THREADS, 1)
    flash_backward_dq_wgmma_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                   const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap dout_map,
                                   bf16* dq, const float* lse2, const float* dsum, HeadShape sh, DocSpans docs,
                                   float scale_log2, float scale) {
#if FA90_DEVICE
    DqTiles<HD>& sm = tiles_at_1k<DqTiles<HD>>();
    const int q0 = (gridDim.y - 1 - blockIdx.y) * FA90_TILE, bh = blockIdx.x, b = bh / sh.NH, h = bh % sh.NH;
    const KeyRange keys = key_range<DOC_MASK, DqTiles<HD>::KEYS>(docs, b, q0, sh.T);
    init_key_ring(sm);
    if (threadIdx.x < 128) {
        regs_release<24>();
        if (threadIdx.x == 0) {
            mbar_arrive_expect(&sm.rows_full, 2 * sm.q.BYTES);
            sm.q.load(&q_map, &sm.rows_full, q0, h, b);
            sm.dout.load(&dout_map, &sm.rows_full, h, q0, b);
            stream_key_tiles<HD>(sm, &k_map, &v_map, keys, h / (sh.NH / sh.KVH), b);
        }
    } else {
        regs_claim<240>();
        const int row0 = q0 + (threadIdx.x / 128 - 1) * FA90_WG_ROWS;
        dq_rows<HD, DOC_MASK>(sm, keys, q0, row0, dq, lse2, dsum, sh, docs, bh, scale_log2, scale);
    }
#endif
}

// [TMA] The driver's cuTensorMapEncodeTiled, reached through the runtime (no -lcuda), once.
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    if (!encode) {
        cudaDriverEntryPointQueryResult found;
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000, cudaEnableDefault,
                                                    &found));
        if (found != cudaDriverEntryPointSuccess || !encode) {
            fprintf(stderr, "error: %sthe CUDA driver has no cuTensorMapEncodeTiled (the sm_90 attention needs it)\n", rank_tag);
            exit(EXIT_FAILURE);
        }
    }
    return encode;
}

// A 4-d bf16 tensor map over x (dims[0] contiguous, strides in elements for dims 1..3) whose boxes
// are 64 columns by box[1..3], 128-byte swizzled as SwizzledTile lays them out; rows outside the
// tensor read as zeros.
static CUtensorMap bf16_tensor_map(const bf16* x, const uint64_t* dims, const uint64_t* strides, const uint32_t* box) {
    CUtensorMap map;
    const cuuint64_t stride_bytes[3] = {strides[0] * 2, strides[1] * 2, strides[2] * 2};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void*)x, dims, stride_bytes, box,
                                      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "error: %scuTensorMapEncodeTiled failed (CUresult %d)\n", rank_tag, (int)r);
        exit(EXIT_FAILURE);
    }
    return map;
}
// Head-major (B, heads, T, HD) q, k or v in boxes of `rows` positions: coordinates (column, t, head, b).
static CUtensorMap head_major_map(const bf16* x, HeadShape sh, int heads, int rows) {
    const uint64_t dims[4] = {(uint64_t)sh.HD, (uint64_t)sh.T, (uint64_t)heads, (uint64_t)sh.B};
    const uint64_t strides[3] = {(uint64_t)sh.HD, (uint64_t)sh.T * sh.HD, (uint64_t)heads * sh.T * sh.HD};
    const uint32_t box[4] = {64, (uint32_t)rows, 1, 1};
    return bf16_tensor_map(x, dims, strides, box);
}
// Token-major (B, T, NH, HD) dO in boxes of `rows` positions of one head: coordinates (column, head, t, b).
static CUtensorMap token_major_map(const bf16* x, HeadShape sh, int rows) {
    const uint64_t dims[4] = {(uint64_t)sh.HD, (uint64_t)sh.NH, (uint64_t)sh.T, (uint64_t)sh.B};
    const uint64_t strides[3] = {(uint64_t)sh.HD, (uint64_t)sh.NH * sh.HD, (uint64_t)sh.T * sh.NH * sh.HD};
    const uint32_t box[4] = {64, 1, (uint32_t)rows, 1};
    return bf16_tensor_map(x, dims, strides, box);
}

// Whether this binary holds the wgmma kernels' sm_90a machine code and the GPU runs it: a probe
// launch the first time (a sync: the trainer asks before it captures a step).
__global__ void wgmma_built_kernel(int* built) { *built = FA90_DEVICE; }
static bool flash_wgmma_built(void) {
    static int built = -1;
    if (built < 0) {
        int device, major, *flag;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        built = 0;
        if (major == 9) {
            CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
            wgmma_built_kernel<<<1, 1>>>(flag);
            LAUNCH_CHECK();
            CUDA_CHECK(cudaMemcpy(&built, flag, sizeof(int), cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaFree(flag));
        }
    }
    return built == 1;
}

template <int HD>
static void flash_forward_wgmma(bf16* out, float* lse2, const bf16* q, const bf16* k, const bf16* v, HeadShape sh,
                                DocSpans docs, cudaStream_t s) {
    dim3 grid(sh.B * sh.NH, ceil_div(sh.T, FA90_TILE));
    float scale_log2 = 1.4426950408889634f / sqrtf((float)HD);
    CUtensorMap q_map = head_major_map(q, sh, sh.NH, FA90_TILE), k_map = head_major_map(k, sh, sh.KVH, FA90_TILE),
                v_map = head_major_map(v, sh, sh.KVH, FA90_TILE);
    BOOL_SWITCH(docs.start != NULL, DOC_MASK, [&] {
        flash_launch<flash_forward_wgmma_kernel<HD, DOC_MASK>, sizeof(ForwardTiles<HD>) + 1024, FA90_THREADS>(
            grid, s, q_map, k_map, v_map, out, lse2, sh, docs, scale_log2);
    });
}

template <int HD>
static void flash_backward_wgmma(bf16* dq, bf16* dk, bf16* dv, const float* dsum, const bf16* dout, const bf16* q,
                                 const bf16* k, const bf16* v, const float* lse2, HeadShape sh, DocSpans docs,
                                 cudaStream_t s) {
    float scale = 1.0f / sqrtf((float)HD), scale_log2 = 1.4426950408889634f * scale;
    dim3 grid_kv(sh.B * sh.KVH, ceil_div(sh.T, FA90_TILE)), grid_q(sh.B * sh.NH, ceil_div(sh.T, FA90_TILE));
    CUtensorMap q_step = head_major_map(q, sh, sh.NH, FA90_STEP), dout_step = token_major_map(dout, sh, FA90_STEP);
    CUtensorMap q_tile = head_major_map(q, sh, sh.NH, FA90_TILE), dout_tile = token_major_map(dout, sh, FA90_TILE);
    CUtensorMap k_map = head_major_map(k, sh, sh.KVH, FA90_TILE), v_map = head_major_map(v, sh, sh.KVH, FA90_TILE);
    CUtensorMap k_dq = head_major_map(k, sh, sh.KVH, DqTiles<HD>::KEYS), v_dq = head_major_map(v, sh, sh.KVH, DqTiles<HD>::KEYS);
    BOOL_SWITCH(docs.start != NULL, DOC_MASK, [&] {
        flash_launch<flash_backward_dkv_wgmma_kernel<HD, DOC_MASK>, sizeof(DkvTiles<HD>) + 1024, FA90_THREADS>(
            grid_kv, s, q_step, k_map, v_map, dout_step, dk, dv, lse2, dsum, sh, docs, scale_log2, scale);
        flash_launch<flash_backward_dq_wgmma_kernel<HD, DOC_MASK>, sizeof(DqTiles<HD>) + 1024, FA90_THREADS>(
            grid_q, s, q_tile, k_dq, v_dq, dout_tile, dq, lse2, dsum, sh, docs, scale_log2, scale);
    });
}

// ---- attention: the launchers ----

// Whether the wgmma kernels take this shape: built for and on an sm_90 GPU, HD 64 or 128 (HD 32
// goes to the mma.sync kernels, which take 32, 64 and 128).
static bool flash_wgmma_takes(HeadShape sh) { return (sh.HD == 64 || sh.HD == 128) && flash_wgmma_built(); }

// The wgmma kernels have not run on a GPU yet (written 2026-12-07, when no machine could be started):
// until dev/attention --check passes on one (version 5 against the fp64 reference and version 4),
// the launchers keep the mma.sync kernels and version 5 runs in dev/attention alone. 1: the
// launchers take them wherever flash_wgmma_takes.
#define FLASH_WGMMA_IN_TRAINER 0
static bool flash_uses_wgmma(HeadShape sh) { return FLASH_WGMMA_IN_TRAINER && flash_wgmma_takes(sh); }

// out (token-major) and lse2 (B*NH*T) from head-major q, k, v, causal, within documents when
// docs.start != NULL; HD 32, 64 or 128 (llama3.h kernel_limits_check).
static void flash_attention_forward(bf16* out, float* lse2, const bf16* q, const bf16* k, const bf16* v, HeadShape sh,
                                    DocSpans docs, cudaStream_t s) {
    if (!flash_uses_wgmma(sh)) flash_forward_mma(out, lse2, q, k, v, sh, docs, s);
    else if (sh.HD == 64) flash_forward_wgmma<64>(out, lse2, q, k, v, sh, docs, s);
    else flash_forward_wgmma<128>(out, lse2, q, k, v, sh, docs, s);
}

// dq, dk, dv (head-major) from dout and out (token-major) and the forward's lse2; dsum is scratch
// of B*NH*T floats. [document mask] docs: the forward's.
static void flash_attention_backward(bf16* dq, bf16* dk, bf16* dv, float* dsum, const bf16* dout, const bf16* out,
                                     const bf16* q, const bf16* k, const bf16* v, const float* lse2, HeadShape sh,
                                     DocSpans docs, cudaStream_t s) {
    attention_row_dot(dsum, dout, out, sh, s);
    if (!flash_uses_wgmma(sh)) flash_backward_mma(dq, dk, dv, dsum, dout, q, k, v, lse2, sh, docs, s);
    else if (sh.HD == 64) flash_backward_wgmma<64>(dq, dk, dv, dsum, dout, q, k, v, lse2, sh, docs, s);
    else flash_backward_wgmma<128>(dq, dk, dv, dsum, dout, q, k, v, lse2, sh, docs, s);
}

// ---- SwiGLU ----

// [mixed dtypes in registers] act = bf16(bf16(silu(gate)) * up) from the gate_up GEMM's rows
// [gate F | up F], rounding where PyTorch's bf16 silu and multiply do. 8 outputs per thread:
// reads 4 bytes, writes 2 per output. [fp8] AMAX: also the largest |act| into *amax_bits, for the
// down projection's FP8 input, so that it needs no pass of its own.
template <bool AMAX> __global__ void swiglu_forward_kernel(bf16* act, unsigned* amax_bits, const bf16* gate_up, int N, int F) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    float amax = 0.0f;
    if (i < (size_t)N * F) {
        size_t n = i / F, f = i % F;
        Vec16<bf16> g = load16(gate_up + n * 2 * F + f), u = load16(gate_up + n * 2 * F + F + f), a;
        for (int e = 0; e < 8; e++) {
            a.v[e] = __float2bfloat16_rn(round_bf16(silu(__bfloat162float(g.v[e]))) * __bfloat162float(u.v[e]));
            amax = fmaxf(amax, fabsf(__bfloat162float(a.v[e])));
        }
        store16(act + i, a);
    }
    if (AMAX) block_amax(amax_bits, amax);
}

// Backward of the above, with PyTorch's roundings: d_up = bf16(d_act * bf16(silu(g))),
// d_silu = bf16(d_act * up), d_gate = bf16(d_silu * sig(g) * (1 + g * (1 - sig(g)))). [fp8] AMAX:
// the largest |d_gate_up| into *amax_bits, for the gate_up projection's FP8 output gradient.
template <bool AMAX>
__global__ void swiglu_backward_kernel(bf16* dgate_up, unsigned* amax_bits, const bf16* dact, const bf16* gate_up, int N,
                                       int F) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    float amax = 0.0f;
    if (i < (size_t)N * F) {
        size_t n = i / F, f = i % F;
        Vec16<bf16> g = load16(gate_up + n * 2 * F + f), u = load16(gate_up + n * 2 * F + F + f), da = load16(dact + i);
        Vec16<bf16> dg, du;
        for (int e = 0; e < 8; e++) {
            float gv = __bfloat162float(g.v[e]), dav = __bfloat162float(da.v[e]);
            float sig = 1.0f / (1.0f + expf(-gv));
            du.v[e] = __float2bfloat16_rn(dav * round_bf16(gv * sig));
            float dsilu = round_bf16(dav * __bfloat162float(u.v[e]));
            dg.v[e] = __float2bfloat16_rn(dsilu * (sig * (1.0f + gv * (1.0f - sig))));
            amax = fmaxf(amax, fmaxf(fabsf(__bfloat162float(dg.v[e])), fabsf(__bfloat162float(du.v[e]))));
        }
        store16(dgate_up + n * 2 * F + f, dg);
        store16(dgate_up + n * 2 * F + F + f, du);
    }
    if (AMAX) block_amax(amax_bits, amax);
}

// The forward (out = act) or the backward (out = dgate_up, from dact); amax_bits: NULL, or where
// [fp8] the largest |out| goes (atomicMax onto what is there: zeroed before the step).
static void swiglu(bool backward, bf16* out, const bf16* dact, const bf16* gate_up, int N, int F, cudaStream_t s,
                   unsigned* amax_bits = NULL) {
    unsigned grid = ceil_div((size_t)N * F / 8, 256);
    BOOL_SWITCH(amax_bits != NULL, AMAX, [&] {
        if (backward) swiglu_backward_kernel<AMAX><<<grid, 256, 0, s>>>(out, amax_bits, dact, gate_up, N, F);
        else swiglu_forward_kernel<AMAX><<<grid, 256, 0, s>>>(out, amax_bits, gate_up, N, F);
    });
    LAUNCH_CHECK();
}

// ---- classifier ----

// Online softmax statistics: (max, sum of exp(x - max)) merged across threads.
struct SoftmaxStat {
    float max, sum;
};
__device__ inline SoftmaxStat softmax_merge(SoftmaxStat a, SoftmaxStat b) {
    float m = fmaxf(a.max, b.max);
    if (m == -INFINITY) return a;
    return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}
__device__ inline SoftmaxStat block_softmax_stat(SoftmaxStat st) {
    __shared__ SoftmaxStat partial[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 16; o > 0; o >>= 1)
        st = softmax_merge(st, {__shfl_xor_sync(0xffffffffu, st.max, o), __shfl_xor_sync(0xffffffffu, st.sum, o)});
    if (lane == 0) partial[warp] = st;
    __syncthreads();
    st = lane < (int)(blockDim.x / 32) ? partial[lane] : SoftmaxStat{-INFINITY, 0.0f};
    for (int o = 16; o > 0; o >>= 1)
        st = softmax_merge(st, {__shfl_xor_sync(0xffffffffu, st.max, o), __shfl_xor_sync(0xffffffffu, st.sum, o)});
    return st;
}

// [fused classifier] One block per token row of bf16 logits (V wide): loss = logsumexp - logit
// of the target, and dlogits = (softmax - onehot) * dloss written as bf16 over the logits in
// place: no fp32 logits and no second V-wide buffer. Reads the row twice (the second mostly from
// L2) and writes it once. V % 8 == 0.
__global__ void cross_entropy_kernel(bf16* logits, float* losses, const int* targets, int V, float dloss) {
    bf16* row = logits + (size_t)blockIdx.x * V;
    int target = targets[blockIdx.x];
    SoftmaxStat st = {-INFINITY, 0.0f};
    for (int i = threadIdx.x * 8; i < V; i += blockDim.x * 8) {
        Vec16<bf16> x = load16(row + i);
        float m = st.max;
        for (int e = 0; e < 8; e++) m = fmaxf(m, __bfloat162float(x.v[e]));
        float sum = st.sum * expf(st.max - m);
        for (int e = 0; e < 8; e++) sum += expf(__bfloat162float(x.v[e]) - m);
        st = {m, sum};
    }
    float target_logit = __bfloat162float(row[target]); // read before any thread overwrites the row
    st = block_softmax_stat(st);
    float lse = st.max + logf(st.sum);
    if (threadIdx.x == 0) losses[blockIdx.x] = lse - target_logit;
    __syncthreads();
    for (int i = threadIdx.x * 8; i < V; i += blockDim.x * 8) {
        Vec16<bf16> x = load16(row + i);
        for (int e = 0; e < 8; e++) {
            float p = expf(__bfloat162float(x.v[e]) - lse);
            x.v[e] = __float2bfloat16_rn((p - (i + e == target ? 1.0f : 0.0f)) * dloss);
        }
        store16(row + i, x);
    }
}
static void cross_entropy(bf16* logits, float* losses, const int* targets, int N, int V, float dloss, cudaStream_t s) {
    cross_entropy_kernel<<<N, 512, 0, s>>>(logits, losses, targets, V, dloss);
    LAUNCH_CHECK();
}

// Sum of values[0, n) by one block in a fixed order (deterministic); every thread gets it.
__device__ inline float block_sum_of(const float* values, int n) {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sum += values[i];
    return block_sum(sum);
}
// Mean of values[0, n): a step's per-token losses, or the val batches' losses.
__global__ void mean_kernel(float* out, const float* values, int n) {
    float sum = block_sum_of(values, n);
    if (threadIdx.x == 0) *out = sum / n;
}
static void mean(float* out, const float* values, int n, cudaStream_t s) {
    mean_kernel<<<1, 1024, 0, s>>>(out, values, n);
    LAUNCH_CHECK();
}

// ---- AdamW ----

// Hyperparameters of one step. They live in device memory, written by adamw_next_step at the
// start of each step [graphs]: a captured step then replays unchanged, with no value of the host
// baked into it and no host-to-device copy per step; each AdamW thread reads the 40 bytes from
// cache. The step's own kernels complete them: grad_scale once the gradient norm is known, skip
// once the loss (and norm) are.
typedef struct {
    float lr, beta1, beta2, eps, weight_decay; // lr: the schedule's for this step
    float step_size;       // lr / (1 - beta1^t)
    float bias_corr2_sqrt; // sqrt(1 - beta2^t)
    float grad_scale;      // gradient clipping's min(1, clip / (norm + 1e-6)); 1 without clipping
    int skip;              // NaN guard: 1 when the step's loss or gradient norm is not finite
    unsigned t;            // the step (from 1): keys the [bf16 moments] rounding stream
} AdamWParams;

// What the host learns of each step, copied to pinned memory once per step (read a step later).
typedef struct {
    float loss;      // mean loss over the step's tokens
    float grad_norm; // global L2 norm of the gradients before clipping (with --grad_clip only)
    float lr;
    int skipped;       // 1: this step's update was skipped by the NaN guard
    int bad_in_row;    // skipped steps in a row, this one included
    int skipped_total; // skipped steps of this process
} StepStats;

// Step t's hyperparameters (t from 1): the scheduled lr and the bias corrections, in double as
// torch.optim.AdamW computes them on the host; no clipping yet (grad_scale 1), not skipped.
static inline L3_HOST_DEVICE AdamWParams adamw_params_at(const OptimConfig& o, int t) {
    AdamWParams p;
    p.lr = lr_at(o.sched, t);
    p.beta1 = o.beta1, p.beta2 = o.beta2, p.eps = o.eps, p.weight_decay = o.weight_decay;
    p.step_size = (float)(p.lr / (1.0 - pow((double)p.beta1, t)));
    p.bias_corr2_sqrt = (float)sqrt(1.0 - pow((double)p.beta2, t));
    p.grad_scale = 1.0f, p.skip = 0, p.t = (unsigned)t;
    return p;
}

// AdamW's hyperparameters of the last two steps, in device memory. A step's first kernel
// (adamw_next_step) moves `latest` into `previous` and writes its own into `latest`. So inside
// step t, `latest` is step t's and `previous` step t-1's: the step whose deferred updates step t
// runs first [deferred AdamW]; between steps, `latest` is the step just run.
typedef struct {
    AdamWParams latest, previous;
} AdamWHistory;

// One thread: t = ++step, then step t's hyperparameters into h->latest, step t-1's kept in
// h->previous.
__global__ void adamw_next_step_kernel(AdamWHistory* h, int* step, OptimConfig o, StepStats* stats) {
    int t = ++*step;
    h->previous = h->latest;
    h->latest = adamw_params_at(o, t);
    stats->lr = h->latest.lr;
}
static void adamw_next_step(AdamWHistory* h, int* step, OptimConfig o, StepStats* stats, cudaStream_t s) {
    adamw_next_step_kernel<<<1, 1, 0, s>>>(h, step, o, stats);
    LAUNCH_CHECK();
}

// The NaN guard's count, by the step's last guard kernel: a skipped step extends the run of bad
// steps that --max_bad_steps bounds, a good one ends it.
__device__ inline void count_step(StepStats* stats, int skip) {
    stats->skipped = skip;
    stats->bad_in_row = skip ? stats->bad_in_row + 1 : 0;
    stats->skipped_total += skip;
}

// The step's mean loss (one block, fixed order: deterministic) and the NaN guard on it, before any
// AdamW of the step reads h->skip. count: this is the step's last guard (no gradient norm follows).
__global__ void loss_guard_kernel(AdamWParams* h, StepStats* stats, const float* losses, int n, bool count) {
    float sum = block_sum_of(losses, n);
    if (threadIdx.x != 0) return;
    stats->loss = sum / n;
    h->skip = !isfinite(stats->loss);
    if (count) count_step(stats, h->skip);
}
static void loss_guard(AdamWParams* h, StepStats* stats, const float* losses, int n, bool count, cudaStream_t s) {
    loss_guard_kernel<<<1, 1024, 0, s>>>(h, stats, losses, n, count);
    LAUNCH_CHECK();
}

// [data parallel] The NaN guard's count once the ranks agree on the skip (every rank's loss_guard,
// then an all-reduce of the skip flags): a step skipped on one rank is skipped on all.
__global__ void count_step_kernel(const AdamWParams* h, StepStats* stats) { count_step(stats, h->skip); }
static void count_step_after(const AdamWParams* h, StepStats* stats, cudaStream_t s) {
    count_step_kernel<<<1, 1, 0, s>>>(h, stats);
    LAUNCH_CHECK();
}

// [clipping] Sum of squares of n gradients into partial[blockIdx.x], VEC per 16-byte load, in a
// fixed grid: each block's share is the same every step, so the sum is deterministic. Reading the
// gradients is the whole cost (2 bytes per bf16 gradient): launched on the optimizer stream as
// soon as the backward has written them, it fills bandwidth the backward leaves idle, partly from
// L2 where the gradient GEMM just wrote.
template <int VEC, typename G> __device__ inline float thread_sum_squares(const G* g, size_t n) {
    float acc = 0.0f;
    size_t stride = (size_t)gridDim.x * blockDim.x * VEC;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC; i < n; i += stride) {
        if constexpr (VEC > 1) {
            Vec16<G> x = load16(g + i);
            for (int e = 0; e < VEC; e++) acc += (float)x.v[e] * (float)x.v[e];
        } else {
            acc += (float)g[i] * (float)g[i];
        }
    }
    return acc;
}
template <int VEC, typename G> __global__ void sum_squares_kernel(float* partial, const G* g, size_t n) {
    float acc = block_sum(thread_sum_squares<VEC>(g, n));
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}
// [clipping] [sparse rows] The same over the wte gradient rows this step touched (the rest are
// zero): block b takes the sorted entries b, b + gridDim.x, ... that own their row.
__global__ void sum_squares_rows_kernel(float* partial, const float* g, const int* sorted_tokens, int n_sorted, int C) {
    float acc = 0.0f;
    for (int j = blockIdx.x; j < n_sorted; j += gridDim.x) {
        if (!owns_row(sorted_tokens, j)) continue;
        const float* row = g + (size_t)sorted_tokens[j] * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) acc += row[c] * row[c];
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}
// Blocks per sum of squares: each launch owns this many partial sums (unused ones stay zero).
// 1024 of 256 threads keep 4 MB of loads in flight, about what the H200 needs to stream at full
// bandwidth (dev/grad_norm).
#define SUMSQ_BLOCKS 1024
template <typename G> static void sum_squares(float* partial, const G* g, size_t n, cudaStream_t s) {
    const int vec = 16 / sizeof(G), threads = 256;
    unsigned blocks = std::min<unsigned>(SUMSQ_BLOCKS, ceil_div(n, (size_t)threads * vec));
    BOOL_SWITCH(n % vec == 0 && aligned16(g), VEC16, [&] {
        sum_squares_kernel<VEC16 ? 16 / sizeof(G) : 1><<<blocks, threads, 0, s>>>(partial, g, n);
    });
    LAUNCH_CHECK();
}
static void sum_squares_rows(float* partial, const float* g, const int* sorted_tokens, int n_sorted, int C,
                             cudaStream_t s) {
    sum_squares_rows_kernel<<<std::min(SUMSQ_BLOCKS, n_sorted), 256, 0, s>>>(partial, g, sorted_tokens, n_sorted, C);
    LAUNCH_CHECK();
}

// [clipping] The global norm from every partial sum (one block, fixed order), as
// torch.nn.utils.clip_grad_norm_: scale = min(1, clip / (norm + 1e-6)); a norm that is not finite
// skips the step (NaN guard). The step's last guard: counts it.
__global__ void clip_guard_kernel(AdamWParams* h, StepStats* stats, const float* partial, int n, float clip) {
    float sum = block_sum_of(partial, n);
    if (threadIdx.x != 0) return;
    float norm = sqrtf(sum);
    stats->grad_norm = norm;
    h->grad_scale = fminf(1.0f, clip / (norm + 1e-6f));
    h->skip |= !isfinite(norm);
    count_step(stats, h->skip);
}
static void clip_guard(AdamWParams* h, StepStats* stats, const float* partial, int n, float clip, cudaStream_t s) {
    clip_guard_kernel<<<1, 1024, 0, s>>>(h, stats, partial, n, clip);
    LAUNCH_CHECK();
}

// torch.optim.AdamW's update (the fused kernel's order of operations), on the gradient times the
// clipping scale; weight decay wd (0 for the norm weights). APPROX: the square root and the two
// divisions by the special-function unit (2 ulp) in place of IEEE's, about 20 instructions an element
// fewer, for [bf16 weights], whose update is rounded into bf16 at random anyway (dev/adamw version 7:
// 99 % of the copy rate on the 1B's largest tensor where IEEE's version 6 reached 90 %, H100).
template <bool APPROX = false>
__device__ inline void adamw_update(float& p, float& m, float& v, float g, const AdamWParams& h, float wd) {
    g *= h.grad_scale;
    p -= h.lr * wd * p;
    m = h.beta1 * m + (1.0f - h.beta1) * g;
    v = h.beta2 * v + (1.0f - h.beta2) * g * g;
    if constexpr (APPROX) {
        float root;
        asm("sqrt.approx.f32 %0, %1;" : "=f"(root) : "f"(v)); // (of +0: +0)
        p -= h.step_size * __fdividef(m, __fdividef(root, h.bias_corr2_sqrt) + h.eps);
    } else {
        p -= h.step_size * m / (sqrtf(v) / h.bias_corr2_sqrt + h.eps);
    }
}

// Gradients as floats, fp32 or [bf16 grads]: 4 at a time in one 128-bit (fp32) or 64-bit (bf16)
// load, or one.
__device__ inline float4 load_grad4(const float* g) { return *reinterpret_cast<const float4*>(g); }
__device__ inline float4 load_grad4(const bf16* g) { return load_bf16x4(g); }
__device__ inline float grad_at(const float* g, size_t i) { return g[i]; }
__device__ inline float grad_at(const bf16* g, size_t i) { return __bfloat162float(g[i]); }

// [bf16 moments] (--optimizer_state bf16) m and v stored as bf16, computed in fp32 and rounded
// stochastically: up with the probability of the dropped fraction, so a rounded value is right on
// average, and v's many small steps of (1 - beta2) g^2, each under half a bf16 ulp, add up instead
// of rounding away. The 16 random bits of each value come from a counter-based stream, mix64 of
// (element, step): fresh every step, the same on a rerun or a resume, no generator state to save.
// An element's m takes bits 0-15, its v bits 16-31, and [bf16 weights] its weight bits 32-47 (the
// weight with no fp32 master: its update rounded into it the same way). Not finite values pass
// unrounded.
__device__ inline uint64_t rounding_bits(uint64_t element, unsigned t) {
    return mix64((element + 1) * 0x9E3779B97F4A7C15ull + (uint64_t)t * 0xD1B54A32D192ED03ull);
}
#define ROUND_M 0
#define ROUND_V 16
#define ROUND_W 32
__device__ inline bf16 bf16_stochastic(float x, uint32_t r16) {
    uint32_t b = __float_as_uint(x);
    if ((b & 0x7F800000u) == 0x7F800000u) return __float2bfloat16_rn(x);
    return __ushort_as_bfloat16((unsigned short)((b + (r16 & 0xFFFFu)) >> 16)); // a carry rounds up
}
// x rounded with the 16 bits of `bits` from `shift` on.
__device__ inline bf16 bf16_rounded(float x, uint64_t bits, int shift) {
    return bf16_stochastic(x, (uint32_t)(bits >> shift));
}

// AdamW's values (weight, m, v) as floats, and back: fp32 as they are, bf16 rounded as above with
// 16 of the element's bits from `shift` (ROUND_M, ROUND_V, ROUND_W). 4 at a time in one 128-bit
// (fp32) or 64-bit (bf16) access, or one.
__device__ inline Vec16<float> load_state4(const float* p) { return load16(p); }
__device__ inline Vec16<float> load_state4(const bf16* p) {
    float4 f = load_bf16x4(p);
    return Vec16<float>{{f.x, f.y, f.z, f.w}};
}
__device__ inline float state_at(const float* p, size_t i) { return p[i]; }
__device__ inline float state_at(const bf16* p, size_t i) { return __bfloat162float(p[i]); }
__device__ inline void store_state4(float* p, const Vec16<float>& x, const uint64_t*, int) { store16(p, x); }
__device__ inline void store_state4(bf16* p, const Vec16<float>& x, const uint64_t* bits, int shift) {
    __nv_bfloat162 a, b;
    a.x = bf16_rounded(x.v[0], bits[0], shift), a.y = bf16_rounded(x.v[1], bits[1], shift);
    b.x = bf16_rounded(x.v[2], bits[2], shift), b.y = bf16_rounded(x.v[3], bits[3], shift);
    *reinterpret_cast<uint2*>(p) = make_uint2(*reinterpret_cast<unsigned*>(&a), *reinterpret_cast<unsigned*>(&b));
}
__device__ inline void store_state(float* p, size_t i, float x, uint64_t, int) { p[i] = x; }
__device__ inline void store_state(bf16* p, size_t i, float x, uint64_t bits, int shift) {
    p[i] = bf16_rounded(x, bits, shift);
}
// The rounding bits of element `element` at step t, drawn only when the weight (P) or the moments
// (M) are bf16.
template <typename P, typename M> __device__ inline uint64_t update_bits(uint64_t element, unsigned t) {
    if constexpr (std::is_same<M, bf16>::value || std::is_same<P, bf16>::value) return rounding_bits(element, t);
    else return 0;
}

// AdamW on 4 consecutive elements at i with 128-bit loads and stores (64-bit for bf16 values);
// returns the new parameters (for the shadow copy). P: the weight's type, fp32 (the master) or
// [bf16 weights] bf16 (the only copy). `element` is params[i]'s index in the whole parameter block
// (the rounding stream's key, the same on every rank). Plain, not streaming (__ldcs/__stcs),
// accesses: dev/adamw measured the streaming hints at 93% of the copy ceiling and plain ones at 99%
// on the H200.
template <bool APPROX = false, typename P, typename G, typename M>
__device__ inline float4 adamw_update4(P* params, M* m, M* v, const G* grads, size_t i, uint64_t element,
                                       const AdamWParams& h, float wd) {
    Vec16<float> p = load_state4(params + i), m4 = load_state4(m + i), v4 = load_state4(v + i);
    float4 g4 = load_grad4(grads + i);
    const float g[4] = {g4.x, g4.y, g4.z, g4.w};
    uint64_t bits[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        adamw_update<APPROX>(p.v[e], m4.v[e], v4.v[e], g[e], h, wd);
        bits[e] = update_bits<P, M>(element + e, h.t);
    }
    store_state4(params + i, p, bits, ROUND_W);
    store_state4(m + i, m4, bits, ROUND_M);
    store_state4(v + i, v4, bits, ROUND_V);
    return make_float4(p.v[0], p.v[1], p.v[2], p.v[3]);
}
template <bool APPROX = false, typename P, typename G, typename M>
__device__ inline float adamw_update1(P* params, M* m, M* v, const G* grads, size_t i, uint64_t element,
                                      const AdamWParams& h, float wd) {
    float p = state_at(params, i), mi = state_at(m, i), vi = state_at(v, i);
    adamw_update<APPROX>(p, mi, vi, grad_at(grads, i), h, wd);
    uint64_t bits = update_bits<P, M>(element, h.t);
    store_state(params, i, p, bits, ROUND_W);
    store_state(m, i, mi, bits, ROUND_M);
    store_state(v, i, vi, bits, ROUND_V);
    return p;
}

// [float4 Adam] [shadow weights] Dense AdamW, VEC elements per thread (4: 128-bit loads and
// stores; 1: the scalar fallback), and with SHADOW the bf16 copy the GEMMs read is written in
// the same pass: 30 bytes per element (g, p, m, v read; p, m, v, shadow written; 28 with [bf16
// grads], 22 with [bf16 moments]) and no cast kernel before any GEMM. [bf16 weights] P bf16: the
// weight itself is what the GEMMs read, no shadow (14 bytes per element with bf16 grads and
// moments). The last n % VEC elements are done by the first threads, scalar. G: the gradient's
// type, float or bf16; M: the moments', float or bf16. element0: params[0]'s index in the
// parameter block. decay: weight decay applies (not to the norm weights). A step the NaN guard
// skips changes nothing. APPROX: adamw_update's.
template <int VEC, bool SHADOW, bool APPROX = false, typename P, typename G, typename M>
__global__ void adamw_kernel(P* params, M* m, M* v, const G* grads, bf16* shadow, size_t n, uint64_t element0,
                             const AdamWParams* hp, bool decay) {
    static_assert(!(SHADOW && std::is_same<P, bf16>::value), "bf16 weights are their own bf16 copy: no shadow");
    const AdamWParams h = *hp;
    if (h.skip) return;
    float wd = decay ? h.weight_decay : 0.0f;
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x, i = t * VEC;
    if (i + VEC <= n) {
        if constexpr (VEC == 4) {
            float4 p = adamw_update4<APPROX>(params, m, v, grads, i, element0 + i, h, wd);
            if (SHADOW) store_bf16x4(shadow + i, p);
        } else {
            float p = adamw_update1<APPROX>(params, m, v, grads, i, element0 + i, h, wd);
            if (SHADOW) shadow[i] = __float2bfloat16_rn(p);
        }
    }
    size_t tail = n % VEC;
    if (t < tail) {
        size_t j = n - tail + t;
        float p = adamw_update1<APPROX>(params, m, v, grads, j, element0 + j, h, wd);
        if (SHADOW) shadow[j] = __float2bfloat16_rn(p);
    }
}

#define ADAMW_THREADS 256 // per block of adamw_kernel

// p aligned for a 4-element access of its type (16 bytes for fp32, 8 for bf16).
template <typename T> static bool aligned_for4(const T* p) { return (uintptr_t)p % (4 * sizeof(T)) == 0; }

// Guards [float4 Adam]: 128-bit access needs every fp32 pointer 16-byte aligned (the shadow, bf16
// weights, gradients and moments 8-byte), and a tensor smaller than one float4 per thread over all SMs
// runs scalar so that it still spreads across the chip (the seed's minimum size, scaled by SM
// count). shadow NULL: no shadow copy.
template <typename P, typename G, typename M>
static bool adamw_vec4_ok(const P* params, const M* m, const M* v, const G* grads, const bf16* shadow, size_t n,
                          int sms) {
    bool aligned = aligned_for4(params) && aligned_for4(m) && aligned_for4(v) && aligned_for4(grads) &&
                   (shadow == NULL || aligned_for4(shadow));
    return aligned && n >= (size_t)sms * ADAMW_THREADS * 4;
}
// adamw_kernel over n elements, float4 where adamw_vec4_ok allows it; shadow NULL without SHADOW.
// allow_vec4 = false forces the scalar kernel (the ablation's "no vectorised Adam").
template <bool SHADOW, bool APPROX = false, typename P, typename G, typename M>
static void adamw_dense(P* params, M* m, M* v, const G* grads, bf16* shadow, size_t n, uint64_t element0,
                        const AdamWParams* h, bool decay, int sms, cudaStream_t s, bool allow_vec4 = true) {
    const int threads = ADAMW_THREADS;
    BOOL_SWITCH(allow_vec4 && adamw_vec4_ok(params, m, v, grads, shadow, n, sms), VEC4, [&] {
        unsigned blocks = VEC4 ? ceil_div(n / 4 + 1, threads) : ceil_div(n, threads);
        adamw_kernel<VEC4 ? 4 : 1, SHADOW, APPROX>
            <<<blocks, threads, 0, s>>>(params, m, v, grads, shadow, n, element0, h, decay);
    });
    LAUNCH_CHECK();
}

// [sparse rows] Lazy AdamW over the rows of wte this step touched (block j owns sorted entry j
// when it is the first of its run): the dense kernel's update on those rows only, so untouched
// rows keep their m and v, and the gradient row is zeroed in the same pass, which restores the
// "zero outside touched rows" invariant without a fill. 128-bit when C % 4 == 0 and the
// pointers are aligned (VEC 4), scalar otherwise. A skipped step only zeroes the rows. element0:
// params[0]'s index in the parameter block (the [bf16 moments] rounding stream's key).
template <int VEC, typename M>
__global__ void adamw_sparse_rows_kernel(float* params, M* m, M* v, float* grads, const int* sorted_tokens, int C,
                                         uint64_t element0, const AdamWParams* hp) {
    const AdamWParams h = *hp;
    int j = blockIdx.x;
    if (!owns_row(sorted_tokens, j)) return;
    size_t row = (size_t)sorted_tokens[j] * C;
    for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
        if constexpr (VEC == 4) {
            if (!h.skip) adamw_update4(params, m, v, grads, row + c, element0 + row + c, h, h.weight_decay);
            store16(grads + row + c, Vec16<float>{});
        } else {
            if (!h.skip) adamw_update1(params, m, v, grads, row + c, element0 + row + c, h, h.weight_decay);
            grads[row + c] = 0.0f;
        }
    }
}
template <typename M>
static void adamw_sparse_rows(float* params, M* m, M* v, float* grads, const int* sorted_tokens, int n_sorted, int C,
                              uint64_t element0, const AdamWParams* h, cudaStream_t s, bool allow_vec4 = true) {
    bool vec4 = allow_vec4 && C % 4 == 0 && aligned16(params) && aligned_for4(m) && aligned_for4(v) && aligned16(grads);
    BOOL_SWITCH(vec4, VEC4, [&] {
        adamw_sparse_rows_kernel<VEC4 ? 4 : 1>
            <<<n_sorted, 128, 0, s>>>(params, m, v, grads, sorted_tokens, C, element0, h);
    });
    LAUNCH_CHECK();
}

// ---- sampling ----

// The next token from one row of V bf16 logits, chosen as HF generate does, with the host's
// uniform draw u in [0, 1):
//   temperature 0: the argmax, the lowest index among equal maxima (torch.argmax, do_sample=False);
//   temperature > 0: softmax(logits / temperature) over the logits >= the top_k-th largest (ties
//   at that threshold kept, as TopKLogitsWarper; top_k 0 or >= V keeps all), and the first index,
//   in index order, whose cumulative probability exceeds u.
// NaN logits count as -inf, and -0 equals +0. When the largest logit is not finite (+inf, or every
// logit -inf or NaN) the result is the argmax: there are no finite weights to draw from.
// It runs once per generated token, outside the training step, so one block of SAMPLE_THREADS
// does all of it, every sum in a fixed order (deterministic). The block reductions carry keys,
// counts and indices as floats: exact below 2^24.
#define SAMPLE_THREADS 1024

// Unsigned 16-bit key that orders bf16 logits as floats (negatives: every bit flipped; the rest:
// sign bit set). NaN takes -inf's key and -0 takes +0's.
__device__ inline unsigned logit_key(bf16 x) {
    unsigned b = __bfloat16_as_ushort(x);
    if ((b & 0x7FFFu) > 0x7F80u) b = 0xFF80u; // NaN -> -inf
    if (b == 0x8000u) b = 0;                  // -0 -> +0
    return b & 0x8000u ? ~b & 0xFFFFu : b | 0x8000u;
}
__device__ inline float logit_value(bf16 x) {
    float f = __bfloat162float(x);
    return isnan(f) ? -INFINITY : f;
}

// Calls f(i, logit i) for i in [begin, end) by steps of `step`, VEC logits per load: VEC = 8 is
// one 16-byte load (row 16-byte aligned; begin, end and step multiples of 8), VEC = 1 one bf16.
template <int VEC, typename F>
__device__ inline void for_each_logit(const bf16* row, int begin, int end, int step, F f) {
    for (int i = begin; i < end; i += step) {
        Vec16<bf16> x;
        if (VEC == 8) x = load16(row + i);
        else x.v[0] = row[i];
        for (int e = 0; e < VEC; e++) f(i + e, x.v[e]);
    }
}

__device__ inline float warp_inclusive_sum(float v) {
    int lane = threadIdx.x % 32;
    for (int o = 1; o < 32; o <<= 1) {
        float u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
}
// Exclusive prefix sum over the block in thread order (blockDim.x a multiple of 32), the block's
// total in *total: a scan within each warp, then one of the warp totals. A sum of zeros is 0.
__device__ inline float block_exclusive_sum(float v, float* total) {
    __shared__ float warp_total[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float inclusive = warp_inclusive_sum(v);
    __syncthreads(); // a previous call may still be reading warp_total
    if (lane == 31) warp_total[warp] = inclusive;
    __syncthreads();
    float warps = warp_inclusive_sum(lane < (int)(blockDim.x / 32) ? warp_total[lane] : 0.0f);
    *total = __shfl_sync(0xffffffffu, warps, 31);
    float before_warp = __shfl_sync(0xffffffffu, warps, (warp + 31) % 32);
    float before_lane = __shfl_up_sync(0xffffffffu, inclusive, 1);
    return (warp > 0 ? before_warp : 0.0f) + (lane > 0 ? before_lane : 0.0f);
}

// The lowest index holding the largest key: each thread keeps the first maximum of its strided
// logits (visited in increasing order), then one block max finds the key and one the least index
// holding it (negated).
template <int VEC> __device__ inline int argmax_logit(const bf16* row, int V) {
    float best = -1.0f, first = 0.0f;
    for_each_logit<VEC>(row, threadIdx.x * VEC, V, blockDim.x * VEC, [&](int i, bf16 x) {
        float key = (float)logit_key(x);
        if (key > best) {
            best = key;
            first = (float)i;
        }
    });
    float top = block_max(best);
    return (int)-block_max(best == top ? -first : -INFINITY);
}

// Key of the top_k-th largest logit: the largest t with count(key >= t) >= top_k, bisected bit by
// bit from the top. Exact, and it needs no buffer: 16 counting passes over the row (coalesced,
// mostly from L2), each one block sum.
template <int VEC> __device__ inline unsigned top_k_threshold(const bf16* row, int V, int top_k) {
    unsigned threshold = 0;
    for (int bit = 15; bit >= 0; bit--) {
        unsigned t = threshold | 1u << bit;
        float n = 0.0f;
        for_each_logit<VEC>(row, threadIdx.x * VEC, V, blockDim.x * VEC, [&](int, bf16 x) {
            n += logit_key(x) >= t;
        });
        if (block_sum(n) >= top_k) threshold = t;
    }
    return threshold;
}

// Inverse-CDF draw over w_i = exp((x_i - max) / temperature) for the logits with key >= threshold
// (0 elsewhere), in index order. Thread t sums a contiguous chunk of the row; a block exclusive
// scan gives each chunk's start; the last chunk with weight that starts at or below u * total
// (the first such chunk starts at exactly 0, so there is one) rescans its logits for the first
// index where the running sum exceeds u * total. Should fp32 rounding leave the chunk's end at or
// below it, the chunk's last index with weight is taken: the token always has weight.
template <int VEC>
__device__ inline void sample_weights(int* token_out, const bf16* row, int V, float max_logit, float temperature,
                                      unsigned threshold, float uniform) {
    auto weight = [&](bf16 x) {
        return logit_key(x) >= threshold ? expf((logit_value(x) - max_logit) / temperature) : 0.0f;
    };
    int per_round = blockDim.x * VEC, chunk = (V + per_round - 1) / per_round * VEC; // a multiple of VEC
    int begin = min((int)threadIdx.x * chunk, V), end = min(begin + chunk, V);
    float sum = 0.0f, total;
    for_each_logit<VEC>(row, begin, end, VEC, [&](int, bf16 x) { sum += weight(x); });
    float start = block_exclusive_sum(sum, &total);
    float target = fminf(fmaxf(uniform, 0.0f), 1.0f) * total; // clamped: some chunk always owns it
    int owner = (int)block_max(sum > 0.0f && start <= target ? (float)threadIdx.x : -1.0f);
    if ((int)threadIdx.x != owner) return;
    float run = start;
    int first_over = -1, last_kept = begin;
    for_each_logit<VEC>(row, begin, end, VEC, [&](int i, bf16 x) {
        float w = weight(x);
        run += w;
        if (w > 0.0f) last_kept = i;
        if (first_over < 0 && run > target) first_over = i;
    });
    *token_out = first_over >= 0 ? first_over : last_kept;
}

// One block: the argmax pass; for temperature > 0, the top-k bisection when it filters, then the
// weights' pass, its scan and one chunk's rescan. Reads the row 2 (greedy), 3 or 19 (top-k) times.
template <int VEC>
__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_token_kernel(int* token_out, const bf16* logits, int V, float temperature, int top_k, float uniform) {
    int greedy = argmax_logit<VEC>(logits, V);
    float max_logit = logit_value(logits[greedy]);
    if (!(temperature > 0.0f) || !isfinite(max_logit)) {
        if (threadIdx.x == 0) *token_out = greedy;
        return;
    }
    unsigned threshold = top_k > 0 && top_k < V ? top_k_threshold<VEC>(logits, V, top_k) : 0;
    sample_weights<VEC>(token_out, logits, V, max_logit, temperature, threshold, uniform);
}

// *token_out (device) = the token chosen from logits[0, V) (device). 16-byte loads when the row
// allows them (V % 8 == 0, 16-byte aligned), else one bf16 per load. V < 2^24: the reductions'
// floats hold every count and index exactly. A finite temperature: an infinite one would weigh
// -inf logits as exp(-inf / inf) = NaN.
static void sample_token(int* token_out, const bf16* logits, int V, float temperature, int top_k, float uniform,
                         cudaStream_t s) {
    if (V < 1 || V >= 1 << 24 || !isfinite(temperature)) {
        fprintf(stderr, "sample_token: V = %d must be in [1, 2^24), temperature %g finite\n", V, temperature);
        exit(EXIT_FAILURE);
    }
    BOOL_SWITCH(V % 8 == 0 && aligned16(logits), VEC16, [&] {
        sample_token_kernel<VEC16 ? 8 : 1>
            <<<1, SAMPLE_THREADS, 0, s>>>(token_out, logits, V, temperature, top_k, uniform);
    });
    LAUNCH_CHECK();
}

// ---- matmul (cuBLASLt) ----
// Row-major D[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * D, bf16 inputs, fp32 accumulate,
// D bf16 or fp32, packed rows, optionally strided-batched. cuBLASLt is column-major, so we ask
// it for D^T = op(B)^T @ op(A)^T: the row-major buffers are already those transposes.
// A plan (descriptors + heuristic's algorithm) is built once per distinct call shape and reused:
// the heuristic query costs far more host time than the launch.

typedef struct {
    int M, N, K, batch;
    bool trans_a, trans_b, out_fp32;
    cudaDataType type_a, type_b; // bf16, or [fp8] e4m3 / e5m2 (then NT only: cuBLASLt's FP8 kernels are TN)
    bool fast_accum;             // [fp8] cuBLASLt's fast accumulation (partial sums not promoted to fp32)
    long long stride_a, stride_b, stride_d;
    int align_a, align_b, align_d; // pointer alignment in bytes, capped at 256
} GemmKey;

typedef struct {
    GemmKey key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} GemmPlan;

#define GEMM_MAX_PLANS 128
typedef struct {
    cublasLtHandle_t handle;
    void* workspace;
    size_t workspace_bytes;
    GemmPlan plans[GEMM_MAX_PLANS];
    int n_plans;
} Gemm;

static int pointer_alignment(const void* p) {
    int a = 256;
    while (a > 1 && ((uintptr_t)p % a) != 0) a /= 2;
    return a;
}

static cublasLtMatrixLayout_t gemm_layout(cudaDataType t, int rows, int cols, int batch, long long stride) {
    cublasLtMatrixLayout_t l;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, t, rows, cols, rows));
    if (batch > 1) {
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
    return l;
}

// The heuristic's best n algorithms for plan p (its descriptors, the key's alignments, the
// workspace), best first, into results; returns how many it found. gemm_plan keeps the first;
// dev/gemm times the others.
static int gemm_candidates(Gemm* g, const GemmPlan* p, cublasLtMatmulHeuristicResult_t* results, int n) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint32_t al_a = p->key.align_b, al_b = p->key.align_a, al_d = p->key.align_d; // cuBLAS's A is our B
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &g->workspace_bytes, sizeof(g->workspace_bytes)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, 4));
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(g->handle, p->op, p->a, p->b, p->d, p->d, pref, n, results, &found));
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    return found;
}

// [fp8] The inverse scales cuBLASLt multiplies an FP8 product by (device pointers; cuBLAS's A is our
// B, see matmul). They are set before the heuristic query as well, which otherwise may pick a kernel
// without scaling, and before every call (the plan is shared by calls on other tensors).
static void gemm_set_scales(GemmPlan* p, const float* a_scale_inv, const float* b_scale_inv) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv,
                                                sizeof(b_scale_inv)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv,
                                                sizeof(a_scale_inv)));
}

// The plan of key k, made on first use; an FP8 key's with the given inverse scales.
static GemmPlan* gemm_plan(Gemm* g, const GemmKey* k, const float* a_scale_inv = NULL,
                           const float* b_scale_inv = NULL) {
    for (int i = 0; i < g->n_plans; i++)
        if (!memcmp(&g->plans[i].key, k, sizeof(GemmKey))) return &g->plans[i];
    if (g->n_plans == GEMM_MAX_PLANS) {
        fprintf(stderr, "gemm: more than %d distinct GEMM shapes\n", GEMM_MAX_PLANS);
        exit(EXIT_FAILURE);
    }
    GemmPlan* p = &g->plans[g->n_plans];
    p->key = *k;
    cublasOperation_t op_b = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // cuBLAS's "A" is our B and its "B" is our A (see above).
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)));
    if (k->fast_accum) {
        int8_t on = 1;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof(on)));
    }
    p->a = gemm_layout(k->type_b, k->trans_b ? k->K : k->N, k->trans_b ? k->N : k->K, k->batch, k->stride_b);
    p->b = gemm_layout(k->type_a, k->trans_a ? k->M : k->K, k->trans_a ? k->K : k->M, k->batch, k->stride_a);
    p->d = gemm_layout(k->out_fp32 ? CUDA_R_32F : CUDA_R_16BF, k->N, k->M, k->batch, k->stride_d);
    if (a_scale_inv) gemm_set_scales(p, a_scale_inv, b_scale_inv);
    cublasLtMatmulHeuristicResult_t result;
    if (gemm_candidates(g, p, &result, 1) == 0) {
        fprintf(stderr, "gemm: cuBLASLt has no algorithm for M=%d N=%d K=%d batch=%d trans_a=%d trans_b=%d\n", k->M,
                k->N, k->K, k->batch, k->trans_a, k->trans_b);
        exit(EXIT_FAILURE);
    }
    p->algo = result.algo;
    g->n_plans++;
    return p;
}

// compute-sanitizer's initcheck does not see cuBLASLt's writes on Hopper (its nvjet kernels store D
// through TMA), so every read of a GEMM output would be reported as uninitialized: matmul() tells
// it, through NVTX's memory extension, that D is written whole. No tool attached: a no-op.
#if LLAMA3_NVTX
static void mark_initialized(cudaStream_t s, const void* ptr, size_t bytes) {
    static nvtxDomainHandle_t domain = nvtxDomainCreateA("llama3");
    nvtxMemVirtualRangeDesc_t range = {bytes, ptr};
    nvtxMemMarkInitializedBatch_t batch = {};
    batch.extCompatID = NVTX_EXT_COMPATID_MEM;
    batch.structSize = sizeof(batch);
    batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
    batch.regionDescCount = 1;
    batch.regionDescElementSize = sizeof(range);
    batch.regionDescElements = &range;
    nvtxMemCudaMarkInitialized(domain, s, 0, &batch);
}
#else
static void mark_initialized(cudaStream_t, const void*, size_t) {}
#endif

static void matmul(Gemm* g, cudaStream_t s, void* D, const bf16* A, const bf16* B, int M, int N, int K, bool trans_a,
                   bool trans_b, bool out_fp32, float alpha = 1.0f, float beta = 0.0f, int batch = 1,
                   long long stride_a = 0, long long stride_b = 0, long long stride_d = 0) {
    GemmKey k;
    memset(&k, 0, sizeof(k)); // padding bytes take part in the memcmp lookup
    k.M = M, k.N = N, k.K = K, k.batch = batch, k.trans_a = trans_a, k.trans_b = trans_b, k.out_fp32 = out_fp32;
    k.stride_a = stride_a, k.stride_b = stride_b, k.stride_d = stride_d;
    k.type_a = k.type_b = CUDA_R_16BF;
    k.align_a = pointer_alignment(A), k.align_b = pointer_alignment(B), k.align_d = pointer_alignment(D);
    GemmPlan* p = gemm_plan(g, &k);
    CUBLAS_CHECK(cublasLtMatmul(g->handle, p->op, &alpha, B, p->a, A, p->b, &beta, D, p->d, D, p->d, &p->algo,
                                g->workspace, g->workspace_bytes, s));
    size_t d_elems = (size_t)(batch - 1) * stride_d + (size_t)M * N;
    mark_initialized(s, D, d_elems * (out_fp32 ? sizeof(float) : sizeof(bf16)));
}

// A cuBLASLt handle and a 32 MiB workspace; plans are made on first use of each shape.
#define GEMM_WORKSPACE_BYTES ((size_t)32 << 20)
static void gemm_create(Gemm* g) {
    memset(g, 0, sizeof(*g));
    CUBLAS_CHECK(cublasLtCreate(&g->handle));
    g->workspace_bytes = GEMM_WORKSPACE_BYTES;
    g->workspace = device_alloc(g->workspace_bytes, "cuBLASLt workspace");
}

static void gemm_destroy(Gemm* g) {
    for (int i = 0; i < g->n_plans; i++) {
        CUBLAS_CHECK(cublasLtMatmulDescDestroy(g->plans[i].op));
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(g->plans[i].a));
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(g->plans[i].b));
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(g->plans[i].d));
    }
    g->n_plans = 0;
    CUBLAS_CHECK(cublasLtDestroy(g->handle));
    CUDA_CHECK(cudaFree(g->workspace));
}

// ---- [fp8] tensorwise-scaled FP8 GEMMs ----
// An FP8 GEMM reads its operands as e4m3 (activations, weights: 3 mantissa bits, max 448) or e5m2
// (gradients: 2 mantissa bits, max 57344, the range gradients need), each with one fp32 scale per
// tensor, and accumulates in fp32 (torchao's "tensorwise" recipe). Dynamic scaling: a tensor's
// scale is FP8_MAX / amax(|x|) of the tensor as it is now, so its largest element lands on the
// format's largest finite value; the GEMM multiplies its result by the two inverse scales.
// Hopper's FP8 tensor cores take only cuBLAS's TN layout, our row-major NT: D (M, N) = A (M, K)
// B (N, K)^T, both operands with K contiguous. So each GEMM of the backward needs transposed
// operands, written beside the straight ones by quantize_fp8. The trainer's `--fp8 1` (train_llama3.cu [fp8])
// calls them; dev/fp8_quantize checks the quantisers bit for bit, dev/fp8_gemm the GEMMs and their
// SQNR against bf16.

template <typename F8> struct Fp8Format;
template <> struct Fp8Format<__nv_fp8_e4m3> {
    static constexpr float max = 448.0f;
    static constexpr __nv_fp8_interpretation_t interp = __NV_E4M3;
};
template <> struct Fp8Format<__nv_fp8_e5m2> {
    static constexpr float max = 57344.0f;
    static constexpr __nv_fp8_interpretation_t interp = __NV_E5M2;
};
typedef __nv_fp8_e4m3 e4m3;
typedef __nv_fp8_e5m2 e5m2;

// A tensor's scaling state, in device memory: amax as the bits of a non-negative float (which
// order as unsigned integers, so atomicMax on them is a float max; zeroed by memset before the
// tensor is made) and the inverse scale the GEMM multiplies by (written by the quantize kernel).
// 16-byte aligned, scale_inv first: cuBLASLt refuses (CUBLAS_STATUS_NOT_SUPPORTED) a scale pointer
// at a 4-byte offset (dev/PERF.md, issue 24).
typedef struct alignas(16) {
    float scale_inv;
    unsigned amax_bits;
} Fp8Scale;

// The quantisation scale from amax, as torchao computes it: FP8_MAX / max(amax, 1e-12), in fp32.
template <typename F8> __device__ inline float fp8_scale(const Fp8Scale* s) {
    return Fp8Format<F8>::max / fmaxf(__uint_as_float(s->amax_bits), 1e-12f);
}
// x * scale rounded to nearest even, saturated to the format's largest finite value (NaN stays NaN).
template <typename F8> __device__ inline __nv_fp8_storage_t fp8_encode(float x, float scale) {
    return __nv_cvt_float_to_fp8(x * scale, __NV_SATFINITE, Fp8Format<F8>::interp);
}

// amax(|x|) over n bf16 into s->amax_bits (zeroed before): 8 elements per 16-byte load, one
// atomicMax per block. Memory-bound, 2 bytes per element read: the pass that RMSNorm and SwiGLU
// spare their outputs by computing the amax as they write them (their amax_bits).
#define FP8_THREADS 256
__global__ void amax_kernel(Fp8Scale* s, const bf16* x, size_t n) {
    float m = 0.0f;
    size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n; i += stride) {
        Vec16<bf16> v = *(const Vec16<bf16>*)(x + i);
        for (int e = 0; e < 8; e++) m = fmaxf(m, fabsf(__bfloat162float(v.v[e])));
    }
    block_amax(&s->amax_bits, m);
}
// The shapes the FP8 kernels take: 8-element (16-byte) rows of bf16, 64 x 64 transpose tiles, the
// FP8 GEMM's multiples of 16. Anything else is a caller's bug: it stops the program, named.
static void fp8_require(bool ok, const char* what) {
    if (ok) return;
    fprintf(stderr, "error: %s\n", what);
    exit(EXIT_FAILURE);
}

// n a multiple of 8, x 16-byte aligned; s->amax_bits must be zero (memset) before.
static void fp8_amax(Fp8Scale* s, const bf16* x, size_t n, int sms, cudaStream_t st) {
    fp8_require(n % 8 == 0 && aligned16(x), "fp8_amax: n must be a multiple of 8 and x 16-byte aligned");
    unsigned blocks = ceil_div(n / 8, FP8_THREADS);
    if (blocks > (unsigned)sms * 8) blocks = sms * 8;
    amax_kernel<<<blocks, FP8_THREADS, 0, st>>>(s, x, n);
    LAUNCH_CHECK();
}

// fp8(x[0, 8) * scale), packed: one 16-byte load of bf16, 8 bytes out (both quantisers below).
template <typename F8> __device__ inline uint2 fp8_encode8(const bf16* x, float scale) {
    Vec16<bf16> v = *(const Vec16<bf16>*)x;
    uint2 packed;
    unsigned char* b = (unsigned char*)&packed;
    for (int e = 0; e < 8; e++) b[e] = fp8_encode<F8>(__bfloat162float(v.v[e]), scale);
    return packed;
}

// out = fp8(x * scale) and out_t (cols, rows) = fp8(x^T * scale) for x (rows, cols) row-major, the
// scale from s's amax, in one pass: each 64 x 64 tile is read once as 16-byte rows of x, written
// straight as 8-byte rows of out, and through shared memory as 16-byte rows of out_t (coalesced
// every way). 4 bytes per element (2 read, 1 + 1 written): the backward's GEMMs need both copies of
// every FP8 operand (Hopper's FP8 GEMMs are TN only), and one read of x serves both. rows and cols
// multiples of 64. Block (0, 0)'s thread 0 writes s->scale_inv for the GEMMs.
// In = F8: x is already quantised, and only out_t is written, the bytes transposed (2 bytes per
// element): [data parallel] each rank's transpose of an all-gathered FP8 weight.
#define FP8_TILE 64
template <typename F8, typename In>
__global__ void quantize_fp8_kernel(F8* out, F8* out_t, Fp8Scale* s, const In* x, int rows, int cols) {
    __shared__ unsigned char tile[FP8_TILE][FP8_TILE + 16]; // encoded bytes, [col in tile][row in tile]
    constexpr bool encode = std::is_same<In, bf16>::value;
    float scale = encode ? fp8_scale<F8>(s) : 1.0f;
    if (encode && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) s->scale_inv = 1.0f / scale;
    int r0 = blockIdx.y * FP8_TILE, c0 = blockIdx.x * FP8_TILE;
    for (int k = threadIdx.x; k < FP8_TILE * FP8_TILE / 8; k += blockDim.x) { // 8 elements of one row each
        int r = k / (FP8_TILE / 8), c = (k % (FP8_TILE / 8)) * 8;
        size_t at = (size_t)(r0 + r) * cols + c0 + c;
        uint2 packed;
        if constexpr (encode) {
            packed = fp8_encode8<F8>(x + at, scale);
            *(uint2*)(out + at) = packed;
        } else {
            packed = *(const uint2*)(x + at);
        }
        const unsigned char* b = (const unsigned char*)&packed;
        for (int e = 0; e < 8; e++) tile[c + e][r] = b[e];
    }
    __syncthreads();
    for (int k = threadIdx.x; k < FP8_TILE * FP8_TILE / 16; k += blockDim.x) { // 16 bytes of one out_t row each
        int c = k / (FP8_TILE / 16), r = (k % (FP8_TILE / 16)) * 16;
        *(uint4*)(out_t + (size_t)(c0 + c) * rows + r0 + r) = *(const uint4*)&tile[c][r];
    }
}
template <typename F8, typename In>
static void fp8_tiles(F8* out, F8* out_t, Fp8Scale* s, const In* x, int rows, int cols, cudaStream_t st) {
    fp8_require(rows % FP8_TILE == 0 && cols % FP8_TILE == 0 && aligned16(x) && aligned16(out_t) &&
                    (out == NULL || aligned16(out)),
                "quantize_fp8: rows and cols must be multiples of 64, x, out and out_t 16-byte aligned");
    dim3 grid(cols / FP8_TILE, rows / FP8_TILE);
    quantize_fp8_kernel<F8, In><<<grid, FP8_THREADS, 0, st>>>(out, out_t, s, x, rows, cols);
    LAUNCH_CHECK();
}
template <typename F8>
static void quantize_fp8(F8* out, F8* out_t, Fp8Scale* s, const bf16* x, int rows, int cols, cudaStream_t st) {
    fp8_tiles(out, out_t, s, x, rows, cols, st);
}
// out_t (cols, rows) = x^T for FP8 x (rows, cols), the bytes as they are.
template <typename F8> static void transpose_fp8(F8* out_t, const F8* x, int rows, int cols, cudaStream_t st) {
    fp8_tiles<F8, F8>(NULL, out_t, NULL, x, rows, cols, st);
}

// out[0, n) = fp8(x * scale), the scale from s's amax, without a transpose: [data parallel] each rank
// quantises its own part of a weight (the ranks' amaxes all-reduced first: one scale on every rank)
// and the ranks all-gather the FP8 bytes, half the bytes of the bf16 copy. 8 elements per thread (a
// 16-byte load, an 8-byte store); n a positive multiple of 8, x 16-byte and out 8-byte aligned.
// Thread 0 of block 0 writes s->scale_inv.
template <typename F8> __global__ void quantize_fp8_range_kernel(F8* out, Fp8Scale* s, const bf16* x, size_t n) {
    float scale = fp8_scale<F8>(s);
    if (blockIdx.x == 0 && threadIdx.x == 0) s->scale_inv = 1.0f / scale;
    size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n; i += stride)
        *(uint2*)(out + i) = fp8_encode8<F8>(x + i, scale);
}
template <typename F8>
static void quantize_fp8_range(F8* out, Fp8Scale* s, const bf16* x, size_t n, int sms, cudaStream_t st) {
    fp8_require(n % 8 == 0 && n > 0 && aligned16(x) && (uintptr_t)out % 8 == 0,
                "quantize_fp8_range: n must be a positive multiple of 8, x 16-byte and out 8-byte aligned");
    unsigned blocks = (unsigned)std::min<size_t>(ceil_div(n / 8, (size_t)FP8_THREADS), (size_t)sms * 8);
    quantize_fp8_range_kernel<F8><<<blocks, FP8_THREADS, 0, st>>>(out, s, x, n);
    LAUNCH_CHECK();
}

// D (M, N) = a_scale_inv * b_scale_inv * A (M, K) B (N, K)^T + beta * D, A and B FP8 (types ta, tb:
// not both e5m2) row-major with K contiguous, the inverse scales fp32 in device memory, D bf16 or
// (out_fp32) fp32: a weight gradient accumulated over micro-steps adds onto the fp32 sum with
// beta 1, as the bf16 GEMMs do. fast_accum: cuBLASLt's faster accumulation (torchao uses it for
// the forward only). M, N, K multiples of 16.
static void matmul_fp8(Gemm* g, cudaStream_t s, void* D, const void* A, cudaDataType ta, const float* a_scale_inv,
                       const void* B, cudaDataType tb, const float* b_scale_inv, int M, int N, int K, bool fast_accum,
                       bool out_fp32 = false, float beta = 0.0f) {
    fp8_require(M % 16 == 0 && N % 16 == 0 && K % 16 == 0 && !(ta == CUDA_R_8F_E5M2 && tb == CUDA_R_8F_E5M2),
                "matmul_fp8: M, N, K must be multiples of 16, and A and B not both e5m2");
    fp8_require((uintptr_t)a_scale_inv % 16 == 0 && (uintptr_t)b_scale_inv % 16 == 0,
                "matmul_fp8: the inverse scales must be 16-byte aligned (cuBLASLt refuses others)");
    GemmKey k;
    memset(&k, 0, sizeof(k));
    k.M = M, k.N = N, k.K = K, k.batch = 1, k.trans_a = false, k.trans_b = true, k.out_fp32 = out_fp32;
    k.type_a = ta, k.type_b = tb, k.fast_accum = fast_accum;
    k.align_a = pointer_alignment(A), k.align_b = pointer_alignment(B), k.align_d = pointer_alignment(D);
    GemmPlan* p = gemm_plan(g, &k, a_scale_inv, b_scale_inv);
    gemm_set_scales(p, a_scale_inv, b_scale_inv);
    const float one = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(g->handle, p->op, &one, B, p->a, A, p->b, &beta, D, p->d, D, p->d, &p->algo,
                                g->workspace, g->workspace_bytes, s));
    mark_initialized(s, D, (size_t)M * N * (out_fp32 ? sizeof(float) : sizeof(bf16)));
}
