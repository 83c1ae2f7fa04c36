// dev/adamw.cu: AdamW over a flat fp32 parameter block with torch.optim.AdamW semantics
// (kernels.cuh adamw_update), and the bf16 copy of the parameters that the GEMMs read:
//   g *= grad_scale;  p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps);  shadow = bf16(p)
// The kernels read step t's hyperparameters as the trainer's adamw_next_step writes them; the
// reference (common.h adamw_cpu, fp64) computes the bias corrections itself. Besides the plain
// step, validation covers what the step's guards write into those hyperparameters (kernels.cuh
// clip_guard, loss_guard): a clipping scale grad_scale = 0.37, a launch with decay = false (the
// norm weights: wd = 0), and a step the NaN guard skips (skip = 1: p, m, v and the shadow stay
// as they were, bit for bit).
// Memory-bound: g, p, m, v read (16 bytes per element; 14 with bf16 g, 12 with bf16 m and v), p, m,
// v written (12; 8 with bf16 m and v), shadow written (2).
//
// build: make dev/adamw
// run:   ./dev/adamw          validate every version against a CPU reference, then time them
//        ./dev/adamw K        version K only
//        ./dev/adamw --check  validate only, no timing (what `make test` runs)
//
// versions (3 to 5 and 7 the trainer's paths, called through ../kernels.cuh):
//   1  scalar Adam, one element per thread, no shadow (adamw_kernel<1, false>), then a separate
//      f32 -> bf16 cast of the parameters (cast_to_bf16): the seed's starting point, Adam and
//      then a cast before the GEMMs. 28 + 6 bytes per element.
//   2  scalar Adam writing the bf16 shadow in the same pass (adamw_kernel<1, true>): 30 bytes.
//   3  the trainer's adamw_dense<true>: float4 + shadow when its alignment and minimum-size
//      guards allow, else the scalar kernel. Each row names the path the guard took.
//   4  the same with bf16 gradients (the trainer's matmul weights with --bf16_grads, its
//      default at one micro-step per step): 28 bytes per element.
//   5  version 3 with bf16 moments, stochastically rounded (--optimizer_state bf16): 22 bytes.
//      Its m and v are checked within one bf16 ulp (rtol 2^-7) of the reference from the same
//      bf16 inputs; test_llama3 --bf16_moments checks the rounding itself (unbiased, fresh bits
//      each step, the same bits on a rerun).
//   6  [bf16 weights] no fp32 master: the bf16 weight is the only copy (what the GEMMs read), its
//      update rounded into it stochastically like the moments, with bf16 moments and gradients
//      (adamw_dense<false> on bf16 p, m, v, g): 14 bytes. p, m and v within one bf16 ulp of the
//      reference from the same bf16 inputs, and the rounding itself against a float64 model of
//      it: each of p, m and v rounds up with the probability of its dropped fraction (in each
//      quarter of the fractions, the share rounded up equals the mean fraction within 0.01), and
//      the three draws of an element, and the weight draws of neighbouring elements, are
//      uncorrelated (|r| < 0.01 over 1M elements: sharing bits gives r near 0.5).
//   7  the trainer's [bf16 weights]: version 6 with adamw_update's APPROX, the square root and the two
//      divisions by the special-function unit (2 ulp) instead of IEEE's. Version 6 runs at 90% of the
//      copy rate (H100, 2026-12-07) on about 120 instructions an element, near what the SMs issue in the
//      time of its 14 bytes; this drops about 20 of them: 99% on the largest tensor (H100, the next day).
//      Checked as version 6 is (one bf16 ulp, the rounding's model, the draws).
// sizes: the LLaMA3.2-1B tensors of the seed's Adam table, one launch each, as the trainer
// issues them when it overlaps AdamW with the backward (adamw_tensor); without the overlap it
// walks each range of the parameter block in one launch.
#include "common.h"

// Step 10 of AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.1): weight decay non-zero
// so that its term is tested, the bias corrections far from 1.
static const AdamWStep STEP = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 10};
static const AdamWParams* H_device(void) { // where the kernels read STEP's hyperparameters
    static const AdamWParams* h = dev_adamw_params(STEP);
    return h;
}

typedef struct {
    float *params, *m, *v, *grads; // fp32, updated in place (grads read only)
    bf16* shadow;                  // bf16(params) after the step
    bf16* grads_bf16;              // version 4's gradients: bf16(grads)
    bf16 *m_bf16, *v_bf16;         // version 5's and 6's moments, updated in place
    bf16* params_bf16;             // version 6's weights, updated in place
} AdamBuffers;

