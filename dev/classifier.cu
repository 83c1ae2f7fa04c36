// dev/classifier.cu: the loss of the LM head (kernels.cuh cross_entropy and mean). Per row of bf16
// logits (N rows of V = 128256):
//   loss    = logsumexp(logits) - logits[target]                        (fp32, then their mean)
//   dlogits = (softmax(logits) - onehot(target)) * dloss, dloss = 1/N  (bf16, over the logits)
// Memory-bound: the fewest bytes are the logits read once and dlogits written once (4 bytes per
// element), plus the targets and losses.
//
// build: make dev/classifier
// run:   ./dev/classifier          validate every version against a CPU reference, then time them
//        ./dev/classifier K        version K only
//        ./dev/classifier --check  validate only, no timing (what `make test` runs)
//
// versions (the last is the trainer's own, called through ../kernels.cuh):
//   1  unfused, as PyTorch eager runs F.cross_entropy(logits.float(), targets) and its backward:
//      a cast of the logits to an fp32 (N, V) buffer, log_softmax into another (max, sum and
//      write passes over each row), the nll gather, the mean; then (softmax - onehot) * dloss
//      into a third fp32 (N, V) buffer and its cast to bf16 over the logits.
//   2  the trainer's cross_entropy(): one block per row, online max and sum, dlogits written in
//      place (the row read twice, the second time mostly from L2); then mean().
// sizes: N = 256 (B=4, T=64) and 16384 (B=16, T=1024) rows of V = 128256; validated at N = 34,
// V = 512 and at N = 256, V = 128256.
#include "common.h"

// ---- version 1: unfused, fp32 (N, V) intermediates ----

__global__ void bf16_to_float_kernel(float* out, const bf16* in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __bfloat162float(in[i]);
}

// logprobs = x - max - log(sum exp(x - max)) over each fp32 row of V, one block per row.
__global__ void log_softmax_kernel(float* logprobs, const float* logits, int V) {
    const float* x = logits + (size_t)blockIdx.x * V;
    float* y = logprobs + (size_t)blockIdx.x * V;
    float mx = -INFINITY, sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
    mx = block_max(mx);
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += expf(x[i] - mx);
    float log_sum = logf(block_sum(sum));
    for (int i = threadIdx.x; i < V; i += blockDim.x) y[i] = x[i] - mx - log_sum;
}

// losses[n] = -logprobs[n, targets[n]]: nll_loss's gather (mean() takes the mean).
__global__ void nll_kernel(float* losses, const float* logprobs, const int* targets, int N, int V) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) losses[n] = -logprobs[(size_t)n * V + targets[n]];
}

// dlogits = (exp(logprobs) - onehot(target)) * dloss, fp32, one thread per element: the backward
// of log_softmax under the mean nll loss.
__global__ void softmax_minus_onehot_kernel(float* dlogits, const float* logprobs, const int* targets, size_t n,
                                            int V, float dloss) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int target = targets[i / V];
    dlogits[i] = (expf(logprobs[i]) - ((int)(i % V) == target ? 1.0f : 0.0f)) * dloss;
}

// ---- the versions ----

typedef struct {
    bf16* logits;  // (N, V) in, dlogits out
    int* targets;  // (N)
    float* losses; // (N)
    float* loss;   // the mean
    float *logits_f32, *logprobs, *dlogits_f32; // version 1's (N, V) fp32 intermediates
} ClassifierBuffers;

static ClassifierBuffers classifier_alloc(size_t N, size_t V, bool fp32_intermediates) {
    ClassifierBuffers b = {dev_alloc<bf16>(N * V), dev_alloc<int>(N), dev_alloc<float>(N), dev_alloc<float>(1)};
    if (fp32_intermediates) {
        b.logits_f32 = dev_alloc<float>(N * V), b.logprobs = dev_alloc<float>(N * V);
        b.dlogits_f32 = dev_alloc<float>(N * V);
    }
    return b;
}
static void classifier_free(ClassifierBuffers& b) {
    void* all[] = {b.logits, b.targets, b.losses, b.loss, b.logits_f32, b.logprobs, b.dlogits_f32};
    for (void* p : all) CUDA_CHECK(cudaFree(p)); // cudaFree(NULL) is a no-op
}

static void classifier_version(int version, const ClassifierBuffers& b, int N, int V) {
    size_t n = (size_t)N * V;
    float dloss = 1.0f / N;
    if (version == 2) {
        cross_entropy(b.logits, b.losses, b.targets, N, V, dloss, 0);
        mean(b.loss, b.losses, N, 0);
        return;
    }
    bf16_to_float_kernel<<<ceil_div(n, 256), 256>>>(b.logits_f32, b.logits, n);
    LAUNCH_CHECK();
    log_softmax_kernel<<<N, 512>>>(b.logprobs, b.logits_f32, V);
    LAUNCH_CHECK();
    nll_kernel<<<ceil_div(N, 256), 256>>>(b.losses, b.logprobs, b.targets, N, V);
    LAUNCH_CHECK();
    mean(b.loss, b.losses, N, 0);
    softmax_minus_onehot_kernel<<<ceil_div(n, 256), 256>>>(b.dlogits_f32, b.logprobs, b.targets, n, V, dloss);
    LAUNCH_CHECK();
    cast_to_bf16(b.logits, b.dlogits_f32, n, 0);
}

