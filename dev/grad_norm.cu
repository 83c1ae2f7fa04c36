// dev/grad_norm.cu: the global gradient norm behind gradient clipping and the NaN guard
// (kernels.cuh [clipping]):
//   sum_squares       partial[b] = sum of g[i]^2 over block b's fixed share of one gradient tensor
//                     (fp32 or bf16), at most SUMSQ_BLOCKS blocks
//   sum_squares_rows  the same over the wte gradient rows a step touched (sorted token ids, a row
//                     counted once, by the entry that owns it)
//   clip_guard        norm = sqrt(sum of all partials); grad_scale = min(1, clip / (norm + 1e-6));
//                     skip |= !isfinite(norm)
//   loss_guard        mean loss; skip = !isfinite(loss)
// Memory-bound: sum_squares reads each gradient once (2 bytes per bf16 element, 4 per fp32).
//
// build: make dev/grad_norm
// run:   ./dev/grad_norm          validate every version, then time sum_squares
//        ./dev/grad_norm K        version K only
//        ./dev/grad_norm --check  validate only, no timing (what `make test` runs)
//        ./dev/grad_norm --small  validate with every size below a 64th (what make sanitize runs)
//
// versions of sum_squares (sum_squares_rows, clip_guard and loss_guard have only the trainer's):
//   1  one atomicAdd per block into one float, on a grid that fills the GPU (8 blocks of 256 per
//      SM): the short way, whose sum rounds differently run to run. One atomic per block costs
//      nothing; against version 2 it shows what the fixed grid of SUMSQ_BLOCKS blocks costs.
//   2  the trainer's sum_squares: a fixed grid, one partial sum per block, added in a fixed order by
//      clip_guard: deterministic. Each row names the path its launcher's guard took.
// sizes: the LLaMA3.2-1B gradients the trainer launches it on: lm_head, qkv, attn_out, gate_up,
// down (bf16 with --bf16_grads, fp32 without) and an RMSNorm weight (fp32).
//
// Tolerances. Every square is added in fp32: each thread adds k of them in sequence (k = 4008 for
// lm_head: 262,668,288 over 256 blocks x 256 threads), a block's 256 sums add in a tree of depth
// 10 (two warp sums), and here clip_guard adds 2 partials per thread and another tree of 10. All
// terms are positive, so the sum's relative error is at most (k + 24) u, u = 2^-24 (2.4e-4 for
// lm_head): that bound is the tolerance (half of it for the norm, a square root). Expected well
// inside it: an fp32 emulation of the kernel in numpy gave -5.4e-6 for bf16 lm_head (the squares'
// short mantissas make round-half-even ties frequent, and they round down once the sum is even)
// and 1e-7 for fp32. A dropped or doubled element changes a sum of 2.6e8 squares by 4e-9 only, so
// coverage has its own exact check: the same tensor with every value +-1 or +-2, whose squares
// add exactly.
#include "common.h"

// ---- version 1: one atomicAdd per block ----

// out[0] += sum of g[i]^2, VEC per 16-byte load (1: scalar), grid-stride; one atomicAdd per block,
// in whatever order the blocks finish. Expects out[0] zeroed before the first call.
template <int VEC, typename G> __global__ void sum_squares_atomic_kernel(float* out, const G* g, size_t n) {
    float acc = block_sum(thread_sum_squares<VEC>(g, n)); // the trainer's per-thread loop
    if (threadIdx.x == 0) atomicAdd(out, acc);
}

// The trainer's launcher's guard and block count (kernels.cuh sum_squares), same inputs.
template <typename G> static bool uses_vec16(const G* g, size_t n) {
    return n % (16 / sizeof(G)) == 0 && aligned16(g);
}
template <typename G> static unsigned trainer_blocks(size_t n) {
    return std::min<unsigned>(SUMSQ_BLOCKS, ceil_div(n, (size_t)256 * (16 / sizeof(G))));
}

// Version 1's grid: 8 blocks of 256 threads per SM, fewer when n is small.
template <typename G> static unsigned atomic_blocks(size_t n, int sms) {
    return std::min<unsigned>(8 * sms, ceil_div(n, (size_t)256 * (16 / sizeof(G))));
}

