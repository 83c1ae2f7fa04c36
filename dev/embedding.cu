// dev/embedding.cu: the token-embedding gradient and its AdamW step, V = 128256, C = 2048
// (LLaMA 3.2 1B), for a batch of N = B*T tokens:
//   backward: grad[t, :] = sum of dresid[n, :] over the positions n holding token t (fp32)
//   AdamW:    torch.optim.AdamW on wte (params, m, v: fp32, V x C) with that gradient
// A step touches few of the V rows (256 tokens in the seed's step, and text repeats its frequent
// tokens), which is what the seed's last optimisation [sparse rows] exploits.
//
// Build: make dev/embedding
// Run:   ./dev/embedding          validate both versions, then time them (N = 256 and 16384)
//        ./dev/embedding K        only version K
//        ./dev/embedding --check  validate only (what `make test` runs)
// Versions, each timed end to end (backward + AdamW):
//   1 = dense, where the seed started: cudaMemsetAsync of the whole (V, C) gradient, an atomicAdd
//       scatter of every position's dresid row into grad[token], then AdamW over all V*C elements
//       (adamw_dense<false> in kernels.cuh): untouched rows move too (m, v decay, p by weight decay)
//   2 = the trainer's [sparse rows]: token_sort, embedding_backward (deterministic per-row sums into
//       the persistent gradient, zero outside the touched rows), adamw_sparse_rows (the touched
//       rows only, zeroing their gradient rows again): lazy Adam, untouched rows unchanged; also
//       checked on a step the NaN guard skips (p, m, v unchanged, gradient rows still zeroed)
// Token ids are drawn Zipf-like (P(id) ~ 1/(id + 1), many repeats, as in text) or uniform over V.
#include "common.h"

// ---- version 1: dense ----

// Every position's dresid row added into grad[token] by atomicAdd, one thread per element, grid
// over N * C (the seed's scatter; the order of the adds, and so the rounding, varies run to run).
__global__ void embedding_scatter_kernel(float* grad, const float* dresid, const int* tokens, int N, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    atomicAdd(grad + (size_t)tokens[i / C] * C + i % C, dresid[i]);
}

// The (V, C) fp32 tensors of wte that the step reads and writes.
typedef struct {
    int V, C;
    float *params, *m, *v, *grad;
} Wte;

static Wte wte_alloc(int V, int C) {
    size_t n = (size_t)V * C;
    Wte t = {V, C, dev_alloc<float>(n), dev_alloc<float>(n), dev_alloc<float>(n), dev_alloc<float>(n)};
    return t;
}
static void wte_free(Wte* t) {
    float* p[] = {t->params, t->m, t->v, t->grad};
    for (float* q : p) CUDA_CHECK(cudaFree(q));
}

// ---- version 2: sparse rows (the trainer) ----

// Set up as model_create does: one allocation for the sorted ids, their positions and 0..n-1,
// end_bit covering the largest id, and cub's scratch sized for n keys.
static TokenSorter sorter_create(int n, int V) {
    TokenSorter ts;
    ts.sorted_tokens = dev_alloc<int>((size_t)3 * n);
    ts.sorted_positions = ts.sorted_tokens + n;
    std::vector<int> iota(n);
    for (int i = 0; i < n; i++) iota[i] = i;
    CUDA_CHECK(cudaMemcpy(ts.sorted_tokens + 2 * n, iota.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    ts.iota = ts.sorted_tokens + 2 * n;
    for (ts.end_bit = 1; (1 << ts.end_bit) < V; ts.end_bit++) {}
    ts.temp = NULL;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, ts.temp_bytes, ts.sorted_tokens, ts.sorted_tokens, ts.iota,
                                               ts.sorted_positions, n, 0, ts.end_bit));
    ts.temp = dev_alloc<char>(ts.temp_bytes);
    return ts;
}
static void sorter_free(TokenSorter* ts) {
    CUDA_CHECK(cudaFree(ts->sorted_tokens));
    CUDA_CHECK(cudaFree(ts->temp));
}

