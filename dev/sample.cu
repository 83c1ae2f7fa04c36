// dev/sample.cu: the next token from one row of V bf16 logits (kernels.cuh sample_token), chosen
// as HF generate does, with a uniform u in [0, 1) drawn on the host:
//   temperature 0: argmax, the lowest index among equal maxima (torch.argmax);
//   temperature > 0: softmax(logits / temperature) over the logits >= the top_k-th largest (ties
//   at that threshold kept, as TopKLogitsWarper; top_k 0 or >= V keeps all), then the first
//   index whose cumulative probability exceeds u.
// NaN logits count as -inf. One block does it all: it runs once per generated token, outside the
// training step, so what matters is its latency, us per token. The rate column is the row's 2V
// bytes over that time; the kernel reads the row 2 (greedy), 3 (sampling) or 19 times (top-k
// filtering), the re-reads mostly from L2.
//
// build: make dev/sample
// run:   ./dev/sample          validate against a CPU reference, then time
//        ./dev/sample 1        the same (there is one version)
//        ./dev/sample --check  validate only, no timing (what `make test` runs)
//
// versions: 1  the trainer's sample_token (../kernels.cuh): an argmax pass; top_k's threshold
//              bisected over the 16-bit keys of the bf16 logits (16 counting passes, exact); the
//              weights summed per thread over contiguous chunks, a block scan of the chunk sums,
//              and one chunk rescanned for the token.
// checks: V = 1000 and 128256 (16-byte loads); 1, 7, 1001 and 128256 one element past alignment
// (one bf16 per load). Greedy on random rows, planted ties of the maximum, NaNs, zeros of both signs. Sampling at
// several (temperature, top_k), top_k = 1 against greedy, rows of small integers (ties at every
// top-k threshold), NaN, +inf and all -inf rows; each against the fp64 reference for uniforms 0,
// the largest float below 1, random ones, and the midpoints of random kept tokens' intervals.
#include <functional>

#include "common.h"

// A draw off by one token is accepted when u lies within this much of the two tokens' boundary
// (in cumulative probability). The kernel's cumulative sums are fp32: expf's and the division's
// roundings cost at most about E_p|x - max| / temperature * 2^-23 <= ln(V) * 2^-23 of the total,
// the chunk sum, the scan and the rescan add at most ~280 fp32 roundings (~1.7e-5): together at
// most ~2e-5. The reference sums in fp64.
static const double BOUNDARY_TOL = 5e-5;

// ---- CPU reference (fp64) ----

static double logit_or_ninf(float x) { return isnan(x) ? -INFINITY : (double)x; }

// torch.argmax with NaN as -inf: the lowest index among equal maxima (-0 == +0).
static int argmax_cpu(const std::vector<float>& x) {
    int best = 0;
    for (int i = 1; i < (int)x.size(); i++)
        if (logit_or_ninf(x[i]) > logit_or_ninf(x[best])) best = i;
    return best;
}

// HF's sampling distribution: weights exp((x - max) / temperature) on the logits >= the top_k-th
// largest (on all when top_k is 0 or >= V), 0 elsewhere, and their cumulative sums normalised to
// end at 1. Empty when the largest logit is not finite: the kernel then returns the argmax.
typedef struct {
    std::vector<double> w, cum;
} Distribution;

static Distribution distribution_cpu(const std::vector<float>& x, float temperature, int top_k) {
    int V = (int)x.size();
    std::vector<double> v(V);
    for (int i = 0; i < V; i++) v[i] = logit_or_ninf(x[i]);
    double mx = *std::max_element(v.begin(), v.end()), threshold = -INFINITY, run = 0.0;
    Distribution d;
    if (!isfinite(mx)) return d;
    if (top_k > 0 && top_k < V) {
        std::vector<double> sorted = v;
        std::nth_element(sorted.begin(), sorted.begin() + top_k - 1, sorted.end(), std::greater<double>());
        threshold = sorted[top_k - 1];
    }
    d.w.resize(V);
    d.cum.resize(V);
    for (int i = 0; i < V; i++) {
        d.w[i] = v[i] >= threshold ? exp((v[i] - mx) / temperature) : 0.0;
        run += d.w[i];
        d.cum[i] = run;
    }
    for (double& c : d.cum) c /= run;
    return d;
}