// Version 1 adds into out[0]; version 2 writes out[0, trainer_blocks(n)).
template <typename G> static void sumsq_version(int version, float* out, const G* g, size_t n, int sms) {
    if (version == 2) return sum_squares(out, g, n, 0);
    if (uses_vec16(g, n)) sum_squares_atomic_kernel<16 / sizeof(G)><<<atomic_blocks<G>(n, sms), 256>>>(out, g, n);
    else sum_squares_atomic_kernel<1><<<atomic_blocks<G>(n, sms), 256>>>(out, g, n);
    LAUNCH_CHECK();
}

// ---- inputs, references and checks ----

static const size_t LM_HEAD = (size_t)128256 * 2048;
static const struct {
    size_t n;
    const char* name;
    bool bf16; // also launched on bf16 gradients (the matmul weights)
} TENSORS[] = {{LM_HEAD, "lm_head 128256x2048", true},
               {(size_t)3072 * 2048, "qkv 3072x2048", true},
               {(size_t)2048 * 2048, "attn_out 2048x2048", true},
               {(size_t)16384 * 2048, "gate_up 16384x2048", true},
               {(size_t)2048 * 8192, "down 2048x8192", true},
               {2048, "RMSNorm weight 2048", false}};
static const int N_TENSORS = sizeof(TENSORS) / sizeof(TENSORS[0]);
static const float GRAD_STD = 1e-2f;

// n gradients ~ N(0, GRAD_STD^2) made on the device (seeded from dev_seed()), fp32 or bf16.
static void fill_grads(float* g, size_t n) {
    init_params(g, n, 0.0f, GRAD_STD, ((uint64_t)rng_u32() << 32) | rng_u32(), 0);
}
static void fill_grads(bf16* g, size_t n) { fill_normal(g, n, GRAD_STD); }
static float host_float(float x) { return x; }
static float host_float(bf16 x) { return __bfloat162float(x); }
static void set_host(float& d, float x) { d = x; }
static void set_host(bf16& d, float x) { d = __float2bfloat16_rn(x); }
static const char* type_name(const float*) { return "fp32"; }
static const char* type_name(const bf16*) { return "bf16"; }

template <typename G> static double sum_squares_ref(const G* g, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)host_float(g[i]) * host_float(g[i]);
    return s;
}
static double sum_of(const std::vector<float>& v, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += v[i];
    return s;
}
// The bound of the header comment: k squares added in sequence per thread, then trees of depth 24 at most.
static double sumsq_rtol(size_t per_thread) { return (per_thread + 24) * 0x1p-24; }

// One value against its reference: |got - ref| <= rtol |ref| (NaN never passes); counted as dev_check.
static bool check_value(const char* what, double got, double ref, double rtol) {
    bool ok = fabs(got - ref) <= rtol * fabs(ref);
    printf("%s %-60s got %.9g ref %.9g (rel err %.1e, rtol %.1e)\n", ok ? "ok  " : "FAIL", what, got, ref,
           ref != 0.0 ? fabs(got - ref) / fabs(ref) : fabs(got), rtol);
    ok ? dev_passed++ : dev_failed++;
    return ok;
}
static bool check_true(const char* what, bool ok) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    ok ? dev_passed++ : dev_failed++;
    return ok;
}
static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

// ---- sum_squares ----

// Each element counted once (version 2): every value of the tensor replaced by +-1 or +-2 (sign and
// size from the random value), whose squares add exactly in fp32 (every partial stays below 2^24),
// so the partials' sum in fp64 must equal the reference exactly.
template <typename G>
static bool check_coverage(G* g, std::vector<G>& host, float* out, const char* what) {
    double exact = 0.0;
    for (G& x : host) {
        float f = host_float(x), q = (f < 0.0f ? -1.0f : 1.0f) * (fabsf(f) > GRAD_STD ? 2.0f : 1.0f);
        set_host(x, q);
        exact += q * q;
    }
    CUDA_CHECK(cudaMemcpy(g, host.data(), host.size() * sizeof(G), cudaMemcpyHostToDevice));
    dev_poison(out, SUMSQ_BLOCKS);
    sum_squares(out, g, host.size(), 0);
    return check_value(what, sum_of(dev_download(out, SUMSQ_BLOCKS), trainer_blocks<G>(host.size())), exact, 0.0);
}

