// dev/gemm.cu: the GEMMs of one LLaMA3.2-1B layer and of the LM head, through the trainer's
// matmul() (kernels.cuh: cuBLASLt, one cached plan per call shape), called as train_llama3.cu
// calls it for a linear layer y = x W^T, x (N, in), W (out, in), N = B*T tokens:
//   forward      y  (N, out)      = x W^T   matmul(y, x, W, N, out, in, NT), bf16 out  (block_forward)
//   input grad   dx (N, in)       = dy W    matmul(dx, dy, W, N, in, out, NN), bf16 out (input_grad)
//   weight grad  dW (out, in)    (+)= dy^T x matmul(dW, dy, x, out, in, N, TN), bf16 out (one micro-step,
//                the default), or fp32 out with beta 0 (first micro-step) or beta 1 (the later
//                ones accumulate)                                                      (weight_grad)
// for qkv (3072 x 2048), attn_out (2048 x 2048), gate_up (16384 x 2048), down (2048 x 8192) and
// lm_head (128256 x 2048). 2 M N K FLOPs each, against the measured GEMM ceiling.
//
// build: make dev/gemm
// run:   ./dev/gemm          validate against a CPU reference, then time every shape
//        ./dev/gemm 1        only version 1; ./dev/gemm 2 only version 2 (2.5 minutes on the H200)
//        ./dev/gemm --check  validate only, no timing (what `make test` runs)
//
// versions:
//   1  the trainer's matmul() (the library: cuBLASLt's heuristic picks the kernel).
//   2  the heuristic's first 8 candidates for the largest B=16,T=1024 GEMMs, each timed after 3 s
//      back to back: the rate at the clock the 700 W power cap leaves (see version 2's note).
// sizes: N = 256 (B=4, T=64) and 16384 (B=16, T=1024); the 3B's and the 8B's layers (--shape 3b, 8b)
// at N = 4096, their micro-batch in the README's model table. Validated on every layer's shapes of a
// small model (C 64, 4/2 heads of 16, F 128, V 520) at N = 34, and on attn_out at N = 256.
#include "common.h"
#include "../llama3.h"

enum { FORWARD, INPUT_GRAD, WEIGHT_GRAD_BF16, WEIGHT_GRAD, WEIGHT_GRAD_ACC, NUM_KINDS };
static const char* const KIND_NAMES[NUM_KINDS] = {"forward (NT, bf16)", "input grad (NN, bf16)",
                                                  "weight grad (TN, bf16)", "weight grad (TN, fp32, beta 0)",
                                                  "weight grad (TN, fp32, beta 1)"};

typedef struct {
    bf16 *x, *w, *dy; // inputs: x (N, in), W (out, in), dy (N, out)
    bf16 *y, *dx;     // outputs: y (N, out), dx (N, in)
    bf16* dw_bf16;    // output: dW (out, in) in bf16
    float* dw;        // output (beta 0) or accumulated into (beta 1): dW (out, in) in fp32
} LinearBuffers;

static LinearBuffers linear_alloc(size_t N, Linear l) {
    size_t W = (size_t)l.out * l.in;
    LinearBuffers b = {dev_alloc<bf16>(N * l.in),  dev_alloc<bf16>(W),        dev_alloc<bf16>(N * l.out),
                       dev_alloc<bf16>(N * l.out), dev_alloc<bf16>(N * l.in), dev_alloc<bf16>(W),
                       dev_alloc<float>(W)};
    return b;
}
static void linear_free(LinearBuffers& b) {
    void* all[] = {b.x, b.w, b.dy, b.y, b.dx, b.dw_bf16, b.dw};
    for (void* p : all) CUDA_CHECK(cudaFree(p));
}