// ---- one step of either version ----

static void step_backward(int version, const Wte* t, TokenSorter* ts, const float* dresid, const int* tokens, int N) {
    if (version == 1) {
        CUDA_CHECK(cudaMemsetAsync(t->grad, 0, (size_t)t->V * t->C * sizeof(float)));
        embedding_scatter_kernel<<<ceil_div((size_t)N * t->C, 256), 256>>>(t->grad, dresid, tokens, N, t->C);
        LAUNCH_CHECK();
    } else {
        token_sort(ts, tokens, N, 0);
        embedding_backward(t->grad, dresid, ts, N, t->C, 0);
    }
}
static void step_adamw(int version, const Wte* t, const TokenSorter* ts, int N, const AdamWParams* h, int sms) {
    if (version == 1) adamw_dense<false>(t->params, t->m, t->v, t->grad, NULL, (size_t)t->V * t->C, 0, h, true, sms, 0);
    else adamw_sparse_rows(t->params, t->m, t->v, t->grad, ts->sorted_tokens, N, t->C, 0, h, 0);
}

// Step 3 of AdamW(lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1): weight decay and the
// bias corrections all show in the result.
static const AdamWStep STEP = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3};
static const AdamWParams* H_device(void) { // where the kernels read STEP's hyperparameters
    static const AdamWParams* h = dev_adamw_params(STEP);
    return h;
}

// Fewest bytes each version moves. Dense: per table element the memset 4 and AdamW 28 (grad, p,
// m, v read; p, m, v written), and the scatter's dresid reads (its atomics land in rows the memset
// just wrote). Sparse rows: per touched element the backward's read and write of the gradient 8,
// AdamW 28 and the zeroing 4, and the dresid reads; the sort's few ints are left out.
static double step_bytes(int version, int V, int C, int N, size_t touched) {
    double dresid = 4.0 * N * C;
    return version == 1 ? 32.0 * V * C + dresid : 40.0 * touched * C + dresid;
}

// ---- CPU reference (AdamW's is common.h's adamw_cpu) ----

enum Dist { ZIPF, UNIFORM };
static const char* DIST_NAMES[] = {"zipf", "uniform"};

static std::vector<int> random_tokens(int N, int V, Dist dist) {
    std::vector<int> tokens(N);
    if (dist == UNIFORM) {
        for (int& t : tokens) t = rng_u32() % V;
        return tokens;
    }
    std::vector<double> cdf(V);
    double sum = 0.0;
    for (int i = 0; i < V; i++) cdf[i] = sum += 1.0 / (i + 1);
    for (int& t : tokens) t = std::upper_bound(cdf.begin(), cdf.end(), rng_uniform(0.0f, 1.0f) * sum) - cdf.begin();
    return tokens;
}
// The distinct ids, ascending: the rows the step touches.
static std::vector<int> touched_rows(std::vector<int> tokens) {
    std::sort(tokens.begin(), tokens.end());
    tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
    return tokens;
}

// (V, C) gradient: per-row fp64 sums of dresid, zero in untouched rows.
static std::vector<float> grad_ref(const std::vector<float>& dresid, const std::vector<int>& tokens,
                                   const std::vector<int>& touched, int V, int C) {
    std::vector<double> sums(touched.size() * C, 0.0);
    for (size_t n = 0; n < tokens.size(); n++) {
        size_t j = std::lower_bound(touched.begin(), touched.end(), tokens[n]) - touched.begin();
        for (int c = 0; c < C; c++) sums[j * C + c] += dresid[n * C + c];
    }
    std::vector<float> grad((size_t)V * C, 0.0f);
    for (size_t j = 0; j < touched.size(); j++)
        for (int c = 0; c < C; c++) grad[(size_t)touched[j] * C + c] = (float)sums[j * C + c];
    return grad;
}

// ---- validation ----

