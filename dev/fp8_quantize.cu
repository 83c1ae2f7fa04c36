// dev/fp8_quantize.cu: the FP8 quantisation kernels of kernels.cuh ([fp8]), checked bit for bit
// against the reference codec of dev/common.h (written from the formats' definitions), then timed:
//   amax            amax(|x|) of a bf16 tensor (2 bytes per element read)
//   quantize        out = fp8(x * scale) and out_t = fp8(x^T * scale), scale = FP8_MAX / amax, in
//                   one pass: a 64 x 64 tile read once, written straight and (through shared
//                   memory) transposed (4 bytes per element)
//   quantize range  out = fp8(x * scale) of a range, no transpose (3 bytes per element): a rank's part
//                   of a weight under ZeRO-1, whose FP8 bytes the ranks all-gather
//   transpose       out_t = x^T of FP8 bytes (2 bytes per element): each rank's transpose of the
//                   gathered weight
// in e4m3 (activations, weights) and e5m2 (gradients).
//
// build: make dev/fp8_quantize
// run:   ./dev/fp8_quantize          validate, then time
//        ./dev/fp8_quantize --check  validate only (what `make test` runs)
//
// Checks, every element exact: the amax (a max is exact), scale_inv == 1 / (FP8_MAX / amax) in
// fp32, and each byte against fp8_encode_ref(x * scale) (the product in fp32, as the kernel forms
// it). Inputs: N(0, 1) with outliers, values below the formats' smallest subnormals, ties of the
// rounding (values halfway between two FP8 neighbours) and, with the amax set below the true one,
// values past the largest finite value (saturation).
#include "common.h"

static float bits_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// The bytes of a host vector of FP8 values.
template <typename F8> static std::vector<uint8_t> fp8_bytes(const F8* p, size_t n) {
    std::vector<F8> raw = dev_download(p, n);
    std::vector<uint8_t> out(n);
    for (size_t i = 0; i < n; i++) out[i] = raw[i].__x;
    return out;
}

// got against the codec, byte for byte; prints the first mismatch.
static void check_bytes(const char* what, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.size(); i++)
        if (got[i] != want[i] && bad++ == 0) first = i;
    if (bad) printf("FAIL %-52s %zu/%zu bytes differ (first [%zu]: got 0x%02x want 0x%02x)\n", what, bad, want.size(), first,
                    got[first], want[first]);
    else printf("ok   %-52s %zu/%zu bytes equal to the reference codec\n", what, want.size(), want.size());
    bad ? dev_failed++ : dev_passed++;
}

// Inputs that reach every case of the encoder: normal values, outliers, tiny values (under the
// smallest subnormal after scaling), and exact halfway points between FP8 neighbours, divided by
// the scale the tensor will get (so x * scale lands on the tie).
static std::vector<float> hostile_input(size_t n, Fp8Spec f) {
    std::vector<float> x = random_normal(n);
    for (size_t i = 0; i < n; i += 97) x[i] *= 1e-7f;
    // The amax FP8_MAX / 16 (e4m3: 28) or / 8192 (e5m2: 7), above every N(0, 1) sample here: the
    // scale is then a power of two, so x * scale is exact and lands on the ties below.
    float scale = f.mbits == 3 ? 16.0f : 8192.0f;
    x[rng_u32() % n] = f.max / scale;
    for (size_t i = 1; i < n; i += 89) { // halfway between neighbours k and k + 1 (finite codes)
        uint8_t k = rng_u32() % 0x7a;
        x[i] = 0.5f * (fp8_decode_ref(k, f) + fp8_decode_ref(k + 1, f)) / scale; // 5 significant bits: bf16-exact
    }
    return from_bf16(to_bf16(x));
}