// Fresh gradients of n elements, `offset` elements into their allocation; each selected version
// against the fp64 sum of squares; version 2 also writes its blocks' partials and no more (the
// rest of its slot keeps what the caller left there: zeros in the trainer), and covers every
// element once.
template <typename G>
static void validate_sum_squares(size_t n, size_t offset, const char* name, int sms, const DevArgs& a, bool* ok) {
    G* base = dev_alloc<G>(n + offset);
    G* g = base + offset;
    fill_grads(g, n);
    std::vector<G> host = dev_download(g, n);
    unsigned written = trainer_blocks<G>(n);
    double ref = sum_squares_ref(host.data(), n), rtol = sumsq_rtol(ceil_div(n, (size_t)written * 256));
    float* out = dev_alloc<float>(2 * SUMSQ_BLOCKS);
    char what[128];
    for (int version = 1; version <= 2; version++) {
        if (!dev_selected(a, version)) continue;
        if (version == 1) CUDA_CHECK(cudaMemset(out, 0, sizeof(float)));
        else dev_poison(out, 2 * SUMSQ_BLOCKS);
        sumsq_version(version, out, g, n, sms);
        // Version 1 writes out[0] alone (an atomic sum onto its zero): only that is read back.
        std::vector<float> got = dev_download(out, version == 1 ? 1 : 2 * SUMSQ_BLOCKS);
        snprintf(what, sizeof(what), "v%d %s %s %s: sum of squares", version, type_name(g),
                 uses_vec16(g, n) ? "vec16" : "scalar", name);
        ok[version] &= check_value(what, sum_of(got, version == 1 ? 1 : written), ref, rtol);
        if (version == 1) continue;
        bool rest_untouched = true;
        for (size_t i = written; i < got.size(); i++) rest_untouched &= bits(got[i]) == 0xFFFFFFFFu;
        snprintf(what, sizeof(what), "v2 %s %s: writes partial[0, %u) only", type_name(g), name, written);
        ok[2] &= check_true(what, rest_untouched);
        snprintf(what, sizeof(what), "v2 %s %s: every element once (+-1, +-2: exact)", type_name(g), name);
        ok[2] &= check_coverage(g, host, out, what);
    }
    CUDA_CHECK(cudaFree(base));
    CUDA_CHECK(cudaFree(out));
}

// ---- sum_squares_rows ----

// N token ids as token_sort leaves them (ascending), id = V u^3 for u uniform: the small ids repeat
// many times, as frequent tokens do in text.
static std::vector<int> sorted_tokens(int N, int V) {
    std::vector<int> t(N);
    for (int& x : t) x = std::min(V - 1, (int)(V * powf(rng_uniform(0.0f, 1.0f), 3.0f)));
    std::sort(t.begin(), t.end());
    return t;
}

