// dev/swiglu.cu: SwiGLU of the LLaMA MLP on the gate_up GEMM's rows [gate F | up F] (N, 2F), with
// the roundings of PyTorch's bf16 silu and multiply (kernels.cuh swiglu):
//   forward   act = bf16(bf16(silu(g)) * u)                                           (N, F)
//   backward  d_up = bf16(d_act * bf16(silu(g))),  d_silu = bf16(d_act * u),
//             d_gate = bf16(d_silu * sig(g) * (1 + g * (1 - sig(g))))          into (N, 2F)
// Memory-bound: forward reads 4 bytes and writes 2 per output element, backward reads 6 and
// writes 4 (the fewest: gate, up, d_act read once, each output written once).
//
// build: make dev/swiglu
// run:   ./dev/swiglu          validate every version against a CPU reference, then time them
//        ./dev/swiglu K        version K only
//        ./dev/swiglu --check  validate only, no timing (what `make test` runs)
//
// versions (the last is the trainer's own, called through ../kernels.cuh):
//   1  unfused, as PyTorch eager runs it, one thread per element: forward = a silu kernel writing
//      a bf16 (N, F) temp, then a multiply kernel; backward = three kernels, d_up from the saved
//      silu temp, d_silu, then d_gate from d_silu.
//   2  the trainer's swiglu(): one pass each way, 8 elements (16 bytes) per thread.
//   3  the same with [fp8]'s amax: the largest |output| into an FP8 scale's amax as it is written
//      (a block max and one atomicMax per block), for the FP8 GEMM that reads it; the amax is
//      checked exact against the largest |output| the kernel wrote, which is checked as above.
// sizes: LLaMA3.2-1B F = 8192 at N = B*T = 256 (B=4, T=64) and 16384 (B=16, T=1024); validated at
// N = 34, F = 128 and at N = 256, F = 8192.
#include "common.h"

// ---- version 1: unfused, one thread per element ----

// silu_out (N, F) = bf16(silu(g)), g read from the gate half of gate_up (N, 2F).
__global__ void silu_kernel(bf16* silu_out, const bf16* gate_up, int N, int F) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * F) return;
    size_t n = i / F, f = i % F;
    silu_out[i] = __float2bfloat16_rn(silu(__bfloat162float(gate_up[n * 2 * F + f])));
}

// out = bf16(a * b) over (N, F) views whose rows are `*_stride` elements apart: PyTorch's bf16 mul.
__global__ void mul_kernel(bf16* out, int out_stride, const bf16* a, int a_stride, const bf16* b, int b_stride,
                           int N, int F) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * F) return;
    size_t n = i / F, f = i % F;
    float prod = __bfloat162float(a[n * a_stride + f]) * __bfloat162float(b[n * b_stride + f]);
    out[n * out_stride + f] = __float2bfloat16_rn(prod);
}

// d_gate = bf16(d_silu * sig(g) * (1 + g * (1 - sig(g)))) into the gate half of dgate_up.
__global__ void silu_backward_kernel(bf16* dgate_up, const bf16* dsilu, const bf16* gate_up, int N, int F) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * F) return;
    size_t n = i / F, f = i % F;
    float g = __bfloat162float(gate_up[n * 2 * F + f]), sig = 1.0f / (1.0f + expf(-g));
    dgate_up[n * 2 * F + f] = __float2bfloat16_rn(__bfloat162float(dsilu[i]) * (sig * (1.0f + g * (1.0f - sig))));
}

// ---- the versions ----

typedef struct {
    bf16 *gate_up, *dact; // inputs: (N, 2F) and (N, F)
    bf16 *act, *dgate_up; // outputs: (N, F) and (N, 2F)
    bf16 *silu, *dsilu;   // version 1's (N, F) temps: silu(g), saved by the forward for the backward, and d_silu
    unsigned* amax_bits;  // version 3's amax (a float's bits), zeroed before each call
} SwigluBuffers;

static SwigluBuffers swiglu_alloc(size_t N, size_t F) {
    SwigluBuffers b = {dev_alloc<bf16>(N * 2 * F), dev_alloc<bf16>(N * F), dev_alloc<bf16>(N * F),
                       dev_alloc<bf16>(N * 2 * F), dev_alloc<bf16>(N * F), dev_alloc<bf16>(N * F),
                       dev_alloc<unsigned>(1)};
    return b;
}
static void swiglu_free(SwigluBuffers& b) {
    void* all[] = {b.gate_up, b.dact, b.act, b.dgate_up, b.silu, b.dsilu, b.amax_bits};
    for (void* p : all) CUDA_CHECK(cudaFree(p));
}

