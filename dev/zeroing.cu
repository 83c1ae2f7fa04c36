// dev/zeroing.cu: setting many small fp32 buffers to zero, the launch-bound regime of the seed's
// FillKernel<float> (678 launches per step at 3.6-4.7 us each, almost all of it launch overhead).
// Each timed call zeroes the whole batch of buffers; the rate counts the bytes written once.
//
// build: make dev/zeroing
// run:   ./dev/zeroing          validate every version, then time them
//        ./dev/zeroing K        version K only
//        ./dev/zeroing --check  validate only, no timing (what `make test` runs)
//
// versions:
//   1  one fill kernel launch per buffer (kernels.cuh fill(), the seed's FillKernel<float>(0),
//      kept there for the trainer's zeroing ablation).
//   2  one cudaMemsetAsync per buffer (the seed's fix: Fill(0) specialised to a memset).
//   3  one cudaMemsetAsync over the contiguous block that holds every buffer. This is a model,
//      not the trainer's code: the trainer keeps its gradients in one block and zeroes none of
//      them per step, because the first micro-step writes them (beta 0 GEMMs, write-mode
//      kernels). Version 3 is what that layout would cost if a zeroing were still needed.
// workloads: 678 buffers (the seed's count) of 2K..64K floats, log-uniform like the model's
// small tensors (about 50 MB in all), and the same 678 scaled up to about 1 GB in all.
#include "common.h"

// Buffers laid end to end in one block; every size is a multiple of 64 floats, so each buffer
// starts on a 256-byte boundary and the block has no padding: the block is exactly the buffers.
typedef struct {
    std::vector<size_t> offset, count; // floats
    size_t total;                      // floats in the block
} BufferSet;

static BufferSet buffer_set(const std::vector<size_t>& count) {
    BufferSet s = {{}, count, 0};
    for (size_t c : count) s.offset.push_back(s.total), s.total += c;
    return s;
}

// 678 sizes log-uniform in [2048, 65536] floats, rounded down to multiples of 64.
static std::vector<size_t> small_sizes(void) {
    std::vector<size_t> count(678);
    for (auto& c : count) c = std::max((size_t)2048, (size_t)expf(rng_uniform(logf(2048.0f), logf(65536.0f))) / 64 * 64);
    return count;
}
// The same sizes times the factor that brings their sum to about 1 GiB.
static std::vector<size_t> scaled_to_1gib(std::vector<size_t> count) {
    size_t sum = 0;
    for (size_t c : count) sum += c;
    size_t factor = ((size_t)1 << 28) / sum;
    for (auto& c : count) c *= factor;
    return count;
}

static void zero_buffers(int version, float* block, const BufferSet& s) {
    if (version == 3) {
        CUDA_CHECK(cudaMemsetAsync(block, 0, s.total * sizeof(float)));
        return;
    }
    for (size_t i = 0; i < s.count.size(); i++) {
        float* buf = block + s.offset[i];
        if (version == 1) fill(buf, s.count[i], 0.0f, 0);
        else CUDA_CHECK(cudaMemsetAsync(buf, 0, s.count[i] * sizeof(float)));
    }
}

// Poison the block (0xFF: NaN), zero the buffers, and every element must be exactly 0.
static void validate(const char* name, const BufferSet& s, const DevArgs& a, bool* ok) {
    float* block = dev_alloc<float>(s.total);
    std::vector<float> zeros(s.total, 0.0f);
    for (int version = 1; version <= 3; version++) {
        if (!dev_selected(a, version)) continue;
        dev_poison(block, s.total);
        zero_buffers(version, block, s);
        char what[96];
        snprintf(what, sizeof(what), "v%d %s: %zu buffers == 0", version, name, s.count.size());
        ok[version] &= dev_check(what, dev_download(block, s.total), zeros, 0.0f, 0.0f);
    }
    CUDA_CHECK(cudaFree(block));
}

static const char* const LABELS[] = {"", "1 fill kernel per buffer", "2 cudaMemsetAsync per buffer",
                                     "3 one cudaMemsetAsync, whole block"};

// A batch smaller than 200 MB rotates over copies of its block, so the writes reach DRAM as
// they would in a step (the small batch is about L2's size).
static void time_versions(const char* name, const BufferSet& s, const DevArgs& a, const bool* ok) {
    double bytes = s.total * sizeof(float);
    size_t copies = (size_t)ceil(200e6 / bytes);
    float* blocks = dev_alloc<float>(copies * s.total);
    char size[64];
    snprintf(size, sizeof(size), "%s: %zu buffers, %.1f MB", name, s.count.size(), bytes / 1e6);
    for (int version = 1; version <= 3; version++) {
        if (!dev_selected(a, version)) continue;
        size_t k = 0;
        double ms = median_ms([&] { zero_buffers(version, blocks + (k++ % copies) * s.total, s); });
        print_row("zeroing", LABELS[version], size, ms, bytes, 0.0, ok[version]);
    }
    CUDA_CHECK(cudaFree(blocks));
}

int main(int argc, char** argv) {
    DevArgs a = dev_args(argc, argv, 3);
    BufferSet small = buffer_set(small_sizes()), large = buffer_set(scaled_to_1gib(small.count));
    bool ok[4] = {true, true, true, true};
    validate("small", small, a, ok);
    validate("large", large, a, ok);
    if (!a.check_only) {
        copy_ceiling_gbs(); // measured before the table, so its line does not split it
        print_header();
        time_versions("small", small, a, ok);
        time_versions("large", large, a, ok);
    }
    return dev_finish();
}
