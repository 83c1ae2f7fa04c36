// dev/fp8_gemm.cu: the block linears' GEMMs in FP8 (kernels.cuh matmul_fp8: cuBLASLt, tensorwise
// scales, fp32 accumulation, bf16 out) against the trainer's bf16 matmul() on the same shapes. For
// a linear y = x W^T, x (N, in), W (out, in), N = B*T tokens, the three GEMMs in the only layout
// Hopper's FP8 tensor cores take (row-major NT, K contiguous in both operands):
//   forward      y  (N, out) = x8 W8^T        e4m3 x e4m3
//   input grad   dx (N, in)  = dy8 (W^T)8^T   e5m2 x e4m3   (W^T: a transposed copy of the weight)
//   weight grad  dW (out, in) = (dy^T)8 (x^T)8^T  e5m2 x e4m3 (transposed copies of dy and x)
// for qkv (3072 x 2048), attn_out (2048 x 2048), gate_up (16384 x 2048) and down (2048 x 8192).
//
// build: make dev/fp8_gemm
// run:   ./dev/fp8_gemm          validate, the SQNR table, then time bf16 against FP8
//        ./dev/fp8_gemm 2        validate, then time version 2 only
//        ./dev/fp8_gemm --check  validate and the SQNR table only (what `make test` runs)
//        ./dev/fp8_gemm --small  validate the small model's linears only (what make sanitize runs)
//
// versions (the rows of one shape): 1 bf16 matmul() (the trainer's), 2 FP8 (quantized operands
// made by kernels.cuh quantize_fp8, not timed here: dev/fp8_quantize
// times them), 3 FP8 with cuBLASLt's fast accumulation (torchao's choice for the forward).
// Checks: each FP8 GEMM against an fp64 dot product of its decoded FP8 operands (this file's codec
// in dev/common.h) times the two inverse scales: rtol 1e-2 (bf16 output 2^-9, fp32 accumulation),
// atol 1e-2 sqrt(K) rms(a) rms(b) for sums near 0; the weight gradient also as micro-steps sum it,
// into fp32 with beta 1 onto an earlier sum. SQNR of the whole FP8 path (bf16 inputs
// quantized, FP8 GEMM) against the bf16 GEMM of the same inputs: at least 20 dB (torchao's bar).
// Timing: each row from idle (median of 30 after warm-up) and, for the B=16,T=1024 shapes, after
// 3 s back to back: the rate at the clock the 700 W cap leaves (dev/gemm version 2's note).
#include <functional>

#include "common.h"
#include "../llama3.h"

// The block linears: model_linears (dev/common.h) but the lm_head, which --fp8 1 leaves in bf16.
static std::vector<Linear> block_linears(const Llama3Config& c) {
    std::vector<Linear> ls = model_linears(c);
    ls.pop_back();
    return ls;
}

enum { FORWARD, INPUT_GRAD, WEIGHT_GRAD, NUM_KINDS };
static const char* const KIND_NAMES[NUM_KINDS] = {"forward", "input grad", "weight grad"};

typedef struct {
    bf16 *x, *w, *dy;         // bf16 inputs: x (N, in), W (out, in), dy (N, out)
    e4m3 *x8, *xt8, *w8, *wt8; // FP8 copies: x, x^T (in, N), W, W^T (in, out)
    e5m2 *dy8, *dyt8;          // dy, dy^T (out, N)
    Fp8Scale* scales;          // x, W, dy
    bf16 *y, *dx, *dw;         // outputs
} LinearBuffers;

static LinearBuffers linear_alloc(size_t N, Linear l) {
    size_t W = (size_t)l.out * l.in;
    LinearBuffers b = {dev_alloc<bf16>(N * l.in),  dev_alloc<bf16>(W),       dev_alloc<bf16>(N * l.out),
                       dev_alloc<e4m3>(N * l.in),  dev_alloc<e4m3>(N * l.in), dev_alloc<e4m3>(W),
                       dev_alloc<e4m3>(W),         dev_alloc<e5m2>(N * l.out), dev_alloc<e5m2>(N * l.out),
                       dev_alloc<Fp8Scale>(3),     dev_alloc<bf16>(N * l.out), dev_alloc<bf16>(N * l.in),
                       dev_alloc<bf16>(W)};
    return b;
}
static void linear_free(LinearBuffers& b) {
    void* all[] = {b.x, b.w, b.dy, b.x8, b.xt8, b.w8, b.wt8, b.dy8, b.dyt8, b.scales, b.y, b.dx, b.dw};
    for (void* p : all) CUDA_CHECK(cudaFree(p));
}

