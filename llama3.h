// llama3.h: the host-side C of the LLaMA 3 trainer. Config, parameter layout, the two model
// file formats, llm.c token files and the data loader, the RoPE table, and the command line.
// No CUDA in here: `gcc -x c test_llama3_host.c` builds its unit tests on a machine without a GPU.
// Functions that can fail on bad input return 0 on success and -1 with a message in `err`
// (L3_ERR_LEN bytes) that names the file or flag and what is wrong; callers decide to exit.
#pragma once
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define L3_ERR_LEN 512
#define MODEL_MAGIC 20240803
#define MODEL_VERSION_FP32 3
#define TOKENS_MAGIC_LLAMA3 20240801 // uint32 tokens, version 7
#define TOKENS_MAGIC_GPT2 20240520   // uint16 tokens, version 1

static inline int l3_fail(char* err, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, L3_ERR_LEN, fmt, ap);
    va_end(ap);
    return -1;
}

// ---- config ----

typedef struct {
    int max_seq_len; // longest sequence the model was set up for (RoPE table, CLI check)
    int vocab_size;  // V
    int n_layer;     // L
    int n_head;      // NH query heads
    int n_kv_head;   // KVH key/value heads (GQA: NH / KVH query heads share one)
    int n_embd;      // C
    float ffn_dim_multiplier;
    int multiple_of;
    int ffn_hidden; // F, derived from the two fields above
    float norm_eps;
    float rope_theta;
    int use_scaled_rope; // llama3 frequency scaling: factor 32, low 1, high 4, original 8192
} Llama3Config;

// LLaMA 3's FFN width: 4C, two thirds of it, times the multiplier, rounded up to multiple_of.
static inline int ffn_hidden_dim(int n_embd, float multiplier, int multiple_of) {
    int hidden = 2 * (4 * n_embd) / 3;
    hidden = (int)(multiplier * hidden);
    return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

static inline Llama3Config llama3_2_1b_config(void) {
    Llama3Config c = {8192, 128256, 16, 32, 8, 2048, 1.5f, 256, 0, 1e-5f, 500000.0f, 1};
    c.ffn_hidden = ffn_hidden_dim(c.n_embd, c.ffn_dim_multiplier, c.multiple_of);
    return c;
}

static inline int config_check(const Llama3Config* c, const char* source, char* err) {
    if (c->vocab_size <= 0 || c->n_layer <= 0 || c->n_head <= 0 || c->n_kv_head <= 0 ||
        c->n_embd <= 0 || c->max_seq_len <= 0 || c->ffn_hidden <= 0)
        return l3_fail(err, "%s: model config has a non-positive size", source);
    // Bounds far above any LLaMA 3, so that no size computed from them overflows.
    if (c->n_layer > 1024 || c->n_head > 1024 || c->ffn_hidden > (1 << 20) || c->vocab_size > (1 << 24) ||
        c->max_seq_len > (1 << 24))
        return l3_fail(err, "%s: model config out of range (n_layer %d, n_head %d, ffn_hidden %d, vocab_size %d, "
                       "max_seq_len %d)", source, c->n_layer, c->n_head, c->ffn_hidden, c->vocab_size, c->max_seq_len);
    if (c->n_embd % c->n_head != 0 || c->n_head % c->n_kv_head != 0)
        return l3_fail(err, "%s: n_embd %d, n_head %d, n_kv_head %d do not divide evenly", source,
                       c->n_embd, c->n_head, c->n_kv_head);
    // The kernels move 8 bf16 (16 bytes) at a time along C, F, V and the head dimension.
    if (c->n_embd % 8 != 0 || c->ffn_hidden % 8 != 0 || c->vocab_size % 8 != 0 || (c->n_embd / c->n_head) % 8 != 0)
        return l3_fail(err, "%s: n_embd, ffn_hidden, vocab_size and head_dim must be multiples of 8", source);
    if (!(c->norm_eps > 0.0f) || !(c->rope_theta > 0.0f))
        return l3_fail(err, "%s: norm_eps and rope_theta must be positive", source);
    return 0;
}

static inline void config_print(FILE* f, const Llama3Config* c) {
    fprintf(f, "| max_seq_len %d | vocab_size %d | n_layer %d | n_head %d | n_kv_head %d |\n",
            c->max_seq_len, c->vocab_size, c->n_layer, c->n_head, c->n_kv_head);
    fprintf(f, "| n_embd %d | head_dim %d | ffn_hidden %d | norm_eps %g | rope_theta %g | scaled_rope %d |\n",
            c->n_embd, c->n_embd / c->n_head, c->ffn_hidden, c->norm_eps, c->rope_theta,
            c->use_scaled_rope);
}

// ---- parameter layout ----
// All fp32 master weights live in one block, in this order. The matmul weights (lm_head to
// down) are contiguous so their bf16 shadow copies form one block that one Adam launch writes;
// the norm weights come last (read in fp32 by the RMSNorm kernels, no shadow); wte comes first
// (its Adam is the sparse row update). Stacked tensors hold all L layers, layer-major.
// gate_up packs each layer's gate rows then up rows: one GEMM computes both in the forward pass,
// and one GEMM with K = 2F computes their input gradient in the backward pass.
enum {
    P_WTE,        // (V, C) token embedding
    P_LM_HEAD,    // (V, C) untied output projection
    P_QKV,        // (L, C + 2*KVH*HD, C) rows [Q | K | V], RoPE pairs adjacent (Meta order)
    P_ATTN_OUT,   // (L, C, C)
    P_GATE_UP,    // (L, 2F, C) rows [gate | up]
    P_DOWN,       // (L, C, F)
    P_ATTN_NORM,  // (L, C)
    P_FFN_NORM,   // (L, C)
    P_FINAL_NORM, // (C)
    NUM_PARAM_TENSORS
};
static const char* const PARAM_NAMES[NUM_PARAM_TENSORS] = {
    "wte", "lm_head", "qkv", "attn_out", "gate_up", "down", "attn_norm", "ffn_norm", "final_norm"};

typedef struct {
    size_t layer_size[NUM_PARAM_TENSORS]; // elements of one layer (whole tensor if unstacked)
    size_t size[NUM_PARAM_TENSORS];       // elements of the whole tensor
    size_t offset[NUM_PARAM_TENSORS];     // start in the parameter block
    size_t total;
    size_t matmul_begin, matmul_end; // shadowed range [lm_head, down]
    size_t norm_begin;               // norm weights run from here to total
} ParamLayout;

static inline int qkv_dim(const Llama3Config* c) { return c->n_embd + 2 * c->n_kv_head * (c->n_embd / c->n_head); }

static inline ParamLayout param_layout(const Llama3Config* c) {
    ParamLayout p;
    size_t V = c->vocab_size, C = c->n_embd, L = c->n_layer, F = c->ffn_hidden, QKV = qkv_dim(c);
    size_t per_layer[NUM_PARAM_TENSORS] = {V * C, V * C, QKV * C, C * C, 2 * F * C, C * F, C, C, C};
    int stacked[NUM_PARAM_TENSORS] = {0, 0, 1, 1, 1, 1, 1, 1, 0};
    size_t off = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        p.layer_size[i] = per_layer[i];
        p.size[i] = per_layer[i] * (stacked[i] ? L : 1);
        p.offset[i] = off;
        off += p.size[i];
    }
    p.total = off;
    p.matmul_begin = p.offset[P_LM_HEAD];
    p.matmul_end = p.offset[P_ATTN_NORM];
    p.norm_begin = p.offset[P_ATTN_NORM];
    return p;
}

