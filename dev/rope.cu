// dev/rope.cu: RoPE and the head layout of attention (kernels.cuh rope_permute). Forward: the qkv
// GEMM's token-major rows (B*T, [Q | K | V]) -> head-major q (B, NH, T, HD), k and v (B, KVH, T, HD)
// (one block, q then k then v, as the trainer stores them), RoPE on q and k with the rotary
// pairs adjacent (2i, 2i+1), pair i of position t turned by the angle whose cos and sin the tables hold:
//   y0 = bf16(x0 cos - x1 sin),  y1 = bf16(x1 cos + x0 sin),  products rounded before the add,
// and v copied. Inverse (the backward): head-major -> token-major, rotating by -angle.
// Memory-bound: each direction reads and writes the B*T*(NH + 2 KVH)*HD bf16 once, plus the
// (T, HD/2) fp32 cos and sin tables. The tables are an input of the kernels (the trainer fills
// them with llama3's frequencies, checked against HF transformers by test_llama3); here they hold
// random angles, made in this file, so the reference depends on nothing of the trainer's.
//
// build: make dev/rope
// run:   ./dev/rope          validate every version against a CPU reference, then time them
//        ./dev/rope K        version K only
//        ./dev/rope --check  validate only, no timing (what `make test` runs)
//
// versions (the last is the trainer's own, called through ../kernels.cuh):
//   1  two passes, one thread per element: a permute kernel, then a rotation kernel in place
//      (one thread per rotary pair) on the head-major q and k (forward) or on the Q and K
//      columns of the token-major rows (inverse).
//   2  the trainer's rope_permute(): one fused pass, 8 bf16 (4 pairs, 16 bytes) per thread.
// sizes: LLaMA3.2-1B (NH 32, KVH 8, HD 64) at B=4, T=64 and B=16, T=1024; validated at B=2, T=17,
// NH 4, KVH 2, HD 16 and at B=4, T=64.
#include "common.h"

// Where element e of token n's qkv row [Q | K | V] lives in the head-major block q, k, v.
__host__ __device__ inline size_t head_major_index(HeadShape sh, int n, int e) {
    int C = sh.NH * sh.HD, KVD = sh.KVH * sh.HD, b = n / sh.T, t = n % sh.T, heads = sh.NH;
    size_t N = (size_t)sh.B * sh.T, base = 0;
    if (e >= C + KVD) e -= C + KVD, base = N * (C + KVD), heads = sh.KVH;
    else if (e >= C) e -= C, base = N * C, heads = sh.KVH;
    return base + (((size_t)b * heads + e / sh.HD) * sh.T + t) * sh.HD + e % sh.HD;
}

static int qkv_width(HeadShape sh) { return (sh.NH + 2 * sh.KVH) * sh.HD; }

// ---- version 1: permute, then rotate ----

// token_major (B*T, QKV) <-> the head-major block, one thread per element.
template <bool TO_HEADS> __global__ void permute_qkv_kernel(bf16* token_major, bf16* heads, HeadShape sh) {
    int QKV = (sh.NH + 2 * sh.KVH) * sh.HD;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)sh.B * sh.T * QKV) return;
    size_t h = head_major_index(sh, i / QKV, i % QKV);
    if (TO_HEADS) heads[h] = token_major[i];
    else token_major[i] = heads[h];
}

// RoPE in place on `rows` head rows of HD: row r starts at x + (r / heads) * row_stride +
// (r % heads) * HD and holds position (r / heads) % T. One thread per rotary pair; sign -1
// rotates back. Head-major q and k: heads 1, row_stride HD. Token-major: heads NH + KVH, row_stride QKV.
__global__ void rope_rotate_kernel(bf16* x, const float* rope_cos, const float* rope_sin, size_t rows, int heads,
                                   int row_stride, int T, int HD, float sign) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int half = HD / 2;
    if (i >= rows * half) return;
    size_t r = i / half, n = r / heads;
    int p = i % half, t = n % T;
    bf16* pair = x + n * row_stride + (r % heads) * HD + 2 * p;
    float x0 = __bfloat162float(pair[0]), x1 = __bfloat162float(pair[1]);
    float c = rope_cos[t * half + p], s = sign * rope_sin[t * half + p];
    pair[0] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(x0, c), __fmul_rn(-x1, s)));
    pair[1] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s)));
}

// ---- the versions ----