static AdamBuffers adam_alloc(size_t n) {
    AdamBuffers b = {dev_alloc<float>(n), dev_alloc<float>(n), dev_alloc<float>(n), dev_alloc<float>(n),
                     dev_alloc<bf16>(n),  dev_alloc<bf16>(n),  dev_alloc<bf16>(n),  dev_alloc<bf16>(n),
                     dev_alloc<bf16>(n)};
    return b;
}
// The same buffers from element i on (i = 1 misaligns every pointer for 128-bit access).
static AdamBuffers adam_at(const AdamBuffers& b, size_t i) {
    AdamBuffers r = {b.params + i, b.m + i, b.v + i, b.grads + i, b.shadow + i, b.grads_bf16 + i, b.m_bf16 + i,
                     b.v_bf16 + i, b.params_bf16 + i};
    return r;
}
static void adam_free(AdamBuffers& b) {
    void* all[] = {b.params, b.m, b.v, b.grads, b.shadow, b.grads_bf16, b.m_bf16, b.v_bf16, b.params_bf16};
    for (void* p : all) CUDA_CHECK(cudaFree(p));
}

// Versions 6 and 7 keep the weights in bf16 (no fp32 master), with bf16 moments and gradients.
static bool bf16_weights(int version) { return version >= 6; }

// The path adamw_dense takes for these buffers (version 3: fp32 grads, 4: bf16, 5: bf16 moments, 6 and 7:
// bf16 weights, moments and grads): its guard (kernels.cuh adamw_vec4_ok), same inputs.
static bool trainer_uses_float4(const AdamBuffers& b, size_t n, int sms, int version) {
    if (version == 4) return adamw_vec4_ok(b.params, b.m, b.v, b.grads_bf16, b.shadow, n, sms);
    if (version == 5) return adamw_vec4_ok(b.params, b.m_bf16, b.v_bf16, b.grads, b.shadow, n, sms);
    if (bf16_weights(version)) return adamw_vec4_ok(b.params_bf16, b.m_bf16, b.v_bf16, b.grads_bf16, (bf16*)NULL, n, sms);
    return adamw_vec4_ok(b.params, b.m, b.v, b.grads, b.shadow, n, sms);
}

// decay: weight decay applies (false: the norm weights' launch).
static void adamw_version(int version, const AdamBuffers& b, size_t n, const AdamWParams* h, bool decay, int sms) {
    const unsigned threads = 256, blocks = ceil_div(n, threads);
    if (version == 1) {
        adamw_kernel<1, false><<<blocks, threads>>>(b.params, b.m, b.v, b.grads, NULL, n, 0, h, decay);
        LAUNCH_CHECK();
        cast_to_bf16(b.shadow, b.params, n, 0);
    } else if (version == 2) {
        adamw_kernel<1, true><<<blocks, threads>>>(b.params, b.m, b.v, b.grads, b.shadow, n, 0, h, decay);
        LAUNCH_CHECK();
    } else if (version == 3) {
        adamw_dense<true>(b.params, b.m, b.v, b.grads, b.shadow, n, 0, h, decay, sms, 0);
    } else if (version == 4) {
        adamw_dense<true>(b.params, b.m, b.v, b.grads_bf16, b.shadow, n, 0, h, decay, sms, 0);
    } else if (version == 5) {
        adamw_dense<true>(b.params, b.m_bf16, b.v_bf16, b.grads, b.shadow, n, 0, h, decay, sms, 0);
    } else if (version == 6) {
        adamw_dense<false>(b.params_bf16, b.m_bf16, b.v_bf16, b.grads_bf16, (bf16*)NULL, n, 0, h, decay, sms, 0);
    } else {
        adamw_dense<false, true>(b.params_bf16, b.m_bf16, b.v_bf16, b.grads_bf16, (bf16*)NULL, n, 0, h, decay, sms, 0);
    }
}

// ---- validation (the CPU reference is common.h's adamw_cpu) ----

static void to_device(float* dst, const std::vector<float>& src) {
    CUDA_CHECK(cudaMemcpy(dst, src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice));
}

// What the step's guard kernels left in the hyperparameters, and the launch's decay flag.
typedef struct {
    const char* name; // "" for the plain step
    float grad_scale; // clip_guard's clipping scale
    bool decay;       // false: the norm weights' launch, no weight decay
    int skip;         // the NaN guard skips the step
} Variant;
static const Variant PLAIN = {"", 1.0f, true, 0};

