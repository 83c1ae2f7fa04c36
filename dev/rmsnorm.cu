// dev/rmsnorm.cu: RMSNorm forward and backward at the trainer's width C = 2048 (LLaMA 3.2 1B).
//   forward:  h = x, or with the residual add h = resid_out = resid_in + branch (branch bf16);
//             rstd = 1/sqrt(mean(h^2) + 1e-5), normed = bf16(w * (h * rstd))
//   backward: n = x * rstd, dn = dy * w, dx = rstd * (dn - n * mean(dn * n)), written or added into
//             the fp32 residual gradient dresid (and its bf16 copy); dw (+)= sum over rows of dy * n
// Shapes: x, resid, dresid (N, C) fp32; branch, normed, dy (N, C) bf16; w, dw (C); rstd (N).
//
// Build: make dev/rmsnorm
// Run:   ./dev/rmsnorm          validate every version, then time them (N = 256 and 16384 tokens)
//        ./dev/rmsnorm K        only version K of each family that has one
//        ./dev/rmsnorm --check  validate only (what `make test` runs)
// Every forward version is checked and timed twice: plain (branch = NULL, the first norm) and with
// the residual add (every norm after it).
// Forward versions:
//   1 = the seed's composite as PyTorch autograd ran it: pow, mean, add eps, rsqrt, mul (x * rstd),
//       mul (w * that, rounded to bf16): six kernels, the intermediates in global memory, and the
//       residual add as a seventh (rmsnorm_forward_ops in kernels.cuh, the trainer's
//       --fused_rmsnorm 0)
//   2 = the first fused kernel (below): one warp per row, 8 rows per block, the row walked in
//       float4 steps and read twice
//   3 = the trainer's rmsnorm_forward in kernels.cuh: one block per row, the row in registers;
//       validated also with [fp8]'s amax (the largest |normed| onto an FP8 scale, exact), timed
//       without it (--fp8 0)
// Backward versions:
//   1 = the composite's autograd chain in reverse: mul, mul, rsqrt, mean and pow backward (dw, the
//       gradient of the broadcast weight, summed over rows by atomicAdd into a zero-filled buffer as
//       the seed's BinaryBwd did; d rstd by a row reduction), then x's two paths summed into dresid;
//       n = x * rstd recomputed first (rmsnorm_backward_ops, the trainer's --fused_rmsnorm 0)
//   2 = the first fused kernel (below): 256-thread blocks, two per SM, each walking its rows, the
//       old dresid read after the row's block sum; dw by a (32, 8) scalar column sum
//   3 = the trainer's rmsnorm_backward in kernels.cuh: blocks of C/8 threads, four per SM, all of a
//       row's loads before its block sum; dw by a float4 column sum; validated also with [fp8]'s
//       amax of dresid_bf16, exact
#include "common.h"

static const float EPS = 1e-5f;

// ---- CPU reference (fp64 sums) ----

// h = x (+ branch: the same fp32 add as the kernel), rstd, and normed rounded to bf16 as stored.
static void forward_ref(std::vector<float>& h, std::vector<float>& rstd, std::vector<float>& normed,
                        const std::vector<float>& x, const std::vector<float>* branch, const std::vector<float>& w,
                        int N, int C) {
    h.resize((size_t)N * C), rstd.resize(N), normed.resize((size_t)N * C);
    for (int r = 0; r < N; r++) {
        size_t row = (size_t)r * C;
        double sum_sq = 0.0;
        for (int c = 0; c < C; c++) {
            h[row + c] = branch ? x[row + c] + (*branch)[row + c] : x[row + c];
            sum_sq += (double)h[row + c] * h[row + c];
        }
        double rs = 1.0 / sqrt(sum_sq / C + EPS);
        rstd[r] = (float)rs;
        for (int c = 0; c < C; c++) normed[row + c] = bf16_round((float)(w[c] * (h[row + c] * rs)));
    }
}

// dx: the gradient of x alone; dw_sum[c]: sum over rows of dy * n.
static void backward_ref(std::vector<double>& dx, std::vector<double>& dw_sum, const std::vector<float>& dy,
                         const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& rstd,
                         int N, int C) {
    dx.assign((size_t)N * C, 0.0), dw_sum.assign(C, 0.0);
    for (int r = 0; r < N; r++) {
        size_t row = (size_t)r * C;
        double rs = rstd[r], dot = 0.0;
        for (int c = 0; c < C; c++) {
            double n = x[row + c] * rs;
            dot += dy[row + c] * w[c] * n;
            dw_sum[c] += dy[row + c] * n;
        }
        double mean_dot = dot / C;
        for (int c = 0; c < C; c++) dx[row + c] = rs * (dy[row + c] * w[c] - x[row + c] * rs * mean_dot);
    }
}

