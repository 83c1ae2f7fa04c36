// dev/common.h: what every dev/ microbenchmark shares: fresh random inputs, poisoned outputs,
// checks against a CPU reference, CUDA-event timing (median after warm-up), the ceilings measured
// in the same run, and the table row every benchmark prints.
//
// A benchmark binary: `dev/NAME` validates every version and then times them; `dev/NAME K` only
// version K; `dev/NAME --check` validates only (what `make test` runs); `--small` validates only,
// at the small shapes alone where a file also has the 1B's: what make sanitize runs, as
// compute-sanitizer's tools run a kernel 100-1000x slower and the small shapes take the same paths.
// `--sizes N,N,...` (a benchmark that takes it: dev/attention) times only those of its sizes. Each prints rows
//   | kernel | version | size | ms | rate | % of ceiling | check |
// and ends with "N passed, M failed" (exit code 1 if any check failed).
#pragma once
#include <algorithm>
#include <chrono>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "../kernels.cuh"

static int dev_passed = 0, dev_failed = 0;

// ---- command line ----
typedef struct {
    bool check_only;         // --check: validate, no timing
    bool small;              // --small: the small shapes only (implies --check)
    int version;             // 0: all versions
    std::vector<long> sizes; // --sizes: the sizes to time (empty: all)
} DevArgs;

// A comma-separated list of sizes, each a number with an optional k (x1024: 1k,64k), into *out;
// false unless every one is among `known`.
static bool parse_sizes(const char* list, const std::vector<long>& known, std::vector<long>* out) {
    char* end;
    for (const char* p = list;; p = end + 1) { // past each comma
        long n = strtol(p, &end, 10);
        if (*end == 'k') n *= 1024, end++;
        if (end == p || (*end != ',' && *end != '\0') || std::find(known.begin(), known.end(), n) == known.end())
            return false;
        out->push_back(n);
        if (*end == '\0') return true;
    }
}

// sizes: the sizes a benchmark times, which --sizes picks from (none: it takes no --sizes).
static DevArgs dev_args(int argc, char** argv, int n_versions, const std::vector<long>& sizes = {}) {
    DevArgs a = {false, false, 0, {}};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) a.check_only = true;
        else if (!strcmp(argv[i], "--small")) a.check_only = a.small = true;
        else if (!strcmp(argv[i], "--sizes") && !sizes.empty() && i + 1 < argc &&
                 parse_sizes(argv[i + 1], sizes, &a.sizes))
            i++;
        else if (atoi(argv[i]) >= 1 && atoi(argv[i]) <= n_versions) a.version = atoi(argv[i]);
        else {
            fprintf(stderr, "usage: %s [--check] [--small]", argv[0]);
            if (!sizes.empty()) {
                fprintf(stderr, " [--sizes N,N,... of");
                for (long n : sizes) fprintf(stderr, " %ld", n);
                fprintf(stderr, " (1k = 1024)]");
            }
            fprintf(stderr, " [version 1..%d]\n", n_versions);
            exit(EXIT_FAILURE);
        }
    }
    return a;
}
static bool dev_selected(const DevArgs& a, int version) { return a.version == 0 || a.version == version; }
static bool dev_size_selected(const DevArgs& a, long size) {
    return a.sizes.empty() || std::find(a.sizes.begin(), a.sizes.end(), size) != a.sizes.end();
}

// ---- random inputs: a new seed every run (printed), so each check sees fresh data ----
static uint64_t dev_seed(void) {
    static uint64_t seed = 0;
    if (seed == 0) {
        const char* env = getenv("DEV_SEED");
        seed = env ? strtoull(env, NULL, 10)
                   : (uint64_t)std::chrono::high_resolution_clock::now().time_since_epoch().count();
        printf("random seed %llu (set DEV_SEED to repeat)\n", (unsigned long long)seed);
    }
    return seed;
}
static uint64_t rng_state = 0;
static uint32_t rng_u32(void) { // xorshift64*, seeded from dev_seed()
    if (rng_state == 0) rng_state = dev_seed() | 1;
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}
static float rng_uniform(float lo, float hi) { return lo + (hi - lo) * ((rng_u32() >> 8) * (1.0f / 16777216.0f)); }
static float rng_normal(void) {
    float u1 = (rng_u32() + 0.5f) * 2.3283064e-10f, u2 = (rng_u32() + 0.5f) * 2.3283064e-10f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}