// The first index whose cumulative probability exceeds u.
static int draw_cpu(const Distribution& d, double u) {
    return (int)(std::upper_bound(d.cum.begin(), d.cum.end(), u) - d.cum.begin());
}

// The kernel's token g for uniform u: SAME as the reference's draw; NEAR_BOUNDARY when g is another
// token with weight whose interval [cum[g-1], cum[g]) comes within BOUNDARY_TOL of u; else WRONG.
// With no finite maximum the answer is the argmax, exactly.
enum Verdict { SAME, NEAR_BOUNDARY, WRONG };
static Verdict judge(const Distribution& d, int argmax, float u, int g) {
    if (d.cum.empty()) return g == argmax ? SAME : WRONG;
    if (g == draw_cpu(d, u)) return SAME;
    if (g < 0 || g >= (int)d.w.size() || !(d.w[g] > 0.0)) return WRONG;
    double lo = g > 0 ? d.cum[g - 1] : 0.0;
    return lo - BOUNDARY_TOL <= u && u < d.cum[g] + BOUNDARY_TOL ? NEAR_BOUNDARY : WRONG;
}

// ---- rows ----

static std::vector<float> normal_row(int V) { return from_bf16(to_bf16(random_normal(V, 2.0f))); }

// Integers in [-6, 6]: every top-k threshold falls on a value many logits share.
static std::vector<float> integer_row(int V) {
    std::vector<float> x(V);
    for (float& v : x) v = (float)((int)(rng_u32() % 13) - 6);
    return x;
}

// `n` distinct random indices of a row of V (all of them when n >= V).
static std::vector<int> random_indices(int V, int n) {
    std::vector<int> idx;
    while ((int)idx.size() < std::min(n, V)) {
        int i = (int)(rng_u32() % V);
        if (std::find(idx.begin(), idx.end(), i) == idx.end()) idx.push_back(i);
    }
    return idx;
}

// Sets `n` random entries to one value above the row's maximum (a tie of the maximum when n > 1).
static void plant_max(std::vector<float>& x, int n) {
    float top = bf16_round(logit_or_ninf(x[argmax_cpu(x)]) + 1.0f);
    for (int i : random_indices((int)x.size(), n)) x[i] = top;
}

// ---- the kernel ----

// sample_token on the row, placed `offset` elements past a 256-byte boundary (1: misaligned, one
// bf16 per load), once per uniform; the output is poisoned (-1) before every call.
static std::vector<int> sample_gpu(const std::vector<float>& x, int offset, float temperature, int top_k,
                                   const std::vector<float>& uniforms) {
    int V = (int)x.size();
    bf16* buf = dev_alloc<bf16>(V + offset);
    upload_into(buf + offset, x);
    int* token = dev_alloc<int>(1);
    std::vector<int> got;
    for (float u : uniforms) {
        dev_poison(token, 1);
        sample_token(token, buf + offset, V, temperature, top_k, u, 0);
        got.push_back(dev_download(token, 1)[0]);
    }
    CUDA_CHECK(cudaFree(buf));
    CUDA_CHECK(cudaFree(token));
    return got;
}

static void report(bool ok, const char* what, const char* detail) {
    printf("%s %-58s %s\n", ok ? "ok  " : "FAIL", what, detail);
    ok ? dev_passed++ : dev_failed++;
}

// ---- validation ----

typedef struct {
    int V, offset, draws; // draws: random uniforms (and as many midpoints) per sampling check
} Shape;
// The rows checked; with --small the vocabulary's two rows are V = 20000 (20 elements a thread, as
// against 125: the same loops) and each sampling check draws 4 random uniforms and 4 midpoints,
// not 16 and 16 (every draw is a launch).
static std::vector<Shape> shapes(const DevArgs& a) {
    int large = a.small ? 20000 : 128256, draws = a.small ? 4 : 16;
    return {{1, 0, draws}, {7, 0, draws}, {1000, 0, draws}, {1001, 0, draws}, {large, 0, draws}, {large, 1, draws}};
}

static const char* path_of(int V, int offset) {
    return V % 8 == 0 && offset % 8 == 0 ? "16-byte loads" : "one bf16 per load";
}

