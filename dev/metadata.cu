// dev/metadata.cu: how a kernel gets its shape metadata, on the seed's Slice: gather a strided
// slice of a contiguous fp32 tensor of up to 8 dims,
//   out[c_0, ..., c_{D-1}] = in[starts[0] + c_0 * steps[0], ..., starts[D-1] + c_{D-1} * steps[D-1]]
// which needs five int64 arrays per call (new_dims, starts, steps, in_strides, out_strides).
// The seed issued 257 Slices per step on small tensors; each call's cost is launch and copy
// overhead, not bandwidth (a 1-2 MB gather takes well under a microsecond of DRAM time).
//
// build: make dev/metadata
// run:   ./dev/metadata          validate both versions, then time them
//        ./dev/metadata K        version K only
//        ./dev/metadata --check  validate only, no timing (what `make test` runs)
//
// versions (the same gather; only the metadata path differs):
//   1  the seed's baseline: per call a cudaMallocAsync'd device array, five cudaMemcpyAsync
//      host-to-device copies of the arrays from pageable host memory, the kernel reading them
//      from global memory, then cudaFreeAsync.
//   2  [by-value metadata] the arrays packed in one SliceMeta struct passed by value as a kernel
//      argument (the trainer's approach, cf. HeadShape in kernels.cuh; the trainer has no
//      generic slice, so the struct and kernel live here).
// Everything runs on one stream (the default stream, which median_ms's events time).
#include "common.h"

#define SLICE_MAX_DIMS 8

// [by-value metadata] The five per-dimension arrays of a slice as one kernel argument
// (328 bytes of the 4 KB parameter space). Strides are of the contiguous input and output.
typedef struct {
    int64_t new_dims[SLICE_MAX_DIMS], starts[SLICE_MAX_DIMS], steps[SLICE_MAX_DIMS];
    int64_t in_strides[SLICE_MAX_DIMS], out_strides[SLICE_MAX_DIMS];
    int ndim;
} SliceMeta;

// Input offset of output element i: its coordinate along dim d, (i / out_strides[d]) % new_dims[d],
// is input index starts[d] + coordinate * steps[d].
__device__ inline int64_t slice_source(int64_t i, const int64_t* new_dims, const int64_t* starts, const int64_t* steps,
                                       const int64_t* in_strides, const int64_t* out_strides, int ndim) {
    int64_t src = 0;
    for (int d = 0; d < ndim; d++) src += (starts[d] + (i / out_strides[d]) % new_dims[d] * steps[d]) * in_strides[d];
    return src;
}

// Version 1: meta holds the five arrays back to back in device memory, ndim entries each.
// One thread per output element.
__global__ void slice_meta_in_memory_kernel(float* out, const float* in, const int64_t* meta, int ndim, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = in[slice_source(i, meta, meta + ndim, meta + 2 * ndim, meta + 3 * ndim, meta + 4 * ndim, ndim)];
}

// Version 2: the arrays by value; __grid_constant__ lets the kernel index them in the parameter
// bank (constant cache) without a per-thread local copy.
__global__ void slice_kernel(float* out, const float* in, const __grid_constant__ SliceMeta meta, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = in[slice_source(i, meta.new_dims, meta.starts, meta.steps, meta.in_strides, meta.out_strides, meta.ndim)];
}

static void slice_version(int version, float* out, const float* in, const SliceMeta& s, int64_t n, cudaStream_t stream) {
    if (version == 1) {
        size_t bytes = s.ndim * sizeof(int64_t);
        const int64_t* host[5] = {s.new_dims, s.starts, s.steps, s.in_strides, s.out_strides};
        int64_t* meta;
        CUDA_CHECK(cudaMallocAsync(&meta, 5 * bytes, stream));
        for (int k = 0; k < 5; k++)
            CUDA_CHECK(cudaMemcpyAsync(meta + k * s.ndim, host[k], bytes, cudaMemcpyHostToDevice, stream));
        slice_meta_in_memory_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(out, in, meta, s.ndim, n);
        LAUNCH_CHECK();
        CUDA_CHECK(cudaFreeAsync(meta, stream));
    } else {
        slice_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(out, in, s, n);
        LAUNCH_CHECK();
    }
}