static std::vector<float> random_normal(size_t n, float std = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = std * rng_normal();
    return v;
}
static std::vector<float> random_uniform(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (auto& x : v) x = rng_uniform(lo, hi);
    return v;
}
// Host round-to-nearest-even to bf16 and back: what a bf16 tensor holds.
static float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}
static std::vector<bf16> to_bf16(const std::vector<float>& v) {
    std::vector<bf16> out(v.size());
    for (size_t i = 0; i < v.size(); i++) out[i] = __float2bfloat16_rn(v[i]);
    return out;
}
static std::vector<float> from_bf16(const std::vector<bf16>& v) {
    std::vector<float> out(v.size());
    for (size_t i = 0; i < v.size(); i++) out[i] = __bfloat162float(v[i]);
    return out;
}

// ---- device buffers ----
template <typename T> static T* dev_alloc(size_t n) {
    T* p;
    CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    return p;
}
template <typename T> static T* dev_upload(const std::vector<T>& v) {
    T* p = dev_alloc<T>(v.size());
    CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}
template <typename T> static std::vector<T> dev_download(const T* p, size_t n) {
    std::vector<T> v(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}
// All bytes 0xFF: NaN as fp32 and as bf16, so an output element the kernel skips fails the check.
template <typename T> static void dev_poison(T* p, size_t n) { CUDA_CHECK(cudaMemset(p, 0xFF, n * sizeof(T))); }

// ---- checks ----
// Every element: |got - ref| <= atol + rtol * |ref|, NaN never passes. Prints the worst element.
static bool dev_check(const char* what, const float* got, const float* ref, size_t n, float atol, float rtol) {
    size_t bad = 0, worst = 0;
    double worst_excess = -1.0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - ref[i]), lim = atol + rtol * fabs((double)ref[i]);
        bool ok = err <= lim; // false for NaN
        if (!ok) bad++;
        double excess = ok ? err - lim : INFINITY;
        if (excess > worst_excess) worst_excess = excess, worst = i;
    }
    printf("%s %-52s %zu/%zu elements within atol %.1e rtol %.1e (worst [%zu]: got %.6g ref %.6g)\n",
           bad ? "FAIL" : "ok  ", what, n - bad, n, atol, rtol, worst, got[worst], ref[worst]);
    bad ? dev_failed++ : dev_passed++;
    return bad == 0;
}
static bool dev_check(const char* what, const std::vector<float>& got, const std::vector<float>& ref, float atol,
                      float rtol) {
    return dev_check(what, got.data(), ref.data(), std::min(got.size(), ref.size()), atol, rtol);
}
// [fp8] A kernel's fused amax (the bits of a float in device memory, run from zero) against the
// largest |value| of what the kernel wrote: exact, since a max rounds nothing.
static bool dev_check_amax(const char* what, const unsigned* amax_bits, const std::vector<float>& written) {
    unsigned bits = dev_download(amax_bits, 1)[0];
    float got, want = 0.0f;
    memcpy(&got, &bits, 4);
    for (float v : written) want = std::max(want, fabsf(v));
    return dev_check(what, std::vector<float>{got}, std::vector<float>{want}, 0.0f, 0.0f);
}
static int dev_finish(void) {
    printf("%d passed, %d failed\n", dev_passed, dev_failed);
    return dev_failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

// ---- shared input helpers ----

// n bf16 values ~ N(0, std^2) made on the device (seeded from dev_seed()): inputs too large for
// the host's generator.
static void fill_normal(bf16* x, size_t n, float std = 1.0f) {
    static uint64_t calls = 0;
    float* tmp = dev_alloc<float>(n);
    init_params(tmp, n, 0.0f, std, dev_seed() + ++calls, 0);
    cast_to_bf16(x, tmp, n, 0);
    CUDA_CHECK(cudaFree(tmp));
}

// Host floats rounded to bf16 into an existing device buffer.
static void upload_into(bf16* dst, const std::vector<float>& src) {
    std::vector<bf16> b = to_bf16(src);
    CUDA_CHECK(cudaMemcpy(dst, b.data(), b.size() * sizeof(bf16), cudaMemcpyHostToDevice));
}

// The [begin, begin + width) columns of each of the N rows of a row-major matrix `cols` wide.
static std::vector<float> columns(const std::vector<float>& m, size_t N, int cols, int begin, int width) {
    std::vector<float> out(N * width);
    for (size_t n = 0; n < N; n++)
        std::copy(m.begin() + n * cols + begin, m.begin() + n * cols + begin + width, out.begin() + n * width);
    return out;
}

// Sets of buffers to rotate through so that a timed call never finds its inputs in L2: enough
// to span twice the L2 size (one when a single call already does).
static int rotations(size_t bytes_per_call) {
    int l2;
    CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    return (int)std::min<size_t>(64, 2 * (size_t)l2 / bytes_per_call + 1);
}

// ---- the model's linears ----
// A linear layer y = x W^T of the trainer: W (out, in).
typedef struct {
    const char* name;
    int out, in;
} Linear;

// One layer's linears, then the LM head (last), at model c's widths.
static std::vector<Linear> model_linears(const Llama3Config& c) {
    return {{"qkv", qkv_dim(&c), c.n_embd},
            {"attn_out", c.n_embd, c.n_embd},
            {"gate_up", 2 * c.ffn_hidden, c.n_embd},
            {"down", c.n_embd, c.ffn_hidden},
            {"lm_head", c.vocab_size, c.n_embd}};
}

// ---- timing ----
// One thread busy-waits `ns` nanoseconds of the GPU's global timer.
__global__ void spin_kernel(uint64_t ns) {
    uint64_t start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    while (now - start < ns);
}

// Median of `reps` timed calls after `warmup` untimed ones, each call between two events. Each
// timed call is queued behind a 50 us spin, during which the host issues the call: the start event
// fires when the spin ends, right before the call's work, so a kernel shorter than its own host
// launch cost is timed on the GPU alone. (A call the host issues for longer than the spin is still
// timed at the host's pace, less the spin.)
template <typename F> static double median_ms(F fn, int warmup = 5, int reps = 30) {
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < warmup; i++) fn();
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; i++) {
        spin_kernel<<<1, 1>>>(50 * 1000); // 50 us
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaEventRecord(a));
        fn();
        CUDA_CHECK(cudaEventRecord(b));
        CUDA_CHECK(cudaEventSynchronize(b));
        CUDA_CHECK(cudaEventElapsedTime(&ms[i], a, b));
    }
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
}

