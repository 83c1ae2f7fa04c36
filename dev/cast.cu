// dev/cast.cu: the cost the shadow weights remove. A linear layer's forward y = x @ W^T with x
// bf16 (tokens, in), W (out, in) and y bf16 (tokens, out), fp32 accumulation, through the
// trainer's cuBLASLt matmul(). The seed kept W in fp32 only, so autocast cast it to bf16 before
// every GEMM; the trainer's AdamW writes a bf16 shadow of W in the same pass as the update.
//
// build: make dev/cast
// run:   ./dev/cast          validate both versions, then time them
//        ./dev/cast K        version K only
//        ./dev/cast --check  validate only, no timing (what `make test` runs)
//
// versions:
//   1  cast_to_bf16 of the fp32 weight (kernels.cuh), then the GEMM on the cast copy: the seed.
//   2  [shadow weights] the GEMM on the bf16 shadow directly, no cast: the trainer.
// shapes: one LLaMA3.2-1B layer's four weight GEMMs of the forward, and lm_head, at the seed's
// 256 tokens (B 4 x T 64): qkv 3072x2048, attn_out 2048x2048, gate_up 16384x2048,
// down 2048x8192, lm_head 128256x2048 (weights out x in).
#include "common.h"

static const int TOKENS = 256;
typedef struct {
    const char* name;
    int out, in;
} WeightShape;
static const WeightShape SHAPES[] = {
    {"qkv", 3072, 2048}, {"attn_out", 2048, 2048}, {"gate_up", 16384, 2048}, {"down", 2048, 8192}, {"lm_head", 128256, 2048}};

// One linear layer's operands. `copies` weights (fp32 and their shadows) are rotated through so
// that a weight smaller than L2 still streams from DRAM, as it does once per step in training.
typedef struct {
    int tokens, out, in, copies;
    float* weight_f32;  // copies x (out, in): the fp32 masters
    bf16* shadow;       // copies x (out, in): bf16 of the masters, what the trainer's AdamW writes
    bf16* weight_cast;  // (out, in): version 1's cast output, reused by every call
    bf16* x;            // (tokens, in)
    bf16* y;            // (tokens, out)
} CastLinear;

static CastLinear linear_alloc(int tokens, int out, int in, int copies) {
    size_t n = (size_t)out * in;
    CastLinear L = {tokens, out, in, copies, dev_alloc<float>(copies * n), dev_alloc<bf16>(copies * n), dev_alloc<bf16>(n),
                dev_alloc<bf16>((size_t)tokens * in), dev_alloc<bf16>((size_t)tokens * out)};
    return L;
}
// Weights N(0, 0.02) from the trainer's init kernel (host generation of lm_head's 262M would take
// seconds), shadows by cast_to_bf16 as model_sync_shadow makes them; x N(0, 1) from the host.
static CastLinear linear_random(int tokens, int out, int in, int copies, std::vector<float>* x_host) {
    CastLinear L = linear_alloc(tokens, out, in, copies);
    size_t n = (size_t)copies * out * in;
    init_params(L.weight_f32, n, 0.0f, 0.02f, dev_seed() + out + in, 0);
    cast_to_bf16(L.shadow, L.weight_f32, n, 0);
    *x_host = from_bf16(to_bf16(random_normal((size_t)tokens * in)));
    CUDA_CHECK(cudaMemcpy(L.x, to_bf16(*x_host).data(), x_host->size() * sizeof(bf16), cudaMemcpyHostToDevice));
    return L;
}
static void linear_free(CastLinear& L) {
    void* all[] = {L.weight_f32, L.shadow, L.weight_cast, L.x, L.y};
    for (void* p : all) CUDA_CHECK(cudaFree(p));
}

// y = x @ W^T with weight copy `copy`, as the trainer's block_forward calls matmul.
static void linear_forward(int version, Gemm* g, const CastLinear& L, int copy) {
    size_t n = (size_t)L.out * L.in;
    const bf16* w = L.shadow + copy * n;
    if (version == 1) {
        cast_to_bf16(L.weight_cast, L.weight_f32 + copy * n, n, 0);
        w = L.weight_cast;
    }
    matmul(g, 0, L.y, L.x, w, L.tokens, L.out, L.in, false, true, false);
}

// ---- CPU reference ----

// y[o] = sum_k x[k] * w[o, k] in fp64 for one token row, from the bf16 values the GEMM reads.
static void linear_cpu_row(float* y, const float* x, const std::vector<float>& w, int out, int in) {
    for (int o = 0; o < out; o++) {
        double sum = 0.0;
        for (int k = 0; k < in; k++) sum += (double)x[k] * w[(size_t)o * in + k];
        y[o] = (float)sum;
    }
}

// Tolerances against the CPU: rtol 1e-2 for the bf16 output (its rounding is up to 2^-8
// relative, half an ulp), atol 1e-3 for outputs that cancel to about 0, where fp32 accumulation
// order over K terms decides the last bits.
static const float ATOL = 1e-3f, RTOL = 1e-2f;