// A (V, C) fp32 gradient random in every row (a row read that should not be shows), N sorted ids
// with repeats: the partials must add up to the distinct rows' squares, each row once. Each thread
// adds at most ceil(N / 256) * ceil(C / 256) squares: the tolerance is that count's bound.
static void validate_rows(int V, int C, int N, bool* ok) {
    std::vector<int> tokens = sorted_tokens(N, V);
    float* g = dev_alloc<float>((size_t)V * C);
    fill_grads(g, (size_t)V * C);
    int* tokens_dev = dev_upload(tokens);
    double ref = 0.0, with_repeats = 0.0;
    int rows = 0;
    std::vector<float> row(C);
    for (int j = 0; j < N; j++) {
        CUDA_CHECK(cudaMemcpy(row.data(), g + (size_t)tokens[j] * C, C * sizeof(float), cudaMemcpyDeviceToHost));
        double s = sum_squares_ref(row.data(), C);
        with_repeats += s;
        if (j == 0 || tokens[j - 1] != tokens[j]) {
            ref += s;
            rows++;
        }
    }
    float* out = dev_alloc<float>(2 * SUMSQ_BLOCKS);
    dev_poison(out, 2 * SUMSQ_BLOCKS);
    sum_squares_rows(out, g, tokens_dev, N, C, 0);
    std::vector<float> got = dev_download(out, 2 * SUMSQ_BLOCKS);
    int written = std::min(SUMSQ_BLOCKS, N);
    char what[128];
    snprintf(what, sizeof(what), "rows V%d C%d N%d: %d distinct rows (all N: %.6g)", V, C, N, rows, with_repeats);
    ok[2] &= check_value(what, sum_of(got, written), ref, sumsq_rtol((size_t)ceil_div(N, 256) * ceil_div(C, 256)));
    bool rest_untouched = true;
    for (size_t i = written; i < got.size(); i++) rest_untouched &= bits(got[i]) == 0xFFFFFFFFu;
    snprintf(what, sizeof(what), "rows V%d C%d N%d: writes partial[0, %d) only", V, C, N, written);
    ok[2] &= check_true(what, rest_untouched);
    void* all[] = {g, tokens_dev, out};
    for (void* p : all) CUDA_CHECK(cudaFree(p));
}

// ---- clip_guard over a step's gradients ----

// A model of one step's gradients: one layer's matrices and lm_head in one bf16 block, two RMSNorm
// weights in one fp32 block, and the wte rows of N sorted ids. One launch per tensor, each into its
// own SUMSQ_BLOCKS slot of one partial buffer zeroed once (a launch of fewer blocks leaves the rest
// of its slot at zero, every step), then clip_guard over the whole buffer.
static const int WTE_V = 128256, WTE_C = 2048;
// --small: each tensor (and the wte's rows) a 64th of the 1B's, the columns an 8th
static const int SMALL_DIV = 64;

// What the guard kernels read and write: step t's hyperparameters and the step's stats.
typedef struct {
    AdamWParams* h;    // one AdamWParams, on the device
    StepStats* stats;  // on the device
    AdamWParams fresh; // h as adamw_next_step writes it: grad_scale 1, skip 0
} Guards;
static Guards guards_create(void) {
    static const AdamWParams* step1 = dev_adamw_params({1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1});
    Guards g = {(AdamWParams*)dev_adamw_params_with(step1, 1.0f, 0), dev_alloc<StepStats>(1), {}};
    CUDA_CHECK(cudaMemcpy(&g.fresh, g.h, sizeof(AdamWParams), cudaMemcpyDeviceToHost));
    return g;
}
static void guards_free(Guards& g) {
    CUDA_CHECK(cudaFree(g.h));
    CUDA_CHECK(cudaFree(g.stats));
}
// A new step: h as adamw_next_step leaves it, with skip as the loss guard leaves it; the stats
// carry over from the last step (the run of bad steps).
static void next_step(const Guards& g, int skip) {
    AdamWParams h = g.fresh;
    h.skip = skip;
    CUDA_CHECK(cudaMemcpy(g.h, &h, sizeof(h), cudaMemcpyHostToDevice));
}
// The first step of a run: the stats zero.
static void reset_guards(const Guards& g, int skip) {
    next_step(g, skip);
    CUDA_CHECK(cudaMemset(g.stats, 0, sizeof(StepStats)));
}

typedef struct {
    bf16* mats;
    float *norms, *wte_grad, *partial;
    int *tokens, N, slots;
    int div, V, C;    // the sizes: TENSORS[k].n / div, the wte (V, C)
    Guards guards;
    double ref_sumsq; // fp64 sum of every gradient's square
} Step;