// The FP8 operands of all three GEMMs from the bf16 inputs, as a step would make them.
static void quantize_all(LinearBuffers& b, int N, Linear l, int sms) {
    CUDA_CHECK(cudaMemset(b.scales, 0, 3 * sizeof(Fp8Scale)));
    Fp8Scale *sx = b.scales, *sw = b.scales + 1, *sdy = b.scales + 2;
    fp8_amax(sx, b.x, (size_t)N * l.in, sms, 0);
    fp8_amax(sw, b.w, (size_t)l.out * l.in, sms, 0);
    fp8_amax(sdy, b.dy, (size_t)N * l.out, sms, 0);
    quantize_fp8(b.x8, b.xt8, sx, b.x, N, l.in, 0);
    quantize_fp8(b.w8, b.wt8, sw, b.w, l.out, l.in, 0);
    quantize_fp8(b.dy8, b.dyt8, sdy, b.dy, N, l.out, 0);
}

// M, N, K of each kind in the NT form.
static void kind_mnk(int kind, int N, Linear l, int mnk[3]) {
    const int all[NUM_KINDS][3] = {{N, l.out, l.in}, {N, l.in, l.out}, {l.out, l.in, N}};
    memcpy(mnk, all[kind], sizeof(all[kind]));
}
static bf16* kind_out(int kind, const LinearBuffers& b) { return kind == FORWARD ? b.y : kind == INPUT_GRAD ? b.dx : b.dw; }

static void gemm_fp8(Gemm* g, int kind, const LinearBuffers& b, int N, Linear l, bool fast_accum) {
    const float *sx = &b.scales[0].scale_inv, *sw = &b.scales[1].scale_inv, *sdy = &b.scales[2].scale_inv;
    const cudaDataType E4 = CUDA_R_8F_E4M3, E5 = CUDA_R_8F_E5M2;
    if (kind == FORWARD) matmul_fp8(g, 0, b.y, b.x8, E4, sx, b.w8, E4, sw, N, l.out, l.in, fast_accum);
    else if (kind == INPUT_GRAD) matmul_fp8(g, 0, b.dx, b.dy8, E5, sdy, b.wt8, E4, sw, N, l.in, l.out, fast_accum);
    else matmul_fp8(g, 0, b.dw, b.dyt8, E5, sdy, b.xt8, E4, sx, l.out, l.in, N, fast_accum);
}
// The trainer's bf16 calls (train_llama3.cu block_forward, input_grad, weight_grad, one micro-step).
static void gemm_bf16(Gemm* g, int kind, const LinearBuffers& b, int N, Linear l) {
    if (kind == FORWARD) matmul(g, 0, b.y, b.x, b.w, N, l.out, l.in, false, true, false);
    else if (kind == INPUT_GRAD) matmul(g, 0, b.dx, b.dy, b.w, N, l.in, l.out, false, false, false);
    else matmul(g, 0, b.dw, b.dy, b.x, l.out, l.in, N, true, false, false);
}

// ---- checks ----

template <typename F8> static std::vector<float> decoded(const F8* p, size_t n, Fp8Spec f) {
    std::vector<F8> raw = dev_download(p, n);
    std::vector<float> out(n);
    for (size_t i = 0; i < n; i++) out[i] = fp8_decode_ref(raw[i].__x, f);
    return out;
}