// The trainer's calls (train_llama3.cu block_forward, input_grad, weight_grad).
static void gemm_kind(Gemm* g, int kind, const LinearBuffers& b, int N, Linear l) {
    if (kind == FORWARD) matmul(g, 0, b.y, b.x, b.w, N, l.out, l.in, false, true, false);
    else if (kind == INPUT_GRAD) matmul(g, 0, b.dx, b.dy, b.w, N, l.in, l.out, false, false, false);
    else if (kind == WEIGHT_GRAD_BF16) matmul(g, 0, b.dw_bf16, b.dy, b.x, l.out, l.in, N, true, false, false);
    else matmul(g, 0, b.dw, b.dy, b.x, l.out, l.in, N, true, false, true, 1.0f, kind == WEIGHT_GRAD_ACC ? 1.0f : 0.0f);
}

// ---- CPU reference ----

// D (M, N) = A (M, K) B (K, N), row-major, summed in fp64 (the bf16 products are exact in it).
static std::vector<float> matmul_cpu(const std::vector<float>& A, const std::vector<float>& B, int M, int N, int K) {
    std::vector<double> acc(N);
    std::vector<float> D((size_t)M * N);
    for (int m = 0; m < M; m++) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int k = 0; k < K; k++) {
            double a = A[(size_t)m * K + k];
            const float* b = &B[(size_t)k * N];
            for (int n = 0; n < N; n++) acc[n] += a * b[n];
        }
        for (int n = 0; n < N; n++) D[(size_t)m * N + n] = (float)acc[n];
    }
    return D;
}
static std::vector<float> transpose(const std::vector<float>& m, int rows, int cols) {
    std::vector<float> t(m.size());
    for (size_t r = 0; r < (size_t)rows; r++)
        for (int c = 0; c < cols; c++) t[(size_t)c * rows + r] = m[r * cols + c];
    return t;
}

// Fresh N(0, 1) x, W, dy; the four calls against the reference. The outputs have scale sqrt(K).
// Tolerances: bf16 outputs rtol 1e-2 (their own rounding is 2^-9), fp32 outputs rtol 1e-4 (fp32
// accumulation over K, ~1e-6); both with atol 1e-4 sqrt(K) for outputs that cancel to near 0,
// where the error is that of the sum's terms. The beta 1 call starts from random fp32 dW (its
// "poison": a value that was not accumulated into shows) and must return dW + dy^T x.
static void validate(Gemm* g, int N, Linear l, bool* ok) {
    std::vector<float> x = from_bf16(to_bf16(random_normal((size_t)N * l.in)));
    std::vector<float> w = from_bf16(to_bf16(random_normal((size_t)l.out * l.in)));
    std::vector<float> dy = from_bf16(to_bf16(random_normal((size_t)N * l.out)));
    std::vector<float> dw_old = random_normal((size_t)l.out * l.in, sqrtf((float)N));
    std::vector<float> ref[NUM_KINDS] = {matmul_cpu(x, transpose(w, l.out, l.in), N, l.out, l.in),
                                         matmul_cpu(dy, w, N, l.in, l.out),
                                         {}, matmul_cpu(transpose(dy, N, l.out), x, l.out, l.in, N), {}};
    ref[WEIGHT_GRAD_BF16] = ref[WEIGHT_GRAD_ACC] = ref[WEIGHT_GRAD];
    for (size_t i = 0; i < dw_old.size(); i++) ref[WEIGHT_GRAD_ACC][i] += dw_old[i];
    const int K[NUM_KINDS] = {l.in, l.out, N, N, N};
    LinearBuffers b = linear_alloc(N, l);
    upload_into(b.x, x), upload_into(b.w, w), upload_into(b.dy, dy);
    char what[128];
    for (int kind = 0; kind < NUM_KINDS; kind++) {
        std::vector<float> got;
        if (kind == FORWARD) dev_poison(b.y, (size_t)N * l.out);
        if (kind == INPUT_GRAD) dev_poison(b.dx, (size_t)N * l.in);
        if (kind == WEIGHT_GRAD_BF16) dev_poison(b.dw_bf16, (size_t)l.out * l.in);
        if (kind == WEIGHT_GRAD) dev_poison(b.dw, (size_t)l.out * l.in);
        if (kind == WEIGHT_GRAD_ACC)
            CUDA_CHECK(cudaMemcpy(b.dw, dw_old.data(), dw_old.size() * sizeof(float), cudaMemcpyHostToDevice));
        gemm_kind(g, kind, b, N, l);
        if (kind == FORWARD) got = from_bf16(dev_download(b.y, (size_t)N * l.out));
        else if (kind == INPUT_GRAD) got = from_bf16(dev_download(b.dx, (size_t)N * l.in));
        else if (kind == WEIGHT_GRAD_BF16) got = from_bf16(dev_download(b.dw_bf16, (size_t)l.out * l.in));
        else got = dev_download(b.dw, (size_t)l.out * l.in);
        snprintf(what, sizeof(what), "%s N=%d (%dx%d) %s", l.name, N, l.out, l.in, KIND_NAMES[kind]);
        ok[1] &= dev_check(what, got, ref[kind], 1e-4f * sqrtf((float)K[kind]), kind <= WEIGHT_GRAD_BF16 ? 1e-2f : 1e-4f);
    }
    linear_free(b);
}