// ---- version 2: the first fused kernels, kept for comparison ----

// One warp per row, 8 rows per block: N = 256 gives 32 blocks, so 32 of the H200's 132 SMs work.
// Each lane walks the row in float4 steps of 128 columns; with the residual add, each step's store
// to resid_out keeps the next step's load from starting (they may alias), so the steps are
// separate round trips; then the row is read a second time for the output.
template <bool ADD_BRANCH>
__global__ void rmsnorm_forward_v2_kernel(float* resid_out, bf16* normed, float* rstd_out, const float* resid_in,
                                          const bf16* branch, const float* weight, int N, int C, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    size_t base = (size_t)row * C;
    float sum_sq = 0.0f;
    for (int c = lane * 4; c < C; c += 128) {
        float4 x = *reinterpret_cast<const float4*>(resid_in + base + c);
        if (ADD_BRANCH) {
            float4 b = load_bf16x4(branch + base + c);
            x = make_float4(x.x + b.x, x.y + b.y, x.z + b.z, x.w + b.w);
            *reinterpret_cast<float4*>(resid_out + base + c) = x;
        }
        sum_sq += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
    }
    float rstd = rsqrtf(warp_sum(sum_sq) / C + eps);
    const float* h = ADD_BRANCH ? resid_out : resid_in; // this thread's own writes, re-read
    for (int c = lane * 4; c < C; c += 128) {
        float4 x = *reinterpret_cast<const float4*>(h + base + c);
        float4 w = *reinterpret_cast<const float4*>(weight + c);
        store_bf16x4(normed + base + c, make_float4(w.x * (x.x * rstd), w.y * (x.y * rstd), w.z * (x.z * rstd),
                                                    w.w * (x.w * rstd)));
    }
    if (lane == 0) rstd_out[row] = rstd;
}
static void rmsnorm_forward_v2(float* resid_out, bf16* normed, float* rstd, const float* resid_in, const bf16* branch,
                               const float* weight, int N, int C, float eps) {
    const int warps = 8;
    if (branch)
        rmsnorm_forward_v2_kernel<true><<<ceil_div(N, warps), warps * 32>>>(resid_out, normed, rstd, resid_in, branch,
                                                                            weight, N, C, eps);
    else
        rmsnorm_forward_v2_kernel<false><<<ceil_div(N, warps), warps * 32>>>(resid_out, normed, rstd, resid_in,
                                                                             branch, weight, N, C, eps);
    LAUNCH_CHECK();
}