static void swiglu_version(int version, bool backward, const SwigluBuffers& b, int N, int F) {
    if (version >= 2) {
        if (version == 3) CUDA_CHECK(cudaMemsetAsync(b.amax_bits, 0, sizeof(unsigned), 0));
        swiglu(backward, backward ? b.dgate_up : b.act, b.dact, b.gate_up, N, F, 0, version == 3 ? b.amax_bits : NULL);
        return;
    }
    unsigned grid = ceil_div((size_t)N * F, 256);
    if (!backward) {
        silu_kernel<<<grid, 256>>>(b.silu, b.gate_up, N, F);
        LAUNCH_CHECK();
        mul_kernel<<<grid, 256>>>(b.act, F, b.silu, F, b.gate_up + F, 2 * F, N, F);
        LAUNCH_CHECK();
    } else {
        mul_kernel<<<grid, 256>>>(b.dgate_up + F, 2 * F, b.dact, F, b.silu, F, N, F); // d_up
        LAUNCH_CHECK();
        mul_kernel<<<grid, 256>>>(b.dsilu, F, b.dact, F, b.gate_up + F, 2 * F, N, F); // d_silu
        LAUNCH_CHECK();
        silu_backward_kernel<<<grid, 256>>>(b.dgate_up, b.dsilu, b.gate_up, N, F);
        LAUNCH_CHECK();
    }
}

// ---- CPU reference: the kernels' fp32 operations and bf16 roundings, in the same order ----

static void swiglu_forward_cpu(std::vector<float>& act, const std::vector<float>& gate_up, int N, int F) {
    for (size_t n = 0; n < (size_t)N; n++)
        for (int f = 0; f < F; f++) {
            float g = gate_up[n * 2 * F + f], u = gate_up[n * 2 * F + F + f];
            act[n * F + f] = bf16_round(bf16_round(g / (1.0f + expf(-g))) * u);
        }
}

static void swiglu_backward_cpu(std::vector<float>& dgate_up, const std::vector<float>& dact,
                                const std::vector<float>& gate_up, int N, int F) {
    for (size_t n = 0; n < (size_t)N; n++)
        for (int f = 0; f < F; f++) {
            float g = gate_up[n * 2 * F + f], u = gate_up[n * 2 * F + F + f], da = dact[n * F + f];
            float sig = 1.0f / (1.0f + expf(-g)), dsilu = bf16_round(da * u);
            dgate_up[n * 2 * F + F + f] = bf16_round(da * bf16_round(g * sig));
            dgate_up[n * 2 * F + f] = bf16_round(dsilu * (sig * (1.0f + g * (1.0f - sig))));
        }
}