// ---- model files ----
// Two formats share magic 20240803 and version 3 (fp32); see the README's "File formats".
// seed: InfiniTrain's llmc_filepath file, 1024-byte header, tensors in the order of
//       seed_file_segments below. llmc: llm.c's llama3 branch, 2048-byte header, with zero biases.
// A file is read as a list of segments: `count` floats at `file_offset` that go to
// `param_offset` in our layout, or that must be zero (llm.c's biases, param_offset < 0).

typedef enum { MODEL_FILE_SEED = 1, MODEL_FILE_LLMC = 2 } ModelFileFormat;
static inline const char* model_format_name(ModelFileFormat f) {
    return f == MODEL_FILE_SEED ? "seed (InfiniTrain llmc_filepath, 1024-byte header)"
                                : "llm.c llama3 (2048-byte header, zero biases)";
}

typedef struct {
    size_t file_offset;
    size_t count;
    long long param_offset; // -1: a bias that must be all zero
    const char* name;
} FileSegment;

typedef struct {
    FileSegment* seg;
    int n;
    size_t end; // file offset after the last segment = expected file size
} SegmentList;

static inline void seg_push(SegmentList* s, size_t* pos, size_t count, long long param_offset, const char* name) {
    s->seg[s->n++] = (FileSegment){*pos, count, param_offset, name};
    *pos += count * sizeof(float);
}

// The seed format's order: wte, attn_norm(L), qkv(L), attn_out(L), ffn_norm(L), gate(L), up(L),
// down(L), final_norm, lm_head. Gate and up of layer l land in the halves of gate_up[l].
// Also the order of the gradient and parameter blocks of the reference state file.
static inline SegmentList seed_file_segments(const Llama3Config* c, size_t header_bytes) {
    ParamLayout p = param_layout(c);
    SegmentList s = {(FileSegment*)malloc(sizeof(FileSegment) * (8 + 2 * c->n_layer)), 0, 0};
    size_t pos = header_bytes, FC = (size_t)c->ffn_hidden * c->n_embd;
    seg_push(&s, &pos, p.size[P_WTE], p.offset[P_WTE], "wte");
    seg_push(&s, &pos, p.size[P_ATTN_NORM], p.offset[P_ATTN_NORM], "attn_norm");
    seg_push(&s, &pos, p.size[P_QKV], p.offset[P_QKV], "qkv");
    seg_push(&s, &pos, p.size[P_ATTN_OUT], p.offset[P_ATTN_OUT], "attn_out");
    seg_push(&s, &pos, p.size[P_FFN_NORM], p.offset[P_FFN_NORM], "ffn_norm");
    for (int half = 0; half < 2; half++)
        for (int l = 0; l < c->n_layer; l++)
            seg_push(&s, &pos, FC, p.offset[P_GATE_UP] + l * 2 * FC + half * FC, half ? "up" : "gate");
    seg_push(&s, &pos, p.size[P_DOWN], p.offset[P_DOWN], "down");
    seg_push(&s, &pos, p.size[P_FINAL_NORM], p.offset[P_FINAL_NORM], "final_norm");
    seg_push(&s, &pos, p.size[P_LM_HEAD], p.offset[P_LM_HEAD], "lm_head");
    s.end = pos;
    return s;
}