static Step step_create(int N, int div) {
    Step s;
    s.div = div, s.V = WTE_V / div, s.C = WTE_C / (div > 1 ? 8 : 1);
    const int V = s.V, C = s.C;
    size_t n_mats = 0;
    for (int k = 0; k < N_TENSORS; k++) n_mats += TENSORS[k].bf16 ? TENSORS[k].n / div : 0;
    s.mats = dev_alloc<bf16>(n_mats);
    s.norms = dev_alloc<float>(2 * C);
    s.wte_grad = dev_alloc<float>((size_t)V * C);
    fill_grads(s.mats, n_mats);
    fill_grads(s.norms, 2 * C);
    fill_grads(s.wte_grad, (size_t)V * C);
    std::vector<int> tokens = sorted_tokens(N, V);
    s.tokens = dev_upload(tokens);
    s.N = N;
    s.slots = N_TENSORS + 2; // the matrices, 2 norm weights, the wte rows
    s.partial = dev_alloc<float>((size_t)s.slots * SUMSQ_BLOCKS);
    CUDA_CHECK(cudaMemset(s.partial, 0, (size_t)s.slots * SUMSQ_BLOCKS * sizeof(float)));
    s.guards = guards_create();
    std::vector<bf16> mats = dev_download(s.mats, n_mats);
    std::vector<float> norms = dev_download(s.norms, 2 * C), row(C);
    s.ref_sumsq = sum_squares_ref(mats.data(), n_mats) + sum_squares_ref(norms.data(), 2 * C);
    for (int j = 0; j < N; j++) {
        if (j > 0 && tokens[j - 1] == tokens[j]) continue;
        CUDA_CHECK(cudaMemcpy(row.data(), s.wte_grad + (size_t)tokens[j] * C, C * sizeof(float),
                              cudaMemcpyDeviceToHost));
        s.ref_sumsq += sum_squares_ref(row.data(), C);
    }
    return s;
}
static void step_free(Step& s) {
    void* all[] = {s.mats, s.norms, s.wte_grad, s.partial, s.tokens};
    for (void* p : all) CUDA_CHECK(cudaFree(p));
    guards_free(s.guards);
}
// Every gradient's sum of squares, then clip_guard; *h and *stats: what it wrote.
static void norm_step(const Step& s, float clip, AdamWParams* h, StepStats* stats) {
    size_t off = 0;
    int slot = 0;
    for (int k = 0; k < N_TENSORS; k++) {
        if (!TENSORS[k].bf16) continue;
        sum_squares(s.partial + (size_t)slot++ * SUMSQ_BLOCKS, s.mats + off, TENSORS[k].n / s.div, 0);
        off += TENSORS[k].n / s.div;
    }
    for (int k = 0; k < 2; k++)
        sum_squares(s.partial + (size_t)slot++ * SUMSQ_BLOCKS, s.norms + k * s.C, s.C, 0);
    sum_squares_rows(s.partial + (size_t)slot++ * SUMSQ_BLOCKS, s.wte_grad, s.tokens, s.N, s.C, 0);
    clip_guard(s.guards.h, s.guards.stats, s.partial, s.slots * SUMSQ_BLOCKS, clip, 0);
    *h = dev_download(s.guards.h, 1)[0];
    *stats = dev_download(s.guards.stats, 1)[0];
}