// ---- timing ----

// All four calls of one linear layer. Rotation is sized by the forward's operands (the input
// grad's are the same, the weight grad's larger): at N = 256 the small layers' fit in L2.
static void time_linear(Gemm* g, const char* model, int N, Linear l, bool ok) {
    int sets = rotations(2 * ((size_t)N * l.in + (size_t)l.out * l.in + (size_t)N * l.out));
    std::vector<LinearBuffers> b(sets);
    for (auto& s : b) {
        s = linear_alloc(N, l);
        fill_normal(s.x, (size_t)N * l.in), fill_normal(s.w, (size_t)l.out * l.in);
        fill_normal(s.dy, (size_t)N * l.out);
    }
    const int MNK[NUM_KINDS][3] = {{N, l.out, l.in}, {N, l.in, l.out}, {l.out, l.in, N}, {l.out, l.in, N}, {l.out, l.in, N}};
    for (int kind = 0; kind < NUM_KINDS; kind++) { // beta 0 before beta 1: dW holds values to add to
        int r = 0;
        double ms = median_ms([&] { gemm_kind(g, kind, b[r++ % sets], N, l); });
        char kernel[64], size[64];
        snprintf(kernel, sizeof(kernel), "%s %s %s", model, l.name, KIND_NAMES[kind]);
        snprintf(size, sizeof(size), "M=%d N=%d K=%d", MNK[kind][0], MNK[kind][1], MNK[kind][2]);
        print_row(kernel, sets > 1 ? "1 cuBLASLt (rotated)" : "1 cuBLASLt", size, ms, 0.0, 2.0 * N * l.out * l.in, ok);
    }
    for (auto& s : b) linear_free(s);
}

// The ceiling's 8192^3 GEMM run back to back for `seconds` first, then timed: the rate once the
// board's power cap (700 W on the H200) has pulled the SM clock down, which is what the GEMMs of a
// long training step see; the ceiling above is measured before the clock falls.
static void sustained_gemm_tflops(Gemm* g, double seconds) {
    const int n = 8192;
    bf16 *a = dev_upload(to_bf16(random_normal((size_t)n * n))), *b = dev_upload(to_bf16(random_normal((size_t)n * n)));
    bf16* d = dev_alloc<bf16>((size_t)n * n);
    auto start = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
        for (int i = 0; i < 20; i++) matmul(g, 0, d, a, b, n, n, n, false, true, false);
        CUDA_CHECK(cudaDeviceSynchronize());
    }
    double ms = median_ms([&] { matmul(g, 0, d, a, b, n, n, n, false, true, false); }, 0, 50);
    printf("sustained: bf16 GEMM 8192^3 after %.0f s back to back %.0f TFLOP/s\n", seconds,
           2.0 * n * n * (double)n / (ms * 1e9));
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    CUDA_CHECK(cudaFree(d));
}