// ---- slices ----

typedef struct {
    SliceMeta meta;
    int64_t in_numel, out_numel;
} SliceCase;

// in[starts[d] :: steps[d]], new_dims[d] elements along each dim d of a contiguous tensor.
static SliceCase slice_case(int ndim, const int64_t* in_dims, const int64_t* starts, const int64_t* steps,
                            const int64_t* new_dims) {
    SliceCase c = {};
    c.meta.ndim = ndim, c.in_numel = 1, c.out_numel = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        c.meta.new_dims[d] = new_dims[d], c.meta.starts[d] = starts[d], c.meta.steps[d] = steps[d];
        c.meta.in_strides[d] = c.in_numel, c.meta.out_strides[d] = c.out_numel;
        c.in_numel *= in_dims[d], c.out_numel *= new_dims[d];
    }
    return c;
}

// The LLaMA forward's small slices at the seed's B = 4, T = 64 (32 heads, 8 kv heads, HD 64).
static std::vector<SliceCase> llama_slices(void) {
    struct {
        int64_t in[4], start[4], step[4], out[4];
    } s[] = {
        {{4, 32, 64, 64}, {0, 0, 0, 0}, {1, 1, 1, 1}, {4, 32, 64, 32}},         // q, rotate_half low half
        {{4, 32, 64, 64}, {0, 0, 0, 32}, {1, 1, 1, 1}, {4, 32, 64, 32}},        // q, rotate_half high half
        {{4, 8, 64, 64}, {0, 0, 0, 0}, {1, 1, 1, 1}, {4, 8, 64, 32}},           // k, rotate_half low half
        {{4, 64, 48, 64}, {0, 0, 0, 0}, {1, 1, 1, 1}, {4, 64, 32, 64}},         // qkv heads -> q
        {{4, 64, 48, 64}, {0, 0, 40, 0}, {1, 1, 1, 1}, {4, 64, 8, 64}},         // qkv heads -> v
        {{1, 1, 1024, 1024}, {0, 0, 0, 0}, {1, 1, 1, 1}, {1, 1, 64, 64}},       // causal mask [:T, :T]
        {{4, 64, 32, 64}, {0, 0, 0, 1}, {1, 1, 1, 2}, {4, 64, 32, 32}},         // odd elements of pairs
    };
    std::vector<SliceCase> cases;
    for (auto& c : s) cases.push_back(slice_case(4, c.in, c.start, c.step, c.out));
    return cases;
}

// 1 to 8 dims, at most 2^18 input elements, any start, step 1..3, any length that fits.
static SliceCase random_slice(void) {
    int ndim = 1 + rng_u32() % SLICE_MAX_DIMS, max_dim = (int)pow(2.0, 18.0 / ndim);
    int64_t in[SLICE_MAX_DIMS], start[SLICE_MAX_DIMS], step[SLICE_MAX_DIMS], out[SLICE_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        in[d] = 1 + rng_u32() % max_dim;
        start[d] = rng_u32() % in[d];
        step[d] = 1 + rng_u32() % 3;
        out[d] = 1 + rng_u32() % ((in[d] - start[d] + step[d] - 1) / step[d]);
    }
    return slice_case(ndim, in, start, step, out);
}

// ---- CPU reference ----

// Walks the output coordinates like an odometer (no divisions, unlike the kernel).
static std::vector<float> slice_cpu(const std::vector<float>& in, const SliceMeta& s, int64_t n) {
    std::vector<float> out(n);
    int64_t coord[SLICE_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t src = 0;
        for (int d = 0; d < s.ndim; d++) src += (s.starts[d] + coord[d] * s.steps[d]) * s.in_strides[d];
        out[i] = in[src];
        for (int d = s.ndim - 1; d >= 0 && ++coord[d] == s.new_dims[d]; d--) coord[d] = 0;
    }
    return out;
}