// The whole 256-thread block on one row at a time, RMS_BWD_VEC_V2 float4 column groups per thread
// (C up to 4096; at 2048 half of them idle), a range of rows per block and about two blocks per
// SM (16 warps). A row's old dresid is read only after its block sum: two round trips per row.
#define RMS_BWD_THREADS_V2 256
#define RMS_BWD_VEC_V2 4
__global__ void __launch_bounds__(RMS_BWD_THREADS_V2)
    rmsnorm_backward_v2_kernel(float* dresid, bf16* dresid_bf16, float* dw_partial, const bf16* dnormed,
                               const float* x, const float* weight, const float* rstd, int N, int C,
                               int rows_per_block, bool accumulate) {
    float4 w[RMS_BWD_VEC_V2], dw[RMS_BWD_VEC_V2];
#pragma unroll
    for (int k = 0; k < RMS_BWD_VEC_V2; k++) {
        int c = (threadIdx.x + k * RMS_BWD_THREADS_V2) * 4;
        w[k] = c < C ? *reinterpret_cast<const float4*>(weight + c) : make_float4(0, 0, 0, 0);
        dw[k] = make_float4(0, 0, 0, 0);
    }
    int row_end = min(N, (blockIdx.x + 1) * rows_per_block);
    for (int row = blockIdx.x * rows_per_block; row < row_end; row++) {
        size_t base = (size_t)row * C;
        float r = rstd[row], dot = 0.0f;
        float4 dn[RMS_BWD_VEC_V2], n[RMS_BWD_VEC_V2];
#pragma unroll
        for (int k = 0; k < RMS_BWD_VEC_V2; k++) {
            int c = (threadIdx.x + k * RMS_BWD_THREADS_V2) * 4;
            if (c >= C) continue;
            float4 dy = load_bf16x4(dnormed + base + c), xv = *reinterpret_cast<const float4*>(x + base + c);
            n[k] = make_float4(xv.x * r, xv.y * r, xv.z * r, xv.w * r);
            dn[k] = make_float4(dy.x * w[k].x, dy.y * w[k].y, dy.z * w[k].z, dy.w * w[k].w);
            dot += dn[k].x * n[k].x + dn[k].y * n[k].y + dn[k].z * n[k].z + dn[k].w * n[k].w;
            dw[k].x += dy.x * n[k].x, dw[k].y += dy.y * n[k].y, dw[k].z += dy.z * n[k].z, dw[k].w += dy.w * n[k].w;
        }
        float mean_dot = block_sum(dot) / C;
#pragma unroll
        for (int k = 0; k < RMS_BWD_VEC_V2; k++) {
            int c = (threadIdx.x + k * RMS_BWD_THREADS_V2) * 4;
            if (c >= C) continue;
            float4 d = make_float4(r * (dn[k].x - n[k].x * mean_dot), r * (dn[k].y - n[k].y * mean_dot),
                                   r * (dn[k].z - n[k].z * mean_dot), r * (dn[k].w - n[k].w * mean_dot));
            if (accumulate) {
                float4 old = *reinterpret_cast<const float4*>(dresid + base + c);
                d = make_float4(old.x + d.x, old.y + d.y, old.z + d.z, old.w + d.w);
            }
            *reinterpret_cast<float4*>(dresid + base + c) = d;
            store_bf16x4(dresid_bf16 + base + c, d);
        }
    }
#pragma unroll
    for (int k = 0; k < RMS_BWD_VEC_V2; k++) {
        int c = (threadIdx.x + k * RMS_BWD_THREADS_V2) * 4;
        if (c < C) *reinterpret_cast<float4*>(dw_partial + (size_t)blockIdx.x * C + c) = dw[k];
    }
}

// out[c] (+)= sum over rows of partial[row, c], rows summed in a fixed order. Block (32, 8): 32
// columns, 8 row slices reduced through shared memory; 4-byte loads.
__global__ void column_sum_v2_kernel(float* out, const float* partial, int rows, int C, bool accumulate) {
    __shared__ float slice[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float sum = 0.0f;
    if (c < C)
        for (int r = threadIdx.y; r < rows; r += 8) sum += partial[(size_t)r * C + c];
    slice[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int y = 1; y < 8; y++) sum += slice[y][threadIdx.x];
        out[c] = accumulate ? out[c] + sum : sum;
    }
}

// Rows per block so that about two blocks run per SM; dw_partial must hold rms_bwd_blocks_v2 x C.
static int rms_bwd_blocks_v2(int N, int sms) {
    int rows = (N + 2 * sms - 1) / (2 * sms);
    return (N + rows - 1) / rows;
}
static void rmsnorm_backward_v2(float* dresid, bf16* dresid_bf16, float* dweight, float* dw_partial,
                                const bf16* dnormed, const float* x, const float* weight, const float* rstd, int N,
                                int C, bool accumulate_dx, bool accumulate_dw, int sms) {
    int blocks = rms_bwd_blocks_v2(N, sms), rows = (N + blocks - 1) / blocks;
    rmsnorm_backward_v2_kernel<<<blocks, RMS_BWD_THREADS_V2>>>(dresid, dresid_bf16, dw_partial, dnormed, x, weight,
                                                               rstd, N, C, rows, accumulate_dx);
    LAUNCH_CHECK();
    column_sum_v2_kernel<<<ceil_div(C, 32), dim3(32, 8)>>>(dweight, dw_partial, blocks, C, accumulate_dw);
    LAUNCH_CHECK();
}

// ---- buffers and timing rows ----

// Copies of a call's inputs and outputs, cycled through by the timing loop, so that together they
// exceed the H200's 50 MB L2 four times over and every call reads from DRAM, as in training.
static int rotation_copies(double bytes_per_copy) { return std::max(1, (int)ceil(200e6 / bytes_per_copy)); }