// ---- AdamW ----
// Step t (from 1) of torch.optim.AdamW(lr, (beta1, beta2), eps, weight_decay).
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    int t;
} AdamWStep;

// AdamW at s's constant lr (no warmup, no decay up to step s.t), without clipping.
static OptimConfig optim_config(const AdamWStep& s) {
    OptimConfig o = {};
    o.sched.kind = LR_CONSTANT;
    o.sched.warmup = 0;
    o.sched.total = s.t;
    o.sched.peak_lr = s.lr;
    o.beta1 = s.beta1, o.beta2 = s.beta2, o.eps = s.eps, o.weight_decay = s.weight_decay;
    return o;
}

// The kernels' hyperparameters for step s where they read them, device memory (kernels.cuh,
// [graphs]), written by the trainer's adamw_next_step from step t - 1: its bias corrections are
// under test with the kernels (the reference, adamw_cpu, computes its own).
static const AdamWParams* dev_adamw_params(const AdamWStep& s) {
    AdamWHistory* h = dev_alloc<AdamWHistory>(1);
    CUDA_CHECK(cudaMemset(h, 0, sizeof(AdamWHistory)));
    int* step = dev_upload(std::vector<int>{s.t - 1});
    StepStats* stats = dev_alloc<StepStats>(1);
    adamw_next_step(h, step, optim_config(s), stats, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaFree(step));
    CUDA_CHECK(cudaFree(stats));
    return &h->latest;
}
// A new device copy of h (the step's `latest`) with the fields the step's guard kernels fill in: clip_guard's
// clipping scale and the NaN guard's skip.
static const AdamWParams* dev_adamw_params_with(const AdamWParams* h, float grad_scale, int skip) {
    AdamWParams host;
    CUDA_CHECK(cudaMemcpy(&host, h, sizeof(host), cudaMemcpyDeviceToHost));
    host.grad_scale = grad_scale;
    host.skip = skip;
    AdamWParams* d = dev_alloc<AdamWParams>(1);
    CUDA_CHECK(cudaMemcpy(d, &host, sizeof(host), cudaMemcpyHostToDevice));
    return d;
}