// Every case on fresh random input, the output poisoned before each run; a gather copies values,
// so the check is exact (tolerance 0). All cases' outputs are checked together, per version.
static void validate(const char* name, const std::vector<SliceCase>& cases, const DevArgs& a, bool* ok) {
    std::vector<std::vector<float>> inputs;
    std::vector<float> ref;
    for (const SliceCase& c : cases) {
        inputs.push_back(random_normal(c.in_numel));
        std::vector<float> r = slice_cpu(inputs.back(), c.meta, c.out_numel);
        ref.insert(ref.end(), r.begin(), r.end());
    }
    for (int version = 1; version <= 2; version++) {
        if (!dev_selected(a, version)) continue;
        std::vector<float> got;
        for (size_t k = 0; k < cases.size(); k++) {
            float *in = dev_upload(inputs[k]), *out = dev_alloc<float>(cases[k].out_numel);
            dev_poison(out, cases[k].out_numel);
            slice_version(version, out, in, cases[k].meta, cases[k].out_numel, 0);
            std::vector<float> o = dev_download(out, cases[k].out_numel);
            got.insert(got.end(), o.begin(), o.end());
            CUDA_CHECK(cudaFree(in));
            CUDA_CHECK(cudaFree(out));
        }
        char what[96];
        snprintf(what, sizeof(what), "v%d %zu %s", version, cases.size(), name);
        ok[version] &= dev_check(what, got, ref, 0.0f, 0.0f);
    }
}

// ---- timing ----

static const char* const LABELS[] = {"", "1 malloc + 5 pageable H2D + free", "2 SliceMeta by value (trainer's way)"};

// One timed call = the seed's 257 Slices of a step, cycling over the LLaMA slices. Call i reads
// and writes slot i % 64 of two 256 MB arenas, so the calls' data does not stay in L2.
static void time_versions(const std::vector<SliceCase>& cases, const DevArgs& a, const bool* ok) {
    const int calls = 257, slots = 64;
    const size_t slot = (size_t)1 << 20; // floats, at least every case's input
    float *in = dev_alloc<float>(slots * slot), *out = dev_alloc<float>(slots * slot);
    init_params(in, slots * slot, 0.0f, 1.0f, dev_seed(), 0);
    double bytes = 0.0; // per call: each output element read once and written once
    for (int i = 0; i < calls; i++) bytes += 2.0 * sizeof(float) * cases[i % cases.size()].out_numel / calls;
    char size[64];
    snprintf(size, sizeof(size), "%d calls (%zu LLaMA slices): per call", calls, cases.size());
    double us[3] = {0.0, 0.0, 0.0};
    for (int version = 1; version <= 2; version++) {
        if (!dev_selected(a, version)) continue;
        double ms = median_ms([&] {
            for (int i = 0; i < calls; i++) {
                const SliceCase& c = cases[i % cases.size()];
                size_t at = (size_t)(i % slots) * slot;
                slice_version(version, out + at, in + at, c.meta, c.out_numel, 0);
            }
        });
        us[version] = 1000.0 * ms / calls;
        print_row("slice", LABELS[version], size, ms / calls, bytes, 0.0, ok[version]);
    }
    for (int version = 1; version <= 2; version++)
        if (us[version] > 0.0)
            printf("version %d: %.2f us per call, %.3f ms per step of %d calls (launch/copy-bound: the "
                   "data moved is about %.2f us of DRAM time at the copy ceiling)\n",
                   version, us[version], us[version] * calls / 1000.0, calls, bytes / (copy_ceiling_gbs() * 1e3));
    CUDA_CHECK(cudaFree(in));
    CUDA_CHECK(cudaFree(out));
}

int main(int argc, char** argv) {
    DevArgs a = dev_args(argc, argv, 2);
    std::vector<SliceCase> random_cases, llama = llama_slices();
    for (int k = 0; k < 32; k++) random_cases.push_back(random_slice());
    bool ok[3] = {true, true, true};
    validate("random slices, 1-8 dims", random_cases, a, ok);
    validate("LLaMA slices (B 4, T 64)", llama, a, ok);
    if (!a.check_only) {
        copy_ceiling_gbs(); // measured before the table, so its line does not split it
        print_header();
        time_versions(llama, a, ok);
    }
    return dev_finish();
}