template <typename F8> static void validate(int rows, int cols, Fp8Spec f, const char* name, int sms, bool saturate) {
    size_t n = (size_t)rows * cols;
    std::vector<float> x = hostile_input(n, f);
    bf16* xd = dev_upload(to_bf16(x));
    F8 *out = dev_alloc<F8>(n), *out_t = dev_alloc<F8>(n);
    Fp8Scale* s = dev_alloc<Fp8Scale>(1);
    dev_poison(out, n), dev_poison(out_t, n);
    CUDA_CHECK(cudaMemset(s, 0, sizeof(Fp8Scale)));
    fp8_amax(s, xd, n, sms, 0);
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, fabsf(v));
    Fp8Scale got_s = dev_download(s, 1)[0];
    char what[128];
    snprintf(what, sizeof(what), "%s amax %dx%d", name, rows, cols);
    dev_check(what, std::vector<float>{bits_float(got_s.amax_bits)}, std::vector<float>{amax}, 0.0f, 0.0f);
    if (saturate) { // a stale, smaller amax: the largest values must saturate, not wrap or turn NaN
        amax *= 0.25f;
        memcpy(&got_s.amax_bits, &amax, 4);
        CUDA_CHECK(cudaMemcpy(s, &got_s, sizeof(got_s), cudaMemcpyHostToDevice));
    }
    quantize_fp8(out, out_t, s, xd, rows, cols, 0);
    float scale = fp8_scale_ref(amax, f);
    std::vector<uint8_t> want(n), want_t(n);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            want_t[(size_t)c * rows + r] = want[(size_t)r * cols + c] = fp8_encode_ref(x[(size_t)r * cols + c] * scale, f);
    snprintf(what, sizeof(what), "%s quantize %dx%d%s", name, rows, cols, saturate ? " (amax / 4: saturating)" : "");
    check_bytes(what, fp8_bytes(out, n), want);
    snprintf(what, sizeof(what), "%s transpose %dx%d%s", name, rows, cols, saturate ? " (saturating)" : "");
    check_bytes(what, fp8_bytes(out_t, n), want_t);
    snprintf(what, sizeof(what), "%s scale_inv %dx%d", name, rows, cols);
    dev_check(what, std::vector<float>{dev_download(s, 1)[0].scale_inv}, std::vector<float>{1.0f / scale}, 0.0f, 0.0f);
    // The ranks' path: the range quantiser over two parts split at a multiple of 8 (as ZeRO-1's
    // parts are), then the transpose of its bytes; outputs and scale_inv poisoned again.
    dev_poison(out, n), dev_poison(out_t, n);
    Fp8Scale poisoned = dev_download(s, 1)[0];
    poisoned.scale_inv = NAN;
    CUDA_CHECK(cudaMemcpy(s, &poisoned, sizeof(poisoned), cudaMemcpyHostToDevice));
    size_t split = n / 3 / 8 * 8;
    quantize_fp8_range(out, s, xd, split, sms, 0);
    quantize_fp8_range(out + split, s, xd + split, n - split, sms, 0);
    snprintf(what, sizeof(what), "%s quantize range %dx%d in 2 parts%s", name, rows, cols, saturate ? " (saturating)" : "");
    check_bytes(what, fp8_bytes(out, n), want);
    snprintf(what, sizeof(what), "%s range scale_inv %dx%d", name, rows, cols);
    dev_check(what, std::vector<float>{dev_download(s, 1)[0].scale_inv}, std::vector<float>{1.0f / scale}, 0.0f, 0.0f);
    transpose_fp8(out_t, out, rows, cols, 0);
    snprintf(what, sizeof(what), "%s transpose of FP8 bytes %dx%d", name, rows, cols);
    check_bytes(what, fp8_bytes(out_t, n), want_t);
    CUDA_CHECK(cudaFree(xd));
    CUDA_CHECK(cudaFree(out));
    CUDA_CHECK(cudaFree(out_t));
    CUDA_CHECK(cudaFree(s));
}

// The two kernels on a tensor of the step: rows x cols bf16.
template <typename F8> static void time_kernels(int rows, int cols, const char* name, int sms) {
    size_t n = (size_t)rows * cols;
    bf16* x = dev_alloc<bf16>(n);
    fill_normal(x, n);
    F8 *out = dev_alloc<F8>(n), *out_t = dev_alloc<F8>(n);
    Fp8Scale* s = dev_alloc<Fp8Scale>(1);
    CUDA_CHECK(cudaMemset(s, 0, sizeof(Fp8Scale)));
    fp8_amax(s, x, n, sms, 0);
    char size[64], kernel[64];
    snprintf(size, sizeof(size), "%d x %d", rows, cols);
    snprintf(kernel, sizeof(kernel), "amax (%s input)", name);
    print_row(kernel, "1", size, median_ms([&] { fp8_amax(s, x, n, sms, 0); }), 2.0 * n, 0.0, true);
    snprintf(kernel, sizeof(kernel), "quantize %s + transposed", name);
    print_row(kernel, "1 64x64 tile", size, median_ms([&] { quantize_fp8(out, out_t, s, x, rows, cols, 0); }), 4.0 * n,
              0.0, true);
    snprintf(kernel, sizeof(kernel), "quantize %s range", name);
    print_row(kernel, "1", size, median_ms([&] { quantize_fp8_range(out, s, x, n, sms, 0); }), 3.0 * n, 0.0, true);
    snprintf(kernel, sizeof(kernel), "transpose %s bytes", name);
    print_row(kernel, "1 64x64 tile", size, median_ms([&] { transpose_fp8(out_t, out, rows, cols, 0); }), 2.0 * n, 0.0,
              true);
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(out));
    CUDA_CHECK(cudaFree(out_t));
    CUDA_CHECK(cudaFree(s));
}

int main(int argc, char** argv) {
    DevArgs a = dev_args(argc, argv, 1);
    int sms;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    for (bool saturate : {false, true}) {
        validate<e4m3>(128, 192, FP8_E4M3, "e4m3", sms, saturate);
        validate<e5m2>(128, 192, FP8_E5M2, "e5m2", sms, saturate);
    }
    validate<e4m3>(1024, 2048, FP8_E4M3, "e4m3", sms, false); // many blocks: the amax's atomics
    if (!a.check_only) {
        print_header();
        time_kernels<e4m3>(16384, 2048, "e4m3", sms); // x of qkv, gate_up at B=16,T=1024
        time_kernels<e5m2>(16384, 16384, "e5m2", sms); // dy of gate_up
        time_kernels<e4m3>(16384, 8192, "e4m3", sms); // x of down (the SwiGLU output)
    }
    return dev_finish();
}