// torch.optim.AdamW's step s on n elements in fp64 from the fp32 state, bias corrections included,
// in the kernels' order of operations, on the gradient times grad_scale (gradient clipping's):
//   g *= grad_scale;  p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// A launch with decay = false (the norm weights) is the reference with s.weight_decay = 0.
static void adamw_cpu(float* p, float* m, float* v, const float* g, size_t n, const AdamWStep& s,
                      float grad_scale = 1.0f) {
    double b1 = s.beta1, b2 = s.beta2;
    double step_size = s.lr / (1.0 - pow(b1, s.t)), bias_corr2_sqrt = sqrt(1.0 - pow(b2, s.t));
    for (size_t i = 0; i < n; i++) {
        double gi = (double)g[i] * grad_scale;
        double pi = p[i] - (double)s.lr * s.weight_decay * p[i];
        double mi = b1 * m[i] + (1.0 - b1) * gi;
        double vi = b2 * v[i] + (1.0 - b2) * gi * gi;
        pi -= step_size * mi / (sqrt(vi) / bias_corr2_sqrt + s.eps);
        p[i] = (float)pi;
        m[i] = (float)mi;
        v[i] = (float)vi;
    }
}

// ---- ceilings, measured in this run ----
// Device-to-device copy of 2 GiB, bytes read + written: the bandwidth a streaming kernel can reach.
static double copy_ceiling_gbs(void) {
    static double gbs = 0.0;
    if (gbs > 0.0) return gbs;
    size_t bytes = (size_t)2 << 30;
    char *src = dev_alloc<char>(bytes), *dst = dev_alloc<char>(bytes);
    CUDA_CHECK(cudaMemset(src, 1, bytes));
    double ms = median_ms([&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); }, 3, 10);
    gbs = 2.0 * bytes / (ms * 1e6);
    CUDA_CHECK(cudaFree(src));
    CUDA_CHECK(cudaFree(dst));
    printf("ceiling: device-to-device copy %.0f GB/s (read + write)\n", gbs);
    return gbs;
}
// An 8192^3 bf16 GEMM on random data through the trainer's cuBLASLt path.
static double gemm_ceiling_tflops(void) {
    static double tflops = 0.0;
    if (tflops > 0.0) return tflops;
    const int n = 8192;
    bf16 *a = dev_upload(to_bf16(random_normal((size_t)n * n))), *b = dev_upload(to_bf16(random_normal((size_t)n * n)));
    bf16* d = dev_alloc<bf16>((size_t)n * n);
    static Gemm g; // large (its plan table): not on the stack
    gemm_create(&g);
    double ms = median_ms([&] { matmul(&g, 0, d, a, b, n, n, n, false, true, false); }, 3, 10);
    tflops = 2.0 * n * n * (double)n / (ms * 1e9);
    gemm_destroy(&g);
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    CUDA_CHECK(cudaFree(d));
    printf("ceiling: bf16 GEMM 8192^3 %.0f TFLOP/s (cuBLASLt, random data)\n", tflops);
    return tflops;
}