// ---- CPU reference (fp64) ----

static void cross_entropy_cpu(std::vector<float>& losses, float* mean_loss, std::vector<float>& dlogits,
                              const std::vector<float>& logits, const std::vector<int>& targets, int N, int V) {
    double total = 0.0;
    for (size_t n = 0; n < (size_t)N; n++) {
        const float* x = &logits[n * V];
        double mx = -INFINITY, sum = 0.0;
        for (int v = 0; v < V; v++) mx = std::max(mx, (double)x[v]);
        for (int v = 0; v < V; v++) sum += exp(x[v] - mx);
        double lse = mx + log(sum);
        losses[n] = (float)(lse - x[targets[n]]), total += lse - x[targets[n]];
        for (int v = 0; v < V; v++) dlogits[n * V + v] = (float)((exp(x[v] - lse) - (v == targets[n])) / N);
    }
    *mean_loss = (float)(total / N);
}

// Fresh N(0, 2^2) logits and random targets. Tolerances: losses and their mean rtol 1e-4 (fp32
// sums of 128K exps, about 1e-6 relative error); dlogits rtol 2^-8, between half and one bf16
// ulp (a bf16 rounding of an fp32 value whose error is ~1e-6 relative), atol 1e-9 for the tiny
// values (dloss = 1/N times probabilities down to ~1e-12).
static void validate(int N, int V, const DevArgs& a, bool* ok) {
    std::vector<float> logits = from_bf16(to_bf16(random_normal((size_t)N * V, 2.0f)));
    std::vector<int> targets(N);
    for (auto& t : targets) t = rng_u32() % V;
    std::vector<float> losses_ref(N), dlogits_ref((size_t)N * V);
    float mean_ref;
    cross_entropy_cpu(losses_ref, &mean_ref, dlogits_ref, logits, targets, N, V);
    ClassifierBuffers b = classifier_alloc(N, V, dev_selected(a, 1));
    CUDA_CHECK(cudaMemcpy(b.targets, targets.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    std::vector<bf16> logits_bf16 = to_bf16(logits);
    char what[96];
    for (int version = 1; version <= 2; version++) {
        if (!dev_selected(a, version)) continue;
        CUDA_CHECK(cudaMemcpy(b.logits, logits_bf16.data(), logits_bf16.size() * sizeof(bf16), cudaMemcpyHostToDevice));
        dev_poison(b.losses, N), dev_poison(b.loss, 1);
        if (version == 1) {
            dev_poison(b.logits_f32, (size_t)N * V), dev_poison(b.logprobs, (size_t)N * V);
            dev_poison(b.dlogits_f32, (size_t)N * V);
        }
        classifier_version(version, b, N, V);
        snprintf(what, sizeof(what), "v%d N=%d V=%d losses", version, N, V);
        ok[version] &= dev_check(what, dev_download(b.losses, N), losses_ref, 0.0f, 1e-4f);
        snprintf(what, sizeof(what), "v%d N=%d V=%d mean loss", version, N, V);
        ok[version] &= dev_check(what, dev_download(b.loss, 1).data(), &mean_ref, 1, 0.0f, 1e-4f);
        snprintf(what, sizeof(what), "v%d N=%d V=%d dlogits", version, N, V);
        std::vector<float> dlogits = from_bf16(dev_download(b.logits, (size_t)N * V));
        ok[version] &= dev_check(what, dlogits, dlogits_ref, 1e-9f, 1.0f / 256);
    }
    classifier_free(b);
}

// ---- timing ----

// One set of buffers: the logits of both sizes (at least 65 MB) already exceed L2. The timed
// calls run on the previous call's dlogits as logits: no kernel's work depends on the values.
static void time_versions(int B, int T, int V, const DevArgs& a, const bool* ok) {
    int N = B * T;
    ClassifierBuffers b = classifier_alloc(N, V, dev_selected(a, 1));
    fill_normal(b.logits, (size_t)N * V, 2.0f);
    std::vector<int> targets(N);
    for (auto& t : targets) t = rng_u32() % V;
    CUDA_CHECK(cudaMemcpy(b.targets, targets.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    char size[48];
    snprintf(size, sizeof(size), "B=%d T=%d (N=%d V=%d)", B, T, N, V);
    const char* labels[3] = {"", "1 unfused fp32", "2 trainer (fused, in place)"};
    for (int version = 1; version <= 2; version++) {
        if (!dev_selected(a, version)) continue;
        double ms = median_ms([&] { classifier_version(version, b, N, V); });
        print_row("cross_entropy + mean", labels[version], size, ms, 4.0 * N * V + 8.0 * N, 0.0, ok[version]);
    }
    classifier_free(b);
}

int main(int argc, char** argv) {
    DevArgs a = dev_args(argc, argv, 2);
    bool ok[3] = {true, true, true};
    validate(34, 512, a, ok);
    validate(256, 128256, a, ok);
    if (!a.check_only) {
        copy_ceiling_gbs(); // measured before the table, so its line does not split it
        print_header();
        time_versions(4, 64, 128256, a, ok);
        time_versions(16, 1024, 128256, a, ok);
    }
    return dev_finish();
}