// The norm against fp64 (the bound of lm_head's 4008 squares per thread, halved by the square
// root, plus the sqrt's rounding), the scale below and above the clip, determinism (a second run
// bit-identical: partials, norm, scale), a skip set before the norm (by the loss guard) kept, and a
// NaN in one gradient skipping the step.
static void validate_clip(int div, bool* ok) {
    Step s = step_create(16384, div);
    double norm = sqrt(s.ref_sumsq), rtol = sumsq_rtol(ceil_div(LM_HEAD / div, 256 * 256)) / 2 + 0x1p-23;
    AdamWParams h, h2;
    StepStats st, st2;
    float below = (float)(0.5 * norm), above = (float)(2.0 * norm);
    reset_guards(s.guards, 0);
    norm_step(s, below, &h, &st);
    std::vector<float> partial = dev_download(s.partial, (size_t)s.slots * SUMSQ_BLOCKS);
    ok[2] &= check_value("clip_guard: grad_norm (5 bf16 matrices, 2 norms, wte rows)", st.grad_norm, norm, rtol);
    ok[2] &= check_value("clip_guard: grad_scale, clip = norm / 2", h.grad_scale, below / (norm + 1e-6),
                         rtol + 1e-6);
    ok[2] &= check_true("clip_guard: finite norm, skip 0 and counted as a good step", !h.skip && !st.skipped);
    reset_guards(s.guards, 0);
    norm_step(s, above, &h2, &st2);
    ok[2] &= check_true("clip_guard: grad_scale 1 exactly, clip = 2 norm", h2.grad_scale == 1.0f);
    std::vector<float> partial2 = dev_download(s.partial, partial.size());
    ok[2] &= check_true("clip_guard: second run bit-identical (partials, grad_norm)",
                        !memcmp(partial.data(), partial2.data(), partial.size() * 4) &&
                            bits(st.grad_norm) == bits(st2.grad_norm));
    reset_guards(s.guards, 0);
    norm_step(s, below, &h2, &st2);
    ok[2] &= check_true("clip_guard: same clip again, grad_scale bit-identical",
                        bits(h.grad_scale) == bits(h2.grad_scale));
    reset_guards(s.guards, 1);
    norm_step(s, below, &h, &st);
    ok[2] &= check_true("clip_guard: a skip set by the loss guard stays set", h.skip == 1 && st.skipped == 1);
    uint16_t nan_bits = 0x7FC0; // a bf16 quiet NaN, into the middle of the second tensor (qkv)
    CUDA_CHECK(cudaMemcpy(s.mats + (LM_HEAD + TENSORS[1].n / 2) / div, &nan_bits, 2, cudaMemcpyHostToDevice));
    reset_guards(s.guards, 0);
    norm_step(s, below, &h, &st);
    ok[2] &= check_true("clip_guard: one NaN gradient: skip 1, grad_norm NaN, counted",
                        h.skip == 1 && isnan(st.grad_norm) && st.skipped == 1 && st.bad_in_row == 1);
    step_free(s);
}

// ---- loss_guard ----