// One validation case: host inputs and reference gradient, and their device copies (the initial
// Adam state p0, m0, v0 is copied into the Wte before each version runs).
typedef struct {
    int V, C, N;
    char label[40];
    std::vector<int> tokens, touched;
    std::vector<float> dresid, p0, m0, v0, grad; // p0, m0, v0, grad: (V, C)
    float *p0_dev, *m0_dev, *v0_dev, *dresid_dev;
    int* tokens_dev;
} Case;

// Removes the given rows (ascending ids) of a (rows, C) array and returns them; the rest stay packed.
static std::vector<float> take_rows(std::vector<float>& a, const std::vector<int>& ids, int C) {
    std::vector<float> taken;
    taken.reserve(ids.size() * C);
    size_t kept = 0, next = 0;
    for (size_t r = 0; r < a.size() / C; r++) {
        if (next < ids.size() && (size_t)ids[next] == r) {
            taken.insert(taken.end(), a.begin() + r * C, a.begin() + (r + 1) * C), next++;
        } else {
            if (kept != r) std::copy(a.begin() + r * C, a.begin() + (r + 1) * C, a.begin() + kept * C);
            kept++;
        }
    }
    a.resize(kept * C);
    return taken;
}

// A (V, C) array from the device against its reference: the touched rows within (atol, rtol),
// the other rows within (atol_rest, rtol_rest).
static bool check_rows(int version, const char* what, std::vector<float> got, std::vector<float> ref, const Case& c,
                       float atol, float rtol, float atol_rest, float rtol_rest) {
    std::vector<float> got_touched = take_rows(got, c.touched, c.C), ref_touched = take_rows(ref, c.touched, c.C);
    char name[96];
    snprintf(name, sizeof(name), "v%d %s, touched rows (%s)", version, what, c.label);
    bool ok = dev_check(name, got_touched, ref_touched, atol, rtol);
    snprintf(name, sizeof(name), "v%d %s, other rows (%s)", version, what, c.label);
    if (!got.empty()) ok &= dev_check(name, got, ref, atol_rest, rtol_rest);
    return ok;
}