// One FP8 GEMM against the fp64 dot products of its decoded operands A (M, K), B (N, K) times the
// inverse scales, on `samples` random outputs (all when samples is 0); the output poisoned first.
// accumulate (the weight gradient only): as micro-steps sum it, into fp32 with beta 1 onto a random
// earlier sum, which the reference adds.
static void check_fp8(Gemm* g, int kind, const LinearBuffers& b, int N, Linear l, bool fast_accum, int samples,
                      bool accumulate = false) {
    int mnk[3];
    kind_mnk(kind, N, l, mnk);
    const int M = mnk[0], Nn = mnk[1], K = mnk[2];
    std::vector<float> A = kind == FORWARD ? decoded(b.x8, (size_t)M * K, FP8_E4M3)
                                           : decoded(kind == INPUT_GRAD ? b.dy8 : b.dyt8, (size_t)M * K, FP8_E5M2);
    std::vector<float> B = decoded(kind == FORWARD ? b.w8 : kind == INPUT_GRAD ? b.wt8 : b.xt8, (size_t)Nn * K, FP8_E4M3);
    std::vector<Fp8Scale> s = dev_download(b.scales, 3);
    double scale = kind == FORWARD ? (double)s[0].scale_inv * s[1].scale_inv
                 : kind == INPUT_GRAD ? (double)s[2].scale_inv * s[1].scale_inv
                                      : (double)s[2].scale_inv * s[0].scale_inv;
    double sa = 0.0, sb = 0.0;
    for (float a : A) sa += (double)a * a;
    for (float v : B) sb += (double)v * v;
    double rms = sqrt(sa / A.size()) * sqrt(sb / B.size()) * scale;
    std::vector<float> got_all, prior;
    if (accumulate) {
        prior = random_normal((size_t)M * Nn, (float)(sqrt((double)K) * rms));
        float* sum = dev_upload(prior);
        matmul_fp8(g, 0, sum, b.dyt8, CUDA_R_8F_E5M2, &b.scales[2].scale_inv, b.xt8, CUDA_R_8F_E4M3,
                   &b.scales[0].scale_inv, M, Nn, K, fast_accum, true, 1.0f);
        got_all = dev_download(sum, (size_t)M * Nn);
        CUDA_CHECK(cudaFree(sum));
    } else {
        bf16* out = kind_out(kind, b);
        dev_poison(out, (size_t)M * Nn);
        gemm_fp8(g, kind, b, N, l, fast_accum);
        got_all = from_bf16(dev_download(out, (size_t)M * Nn));
    }
    size_t n = samples ? samples : (size_t)M * Nn;
    std::vector<float> got(n), ref(n);
    for (size_t i = 0; i < n; i++) {
        size_t idx = samples ? (size_t)(rng_u32() % M) * Nn + rng_u32() % Nn : i;
        size_t r = idx / Nn, c = idx % Nn;
        double sum = 0.0;
        for (int k = 0; k < K; k++) sum += (double)A[r * K + k] * B[c * K + k];
        got[i] = got_all[idx], ref[i] = (float)(sum * scale + (accumulate ? prior[idx] : 0.0));
    }
    char what[128];
    snprintf(what, sizeof(what), "fp8 %s %s%s%s M=%d N=%d K=%d", l.name, KIND_NAMES[kind],
             accumulate ? " fp32 += (micro-steps)" : "", fast_accum ? " fast" : "", M, Nn, K);
    dev_check(what, got, ref, (float)(1e-2 * sqrt((double)K) * rms), 1e-2f);
}

// SQNR in dB of got against ref: 10 log10(sum ref^2 / sum (got - ref)^2).
static double sqnr_db(const std::vector<float>& got, const std::vector<float>& ref) {
    double signal = 0.0, noise = 0.0;
    for (size_t i = 0; i < ref.size(); i++) signal += (double)ref[i] * ref[i], noise += ((double)got[i] - ref[i]) * (got[i] - ref[i]);
    return 10.0 * log10(signal / noise);
}

// Fresh inputs: x, dy ~ N(0, 1), W ~ N(0, 0.02^2) (the trainer's init), a few outliers in x (100x,
// as activations have) so that the scale is set by them; then the GEMM checks and the SQNR of every
// kind and accumulation against bf16. Returns false if an SQNR is under 20 dB.
static bool validate(Gemm* g, int N, Linear l, int samples, int sms, bool print_sqnr) {
    LinearBuffers b = linear_alloc(N, l);
    std::vector<float> x = random_normal((size_t)N * l.in);
    for (int i = 0; i < 8; i++) x[rng_u32() % x.size()] *= 100.0f;
    upload_into(b.x, x);
    upload_into(b.w, random_normal((size_t)l.out * l.in, 0.02f));
    upload_into(b.dy, random_normal((size_t)N * l.out));
    quantize_all(b, N, l, sms);
    bool ok = true;
    for (int kind = 0; kind < NUM_KINDS; kind++)
        for (bool fast : {false, true}) {
            check_fp8(g, kind, b, N, l, fast, samples);
            if (kind == WEIGHT_GRAD && !fast) check_fp8(g, kind, b, N, l, fast, samples, true);
            int mnk[3];
            kind_mnk(kind, N, l, mnk);
            size_t n = (size_t)mnk[0] * mnk[1];
            gemm_bf16(g, kind, b, N, l);
            std::vector<float> ref = from_bf16(dev_download(kind_out(kind, b), n));
            gemm_fp8(g, kind, b, N, l, fast);
            double db = sqnr_db(from_bf16(dev_download(kind_out(kind, b), n)), ref);
            bool pass = db >= 20.0;
            ok &= pass;
            pass ? dev_passed++ : dev_failed++;
            if (print_sqnr || !pass)
                printf("%s sqnr %-8s %-11s %-5s N=%d: %.1f dB against bf16 (bar 20 dB)\n", pass ? "ok  " : "FAIL", l.name,
                       KIND_NAMES[kind], fast ? "fast" : "", N, db);
        }
    linear_free(b);
    return ok;
}