static bool check_greedy(const char* row_name, const std::vector<float>& x, int offset, int top_k = 0) {
    int ref = argmax_cpu(x), got = sample_gpu(x, offset, 0.0f, top_k, {0.5f})[0];
    char what[128], detail[64];
    snprintf(what, sizeof(what), "greedy V=%zu %s (%s)", x.size(), row_name, path_of((int)x.size(), offset));
    snprintf(detail, sizeof(detail), "got %d, expected %d", got, ref);
    report(got == ref, what, detail);
    return got == ref;
}

// Greedy on each shape: a random row; temperature 0 ignoring top_k; 4 planted maxima (the lowest
// index must win) after NaNs at index 0 and 3 random places; a row of negatives whose maximum is a
// -0 and a +0 (the first of the two must win); a row of -inf and NaN only (index 0).
static bool validate_greedy(const DevArgs& a) {
    bool ok = true;
    for (const Shape& sh : shapes(a)) {
        std::vector<float> x = normal_row(sh.V);
        ok &= check_greedy("random", x, sh.offset);
        ok &= check_greedy("random, top_k=5", x, sh.offset, 5);
        x[0] = NAN;
        for (int i : random_indices(sh.V, 3)) x[i] = NAN;
        plant_max(x, 4);
        ok &= check_greedy("NaNs and 4 tied maxima", x, sh.offset);
        if (sh.V < 2) continue;
        for (float& v : x) v = bf16_round(-1.0f - fabsf(rng_normal()));
        std::vector<int> z = random_indices(sh.V, 2);
        x[z[0]] = rng_u32() % 2 ? -0.0f : 0.0f;
        x[z[1]] = signbit(x[z[0]]) ? 0.0f : -0.0f;
        ok &= check_greedy("-0 and +0 tied maxima", x, sh.offset);
        for (float& v : x) v = rng_u32() % 2 ? -INFINITY : NAN;
        ok &= check_greedy("-inf and NaN only", x, sh.offset);
    }
    return ok;
}

// Draws with uniforms 0, the largest float below 1, sh.draws random ones and the midpoints of as
// many random kept tokens' intervals, each judged against the reference. x: sh.V logits.
static bool check_sampling(const char* row_name, const std::vector<float>& x, const Shape& sh, float temperature,
                           int top_k) {
    int V = sh.V, offset = sh.offset, n = sh.draws;
    Distribution d = distribution_cpu(x, temperature, top_k);
    std::vector<float> us = {0.0f, 0x1.fffffep-1f};
    for (int j = 0; j < n; j++) us.push_back(rng_uniform(0.0f, 1.0f));
    std::vector<int> kept_idx;
    for (int i = 0; i < (int)d.w.size(); i++)
        if (d.w[i] > 0.0) kept_idx.push_back(i);
    int kept = (int)kept_idx.size();
    for (int j = 0; j < n && kept > 0; j++) {
        int t = kept_idx[rng_u32() % kept];
        us.push_back((float)(((t > 0 ? d.cum[t - 1] : 0.0) + d.cum[t]) / 2));
    }
    std::vector<int> got = sample_gpu(x, offset, temperature, top_k, us);
    int count[3] = {0, 0, 0}, bad = -1, argmax = argmax_cpu(x);
    for (size_t j = 0; j < us.size(); j++) {
        Verdict v = judge(d, argmax, us[j], got[j]);
        count[v]++;
        if (v == WRONG && bad < 0) bad = (int)j;
    }
    char what[128], detail[160];
    snprintf(what, sizeof(what), "T=%g top_k=%d V=%d %s (%s)", temperature, top_k, V, row_name,
             path_of(V, offset));
    int len = snprintf(detail, sizeof(detail), "%zu draws: %d same, %d near a boundary; %d of %d kept",
                       us.size(), count[SAME], count[NEAR_BOUNDARY], kept, V);
    if (bad >= 0)
        snprintf(detail + len, sizeof(detail) - len, "; u=%.9g got %d, expected %d", us[bad], got[bad],
                 d.cum.empty() ? argmax : draw_cpu(d, us[bad]));
    report(bad < 0, what, detail);
    return bad < 0;
}