static void rope_version(int version, bool inverse, bf16* token_major, bf16* heads, const float* rope_cos,
                         const float* rope_sin, HeadShape sh) {
    size_t N = (size_t)sh.B * sh.T, C = (size_t)sh.NH * sh.HD, KVD = (size_t)sh.KVH * sh.HD;
    if (version == 2) {
        rope_permute(inverse, token_major, heads, heads + N * C, heads + N * (C + KVD), rope_cos, rope_sin, sh, 0);
        return;
    }
    size_t elems = N * qkv_width(sh), rows = N * (sh.NH + sh.KVH); // rows of HD to rotate: q and k
    if (!inverse) permute_qkv_kernel<true><<<ceil_div(elems, 256), 256>>>(token_major, heads, sh);
    else permute_qkv_kernel<false><<<ceil_div(elems, 256), 256>>>(token_major, heads, sh);
    LAUNCH_CHECK();
    if (!inverse)
        rope_rotate_kernel<<<ceil_div(rows * sh.HD / 2, 256), 256>>>(heads, rope_cos, rope_sin, rows, 1, sh.HD, sh.T,
                                                                     sh.HD, 1.0f);
    else
        rope_rotate_kernel<<<ceil_div(rows * sh.HD / 2, 256), 256>>>(token_major, rope_cos, rope_sin, rows,
                                                                     sh.NH + sh.KVH, qkv_width(sh), sh.T, sh.HD, -1.0f);
    LAUNCH_CHECK();
}

// ---- CPU reference ----

// The kernels' arithmetic: fp32 products, rounded, added, then bf16.
static void rotate_pair(float* y, const float* x, float c, float s) {
    float a = x[0] * c, b = -x[1] * s, d = x[1] * c, e = x[0] * s;
    y[0] = bf16_round(a + b), y[1] = bf16_round(d + e);
}

// Forward (token_major -> heads) or inverse (heads -> token_major), pair by pair.
static void rope_cpu(bool inverse, std::vector<float>& token_major, std::vector<float>& heads,
                     const std::vector<float>& rope_cos, const std::vector<float>& rope_sin, HeadShape sh) {
    int QKV = qkv_width(sh), rotated = (sh.NH + sh.KVH) * sh.HD, half = sh.HD / 2;
    for (int n = 0; n < sh.B * sh.T; n++)
        for (int e = 0; e < QKV; e += 2) {
            float* tok = &token_major[(size_t)n * QKV + e];
            float* head = &heads[head_major_index(sh, n, e)];
            const float* src = inverse ? head : tok;
            float* dst = inverse ? tok : head;
            int k = (n % sh.T) * half + (e % sh.HD) / 2;
            if (e < rotated) rotate_pair(dst, src, rope_cos[k], inverse ? -rope_sin[k] : rope_sin[k]);
            else dst[0] = src[0], dst[1] = src[1];
        }
}

// ---- validation ----

static std::vector<float> tail(const std::vector<float>& v, size_t from) {
    return std::vector<float>(v.begin() + from, v.end());
}

// cos a and sin a of a random angle a in [-pi, pi) per (position, pair): cos (T, HD/2), then sin.
static std::vector<float> random_rope_tables(HeadShape sh) {
    size_t n = (size_t)sh.T * sh.HD / 2;
    std::vector<float> table(2 * n);
    for (size_t i = 0; i < n; i++) {
        double angle = rng_uniform(-3.14159265f, 3.14159265f);
        table[i] = (float)cos(angle);
        table[n + i] = (float)sin(angle);
    }
    return table;
}