template <typename T> static T* upload_copies(const std::vector<T>& v, int copies) {
    T* p = dev_alloc<T>(v.size() * copies);
    for (int k = 0; k < copies; k++)
        CUDA_CHECK(cudaMemcpy(p + v.size() * k, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

// One timing result, printed in the table after every check has run.
typedef struct {
    const char* kernel;
    const char* version;
    char size[32];
    double ms, bytes;
    bool ok;
} Row;
static std::vector<Row> rows;

static void add_row(const char* kernel, const char* version, int N, int C, double ms, double bytes, bool ok) {
    Row r = {kernel, version, "", ms, bytes, ok};
    snprintf(r.size, sizeof(r.size), "N=%d C=%d", N, C);
    rows.push_back(r);
}

// ---- forward ----

static const char* FWD_NAMES[] = {"", "1 composite (6 kernels, + 1 for the add)", "2 fused, warp per row",
                                  "3 fused, block per row (trainer)"};

// x, branch and the outputs in `copies` copies (see rotation_copies); w and the composite's
// scratch once.
typedef struct {
    int N, C, copies;
    float *x, *resid_out, *rstd, *w;
    bf16 *branch, *normed;
    unsigned* amax_bits; // version 3's [fp8] amax (a float's bits)
    RmsScratch scratch;
} FwdBuffers;

static RmsScratch scratch_alloc(int N, int C) {
    RmsScratch s;
    for (float*& p : s.nc) p = dev_alloc<float>((size_t)N * C);
    for (float*& p : s.row) p = dev_alloc<float>(N);
    return s;
}
static void scratch_free(RmsScratch* s) {
    for (float* p : s->nc) CUDA_CHECK(cudaFree(p));
    for (float* p : s->row) CUDA_CHECK(cudaFree(p));
}

static FwdBuffers fwd_alloc(const std::vector<float>& x, const std::vector<bf16>& branch, const std::vector<float>& w,
                            int N, int C, int copies) {
    size_t NC = (size_t)N * C;
    FwdBuffers b = {N, C, copies};
    b.x = upload_copies(x, copies), b.branch = upload_copies(branch, copies), b.w = dev_upload(w);
    b.resid_out = dev_alloc<float>(NC * copies), b.normed = dev_alloc<bf16>(NC * copies);
    b.rstd = dev_alloc<float>((size_t)N * copies);
    b.amax_bits = dev_alloc<unsigned>(1);
    b.scratch = scratch_alloc(N, C);
    return b;
}
static void fwd_free(FwdBuffers* b) {
    void* p[] = {b->x, b->resid_out, b->rstd, b->w, b->branch, b->normed, b->amax_bits};
    for (void* q : p) CUDA_CHECK(cudaFree(q));
    scratch_free(&b->scratch);
}

// Forward version `version` on copy k of the buffers, with the residual add if `add` (version 3:
// and the amax if `amax`).
static void forward(int version, const FwdBuffers* b, int k, bool add, bool amax = false) {
    size_t off = (size_t)k * b->N * b->C;
    float *rstd = b->rstd + (size_t)k * b->N, *resid_out = b->resid_out + off;
    const bf16* branch = add ? b->branch + off : NULL;
    bf16* normed = b->normed + off;
    if (version == 1)
        rmsnorm_forward_ops(resid_out, normed, rstd, b->x + off, branch, b->w, b->N, b->C, EPS, &b->scratch, 0);
    else if (version == 2) rmsnorm_forward_v2(resid_out, normed, rstd, b->x + off, branch, b->w, b->N, b->C, EPS);
    else rmsnorm_forward(resid_out, normed, rstd, b->x + off, branch, b->w, b->N, b->C, EPS, 0, amax ? b->amax_bits : NULL);
}

// Fewest bytes each version moves; w (C floats) is read once, shared by every row.
static double forward_bytes(int version, bool add, int N, int C) {
    double NC = (double)N * C;
    if (version == 1) // per element: pow 8, mean 4, mul 8, mul 6 (+ the add 10); per row: mean 4, add 8,
                      // rsqrt 8, mul 4
        return (add ? 36 : 26) * NC + 24.0 * N + 4.0 * C;
    // x read, normed and rstd written (+ branch read, resid_out written)
    return (add ? 12 : 6) * NC + 4.0 * N + 4.0 * C;
}

// Tolerances: normed is bf16 and is compared with the reference rounded the same way; a value
// within fp32 error of a rounding tie may land on the neighbour, and 1 bf16 ulp is 2^-8..2^-7
// relative, so rtol 2^-7 (+ atol 1e-6 for values near zero). rstd: fp32 sum of C squares then
// rsqrtf (2 ulp): rtol 1e-5. resid_out: the same single fp32 add as the reference: rtol 1e-6.
static bool check_forward(int version, bool add, const FwdBuffers* b, const std::vector<float>& h,
                          const std::vector<float>& rstd, const std::vector<float>& normed) {
    int N = b->N, C = b->C;
    size_t NC = (size_t)N * C;
    dev_poison(b->normed, NC), dev_poison(b->rstd, N), dev_poison(b->resid_out, NC);
    CUDA_CHECK(cudaMemset(b->amax_bits, 0, sizeof(unsigned)));
    forward(version, b, 0, add, true);
    char name[80], what[40];
    snprintf(what, sizeof(what), "%sN=%d C=%d", add ? "add, " : "", N, C);
    snprintf(name, sizeof(name), "fwd v%d normed (%s)", version, what);
    std::vector<float> got = from_bf16(dev_download(b->normed, NC));
    bool ok = dev_check(name, got, normed, 1e-6f, 1.0f / 128);
    snprintf(name, sizeof(name), "fwd v%d amax (%s)", version, what);
    if (version == 3) ok &= dev_check_amax(name, b->amax_bits, got);
    snprintf(name, sizeof(name), "fwd v%d rstd (%s)", version, what);
    ok &= dev_check(name, dev_download(b->rstd, N), rstd, 0.0f, 1e-5f);
    if (add) {
        snprintf(name, sizeof(name), "fwd v%d resid_out (%s)", version, what);
        ok &= dev_check(name, dev_download(b->resid_out, NC), h, 0.0f, 1e-6f);
    }
    return ok;
}

static void forward_case(const DevArgs& a, int N, int C, bool timed) {
    size_t NC = (size_t)N * C;
    std::vector<float> x = random_normal(NC), w = random_uniform(C, 0.5f, 1.5f);
    std::vector<bf16> branch = to_bf16(random_normal(NC));
    std::vector<float> branch_f = from_bf16(branch), h, rstd, normed, h_add, rstd_add, normed_add;
    forward_ref(h, rstd, normed, x, NULL, w, N, C);
    forward_ref(h_add, rstd_add, normed_add, x, &branch_f, w, N, C);
    FwdBuffers b = fwd_alloc(x, branch, w, N, C, timed ? rotation_copies(forward_bytes(3, true, N, C)) : 1);
    for (bool add : {false, true})
        for (int v = 1; v <= 3; v++) {
            if (!dev_selected(a, v)) continue;
            bool ok = add ? check_forward(v, add, &b, h_add, rstd_add, normed_add)
                          : check_forward(v, add, &b, h, rstd, normed);
            if (!timed) continue;
            int k = 0;
            double ms = median_ms([&] { forward(v, &b, k++ % b.copies, add); });
            add_row(add ? "residual add + rmsnorm_forward" : "rmsnorm_forward", FWD_NAMES[v], N, C, ms,
                    forward_bytes(v, add, N, C), ok);
        }
    fwd_free(&b);
}

// ---- backward ----

static const char* BWD_NAMES[] = {"", "1 composite (autograd chain)", "2 fused, row walk + column_sum",
                                  "3 fused, row in registers + column_sum (trainer)"};

// Blocks of each fused version, one dw_partial row each.
static int partial_rows(int version, int N, int sms) {
    return version == 2 ? rms_bwd_blocks_v2(N, sms) : rms_bwd_blocks(N, sms);
}

// dy, x, rstd, dresid and dresid_bf16 in `copies` copies; w, dw, dw_partial (as many rows as the
// fused version with the most blocks needs) and the composite's scratch once.
typedef struct {
    int N, C, copies, sms;
    bf16 *dy, *dresid_bf16;
    float *x, *rstd, *dresid;
    float *w, *dw, *dw_partial;
    size_t partial_size;
    unsigned* amax_bits; // version 3's [fp8] amax
    RmsScratch scratch;
} BwdBuffers;

static BwdBuffers bwd_alloc(const std::vector<bf16>& dy, const std::vector<float>& x,
                            const std::vector<float>& rstd, const std::vector<float>& dresid,
                            const std::vector<float>& w, int N, int C, int copies, int sms) {
    size_t NC = (size_t)N * C;
    BwdBuffers b = {N, C, copies, sms};
    b.dy = upload_copies(dy, copies), b.x = upload_copies(x, copies);
    b.rstd = upload_copies(rstd, copies), b.dresid = upload_copies(dresid, copies);
    b.dresid_bf16 = dev_alloc<bf16>(NC * copies);
    b.w = dev_upload(w), b.dw = dev_alloc<float>(C);
    b.partial_size = (size_t)std::max(partial_rows(2, N, sms), partial_rows(3, N, sms)) * C;
    b.dw_partial = dev_alloc<float>(b.partial_size);
    b.amax_bits = dev_alloc<unsigned>(1);
    b.scratch = scratch_alloc(N, C);
    return b;
}
static void bwd_free(BwdBuffers* b) {
    void* p[] = {b->dy, b->dresid_bf16, b->x, b->rstd, b->dresid, b->w, b->dw, b->dw_partial, b->amax_bits};
    for (void* q : p) CUDA_CHECK(cudaFree(q));
    scratch_free(&b->scratch);
}

// Backward version `version` on copy k of the buffers (version 3: with the amax if `amax`).
static void backward(int version, const BwdBuffers* b, int k, bool accumulate_dx, bool accumulate_dw,
                     bool amax = false) {
    size_t off = (size_t)k * b->N * b->C;
    if (version == 1)
        rmsnorm_backward_ops(b->dresid + off, b->dresid_bf16 + off, b->dw, b->dy + off, b->x + off, b->w,
                             b->rstd + (size_t)k * b->N, b->N, b->C, accumulate_dx, accumulate_dw, &b->scratch, 0);
    else if (version == 2)
        rmsnorm_backward_v2(b->dresid + off, b->dresid_bf16 + off, b->dw, b->dw_partial, b->dy + off, b->x + off,
                            b->w, b->rstd + (size_t)k * b->N, b->N, b->C, accumulate_dx, accumulate_dw, b->sms);
    else rmsnorm_backward(b->dresid + off, b->dresid_bf16 + off, b->dw, b->dw_partial, b->dy + off, b->x + off, b->w,
                          b->rstd + (size_t)k * b->N, b->N, b->C, accumulate_dx, accumulate_dw, b->sms, 0,
                          amax ? b->amax_bits : NULL);
}

// Fewest bytes each version moves as timed (dx added into dresid, dw written).
static double backward_bytes(int version, int N, int C, int sms) {
    double NC = (double)N * C;
    if (version == 1) // per element: n recomputed 8, mul 10, mul 12, mean 4, pow 12, sum into dresid 18;
                      // per row: n 4, mul 8, rsqrt 12, mean 4; per column: memset 4, mul 8
        return 64 * NC + 28.0 * N + 12.0 * C;
    // dy 2, x 4, old dresid 4 read, dresid 4 and its bf16 copy 2 written; rstd; w read and dw written;
    // the partials written and read back once
    return 16 * NC + 4.0 * N + 8.0 * C + 8.0 * partial_rows(version, N, sms) * C;
}

// Reference data of one backward case: the random inputs and the fp64 dx and dw sums.
typedef struct {
    std::vector<float> dresid0, dw0;
    std::vector<double> dx, dw_sum;
} BwdRef;

// Tolerances: dresid (fp32): the reference is fp64; the kernel sums C products in fp32 and
// cancels dn against n * mean: rtol 1e-4 + atol 1e-5 (values are O(1)). dresid_bf16 must be
// exactly dresid rounded. dw: an fp32 sum over N rows of O(1) terms in any order (atomics in
// version 1) drifts by up to ~eps * sqrt(N) * |partial sum| ~ 1e-7 * N: atol 1e-6 * N, rtol 1e-4.
static bool check_backward(int version, const BwdBuffers* b, const BwdRef& ref, bool accumulate_dx,
                           bool accumulate_dw) {
    int N = b->N, C = b->C;
    size_t NC = (size_t)N * C;
    if (accumulate_dx) CUDA_CHECK(cudaMemcpy(b->dresid, ref.dresid0.data(), NC * 4, cudaMemcpyHostToDevice));
    else dev_poison(b->dresid, NC);
    if (accumulate_dw) CUDA_CHECK(cudaMemcpy(b->dw, ref.dw0.data(), C * 4, cudaMemcpyHostToDevice));
    else dev_poison(b->dw, C);
    dev_poison(b->dresid_bf16, NC), dev_poison(b->dw_partial, b->partial_size);
    CUDA_CHECK(cudaMemset(b->amax_bits, 0, sizeof(unsigned)));
    backward(version, b, 0, accumulate_dx, accumulate_dw, true);

    std::vector<float> dresid_ref(NC), dw_ref(C), dresid = dev_download(b->dresid, NC), dresid_rounded(NC);
    for (size_t i = 0; i < NC; i++) dresid_ref[i] = (float)((accumulate_dx ? ref.dresid0[i] : 0.0) + ref.dx[i]);
    for (int c = 0; c < C; c++) dw_ref[c] = (float)((accumulate_dw ? ref.dw0[c] : 0.0) + ref.dw_sum[c]);
    for (size_t i = 0; i < NC; i++) dresid_rounded[i] = bf16_round(dresid[i]);
    char name[80], what[48];
    snprintf(what, sizeof(what), "acc_dx=%d acc_dw=%d N=%d C=%d", accumulate_dx, accumulate_dw, N, C);
    snprintf(name, sizeof(name), "bwd v%d dresid (%s)", version, what);
    bool ok = dev_check(name, dresid, dresid_ref, 1e-5f, 1e-4f);
    snprintf(name, sizeof(name), "bwd v%d dresid_bf16 (%s)", version, what);
    std::vector<float> got_bf16 = from_bf16(dev_download(b->dresid_bf16, NC));
    ok &= dev_check(name, got_bf16, dresid_rounded, 0.0f, 0.0f);
    snprintf(name, sizeof(name), "bwd v%d amax (%s)", version, what);
    if (version == 3) ok &= dev_check_amax(name, b->amax_bits, got_bf16);
    snprintf(name, sizeof(name), "bwd v%d dw (%s)", version, what);
    ok &= dev_check(name, dev_download(b->dw, C), dw_ref, 1e-6f * N, 1e-4f);
    return ok;
}

static void backward_case(const DevArgs& a, int N, int C, bool timed, int sms) {
    size_t NC = (size_t)N * C;
    std::vector<bf16> dy = to_bf16(random_normal(NC));
    std::vector<float> x = random_normal(NC), w = random_uniform(C, 0.5f, 1.5f), rstd(N), h, normed;
    forward_ref(h, rstd, normed, x, NULL, w, N, C);
    BwdRef ref = {random_uniform(NC, -1.0f, 1.0f), random_uniform(C, -1.0f, 1.0f)};
    backward_ref(ref.dx, ref.dw_sum, from_bf16(dy), x, w, rstd, N, C);
    int copies = timed ? rotation_copies(16.0 * NC + 4.0 * N) : 1;
    BwdBuffers b = bwd_alloc(dy, x, rstd, ref.dresid0, w, N, C, copies, sms);
    for (int v = 1; v <= 3; v++) {
        if (!dev_selected(a, v)) continue;
        bool ok = check_backward(v, &b, ref, true, false);
        ok &= check_backward(v, &b, ref, false, true);
        if (!timed) continue;
        int k = 0;
        double ms = median_ms([&] { backward(v, &b, k++ % b.copies, true, false); });
        add_row("rmsnorm_backward", BWD_NAMES[v], N, C, ms, backward_bytes(v, N, C, sms), ok);
    }
    bwd_free(&b);
}

int main(int argc, char** argv) {
    DevArgs a = dev_args(argc, argv, 3);
    int sms;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    // N, C, timed: a small odd case (C = 264: a block's second float4 column group mostly idle;
    // N = 1001: two or three rows per backward block, the last block short), the seed's 256
    // tokens (one row per backward block), and 16384 tokens (B*T of a large batch).
    const int cases[][3] = {{1001, 264, 0}, {256, 2048, 1}, {16384, 2048, 1}};
    for (const auto& c : cases) {
        forward_case(a, c[0], c[1], c[2] && !a.check_only);
        backward_case(a, c[0], c[1], c[2] && !a.check_only, sms);
    }
    if (!a.check_only) {
        copy_ceiling_gbs();
        print_header();
        for (const Row& r : rows) print_row(r.kernel, r.version, r.size, r.ms, r.bytes, 0.0, r.ok);
    }
    return dev_finish();
}