// llm.c's order: wte, lm_head, then each weight (L-stacked) followed by its zero bias; its fc
// weight already packs gate rows then up rows per layer, as our gate_up does.
static inline SegmentList llmc_file_segments(const Llama3Config* c, size_t header_bytes) {
    ParamLayout p = param_layout(c);
    SegmentList s = {(FileSegment*)malloc(sizeof(FileSegment) * 16), 0, 0};
    size_t pos = header_bytes, L = c->n_layer, C = c->n_embd, F = c->ffn_hidden, QKV = qkv_dim(c);
    seg_push(&s, &pos, p.size[P_WTE], p.offset[P_WTE], "wte");
    seg_push(&s, &pos, p.size[P_LM_HEAD], p.offset[P_LM_HEAD], "lm_head");
    seg_push(&s, &pos, p.size[P_ATTN_NORM], p.offset[P_ATTN_NORM], "ln1 weight");
    seg_push(&s, &pos, L * C, -1, "ln1 bias");
    seg_push(&s, &pos, p.size[P_QKV], p.offset[P_QKV], "qkv weight");
    seg_push(&s, &pos, L * QKV, -1, "qkv bias");
    seg_push(&s, &pos, p.size[P_ATTN_OUT], p.offset[P_ATTN_OUT], "attn proj weight");
    seg_push(&s, &pos, L * C, -1, "attn proj bias");
    seg_push(&s, &pos, p.size[P_FFN_NORM], p.offset[P_FFN_NORM], "ln2 weight");
    seg_push(&s, &pos, L * C, -1, "ln2 bias");
    seg_push(&s, &pos, p.size[P_GATE_UP], p.offset[P_GATE_UP], "fc weight");
    seg_push(&s, &pos, L * 2 * F, -1, "fc bias");
    seg_push(&s, &pos, p.size[P_DOWN], p.offset[P_DOWN], "fc proj weight");
    seg_push(&s, &pos, L * C, -1, "fc proj bias");
    seg_push(&s, &pos, p.size[P_FINAL_NORM], p.offset[P_FINAL_NORM], "lnf weight");
    seg_push(&s, &pos, C, -1, "lnf bias");
    s.end = pos;
    return s;
}