// Fresh random tables, N(0, 1) qkv rows (for the forward and the round trip) and head-major
// gradients (for the inverse). Tolerances:
//   forward and inverse, rotated part: rtol 2^-7, one bf16 ulp (2^-8..2^-7 of the value); the
//     reference does the kernels' fp32 operations, so they should agree bit for bit.
//   v (and V columns): copied, exact.
//   round trip inverse(forward(x)) vs x, rotated part: two bf16 roundings (unit roundoff 2^-8,
//     8 significant bits) of a rotated pair of norm r: |error| <= 2^-8 r (the forward's, a vector
//     of norm <= 2^-8 r rotated back) + 2^-8 |x| (the inverse's), so atol 1.1 * 2^-8 * (largest r)
//     and rtol 2^-8.
static void validate(HeadShape sh, const DevArgs& a, bool* ok) {
    size_t N = (size_t)sh.B * sh.T, total = N * qkv_width(sh), rot_heads = N * (sh.NH + sh.KVH) * sh.HD;
    int QKV = qkv_width(sh), rot_cols = (sh.NH + sh.KVH) * sh.HD, v_cols = sh.KVH * sh.HD;
    std::vector<float> table = random_rope_tables(sh);
    std::vector<float> rope_cos(table.begin(), table.begin() + table.size() / 2);
    std::vector<float> rope_sin(table.begin() + table.size() / 2, table.end());
    std::vector<float> x = from_bf16(to_bf16(random_normal(total))), dheads = from_bf16(to_bf16(random_normal(total)));
    std::vector<float> heads_ref(total), dx_ref(total);
    rope_cpu(false, x, heads_ref, rope_cos, rope_sin, sh);
    rope_cpu(true, dx_ref, dheads, rope_cos, rope_sin, sh);
    double r_max = 0.0;
    for (size_t i = 0; i < total; i += 2) r_max = std::max(r_max, hypot((double)x[i], (double)x[i + 1]));
    float* tables = dev_upload(table);
    bf16 *tok = dev_alloc<bf16>(total), *heads = dev_alloc<bf16>(total);
    char what[128], size[48];
    snprintf(size, sizeof(size), "B=%d T=%d NH=%d KVH=%d HD=%d", sh.B, sh.T, sh.NH, sh.KVH, sh.HD);
    for (int version = 1; version <= 2; version++) {
        if (!dev_selected(a, version)) continue;
        upload_into(tok, x), dev_poison(heads, total);
        rope_version(version, false, tok, heads, tables, tables + table.size() / 2, sh);
        std::vector<float> got = from_bf16(dev_download(heads, total));
        snprintf(what, sizeof(what), "v%d forward %s q, k", version, size);
        ok[version] &= dev_check(what, got.data(), heads_ref.data(), rot_heads, 0.0f, 1.0f / 128);
        snprintf(what, sizeof(what), "v%d forward %s v", version, size);
        ok[version] &= dev_check(what, tail(got, rot_heads), tail(heads_ref, rot_heads), 0.0f, 0.0f);
        dev_poison(tok, total); // round trip: the forward's heads back to token-major
        rope_version(version, true, tok, heads, tables, tables + table.size() / 2, sh);
        got = from_bf16(dev_download(tok, total));
        snprintf(what, sizeof(what), "v%d inverse(forward(x)) %s Q, K", version, size);
        ok[version] &= dev_check(what, columns(got, N, QKV, 0, rot_cols), columns(x, N, QKV, 0, rot_cols),
                                 (float)(1.1 * r_max / 256), 1.0f / 256);
        snprintf(what, sizeof(what), "v%d inverse(forward(x)) %s V", version, size);
        ok[version] &= dev_check(what, columns(got, N, QKV, rot_cols, v_cols), columns(x, N, QKV, rot_cols, v_cols),
                                 0.0f, 0.0f);
        upload_into(heads, dheads), dev_poison(tok, total);
        rope_version(version, true, tok, heads, tables, tables + table.size() / 2, sh);
        got = from_bf16(dev_download(tok, total));
        snprintf(what, sizeof(what), "v%d inverse %s Q, K", version, size);
        ok[version] &= dev_check(what, columns(got, N, QKV, 0, rot_cols), columns(dx_ref, N, QKV, 0, rot_cols), 0.0f,
                                 1.0f / 128);
        snprintf(what, sizeof(what), "v%d inverse %s V", version, size);
        ok[version] &= dev_check(what, columns(got, N, QKV, rot_cols, v_cols),
                                 columns(dx_ref, N, QKV, rot_cols, v_cols), 0.0f, 0.0f);
    }
    CUDA_CHECK(cudaFree(tables));
    CUDA_CHECK(cudaFree(tok));
    CUDA_CHECK(cudaFree(heads));
}

// ---- timing ----

static void time_versions(HeadShape sh, const DevArgs& a, const bool* ok) {
    size_t total = (size_t)sh.B * sh.T * qkv_width(sh);
    double bytes = 4.0 * total + 4.0 * sh.T * sh.HD; // bf16 in and out, fp32 cos and sin (T, HD/2)
    int sets = rotations((size_t)bytes);
    std::vector<float> table = random_rope_tables(sh);
    float* tables = dev_upload(table);
    std::vector<bf16*> tok(sets), heads(sets);
    for (int s = 0; s < sets; s++) {
        tok[s] = dev_alloc<bf16>(total), heads[s] = dev_alloc<bf16>(total);
        fill_normal(tok[s], total), fill_normal(heads[s], total);
    }
    char size[48];
    snprintf(size, sizeof(size), "B=%d T=%d", sh.B, sh.T);
    const char* labels[3] = {"", "1 permute, then rotate", "2 trainer (fused)"};
    for (int version = 1; version <= 2; version++) {
        if (!dev_selected(a, version)) continue;
        for (int inverse = 0; inverse <= 1; inverse++) {
            int r = 0;
            double ms = median_ms([&] {
                int s = r++ % sets;
                rope_version(version, inverse, tok[s], heads[s], tables, tables + table.size() / 2, sh);
            });
            print_row(inverse ? "rope_permute inverse" : "rope_permute forward", labels[version], size, ms, bytes, 0.0,
                      ok[version]);
        }
    }
    for (int s = 0; s < sets; s++) CUDA_CHECK(cudaFree(tok[s])), CUDA_CHECK(cudaFree(heads[s]));
    CUDA_CHECK(cudaFree(tables));
}

int main(int argc, char** argv) {
    DevArgs a = dev_args(argc, argv, 2);
    bool ok[3] = {true, true, true};
    validate(HeadShape{2, 17, 4, 2, 16}, a, ok);
    validate(HeadShape{4, 64, 32, 8, 64}, a, ok);
    if (!a.check_only) {
        copy_ceiling_gbs(); // measured before the table, so its line does not split it
        print_header();
        time_versions(HeadShape{4, 64, 32, 8, 64}, a, ok);
        time_versions(HeadShape{16, 1024, 32, 8, 64}, a, ok);
    }
    return dev_finish();
}