// [bf16 weights] Version 6's stochastic rounding against a float64 model of it. `exact` is a value
// before rounding (the reference's, in fp32), `got` the kernel's bf16 result. An element rounds its
// magnitude down (exact's upper 16 bits) or up (one bf16 ulp more) with the probability of the
// dropped fraction f (exact's lower 16 bits / 65536); x = up - f has mean 0 in every range of f. An
// element whose result is neither (the kernel's fp32 value a few fp32 ulps from the reference's,
// across a bf16 boundary) is left out (x NaN); they must be under 0.1 %.
static std::vector<double> rounding_residuals(const std::vector<float>& got, const std::vector<float>& exact,
                                              const char* what, bool* ok) {
    size_t n = exact.size(), left_out = 0;
    double up[4] = {0}, frac[4] = {0}, count[4] = {0};
    std::vector<double> x(n);
    for (size_t i = 0; i < n; i++) {
        uint32_t e, g;
        memcpy(&e, &exact[i], 4), memcpy(&g, &got[i], 4);
        double f = (e & 0xFFFFu) / 65536.0;
        int rounded_up = (g >> 16) == (e >> 16) ? 0 : (g >> 16) == (e >> 16) + 1 ? 1 : -1;
        if (rounded_up < 0) {
            x[i] = NAN, left_out++;
            continue;
        }
        x[i] = rounded_up - f;
        int q = (int)(f * 4);
        up[q] += rounded_up, frac[q] += f, count[q]++;
    }
    std::vector<float> share_up(4), mean_frac(4);
    for (int q = 0; q < 4; q++) share_up[q] = up[q] / count[q], mean_frac[q] = frac[q] / count[q];
    char line[192];
    snprintf(line, sizeof(line), "%s: rounded up as often as its fraction, per quarter", what);
    *ok &= dev_check(line, share_up, mean_frac, 0.01f, 0.0f);
    snprintf(line, sizeof(line), "%s: results neither way from the reference (share)", what);
    *ok &= dev_check(line, std::vector<float>{(float)left_out / n}, std::vector<float>{0.0f}, 1e-3f, 0.0f);
    return x;
}
// Pearson's r of a and b[shift..] over the elements where both are defined.
static float correlation(const std::vector<double>& a, const std::vector<double>& b, size_t shift) {
    double sa = 0, sb = 0, saa = 0, sbb = 0, sab = 0, k = 0;
    for (size_t i = 0; i + shift < a.size(); i++) {
        double x = a[i], y = b[i + shift];
        if (std::isnan(x) || std::isnan(y)) continue;
        sa += x, sb += y, saa += x * x, sbb += y * y, sab += x * y, k++;
    }
    double cov = sab / k - sa / k * sb / k;
    return (float)(cov / sqrt((saa / k - sa / k * sa / k) * (sbb / k - sb / k * sb / k)));
}
// The three draws of an element (p's, m's, v's) and the weight draws of neighbours, independent.
static void check_draws(int version, size_t n, const std::vector<float>* got, const std::vector<float>* exact,
                        bool* ok) {
    const char* names[3] = {"params", "m", "v"};
    std::vector<double> x[3];
    char what[96];
    for (int k = 0; k < 3; k++) {
        snprintf(what, sizeof(what), "v%d n=%zu %s", version, n, names[k]);
        x[k] = rounding_residuals(got[k], exact[k], what, ok);
    }
    std::vector<float> r = {correlation(x[0], x[1], 0), correlation(x[0], x[2], 0), correlation(x[1], x[2], 0),
                            correlation(x[0], x[0], 1)};
    snprintf(what, sizeof(what), "v%d n=%zu draws uncorrelated: p-m, p-v, m-v, p[i]-p[i+1]", version, n);
    *ok &= dev_check(what, r, std::vector<float>(4, 0.0f), 0.01f, 0.0f);
}