// ---- version 2: the heuristic's other candidates, under the power cap ----
// The trainer runs cuBLASLt's first candidate, the library's pick for the burst clock. Through a
// B=16, T=1024 step the H200 sits at its 700 W cap with the SM clock near 1550 MHz (dev/PERF.md),
// so what counts there is a kernel's rate at the clock the cap leaves it: a candidate with other
// tiles, stages or clusters (other bytes moved per FLOP through L2 and shared memory) could do more
// work per joule. Each of the first CANDIDATES is checked on SAMPLES outputs against an fp64 dot
// product of the same bf16 inputs, then timed twice: from idle (burst, in the version column) and
// after 3 s back to back (the row's ms and rate).
#define CANDIDATES 8
#define SAMPLES 1024

template <typename T> static T algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
    T value = 0;
    size_t written = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written));
    return value;
}

// Output (m, n) of `kind` from host copies of the bf16 inputs, summed in fp64.
static double product_ref(int kind, const std::vector<bf16>& x, const std::vector<bf16>& w, const std::vector<bf16>& dy,
                          int N, Linear l, int m, int n) {
    double sum = 0.0;
    if (kind == FORWARD) // y[m][n] = x[m, :] . W[n, :]
        for (int k = 0; k < l.in; k++) sum += (double)__bfloat162float(x[(size_t)m * l.in + k]) * __bfloat162float(w[(size_t)n * l.in + k]);
    else if (kind == INPUT_GRAD) // dx[m][n] = dy[m, :] . W[:, n]
        for (int k = 0; k < l.out; k++) sum += (double)__bfloat162float(dy[(size_t)m * l.out + k]) * __bfloat162float(w[(size_t)k * l.in + n]);
    else // dW[m][n] = dy[:, m] . x[:, n]
        for (int k = 0; k < N; k++) sum += (double)__bfloat162float(dy[(size_t)k * l.out + m]) * __bfloat162float(x[(size_t)k * l.in + n]);
    return sum;
}

// Candidate cand (set into the shape's plan, the only one in g) checked on the sampled outputs;
// poisoned first, so an output the kernel skips fails.
static bool check_candidate(Gemm* g, const char* what, int kind, const LinearBuffers& b, int N, Linear l,
                            const std::vector<int>& ms, const std::vector<int>& ns, const std::vector<float>& ref) {
    const int cols = kind == FORWARD ? l.out : l.in, K = kind == FORWARD ? l.in : kind == INPUT_GRAD ? l.out : N;
    bf16* out = kind == FORWARD ? b.y : kind == INPUT_GRAD ? b.dx : b.dw_bf16;
    dev_poison(out, (size_t)(kind == WEIGHT_GRAD_BF16 ? l.out : N) * cols);
    gemm_kind(g, kind, b, N, l);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got(ms.size());
    for (size_t i = 0; i < ms.size(); i++) {
        bf16 v;
        CUDA_CHECK(cudaMemcpy(&v, out + (size_t)ms[i] * cols + ns[i], sizeof(v), cudaMemcpyDeviceToHost));
        got[i] = __bfloat162float(v);
    }
    return dev_check(what, got, ref, 1e-4f * sqrtf((float)K), 1e-2f);
}