// Fresh N(0, 1) gate_up and d_act; every selected version forward and backward on them.
// Tolerances (bf16 outputs; the reference repeats the kernels' fp32 operations and roundings, so
// the only difference is expf on the host vs the device, an fp32 ulp or two):
//   d_gate: rtol 2^-7, one bf16 ulp (an ulp is 2^-8..2^-7 of the value): its only inputs that can
//           differ are fp32 values rounded once.
//   act and d_up: rtol 2^-6. They round silu to bf16 and then a product of it: where an fp32 ulp
//           moves silu across a bf16 rounding boundary (about 1 element in 10^5), silu is one
//           bf16 ulp off and the rounded product can then be two ulps off.
// up_scale multiplies the up half: at 1/64 d_gate (which scales with up) stays under d_up, so
// version 3's backward amax must come from d_up's half.
static void validate(int N, int F, const DevArgs& a, bool* ok, float up_scale = 1.0f) {
    std::vector<float> gate_up = random_normal((size_t)N * 2 * F);
    for (size_t n = 0; n < (size_t)N; n++)
        for (int f = F; f < 2 * F; f++) gate_up[n * 2 * F + f] *= up_scale;
    gate_up = from_bf16(to_bf16(gate_up));
    std::vector<float> dact = from_bf16(to_bf16(random_normal((size_t)N * F)));
    std::vector<float> act_ref((size_t)N * F), dgate_up_ref((size_t)N * 2 * F);
    swiglu_forward_cpu(act_ref, gate_up, N, F);
    swiglu_backward_cpu(dgate_up_ref, dact, gate_up, N, F);
    std::vector<float> dgate_ref = columns(dgate_up_ref, N, 2 * F, 0, F);
    std::vector<float> dup_ref = columns(dgate_up_ref, N, 2 * F, F, F);
    SwigluBuffers b = swiglu_alloc(N, F);
    upload_into(b.gate_up, gate_up);
    upload_into(b.dact, dact);
    const float one_ulp = 1.0f / 128, two_ulps = 1.0f / 64;
    const char* tag = up_scale == 1.0f ? "" : " (up / 64)";
    char what[96];
    for (int version = 1; version <= 3; version++) {
        if (!dev_selected(a, version)) continue;
        dev_poison(b.act, (size_t)N * F), dev_poison(b.silu, (size_t)N * F);
        swiglu_version(version, false, b, N, F);
        snprintf(what, sizeof(what), "v%d forward N=%d F=%d%s act", version, N, F, tag);
        std::vector<float> act = from_bf16(dev_download(b.act, (size_t)N * F));
        ok[version] &= dev_check(what, act, act_ref, 0.0f, two_ulps);
        snprintf(what, sizeof(what), "v%d forward N=%d F=%d%s amax", version, N, F, tag);
        if (version == 3) ok[version] &= dev_check_amax(what, b.amax_bits, act);
        dev_poison(b.dgate_up, (size_t)N * 2 * F), dev_poison(b.dsilu, (size_t)N * F);
        swiglu_version(version, true, b, N, F);
        std::vector<float> got = from_bf16(dev_download(b.dgate_up, (size_t)N * 2 * F));
        snprintf(what, sizeof(what), "v%d backward N=%d F=%d%s d_gate", version, N, F, tag);
        ok[version] &= dev_check(what, columns(got, N, 2 * F, 0, F), dgate_ref, 0.0f, one_ulp);
        snprintf(what, sizeof(what), "v%d backward N=%d F=%d%s d_up", version, N, F, tag);
        ok[version] &= dev_check(what, columns(got, N, 2 * F, F, F), dup_ref, 0.0f, two_ulps);
        snprintf(what, sizeof(what), "v%d backward N=%d F=%d%s amax", version, N, F, tag);
        if (version == 3) ok[version] &= dev_check_amax(what, b.amax_bits, got);
    }
    swiglu_free(b);
}

// ---- timing ----

static void time_versions(int B, int T, int F, const DevArgs& a, const bool* ok) {
    int N = B * T, sets = rotations((size_t)6 * N * F);
    std::vector<SwigluBuffers> b(sets);
    for (auto& s : b) {
        s = swiglu_alloc(N, F);
        fill_normal(s.gate_up, (size_t)N * 2 * F), fill_normal(s.dact, (size_t)N * F);
    }
    char size[64];
    snprintf(size, sizeof(size), "B=%d T=%d (N=%d F=%d)", B, T, N, F);
    const char* labels[4] = {"", "1 unfused", "2 trainer", "3 trainer + amax"};
    for (int version = 1; version <= 3; version++) {
        if (!dev_selected(a, version)) continue;
        for (int backward = 0; backward <= 1; backward++) {
            if (backward) // version 1's backward reads the silu temp its forward saved
                for (auto& s : b) swiglu_version(version, false, s, N, F);
            int r = 0;
            double ms = median_ms([&] { swiglu_version(version, backward, b[r++ % sets], N, F); });
            print_row(backward ? "swiglu backward" : "swiglu forward", labels[version], size, ms,
                      (backward ? 10.0 : 6.0) * N * F, 0.0, ok[version]);
        }
    }
    for (auto& s : b) swiglu_free(s);
}

int main(int argc, char** argv) {
    DevArgs a = dev_args(argc, argv, 3);
    bool ok[4] = {true, true, true, true};
    validate(34, 128, a, ok);
    validate(34, 128, a, ok, 1.0f / 64);
    validate(256, 8192, a, ok);
    if (!a.check_only) {
        copy_ceiling_gbs(); // measured before the table, so its line does not split it
        print_header();
        time_versions(4, 64, 8192, a, ok);
        time_versions(16, 1024, 8192, a, ok);
    }
    return dev_finish();
}