static inline long long file_size_of(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static inline int32_t read_i32(const unsigned char* b, int byte) { int32_t v; memcpy(&v, b + byte, 4); return v; }
static inline float read_f32(const unsigned char* b, int byte) { float v; memcpy(&v, b + byte, 4); return v; }

static inline Llama3Config seed_header_config(const unsigned char* h) {
    Llama3Config c;
    c.max_seq_len = read_i32(h, 8), c.vocab_size = read_i32(h, 12), c.n_layer = read_i32(h, 16);
    c.n_head = read_i32(h, 20), c.n_kv_head = read_i32(h, 24), c.n_embd = read_i32(h, 28);
    c.ffn_dim_multiplier = read_f32(h, 32), c.multiple_of = read_i32(h, 36);
    c.norm_eps = read_f32(h, 40), c.rope_theta = read_f32(h, 44), c.use_scaled_rope = read_i32(h, 48);
    return c;
}

static inline Llama3Config llmc_header_config(const unsigned char* h) {
    Llama3Config c;
    c.max_seq_len = read_i32(h, 8), c.vocab_size = read_i32(h, 12), c.n_layer = read_i32(h, 16);
    c.n_head = read_i32(h, 20), c.n_kv_head = read_i32(h, 24), c.n_embd = read_i32(h, 28);
    c.multiple_of = read_i32(h, 32), c.use_scaled_rope = read_i32(h, 36);
    c.ffn_dim_multiplier = read_f32(h, 1024), c.norm_eps = read_f32(h, 1028), c.rope_theta = read_f32(h, 1032);
    return c;
}

// Size a header interpretation implies, or 0 when its fields are not a model.
static inline size_t implied_file_size(Llama3Config* c, ModelFileFormat fmt) {
    if (c->multiple_of <= 0 || c->multiple_of > (1 << 20) || !(c->ffn_dim_multiplier > 0.0f) ||
        c->n_embd <= 0 || c->n_embd > (1 << 20))
        return 0;
    c->ffn_hidden = ffn_hidden_dim(c->n_embd, c->ffn_dim_multiplier, c->multiple_of);
    char scratch[L3_ERR_LEN];
    if (config_check(c, "", scratch) != 0) return 0;
    SegmentList s = fmt == MODEL_FILE_SEED ? seed_file_segments(c, 1024) : llmc_file_segments(c, 2048);
    free(s.seg);
    return s.end;
}

// Reads the header of `path`, tells the two formats apart by the file size each header implies,
// and returns the config and the format.
static inline int model_header_read(const char* path, Llama3Config* cfg, ModelFileFormat* fmt, char* err) {
    long long size = file_size_of(path);
    FILE* f = fopen(path, "rb");
    if (!f || size < 0) return l3_fail(err, "%s: cannot open model file: %s", path, strerror(errno));
    unsigned char h[2048] = {0};
    size_t got = fread(h, 1, sizeof(h), f);
    fclose(f);
    if (got < 1024) return l3_fail(err, "%s: truncated: %zu bytes, shorter than a model header", path, got);
    if (read_i32(h, 0) != MODEL_MAGIC)
        return l3_fail(err, "%s: bad magic %d (expected %d, a LLaMA 3 model file)", path, read_i32(h, 0), MODEL_MAGIC);
    if (read_i32(h, 4) != MODEL_VERSION_FP32)
        return l3_fail(err, "%s: unknown version %d (this trainer reads version 3, fp32 weights)", path, read_i32(h, 4));
    Llama3Config seed = seed_header_config(h), llmc = llmc_header_config(h);
    size_t seed_size = implied_file_size(&seed, MODEL_FILE_SEED);
    size_t llmc_size = got == 2048 ? implied_file_size(&llmc, MODEL_FILE_LLMC) : 0;
    if (seed_size && (long long)seed_size == size) { *cfg = seed, *fmt = MODEL_FILE_SEED; }
    else if (llmc_size && (long long)llmc_size == size) { *cfg = llmc, *fmt = MODEL_FILE_LLMC; }
    else if (!seed_size && !llmc_size)
        return l3_fail(err, "%s: header does not describe a valid model in either format", path);
    else
        return l3_fail(err, "%s: truncated or corrupt: %lld bytes, but its header implies %zu (seed format) or %zu (llm.c format)",
                       path, size, seed_size, llmc_size);
    return config_check(cfg, path, err);
}

// Receives the file's floats for one span of the parameter block (a device copy in the trainer,
// a memcpy in the host tests).
typedef void (*ParamSink)(void* ctx, size_t param_offset, const float* src, size_t count);

// Streams every segment through `buf` (buf_floats long) into `sink`; checks llm.c's biases are zero.
static inline int segments_load(const char* path, const SegmentList* s, float* buf, size_t buf_floats,
                         ParamSink sink, void* ctx, char* err) {
    FILE* f = fopen(path, "rb");
    if (!f) return l3_fail(err, "%s: cannot open: %s", path, strerror(errno));
    for (int i = 0; i < s->n; i++) {
        const FileSegment* g = &s->seg[i];
        if (fseeko(f, (off_t)g->file_offset, SEEK_SET) != 0) {
            fclose(f);
            return l3_fail(err, "%s: cannot seek to tensor %s: %s", path, g->name, strerror(errno));
        }
        for (size_t done = 0; done < g->count;) {
            size_t n = g->count - done < buf_floats ? g->count - done : buf_floats;
            if (fread(buf, sizeof(float), n, f) != n) {
                fclose(f);
                return l3_fail(err, "%s: truncated inside tensor %s", path, g->name);
            }
            if (g->param_offset >= 0) sink(ctx, (size_t)g->param_offset + done, buf, n);
            else
                for (size_t j = 0; j < n; j++)
                    if (buf[j] != 0.0f) {
                        fclose(f);
                        return l3_fail(err, "%s: %s is not zero (LLaMA has no biases)", path, g->name);
                    }
            done += n;
        }
    }
    fclose(f);
    return 0;
}

static inline int model_file_load(const char* path, const Llama3Config* cfg, ModelFileFormat fmt,
                           float* buf, size_t buf_floats, ParamSink sink, void* ctx, char* err) {
    SegmentList s = fmt == MODEL_FILE_SEED ? seed_file_segments(cfg, 1024) : llmc_file_segments(cfg, 2048);
    int rc = segments_load(path, &s, buf, buf_floats, sink, ctx, err);
    free(s.seg);
    return rc;
}

// Writes a header for the seed format (the reference script writes the same bytes).
static inline void seed_header_write(unsigned char h[1024], const Llama3Config* c) {
    int32_t ints[256] = {0};
    ints[0] = MODEL_MAGIC, ints[1] = MODEL_VERSION_FP32, ints[2] = c->max_seq_len, ints[3] = c->vocab_size;
    ints[4] = c->n_layer, ints[5] = c->n_head, ints[6] = c->n_kv_head, ints[7] = c->n_embd;
    memcpy(&ints[8], &c->ffn_dim_multiplier, 4);
    ints[9] = c->multiple_of;
    memcpy(&ints[10], &c->norm_eps, 4);
    memcpy(&ints[11], &c->rope_theta, 4);
    ints[12] = c->use_scaled_rope, ints[13] = 4, ints[14] = 3, ints[15] = 2;
    memcpy(h, ints, 1024);
}

// ---- token files and the data loader ----

typedef struct {
    uint32_t* tokens;
    size_t n_tokens;
} TokenData;

// Parses an llm.c token file image (header + tokens) and checks every token against the vocab.
static inline int tokens_parse(TokenData* d, const unsigned char* bytes, size_t nbytes, const char* name,
                        int vocab_size, char* err) {
    if (nbytes < 1024) return l3_fail(err, "%s: truncated: %zu bytes, shorter than the 1024-byte header", name, nbytes);
    int32_t magic = read_i32(bytes, 0), version = read_i32(bytes, 4), count = read_i32(bytes, 8);
    size_t width;
    if (magic == TOKENS_MAGIC_LLAMA3 && version == 7) width = 4;
    else if (magic == TOKENS_MAGIC_GPT2 && version == 1) width = 2;
    else if (magic == TOKENS_MAGIC_LLAMA3 || magic == TOKENS_MAGIC_GPT2)
        return l3_fail(err, "%s: unknown version %d for magic %d", name, version, magic);
    else return l3_fail(err, "%s: bad magic %d (expected %d for LLaMA 3 or %d for GPT-2 tokens)", name,
                        magic, TOKENS_MAGIC_LLAMA3, TOKENS_MAGIC_GPT2);
    if (count < 0 || (nbytes - 1024) != (size_t)count * width)
        return l3_fail(err, "%s: truncated or corrupt: header says %d tokens of %zu bytes, file holds %zu bytes of tokens",
                       name, count, width, nbytes - 1024);
    d->n_tokens = (size_t)count;
    d->tokens = (uint32_t*)malloc(sizeof(uint32_t) * (count ? count : 1));
    for (size_t i = 0; i < d->n_tokens; i++) {
        uint32_t t;
        if (width == 4) memcpy(&t, bytes + 1024 + 4 * i, 4);
        else { uint16_t t16; memcpy(&t16, bytes + 1024 + 2 * i, 2); t = t16; }
        if (t >= (uint32_t)vocab_size) {
            free(d->tokens), d->tokens = NULL;
            return l3_fail(err, "%s: token id %u at position %zu is >= vocab_size %d", name, t, i, vocab_size);
        }
        d->tokens[i] = t;
    }
    return 0;
}

static inline int tokens_load_file(TokenData* d, const char* path, int vocab_size, char* err) {
    long long size = file_size_of(path);
    FILE* f = fopen(path, "rb");
    if (!f || size < 0) return l3_fail(err, "%s: cannot open token file: %s", path, strerror(errno));
    unsigned char* bytes = (unsigned char*)malloc(size ? size : 1);
    size_t got = fread(bytes, 1, size, f);
    fclose(f);
    int rc = got == (size_t)size ? tokens_parse(d, bytes, size, path, vocab_size, err)
                                 : l3_fail(err, "%s: read %zu of %lld bytes", path, got, size);
    free(bytes);
    return rc;
}

static inline void tokens_free(TokenData* d) { free(d->tokens), d->tokens = NULL, d->n_tokens = 0; }

// Sequential batches like llm.c: x = tokens[pos : pos+B*T], y = tokens[pos+1 : pos+B*T+1];
// pos advances by B*T and wraps to 0 when the next batch would not fit.
typedef struct {
    const TokenData* data;
    size_t batch_tokens; // B*T
    size_t pos;
    int overfit_single_batch;
} DataLoader;

static inline int loader_init(DataLoader* l, const TokenData* d, int B, int T, int overfit, const char* name, char* err) {
    l->data = d, l->batch_tokens = (size_t)B * T, l->pos = 0, l->overfit_single_batch = overfit;
    if (d->n_tokens < l->batch_tokens + 1)
        return l3_fail(err, "%s: not enough tokens for one batch: %zu tokens, B*T+1 = %zu needed", name,
                       d->n_tokens, l->batch_tokens + 1);
    return 0;
}

static inline void loader_next(DataLoader* l, int32_t* inputs, int32_t* targets) {
    if (l->pos + l->batch_tokens + 1 > l->data->n_tokens) l->pos = 0;
    const uint32_t* src = l->data->tokens + l->pos;
    for (size_t i = 0; i < l->batch_tokens; i++) inputs[i] = (int32_t)src[i], targets[i] = (int32_t)src[i + 1];
    if (!l->overfit_single_batch) l->pos += l->batch_tokens;
}

// ---- RoPE ----
// Inverse frequencies as HF transformers computes them for rope_type "llama3" (fp32 results),
// and the (T, HD/2) cos/sin table of angle = fp32(pos * inv_freq), as its rotary embedding does.
static inline void rope_inv_freq(const Llama3Config* c, float* inv_freq) {
    int HD = c->n_embd / c->n_head;
    const double factor = 32.0, low_ff = 1.0, high_ff = 4.0, old_ctx = 8192.0;
    for (int i = 0; i < HD / 2; i++) {
        double f = (float)(1.0 / pow((double)c->rope_theta, (double)(2 * i) / HD));
        if (c->use_scaled_rope) {
            double wavelen = 2.0 * M_PI / f;
            if (wavelen > old_ctx / low_ff) f = f / factor;
            else if (wavelen >= old_ctx / high_ff) {
                double smooth = (old_ctx / wavelen - low_ff) / (high_ff - low_ff);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

static inline void rope_table(const Llama3Config* c, int T, float* cos_out, float* sin_out) {
    int half = c->n_embd / c->n_head / 2;
    float* inv_freq = (float*)malloc(sizeof(float) * half);
    rope_inv_freq(c, inv_freq);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            float angle = (float)t * inv_freq[i];
            cos_out[t * half + i] = (float)cos((double)angle);
            sin_out[t * half + i] = (float)sin((double)angle);
        }
    free(inv_freq);
}

// ---- command line ----
// The seed report's flags (gflags style: --flag value or --flag=value) plus our own.

// Optimisations that can be switched off, one by one, for the ablation (scripts/bench.sh).
enum { GRAD_ZERO_NONE, GRAD_ZERO_MEMSET, GRAD_ZERO_FILL };
typedef struct {
    int shadow_weights;    // 0: cast each fp32 weight to bf16 before every GEMM that reads it
    int vector_adam;       // 0: scalar AdamW kernels
    int grad_zeroing;      // NONE: first gradient GEMM writes; MEMSET/FILL: zero every tensor each step
    int metadata_by_value; // 0: shapes copied host-to-device before each kernel that takes them
    int sparse_embedding;  // 0: dense embedding gradient and AdamW
    int overlap_optimizer; // 0: AdamW after the backward pass instead of on a second stream during it
    int flash_attention;   // 0: unfused attention (batched GEMMs, T x T scores in memory)
    int bf16_grads;        // 0: fp32 matmul weight gradients even when one micro-step makes the step
    int cuda_graph;        // 0: launch every kernel of every step from the host
    int fused_rmsnorm;     // 0: RMSNorm (and its residual add) as separate ops, as autograd runs it
    int deferred_adamw;    // layers 0..K-1 whose AdamW runs during the next step's forward; 0: none;
                           // -1 (not given): deferred_layers()
    int delete_fills;      // 0: zero-fill the attention and head-permute backward outputs first
} Switches;

typedef struct {
    const char* input_bin;     // NULL: the embedded default data set
    const char* llmc_filepath; // NULL: random init (LLaMA3.2-1B shape, std 0.02, norms 1)
    const char* log_file;      // NULL: no JSON log
    int num_iteration, batch_size, sequence_length, total_batch_size;
    float learning_rate, weight_decay, beta1, beta2, eps;
    int overfit_single_batch;
    unsigned long long seed;
    Switches sw;
    int help; // --help or -h: print the usage and exit
} TrainArgs;

static inline TrainArgs train_args_default(void) {
    TrainArgs a = {NULL, NULL, NULL, 100, 4, 64, 256, 1e-5f, 0.0f, 0.9f, 0.999f, 1e-8f, 0, 42,
                   {1, 1, GRAD_ZERO_NONE, 1, 1, 1, 1, 1, 1, 1, -1, 1}, 0};
    return a;
}

// Layers whose AdamW is deferred: --deferred_adamw's value (12 when not given), capped at the
// model's layers (a 2-layer model defers both).
static inline int deferred_layers(const Switches* sw, int n_layer) {
    int k = sw->deferred_adamw >= 0 ? sw->deferred_adamw : 12;
    return k < n_layer ? k : n_layer;
}

static inline void print_usage(FILE* f, const char* prog) {
    fprintf(f,
            "usage: %s [flags]  (--flag value or --flag=value)\n"
            "  --help, -h               this text\n"
            "  --input_bin PATH         llm.c token file (default: embedded tiny shakespeare)\n"
            "  --llmc_filepath PATH     model file, seed or llm.c format (default: random init)\n"
            "  --num_iteration N        optimizer steps (100)\n"
            "  --batch_size B           sequences per micro-batch (4)\n"
            "  --sequence_length T      tokens per sequence (64)\n"
            "  --total_batch_size N     tokens per optimizer step, a multiple of B*T (256)\n"
            "  --learning_rate F        AdamW lr (1e-5)\n"
            "  --weight_decay F         AdamW decoupled weight decay (0)\n"
            "  --beta1 F --beta2 F      AdamW betas (0.9, 0.999)\n"
            "  --eps F                  AdamW eps (1e-8)\n"
            "  --seed N                 random init seed (42)\n"
            "  --overfit_single_batch B 1: train on the first batch only (0)\n"
            "  --log_file PATH          write one JSON line per step\n"
            "  --dtype bfloat16         the only precision (bf16 matmuls, fp32 master weights)\n"
            "  --device cuda            the only device\n"
            "optimisations (all on by default; off for the ablation):\n"
            "  --sparse_embedding B     1: lazy row-sparse AdamW on wte; 0: dense AdamW\n"
            "  --overlap_optimizer B    1: AdamW of each layer on a second stream during the backward\n"
            "  --shadow_weights B       1: AdamW writes bf16 copies; 0: cast before every GEMM\n"
            "  --vector_adam B          1: 128-bit AdamW; 0: scalar\n"
            "  --metadata_by_value B    1: shapes as kernel arguments; 0: copied host-to-device per launch\n"
            "  --flash_attention B      1: flash attention; 0: unfused (scores and P in memory)\n"
            "  --bf16_grads B           1: matmul weight gradients in bf16 when grad_accum is 1; 0: fp32\n"
            "  --cuda_graph B           1: steps 2.. replay one CUDA graph (needs metadata_by_value 1)\n"
            "  --fused_rmsnorm B        1: one kernel per RMSNorm forward/backward; 0: separate ops\n"
            "  --delete_fills B         1: no fill before a kernel that overwrites its whole output; 0: the\n"
            "                           seed's fills before the attention and head-permute backward outputs\n"
            "  --deferred_adamw K       AdamW of layers 0..K-1 during the next step's forward (12, or all\n"
            "                           of a smaller model's; needs overlap_optimizer 1 and grad_zeroing\n"
            "                           none; 0: every layer's AdamW in its own step)\n"
            "  --grad_zeroing MODE      none: first gradient GEMM writes; memset or fill: zero grads each step\n",
            prog);
}

static inline int parse_int(const char* flag, const char* s, long long lo, long long hi, long long* out, char* err) {
    char* end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return l3_fail(err, "%s: bad value '%s' (an integer in [%lld, %lld])", flag, s, lo, hi);
    *out = v;
    return 0;
}

static inline int parse_float(const char* flag, const char* s, double lo, double hi, float* out, char* err) {
    char* end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return l3_fail(err, "%s: bad value '%s' (a number in [%g, %g])", flag, s, lo, hi);
    *out = (float)v;
    return 0;
}

static inline int parse_bool(const char* flag, const char* s, int* out, char* err) {
    if (!strcmp(s, "1") || !strcmp(s, "true")) *out = 1;
    else if (!strcmp(s, "0") || !strcmp(s, "false")) *out = 0;
    else return l3_fail(err, "%s: bad value '%s' (0, 1, true or false)", flag, s);
    return 0;
}

// Applies one flag and its value.
static inline int apply_flag(TrainArgs* a, const char* flag, const char* val, char* err) {
    long long v = 0;
    const long long BIG = 1LL << 30;
#define INT_FLAG(NAME, FIELD, LO, HI)                                          \
    if (!strcmp(flag, NAME)) {                                                 \
        if (parse_int(flag, val, LO, HI, &v, err)) return -1;                  \
        a->FIELD = (int)v;                                                     \
        return 0;                                                              \
    }
#define FLOAT_FLAG(NAME, FIELD, LO, HI) \
    if (!strcmp(flag, NAME)) return parse_float(flag, val, LO, HI, &a->FIELD, err);
    if (!strcmp(flag, "--input_bin")) { a->input_bin = val; return 0; }
    if (!strcmp(flag, "--llmc_filepath")) { a->llmc_filepath = val; return 0; }
    if (!strcmp(flag, "--log_file")) { a->log_file = val; return 0; }
    INT_FLAG("--num_iteration", num_iteration, 1, BIG)
    INT_FLAG("--batch_size", batch_size, 1, BIG)
    INT_FLAG("--sequence_length", sequence_length, 1, BIG)
    INT_FLAG("--total_batch_size", total_batch_size, 1, BIG)
    INT_FLAG("--deferred_adamw", sw.deferred_adamw, 0, BIG)
    FLOAT_FLAG("--learning_rate", learning_rate, 0.0, 10.0)
    FLOAT_FLAG("--weight_decay", weight_decay, 0.0, 10.0)
    FLOAT_FLAG("--beta1", beta1, 0.0, 0.999999)
    FLOAT_FLAG("--beta2", beta2, 0.0, 0.999999999)
    FLOAT_FLAG("--eps", eps, 1e-30, 1.0)
    if (!strcmp(flag, "--seed")) {
        if (parse_int(flag, val, 0, 0x7fffffffffffffffLL, &v, err)) return -1;
        a->seed = (unsigned long long)v;
        return 0;
    }
    if (!strcmp(flag, "--overfit_single_batch")) return parse_bool(flag, val, &a->overfit_single_batch, err);
    if (!strcmp(flag, "--sparse_embedding")) return parse_bool(flag, val, &a->sw.sparse_embedding, err);
    if (!strcmp(flag, "--overlap_optimizer")) return parse_bool(flag, val, &a->sw.overlap_optimizer, err);
    if (!strcmp(flag, "--shadow_weights")) return parse_bool(flag, val, &a->sw.shadow_weights, err);
    if (!strcmp(flag, "--vector_adam")) return parse_bool(flag, val, &a->sw.vector_adam, err);
    if (!strcmp(flag, "--flash_attention")) return parse_bool(flag, val, &a->sw.flash_attention, err);
    if (!strcmp(flag, "--metadata_by_value")) return parse_bool(flag, val, &a->sw.metadata_by_value, err);
    if (!strcmp(flag, "--bf16_grads")) return parse_bool(flag, val, &a->sw.bf16_grads, err);
    if (!strcmp(flag, "--cuda_graph")) return parse_bool(flag, val, &a->sw.cuda_graph, err);
    if (!strcmp(flag, "--fused_rmsnorm")) return parse_bool(flag, val, &a->sw.fused_rmsnorm, err);
    if (!strcmp(flag, "--delete_fills")) return parse_bool(flag, val, &a->sw.delete_fills, err);
    if (!strcmp(flag, "--grad_zeroing")) {
        if (!strcmp(val, "none")) a->sw.grad_zeroing = GRAD_ZERO_NONE;
        else if (!strcmp(val, "memset")) a->sw.grad_zeroing = GRAD_ZERO_MEMSET;
        else if (!strcmp(val, "fill")) a->sw.grad_zeroing = GRAD_ZERO_FILL;
        else return l3_fail(err, "--grad_zeroing: bad value '%s' (none, memset or fill)", val);
        return 0;
    }
    if (!strcmp(flag, "--dtype"))
        return strcmp(val, "bfloat16") ? l3_fail(err, "--dtype: '%s' is not supported (only bfloat16)", val) : 0;
    if (!strcmp(flag, "--device"))
        return strcmp(val, "cuda") ? l3_fail(err, "--device: '%s' is not supported (only cuda)", val) : 0;
#undef INT_FLAG
#undef FLOAT_FLAG
    return l3_fail(err, "unknown flag '%s'", flag);
}

static inline int is_bool_flag(const char* flag) {
    const char* bools[] = {"--overfit_single_batch", "--sparse_embedding", "--overlap_optimizer",
                           "--shadow_weights", "--vector_adam", "--metadata_by_value", "--flash_attention",
                           "--bf16_grads", "--cuda_graph", "--fused_rmsnorm", "--delete_fills"};
    for (size_t i = 0; i < sizeof(bools) / sizeof(bools[0]); i++)
        if (!strcmp(flag, bools[i])) return 1;
    return 0;
}

// --flag value or --flag=value; a bool flag given without a value (next arg absent or a flag)
// means true. --help or -h stops the parse with a->help set.
static inline int train_args_parse(TrainArgs* a, int argc, char** argv, char* err) {
    *a = train_args_default();
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            a->help = 1;
            return 0;
        }
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') return l3_fail(err, "unexpected argument '%s'", arg);
        char flag[128];
        const char* eq = strchr(arg, '=');
        const char* val;
        if (eq) {
            size_t n = (size_t)(eq - arg) < sizeof(flag) - 1 ? (size_t)(eq - arg) : sizeof(flag) - 1;
            memcpy(flag, arg, n), flag[n] = '\0', val = eq + 1;
        } else {
            snprintf(flag, sizeof(flag), "%s", arg);
            int next_is_value = i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0;
            if (next_is_value) val = argv[++i];
            else if (is_bool_flag(flag)) val = "1";
            else return l3_fail(err, "%s: missing value", flag);
        }
        if (apply_flag(a, flag, val, err)) return -1;
    }
    return 0;
}

// The widths the kernels of kernels.cuh take: RMSNorm rows of at most 8192 (one row in a block's
// registers, 8 values per thread; train_llama3.cu ties this to the kernel's constant) and, for
// flash attention, head_dim 32 or 64.
#define LLAMA3_MAX_N_EMBD 8192
static inline int kernel_limits_check(const Llama3Config* c, int flash_attention, char* err) {
    if (c->n_embd > LLAMA3_MAX_N_EMBD)
        return l3_fail(err, "n_embd %d is more than the %d the RMSNorm kernels take", c->n_embd, LLAMA3_MAX_N_EMBD);
    const int head_dim = c->n_embd / c->n_head;
    if (flash_attention && head_dim != 32 && head_dim != 64)
        return l3_fail(err, "flash attention supports head_dim 32 or 64, not %d: use --flash_attention 0", head_dim);
    return 0;
}

// Checks that need the model: the widths the kernels take, sequence length, B*T dividing the
// total batch, deferred layers.
static inline int train_args_check(const TrainArgs* a, const Llama3Config* c, char* err) {
    if (kernel_limits_check(c, a->sw.flash_attention, err)) return -1;
    if (a->sw.deferred_adamw > c->n_layer)
        return l3_fail(err, "--deferred_adamw %d is more than the model's %d layers", a->sw.deferred_adamw, c->n_layer);
    if (a->sequence_length > c->max_seq_len)
        return l3_fail(err, "--sequence_length %d is longer than the model allows (max_seq_len %d)",
                       a->sequence_length, c->max_seq_len);
    long long bt = (long long)a->batch_size * a->sequence_length;
    if (bt > (1LL << 30)) return l3_fail(err, "--batch_size * --sequence_length = %lld is too large", bt);
    if (a->total_batch_size % bt != 0)
        return l3_fail(err, "--total_batch_size %d is not a multiple of batch_size*sequence_length = %lld",
                       a->total_batch_size, bt);
    return 0;
}