// top_k = 1 with a unique maximum: every draw is the greedy token.
static bool check_top1_is_greedy(int V, int offset) {
    std::vector<float> x = normal_row(V);
    plant_max(x, 1);
    int greedy = sample_gpu(x, offset, 0.0f, 0, {0.5f})[0];
    std::vector<float> us = {0.0f, 0x1.fffffep-1f};
    for (int j = 0; j < 16; j++) us.push_back(rng_uniform(0.0f, 1.0f));
    std::vector<int> got = sample_gpu(x, offset, 1.0f, 1, us);
    int same = (int)std::count(got.begin(), got.end(), greedy);
    char what[128], detail[64];
    snprintf(what, sizeof(what), "T=1 top_k=1 equals greedy, V=%d (%s)", V, path_of(V, offset));
    snprintf(detail, sizeof(detail), "%d of %zu draws are token %d", same, got.size(), greedy);
    bool ok = same == (int)got.size() && greedy == argmax_cpu(x);
    report(ok, what, detail);
    return ok;
}

// Temperatures from peaked (0.05) to flat (5), top_k off, small, large, V - 1 and V, on every shape.
static bool validate_sampling(const DevArgs& a) {
    bool ok = true;
    const struct {
        float temperature;
        int top_k;
    } settings[] = {{1.0f, 0}, {0.7f, 50}, {1.5f, 1000}, {0.05f, 0}, {5.0f, 0}, {1.0f, 1}, {0.8f, 10}};
    for (const Shape& sh : shapes(a)) {
        std::vector<float> x = normal_row(sh.V);
        for (const auto& s : settings) ok &= check_sampling("random", x, sh, s.temperature, s.top_k);
        ok &= check_sampling("random", x, sh, 1.0f, sh.V - 1);
        ok &= check_sampling("random", x, sh, 1.0f, sh.V);
        x = integer_row(sh.V);
        for (int k : {1, 37, 100, sh.V / 6}) ok &= check_sampling("integers", x, sh, 1.0f, k);
        x = normal_row(sh.V);
        plant_max(x, 3);
        ok &= check_sampling("3 tied maxima", x, sh, 1.0f, 1);
        for (int i : random_indices(sh.V, 8)) x[i] = rng_u32() % 2 ? -INFINITY : NAN;
        ok &= check_sampling("NaNs and -infs", x, sh, 1.0f, 0);
        ok &= check_sampling("NaNs and -infs", x, sh, 0.7f, 10);
        for (int i : random_indices(sh.V, 2)) x[i] = INFINITY;
        ok &= check_sampling("+inf (the argmax)", x, sh, 1.0f, 0);
        for (float& v : x) v = rng_u32() % 2 ? -INFINITY : NAN;
        ok &= check_sampling("-inf and NaN only (index 0)", x, sh, 1.0f, 0);
        ok &= check_top1_is_greedy(sh.V, sh.offset);
    }
    return ok;
}

// ---- timing ----

// V = 128256 from the device's generator. The row stays in L2 between calls, as the LM head's
// output is when it gets sampled.
static void time_sample(bool ok) {
    const int V = 128256;
    bf16* logits = dev_alloc<bf16>(V);
    fill_normal(logits, V, 2.0f);
    int* token = dev_alloc<int>(1);
    const struct {
        const char* name;
        float temperature;
        int top_k;
    } runs[] = {{"greedy", 0.0f, 0}, {"T=1", 1.0f, 0}, {"T=0.7 top_k=50", 0.7f, 50}};
    for (const auto& r : runs) {
        double ms = median_ms([&] { sample_token(token, logits, V, r.temperature, r.top_k, 0.5f, 0); });
        char size[96];
        snprintf(size, sizeof(size), "V=%d, %s: %.1f us/token", V, r.name, ms * 1e3);
        print_row("sample_token", "1 trainer", size, ms, 2.0 * V, 0.0, ok);
    }
    CUDA_CHECK(cudaFree(logits));
    CUDA_CHECK(cudaFree(token));
}

int main(int argc, char** argv) {
    DevArgs a = dev_args(argc, argv, 1);
    bool ok = validate_greedy(a);
    ok &= validate_sampling(a);
    if (!a.check_only) {
        copy_ceiling_gbs(); // measured before the table, so its line does not split it
        print_header();
        time_sample(ok);
    }
    return dev_finish();
}