// The mean of N losses in [0, 12] against fp64 (16 per thread, then a tree of 10: bound 26 u, plus
// the division), then NaN losses two steps in a row (skip, counted: bad_in_row 2), then a good step.
static void validate_loss_guard(int N, bool* ok) {
    Guards g = guards_create();
    std::vector<float> losses = random_uniform(N, 0.0f, 12.0f);
    float* losses_dev = dev_upload(losses);
    reset_guards(g, 0);
    loss_guard(g.h, g.stats, losses_dev, N, true, 0);
    ok[2] &= check_value("loss_guard: mean loss", dev_download(g.stats, 1)[0].loss, sum_of(losses, N) / N,
                         27 * 0x1p-24 + 0x1p-23);
    ok[2] &= check_true("loss_guard: finite loss, skip 0", dev_download(g.h, 1)[0].skip == 0);
    float nan = NAN;
    CUDA_CHECK(cudaMemcpy(losses_dev + rng_u32() % N, &nan, 4, cudaMemcpyHostToDevice));
    for (int k = 0; k < 2; k++) {
        next_step(g, 0);
        loss_guard(g.h, g.stats, losses_dev, N, true, 0);
    }
    StepStats st = dev_download(g.stats, 1)[0];
    ok[2] &= check_true("loss_guard: NaN loss twice: skip 1, bad_in_row 2, skipped_total 2",
                        dev_download(g.h, 1)[0].skip == 1 && st.bad_in_row == 2 && st.skipped_total == 2);
    CUDA_CHECK(cudaMemcpy(losses_dev, losses.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    next_step(g, 0);
    loss_guard(g.h, g.stats, losses_dev, N, true, 0);
    st = dev_download(g.stats, 1)[0];
    ok[2] &= check_true("loss_guard: then a good step: skip 0, bad_in_row 0, skipped_total 2",
                        dev_download(g.h, 1)[0].skip == 0 && st.bad_in_row == 0 && st.skipped_total == 2);
    guards_free(g);
    CUDA_CHECK(cudaFree(losses_dev));
}

// ---- timing ----

// Each tensor size on consecutive slices of one arena of lm_head's size, about 200 MB per timed
// call (at most 4096 launches: the 8 KB RMSNorm weight is launch-bound), so that every launch
// reads from DRAM as the large tensors do; the time is per launch.
template <typename G>
static void time_size(int version, const G* arena, size_t n, const char* name, float* out, int sms, bool ok) {
    size_t sets = std::min({LM_HEAD / n, (size_t)ceil(200e6 / (sizeof(G) * (double)n)), (size_t)4096});
    double ms = median_ms([&] {
        for (size_t k = 0; k < sets; k++) sumsq_version(version, out, arena + k * n, n, sms);
    }) / sets;
    char label[64], size[64];
    if (version == 1) snprintf(label, sizeof(label), "1 atomicAdd, %u blocks", atomic_blocks<G>(n, sms));
    else snprintf(label, sizeof(label), "2 trainer (%s, %u blocks)", uses_vec16(arena, n) ? "vec16" : "scalar",
                  trainer_blocks<G>(n));
    snprintf(size, sizeof(size), "%s %s", name, type_name(arena));
    print_row("sum_squares", label, size, ms, sizeof(G) * (double)n, 0.0, ok);
}
static void time_versions(const DevArgs& a, const bool* ok, int sms) {
    bf16* arena16 = dev_alloc<bf16>(LM_HEAD);
    float* arena32 = dev_alloc<float>(LM_HEAD);
    float* out = dev_alloc<float>(SUMSQ_BLOCKS);
    fill_grads(arena16, LM_HEAD);
    fill_grads(arena32, LM_HEAD);
    CUDA_CHECK(cudaMemset(out, 0, SUMSQ_BLOCKS * sizeof(float)));
    print_header();
    for (int k = 0; k < N_TENSORS; k++)
        for (int version = 1; version <= 2; version++) {
            if (!dev_selected(a, version)) continue;
            if (TENSORS[k].bf16) time_size(version, arena16, TENSORS[k].n, TENSORS[k].name, out, sms, ok[version]);
            time_size(version, arena32, TENSORS[k].n, TENSORS[k].name, out, sms, ok[version]);
        }
    void* all[] = {arena16, arena32, out};
    for (void* p : all) CUDA_CHECK(cudaFree(p));
}

int main(int argc, char** argv) {
    DevArgs a = dev_args(argc, argv, 2);
    int sms;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    bool ok[3] = {true, true, true};
    const int div = a.small ? SMALL_DIV : 1, V = WTE_V / div, C = WTE_C / (a.small ? 8 : 1);
    char name[64];
    for (int k = 0; k < N_TENSORS; k++) {
        snprintf(name, sizeof(name), a.small ? "%s / %d" : "%s", TENSORS[k].name, div);
        if (TENSORS[k].bf16) validate_sum_squares<bf16>(TENSORS[k].n / div, 0, name, sms, a, ok);
        validate_sum_squares<float>(TENSORS[k].n / div, 0, name, sms, a, ok);
    }
    // the scalar paths: an odd size, and a pointer one element off 16-byte alignment
    validate_sum_squares<bf16>(1000003, 0, "odd 1000003", sms, a, ok);
    validate_sum_squares<float>(1000003, 0, "odd 1000003", sms, a, ok);
    snprintf(name, sizeof(name), a.small ? "attn_out / %d misaligned by 1" : "attn_out misaligned by 1", div);
    validate_sum_squares<bf16>(TENSORS[2].n / div, 1, name, sms, a, ok);
    validate_sum_squares<float>(TENSORS[2].n / div, 1, name, sms, a, ok);
    if (dev_selected(a, 2)) {
        validate_rows(1000, 264, 3000, ok); // most rows, many times each; C not a multiple of 256
        validate_rows(V, C, 200, ok);       // fewer entries than SUMSQ_BLOCKS
        validate_rows(V, C, 16384, ok);     // a large batch
        validate_clip(div, ok);
        validate_loss_guard(16384, ok);
    }
    if (!a.check_only) {
        copy_ceiling_gbs(); // measured before the table, so its line does not split it
        time_versions(a, ok, sms);
    }
    return dev_finish();
}