// ---- the table ----
static void print_header(void) {
    printf("| kernel | version | size | ms (median) | rate | of ceiling | check |\n|---|---|---|---|---|---|---|\n");
}
// bytes > 0: a memory-bound row (GB/s against the copy ceiling); else flops (TFLOP/s against GEMM).
// causal_flops > 0 (attention): the same work counted as FlashAttention counts it, the causal half of
// the T x T square; its rate follows the first in brackets, "710 TFLOP/s (causal 355)".
static void print_row(const char* kernel, const char* version, const char* size, double ms, double bytes,
                      double flops, bool checked_ok, double causal_flops = 0.0) {
    double rate = bytes > 0 ? bytes / (ms * 1e6) : flops / (ms * 1e9);
    double ceil = bytes > 0 ? copy_ceiling_gbs() : gemm_ceiling_tflops();
    char causal[32] = "";
    if (causal_flops > 0) snprintf(causal, sizeof(causal), " (causal %.0f)", causal_flops / (ms * 1e9));
    printf("| %s | %s | %s | %.4f | %.0f %s%s | %.0f%% | %s |\n", kernel, version, size, ms, rate,
           bytes > 0 ? "GB/s" : "TFLOP/s", causal, 100.0 * rate / ceil, checked_ok ? "ok" : "FAILED");
}

// ---- [fp8] a reference codec, written from the formats' definitions (not CUDA's converters) ----
// e4m3 ("fn": bias 7, no infinities, max 448 = 0x7e, NaN 0x7f) and e5m2 (bias 15, max 57344 =
// 0x7b, NaN 0x7f), each with subnormals below the smallest normal exponent.
typedef struct {
    int mbits, bias;
    float max;
} Fp8Spec;
static const Fp8Spec FP8_E4M3 = {3, 7, 448.0f}, FP8_E5M2 = {2, 15, 57344.0f};

// x rounded to nearest even on the format's grid, saturated to +-max (the kernels' SATFINITE).
static uint8_t fp8_encode_ref(float x, Fp8Spec f) {
    if (isnan(x)) return 0x7f;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    if (a == 0.0) return sign;
    int e, emin = 1 - f.bias; // a = 1.xxx * 2^e; below emin the grid is the subnormals'
    double v = f.max;
    if (!isinf(a)) {
        frexp(a, &e);
        e = std::max(e - 1, emin);
        double quantum = ldexp(1.0, e - f.mbits);
        v = std::min(nearbyint(a / quantum) * quantum, (double)f.max); // nearbyint: to nearest even
    }
    if (v == 0.0) return sign;
    frexp(v, &e);
    e -= 1;
    if (e < emin) return sign | (uint8_t)(v / ldexp(1.0, emin - f.mbits));
    int mantissa = (int)(v / ldexp(1.0, e - f.mbits)) - (1 << f.mbits);
    return sign | (uint8_t)((e + f.bias) << f.mbits) | (uint8_t)mantissa;
}
static float fp8_decode_ref(uint8_t b, Fp8Spec f) {
    int e = (b & 0x7f) >> f.mbits, m = b & ((1 << f.mbits) - 1), emax = (1 << (7 - f.mbits)) - 1;
    float sign = b & 0x80 ? -1.0f : 1.0f;
    if (f.mbits == 3 ? (e == emax && m == 7) : e == emax) return m || f.mbits == 3 ? NAN : sign * INFINITY;
    if (e == 0) return sign * (float)ldexp((double)m, 1 - f.bias - f.mbits);
    return sign * (float)ldexp(1.0 + m / (double)(1 << f.mbits), e - f.bias);
}
// The tensorwise scale as the kernels compute it (kernels.cuh fp8_scale), in fp32.
static float fp8_scale_ref(float amax, Fp8Spec f) { return f.max / std::max(amax, 1e-12f); }