static void time_candidates(int N, Linear l, int kind, bool timing) {
    static Gemm g; // a plan table of its own: the shape's plan is plans[0]
    gemm_create(&g);
    LinearBuffers b = linear_alloc(N, l);
    fill_normal(b.x, (size_t)N * l.in), fill_normal(b.w, (size_t)l.out * l.in), fill_normal(b.dy, (size_t)N * l.out);
    gemm_kind(&g, kind, b, N, l); // makes the plan
    cublasLtMatmulHeuristicResult_t cand[CANDIDATES];
    const int found = gemm_candidates(&g, &g.plans[0], cand, CANDIDATES);
    std::vector<bf16> x = dev_download(b.x, (size_t)N * l.in), w = dev_download(b.w, (size_t)l.out * l.in), dy;
    if (kind != FORWARD) dy = dev_download(b.dy, (size_t)N * l.out);
    const int rows = kind == WEIGHT_GRAD_BF16 ? l.out : N, cols = kind == FORWARD ? l.out : l.in;
    std::vector<int> ms(SAMPLES), ns(SAMPLES);
    std::vector<float> ref(SAMPLES);
    for (int i = 0; i < SAMPLES; i++) {
        ms[i] = rng_u32() % rows, ns[i] = rng_u32() % cols;
        ref[i] = (float)product_ref(kind, x, w, dy, N, l, ms[i], ns[i]);
    }
    const int MNK[3] = {rows, cols, kind == FORWARD ? l.in : kind == INPUT_GRAD ? l.out : N};
    for (int c = 0; c < found; c++) {
        const cublasLtMatmulAlgo_t& a = cand[c].algo;
        char kernel[96], version[192], size[64];
        snprintf(kernel, sizeof(kernel), "%s %s", l.name, KIND_NAMES[kind]);
        snprintf(version, sizeof(version), "2 candidate %d: algo %d tile %u stages %u cluster %u split-k %u", c,
                 algo_attr<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID), algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
                 algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                 (unsigned)algo_attr<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                 algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM));
        snprintf(size, sizeof(size), "M=%d N=%d K=%d", MNK[0], MNK[1], MNK[2]);
        g.plans[0].algo = a;
        char what[320];
        snprintf(what, sizeof(what), "%s, %s", kernel, version);
        bool ok = check_candidate(&g, what, kind, b, N, l, ms, ns, ref);
        if (!timing) continue;
        const double flops = 2.0 * N * l.out * l.in;
        double burst = median_ms([&] { gemm_kind(&g, kind, b, N, l); });
        auto start = std::chrono::steady_clock::now();
        while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 3.0) {
            for (int i = 0; i < 10; i++) gemm_kind(&g, kind, b, N, l);
            CUDA_CHECK(cudaDeviceSynchronize());
        }
        double sustained = median_ms([&] { gemm_kind(&g, kind, b, N, l); }, 0, 30);
        snprintf(version + strlen(version), sizeof(version) - strlen(version), "; burst %.0f TFLOP/s", flops / (burst * 1e9));
        print_row(kernel, version, size, sustained, 0.0, flops, ok);
    }
    linear_free(b);
    gemm_destroy(&g);
}

int main(int argc, char** argv) {
    DevArgs a = dev_args(argc, argv, 2);
    static Gemm g; // the trainer's matmul() state; large (its plan table): not on the stack
    gemm_create(&g);
    Llama3Config small = llama3_2_1b_config(), full = llama3_2_1b_config();
    small.n_embd = 64, small.n_head = 4, small.n_kv_head = 2, small.ffn_hidden = 128, small.vocab_size = 520;
    bool ok[2] = {true, true};
    if (dev_selected(a, 1)) {
        for (const Linear& l : model_linears(small)) validate(&g, 34, l, ok);
        validate(&g, 256, model_linears(full)[1], ok); // attn_out, a real shape
    }
    if (!a.check_only) {
        gemm_ceiling_tflops(); // measured before the table, so its line does not split it
        sustained_gemm_tflops(&g, 5.0);
        print_header();
        if (dev_selected(a, 1)) {
            for (int N : {256, 16384})
                for (const Linear& l : model_linears(full)) time_linear(&g, "1B", N, l, ok[1]);
            // the 3B's and the 8B's micro-batches of the README's model table: B=4, T=1024 and B=2, T=2048
            for (int shape : {SHAPE_3B, SHAPE_8B})
                for (const Linear& l : model_linears(family_config(shape)))
                    time_linear(&g, shape == SHAPE_3B ? "3B" : "8B", 4096, l, ok[1]);
        }
    }
    if (dev_selected(a, 2)) { // the largest GEMMs of a B=16, T=1024 step
        std::vector<Linear> ls = model_linears(full);
        const std::pair<Linear, int> cases[] = {{ls[2], FORWARD}, {ls[2], INPUT_GRAD}, {ls[2], WEIGHT_GRAD_BF16},
                                                {ls[3], FORWARD}, {ls[4], FORWARD}};
        for (const auto& c : cases) time_candidates(16384, c.first, c.second, !a.check_only);
    }
    gemm_destroy(&g);
    return dev_finish();
}