// 64 tokens, a 256x128 weight, all outputs against the CPU; version 1's cast must equal the
// host's round to nearest even of the fp32 weight, bit for bit. Here the shadow comes from the
// host, so it is independent of the cast kernel.
static void validate_small(Gemm* g, const DevArgs& a, bool* ok) {
    const int tokens = 64, out = 256, in = 128;
    std::vector<float> x = from_bf16(to_bf16(random_normal((size_t)tokens * in))), w = random_normal((size_t)out * in);
    std::vector<float> w_bf16 = from_bf16(to_bf16(w)), ref((size_t)tokens * out);
    for (int t = 0; t < tokens; t++) linear_cpu_row(&ref[(size_t)t * out], &x[(size_t)t * in], w_bf16, out, in);
    CastLinear L = linear_alloc(tokens, out, in, 1);
    CUDA_CHECK(cudaMemcpy(L.x, to_bf16(x).data(), x.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(L.weight_f32, w.data(), w.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(L.shadow, to_bf16(w).data(), w.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    for (int version = 1; version <= 2; version++) {
        if (!dev_selected(a, version)) continue;
        dev_poison(L.y, ref.size());
        dev_poison(L.weight_cast, w.size());
        linear_forward(version, g, L, 0);
        char what[96];
        snprintf(what, sizeof(what), "v%d 64 tokens x 256x128 vs CPU", version);
        ok[version] &= dev_check(what, from_bf16(dev_download(L.y, ref.size())), ref, ATOL, RTOL);
        if (version == 1)
            ok[1] &= dev_check("v1 cast_to_bf16 == host bf16 (round to nearest even)",
                               from_bf16(dev_download(L.weight_cast, w.size())), w_bf16, 0.0f, 0.0f);
    }
    linear_free(L);
}

// A real shape: the first and last token rows against the CPU (from the shadow as read back),
// and, with both versions selected, their outputs equal bit for bit (same bf16 weights, same
// cuBLASLt plan: the cast adds time, not a difference).
static void validate_real(Gemm* g, const WeightShape& s, const DevArgs& a, bool* ok) {
    std::vector<float> x;
    CastLinear L = linear_random(TOKENS, s.out, s.in, 1, &x);
    std::vector<float> w = from_bf16(dev_download(L.shadow, (size_t)s.out * s.in)), ref(2 * (size_t)s.out);
    const int rows[2] = {0, TOKENS - 1};
    for (int r = 0; r < 2; r++) linear_cpu_row(&ref[r * (size_t)s.out], &x[(size_t)rows[r] * s.in], w, s.out, s.in);
    std::vector<float> y[3];
    char what[96];
    for (int version = 1; version <= 2; version++) {
        if (!dev_selected(a, version)) continue;
        dev_poison(L.y, (size_t)TOKENS * s.out);
        linear_forward(version, g, L, 0);
        y[version] = from_bf16(dev_download(L.y, (size_t)TOKENS * s.out));
        std::vector<float> got(y[version].begin(), y[version].begin() + s.out);
        got.insert(got.end(), y[version].end() - s.out, y[version].end());
        snprintf(what, sizeof(what), "v%d %s %dx%dx%d rows 0, %d vs CPU", version, s.name, TOKENS, s.out, s.in, TOKENS - 1);
        ok[version] &= dev_check(what, got, ref, ATOL, RTOL);
    }
    if (dev_selected(a, 1) && dev_selected(a, 2)) {
        snprintf(what, sizeof(what), "%s: cast + GEMM == GEMM on shadow, bit for bit", s.name);
        bool same = dev_check(what, y[1], y[2], 0.0f, 0.0f);
        ok[1] &= same, ok[2] &= same;
    }
    linear_free(L);
}

// ---- timing ----

static const char* const LABELS[] = {"", "1 cast, then GEMM", "2 GEMM on shadow (trainer)"};

static void time_shape(Gemm* g, const WeightShape& s, const DevArgs& a, const bool* ok) {
    int copies = (int)ceil(200e6 / (2.0 * s.out * s.in)); // 200 MB of bf16 weights, 4x L2
    std::vector<float> x;
    CastLinear L = linear_random(TOKENS, s.out, s.in, copies, &x);
    char size[64];
    snprintf(size, sizeof(size), "%s %dx%dx%d", s.name, TOKENS, s.out, s.in);
    for (int version = 1; version <= 2; version++) {
        if (!dev_selected(a, version)) continue;
        int k = 0;
        double ms = median_ms([&] { linear_forward(version, g, L, k++ % copies); });
        print_row("linear fwd", LABELS[version], size, ms, 0.0, 2.0 * TOKENS * s.out * s.in, ok[version]);
    }
    linear_free(L);
}

int main(int argc, char** argv) {
    DevArgs a = dev_args(argc, argv, 2);
    static Gemm g; // the trainer's matmul() state; large (its plan table): not on the stack
    gemm_create(&g);
    bool ok[3] = {true, true, true};
    validate_small(&g, a, ok);
    for (const WeightShape& s : SHAPES) validate_real(&g, s, a, ok);
    if (!a.check_only) {
        gemm_ceiling_tflops(); // measured before the table, so its line does not split it
        print_header();
        for (const WeightShape& s : SHAPES) time_shape(&g, s, a, ok);
    }
    gemm_destroy(&g);
    return dev_finish();
}