// ---- timing ----

static double sustained_ms(const std::function<void()>& fn) {
    auto start = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 3.0) {
        for (int i = 0; i < 10; i++) fn();
        CUDA_CHECK(cudaDeviceSynchronize());
    }
    return median_ms(fn, 0, 30);
}

// Each kind of one linear in bf16, FP8 and FP8 with fast accumulation; with `sustained` also after
// 3 s back to back (printed in the version column).
static void time_linear(Gemm* g, int N, Linear l, int sms, bool sustained, const DevArgs& a) {
    LinearBuffers b = linear_alloc(N, l);
    fill_normal(b.x, (size_t)N * l.in), fill_normal(b.w, (size_t)l.out * l.in, 0.02f), fill_normal(b.dy, (size_t)N * l.out);
    quantize_all(b, N, l, sms);
    for (int kind = 0; kind < NUM_KINDS; kind++) {
        int mnk[3];
        kind_mnk(kind, N, l, mnk);
        char kernel[64], size[64];
        snprintf(kernel, sizeof(kernel), "%s %s", l.name, KIND_NAMES[kind]);
        snprintf(size, sizeof(size), "M=%d N=%d K=%d", mnk[0], mnk[1], mnk[2]);
        const double flops = 2.0 * N * l.out * l.in;
        for (int version = 1; version <= 3; version++) {
            if (!dev_selected(a, version)) continue;
            std::function<void()> fn = [&] {
                if (version == 1) gemm_bf16(g, kind, b, N, l);
                else gemm_fp8(g, kind, b, N, l, version == 3);
            };
            double ms = median_ms(fn);
            char v[96];
            snprintf(v, sizeof(v), "%s", version == 1 ? "1 bf16" : version == 2 ? "2 fp8" : "3 fp8 fast accum");
            if (sustained)
                snprintf(v + strlen(v), sizeof(v) - strlen(v), "; after 3 s %.0f TFLOP/s", flops / (sustained_ms(fn) * 1e9));
            print_row(kernel, v, size, ms, 0.0, flops, true);
        }
    }
    linear_free(b);
}

int main(int argc, char** argv) {
    DevArgs a = dev_args(argc, argv, 3);
    int dev, major, minor;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major * 10 + minor < 89) { // (make test lists a "skipped:" line as skipped)
        printf("skipped: dev/fp8_gemm: FP8 GEMMs need compute capability 8.9 or newer; this GPU has %d.%d\n0 passed, "
               "0 failed\n", major, minor);
        return 0;
    }
    int sms;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    static Gemm g; // large (its plan table): not on the stack
    gemm_create(&g);
    Llama3Config small = llama3_2_1b_config(), full = llama3_2_1b_config();
    small.n_embd = 128, small.n_head = 4, small.n_kv_head = 2, small.ffn_hidden = 256;
    for (const Linear& l : block_linears(small)) validate(&g, 64, l, 0, sms, false);
    if (!a.small) // (the SQNR table)
        for (const Linear& l : block_linears(full)) validate(&g, 4096, l, 512, sms, true);
    if (!a.check_only) {
        gemm_ceiling_tflops();
        print_header();
        for (int N : {4096, 16384})
            for (const Linear& l : block_linears(full)) time_linear(&g, N, l, sms, N == 16384, a);
    }
    gemm_destroy(&g);
    return dev_finish();
}