// Fresh inputs of n elements: p ~ N(0, 0.02) like the init, m and g ~ N(0, 1e-3), v in
// [1e-8, 1e-6] (positive, the scale of g^2). Each selected version runs on them with every
// pointer `offset` floats into its allocation and the shadow poisoned (on a skipped step: set to
// bf16(p), the state the step must leave alone); version 4 reads bf16(g), version 5 bf16(m) and
// bf16(v), version 6 all four in bf16, and their references start from the same rounded values.
// Tolerances: rtol 1e-6, about 8 fp32 ulps: the GPU does these fp32 operations with a few
// roundings (its bias corrections and g * grad_scale are fp32 too), the reference none. atol 1e-6
// of each array's scale (p 0.02, m 1e-3, v 1e-7) for elements whose update cancels to about 0,
// where the error is an ulp of the operands rather than of the result. The shadow must be bf16(p)
// of the GPU's own p, bit for bit. A skipped step: p, m, v equal to the inputs, bit for bit.
// Version 5's m and v, and version 6's p too: rtol 2^-7 (one bf16 ulp at most: stochastic rounding
// goes either way); from 1M elements on, version 6's rounding against its model (check_draws).
static void validate(size_t n, size_t offset, int sms, const DevArgs& a, bool* ok, const Variant& var = PLAIN) {
    std::vector<float> p = random_normal(n, 0.02f), m = random_normal(n, 1e-3f), v = random_uniform(n, 1e-8f, 1e-6f),
                       g = random_normal(n, 1e-3f);
    std::vector<float> g_bf16 = from_bf16(to_bf16(g)), m_bf16 = from_bf16(to_bf16(m)), v_bf16 = from_bf16(to_bf16(v)),
                       p_bf16 = from_bf16(to_bf16(p));
    // fp32; bf16 g; bf16 m, v; all bf16
    std::vector<float> ref_of[4][3] = {{p, m, v}, {p, m, v}, {p, m_bf16, v_bf16}, {p_bf16, m_bf16, v_bf16}};
    AdamWStep step = STEP;
    if (!var.decay) step.weight_decay = 0.0f;
    const std::vector<float>* grads_of[4] = {&g, &g_bf16, &g, &g_bf16};
    for (int k = 0; k < 4 && !var.skip; k++)
        adamw_cpu(ref_of[k][0].data(), ref_of[k][1].data(), ref_of[k][2].data(), grads_of[k]->data(), n, step,
                  var.grad_scale);
    const AdamWParams* h = dev_adamw_params_with(H_device(), var.grad_scale, var.skip);
    AdamBuffers base = adam_alloc(n + offset), b = adam_at(base, offset);
    upload_into(b.grads_bf16, g_bf16);
    for (int version = 1; version <= 7; version++) {
        if (!dev_selected(a, version)) continue;
        to_device(b.params, p);
        upload_into(b.params_bf16, p_bf16);
        to_device(b.m, m);
        to_device(b.v, v);
        upload_into(b.m_bf16, m_bf16);
        upload_into(b.v_bf16, v_bf16);
        to_device(b.grads, g);
        if (var.skip) upload_into(b.shadow, p);
        else dev_poison(b.shadow, n);
        adamw_version(version, b, n, h, var.decay, sms);
        std::vector<float> got[3] = {dev_download(b.params, n), dev_download(b.m, n), dev_download(b.v, n)};
        if (version >= 5) got[1] = from_bf16(dev_download(b.m_bf16, n)), got[2] = from_bf16(dev_download(b.v_bf16, n));
        if (bf16_weights(version)) got[0] = from_bf16(dev_download(b.params_bf16, n));
        const char* path = version >= 3 && trainer_uses_float4(b, n, sms, version) ? "float4" : "scalar";
        const char* names[3] = {"params", "m", "v"};
        const std::vector<float>* refs = ref_of[version == 4 ? 1 : version == 5 ? 2 : bf16_weights(version) ? 3 : 0];
        const float scale[3] = {0.02f, 1e-3f, 1e-7f}, tol = var.skip ? 0.0f : 1e-6f;
        char what[96];
        for (int k = 0; k < 3; k++) {
            snprintf(what, sizeof(what), "v%d %s n=%zu%s%s %s", version, path, n, offset ? " misaligned" : "",
                     var.name, names[k]);
            bool rounded = (bf16_weights(version) || (version == 5 && k > 0)) && !var.skip;
            ok[version] &= dev_check(what, got[k], refs[k], tol * scale[k], rounded ? 1.0f / 128.0f : tol);
        }
        if (bf16_weights(version)) {
            if (n >= 1000000 && !var.skip) check_draws(version, n, got, refs, &ok[version]);
            continue; // (its weights are the GEMMs' bf16 copy: no shadow)
        }
        std::vector<float> shadow_gpu = from_bf16(dev_download(b.shadow, n)), shadow_want(n);
        for (size_t i = 0; i < n; i++) shadow_want[i] = bf16_round(got[0][i]);
        snprintf(what, sizeof(what), "v%d %s n=%zu%s%s shadow == bf16(params)", version, path, n,
                 offset ? " misaligned" : "", var.name);
        ok[version] &= dev_check(what, shadow_gpu, shadow_want, 0.0f, 0.0f);
    }
    adam_free(base);
    CUDA_CHECK(cudaFree((void*)h));
}

// ---- timing ----