// Tolerances: grad, touched rows: sums of a few O(1) fp32 terms (in any order in version 1):
// rtol 1e-5 + atol 1e-6 where they cancel; every other row exactly 0. p, m, v, from the same
// gradient: a handful of fp32 roundings against fp64: rtol 1e-6 (+ atol 1e-6 for p and 1e-7 for m,
// whose terms can cancel; v only adds positive terms). Untouched rows: version 1 the same (the dense update with a zero
// gradient), version 2 bit-exact (lazy Adam leaves them alone). Version 2 leaves grad all zero.
static bool check_version(int version, const Case& c, const Wte* t, TokenSorter* ts, int sms) {
    size_t VC = (size_t)c.V * c.C;
    CUDA_CHECK(cudaMemcpy(t->params, c.p0_dev, VC * sizeof(float), cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(t->m, c.m0_dev, VC * sizeof(float), cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(t->v, c.v0_dev, VC * sizeof(float), cudaMemcpyDeviceToDevice));
    // version 1 writes the whole gradient; version 2 needs it zero outside the touched rows on
    // entry, the state the trainer keeps between steps
    if (version == 1) dev_poison(t->grad, VC);
    else CUDA_CHECK(cudaMemset(t->grad, 0, VC * sizeof(float)));
    step_backward(version, t, ts, c.dresid_dev, c.tokens_dev, c.N);
    std::vector<float> grad = dev_download(t->grad, VC);
    step_adamw(version, t, ts, c.N, H_device(), sms);
    // the reference AdamW (common.h adamw_cpu) takes the gradient the kernel produced (checked
    // against fp64 below), so that the p, m, v checks see the Adam step's own rounding only
    std::vector<float> p = c.p0, m = c.m0, v = c.v0;
    if (version == 1) adamw_cpu(p.data(), m.data(), v.data(), grad.data(), VC, STEP);
    else
        for (int r : c.touched) {
            size_t o = (size_t)r * c.C;
            adamw_cpu(p.data() + o, m.data() + o, v.data() + o, grad.data() + o, c.C, STEP);
        }
    bool ok = check_rows(version, "grad", std::move(grad), c.grad, c, 1e-6f, 1e-5f, 0.0f, 0.0f);
    float rest = version == 1 ? 1.0f : 0.0f;
    ok &= check_rows(version, "p", dev_download(t->params, VC), std::move(p), c, 1e-6f, 1e-6f, rest * 1e-6f,
                     rest * 1e-6f);
    ok &= check_rows(version, "m", dev_download(t->m, VC), std::move(m), c, 1e-7f, 1e-6f, rest * 1e-7f,
                     rest * 1e-6f);
    ok &= check_rows(version, "v", dev_download(t->v, VC), std::move(v), c, 0.0f, 1e-6f, 0.0f, rest * 1e-6f);
    if (version == 2)
        ok &= check_rows(version, "grad after AdamW", dev_download(t->grad, VC), std::vector<float>(VC, 0.0f), c,
                         0.0f, 0.0f, 0.0f, 0.0f);
    return ok;
}

// A step the NaN guard skips (h->skip = 1) on version 2: adamw_sparse_rows leaves p, m, v as they
// were, bit for bit, and still zeroes the touched gradient rows (the next backward adds into them).
static bool check_skipped(const Case& c, const Wte* t, TokenSorter* ts) {
    size_t VC = (size_t)c.V * c.C;
    CUDA_CHECK(cudaMemcpy(t->params, c.p0_dev, VC * sizeof(float), cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(t->m, c.m0_dev, VC * sizeof(float), cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(t->v, c.v0_dev, VC * sizeof(float), cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemset(t->grad, 0, VC * sizeof(float)));
    step_backward(2, t, ts, c.dresid_dev, c.tokens_dev, c.N);
    const AdamWParams* skip = dev_adamw_params_with(H_device(), 1.0f, 1);
    step_adamw(2, t, ts, c.N, skip, 0);
    bool ok = check_rows(2, "p, skipped step", dev_download(t->params, VC), c.p0, c, 0.0f, 0.0f, 0.0f, 0.0f);
    ok &= check_rows(2, "m, skipped step", dev_download(t->m, VC), c.m0, c, 0.0f, 0.0f, 0.0f, 0.0f);
    ok &= check_rows(2, "v, skipped step", dev_download(t->v, VC), c.v0, c, 0.0f, 0.0f, 0.0f, 0.0f);
    ok &= check_rows(2, "grad after skipped AdamW", dev_download(t->grad, VC), std::vector<float>(VC, 0.0f), c, 0.0f,
                     0.0f, 0.0f, 0.0f);
    CUDA_CHECK(cudaFree((void*)skip));
    return ok;
}

// Fresh random inputs and Adam state (m0 and v0 nonzero so that the dense update of untouched
// rows shows), both versions checked; ok[v] &= the result.
static void validate_case(const DevArgs& a, int V, int C, int N, Dist dist, int sms, bool ok[]) {
    Case c;
    c.V = V, c.C = C, c.N = N;
    snprintf(c.label, sizeof(c.label), "V%d C%d N%d %s", V, C, N, DIST_NAMES[dist]);
    c.tokens = random_tokens(N, V, dist), c.touched = touched_rows(c.tokens);
    c.dresid = random_uniform((size_t)N * C, -1.0f, 1.0f);
    size_t VC = (size_t)V * C;
    c.p0 = random_uniform(VC, -1.0f, 1.0f), c.m0 = random_uniform(VC, -0.1f, 0.1f);
    c.v0 = random_uniform(VC, 1e-4f, 1e-2f);
    c.grad = grad_ref(c.dresid, c.tokens, c.touched, V, C);
    c.p0_dev = dev_upload(c.p0), c.m0_dev = dev_upload(c.m0), c.v0_dev = dev_upload(c.v0);
    c.dresid_dev = dev_upload(c.dresid), c.tokens_dev = dev_upload(c.tokens);
    Wte t = wte_alloc(V, C);
    TokenSorter ts = sorter_create(N, V);
    for (int v = 1; v <= 2; v++)
        if (dev_selected(a, v)) ok[v] &= check_version(v, c, &t, &ts, sms);
    if (dev_selected(a, 2)) ok[2] &= check_skipped(c, &t, &ts);
    sorter_free(&ts);
    wte_free(&t);
    void* p[] = {c.p0_dev, c.m0_dev, c.v0_dev, c.dresid_dev, c.tokens_dev};
    for (void* q : p) CUDA_CHECK(cudaFree(q));
}

// ---- timing ----

// Copies of a step's inputs, cycled through by the timing loop: copy k holds the same ids shifted
// by k * V / copies (mod V), so that the copies together touch rows (and read dresid) worth four
// times the H200's 50 MB L2, and each step reads its rows from DRAM as in training.
static void time_case(const DevArgs& a, const Wte* t, int N, Dist dist, int sms, const bool ok[]) {
    int V = t->V, C = t->C;
    std::vector<int> tokens = random_tokens(N, V, dist);
    size_t touched = touched_rows(tokens).size();
    int copies = std::max(1, (int)ceil(200e6 / (4.0 * N * C + 16.0 * touched * C)));
    std::vector<int> shifted((size_t)N * copies);
    for (int k = 0; k < copies; k++)
        for (int n = 0; n < N; n++) shifted[(size_t)k * N + n] = (tokens[n] + (long long)k * (V / copies)) % V;
    int* tokens_dev = dev_upload(shifted);
    float* dresid_dev = dev_upload(random_uniform((size_t)N * C * copies, -1.0f, 1.0f));
    TokenSorter ts = sorter_create(N, V);
    char size[48];
    snprintf(size, sizeof(size), "N=%d %s, %zu rows", N, DIST_NAMES[dist], touched);
    for (int v = 1; v <= 2; v++) {
        if (!dev_selected(a, v)) continue;
        if (v == 2) CUDA_CHECK(cudaMemset(t->grad, 0, (size_t)V * C * sizeof(float))); // sparse rows' entry state
        int k = 0;
        double ms = median_ms([&] {
            int j = k++ % copies;
            step_backward(v, t, &ts, dresid_dev + (size_t)j * N * C, tokens_dev + (size_t)j * N, N);
            step_adamw(v, t, &ts, N, H_device(), sms);
        });
        print_row("embedding backward + AdamW", v == 1 ? "1 dense" : "2 sparse rows", size, ms,
                  step_bytes(v, V, C, N, touched), 0.0, ok[v]);
    }
    sorter_free(&ts);
    CUDA_CHECK(cudaFree(tokens_dev));
    CUDA_CHECK(cudaFree(dresid_dev));
}

int main(int argc, char** argv) {
    DevArgs a = dev_args(argc, argv, 2);
    int sms;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int V = 128256, C = 2048;
    bool ok[3] = {true, true, true};
    validate_case(a, 1000, 264, 37, ZIPF, sms, ok);     // small: odd N, C not a multiple of 128
    validate_case(a, 1000, 264, 3000, UNIFORM, sms, ok); // most rows touched, several times each
    validate_case(a, V, C, 256, ZIPF, sms, ok);          // the seed's step at the real size
    if (!a.check_only) {
        Wte t = wte_alloc(V, C);
        size_t VC = (size_t)V * C;
        init_params(t.params, VC, 0.0f, 0.02f, rng_u32(), 0); // a trained-looking state, made on the GPU
        init_params(t.m, VC, 0.0f, 1e-3f, rng_u32(), 0);
        init_params(t.v, VC, 1e-6f, 0.0f, rng_u32(), 0);
        copy_ceiling_gbs();
        print_header();
        for (int N : {256, 16384})
            for (Dist dist : {ZIPF, UNIFORM}) time_case(a, &t, N, dist, sms, ok);
        wte_free(&t);
    }
    return dev_finish();
}