static const size_t SIZES[] = {262668288, 16777216, 6291456, 4194304, 2048};
static const char* const SIZE_NAMES[] = {"262,668,288 (wte / lm_head)", "16,777,216 (one MLP matrix)",
                                         "6,291,456 (qkv)", "4,194,304 (attn out)", "2,048 (one RMSNorm weight)"};

// One arena of the largest size, random on the device. A size whose 30 bytes per element fit in
// L2 runs on consecutive slices of the arena, about 200 MB per timed call, and reports the time
// per launch: the working set then streams from DRAM as the large tensors' does.
static void time_versions(const DevArgs& a, const bool* ok, int sms) {
    const size_t n_max = SIZES[0];
    AdamBuffers arena = adam_alloc(n_max);
    init_params(arena.params, n_max, 0.0f, 0.02f, dev_seed(), 0);
    init_params(arena.m, n_max, 0.0f, 1e-3f, dev_seed() + 1, 0);
    init_params(arena.grads, n_max, 0.0f, 1e-3f, dev_seed() + 2, 0);
    init_params(arena.v, n_max, 1e-6f, 0.0f, 0, 0);
    cast_to_bf16(arena.grads_bf16, arena.grads, n_max, 0);
    cast_to_bf16(arena.m_bf16, arena.m, n_max, 0);
    cast_to_bf16(arena.v_bf16, arena.v, n_max, 0);
    cast_to_bf16(arena.params_bf16, arena.params, n_max, 0);
    double largest_of_ceiling = -1.0;
    print_header();
    for (int s = 0; s < (int)(sizeof(SIZES) / sizeof(SIZES[0])); s++) {
        size_t n = SIZES[s], sets = std::min(n_max / n, (size_t)ceil(200e6 / (30.0 * n)));
        for (int version = 1; version <= 7; version++) {
            if (!dev_selected(a, version)) continue;
            double ms = median_ms([&] {
                for (size_t k = 0; k < sets; k++)
                    adamw_version(version, adam_at(arena, k * n), n, H_device(), true, sms);
            }) / sets;
            const double bytes_per_element[8] = {0, 34, 30, 30, 28, 22, 14, 14}; // (the header's counts)
            double bytes = bytes_per_element[version] * n;
            const char* guard = trainer_uses_float4(arena, n, sms, version) ? "float4" : "scalar";
            char label[64];
            if (version == 1) snprintf(label, sizeof(label), "1 scalar, then cast");
            else if (version == 2) snprintf(label, sizeof(label), "2 scalar + shadow");
            else if (version == 3) snprintf(label, sizeof(label), "3 trainer (guard: %s)", guard);
            else if (version == 4) snprintf(label, sizeof(label), "4 trainer, bf16 grads (guard: %s)", guard);
            else if (version == 5) snprintf(label, sizeof(label), "5 trainer, bf16 moments (guard: %s)", guard);
            else if (version == 6) snprintf(label, sizeof(label), "6 bf16 weights, no master (guard: %s)", guard);
            else snprintf(label, sizeof(label), "7 trainer, bf16 weights: v6, approx. sqrt, div (guard: %s)", guard);
            print_row("adamw", label, SIZE_NAMES[s], ms, bytes, 0.0, ok[version]);
            if (version == 3 && s == 0) largest_of_ceiling = bytes / (ms * 1e6) / copy_ceiling_gbs();
        }
    }
    if (largest_of_ceiling >= 0.0)
        printf("version 3 at %zu: %.1f%% of the copy ceiling (the issue's bar: 85%%)\n", n_max,
               100.0 * largest_of_ceiling);
    adam_free(arena);
}

int main(int argc, char** argv) {
    DevArgs a = dev_args(argc, argv, 7);
    int sms;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    bool ok[8] = {true, true, true, true, true, true, true, true};
    // Below the guard's size (scalar), above it with a tail of 3 (float4), a real MLP matrix
    // (float4), and every pointer one float off (the alignment guard: scalar).
    validate(2048, 0, sms, a, ok);
    validate(1000003, 0, sms, a, ok);
    validate(16777216, 0, sms, a, ok);
    validate(1000003, 1, sms, a, ok);
    // The guards' effects, on both paths of the trainer's kernel (float4, and scalar misaligned).
    const Variant guarded[] = {{" grad_scale 0.37", 0.37f, true, 0}, {" decay off", 1.0f, false, 0},
                               {" skipped", 1.0f, true, 1}};
    for (const Variant& var : guarded) {
        validate(1000003, 0, sms, a, ok, var);
        validate(1000003, 1, sms, a, ok, var);
    }
    if (!a.check_only) {
        copy_ceiling_gbs(); // measured before the table, so its line does not split it
        time_versions(a, ok, sms);
    }
    return dev_finish();
}
