// test_llama3_host.c: unit tests of llama3.h (config, layout, file formats, loader, CLI, switches, the
// step plan, RoPE) with gcc alone, no GPU. Crafted files go to a temporary directory. Ends with
// "N passed, M failed". Each case that could block has its own time limit (limit_start), the run as
// a whole none, so a loaded machine only makes it slower. Checked so (issue 45, 2 cores): beside two
// `nice -n 19 sh -c 'while :; do :; done' &` loops it passed in 36 s (34 s alone); beside four such
// loops at nice 0 and another user's nvcc builds, in 207 s, where the single alarm(120) it had
// before ended it with exit 142.
#define _GNU_SOURCE // (unshare, for a read-only mount in a child)
#include "llama3.h"

#include <float.h>
#include <limits.h>
#include <signal.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// Under AddressSanitizer (make builds this test with it), a malloc that cannot be served returns
// NULL as it does without it, so the trainer's own out-of-memory message is what gets tested (ASan
// still warns "failed to allocate" on stderr, which without_stderr silences: not a report).
const char* __asan_default_options(void) { return "allocator_may_return_null=1"; }

static int n_passed = 0, n_failed = 0;
static char tmpdir[256];

// One result line, "ok   ..." or "FAIL ...": a line break in what it shows (a decoded text, an error)
// is printed as \n, so that every result is one line of the output.
__attribute__((format(printf, 2, 3))) static void check_line(int ok, const char* fmt, ...) {
    char msg[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    printf("%s ", ok ? "ok  " : "FAIL");
    for (const char* p = msg; *p; p++) {
        if (*p == '\n') fputs("\\n", stdout);
        else putchar(*p);
    }
    putchar('\n');
    ok ? n_passed++ : n_failed++;
}
#define CHECK(cond, ...)              \
    do {                              \
        int ok_ = (cond);             \
        check_line(ok_, __VA_ARGS__); \
    } while (0)

// Time limits: each case that could block (an open of a FIFO, a rendezvous waiting for other ranks)
// runs under its own alarm, and one still running at its limit fails by name and ends the run. The
// run as a whole has none: on a slow or loaded machine it only takes longer. The cases' own waits
// are 10 s at most (a rendezvous round) and an open takes microseconds.
#define CASE_LIMIT_S 30
static char limit_msg[600];
static void limit_expired(int sig) {
    (void)sig;
    ssize_t w = write(STDOUT_FILENO, limit_msg, strlen(limit_msg)); // (async-signal-safe, unlike printf)
    (void)w;
    _exit(1);
}
static void limit_start(const char* what) {
    snprintf(limit_msg, sizeof(limit_msg), "FAIL %s: still running after its %d s time limit (blocked, or waiting "
             "without end)\n", what, CASE_LIMIT_S);
    signal(SIGALRM, limit_expired);
    alarm(CASE_LIMIT_S);
}
static void limit_end(void) { alarm(0); }

// A function that must fail: its message must mention every given fragment.
static void expect_error(int rc, const char* err, const char* what, const char* frag1, const char* frag2) {
    int ok = rc != 0 && strstr(err, frag1) && (!frag2 || strstr(err, frag2));
    CHECK(ok, "%s -> \"%s\"", what, rc ? err : "(no error)");
}

// without_stderr() sends stderr to /dev/null until with_stderr(its result): a deliberate failure whose
// warning (ASan's "failed to allocate") is expected stays off the output. A sanitizer report in between
// still ends the run (-fno-sanitize-recover), with its exit code.
static int without_stderr(void) {
    fflush(stderr);
    int saved = dup(2), null = open("/dev/null", O_WRONLY);
    dup2(null, 2);
    close(null);
    return saved;
}
static void with_stderr(int saved) {
    dup2(saved, 2);
    close(saved);
}

static const char* tmp_path(const char* name) {
    static char buf[4][512];
    static int i = 0;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof(buf[i]), "%s/%s", tmpdir, name);
    return buf[i];
}

static void write_file(const char* path, const void* a, size_t na, const void* b, size_t nb) {
    FILE* f = fopen(path, "wb");
    if (na) fwrite(a, 1, na, f);
    if (nb) fwrite(b, 1, nb, f);
    fclose(f);
}

// What was printed to f (a tmpfile), NUL-terminated, to free; f is closed. Empty if it cannot be read.
static char* printed_text(FILE* f) {
    long size = ftell(f);
    char* text = calloc(size + 1, 1);
    rewind(f);
    if (fread(text, 1, size, f) != (size_t)size) text[0] = '\0';
    fclose(f);
    return text;
}

static Llama3Config small_config(void) {
    Llama3Config c = {256, 1000, 2, 8, 2, 256, 1.5f, 256, 0, 1e-5f, 500000.0f, 1, 0, LLAMA3_2_ROPE_FACTOR};
    c.ffn_hidden = ffn_hidden_dim(c.n_embd, c.ffn_dim_multiplier, c.multiple_of);
    return c;
}

static void test_config_and_layout(void) {
    Llama3Config c = llama3_2_1b_config();
    ParamLayout p = param_layout(&c);
    CHECK(c.ffn_hidden == 8192, "1B ffn_hidden = %d (8192)", c.ffn_hidden);
    CHECK(p.total == 1498482688ull, "1B parameter count = %zu (1,498,482,688)", p.total);
    CHECK(qkv_dim(&c) == 3072, "1B qkv rows = %d (2048 + 2*512)", qkv_dim(&c));
    int contiguous = 1;
    for (int i = 1; i < NUM_PARAM_TENSORS; i++) contiguous &= p.offset[i] == p.offset[i - 1] + p.size[i - 1];
    CHECK(contiguous && p.matmul_begin == p.offset[P_LM_HEAD] && p.matmul_end == p.offset[P_ATTN_NORM],
          "tensors contiguous; shadowed range is lm_head..down");
    CHECK(p.total - p.norm_begin == (size_t)(2 * c.n_layer + 1) * c.n_embd, "norm weights last: %zu",
          p.total - p.norm_begin);
    char err[L3_ERR_LEN];
    Llama3Config bad = c;
    bad.n_kv_head = 5;
    expect_error(config_check(&bad, "cfg", err), err, "n_head not divisible by n_kv_head", "divide", NULL);
    bad = c, bad.vocab_size = 1001;
    expect_error(config_check(&bad, "cfg", err), err, "vocab_size not a multiple of 8", "multiples of 8", NULL);
    bad = c, bad.n_layer = 1 << 30;
    expect_error(config_check(&bad, "cfg", err), err, "n_layer past its bound", "out of range", "n_layer 1073741824");
}

// The tensor table, for the small shape (untied and tied) and the 1B, 3B and 8B: the slices tile the
// parameter block in order; the groups are the step plan's (wte, each layer, the head) and hold
// every slice once; the sum-of-squares slots are distinct and in range, in the order the reduction
// over them has always had (wte 0, lm_head 1, final norm 2, layer l's qkv .. ffn_norm at 3 + 6 l ..),
// so that the norm keeps its bits; the FP8 slots 0..4L-1 once each, on the block linears only, and
// their FP8 copies and transposed inputs tile their buffers.
static void check_tensor_table(const Llama3Config* c, const char* name) {
    ParamLayout p = param_layout(c);
    TensorTable tab = tensor_table(c);
    int L = c->n_layer, C = c->n_embd, F = c->ffn_hidden, errors = 0;
    size_t next = 0, fp8_next = 0;
    int* sumsq_seen = calloc(tab.n_sumsq_slots, sizeof(int));
    int* fp8_seen = calloc(tab.n_fp8_slots, sizeof(int));
    int* group_seen = calloc(tab.n_slices, sizeof(int));
    for (int j = 0; j < tab.n_slices; j++) {
        const TensorSlice* s = &tab.slice[j];
        int t = s->tensor, l = s->layer;
        bool stacked = t >= P_QKV && t <= P_FFN_NORM, linear = t >= P_QKV && t <= P_DOWN;
        errors += s->offset != next || s->n != p.layer_size[t] || slice_of(&tab, t, l) != s;
        next = s->offset + s->n;
        errors += s->group != (t == P_WTE ? 0 : stacked ? 1 + l : L + 1);
        int slot = t == P_WTE ? 0 : t == P_LM_HEAD ? 1 : t == P_FINAL_NORM ? 2 : 3 + 6 * l + (t - P_QKV);
        errors += s->sumsq_slot != slot || s->sumsq_slot >= tab.n_sumsq_slots || sumsq_seen[s->sumsq_slot]++;
        errors += linear != (s->fp8_slot >= 0);
        if (linear) {
            errors += s->fp8_slot >= tab.n_fp8_slots || fp8_seen[s->fp8_slot]++ || s->fp8_weight_at != fp8_next;
            errors += (size_t)s->out * s->in != s->n;
            size_t cols_before = (size_t)l * (3 * C + F) + (size_t)(t == P_DOWN ? 3 : t - P_QKV) * C;
            errors += s->fp8_input_cols != cols_before || s->fp8_input_cols + s->in > tab.fp8_input_cols;
            fp8_next += s->n;
        }
    }
    for (int g = 0; g < tab.n_groups; g++)
        for (int k = tab.group_start[g]; k < tab.group_start[g + 1]; k++)
            errors += tab.slice[tab.in_group[k]].group != g || group_seen[tab.in_group[k]]++;
    for (int j = 0; j < tab.n_slices; j++) errors += group_seen[j] != 1;
    for (int i = 0; i < tab.n_fp8_slots; i++) errors += fp8_seen[i] != 1;
    const TensorSlice* head = &tab.slice[tab.in_group[tab.group_start[L + 1]]];
    CHECK(errors == 0 && next == p.total && fp8_next == tab.fp8_weights &&
              tab.fp8_weights == p.offset[P_ATTN_NORM] - p.offset[P_QKV] && tab.n_groups == L + 2 &&
              tab.group_start[tab.n_groups] == tab.n_slices && tab.group_start[L + 2] - tab.group_start[L + 1] ==
              (c->tied_embeddings ? 1 : 2) && head->tensor == P_FINAL_NORM &&
              tab.in_group[tab.group_start[1]] == tab.first[P_QKV] && tab.first[P_LM_HEAD] == (c->tied_embeddings ? -1 : 1),
          "tensor table, %s: %d slices tile the block, %d groups, %d sum-of-squares slots, %d FP8 slots (%d errors)",
          name, tab.n_slices, tab.n_groups, tab.n_sumsq_slots, tab.n_fp8_slots, errors);
    free(sumsq_seen), free(fp8_seen), free(group_seen);
    tensor_table_free(&tab);
}
static void test_tensor_table(void) {
    Llama3Config c = small_config();
    check_tensor_table(&c, "small");
    c.tied_embeddings = 1;
    check_tensor_table(&c, "small, tied");
    for (int shape = SHAPE_1B; shape <= SHAPE_8B; shape++) {
        c = family_config(shape);
        check_tensor_table(&c, SHAPE_NAMES[shape]);
    }
}

// Every parameter is written by exactly one segment of both file formats.
static void test_segments_cover_params(void) {
    Llama3Config c = small_config();
    ParamLayout p = param_layout(&c);
    for (int fmt = MODEL_FILE_SEED; fmt <= MODEL_FILE_LLMC; fmt++) {
        SegmentList s = fmt == MODEL_FILE_SEED ? seed_file_segments(&c, 1024) : llmc_file_segments(&c, 2048, 4);
        unsigned char* hits = calloc(p.total, 1);
        for (int i = 0; i < s.n; i++)
            if (s.seg[i].param_offset >= 0)
                for (size_t j = 0; j < s.seg[i].count; j++) hits[s.seg[i].param_offset + j]++;
        size_t bad = 0;
        for (size_t j = 0; j < p.total; j++) bad += hits[j] != 1;
        CHECK(bad == 0, "%s: each parameter read exactly once (%zu not)", fmt == MODEL_FILE_SEED ? "seed" : "llm.c", bad);
        free(hits), free(s.seg);
    }
    Llama3Config big = llama3_2_1b_config();
    SegmentList s = seed_file_segments(&big, 1024);
    CHECK(s.end == 1024 + 4 * 1498482688ull, "1B seed file size %zu", s.end);
    free(s.seg);
}

// A small seed-format file whose values are their own file positions; checks the mapping.
static float* seed_file_values(const Llama3Config* c, size_t* n) {
    *n = param_layout(c).total;
    float* v = malloc(*n * sizeof(float));
    for (size_t i = 0; i < *n; i++) v[i] = (float)(i % 1000003) + 1.0f;
    return v;
}

static void host_sink(void* ctx, size_t offset, const float* src, size_t count) {
    memcpy((float*)ctx + offset, src, count * sizeof(float));
}
// A whole checkpoint of one rank, as the trainer's writer thread saves it (without hf/).
static int checkpoint_write(const char* dir, const Llama3Config* c, const CheckpointState* st, const float* params,
                            const void* adam_m, const void* adam_v, char* err) {
    return checkpoint_write_model(dir, c, st->step, params, err) || checkpoint_write_state(dir, st, adam_m, adam_v, err);
}

// A seed file `name` of config c in the temporary folder: its header in h, its values (n) in *vals.
static const char* seed_file_make(const char* name, const Llama3Config* c, unsigned char h[1024], float** vals,
                                  size_t* n) {
    *vals = seed_file_values(c, n);
    seed_header_write(h, c);
    const char* path = tmp_path(name);
    write_file(path, h, 1024, *vals, *n * 4);
    return path;
}

static void test_seed_model_file(void) {
    Llama3Config c = small_config(), got;
    size_t n;
    float* vals;
    unsigned char h[1024];
    const char* path = seed_file_make("seed.bin", &c, h, &vals, &n);
    char err[L3_ERR_LEN];
    ModelFileFormat fmt;
    int rc = model_header_read(path, &got, &fmt, err);
    CHECK(rc == 0 && fmt == MODEL_FILE_SEED, "seed file detected as seed format (%s)", rc ? err : "ok");
    CHECK(got.n_layer == 2 && got.n_embd == 256 && got.ffn_hidden == 1024 && got.n_kv_head == 2 &&
              got.rope_theta == 500000.0f && got.use_scaled_rope == 1 && got.norm_eps == 1e-5f &&
              got.rope_factor == 32.0f,
          "seed header fields round-trip");
    Llama3Config factor8 = c;
    factor8.rope_factor = 8.0f;
    unsigned char h8[1024];
    seed_header_write(h8, &factor8);
    Llama3Config got8 = seed_header_config(h8);
    memset(h8 + 68, 0, 4); // slot 17 as the seed's own files have it
    CHECK(got8.rope_factor == 8.0f && seed_header_config(h8).rope_factor == 32.0f,
          "seed header slot 17: rope_factor 8 round-trips, 0 reads as Llama-3.2's 32");
    ParamLayout p = param_layout(&c);
    float* params = calloc(n, sizeof(float));
    float buf[777]; // a chunk size that does not divide any tensor
    rc = model_file_load(path, &c, fmt, buf, 777, host_sink, params, err);
    size_t FC = (size_t)c.ffn_hidden * c.n_embd, L = c.n_layer;
    // file order: wte, attn_norm, qkv, attn_out, ffn_norm, gate(L), up(L), down, final_norm, lm_head
    size_t gate_file = p.size[P_WTE] + p.size[P_ATTN_NORM] + p.size[P_QKV] + p.size[P_ATTN_OUT] + p.size[P_FFN_NORM];
    size_t up_file = gate_file + L * FC, lm_head_file = n - p.size[P_LM_HEAD];
    int ok = rc == 0 && params[p.offset[P_WTE]] == vals[0] &&
             params[p.offset[P_GATE_UP] + 2 * FC + 5] == vals[gate_file + FC + 5] &&     // gate of layer 1
             params[p.offset[P_GATE_UP] + 3 * FC + 7] == vals[up_file + FC + 7] &&       // up of layer 1
             params[p.offset[P_LM_HEAD] + 3] == vals[lm_head_file + 3] &&
             params[p.offset[P_ATTN_NORM] + 1] == vals[p.size[P_WTE] + 1];
    CHECK(ok, "seed file tensors land in our layout (gate/up of a layer packed)");

    // truncated by one float
    const char* cut = tmp_path("seed_cut.bin");
    write_file(cut, h, 1024, vals, n * 4 - 4);
    expect_error(model_header_read(cut, &got, &fmt, err), err, "truncated model file", "truncated", "seed_cut.bin");
    unsigned char bad[1024];
    memcpy(bad, h, 1024);
    bad[0] ^= 1;
    const char* bm = tmp_path("seed_magic.bin");
    write_file(bm, bad, 1024, vals, n * 4);
    expect_error(model_header_read(bm, &got, &fmt, err), err, "bad magic", "bad magic", "seed_magic.bin");
    memcpy(bad, h, 1024);
    bad[4] = 4;
    const char* bv = tmp_path("seed_version.bin");
    write_file(bv, bad, 1024, vals, n * 4);
    expect_error(model_header_read(bv, &got, &fmt, err), err, "unknown version", "unknown version 4", NULL);
    Llama3Config huge = c;
    huge.n_layer = 0x7fffffff; // sizes computed from it would overflow
    seed_header_write(bad, &huge);
    const char* bl = tmp_path("seed_layers.bin");
    write_file(bl, bad, 1024, vals, n * 4);
    expect_error(model_header_read(bl, &got, &fmt, err), err, "header with n_layer 2^31-1",
                 "n_layer 2147483647 is out of range [1, 1024]", "seed_layers.bin");
    expect_error(model_header_read(tmp_path("missing.bin"), &got, &fmt, err), err, "missing model file",
                 "cannot open", "missing.bin");
    free(vals), free(params);
}

// [tied embeddings] The 1B's sizes tied and untied, the layout (lm_head empty, the head GEMMs on
// wte, wte's shadow first and its gradient fp32), the switch it overrides, and a tied seed file:
// its header round trip, no lm_head tensor, and the refusals (a bad flag value, an untied size).
static void test_tied_embeddings(void) {
    Llama3Config c = llama3_2_1b_config(), untied = small_config(), small = untied, got;
    c.tied_embeddings = 1, small.tied_embeddings = 1;
    ParamLayout p = param_layout(&c);
    CHECK(p.total == 1235814400ull, "1B tied parameter count = %zu (1,235,814,400)", p.total);
    CHECK(p.size[P_LM_HEAD] == 0 && p.slices[P_LM_HEAD] == 0 && p.head == P_WTE && p.shadow_begin == 0 &&
              p.matmul_begin == p.offset[P_QKV] && p.matmul_end == p.offset[P_ATTN_NORM],
          "tied layout: lm_head empty, the head is wte, the shadow starts at wte, bf16 grads from qkv");
    ParamLayout u = param_layout(&untied);
    CHECK(u.head == P_LM_HEAD && u.shadow_begin == u.matmul_begin && u.slices[P_LM_HEAD] == 1,
          "untied layout: the head is lm_head, its shadow first");
    Switches sw = train_args_default().sw, tied_sw = switches_for_model(&sw, &c);
    CHECK(sw.sparse_embedding == 1 && tied_sw.sparse_embedding == 0 &&
              switches_for_model(&sw, &untied).sparse_embedding == 1,
          "sparse_embedding off for a tied model only");
    SegmentList s = seed_file_segments(&c, 1024);
    CHECK(s.end == 1024 + 4 * 1235814400ull && strcmp(s.seg[s.n - 1].name, "final_norm") == 0,
          "1B tied seed file: %zu bytes, final_norm last (no lm_head)", s.end);
    free(s.seg);
    size_t n;
    float* vals;
    unsigned char h[1024];
    const char* path = seed_file_make("tied.bin", &small, h, &vals, &n);
    char err[L3_ERR_LEN];
    ModelFileFormat fmt;
    int rc = model_header_read(path, &got, &fmt, err);
    CHECK(rc == 0 && fmt == MODEL_FILE_SEED && got.tied_embeddings == 1 && read_i32(h, 64) == 1,
          "tied seed header round trip, slot 16 (%s)", rc ? err : "ok");
    size_t untied_n = param_layout(&untied).total;
    float* more = calloc(untied_n, sizeof(float));
    write_file(path, h, 1024, more, untied_n * 4);
    expect_error(model_header_read(path, &got, &fmt, err), err, "a tied header on an untied file",
                 "tied.bin: its header says tied_embeddings 1", "untied model");
    int32_t two = 2;
    memcpy(h + 64, &two, 4);
    write_file(path, h, 1024, vals, n * 4);
    expect_error(model_header_read(path, &got, &fmt, err), err, "tied_embeddings 2", "tied.bin",
                 "tied_embeddings 2 is out of range [0, 1]");
    free(vals), free(more);
}

// llm.c's 2048-byte header (256 int32, then 256 float32) for config c in `version` (3 fp32, 5 bf16).
static void llmc_header_write(int32_t h[512], const Llama3Config* c, int version) {
    memset(h, 0, 512 * sizeof(int32_t));
    h[0] = MODEL_MAGIC, h[1] = version, h[2] = c->max_seq_len, h[3] = c->vocab_size, h[4] = c->n_layer;
    h[5] = c->n_head, h[6] = c->n_kv_head, h[7] = c->n_embd, h[8] = c->multiple_of, h[9] = c->use_scaled_rope;
    h[10] = 3, h[11] = 2; // llm.c's major and minor version
    memcpy(&h[256], &c->ffn_dim_multiplier, 4), memcpy(&h[257], &c->norm_eps, 4), memcpy(&h[258], &c->rope_theta, 4);
}

static void test_llmc_model_file(void) {
    Llama3Config c = small_config(), got;
    SegmentList s = llmc_file_segments(&c, 2048, 4);
    size_t n_floats = (s.end - 2048) / 4;
    float* vals = malloc(s.end - 2048);
    for (int i = 0; i < s.n; i++)
        for (size_t j = 0; j < s.seg[i].count; j++)
            vals[(s.seg[i].file_offset - 2048) / 4 + j] = s.seg[i].param_offset < 0 ? 0.0f : (float)(i * 1000 + j % 997);
    int32_t h[512];
    llmc_header_write(h, &c, MODEL_VERSION_FP32);
    const char* path = tmp_path("llmc.bin");
    write_file(path, h, sizeof(h), vals, n_floats * 4);
    char err[L3_ERR_LEN];
    ModelFileFormat fmt;
    int rc = model_header_read(path, &got, &fmt, err);
    CHECK(rc == 0 && fmt == MODEL_FILE_LLMC && got.ffn_hidden == c.ffn_hidden && got.n_kv_head == 2,
          "llm.c file detected as llm.c format (%s)", rc ? err : "ok");
    CHECK(rc == 0 && got.rope_factor == 8.0f, "llm.c file's RoPE factor read as llm.c's 8 (got %g)", got.rope_factor);
    float* params = calloc(param_layout(&c).total, sizeof(float));
    float buf[4096];
    rc = model_file_load(path, &c, fmt, buf, 4096, host_sink, params, err);
    ParamLayout p = param_layout(&c);
    CHECK(rc == 0 && params[p.offset[P_WTE] + 5] == 5.0f && params[p.offset[P_LM_HEAD] + 5] == 1005.0f &&
              params[p.offset[P_ATTN_NORM] + 5] == 2005.0f,
          "llm.c file loads (wte, lm_head, then ln1: segments 0, 1, 2)");
    vals[(s.seg[3].file_offset - 2048) / 4 + 10] = 0.5f; // ln1 bias
    const char* nz = tmp_path("llmc_bias.bin");
    write_file(nz, h, sizeof(h), vals, n_floats * 4);
    rc = model_file_load(nz, &c, fmt, buf, 4096, host_sink, params, err);
    expect_error(rc, err, "llm.c file with a nonzero bias", "ln1 bias is not zero", "llmc_bias.bin");
    free(vals), free(params), free(s.seg);
}

static const char* write_tokens(const char* name, int32_t magic, int32_t version, int32_t count, const void* toks,
                                size_t bytes) {
    int32_t h[256] = {0};
    h[0] = magic, h[1] = version, h[2] = count;
    const char* path = tmp_path(name);
    write_file(path, h, sizeof(h), toks, bytes);
    return path;
}

static void test_token_files(void) {
    uint32_t toks[100];
    for (int i = 0; i < 100; i++) toks[i] = (uint32_t)(i * 37 % 1000);
    char err[L3_ERR_LEN];
    TokenData d;
    const char* ok = write_tokens("tok.bin", TOKENS_MAGIC_LLAMA3, 7, 100, toks, sizeof(toks));
    int rc = tokens_load_file(&d, ok, 1000, err);
    CHECK(rc == 0 && d.n_tokens == 100 && d.tokens[99] == toks[99], "uint32 token file loads");
    if (rc == 0) tokens_free(&d);
    uint16_t t16[50];
    for (int i = 0; i < 50; i++) t16[i] = (uint16_t)(i * 11);
    const char* gpt2 = write_tokens("tok16.bin", TOKENS_MAGIC_GPT2, 1, 50, t16, sizeof(t16));
    rc = tokens_load_file(&d, gpt2, 1000, err);
    CHECK(rc == 0 && d.n_tokens == 50 && d.tokens[49] == 49 * 11, "uint16 (GPT-2) token file loads");
    if (rc == 0) tokens_free(&d);
    const char* magic = write_tokens("tok_magic.bin", 12345, 7, 100, toks, sizeof(toks));
    expect_error(tokens_load_file(&d, magic, 1000, err), err, "token file bad magic", "bad magic 12345", "tok_magic.bin");
    const char* ver = write_tokens("tok_ver.bin", TOKENS_MAGIC_LLAMA3, 3, 100, toks, sizeof(toks));
    expect_error(tokens_load_file(&d, ver, 1000, err), err, "token file unknown version", "unknown version 3", NULL);
    const char* cut = write_tokens("tok_cut.bin", TOKENS_MAGIC_LLAMA3, 7, 100, toks, sizeof(toks) - 8);
    expect_error(tokens_load_file(&d, cut, 1000, err), err, "truncated token file", "truncated", "tok_cut.bin");
    toks[42] = 1000;
    const char* big = write_tokens("tok_big.bin", TOKENS_MAGIC_LLAMA3, 7, 100, toks, sizeof(toks));
    expect_error(tokens_load_file(&d, big, 1000, err), err, "token id >= vocab", "token id 1000 at position 42",
                 "tok_big.bin");
    expect_error(tokens_load_file(&d, tmp_path("nope.bin"), 1000, err), err, "missing token file", "cannot open",
                 "nope.bin");
}

// A whole file in a malloc'd buffer with 8 bytes to spare (NULL, size 0 if it cannot be read).
static unsigned char* read_whole(const char* path, size_t* size) {
    FILE* f = fopen(path, "rb");
    *size = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    unsigned char* b = n > 0 ? (unsigned char*)calloc((size_t)n + 8, 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) == (size_t)n) *size = (size_t)n;
    fclose(f);
    return b;
}

// The text vocab_print writes for ids, NUL-terminated (the test tokens hold no NUL byte).
static char* vocab_text(const Vocab* v, const int32_t* ids, size_t n) {
    char* text = NULL;
    size_t len = 0;
    FILE* f = open_memstream(&text, &len);
    vocab_print(f, v, ids, n);
    fclose(f);
    return text;
}

// Parses a copy of the table image, `size` bytes of it, with the int32 at byte `at` set to value
// (at < 0: none changed); frees what a parse that should have failed allocated.
static int vocab_altered(const unsigned char* table, size_t size, long at, int32_t value, const char* name,
                         char* err) {
    unsigned char* b = (unsigned char*)calloc(size + 8, 1);
    memcpy(b, table, size);
    if (at >= 0) memcpy(b + at, &value, 4);
    Vocab v;
    int rc = vocab_parse(&v, b, size, name, err);
    if (rc == 0) vocab_free(&v);
    free(b);
    return rc;
}

static void test_vocab_real(const Vocab* v) {
    TokenData d;
    char err[L3_ERR_LEN];
    int rc = tokens_load_file(&d, "data/tiny_shakespeare_val.bin", 128256, err);
    CHECK(rc == 0 && d.n_tokens >= 40, "data/tiny_shakespeare_val.bin loads%s%s", rc ? ": " : "", rc ? err : "");
    if (rc) return;
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (int32_t)d.tokens[i];
    tokens_free(&d);
    const char* want = "<|begin_of_text|>First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
                       "<|begin_of_text|>All:\nSpeak, speak.\n\n<|begin_of_text|>First Citizen:\nYou are all "
                       "resolved rather to die than to famish?\n\n<|begin_of_text|>All:\n";
    char* text = vocab_text(v, ids, 40);
    CHECK(!strcmp(text, want), "the val split's first 40 tokens decode to tiktoken's text: \"%.60s...\"", text);
    free(text);
    int32_t split[] = {9468, 19044, 53050, 128255, -1, 128256, 15339}; // "🙂" is 2 tokens: f09f, 9982
    text = vocab_text(v, split, 7);
    CHECK(!strcmp(text, "\xf0\x9f\x99\x82 caf\xc3\xa9<|reserved_special_token_245|><-1><128256>hello"),
          "a character split over tokens, the last special token, ids outside the table: \"%s\"", text);
    free(text);
}

// The real table (the tests run from the repo root) decodes tokens as tiktoken does, also from an
// unaligned copy (a linked blob); each kind of corrupt table is refused with the file named.
static void test_vocab(void) {
    size_t size;
    unsigned char* table = read_whole("data/llama3_vocab.bin", &size);
    char err[L3_ERR_LEN] = "cannot read it";
    Vocab v;
    int rc = size ? vocab_parse(&v, table, size, "data/llama3_vocab.bin", err) : -1;
    CHECK(rc == 0 && v.n_tokens == 128256, "data/llama3_vocab.bin parses, 128256 tokens%s%s", rc ? ": " : "",
          rc ? err : "");
    if (rc) {
        free(table);
        return;
    }
    test_vocab_real(&v);
    vocab_free(&v);
    unsigned char* odd = (unsigned char*)malloc(size + 1);
    memcpy(odd + 1, table, size);
    rc = vocab_parse(&v, odd + 1, size, "odd", err);
    int32_t hello = 15339;
    char* text = rc ? NULL : vocab_text(&v, &hello, 1);
    CHECK(text && !strcmp(text, "hello"), "a table at an odd address parses and decodes");
    free(text);
    if (rc == 0) vocab_free(&v);
    free(odd);
    int32_t n = read_i32(table, 8), total = read_i32(table, 12);
    long off0 = 1024, off_last = 1024 + 4L * n;
    expect_error(vocab_altered(table, 100, -1, 0, "v_short.bin", err), err, "vocab: shorter than its header",
                 "shorter than the 1024-byte header", "v_short.bin");
    expect_error(vocab_altered(table, size - 1, -1, 0, "v_cut.bin", err), err, "vocab: truncated by a byte",
                 "truncated", "v_cut.bin");
    expect_error(vocab_altered(table, size + 3, -1, 0, "v_tail.bin", err), err, "vocab: trailing bytes",
                 "3 trailing bytes", "v_tail.bin");
    expect_error(vocab_altered(table, size, 0, CKPT_MAGIC, "v_magic.bin", err), err, "vocab: a state.bin's magic",
                 "bad magic 20241201", "v_magic.bin");
    expect_error(vocab_altered(table, size, 4, 2, "v_ver.bin", err), err, "vocab: unknown version",
                 "unknown version 2", "v_ver.bin");
    expect_error(vocab_altered(table, size, 8, 0, "v_zero.bin", err), err, "vocab: zero tokens",
                 "corrupt header: 0 tokens", "v_zero.bin");
    expect_error(vocab_altered(table, size, off0, 1, "v_first.bin", err), err, "vocab: offset[0] not 0",
                 "offset[0] = 1, not 0", "v_first.bin");
    expect_error(vocab_altered(table, size, off0 + 4 * 100, 0, "v_down.bin", err), err, "vocab: decreasing offset",
                 "offset[100] = 0 is less than offset[99]", "v_down.bin");
    expect_error(vocab_altered(table, size, off_last - 4, total + 1, "v_past.bin", err), err,
                 "vocab: offset past the end", "is past the end", "v_past.bin");
    expect_error(vocab_altered(table, size, off_last, total - 1, "v_total.bin", err), err,
                 "vocab: last offset not the total", "not the header's total", "v_total.bin");
    free(table);
}

// A loader over tokens in memory (source `s`, named `name`), in order unless `shuffle` (seed 7).
static int memory_loader(DataLoader* l, TokenSource* s, const TokenData* d, int B, int T, int micro_steps, int overfit,
                         int rank, int world, int shuffle, const char* name, char* err) {
    token_source_memory(s, d, name, 1 << 30);
    LoaderConfig c = {B, T, micro_steps, rank, world, overfit, shuffle, 7};
    return loader_init(l, s, &c, err);
}
static void memory_loader_free(DataLoader* l, TokenSource* s) { loader_free(l), token_source_free(s); }
// The next micro-batch of a loader that must not fail.
static void next_batch(DataLoader* l, int32_t* x, int32_t* y) {
    char err[L3_ERR_LEN];
    if (loader_next(l, x, y, err)) CHECK(0, "loader_next: %s", err); // (a failure only: no pass counted per batch)
}

static void test_loader(void) {
    uint32_t toks[21];
    for (int i = 0; i < 21; i++) toks[i] = i;
    TokenData d = {toks, 21};
    TokenSource s;
    DataLoader l;
    char err[L3_ERR_LEN];
    int32_t x[10], y[10];
    int rc = memory_loader(&l, &s, &d, 2, 5, 1, 0, 0, 1, 0, "data", err);
    next_batch(&l, x, y);
    int ok = rc == 0 && x[0] == 0 && y[0] == 1 && x[9] == 9 && y[9] == 10;
    next_batch(&l, x, y);
    ok &= x[0] == 10 && y[9] == 20;
    next_batch(&l, x, y); // 20 + 10 + 1 > 21: wraps
    ok &= x[0] == 0 && l.at.epoch == 1;
    CHECK(ok, "loader: shifted targets, sequential batches, wrap-around into the next epoch");
    memory_loader_free(&l, &s);
    rc = memory_loader(&l, &s, &d, 2, 5, 1, 1, 0, 1, 0, "data", err);
    next_batch(&l, x, y);
    for (int i = 0; i < 10; i++) x[i] = y[i] = -1; // poison: the second batch must be written again
    next_batch(&l, x, y);
    CHECK(rc == 0 && x[0] == 0 && x[9] == 9 && y[0] == 1 && y[9] == 10,
          "loader: overfit_single_batch repeats the first batch");
    memory_loader_free(&l, &s);
    expect_error(memory_loader(&l, &s, &d, 4, 6, 1, 0, 0, 1, 0, "shakespeare.bin", err), err,
                 "fewer tokens than one batch", "not enough tokens for one batch", "shakespeare.bin");
    memory_loader_free(&l, &s);
}

// The command line `line` of one of `world` ranks.
static int parse_ranks(TrainArgs* a, char* err, const char* line, int world) {
    static char copy[1024];
    char* argv[64];
    int argc = 0;
    snprintf(copy, sizeof(copy), "prog %s", line);
    for (char* tok = strtok(copy, " "); tok && argc < 64; tok = strtok(NULL, " ")) argv[argc++] = tok;
    return train_args_parse(a, argc, argv, world, err);
}
static int parse(TrainArgs* a, char* err, const char* line) { return parse_ranks(a, err, line, 1); }

static void test_cli(void) {
    TrainArgs a;
    char err[L3_ERR_LEN];
    int rc = parse(&a, err,
                   "--device cuda --dtype bfloat16 --input_bin data/llama3/tiny_shakespeare_train.bin "
                   "--llmc_filepath data/llama3/llama3.2_1B_fp32.bin --num_iteration 5 --batch_size 4 "
                   "--sequence_length 64 --total_batch_size 256");
    CHECK(rc == 0 && a.optim.sched.total == 5 && a.loop.batch_size == 4 && a.loop.sequence_length == 64 &&
              a.loop.total_batch_size == 256 && !strcmp(a.loop.llmc_filepath, "data/llama3/llama3.2_1B_fp32.bin"),
          "the seed report's command line parses (%s)", rc ? err : "ok");
    CHECK(a.optim.sched.peak_lr == 1e-5f && a.optim.beta1 == 0.9f && a.optim.beta2 == 0.999f && a.optim.eps == 1e-8f &&
              a.optim.weight_decay == 0.0f,
          "defaults: lr 1e-5, betas 0.9/0.999, eps 1e-8, wd 0");
    Switches d = a.sw;
    CHECK(d.sparse_embedding && d.overlap_optimizer && d.shadow_weights && d.vector_adam && d.metadata_by_value &&
              d.flash_attention && d.bf16_grads && d.cuda_graph && d.fused_rmsnorm && d.grad_zeroing == GRAD_ZERO_NONE &&
              d.deferred_adamw == -1 && deferred_layers(&d, 16) == 12 && deferred_layers(&d, 2) == 2 && d.delete_fills,
          "every optimisation on by default (AdamW of 12 layers deferred, all of a 2-layer model's)");
    rc = parse(&a, err, "--batch_size 8 --help --bogus");
    CHECK(rc == 0 && a.help, "--help stops the parse (%s)", rc ? err : "ok");
    rc = parse(&a, err, "-h");
    CHECK(rc == 0 && a.help, "-h too (%s)", rc ? err : "ok");
    rc = parse(&a, err, "--learning_rate=3e-4 --overfit_single_batch --seed 7 --weight_decay 0.1 --sparse_embedding 0");
    CHECK(rc == 0 && a.optim.sched.peak_lr == 3e-4f && a.loop.overfit_single_batch == 1 && a.loop.seed == 7 &&
              a.optim.weight_decay == 0.1f && a.sw.sparse_embedding == 0,
          "--flag=value, bare bool flag, our own flags (%s)", rc ? err : "ok");
    rc = parse(&a, err, "--shadow_weights 0 --vector_adam=0 --metadata_by_value false --overlap_optimizer 0 "
                        "--grad_zeroing fill --flash_attention 0 --bf16_grads=false --cuda_graph 0 --fused_rmsnorm 0 "
                        "--deferred_adamw 0 --delete_fills 0");
    CHECK(rc == 0 && !a.sw.shadow_weights && !a.sw.vector_adam && !a.sw.metadata_by_value && !a.sw.overlap_optimizer &&
              a.sw.grad_zeroing == GRAD_ZERO_FILL && !a.sw.flash_attention && !a.sw.bf16_grads && !a.sw.cuda_graph && !a.sw.fused_rmsnorm &&
              a.sw.deferred_adamw == 0 && !a.sw.delete_fills,
          "ablation switches parse (%s)", rc ? err : "ok");
    expect_error(parse(&a, err, "--grad_zeroing zeros"), err, "bad --grad_zeroing", "--grad_zeroing: bad value 'zeros'",
                 NULL);
    expect_error(parse(&a, err, "--deferred_adamw -1"), err, "negative deferred layers", "--deferred_adamw: bad value",
                 NULL);
    expect_error(parse(&a, err, "--batchsize 4"), err, "unknown flag", "unknown flag '--batchsize'", NULL);
    expect_error(parse(&a, err, "--batch_size four"), err, "non-numeric value", "--batch_size: bad value 'four'", NULL);
    expect_error(parse(&a, err, "--batch_size 0"), err, "zero batch size", "--batch_size: bad value '0'", NULL);
    expect_error(parse(&a, err, "--learning_rate -1"), err, "negative lr", "--learning_rate", NULL);
    expect_error(parse(&a, err, "--dtype float32"), err, "unsupported dtype", "--dtype", "only bfloat16");
    expect_error(parse(&a, err, "--device cpu"), err, "unsupported device", "--device", NULL);
    expect_error(parse(&a, err, "--num_iteration"), err, "missing value", "--num_iteration: missing value", NULL);
    expect_error(parse(&a, err, "stray"), err, "stray argument", "unexpected argument 'stray'", NULL);
    Llama3Config c = llama3_2_1b_config(), small = small_config(), wide = c;
    rc = parse(&a, err, "");
    int checked = train_args_check(&a, &small, err);
    CHECK(rc == 0 && checked == 0, "defaults on a 2-layer model (%s)", checked ? err : "ok");
    Llama3Config hd128 = c, hd96 = c;
    hd128.n_head = 16, hd128.n_kv_head = 8; // head_dim 128, as LLaMA 3.2-3B and 3.1-8B have
    checked = train_args_check(&a, &hd128, err);
    CHECK(checked == 0, "flash attention with head_dim 128 (%s)", checked ? err : "ok");
    hd96.n_embd = 1536, hd96.n_head = 16, hd96.n_kv_head = 8; // head_dim 96
    expect_error(train_args_check(&a, &hd96, err), err, "flash attention with head_dim 96", "head_dim 32, 64 or 128",
                 "head_dim 96");
    wide.n_head = 8, wide.n_kv_head = 2; // head_dim 256
    expect_error(train_args_check(&a, &wide, err), err, "flash attention with head_dim 256", "head_dim 32, 64 or 128",
                 "head_dim 256");
    rc = parse(&a, err, "--flash_attention 0");
    checked = train_args_check(&a, &wide, err);
    CHECK(rc == 0 && checked == 0, "head_dim 256 with --flash_attention 0 (%s)", checked ? err : "ok");
    wide.n_embd = 16384, wide.n_head = 256, wide.n_kv_head = 64;
    expect_error(train_args_check(&a, &wide, err), err, "n_embd wider than the RMSNorm kernels", "n_embd 16384",
                 "8192");
    rc = parse(&a, err, "--sequence_length 131072 --batch_size 1");
    checked = train_args_check(&a, &c, err);
    CHECK(rc == 0 && checked == 0, "--sequence_length 131072, the released models' max_position_embeddings (%s)",
          checked ? err : "ok");
    rc = parse(&a, err, "--sequence_length 131073 --batch_size 1");
    expect_error(train_args_check(&a, &c, err), err, "sequence longer than the model allows", "--sequence_length 131073",
                 "max_seq_len 131072");
    Llama3Config long_ctx = small;
    long_ctx.max_seq_len = 1 << 24;
    rc = parse(&a, err, "--sequence_length 4194240 --batch_size 1");
    checked = train_args_check(&a, &long_ctx, err);
    CHECK(rc == 0 && checked == 0, "--sequence_length 4194240: 65535 tiles of flash attention (%s)", checked ? err : "ok");
    rc = parse(&a, err, "--sequence_length 4194304 --batch_size 1");
    expect_error(train_args_check(&a, &long_ctx, err), err, "a sequence past flash attention's grid",
                 "--sequence_length 4194304", "flash attention takes at most 4194240");
    rc = parse(&a, err, "--sequence_length 4194304 --batch_size 1 --flash_attention 0");
    checked = train_args_check(&a, &long_ctx, err);
    CHECK(rc == 0 && checked == 0, "--sequence_length 4194304 with --flash_attention 0: only memory refuses it (%s)",
          checked ? err : "ok");
    rc |= parse(&a, err, "--deferred_adamw 17");
    expect_error(train_args_check(&a, &c, err), err, "more deferred layers than the model has", "--deferred_adamw 17",
                 "16 layers");
    rc |= parse(&a, err, "--deferred_adamw 16");
    CHECK(rc == 0 && a.sw.deferred_adamw == 16 && train_args_check(&a, &c, err) == 0, "--deferred_adamw 16: every layer");
    rc = parse(&a, err, "--batch_size 3 --sequence_length 64 --total_batch_size 256");
    expect_error(rc ? rc : train_args_check(&a, &c, err), err, "B*T not dividing total_batch_size: the multiples named",
                 "--total_batch_size 256 is not a multiple of --batch_size * --sequence_length = 192",
                 "pass 384 (2 micro-steps) or 192 (1 micro-step), or leave it out");
    rc = parse(&a, err, "--batch_size 4 --sequence_length 64 --total_batch_size 1024");
    CHECK(rc == 0 && a.loop.total_batch_size == 1024 && train_args_check(&a, &c, err) == 0,
          "total_batch_size 1024 = 4 micro-steps of 4x64");
}

// What a user types: --batch_size or --sequence_length alone (the total batch follows them), a
// near-miss flag, --stop_after against the schedule.
static void test_user_flags(void) {
    TrainArgs a;
    char err[L3_ERR_LEN];
    Llama3Config c = llama3_2_1b_config();
    int rc = parse(&a, err, "--batch_size 8");
    CHECK(rc == 0 && a.loop.total_batch_size == 512 && train_args_check(&a, &c, err) == 0,
          "--batch_size 8 alone: one micro-step of 8 x 64 = %d tokens (%s)", a.loop.total_batch_size, rc ? err : "ok");
    rc = parse(&a, err, "--sequence_length 1024 --batch_size 2");
    CHECK(rc == 0 && a.loop.total_batch_size == 2048 && train_args_check(&a, &c, err) == 0,
          "--sequence_length 1024 --batch_size 2 alone: total batch %d (2048)", a.loop.total_batch_size);
    rc = parse(&a, err, "--total_batch_size 0 --batch_size 2");
    CHECK(rc == 0 && a.loop.total_batch_size == 128, "--total_batch_size 0: B*T (%d)", a.loop.total_batch_size);
    CHECK(train_args_default().loop.total_batch_size == 256, "the default total batch is the default B*T, 256");
    rc = parse(&a, err, "--batch_size 8 --sequence_length 128 --total_batch_size 4096 --recompute 2 --fp8 1 "
                        "--fp8_grads e4m3 --optimizer_state bf16");
    RunConfig run = run_config(&a, &c);
    CHECK(rc == 0 && run.B == 8 && run.T == 128 && run.grad_accum == 4 && run.recompute == RECOMPUTE_BLOCKS &&
              run.fp8 == 1 && run.fp8_grads == FP8_GRADS_E4M3 && run.opt == &a.optim &&
              run.opt->moments == MOMENTS_BF16 && run.sw == &a.sw && !run.doc_mask,
          "run_config: B %d T %d, %d micro-steps, recompute %d, fp8 %d grads %d, the flags' optimizer and switches",
          run.B, run.T, run.grad_accum, run.recompute, run.fp8, run.fp8_grads);
    expect_error(parse(&a, err, "--num_iterations 5"), err, "a near-miss flag", "unknown flag '--num_iterations'",
                 "did you mean --num_iteration?");
    expect_error(parse(&a, err, "--lerning_rate 1e-4"), err, "a misspelt flag", "did you mean --learning_rate?", NULL);
    rc = parse(&a, err, "--zzzzzz 1");
    CHECK(rc != 0 && !strstr(err, "did you mean"), "a flag near none: no guess (%s)", err);
    rc = parse(&a, err, "--num_iteration 8 --stop_after 4");
    CHECK(rc == 0 && last_step(&a) == 4 && a.optim.sched.total == 8 && train_args_check(&a, &c, err) == 0,
          "--num_iteration 8 --stop_after 4: the run ends at step 4, the schedule spans 8");
    rc = parse(&a, err, "--num_iteration 8");
    CHECK(rc == 0 && last_step(&a) == 8, "without --stop_after the run ends at --num_iteration");
    rc = parse(&a, err, "--num_iteration 8 --stop_after 9");
    expect_error(rc ? rc : train_args_check(&a, &c, err), err, "--stop_after past the schedule", "--stop_after 9",
                 "--num_iteration 8");
}

// [fp8] What --fp8 1 takes (the bench configs) and what it refuses, each refusal naming the flag and
// what to change: B*T or a width not a multiple of 64 (the transposing quantiser's tiles), several
// micro-steps or ranks, the switches whose buffers it reads off; --fp8_grads parsed into its enum,
// and e4m3 without --fp8 1 refused.
static void test_fp8_flags(void) {
    TrainArgs a;
    char err[L3_ERR_LEN];
    Llama3Config c = llama3_2_1b_config();
    const char* taken[] = {"--fp8 1", "--fp8 1 --batch_size 16 --sequence_length 1024", "--fp8 0 --total_batch_size 512",
                           "--fp8 1 --total_batch_size 512", "--fp8 1 --bf16_grads 0"};
    for (int i = 0; i < 5; i++) {
        int rc = parse(&a, err, taken[i]);
        CHECK(rc == 0 && train_args_check(&a, &c, err) == 0, "%s taken (%s)", taken[i], rc ? err : "ok");
    }
    expect_error(parse(&a, err, "--fp8 2"), err, "--fp8 2", "--fp8: bad value '2'", NULL);
    int rc = parse(&a, err, "--fp8 1 --batch_size 3 --sequence_length 10");
    expect_error(rc ? rc : train_args_check(&a, &c, err), err, "--fp8 1 with B*T 30", "--fp8 1",
                 "--batch_size * --sequence_length = 30 must be a multiple of 64");
    rc = parse(&a, err, "--fp8 1 --batch_size 32 --sequence_length 131072");
    expect_error(rc ? rc : train_args_check(&a, &c, err), err, "--fp8 1 with B*T past the quantiser's grid",
                 "--batch_size * --sequence_length = 4194304", "at most 4194240");
    rc = parse(&a, err, "--fp8 1 --shadow_weights 0");
    expect_error(rc ? rc : train_args_check(&a, &c, err), err, "--fp8 1 --shadow_weights 0", "--fp8 1 needs --shadow_weights 1",
                 NULL);
    rc = parse(&a, err, "--master_weights bf16 --shadow_weights 0");
    expect_error(rc ? rc : train_args_check(&a, &c, err), err, "--master_weights bf16 --shadow_weights 0",
                 "--master_weights bf16 needs --shadow_weights 1", "the bf16 copy is the weight");
    rc = parse(&a, err, "--master_weights bf16 --fp8 1 --optimizer_state bf16 --total_batch_size 512");
    CHECK(rc == 0 && train_args_check(&a, &c, err) == 0 && a.optim.weights == WEIGHTS_BF16,
          "--master_weights bf16 with FP8, bf16 moments and micro-steps taken (%s)", rc ? err : "ok");
    rc = parse(&a, err, "--fp8 1 --total_batch_size 1024");
    a.loop.world = 2; // (a launch of two ranks of 2 micro-steps: fp8_args_check alone, before the rendezvous flags')
    CHECK(rc == 0 && fp8_args_check(&a, &c, err) == 0, "--fp8 1 on two ranks of 2 micro-steps taken (%s)", rc ? err : "ok");
    Llama3Config odd = c;
    odd.ffn_hidden = 8200;
    rc = parse(&a, err, "--fp8 1");
    expect_error(rc ? rc : train_args_check(&a, &odd, err), err, "--fp8 1 with ffn_hidden 8200", "ffn_hidden 8200",
                 "must be multiples of 64");
    rc = parse(&a, err, "--fp8 1");
    CHECK(rc == 0 && a.loop.fp8_grads == FP8_GRADS_E5M2, "--fp8 1: the gradients e5m2 by default");
    rc = parse(&a, err, "--fp8 1 --fp8_grads e4m3");
    CHECK(rc == 0 && a.loop.fp8_grads == FP8_GRADS_E4M3 && train_args_check(&a, &c, err) == 0,
          "--fp8 1 --fp8_grads e4m3 taken (%s)", rc ? err : "ok");
    expect_error(parse(&a, err, "--fp8 1 --fp8_grads e3m4"), err, "--fp8_grads e3m4", "--fp8_grads", "e3m4");
    rc = parse(&a, err, "--fp8_grads e4m3");
    expect_error(rc ? rc : train_args_check(&a, &c, err), err, "--fp8_grads e4m3 without --fp8 1",
                 "--fp8_grads e4m3 takes --fp8 1", NULL);
}

// [document mask] --doc_mask 1 takes the document's BOS from --bos_id, else LLaMA 3's 128000 when the
// vocabulary holds it, and gives it to model creation (run_config); a vocabulary without it needs
// --bos_id, and a --bos_id past the vocabulary is refused. Without --doc_mask no mask, whatever
// --bos_id says (it still starts the samples: bos_token).
static void test_doc_mask_flags(void) {
    TrainArgs a;
    char err[L3_ERR_LEN];
    Llama3Config c = llama3_2_1b_config(), small = c;
    small.vocab_size = 1000;
    int rc = parse(&a, err, "--doc_mask 1");
    RunConfig run = run_config(&a, &c);
    CHECK(rc == 0 && train_args_check(&a, &c, err) == 0 && run.doc_mask && run.bos == 128000,
          "--doc_mask 1 on LLaMA 3's vocabulary: documents start at 128000 (%d; %s)", run.bos, rc ? err : "ok");
    rc = parse(&a, err, "--doc_mask 1 --bos_id 7");
    run = run_config(&a, &small);
    CHECK(rc == 0 && train_args_check(&a, &small, err) == 0 && run.doc_mask && run.bos == 7 &&
              bos_token(&a.loop, &small) == 7,
          "--doc_mask 1 --bos_id 7 on a vocabulary of 1000: documents and samples start at 7 (%s)", rc ? err : "ok");
    rc = parse(&a, err, "--bos_id 7");
    CHECK(rc == 0 && !run_config(&a, &small).doc_mask && bos_token(&a.loop, &small) == 7,
          "--bos_id 7 without --doc_mask: no mask, samples start at 7");
    rc = parse(&a, err, "");
    CHECK(rc == 0 && bos_token(&a.loop, &small) == -1 && bos_token(&a.loop, &c) == 128000,
          "no --bos_id: LLaMA 3's BOS where the vocabulary holds it, else none");
    rc = parse(&a, err, "--doc_mask 1");
    expect_error(rc ? rc : train_args_check(&a, &small, err), err, "--doc_mask 1 on a vocabulary without BOS",
                 "--doc_mask 1: the vocabulary of 1000 tokens has no LLaMA 3 BOS", "--bos_id");
    rc = parse(&a, err, "--doc_mask 1 --bos_id 1000");
    expect_error(rc ? rc : train_args_check(&a, &small, err), err, "--bos_id past the vocabulary",
                 "--bos_id 1000 is past the vocabulary (1000 tokens)", NULL);
    expect_error(parse(&a, err, "--bos_id -1"), err, "a typed --bos_id -1", "--bos_id: bad value '-1'", NULL);
    expect_error(parse(&a, err, "--doc_mask 2"), err, "--doc_mask 2", "--doc_mask: bad value '2'", NULL);
}

// [family] --shape's configs: the released shapes' parameter counts (3.2-3B 3,212,749,824 with its
// tie, 3.1-8B 8,030,261,248), and --shape beside a model file or checkpoint refused.
static void test_family_shapes(void) {
    const struct { int shape, L, C, NH, F, tied; float factor; size_t total; } want[] = {
        {SHAPE_1B, 16, 2048, 32, 8192, 0, 32.0f, 1498482688ull},
        {SHAPE_3B, 28, 3072, 24, 8192, 1, 32.0f, 3212749824ull},
        {SHAPE_8B, 32, 4096, 32, 14336, 0, 8.0f, 8030261248ull}}; // each of 131,072 positions
    char err[L3_ERR_LEN];
    for (int i = 0; i < 3; i++) {
        Llama3Config c = family_config(want[i].shape);
        size_t total = param_layout(&c).total;
        CHECK(c.n_layer == want[i].L && c.n_embd == want[i].C && c.n_head == want[i].NH && c.n_kv_head == 8 &&
                  c.ffn_hidden == want[i].F && c.tied_embeddings == want[i].tied && c.rope_factor == want[i].factor &&
                  total == want[i].total && c.max_seq_len == 131072 && config_check(&c, "family", err) == 0,
              "--shape %s: L %d C %d heads %d/%d F %d tied %d factor %g, %zu parameters, %d positions", SHAPE_NAMES[i],
              c.n_layer, c.n_embd, c.n_head, c.n_kv_head, c.ffn_hidden, c.tied_embeddings, c.rope_factor, total,
              c.max_seq_len);
    }
    TrainArgs a;
    int rc = parse(&a, err, "--shape 3b");
    CHECK(rc == 0 && a.loop.shape == SHAPE_3B && shape_args_check(&a, err) == 0, "--shape 3b alone taken");
    rc = parse(&a, err, "--shape 3b --llmc_filepath m.bin");
    expect_error(rc ? rc : shape_args_check(&a, err), err, "--shape 3b with a model file", "--shape 3b: --llmc_filepath",
                 "leave --shape out");
    rc = parse(&a, err, "--shape 8b --resume ck");
    expect_error(rc ? rc : shape_args_check(&a, err), err, "--shape 8b with --resume", "--shape 8b: --resume's model.bin",
                 NULL);
    rc = parse(&a, err, "--shape 1b --llmc_filepath m.bin");
    CHECK(rc == 0 && shape_args_check(&a, err) == 0, "--shape 1b (the default) beside a model file taken");
}

// [chunked classifier] classifier_rows: --classifier_chunk as given (at most B*T); 0: one chunk while the
// logits take at most 4 GiB (every bench config: B*T up to 16384 at LLaMA 3's vocabulary), else the fewest
// chunks within it, each a multiple of 64 rows and the chunks as even as that allows; and the flag parsed.
static void test_classifier_rows(void) {
    const int V = 128256;
    CHECK(classifier_rows(256, V, 0) == 256 && classifier_rows(16384, V, 0) == 16384,
          "--classifier_chunk 0: the bench configs' 256 and 16384 rows in one chunk");
    CHECK(classifier_rows(131072, V, 0) == 16384 && classifier_rows(65536, V, 0) == 16384 &&
              classifier_rows(20000, V, 0) == 10048,
          "--classifier_chunk 0: T = 131072 in 8 chunks of 16384, 65536 in 4, 20000 in 2 of 10048 (%d, %d, %d)",
          classifier_rows(131072, V, 0), classifier_rows(65536, V, 0), classifier_rows(20000, V, 0));
    CHECK(classifier_rows(1 << 20, 1000, 0) == 1 << 20 && classifier_rows(1000, 1 << 24, 0) == 128,
          "--classifier_chunk 0: 2^20 rows of a 1000-word vocabulary in one chunk; V = 2^24 in chunks of 128 rows");
    long long most = (long long)(CLASSIFIER_AUTO_BYTES / (2 * (size_t)V)), bad = 0;
    for (long long N = 1; N <= 300000; N += 997) { // the rule's promises at every 997th B*T
        long long rows = classifier_rows(N, V, 0), chunks = (N + rows - 1) / rows;
        bad += rows < 1 || rows > N || (size_t)rows * 2 * V > CLASSIFIER_AUTO_BYTES ||
               chunks != (N + most / 64 * 64 - 1) / (most / 64 * 64) || (chunks > 1 && rows % 64);
    }
    CHECK(bad == 0, "--classifier_chunk 0 up to B*T 300000: within 4 GiB, the fewest chunks, multiples of 64 (%lld "
          "broken)", bad);
    CHECK(classifier_rows(1000, V, 100) == 100 && classifier_rows(50, V, 100) == 50 &&
              classifier_rows(131072, V, 4096) == 4096,
          "--classifier_chunk N: N rows, at most B*T");
    TrainArgs a;
    char err[L3_ERR_LEN];
    int rc = parse(&a, err, "--classifier_chunk 4096 --sequence_length 131072 --batch_size 1");
    Llama3Config c = llama3_2_1b_config();
    CHECK(rc == 0 && run_config(&a, &c).classifier_chunk == 4096 && train_args_check(&a, &c, err) == 0,
          "--classifier_chunk 4096 parsed into the run's config, taken at T = 131072 (%s)", rc ? err : "ok");
    expect_error(parse(&a, err, "--classifier_chunk -1"), err, "a negative --classifier_chunk", "--classifier_chunk: bad "
                 "value '-1'", "[0, 1073741824]");
}

// [bf16 weights] widen_bf16_upper_half turns bf16 values stored in the upper half of a float range's
// bytes into those floats, in place, for every length (odd ones too): each exact, none clobbered
// before it is read.
static void test_widen_bf16_upper_half(void) {
    for (size_t n = 1; n <= 37; n += 3) {
        float x[40], want[40];
        uint16_t b[40];
        for (size_t i = 0; i < n; i++) {
            want[i] = (float)(i + 1) * -0.375f + (float)(i % 5) * 1e-3f;
            b[i] = bf16_nearest_even(want[i]);
            uint32_t u = (uint32_t)b[i] << 16;
            memcpy(&want[i], &u, 4);
        }
        memset(x, 0xA5, sizeof(x)); // (the lower half as it was: stale floats)
        memcpy((unsigned char*)x + 2 * n, b, 2 * n);
        widen_bf16_upper_half(x, n);
        CHECK(memcmp(x, want, n * 4) == 0, "widen_bf16_upper_half of %zu values: each the bf16 widened", n);
    }
}

// The out-of-memory advice names only flags the run can take, nothing the run already has: under
// --fp8 1 also --fp8 0, and that the FP8 copies of the inputs scale with B*T.
static void test_fit_advice(void) {
    char out[512];
    FitAdvice bf16 = {.moments = MOMENTS_FP32, .recompute = RECOMPUTE_NONE, .fp8 = 0, .weights = WEIGHTS_FP32,
                      .masters_gib = 4.61, .moments_gib = 11.16, .acts_blocks_gib = 0.13, .fp8_gib = 0};
    fit_advice(&bf16, out, sizeof(out));
    CHECK(strstr(out, "--optimizer_state bf16") && strstr(out, "--recompute 2 (activations 0.13 GiB)") &&
              strstr(out, "--master_weights bf16 (frees the fp32 masters' 4.61 GiB)") &&
              strstr(out, "--offload_optimizer 1 (m and v's 11.16 GiB to host memory; slower)") &&
              strstr(out, "--total_batch_size") && strstr(out, "more ranks") && !strstr(out, "--fp8") &&
              !strstr(out, "--flash_attention"),
          "advice of a bf16 run: \"%s\"", out);
    FitAdvice fp8 = {.moments = MOMENTS_FP32, .recompute = RECOMPUTE_NORMS, .fp8 = 1, .weights = WEIGHTS_FP32,
                     .masters_gib = 4.61, .moments_gib = 11.16, .acts_blocks_gib = 0.13, .fp8_gib = 3.62};
    fit_advice(&fp8, out, sizeof(out));
    CHECK(strstr(out, "--fp8 0 (frees the FP8 copies' 3.62 GiB)") && strstr(out, "--recompute 2") &&
              strstr(out, "--total_batch_size") && strstr(out, "more ranks") && strstr(out, "FP8 copies of the inputs"),
          "advice of an --fp8 1 run: --fp8 0 besides micro-steps and ranks: \"%s\"", out);
    FitAdvice lean = {.moments = MOMENTS_BF16, .recompute = RECOMPUTE_BLOCKS, .fp8 = 1, .weights = WEIGHTS_BF16,
                      .masters_gib = 0, .offload = 1, .moments_gib = 0, .acts_blocks_gib = 0.13, .fp8_gib = 3.62};
    fit_advice(&lean, out, sizeof(out));
    CHECK(!strstr(out, "--optimizer_state") && !strstr(out, "--recompute") && !strstr(out, "--master_weights") &&
              !strstr(out, "--offload_optimizer") && strstr(out, "--batch_size"),
          "advice of a run with bf16 state, bf16 weights, --recompute 2 and offloaded state leaves them out: \"%s\"",
          out);
    char err[L3_ERR_LEN];
    size_t GiB = (size_t)1 << 30;
    CHECK(offload_check(0, 128 * GiB, err) == 0 && offload_check(115 * GiB, 128 * GiB, err) == 0,
          "--offload_optimizer 1: up to 90 %% of the host's memory pinned is taken");
    CHECK(offload_check(116 * GiB, 128 * GiB, err) != 0 && strstr(err, "116.00 GiB") && strstr(err, "128.00 GiB"),
          "--offload_optimizer 1: more than 90 %% of the host's memory is refused: \"%s\"", err);
    FitAdvice chunked = bf16;
    chunked.head_rows = 16384, chunked.logits_gib = 3.91;
    fit_advice(&chunked, out, sizeof(out));
    CHECK(strstr(out, "--classifier_chunk 4096 (frees 2.93 GiB of logits)") != NULL,
          "advice of a classifier of 16384-row chunks: 4096 rows, with the logits that frees: \"%s\"", out);
    chunked.head_rows = 4096;
    fit_advice(&chunked, out, sizeof(out));
    CHECK(!strstr(out, "--classifier_chunk"), "advice of a classifier of 4096-row chunks leaves --classifier_chunk out");
    FitAdvice unfused = bf16;
    unfused.unfused_gib = 2048.5;
    fit_advice(&unfused, out, sizeof(out));
    CHECK(strstr(out, "--flash_attention 1 (frees the unfused attention's T x T scores and probabilities, 2048.50 GiB), "
                      "--optimizer_state bf16") == out,
          "advice of an unfused run names --flash_attention 1 first, with what it frees: \"%s\"", out);
    char tiny[24];
    fit_advice(&bf16, tiny, sizeof(tiny));
    CHECK(strlen(tiny) == sizeof(tiny) - 1, "advice cut to a short buffer: \"%s\"", tiny);
}

// The GPUs the build takes, and the val split beside a user's token file.
static void test_gpu_and_val_paths(void) {
    char err[L3_ERR_LEN], out[L3_PATH_LEN];
    expect_error(gpu_check(7, 5, "Tesla T4", err), err, "a GPU without bf16 tensor cores", "compute capability 7.5",
                 "8.0 or newer");
    int ok = gpu_check(8, 0, "A100", err) == 0 && gpu_check(8, 9, "L4", err) == 0 && gpu_check(9, 0, "H200", err) == 0 &&
             gpu_check(12, 0, "future", err) == 0;
    CHECK(ok, "compute capability 8.0, 8.9, 9.0 and 12.0 are taken");
    const char* train = tmp_path("mine_train.bin");
    const char* val = tmp_path("mine_val.bin");
    write_file(train, "x", 1, NULL, 0);
    expect_error(val_path_beside(train, out, err), err, "--val_every with no val split beside the token file",
                 "no val split", "mine_val.bin");
    write_file(val, "x", 1, NULL, 0);
    CHECK(val_path_beside(train, out, err) == 0 && !strcmp(out, val), "NAME_val.bin beside NAME_train.bin is the val "
          "split (%s)", out);
    CHECK(val_path_beside(tmp_path("mine_train_*.bin"), out, err) == 0 && !strcmp(out, val),
          "NAME_val.bin beside the shards NAME_train_*.bin is their val split (%s)", out);
    expect_error(val_path_beside(tmp_path("tokens.bin"), out, err), err, "a token file not named NAME_train.bin",
                 "pass --val_bin", "tokens.bin");
}

// Reads a whole small text file into a static buffer.
static const char* file_text(const char* path) {
    static char text[4096];
    FILE* f = fopen(path, "rb");
    size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
    if (f) fclose(f);
    text[n] = 0;
    return text;
}

// The JSON log: non-finite numbers as null; a resumed run continues the log, cutting what the first
// part wrote after the resumed step and a half-written last line; a fresh run starts it anew.
static void test_json_log(void) {
    char err[L3_ERR_LEN], num[32];
    CHECK(!strcmp(json_number(num, sizeof(num), "%.6f", NAN), "null") &&
              !strcmp(json_number(num, sizeof(num), "%.6f", -NAN), "null") &&
              !strcmp(json_number(num, sizeof(num), "%.6g", INFINITY), "null") &&
              !strcmp(json_number(num, sizeof(num), "%.6f", 1.5), "1.500000"),
          "non-finite numbers are written as null, finite ones as printed");
    const char* path = tmp_path("run.jsonl");
    const char* first = "{\"step\": 1, \"loss\": 9.0}\n{\"step\": 2, \"loss\": 8.0}\n{\"step\": 2, \"sample_ids\": [1]}\n"
                        "{\"step\": 3, \"loss\": 7.0}\n{\"step\": 4, \"loss\": 6.0}\n{\"step\": 5, \"lo";
    write_file(path, first, strlen(first), NULL, 0);
    FILE* f = log_open(path, 2, err);
    int ok = f && fputs("{\"step\": 3, \"loss\": 7.5}\n", f) >= 0 && fclose(f) == 0;
    CHECK(ok && !strcmp(file_text(path), "{\"step\": 1, \"loss\": 9.0}\n{\"step\": 2, \"loss\": 8.0}\n"
                                          "{\"step\": 2, \"sample_ids\": [1]}\n{\"step\": 3, \"loss\": 7.5}\n"),
          "a run resumed at step 2 keeps the lines of steps 1..2 (its sample too) and continues the log");
    write_file(path, first, strlen(first), NULL, 0);
    f = log_open(path, 5, err);
    ok = f && fclose(f) == 0;
    CHECK(ok && strlen(file_text(path)) == strlen(first) - strlen("{\"step\": 5, \"lo"),
          "a run resumed at step 5 keeps the 4 whole lines and cuts the half-written one");
    f = log_open(path, 0, err);
    ok = f && fclose(f) == 0;
    CHECK(ok && file_text(path)[0] == 0, "a fresh run starts the log anew");
    f = log_open(tmp_path("new.jsonl"), 3, err);
    CHECK(f != NULL, "a resumed run whose log is missing creates it (%s)", f ? "ok" : err);
    if (f) fclose(f);
    expect_error(log_open(tmp_path("no/such/dir/log.jsonl"), 0, err) != NULL ? 0 : -1, err, "a log in a missing folder",
                 "cannot open for writing", "no/such/dir");
}

static void test_rope(void) {
    Llama3Config c = llama3_2_1b_config();
    float inv[32], cs[4 * 32], sn[4 * 32];
    rope_inv_freq(&c, inv);
    double plain31 = 1.0 / pow(500000.0, 62.0 / 64.0);
    int mono = 1;
    for (int i = 1; i < 32; i++) mono &= inv[i] < inv[i - 1];
    CHECK(inv[0] == 1.0f && fabs(inv[31] - plain31 / 32.0) < 1e-6 * plain31 && mono,
          "llama3 inv_freq: high frequencies kept, lowest divided by 32, monotonic");
    c.rope_factor = 8.0f; // Llama-3.1's
    float inv8[32];
    rope_inv_freq(&c, inv8);
    CHECK(inv8[0] == 1.0f && fabs(inv8[31] - plain31 / 8.0) < 1e-6 * plain31 && inv8[20] > inv[20],
          "llama3 inv_freq at rope_factor 8: lowest divided by 8, the smoothed band above factor 32's");
    c.rope_factor = LLAMA3_2_ROPE_FACTOR;
    rope_table(&c, 4, cs, sn);
    CHECK(cs[0] == 1.0f && sn[0] == 0.0f && fabs(cs[32] - cos(1.0)) < 1e-7 && fabs(sn[3 * 32] - sin(3.0)) < 1e-7,
          "rope table: angle = position * inv_freq");
}

// ---- hostile inputs: every bad file or flag ends in one line naming it, with no crash, hang or
// sanitizer report (make builds this test with ASan and UBSan) ----

static char corpus_dir[400];

// One corpus file, corpus_dir/KIND_LABEL (KIND "model" or "tokens"): run_tests.sh gives each to
// ./train_llama3 as well, which must refuse it in one line before touching the GPU.
static const char* corpus_file(const char* kind, const char* label, const void* data, size_t n) {
    static char path[4][512];
    static int i = 0;
    i = (i + 1) % 4;
    snprintf(path[i], sizeof(path[i]), "%s/%s_%s", corpus_dir, kind, label);
    write_file(path[i], data, n, NULL, 0);
    return path[i];
}

// The message is one non-empty line that names `name`.
static int one_line(const char* err, const char* name) { return err[0] && !strchr(err, '\n') && strstr(err, name); }

// A model file the trainer must refuse before the GPU: by its header and size, or by its data check.
static int model_refused(const char* path, char* err) {
    Llama3Config c;
    ModelFileFormat fmt;
    return model_header_read(path, &c, &fmt, err) || model_file_check(path, &c, fmt, err);
}
// A token file the trainer must refuse before the GPU with its default model and B=4, T=64.
static int tokens_refused(const char* path, char* err) {
    TokenSource s;
    DataLoader l = {0};
    LoaderConfig c = {4, 64, 1, 0, 1, 0, 1, 42};
    int rc = token_source_open(&s, path, "--input_bin", llama3_2_1b_config().vocab_size, err) ||
             loader_init(&l, &s, &c, err);
    loader_free(&l), token_source_free(&s);
    return rc != 0;
}

typedef struct {
    int cases, refused; // refused in one line naming the file
    char first_bad[L3_ERR_LEN + 64];
} Tally;
static void tally(Tally* t, const char* path, int refused, const char* err) {
    t->cases++;
    if (refused && one_line(err, path)) t->refused++;
    else if (!t->first_bad[0]) snprintf(t->first_bad, sizeof(t->first_bad), "%s: %s", path, refused ? err : "accepted");
}
static void tally_check(const Tally* t, const char* what) {
    CHECK(t->refused == t->cases, "%s: %d of %d refused in one line naming the file%s%s", what, t->refused, t->cases,
          t->first_bad[0] ? "; first not: " : "", t->first_bad);
}

// A tiny valid model (1 layer, C 32, 4 heads of 8, vocab 64) in memory, in either format, every
// weight 0.5 and every llm.c bias 0.
static unsigned char* tiny_model(ModelFileFormat fmt, size_t* size, SegmentList* segs) {
    Llama3Config c = {64, 64, 1, 4, 2, 32, 1.0f, 32, 0, 1e-5f, 500000.0f, 1, 0, LLAMA3_2_ROPE_FACTOR};
    char err[L3_ERR_LEN];
    config_check(&c, "tiny", err);
    size_t header = fmt == MODEL_FILE_SEED ? 1024 : 2048;
    *segs = fmt == MODEL_FILE_SEED ? seed_file_segments(&c, header) : llmc_file_segments(&c, header, 4);
    *size = segs->end;
    unsigned char* b = calloc(*size, 1);
    if (fmt == MODEL_FILE_SEED) {
        seed_header_write(b, &c);
    } else {
        int32_t h[512];
        llmc_header_write(h, &c, MODEL_VERSION_FP32);
        memcpy(b, h, sizeof(h));
    }
    for (int i = 0; i < segs->n; i++)
        for (size_t j = 0; segs->seg[i].param_offset >= 0 && j < segs->seg[i].count; j++)
            ((float*)(b + segs->seg[i].file_offset))[j] = 0.5f;
    return b;
}

// Model files cut at every header and tensor boundary, every header field at its extremes, wrong
// magic and version, and an llm.c bias that is not zero.
static void corpus_models(void) {
    char err[L3_ERR_LEN], label[64];
    Tally cuts = {0}, fields = {0}, other = {0};
    const int32_t ints[] = {0, -1, INT_MAX, INT_MIN, 1 << 30};
    const float floats[] = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, 1e-45f, FLT_MAX, -1.0f};
    for (int fmt = MODEL_FILE_SEED; fmt <= MODEL_FILE_LLMC; fmt++) {
        const char* name = fmt == MODEL_FILE_SEED ? "seed" : "llmc";
        size_t size, header = fmt == MODEL_FILE_SEED ? 1024 : 2048;
        SegmentList s;
        unsigned char* b = tiny_model((ModelFileFormat)fmt, &size, &s);
        snprintf(label, sizeof(label), "%s_valid", name);
        int refused = model_refused(corpus_file("valid", label, b, size), err);
        CHECK(!refused, "the tiny %s model loads (%s)", name, refused ? err : "ok");
        size_t at[64] = {0, 1, 3, 4, 8, 512, header - 1, header, header + 1, size - 1};
        int n_at = 10;
        for (int i = 1; i < s.n && n_at + 2 < 64; i++) { // a tensor's first byte, and mid-float
            at[n_at++] = s.seg[i].file_offset;
            at[n_at++] = s.seg[i].file_offset + 2;
        }
        for (int i = 0; i < n_at; i++) {
            snprintf(label, sizeof(label), "%s_cut_%zu", name, at[i]);
            const char* p = corpus_file("model", label, b, at[i]);
            tally(&cuts, p, model_refused(p, err), err);
        }
        // the fields the format's reader uses: ints, then floats (byte offsets)
        const int seed_i[] = {8, 12, 16, 20, 24, 28, 36, 48}, llmc_i[] = {8, 12, 16, 20, 24, 28, 32, 36};
        const int seed_f[] = {32, 40, 44, 68}, llmc_f[] = {1024, 1028, 1032}, n_f = fmt == MODEL_FILE_SEED ? 4 : 3;
        const int *fi = fmt == MODEL_FILE_SEED ? seed_i : llmc_i, *ff = fmt == MODEL_FILE_SEED ? seed_f : llmc_f;
        unsigned char* m = malloc(size);
        for (int f = 0; f < 8; f++)
            for (size_t v = 0; v < sizeof(ints) / sizeof(ints[0]); v++) {
                int use_scaled_rope = f == 7;
                if (use_scaled_rope && ints[v] == 0) continue; // a valid value
                memcpy(m, b, size);
                memcpy(m + fi[f], &ints[v], 4);
                snprintf(label, sizeof(label), "%s_field%d_%d", name, fi[f], ints[v]);
                const char* p = corpus_file("model", label, m, size);
                tally(&fields, p, model_refused(p, err), err);
            }
        for (int f = 0; f < n_f; f++)
            for (size_t v = 0; v < sizeof(floats) / sizeof(floats[0]); v++) {
                if (ff[f] == 68 && floats[v] == 0.0f) continue; // rope_factor 0 (and -0): read as 32, valid
                memcpy(m, b, size);
                memcpy(m + ff[f], &floats[v], 4);
                snprintf(label, sizeof(label), "%s_field%d_%g", name, ff[f], floats[v]);
                const char* p = corpus_file("model", label, m, size);
                tally(&fields, p, model_refused(p, err), err);
            }
        const int32_t magic_version[3][2] = {{MODEL_MAGIC + 1, 3}, {MODEL_MAGIC, 2}, {MODEL_MAGIC, 4}};
        for (int k = 0; k < 3; k++) {
            memcpy(m, b, size);
            memcpy(m, magic_version[k], 8);
            snprintf(label, sizeof(label), "%s_magic%d_version%d", name, magic_version[k][0], magic_version[k][1]);
            const char* p = corpus_file("model", label, m, size);
            tally(&other, p, model_refused(p, err), err);
        }
        if (fmt == MODEL_FILE_LLMC) { // a bias that is not zero: only the data check sees it
            memcpy(m, b, size);
            for (int i = 0; i < s.n; i++)
                if (s.seg[i].param_offset < 0) ((float*)(m + s.seg[i].file_offset))[s.seg[i].count - 1] = 0.25f;
            const char* p = corpus_file("model", "llmc_bias_nonzero", m, size);
            tally(&other, p, model_refused(p, err), err);
        }
        free(m);
        free(b);
        free(s.seg);
    }
    tally_check(&cuts, "model files cut at every header and tensor boundary");
    tally_check(&fields, "model headers with a field at 0, -1, INT_MAX, INT_MIN, 2^30, +-0, NaN, +-inf, denormal");
    tally_check(&other, "model files with a wrong magic or version, or a non-zero llm.c bias");
}

// Token files cut at every header boundary and mid-token, counts at their extremes, ids past the
// vocab, wrong magic and version, too few tokens for one batch.
static void corpus_tokens(void) {
    char err[L3_ERR_LEN], label[64];
    Tally t = {0};
    for (int width = 4; width >= 2; width -= 2) {
        size_t n = 100, size = 1024 + n * width;
        unsigned char* b = calloc(size, 1);
        int32_t h[3] = {width == 4 ? TOKENS_MAGIC_LLAMA3 : TOKENS_MAGIC_GPT2, width == 4 ? 7 : 1, (int32_t)n};
        memcpy(b, h, sizeof(h));
        for (size_t i = 0; i < n; i++) b[1024 + i * width] = (unsigned char)(i % 64);
        const size_t at[] = {0, 1, 4, 8, 12, 1023, 1024, 1025, 1024 + (size_t)width, size - 1};
        for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
            snprintf(label, sizeof(label), "u%d_cut_%zu", width * 8, at[i]);
            const char* p = corpus_file("tokens", label, b, at[i]);
            tally(&t, p, tokens_refused(p, err), err);
        }
        const int32_t counts[] = {-1, 0, 99, 101, INT_MAX, INT_MIN};
        unsigned char* m = malloc(size);
        for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
            memcpy(m, b, size);
            memcpy(m + 8, &counts[k], 4);
            snprintf(label, sizeof(label), "u%d_count_%d", width * 8, counts[k]);
            const char* p = corpus_file("tokens", label, m, size);
            tally(&t, p, tokens_refused(p, err), err);
        }
        const size_t where[] = {0, 50, 99};
        for (size_t k = 0; k < 3; k++) {
            memcpy(m, b, size);
            memset(m + 1024 + where[k] * width, 0xff, width); // 65535 or 2^32-1, past any vocab here
            snprintf(label, sizeof(label), "u%d_id_past_vocab_at_%zu", width * 8, where[k]);
            const char* p = corpus_file("tokens", label, m, size);
            tally(&t, p, tokens_refused(p, err), err);
        }
        const int32_t magic_version[2][2] = {{h[0] + 1, h[1]}, {h[0], h[1] + 1}};
        for (int k = 0; k < 2; k++) {
            memcpy(m, b, size);
            memcpy(m, magic_version[k], 8);
            snprintf(label, sizeof(label), "u%d_magic%d_version%d", width * 8, magic_version[k][0], magic_version[k][1]);
            const char* p = corpus_file("tokens", label, m, size);
            tally(&t, p, tokens_refused(p, err), err);
        }
        snprintf(label, sizeof(label), "u%d_too_few_for_a_batch", width * 8);
        const char* p = corpus_file("tokens", label, b, size);
        tally(&t, p, tokens_refused(p, err), err);
        free(m);
        free(b);
    }
    tally_check(&t, "token files: cuts, counts at extremes, ids past the vocab, magic, version, too short");
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) { // xorshift64
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

// A file refused (model_refused, tokens_refused) under its own time limit: an open of a FIFO waits for
// a writer, unless it is opened non-blocking.
static int refused_in_time(int (*refused)(const char*, char*), const char* path, char* err) {
    limit_start(path);
    int rc = refused(path, err);
    limit_end();
    return rc;
}

// Random bytes, directories, FIFOs (which would block an open), and paths that are empty or missing.
static void corpus_odd_files(void) {
    char err[L3_ERR_LEN], label[64], path[512];
    Tally t = {0};
    unsigned char junk[4096];
    for (int k = 0; k < 16; k++) {
        size_t n = rng_next() % sizeof(junk);
        for (size_t i = 0; i < n; i++) junk[i] = (unsigned char)rng_next();
        snprintf(label, sizeof(label), "random_%d", k);
        const char* p = corpus_file("model", label, junk, n);
        tally(&t, p, model_refused(p, err), err);
        p = corpus_file("tokens", label, junk, n);
        tally(&t, p, tokens_refused(p, err), err);
    }
    for (int fifo = 0; fifo <= 1; fifo++) {
        snprintf(path, sizeof(path), "%s/model_%s", corpus_dir, fifo ? "fifo" : "directory");
        int made = fifo ? mkfifo(path, 0600) : mkdir(path, 0700);
        tally(&t, path, made == 0 && refused_in_time(model_refused, path, err), err);
        CHECK(made == 0 && strstr(err, fifo ? "is a pipe or FIFO" : "is a directory"), "a %s is named as one: %s",
              fifo ? "FIFO" : "directory", err);
        snprintf(path, sizeof(path), "%s/tokens_%s", corpus_dir, fifo ? "fifo" : "directory");
        made = fifo ? mkfifo(path, 0600) : mkdir(path, 0700);
        tally(&t, path, made == 0 && refused_in_time(tokens_refused, path, err), err);
    }
    snprintf(path, sizeof(path), "%s/missing.bin", corpus_dir);
    tally(&t, path, model_refused(path, err), err);
    tally_check(&t, "random bytes, directories, FIFOs and a missing path as model and token files");
}

// A bounded random-mutation loop over valid files: bytes of the header set at random, fields set to
// extremes, the file cut or extended. Each result loads, or is refused in one line naming it.
static void mutation_loop(int rounds) {
    char err[L3_ERR_LEN], path[512];
    snprintf(path, sizeof(path), "%s/mutant.bin", tmpdir);
    size_t sizes[3];
    SegmentList segs[2];
    unsigned char* base[3] = {tiny_model(MODEL_FILE_SEED, &sizes[0], &segs[0]),
                              tiny_model(MODEL_FILE_LLMC, &sizes[1], &segs[1]), NULL};
    int32_t toks[1024 / 4 + 300] = {TOKENS_MAGIC_LLAMA3, 7, 300};
    base[2] = (unsigned char*)toks, sizes[2] = sizeof(toks);
    unsigned char* m = malloc(sizes[1] + 4096);
    const int32_t extremes[4] = {INT_MAX, INT_MIN, -1, 0};
    Tally t = {0};
    for (int r = 0; r < rounds; r++) {
        int which = (int)(rng_next() % 3);
        size_t n = sizes[which], header = which == 2 ? 1024 : which == 1 ? 2048 : 1024;
        memcpy(m, base[which], n);
        for (int k = 1 + (int)(rng_next() % 4); k > 0; k--) {
            uint64_t op = rng_next() % 4, x = rng_next();
            if (op == 0) m[x % header] = (unsigned char)(x >> 32);
            else if (op == 1) memcpy(m + (x % (header / 4)) * 4, &extremes[x >> 62], 4);
            else if (op == 2) n = x % (n + 1);
            else if (n + 16 <= sizes[1] + 4096) n += 1 + x % 16;
        }
        write_file(path, m, n, NULL, 0);
        int refused = which == 2 ? tokens_refused(path, err) : model_refused(path, err);
        if (refused) tally(&t, path, refused, err);
    }
    CHECK(t.refused == t.cases, "random mutations of valid files: %d rounds, %d refused in one line, %d not%s%s", rounds,
          t.refused, t.cases - t.refused, t.first_bad[0] ? "; first: " : "", t.first_bad);
    free(m);
    free(base[0]);
    free(base[1]);
    free(segs[0].seg);
    free(segs[1].seg);
}

// The mends of issue 11 that are not a whole corpus: messages that name the field, and values that
// were accepted although wrong.
static void test_hostile_values(void) {
    char err[L3_ERR_LEN];
    Llama3Config c = small_config(), bad = c;
    bad.norm_eps = INFINITY;
    expect_error(config_check(&bad, "m.bin", err), err, "norm_eps +inf", "m.bin: norm_eps inf is out of range", NULL);
    bad = c, bad.rope_theta = 1.4e-45f;
    expect_error(config_check(&bad, "m.bin", err), err, "rope_theta denormal (a NaN RoPE table)", "rope_theta 1.4013e-45",
                 "[1, 1e+12]");
    bad = c, bad.rope_factor = 0.5f; // would raise the low frequencies
    expect_error(config_check(&bad, "m.bin", err), err, "rope_factor 0.5", "m.bin: rope_factor 0.5 is out of range [1, 1024]",
                 NULL);
    bad = c, bad.use_scaled_rope = 2;
    expect_error(config_check(&bad, "m.bin", err), err, "use_scaled_rope 2", "use_scaled_rope 2 is out of range [0, 1]",
                 NULL);
    bad = c, bad.ffn_dim_multiplier = 1e30f; // the int cast of the FFN width overflowed
    expect_error(config_check(&bad, "m.bin", err), err, "ffn_dim_multiplier 1e30", "ffn_dim_multiplier 1e+30", NULL);
    CHECK(ffn_hidden_dim(8192, 3e9f, 1) == -1, "ffn_hidden_dim refuses a width past 2^20 instead of overflowing");
    TrainArgs a;
    char* lead_space[] = {"prog", "--batch_size", " 4"};
    expect_error(train_args_parse(&a, 3, lead_space, 1, err), err, "an integer with a leading space", "bad value ' 4'",
                 NULL);
    char* plus[] = {"prog", "--batch_size", "+4"};
    expect_error(train_args_parse(&a, 3, plus, 1, err), err, "an integer with a '+'", "bad value '+4'", NULL);
    char* beta2[] = {"prog", "--beta2", "0.99999999"};
    expect_error(train_args_parse(&a, 3, beta2, 1, err), err, "--beta2 that rounds to 1 in float", "--beta2: bad value",
                 "32-bit float");
    char* lr[] = {"prog", "--learning_rate", "1e-50"};
    expect_error(train_args_parse(&a, 3, lr, 1, err), err, "--learning_rate that becomes 0 in float", "too small", NULL);
    char* empty[] = {"prog", "--input_bin", ""};
    expect_error(train_args_parse(&a, 3, empty, 1, err), err, "an empty path", "--input_bin: empty path", NULL);
    Llama3Config wide = llama3_2_1b_config();
    wide.n_head = 8, wide.n_kv_head = 2;
    char* model[] = {"prog", "--llmc_filepath", "wide.bin"};
    train_args_parse(&a, 3, model, 1, err);
    expect_error(train_args_check(&a, &wide, err), err, "a kernel limit names the model file", "wide.bin: head_dim 256",
                 NULL);
}

// A file that is not what its header says is refused from its header, before it is read; an
// allocation that cannot be had is named with its size.
static void test_hostile_sizes(void) {
    char err[L3_ERR_LEN];
    const char* path = tmp_path("sparse_8gb.bin");
    int32_t h[256] = {12345};
    write_file(path, h, sizeof(h), NULL, 0);
    int ok = truncate(path, 8LL << 30) == 0; // sparse: no disk used
    TokenData d;
    clock_t t0 = clock();
    int rc = tokens_load_file(&d, path, 1000, err);
    double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECK(ok && rc && strstr(err, "bad magic 12345") && s < 1.0, "an 8 GB token file with a bad magic: refused in %.3f s "
          "from its header (%s)", s, err);
    unlink(path);
    int saved = without_stderr();
    rc = tokens_alloc(&d, SIZE_MAX / 8, "huge.bin", err);
    with_stderr(saved);
    expect_error(rc, err, "tokens that cannot be allocated", "huge.bin: out of host memory", "GiB");
    const char* model = tmp_path("model_in.bin");
    write_file(model, h, 16, NULL, 0);
    const char* link = tmp_path("model_link.bin");
    int linked = symlink(model, link) == 0;
    TrainArgs a;
    char* direct[] = {"prog", "--llmc_filepath", (char*)model, "--log_file", (char*)model};
    train_args_parse(&a, 5, direct, 1, err);
    expect_error(outputs_check(&a, err), err, "--log_file naming the model file", "is the same file as --llmc_filepath",
                 NULL);
    uint32_t toks[20] = {0};
    const char* shard = write_tokens("shard_linked.bin", TOKENS_MAGIC_LLAMA3, 7, 20, toks, sizeof(toks));
    const char* shard_link = tmp_path("shard_link.bin");
    linked &= symlink(shard, shard_link) == 0;
    TokenSource linked_src;
    int held = token_source_open(&linked_src, tmp_path("shard_linked*.bin"), "--input_bin", 1000, err) == 0 &&
               linked_src.n == 1 && source_holds(&linked_src, shard_link);
    CHECK(linked && held, "--log_file through a link to a token file of a glob is one of its files (%s)",
          held ? "held" : err);
    token_source_free(&linked_src);
}

// A text file shorter than a format's header, given as a model, token or state file (issue 45): each
// reader says it is no file of its kind and why, in the same words, not that it is truncated.
static void test_shorter_than_header(void) {
    char err[L3_ERR_LEN];
    const char* text = "a text file, 42 bytes, where one was meant";
    const char* path = tmp_path("text42.txt");
    write_file(path, text, strlen(text), NULL, 0);
    Llama3Config c;
    ModelFileFormat fmt;
    TokenData d;
    CheckpointState st;
    Vocab v;
    expect_error(model_header_read(path, &c, &fmt, err), err, "a 42-byte text file as a model file",
                 "text42.txt: not a model file (42 bytes, shorter than the 1024-byte header)", NULL);
    expect_error(tokens_load_file(&d, path, 1000, err), err, "a 42-byte text file as a token file",
                 "text42.txt: not a token file (42 bytes, shorter than the 1024-byte header)", NULL);
    expect_error(state_header_read(path, 1000, &st, err), err, "a 42-byte text file as a checkpoint state file",
                 "text42.txt: not a checkpoint state file (42 bytes, shorter than the 256-byte header)", NULL);
    expect_error(vocab_parse(&v, (const unsigned char*)text, strlen(text), "text42.txt", err), err,
                 "42 bytes as a vocabulary table", "text42.txt: not a vocabulary table (42 bytes, shorter", NULL);
}

// An existing --log_file that cannot take the log (issue 45: a directory passed every check and failed
// after the GPU start): refused by outputs_writable, before the GPU; a pipe or a device such as /dev/full
// (make test's log that fails on write) passes, but not under --resume, which reads and cuts the log.
static int log_verdict(TrainArgs* a, char* err) {
    Output out[MAX_OUTPUTS];
    Llama3Config c = llama3_2_1b_config();
    int n;
    return outputs_writable(a, &c, 0, out, &n, err);
}
static void test_log_file_kinds(void) {
    char err[L3_ERR_LEN];
    TrainArgs a = train_args_default();
    a.loop.log_file = tmpdir;
    expect_error(log_verdict(&a, err), err, "--log_file naming a directory", "--log_file",
                 "is a directory, not a file to write the log to");
    const char* fifo = tmp_path("log_fifo");
    int made = mkfifo(fifo, 0600) == 0;
    const char* fine[] = {"/dev/null", "/dev/full", fifo, tmp_path("new_log.jsonl")};
    for (int i = 0; i < 4; i++) {
        a.loop.log_file = fine[i];
        int rc = log_verdict(&a, err);
        CHECK((i != 2 || made) && rc == 0, "--log_file %s passes the check (%s)", fine[i], rc ? err : "ok");
    }
    a.ckpt.resume = tmp_path("ckpt");
    a.loop.log_file = fifo;
    expect_error(log_verdict(&a, err), err, "--resume with a FIFO as --log_file", "is a pipe or FIFO, not a regular "
                 "file (a resumed run reads its log", NULL);
    a.loop.log_file = "/dev/null";
    expect_error(log_verdict(&a, err), err, "--resume with /dev/null as --log_file", "is a character device, not a "
                 "regular file", NULL);
    unlink(fifo);
}

// ---- outputs: every path a run writes, checked before the GPU (issue 65) ----

// Output cases: a command line (D/: the corpus folder, where afile is a regular file and adir a
// folder) whose outputs outputs_writable refuses in one line naming the flag and path (said: also in
// it) or takes (said NULL), creating nothing. The refused ones join the hostile corpus
// (corpus_dir/output_LABEL, one argument a line) for ./train_llama3 (run_tests.sh).
typedef struct {
    const char* label;
    const char* args;
    const char* said;
} OutputCase;
static const OutputCase OUTPUT_CASES[] = {
    {"save_hf_under_file", "--save_hf D/afile/sub", "cannot be written: D/afile is a regular file, not a folder"},
    {"checkpoint_dir_under_file", "--checkpoint_dir D/afile/ck", "D/afile is a regular file, not a folder"},
    {"log_under_file", "--log_file D/afile/x.jsonl", "D/afile is a regular file, not a folder"},
    {"log_under_file_deeper", "--log_file D/afile/a/b/x.jsonl", "D/afile is a regular file, not a folder"},
    {"checkpoint_dir_is_file", "--checkpoint_dir D/afile", "D/afile is a regular file, not a folder"},
    {"save_hf_is_file", "--save_hf D/afile", "D/afile is a regular file, not a folder"},
    {"log_is_folder", "--log_file D/adir", "is a directory, not a file to write the log to"},
    {"log_folder_missing", "--log_file D/none/log.jsonl", "its folder D/none does not exist"},
    {"checkpoint_dir_parent_missing", "--checkpoint_dir D/none/ck", "its folder D/none does not exist"},
    {"save_hf_parent_missing", "--save_hf D/none/out", "its folder D/none does not exist"},
    {"checkpoints_fill_the_disk", "--checkpoint_dir D/ck --checkpoint_every 1 --num_iteration 2000 "
     "--checkpoint_keep 2000", "free, and the run writes up to"},
    {"log_new", "--log_file D/adir/new.jsonl", NULL},
    {"all_new", "--log_file D/fresh.jsonl --checkpoint_dir D/ck --save_hf D/hf", NULL},
    {"existing_folders", "--checkpoint_dir D/adir --save_hf D/adir --log_file /dev/null", NULL},
};

// s with every "D/" the corpus folder (out: 1024 bytes).
static const char* in_corpus(const char* s, char* out) {
    size_t k = 0;
    for (; *s && k < 900; s++)
        if (s[0] == 'D' && s[1] == '/') k += snprintf(out + k, 1024 - k, "%s", corpus_dir);
        else out[k++] = *s;
    out[k] = '\0';
    return out;
}

// What outputs_writable says of a command line of the 1B (NULL: takes it), and its outputs' count.
static const char* outputs_verdict(const char* line, int world, int rank, int* n) {
    static char err[L3_ERR_LEN];
    TrainArgs a;
    Output out[MAX_OUTPUTS];
    Llama3Config c = llama3_2_1b_config();
    if (parse_ranks(&a, err, line, world)) return err;
    a.loop.rank = rank;
    return outputs_writable(&a, &c, 0, out, n, err) ? err : NULL;
}

static void test_output_cases(void) {
    char line[1024], said[1024];
    int n;
    for (size_t i = 0; i < sizeof(OUTPUT_CASES) / sizeof(OUTPUT_CASES[0]); i++) {
        const OutputCase* k = &OUTPUT_CASES[i];
        in_corpus(k->args, line);
        const char* err = outputs_verdict(line, 1, 0, &n);
        char flag_path[1024]; // the first flag and its path
        size_t flag = strcspn(line, " ");
        snprintf(flag_path, sizeof(flag_path), "%.*s", (int)(flag + 1 + strcspn(line + flag + 1, " ")), line);
        if (k->said)
            CHECK(err && one_line(err, flag_path) && strstr(err, in_corpus(k->said, said)),
                  "output %s refused in one line naming %s -> \"%s\"", k->label, flag_path, err ? err : "(taken)");
        else CHECK(!err, "output %s taken (%s)", k->label, err ? err : "ok");
    }
    const char* made[] = {"none", "ck", "hf", "fresh.jsonl", "adir/new.jsonl"}; // (tmp_path("new.jsonl") is another test's)
    int created = 0;
    for (int i = 0; i < 5; i++) {
        snprintf(line, sizeof(line), "%s/%s", corpus_dir, made[i]);
        created += access(line, F_OK) == 0;
    }
    snprintf(line, sizeof(line), "%s/afile", corpus_dir);
    CHECK(created == 0 && file_size_of(line) == 5, "the checks created nothing (%d of 5 paths there) and left afile "
          "as it was", created);
    const char* err = outputs_verdict(in_corpus("--log_file D/none/x --save_hf D/afile/x --checkpoint_dir D/ck", line),
                                      2, 1, &n);
    CHECK(!err && n == 1, "rank 1 of 2 checks only the checkpoint folder, its share of the state (%d outputs; %s)", n,
          err ? err : "ok");
}

// The rendezvous file (rank 0 of several writes it): new, in a folder that exists; a spec that is
// none is refused here too, before the GPU.
static void test_rendezvous_output(void) {
    char line[1024];
    int n;
    const char* err = outputs_verdict(in_corpus("--rendezvous file:D/afile", line), 2, 0, &n);
    CHECK(err && strstr(err, "exists already (an earlier run's, or one that stopped)"),
          "a rendezvous file left by an earlier run, refused before the GPU -> \"%s\"", err ? err : "(taken)");
    err = outputs_verdict(in_corpus("--rendezvous file:D/none/rdv", line), 2, 0, &n);
    CHECK(err && strstr(err, "its folder"), "a rendezvous file in a missing folder -> \"%s\"", err ? err : "(taken)");
    err = outputs_verdict(in_corpus("--rendezvous file:D/adir/rdv", line), 2, 1, &n);
    CHECK(!err && n == 0, "rank 1 does not write the rendezvous file: not its output (%s)", err ? err : "ok");
    err = outputs_verdict("--rendezvous tcp:host", 2, 0, &n);
    CHECK(err && strstr(err, "expected file:PATH or tcp:HOST:PORT"), "a rendezvous that is no spec -> \"%s\"",
          err ? err : "(taken)");
}

// What a checkpoint holds and how many are kept at once: the 1B's model.bin (1024 + 4 x 1,498,482,688
// bytes) and state.bin (256 + 2 x 4 x 1,498,482,688), its share on each of 2 ranks; the saves of a run
// until --checkpoint_keep, and one more while a save completes.
static void test_checkpoint_sizes(void) {
    char err[L3_ERR_LEN];
    Llama3Config c = llama3_2_1b_config();
    TrainArgs a;
    parse(&a, err, "");
    unsigned long long one = checkpoint_bytes(&a, &c), model = 1024 + 4ull * 1498482688, state = 256 + 8ull * 1498482688;
    CHECK(one == model + state, "the 1B's checkpoint: %llu bytes (model.bin %llu + state.bin %llu)", one, model, state);
    parse_ranks(&a, err, "--optimizer_state bf16", 2);
    unsigned long long two = checkpoint_bytes(&a, &c);
    CHECK(two > model + 2 * 256 + 4ull * 1498482688 && two < model + 2 * 256 + 4ull * 1498482688 + 8ull * 128256 * 2048,
          "2 ranks of bf16 moments: %llu bytes (each rank's share and the sparse embedding's whole state)", two);
    struct { const char* flags; int start, held, want; } runs[] = {
        {"", 0, 0, 1}, {"--num_iteration 2000 --checkpoint_every 1000", 0, 0, 2},
        {"--num_iteration 2000 --checkpoint_every 100", 0, 0, 3}, {"--num_iteration 2000 --checkpoint_every 100", 1000, 2, 1},
        {"--num_iteration 2000 --checkpoint_every 100 --checkpoint_keep 5", 1000, 2, 4},
        {"--num_iteration 2000 --checkpoint_every 300 --stop_after 1000", 0, 0, 3}};
    for (int i = 0; i < 6; i++) {
        parse(&a, err, runs[i].flags);
        int k = checkpoints_at_once(&a, runs[i].start, runs[i].held);
        CHECK(k == runs[i].want, "'%s' from step %d, %d held: %d checkpoints at once (%d)", runs[i].flags, runs[i].start,
              runs[i].held, k, runs[i].want);
    }
}

// The file system's verdicts from statvfs's numbers: read-only, full, or room.
static void test_space_problem(void) {
    char why[L3_ERR_LEN];
    unsigned long long free_bytes;
    struct statvfs v;
    memset(&v, 0, sizeof(v));
    v.f_frsize = 4096, v.f_bavail = 1 << 20; // 4 GiB free
    CHECK(space_problem("d", &v, 3ull << 30, &free_bytes, why, sizeof(why)) == 0 && free_bytes == 4ull << 30,
          "3 GiB on a file system with 4 GiB free: taken");
    CHECK(space_problem("d", &v, 5ull << 30, &free_bytes, why, sizeof(why)) && !strcmp(why, "d has 4.00 GiB free, and "
          "the run writes up to 5.00 GiB there"), "5 GiB on 4 GiB free: %s", why);
    v.f_bavail = 25600; // 100 MiB
    CHECK(space_problem("d", &v, 200ull << 20, &free_bytes, why, sizeof(why)) && !strcmp(why, "d has 100.00 MiB free, "
          "and the run writes up to 200.00 MiB there"), "200 MiB on 100 MiB free: %s", why);
    v.f_flag = ST_RDONLY;
    CHECK(space_problem("d", &v, 0, &free_bytes, why, sizeof(why)) && !strcmp(why, "d is on a read-only file system"),
          "a read-only file system: %s", why);
}

// In a child process (which may change its user or mounts): output_check of --checkpoint_dir
// DIR/ck; 0 if its message holds `said`, 1 if not, 2 when fn could not set the case up.
static int child_verdict(int (*setup)(const char* dir), const char* dir, const char* said) {
    pid_t pid = fork();
    if (pid == 0) {
        char path[600], err[L3_ERR_LEN] = "";
        if (setup(dir)) _exit(2);
        snprintf(path, sizeof(path), "%s/ck", dir);
        Output o = output_of("--checkpoint_dir", path, OUT_FOLDER, 0, "checkpoints");
        int rc = output_check(&o, err);
        printf("     (%s)\n", rc ? err : "taken");
        _exit(rc && strstr(err, said) && strstr(err, "--checkpoint_dir") ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
// A user without write permission on dir (root: the child becomes nobody, for whom dir's 0555 holds).
static int as_other_user(const char* dir) { return (void)dir, getuid() == 0 && setuid(65534) != 0; }
// dir on a read-only file system: a read-only bind mount of it in a mount namespace of the child's own.
static int read_only_mount(const char* dir) {
    return unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
           mount(dir, dir, NULL, MS_BIND, NULL) || mount(NULL, dir, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL);
}

// No permission and a read-only file system, each in a folder of /tmp (1777, so that nobody reaches it):
// refused in one line. A machine that lets no process mount (no CAP_SYS_ADMIN) skips the second.
static void test_unwritable_folders(void) {
    char dir[] = "/tmp/llama3_outputs_XXXXXX";
    if (!mkdtemp(dir) || chmod(dir, 0555)) {
        CHECK(0, "a folder in /tmp for the permission cases: %s", strerror(errno));
        return;
    }
    fflush(stdout);
    CHECK(child_verdict(as_other_user, dir, "is not writable (Permission denied)") == 0,
          "--checkpoint_dir in a folder this user may not write: refused in one line");
    int rc = child_verdict(read_only_mount, dir, "is on a read-only file system");
    if (rc == 2) printf("skipped: a read-only file system (this machine lets no process mount one)\n");
    else CHECK(rc == 0, "--checkpoint_dir in a folder on a read-only file system: refused in one line");
    rmdir(dir);
}

// The dry run's lines of the outputs, and the one for none.
static void test_outputs_print(void) {
    Output out[2] = {output_of("--log_file", "run.jsonl", OUT_LOG, 0, "the JSON log"),
                     output_of("--checkpoint_dir", "ck", OUT_FOLDER, 3ull << 30, "3 checkpoints of 1.00 GiB at once")};
    out[1].exists = true, out[1].free_bytes = 5ull << 30;
    FILE* f = tmpfile();
    outputs_print(f, out, 2);
    outputs_print(f, out, 0);
    char* text = printed_text(f);
    CHECK(!strcmp(text, "output: --log_file run.jsonl (a new file; the JSON log): can be written\n"
                        "output: --checkpoint_dir ck (an existing folder; 3 checkpoints of 1.00 GiB at once, 3.00 GiB "
                        "of 5.00 GiB free): can be written\n"
                        "outputs: none on this rank (no --log_file, --checkpoint_dir or --save_hf)\n"),
          "the outputs' lines: %s", text);
    free(text);
}

// The corpus's afile (5 bytes) and adir, then each refused output case as corpus_dir/output_LABEL.
static void output_corpus(void) {
    char path[600], args[1024];
    snprintf(path, sizeof(path), "%s/afile", corpus_dir);
    write_file(path, "afile", 5, NULL, 0);
    snprintf(path, sizeof(path), "%s/adir", corpus_dir);
    mkdir(path, 0700);
    for (size_t i = 0; i < sizeof(OUTPUT_CASES) / sizeof(OUTPUT_CASES[0]); i++) {
        if (!OUTPUT_CASES[i].said) continue;
        snprintf(path, sizeof(path), "%s/output_%s", corpus_dir, OUTPUT_CASES[i].label);
        FILE* f = fopen(path, "w");
        in_corpus(OUTPUT_CASES[i].args, args);
        for (char* w = strtok(args, " "); f && w; w = strtok(NULL, " ")) fprintf(f, "%s\n", w);
        if (f) fclose(f);
    }
}

static void test_outputs(void) {
    output_corpus();
    test_output_cases();
    test_rendezvous_output();
    test_checkpoint_sizes();
    test_space_problem();
    test_unwritable_folders();
    test_outputs_print();
}

// llm.c's bf16 files (version 5): each value widened exactly (bf16 is the top half of an fp32).
static void test_llmc_bf16_file(void) {
    Llama3Config c = small_config(), got;
    SegmentList s = llmc_file_segments(&c, 2048, 2);
    int32_t h[512];
    llmc_header_write(h, &c, MODEL_VERSION_BF16);
    size_t n16 = (s.end - 2048) / 2;
    uint16_t* vals = calloc(n16, 2);
    for (int i = 0; i < s.n; i++)
        if (s.seg[i].param_offset >= 0)
            for (size_t j = 0; j < s.seg[i].count; j++) vals[(s.seg[i].file_offset - 2048) / 2 + j] = 0x3f80 + (j % 97);
    const char* path = tmp_path("llmc_bf16.bin");
    write_file(path, h, 2048, vals, n16 * 2);
    char err[L3_ERR_LEN];
    ModelFileFormat fmt;
    int rc = model_header_read(path, &got, &fmt, err);
    CHECK(rc == 0 && fmt == MODEL_FILE_LLMC_BF16, "llm.c version 5 (bf16) detected (%s)", rc ? err : "ok");
    size_t n = param_layout(&c).total, wrong = 0;
    float* params = calloc(n, sizeof(float));
    float buf[777];
    rc = model_file_load(path, &c, MODEL_FILE_LLMC_BF16, buf, 777, host_sink, params, err);
    for (int i = 0; i < s.n && rc == 0; i++)
        for (size_t j = 0; s.seg[i].param_offset >= 0 && j < s.seg[i].count; j++) {
            uint32_t bits = (uint32_t)(0x3f80 + (j % 97)) << 16;
            float want;
            memcpy(&want, &bits, 4);
            wrong += params[s.seg[i].param_offset + j] != want;
        }
    CHECK(rc == 0 && wrong == 0, "bf16 file: every value widened exactly (%zu wrong; %s)", wrong, rc ? err : "ok");
    vals[(s.seg[3].file_offset - 2048) / 2] = 0x3f80; // a bias that is not zero
    write_file(path, h, 2048, vals, n16 * 2);
    expect_error(model_file_check(path, &c, MODEL_FILE_LLMC_BF16, err), err, "bf16 file with a bias", "is not zero", NULL);
    write_file(path, h, 2048, vals, n16 * 2 - 2);
    expect_error(model_header_read(path, &got, &fmt, err), err, "bf16 file one value short", "truncated", NULL);
    free(s.seg), free(vals), free(params);
}

static TrainArgs ckpt_args(void) {
    TrainArgs a = train_args_default();
    a.loop.batch_size = 2, a.loop.sequence_length = 8, a.loop.total_batch_size = 16, a.optim.sched.total = 30;
    return a;
}

// A checkpoint written from host arrays reads back bit for bit; latest names the newest.
static void test_checkpoint_round_trip(void) {
    Llama3Config c = small_config(), got;
    size_t n = param_layout(&c).total;
    float *params = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4), *back = calloc(3 * n, 4);
    for (size_t i = 0; i < n; i++) params[i] = (float)i * 0.5f, m[i] = -(float)i, v[i] = (float)(i % 7919);
    uint32_t toks[300];
    for (int i = 0; i < 300; i++) toks[i] = i % 1000;
    TokenData d = {toks, 300};
    TokenSource s;
    DataLoader l;
    TrainArgs a = ckpt_args();
    char err[L3_ERR_LEN], model[L3_PATH_LEN], state[L3_PATH_LEN];
    memory_loader(&l, &s, &d, 2, 8, 1, 0, 0, 1, a.loop.shuffle, "t", err);
    for (int i = 0; i < 3; i++) next_batch(&l, (int32_t[16]){0}, (int32_t[16]){0}); // at step 3 of the shard
    const char* dir = tmp_path("ckpt");
    make_dir(dir, err);
    CheckpointState st = checkpoint_state_make(&a, 10, n, n, &l), rd;
    int rc = checkpoint_write(dir, &c, &st, params, m, v, err);
    CHECK(rc == 0, "checkpoint_write (%s)", rc ? err : "ok");
    rc = checkpoint_resolve(dir, model, state, err);
    CHECK(rc == 0 && strstr(state, "step_00000010/state.bin"), "--resume DIR finds latest: %s", rc ? err : state);
    ModelFileFormat fmt;
    float buf[777];
    rc = model_header_read(model, &got, &fmt, err) || model_file_load(model, &c, fmt, buf, 777, host_sink, back, err) ||
         state_header_read(state, n, &rd, err) || state_arrays_read(state, n, 4, back + n, back + 2 * n, err);
    CHECK(rc == 0 && fmt == MODEL_FILE_SEED && !memcmp(back, params, n * 4) && !memcmp(back + n, m, n * 4) &&
              !memcmp(back + 2 * n, v, n * 4) && rd.step == 10 && rd.loader_group == 3 && rd.loader_epoch == 0 &&
              rd.loader_shard == 0 && rd.data_tokens == 300 && rd.data_shards == 1 && rd.shuffle == a.loop.shuffle,
          "model.bin (seed format), m, v, step and data position read back bit for bit (%s)", rc ? err : "ok");
    rc = resume_check(&rd, &a, &s, dir, err);
    CHECK(rc == 0, "the same run resumes (%s)", rc ? err : "ok");
    TrainArgs b = a;
    b.loop.batch_size = 4;
    expect_error(resume_check(&rd, &b, &s, dir, err), err, "resume with another B", "--batch_size 4 differs", NULL);
    b = a, b.loop.total_batch_size = 32;
    expect_error(resume_check(&rd, &b, &s, dir, err), err, "resume with another total batch", "--total_batch_size", NULL);
    b = a, b.optim.sched.total = 10;
    expect_error(resume_check(&rd, &b, &s, dir, err), err, "--num_iteration not past the step", "nothing to run", NULL);
    TokenSource other;
    toks[5] ^= 1;
    token_source_memory(&other, &d, "t", 1 << 30);
    expect_error(resume_check(&rd, &a, &other, dir, err), err, "resume on other token data",
                 "differs from the checkpoint's token data", NULL);
    token_source_free(&other);
    toks[5] ^= 1;
    b = a, b.loop.shuffle = !a.loop.shuffle;
    expect_error(resume_check(&rd, &b, &s, dir, err), err, "resume with the other --shuffle", "saved with --shuffle",
                 NULL);
    b = a, b.loop.seed = a.loop.seed + 1;
    if (a.loop.shuffle)
        expect_error(resume_check(&rd, &b, &s, dir, err), err, "a shuffled run resumed with another --seed",
                     "and its --seed", NULL);
    b = a, b.optim.sched.peak_lr = 3e-4f, b.optim.sched.total = 99;
    CHECK(resume_check(&rd, &b, &s, dir, err) == 0, "a resume may change the lr and --num_iteration");
    expect_error(state_header_read(state, n + 1, &rd, err), err, "state of another model", "from another model", NULL);
    expect_error(checkpoint_dir_check(dir, 0, err), err, "a fresh run into a folder with a later checkpoint",
                 "already holds step_00000010", NULL);
    CHECK(checkpoint_dir_check(dir, 10, err) == 0, "a run resumed at step 10 may write into its folder");
    free(params), free(m), free(v), free(back);
    memory_loader_free(&l, &s);
}

// grow_1.bin rewritten with the first `count` of toks, then a resume of st on grow_*.bin: 0 if taken
// (err says why not); *hash is the shards' hash now.
static int resume_after_rewrite(const CheckpointState* st, const TrainArgs* a, const uint32_t* toks, size_t count,
                                uint64_t* hash, char* err) {
    TokenSource now;
    write_tokens("grow_1.bin", TOKENS_MAGIC_LLAMA3, 7, (int32_t)count, toks, count * 4);
    int rc = token_source_open(&now, tmp_path("grow_*.bin"), "--input_bin", 1000, err) ||
             resume_check(st, a, &now, "ck", err);
    *hash = now.hash;
    token_source_free(&now);
    return rc;
}

// A shard rewritten longer between a save and its resume is other data (its steps, and so the saved
// position, fall on other tokens): refused, though its first 65,536 tokens, all of it the hash reads,
// are the same, so that only the token count sees it. Rewritten as it was, it resumes.
static void test_resume_grown_shard(void) {
    const size_t n = TOKENS_HASH_COUNT + 100, more = 64;
    uint32_t* toks = malloc((n + more) * 4);
    for (size_t i = 0; i < n + more; i++) toks[i] = (uint32_t)(i * 7919 % 1000);
    char err[L3_ERR_LEN];
    TrainArgs a = ckpt_args();
    LoaderConfig c = loader_config(&a, true);
    TokenSource saved;
    DataLoader l;
    write_tokens("grow_0.bin", TOKENS_MAGIC_LLAMA3, 7, 300, toks + more, 300 * 4);
    write_tokens("grow_1.bin", TOKENS_MAGIC_LLAMA3, 7, (int32_t)n, toks, n * 4);
    int rc = token_source_open(&saved, tmp_path("grow_*.bin"), "--input_bin", 1000, err) ||
             loader_init(&l, &saved, &c, err);
    CHECK(rc == 0, "two shards, the second of %zu tokens, to save from (%s)", n, rc ? err : "ok");
    if (rc == 0) {
        for (int i = 0; i < 3; i++) next_batch(&l, (int32_t[16]){0}, (int32_t[16]){0});
        CheckpointState st = checkpoint_state_make(&a, 10, 1, 1, &l);
        uint64_t hash;
        rc = resume_after_rewrite(&st, &a, toks, n, &hash, err);
        CHECK(rc == 0, "the second shard rewritten as it was between a save and its resume: taken (%s)",
              rc ? err : "ok");
        rc = resume_after_rewrite(&st, &a, toks, n + more, &hash, err);
        CHECK(rc != 0 && strstr(err, "differs from the checkpoint's token data") && hash == st.data_hash,
              "... rewritten %zu tokens longer past its first 65,536 (the same hash): refused at resume: %s", more,
              rc ? err : "(taken)");
        loader_free(&l);
    }
    token_source_free(&saved), free(toks);
}

// [data parallel] A checkpoint of two ranks: model.bin and state.bin (rank 0's share, written last),
// state_rank1.bin (rank 1's); each reads back its share; a resume by another number of ranks is
// refused; a version-1 state file (before ranks) reads as one rank's.
static void test_checkpoint_ranks(void) {
    Llama3Config c = small_config();
    size_t n = param_layout(&c).total, share[2] = {n / 3, n / 2};
    float *params = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4), *back = calloc(2 * n, 4);
    for (size_t i = 0; i < n; i++) params[i] = (float)i, m[i] = (float)i + 0.25f, v[i] = (float)i + 0.5f;
    uint32_t toks[300];
    for (int i = 0; i < 300; i++) toks[i] = i % 1000;
    TokenData d = {toks, 300};
    TokenSource s;
    DataLoader l;
    char err[L3_ERR_LEN], model[L3_PATH_LEN], state[L3_PATH_LEN], mine[L3_PATH_LEN];
    memory_loader(&l, &s, &d, 2, 8, 1, 0, 0, 2, 1, "t", err);
    const char* dir = tmp_path("ckpt_ranks");
    make_dir(dir, err);
    TrainArgs a = ckpt_args();
    a.loop.world = 2;
    CheckpointState st[2];
    int rc = 0;
    for (int r = 1; r >= 0; r--) { // rank 1's file, then rank 0's model.bin and state.bin
        a.loop.rank = r;
        st[r] = checkpoint_state_make(&a, 6, n, share[r], &l);
        rc |= r ? checkpoint_write_rank(dir, &st[r], m + r, v + r, err)
                : checkpoint_write(dir, &c, &st[r], params, m, v, err);
    }
    rc |= checkpoint_resolve(dir, model, state, err);
    int same = rc == 0;
    for (int r = 0; r < 2 && same; r++) {
        CheckpointState rd;
        same &= rank_state_path(state, r, mine, err) == 0 && state_header_read(mine, n, &rd, err) == 0 &&
                rd.rank == r && rd.world == 2 && rd.state_floats == share[r] &&
                state_arrays_read(mine, rd.state_floats, 4, back, back + n, err) == 0 &&
                !memcmp(back, m + r, share[r] * 4) && !memcmp(back + n, v + r, share[r] * 4);
    }
    CHECK(same && strstr(mine, "step_00000006/state_rank1.bin"),
          "two ranks' checkpoint: each rank's share of m and v read back from its own file (%s)", same ? mine : err);
    a.loop.rank = 0, a.loop.world = 1;
    expect_error(resume_check(&st[0], &a, &s, dir, err), err, "a checkpoint of 2 ranks resumed by 1",
                 "saved by 2 ranks, resumed by 1", "resume it on 2");
    CheckpointState v1 = st[0];
    v1.version = 1, v1.rank = v1.world = 0, v1.state_floats = 0; // a version-1 header has zeros there
    snprintf(mine, sizeof(mine), "%s/v1_state.bin", tmpdir);
    CheckpointState one = v1;
    one.state_floats = n;
    unsigned char header[CKPT_HEADER_BYTES] = {0};
    memcpy(header, &v1, sizeof(v1));
    Chunk chunks[3] = {{header, sizeof(header)}, {m, n * 4}, {v, n * 4}};
    CheckpointState rd;
    rc = write_file_atomic(mine, chunks, 3, err) || state_header_read(mine, n, &rd, err);
    CHECK(rc == 0 && rd.rank == 0 && rd.world == 1 && rd.state_floats == one.state_floats,
          "a version-1 state file reads as one rank's whole state (%s)", rc ? err : "ok");
    free(params), free(m), free(v), free(back);
    memory_loader_free(&l, &s);
}

// [bf16 moments] A checkpoint of --optimizer_state bf16: m and v as 2-byte values (the file's arrays
// half the fp32 one's), read back bit for bit; a resume with fp32 moments is refused; a version-2
// header (before the moments' dtype) reads as fp32 moments; a dtype field out of range is corrupt.
static void test_checkpoint_bf16_moments(void) {
    Llama3Config c = small_config();
    size_t n = param_layout(&c).total;
    float* params = malloc(n * 4);
    uint16_t *m = malloc(n * 2), *v = malloc(n * 2), *back = calloc(2 * n, 2);
    for (size_t i = 0; i < n; i++) params[i] = (float)i, m[i] = (uint16_t)(i * 7), v[i] = (uint16_t)(i * 13 + 1);
    uint32_t toks[300];
    for (int i = 0; i < 300; i++) toks[i] = i % 1000;
    TokenData d = {toks, 300};
    TokenSource s;
    DataLoader l;
    char err[L3_ERR_LEN], model[L3_PATH_LEN], state[L3_PATH_LEN];
    memory_loader(&l, &s, &d, 2, 8, 1, 0, 0, 1, 1, "t", err);
    const char* dir = tmp_path("ckpt_bf16");
    make_dir(dir, err);
    TrainArgs a = ckpt_args();
    a.optim.moments = MOMENTS_BF16;
    CheckpointState st = checkpoint_state_make(&a, 4, n, n, &l), rd;
    int rc = checkpoint_write(dir, &c, &st, params, m, v, err) || checkpoint_resolve(dir, model, state, err) ||
             state_header_read(state, n, &rd, err) || state_arrays_read(state, n, 2, back, back + n, err);
    CHECK(rc == 0 && rd.moments == MOMENTS_BF16 && file_size_of(state) == CKPT_HEADER_BYTES + 4LL * (long long)n &&
              !memcmp(back, m, n * 2) && !memcmp(back + n, v, n * 2),
          "bf16 moments: state.bin holds 2-byte m and v, read back bit for bit (%s)", rc ? err : "ok");
    rc = resume_check(&rd, &a, &s, dir, err);
    CHECK(rc == 0, "bf16 moments: the same run resumes (%s)", rc ? err : "ok");
    TrainArgs b = a;
    b.optim.moments = MOMENTS_FP32;
    expect_error(resume_check(&rd, &b, &s, dir, err), err, "bf16 moments resumed with fp32 ones",
                 "saved in bf16: resume with --optimizer_state bf16", NULL);
    CheckpointState old = st;
    old.version = 2, old.moments = 0;
    unsigned char header[CKPT_HEADER_BYTES] = {0};
    memcpy(header, &old, sizeof(old));
    Chunk chunks[3] = {{header, sizeof(header)}, {params, n * 4}, {params, n * 4}};
    rc = write_file_atomic(state, chunks, 3, err) || state_header_read(state, n, &rd, err);
    CHECK(rc == 0 && rd.moments == MOMENTS_FP32, "a version-2 state file reads as fp32 moments (%s)", rc ? err : "ok");
    old.version = CKPT_VERSION, old.moments = 7;
    memcpy(header, &old, sizeof(old));
    rc = write_file_atomic(state, chunks, 3, err);
    expect_error(rc || state_header_read(state, n, &rd, err), err, "a state file with moments dtype 7",
                 "corrupt header", "moments dtype 7");
    old.version = 3, old.moments = MOMENTS_FP32, old.loader_pos = 48, old.total_batch_size = 16;
    old.shuffle = 1, old.data_shards = 9, old.loader_epoch = old.loader_shard = old.loader_group = 5; // (v4's bytes)
    memcpy(header, &old, sizeof(old));
    rc = write_file_atomic(state, chunks, 3, err) || state_header_read(state, n, &rd, err);
    CHECK(rc == 0 && rd.shuffle == 0 && rd.data_shards == 1 && rd.loader_epoch == 0 && rd.loader_shard == 0 &&
              rd.loader_group == 3,
          "a version-3 state file (one token file in order) reads its token offset 48 as step 3 of 16 tokens (%s)",
          rc ? err : "ok");
    free(params), free(m), free(v), free(back);
    memory_loader_free(&l, &s);
}

// Broken checkpoints: each a one-line error naming the file.
static void test_checkpoint_errors(void) {
    Llama3Config c = small_config();
    size_t n = param_layout(&c).total;
    char err[L3_ERR_LEN], model[L3_PATH_LEN], state[L3_PATH_LEN], path[L3_PATH_LEN];
    CheckpointState rd;
    const char* dir = tmp_path("ckpt");
    checkpoint_resolve(dir, model, state, err);
    long long size = file_size_of(state);
    FILE* f = fopen(state, "rb");
    unsigned char* bytes = malloc(size);
    CHECK(f && fread(bytes, 1, size, f) == (size_t)size, "read the state file back");
    fclose(f);
    snprintf(path, sizeof(path), "%s/cut_state.bin", tmpdir);
    write_file(path, bytes, size - 4, NULL, 0);
    expect_error(state_header_read(path, n, &rd, err), err, "state file cut by 4 bytes", "truncated", "cut_state.bin");
    write_file(path, bytes, 100, NULL, 0);
    expect_error(state_header_read(path, n, &rd, err), err, "state file shorter than its header",
                 "not a checkpoint state file (100 bytes, shorter than the 256-byte header)", NULL);
    bytes[0] ^= 1;
    write_file(path, bytes, size, NULL, 0);
    expect_error(state_header_read(path, n, &rd, err), err, "state file with a bad magic", "bad magic", NULL);
    free(bytes);
    snprintf(path, sizeof(path), "%s/latest", dir);
    write_file(path, "step_00000011\n", 14, NULL, 0);
    expect_error(checkpoint_resolve(dir, model, state, err), err, "latest naming a missing checkpoint",
                 "incomplete checkpoint", NULL);
    write_file(path, "../../etc\n", 10, NULL, 0);
    expect_error(checkpoint_resolve(dir, model, state, err), err, "latest naming no checkpoint", "does not name", NULL);
    expect_error(checkpoint_resolve(tmp_path("no_such"), model, state, err), err, "--resume of a missing path",
                 "no such file", NULL);
    write_file(path, "step_00000010\n", 14, NULL, 0);
}

// Checkpoints of zeros of the small model, one rank, for the tests of which folders a run takes.
typedef struct {
    Llama3Config c;
    size_t n;
    float* zeros; // n floats: the weights, m and v of every checkpoint
    uint32_t toks[300];
    TokenData d;
    TokenSource s;
    DataLoader l;
    TrainArgs a;
} ZeroCheckpoints;
static void zero_checkpoints_init(ZeroCheckpoints* z) {
    char err[L3_ERR_LEN];
    memset(z->toks, 0, sizeof(z->toks));
    z->c = small_config(), z->n = param_layout(&z->c).total, z->zeros = calloc(z->n, 4);
    z->d = (TokenData){z->toks, 300}, z->a = ckpt_args();
    memory_loader(&z->l, &z->s, &z->d, 2, 8, 1, 0, 0, 1, 1, "t", err);
}
static void zero_checkpoints_free(ZeroCheckpoints* z) { free(z->zeros), memory_loader_free(&z->l, &z->s); }
static CheckpointState zero_checkpoint_state(const ZeroCheckpoints* z, int step) {
    return checkpoint_state_make(&z->a, step, z->n, z->n, &z->l);
}

// A save killed after its state.bin was renamed and before latest was: the folder is complete, and
// --resume DIR takes it (the newest complete one), not latest's older one; a folder with only its
// model.bin is passed over; a folder of complete checkpoints without latest resumes too.
static void test_checkpoint_killed_before_latest(void) {
    ZeroCheckpoints z;
    zero_checkpoints_init(&z);
    char err[L3_ERR_LEN], folder[L3_PATH_LEN], model[L3_PATH_LEN], state[L3_PATH_LEN], latest[L3_PATH_LEN];
    const char* dir = tmp_path("killed");
    make_dir(dir, err);
    CheckpointState st = zero_checkpoint_state(&z, 10);
    int rc = checkpoint_write(dir, &z.c, &st, z.zeros, z.zeros, z.zeros, err);
    st.step = 11; // the killed save: model.bin and state.bin, latest still "step_00000010"
    rc |= checkpoint_write_model(dir, &z.c, 11, z.zeros, err) || checkpoint_paths(dir, 11, folder, model, state, err) ||
          state_file_write(state, &st, z.zeros, z.zeros, err);
    rc |= checkpoint_write_model(dir, &z.c, 12, z.zeros, err); // a save killed before its state.bin
    rc |= checkpoint_resolve(dir, model, state, err);
    CHECK(rc == 0 && strstr(state, "step_00000011/state.bin"),
          "--resume DIR takes step 11, complete but not yet named by latest (%s)", rc ? err : state);
    rc = checkpoint_dir_check(dir, 11, err);
    CHECK(rc == 0, "and a run resumed from it may write into DIR (%s)", rc ? err : "ok");
    snprintf(latest, sizeof(latest), "%s/latest", dir);
    unlink(latest);
    rc = checkpoint_resolve(dir, model, state, err);
    CHECK(rc == 0 && strstr(state, "step_00000011/state.bin"), "without latest, DIR's newest complete step (%s)",
          rc ? err : state);
    zero_checkpoints_free(&z);
}

// --checkpoint_keep: after each save the newest K complete checkpoints stay; incomplete folders
// older than the newest go; nothing newer than the save is touched.
static void test_checkpoint_prune(void) {
    ZeroCheckpoints z;
    zero_checkpoints_init(&z);
    char err[L3_ERR_LEN], folder[L3_PATH_LEN], model[L3_PATH_LEN], state[L3_PATH_LEN];
    const char* dir = tmp_path("prune");
    make_dir(dir, err);
    int steps[] = {5, 10, 15, 20, 30}, rc = 0;
    for (int i = 0; i < 5; i++) {
        CheckpointState st = zero_checkpoint_state(&z, steps[i]);
        rc |= checkpoint_write(dir, &z.c, &st, z.zeros, z.zeros, z.zeros, err);
        if (steps[i] <= 10) rc |= checkpoint_write_hf(dir, steps[i], &z.c, z.zeros, true, NULL, err); // (an hf/ in it)
    }
    checkpoint_paths(dir, 12, folder, model, state, err);
    make_dir(folder, err);
    write_file(model, "partial", 7, NULL, 0); // a save killed before its state.bin
    rc |= checkpoint_prune(dir, 20, 2, err);
    int list[16], k = checkpoint_list(dir, list, 16);
    CHECK(rc == 0 && k == 3 && list[0] == 15 && list[1] == 20 && list[2] == 30,
          "keep 2 after saving step 20: step 15, 20 kept, 30 (newer) untouched, 5, 10 (with hf/ folders) and the "
          "partial 12 gone (%d left%s%s)", k, rc ? ": " : "", rc ? err : "");
    zero_checkpoints_free(&z);
}

// The lr schedule (llama3.h lr_at, which the device evaluates too): warmup from lr/N, each shape's
// value at its ends and middle, wsd's stable part, and never 0 or above the peak.
static void test_lr_schedule(void) {
    LrSchedule s = {LR_COSINE, 10, 110, 1e-3f, 0.1f, 0.2f};
    CHECK(fabsf(lr_at(s, 1) - 1e-4f) < 1e-10f && lr_at(s, 10) == 1e-3f, "warmup: lr/10 at step 1, lr at step 10 (%g, %g)",
          lr_at(s, 1), lr_at(s, 10));
    CHECK(fabsf(lr_at(s, 60) - 5.5e-4f) < 1e-9f, "cosine: halfway between lr and lr*0.1 at the middle (%g)", lr_at(s, 60));
    CHECK(fabsf(lr_at(s, 110) - 1e-4f) < 1e-10f, "cosine: lr*final_lr_frac at the last step (%g)", lr_at(s, 110));
    CHECK(lr_at(s, 11) < 1e-3f && lr_at(s, 11) > 0.999e-3f, "cosine: just below the peak after the warmup (%g)",
          lr_at(s, 11));
    s.kind = LR_LINEAR;
    CHECK(fabsf(lr_at(s, 35) - (1e-3f - 0.25f * 0.9e-3f)) < 1e-9f, "linear: a quarter of the way down at step 35 (%g)",
          lr_at(s, 35));
    s.kind = LR_WSD, s.warmup = 0;
    CHECK(lr_at(s, 88) == 1e-3f && lr_at(s, 99) < 1e-3f, "wsd: stable to step 88 (%g), decaying over the last 22 (%g)",
          lr_at(s, 88), lr_at(s, 99));
    CHECK(fabsf(lr_at(s, 110) - 1e-4f) < 1e-10f, "wsd: lr*final_lr_frac at the last step (%g)", lr_at(s, 110));
    s.decay_frac = 0.0f;
    CHECK(lr_at(s, 110) == 1e-3f, "wsd with decay_frac 0: no decay (%g)", lr_at(s, 110));
    s.kind = LR_CONSTANT, s.warmup = 4;
    CHECK(lr_at(s, 2) == 5e-4f && lr_at(s, 110) == 1e-3f, "constant with warmup (%g, %g)", lr_at(s, 2), lr_at(s, 110));
    int bad = 0;
    for (int kind = LR_CONSTANT; kind <= LR_WSD; kind++)
        for (int t = 1; t <= 110; t++) {
            LrSchedule k = {kind, 7, 110, 3e-4f, 0.0f, 0.5f};
            bad += !(lr_at(k, t) > 0.0f || (t == 110 && kind != LR_CONSTANT)) || lr_at(k, t) > 3e-4f;
        }
    CHECK(bad == 0, "every schedule stays in (0, lr], reaching 0 only at the last step with final_lr_frac 0 (%d bad)",
          bad);
    TrainArgs a = train_args_default();
    Llama3Config c = llama3_2_1b_config();
    char err[L3_ERR_LEN];
    a.eval.sample_every = 10, a.eval.sample_tokens = 64;
    expect_error(train_args_check(&a, &c, err), err, "a sample longer than a sequence", "--sample_tokens 64", "63");
    a.eval.sample_tokens = 8, a.eval.top_k = 200000;
    expect_error(train_args_check(&a, &c, err), err, "top_k past the vocabulary", "--top_k 200000", NULL);
}

// The flag table drives parsing, defaults, usage and the printed configuration: every row is in the
// usage and the printout, its default typed back on a command line gives the same arguments (but a
// default of -1, "not given", which no typed value means: --deferred_adamw, --bos_id), and a numeric
// flag takes its bounds and refuses beyond them.
static void test_flag_table(void) {
    char err[L3_ERR_LEN], value[256], line[512];
    TrainArgs d = train_args_default(), a;
    FILE* f = tmpfile();
    print_usage(f, "prog");
    train_args_print(f, &d);
    char* text = printed_text(f);
    int missing = 0, round_trip_bad = 0, bounds_bad = 0;
    for (int i = 0; i < NUM_FLAGS; i++) {
        const FlagSpec* g = &FLAGS[i];
        missing += !strstr(text, g->name) || (g->kind != FLAG_ONLY && !strstr(text, g->name + 2));
        if (g->kind == FLAG_PATH || g->kind == FLAG_ONLY || (g->def && !strcmp(g->def, "-1"))) continue;
        flag_format(&d, g, value, sizeof(value));
        snprintf(line, sizeof(line), "%s=%s", g->name, value);
        char* argv[] = {(char*)"prog", line};
        round_trip_bad += train_args_parse(&a, 2, argv, 1, err) != 0 || memcmp(&a, &d, sizeof(a)) != 0;
        if (g->kind != FLAG_INT && g->kind != FLAG_FLOAT) continue;
        snprintf(line, sizeof(line), "%s=%.10g", g->name, g->hi);
        bounds_bad += train_args_parse(&a, 2, argv, 1, err) != 0;
        snprintf(line, sizeof(line), "%s=%.10g", g->name, g->lo - (g->kind == FLAG_INT ? 1.0 : 1e-3 + fabs(g->lo)));
        bounds_bad += train_args_parse(&a, 2, argv, 1, err) == 0 || !strstr(err, g->name);
    }
    CHECK(text[0] && missing == 0, "every one of the %d flags in the usage text and the printed configuration",
          NUM_FLAGS);
    CHECK(round_trip_bad == 0, "each default, typed back as --flag=value, gives the default arguments (%d differ)",
          round_trip_bad);
    CHECK(bounds_bad == 0, "each numeric flag takes its bounds and refuses below them, naming itself (%d wrong)",
          bounds_bad);
    free(text);
}

// --list_switches: every switch row's ablation values, each "--flag value" on its own line in the
// table's order and nothing else, each a value the flag parses into, other than its default.
static void test_list_switches(void) {
    char err[L3_ERR_LEN], expected[4096] = "", line[256];
    TrainArgs d = train_args_default(), a;
    int rows = 0, values = 0, bad = 0, empty = 0;
    for (int i = 0; i < NUM_FLAGS; i++) {
        const FlagSpec* g = &FLAGS[i];
        if (!g->scope) continue;
        rows++;
        int before = values;
        char list[64];
        snprintf(list, sizeof(list), "%s", g->ablation_values);
        for (char* v = strtok(list, " "); v; v = strtok(NULL, " "), values++) {
            snprintf(line, sizeof(line), "%s %s\n", g->name, v);
            strncat(expected, line, sizeof(expected) - strlen(expected) - 1);
            char* argv[] = {(char*)"prog", (char*)g->name, v};
            bad += train_args_parse(&a, 3, argv, 1, err) != 0 || switch_value(&a.sw, g) == switch_value(&d.sw, g);
        }
        empty += values == before;
    }
    FILE* f = tmpfile();
    print_switches(f);
    char* text = printed_text(f);
    CHECK(rows == (int)(sizeof(Switches) / sizeof(int)) && empty == 0,
          "every one of the %d switch rows has ablation values (%d without)", rows, empty);
    CHECK(!strcmp(text, expected), "print_switches: the %d settings of the %d switches, one per line, nothing else%s%s",
          values, rows, strcmp(text, expected) ? ":\n" : "", strcmp(text, expected) ? text : "");
    CHECK(bad == 0, "each setting parses into a value other than its switch's default (%d do not)", bad);
    int rc = parse(&a, err, "--batch_size 8 --list_switches --bogus");
    CHECK(rc == 0 && a.list_switches && !a.help, "--list_switches stops the parse and asks for the list (%s)",
          rc ? err : "ok");
    free(text);
}

// The step plan of a command line on a model of n_layer layers, and its timings as one letter per
// update group (wte, the layers, the head): O overlapped, D deferred, A after the backward, S sharded.
static StepPlan plan_of(const char* flags, int n_layer, int world, char* letters) {
    TrainArgs a;
    char err[L3_ERR_LEN];
    if (parse(&a, err, flags)) printf("FAIL %s: %s\n", flags, err), n_failed++;
    StepPlan p = step_plan(&a.sw, &a.optim, n_layer, world);
    for (int g = 0; g < p.n_groups; g++) letters[g] = "ODAS"[p.timing[g]];
    letters[p.n_groups] = '\0';
    return p;
}

// step_plan against the rules in its comment, on the 1B (16 layers, 18 groups) and a 2-layer model:
// `want` the timings, then measure_norm and use_graph; after_backward and any_deferred must follow
// from the timings.
static void test_step_plan(void) {
    const struct {
        const char* flags;
        int n_layer;
        const char* want;
        bool norm, graph;
        int world;
        StepCounter counter; // who counts the step: the loss guard, after the ranks agree, the norm's guard
    } cases[] = {
        {"", 16, "ODDDDDDDDDDDDOOOOO", false, true, 1, COUNTED_BY_LOSS_GUARD},                       // layers 0..11 deferred
        {"--grad_clip 1", 16, "DDDDDDDDDDDDDDDDDD", true, true, 1, COUNTED_BY_NORM},           // clipping defers every group
        {"--grad_clip 1 --deferred_adamw 0", 16, "DDDDDDDDDDDDDDDDDD", true, true, 1, COUNTED_BY_NORM},
        {"--overlap_optimizer 0", 16, "AAAAAAAAAAAAAAAAAA", false, true, 1, COUNTED_BY_LOSS_GUARD},
        {"--grad_clip 1 --overlap_optimizer 0", 16, "AAAAAAAAAAAAAAAAAA", true, true, 1, COUNTED_BY_NORM},
        {"--grad_clip 1 --grad_zeroing memset", 16, "AAAAAAAAAAAAAAAAAA", true, true, 1, COUNTED_BY_NORM}, // cannot defer
        {"--grad_zeroing fill", 16, "OOOOOOOOOOOOOOOOOO", false, true, 1, COUNTED_BY_LOSS_GUARD},
        {"--deferred_adamw 0", 16, "OOOOOOOOOOOOOOOOOO", false, true, 1, COUNTED_BY_LOSS_GUARD},
        {"--deferred_adamw 1", 16, "ODOOOOOOOOOOOOOOOO", false, true, 1, COUNTED_BY_LOSS_GUARD},
        {"--deferred_adamw 16", 16, "ODDDDDDDDDDDDDDDDO", false, true, 1, COUNTED_BY_LOSS_GUARD},
        {"--metadata_by_value 0", 16, "ODDDDDDDDDDDDOOOOO", false, false, 1, COUNTED_BY_LOSS_GUARD}, // no graph with the copies
        {"--cuda_graph 0", 16, "ODDDDDDDDDDDDOOOOO", false, false, 1, COUNTED_BY_LOSS_GUARD},
        {"", 2, "ODDO", false, true, 1, COUNTED_BY_LOSS_GUARD},                                      // 12 capped at the 2 layers
        {"--grad_clip 1", 2, "DDDD", true, true, 1, COUNTED_BY_NORM},
        {"", 16, "SSSSSSSSSSSSSSSSSS", false, true, 2, COUNTED_AFTER_RANKS},              // several ranks: every group by shards
        {"--grad_clip 1 --deferred_adamw 4", 2, "SSSS", true, true, 8, COUNTED_BY_NORM},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char got[LLAMA3_MAX_LAYERS + 3];
        int world = cases[i].world;
        StepPlan p = plan_of(cases[i].flags, cases[i].n_layer, world, got);
        bool all_after = strspn(got, "A") == strlen(got), deferred = strchr(got, 'D') != NULL;
        CHECK(p.n_groups == cases[i].n_layer + 2 && !strcmp(got, cases[i].want) && p.measure_norm == cases[i].norm &&
                  p.use_graph == cases[i].graph && p.after_backward == all_after && p.any_deferred == deferred &&
                  p.world == world && p.counted_by == cases[i].counter,
              "step plan, %d layers, %d rank%s, '%s': %s (%s), norm %d, graph %d, after_backward %d, any_deferred %d, "
              "counted by %d", cases[i].n_layer, world, world > 1 ? "s" : "", cases[i].flags, got, cases[i].want,
              p.measure_norm, p.use_graph, p.after_backward, p.any_deferred, (int)p.counted_by);
    }
    const struct { const char* flags; const char* want; } lines[] = {
        {"", "step plan: AdamW overlapped with the backward: wte, layer 12..head | deferred to the next step: layer "
             "0..layer 11 | gradient norm not measured | steps 2.. from one CUDA graph\n"},
        {"--grad_clip 1 --grad_zeroing memset --cuda_graph 0", "step plan: AdamW after the backward: wte..head | "
             "gradient norm measured (clipping) | every step launched from the host\n"},
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        char letters[LLAMA3_MAX_LAYERS + 3];
        StepPlan p = plan_of(lines[i].flags, 16, 1, letters);
        FILE* f = tmpfile();
        step_plan_print(f, &p);
        char* text = printed_text(f);
        CHECK(!strcmp(text, lines[i].want), "step_plan_print of the 1B plan '%s': %.*s", lines[i].flags,
              (int)strcspn(text, "\n"), text);
        free(text);
    }
}

// The launcher's rank variables (rank_env_read), from a fake environment.
static const char* const* fake_env;
static const char* fake_getenv(const char* name) {
    for (const char* const* e = fake_env; *e; e += 2)
        if (!strcmp(e[0], name)) return e[1];
    return NULL;
}

// Launch environments: taken (world > 0: the rank, world size, local rank and the launcher's line
// read) or refused (world 0: one line naming the variables). The refused ones join the hostile corpus
// (launcher_corpus) for ./train_llama3.
typedef struct {
    const char* label;
    const char* env[13]; // name, value, ..., NULL
    int rank, world, local;
    const char* said; // taken: RankEnv.from; refused: in the message
} LauncherCase;
static const LauncherCase LAUNCHER_CASES[] = {
    {"none", {"HOME", "/root"}, 0, 1, 0, ""},
    {"empty_values_unset", {"RANK", "", "WORLD_SIZE", ""}, 0, 1, 0, ""},
    {"torchrun_one", {"RANK", "0", "WORLD_SIZE", "1", "LOCAL_RANK", "0"}, 0, 1, 0,
     "torchrun: RANK=0 WORLD_SIZE=1 LOCAL_RANK=0"},
    {"world_one_alone", {"WORLD_SIZE", "1"}, 0, 1, 0, "torchrun: WORLD_SIZE=1"},
    {"torchrun", {"RANK", "3", "WORLD_SIZE", "4", "LOCAL_RANK", "1"}, 3, 4, 1,
     "torchrun: RANK=3 WORLD_SIZE=4 LOCAL_RANK=1"},
    {"mpirun", {"OMPI_COMM_WORLD_RANK", "2", "OMPI_COMM_WORLD_SIZE", "4", "OMPI_COMM_WORLD_LOCAL_RANK", "0"}, 2, 4, 0,
     "Open MPI: OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=0"},
    {"pmi_no_local", {"PMI_RANK", "1", "PMI_SIZE", "2"}, 1, 2, 1, "PMI: PMI_RANK=1 PMI_SIZE=2"},
    {"srun", {"SLURM_PROCID", "5", "SLURM_STEP_NUM_TASKS", "16", "SLURM_LOCALID", "1", "SLURM_NTASKS", "32"}, 5, 16, 1,
     "Slurm: SLURM_PROCID=5 SLURM_STEP_NUM_TASKS=16 SLURM_LOCALID=1"},
    {"slurm_job_count", {"SLURM_PROCID", "1", "SLURM_NTASKS", "2"}, 1, 2, 1, "Slurm: SLURM_PROCID=1 SLURM_NTASKS=2"},
    {"sbatch_one_task", {"SLURM_PROCID", "0", "SLURM_LOCALID", "0"}, 0, 1, 0, "Slurm: SLURM_PROCID=0 SLURM_LOCALID=0"},
    {"salloc_shell", {"SLURM_NTASKS", "8", "SLURM_JOB_ID", "7"}, 0, 1, 0, ""},
    {"torchrun_in_srun", {"RANK", "3", "WORLD_SIZE", "8", "LOCAL_RANK", "3", "SLURM_PROCID", "0",
                          "SLURM_STEP_NUM_TASKS", "1", "SLURM_LOCALID", "0"}, 3, 8, 3, "torchrun: RANK=3 WORLD_SIZE=8 LOCAL_RANK=3"},
    {"mpirun_in_sbatch", {"OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2", "SLURM_PROCID", "0",
                          "SLURM_NTASKS", "16"}, 1, 2, 1, "Open MPI: OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2"},
    {"rank_alone", {"RANK", "1"}, 0, 0, 0, "RANK=1 without WORLD_SIZE: torchrun's variables are partial"},
    {"rank0_alone", {"RANK", "0"}, 0, 0, 0, "RANK=0 without WORLD_SIZE"},
    {"world_alone", {"WORLD_SIZE", "2"}, 0, 0, 0, "WORLD_SIZE=2 without RANK"},
    {"world_zero", {"RANK", "0", "WORLD_SIZE", "0"}, 0, 0, 0, "WORLD_SIZE=0: not a number of ranks"},
    {"world_abc", {"RANK", "0", "WORLD_SIZE", "abc"}, 0, 0, 0, "WORLD_SIZE=abc: not a number of ranks"},
    {"rank_past_world", {"WORLD_SIZE", "2", "RANK", "3"}, 0, 0, 0, "RANK=3 with WORLD_SIZE=2: a rank is a whole number of 0..1"},
    {"rank_is_world", {"RANK", "2", "WORLD_SIZE", "2"}, 0, 0, 0, "RANK=2 with WORLD_SIZE=2"},
    {"rank_negative", {"RANK", "-1", "WORLD_SIZE", "2"}, 0, 0, 0, "RANK=-1 with WORLD_SIZE=2"},
    {"local_past_world", {"RANK", "0", "WORLD_SIZE", "2", "LOCAL_RANK", "2"}, 0, 0, 0, "LOCAL_RANK=2 with WORLD_SIZE=2"},
    {"local_abc", {"RANK", "0", "WORLD_SIZE", "2", "LOCAL_RANK", "x"}, 0, 0, 0, "LOCAL_RANK=x with WORLD_SIZE=2"},
    {"ompi_rank_alone", {"OMPI_COMM_WORLD_RANK", "1"}, 0, 0, 0, "OMPI_COMM_WORLD_RANK=1 without OMPI_COMM_WORLD_SIZE"},
    {"pmi_size_alone", {"PMI_SIZE", "3"}, 0, 0, 0, "PMI_SIZE=3 without PMI_RANK"},
    {"slurm_task_without_count", {"SLURM_PROCID", "1"}, 0, 0, 0,
     "SLURM_PROCID=1 without SLURM_STEP_NUM_TASKS or SLURM_NTASKS"},
    {"slurm_task_past_count", {"SLURM_PROCID", "2", "SLURM_NTASKS", "2"}, 0, 0, 0, "SLURM_PROCID=2 with SLURM_NTASKS=2"},
    {"rank_alone_under_srun", {"RANK", "1", "SLURM_PROCID", "0", "SLURM_STEP_NUM_TASKS", "1"}, 0, 0, 0,
     "RANK=1 without WORLD_SIZE"},
};
#define N_LAUNCHER_CASES ((int)(sizeof(LAUNCHER_CASES) / sizeof(LAUNCHER_CASES[0])))

static void test_rank_env(void) {
    char err[L3_ERR_LEN];
    for (int i = 0; i < N_LAUNCHER_CASES; i++) {
        const LauncherCase* k = &LAUNCHER_CASES[i];
        RankEnv r;
        fake_env = k->env;
        err[0] = 0;
        int rc = rank_env_read(fake_getenv, &r, err);
        if (k->world)
            CHECK(rc == 0 && r.rank == k->rank && r.world == k->world && r.local_rank == k->local &&
                      !strcmp(r.from, k->said),
                  "launch %s: rank %d of %d, local %d, from \"%s\"%s%s", k->label, r.rank, r.world, r.local_rank,
                  r.from, rc ? ": " : "", rc ? err : "");
        else
            CHECK(rc != 0 && one_line(err, k->said) && r.world == 1,
                  "launch %s refused in one line naming its variables -> \"%s\"", k->label, rc ? err : "(taken)");
    }
    RankEnv r;
    fake_env = LAUNCHER_CASES[4].env; // torchrun's rank 3 of 4
    rank_env_read(fake_getenv, &r, err);
    CHECK(rank_env_check(&r, 8, err) == 0, "rank 3 of 4 taken by a trainer with NCCL");
    expect_error(rank_env_check(&r, 1, err), err, "four ranks refused without NCCL",
                 "rank 3 of 4 ranks (torchrun: RANK=3 WORLD_SIZE=4 LOCAL_RANK=1)", "built without NCCL");
    FILE* f = tmpfile();
    rank_env_print(f, &r);
    fake_env = LAUNCHER_CASES[0].env;
    rank_env_read(fake_getenv, &r, err);
    rank_env_print(f, &r);
    char* text = printed_text(f);
    CHECK(!strcmp(text, "rank 3 of 4 (from torchrun: RANK=3 WORLD_SIZE=4 LOCAL_RANK=1)\n"
                        "rank 0 of 1 (no launcher's variables: one process)\n"),
          "the start's rank line: %s", text);
    free(text);
    // the GPU of each local rank
    RankEnv local = {5, 8, 1, "torchrun"};
    int device = -1;
    CHECK(rank_device(&local, 2, 0, &device, err) == 0 && device == 1, "local rank 1 of a 2-GPU node takes GPU 1");
    local.local_rank = 2;
    expect_error(rank_device(&local, 2, 0, &device, err), err, "local rank 2 on 2 GPUs", "this machine has 2 GPUs",
                 "NCCL_MULTI_RANK_GPU_ENABLE=1");
    local.local_rank = 1;
    CHECK(rank_device(&local, 1, 1, &device, err) == 0 && device == 0, "two ranks on one GPU when NCCL allows it");
}

// The refused launch environments, for ./train_llama3 (run_tests.sh): corpus_dir/env_LABEL, one
// NAME=VALUE per line, and corpus_dir/env_unset, "-u NAME" of every launcher variable (so that the
// caller's own, under a scheduler, do not mix in).
static void launcher_corpus(void) {
    char path[512];
    for (int i = 0; i < N_LAUNCHER_CASES; i++) {
        if (LAUNCHER_CASES[i].world) continue;
        snprintf(path, sizeof(path), "%s/env_%s", corpus_dir, LAUNCHER_CASES[i].label);
        FILE* f = fopen(path, "w");
        for (const char* const* e = LAUNCHER_CASES[i].env; f && *e; e += 2) fprintf(f, "%s=%s\n", e[0], e[1]);
        if (f) fclose(f);
    }
    snprintf(path, sizeof(path), "%s/env_unset", corpus_dir);
    FILE* f = fopen(path, "w");
    for (int i = 0; f && i < NUM_LAUNCHERS; i++) {
        const Launcher* l = &LAUNCHERS[i];
        const char* names[] = {l->size[0], l->size[1], l->rank, l->local};
        for (int j = 0; j < 4; j++)
            if (names[j]) fprintf(f, "-u %s\n", names[j]);
    }
    if (f) fclose(f);
}

// Parameters of [0, total) that the runs [param, param + n) do not cover exactly once: the gaps, and
// what overlaps an earlier run (sorts the runs by their start). Counted from the runs, not per
// parameter: the 1B's 1.5 G parameters would take a byte each and seconds under ASan.
static int run_start_cmp(const void* a, const void* b) {
    size_t x = ((const ShardRun*)a)->param, y = ((const ShardRun*)b)->param;
    return (x > y) - (x < y);
}
static size_t runs_not_once(ShardRun* runs, size_t n, size_t total) {
    qsort(runs, n, sizeof(ShardRun), run_start_cmp);
    size_t covered = 0, wrong = 0; // [0, covered): the runs so far reach that far
    for (size_t i = 0; i < n; i++) {
        size_t end = runs[i].param + runs[i].n;
        if (runs[i].param > covered) wrong += runs[i].param - covered; // a gap before it
        else wrong += (end < covered ? end : covered) - runs[i].param;  // its overlap
        if (end > covered) covered = end;
    }
    return wrong + (total > covered ? total - covered : 0);
}

// ZeRO-1's shards: every tensor's layer slice at 1, 2, 3 and 8 ranks, of the 1B (untied and tied) and of an odd
// shape, covered exactly once by the ranks' parts and the shared tail, parts aligned.
static void test_shards(void) {
    Llama3Config odd = llama3_2_1b_config(); // 3 layers, C = 520, F = 96, vocab 1001: sizes that 8 ranks do not divide
    odd.vocab_size = 1001, odd.n_layer = 3, odd.n_head = 4, odd.n_kv_head = 2, odd.n_embd = 520, odd.ffn_hidden = 96;
    Llama3Config shapes[3] = {llama3_2_1b_config(), odd, llama3_2_1b_config()};
    shapes[2].tied_embeddings = 1; // [tied embeddings] an empty lm_head, a dense wte sharded
    int worlds[] = {1, 2, 3, 8};
    for (int c = 0; c < 3; c++) {
        ParamLayout p = param_layout(&shapes[c]);
        for (int w = 0; w < 4; w++) {
            int world = worlds[w];
            size_t slices = 0, n_runs = 0, state_bad = 0, align_bad = 0, tails = 0;
            for (int t = 0; t < NUM_PARAM_TENSORS; t++) slices += p.slices[t];
            ShardRun* runs = (ShardRun*)malloc(sizeof(ShardRun) * 2 * slices * world); // every part, and each tail once
            for (int rank = 0; rank < world; rank++) {
                ZeroLayout z = zero_layout(&p, rank, world, 0);
                size_t state_next = 0;
                for (int t = 0; t < NUM_PARAM_TENSORS; t++)
                    for (int l = 0; l < p.slices[t]; l++)
                        for (int which = 0; which < 2; which++) {
                            ShardRun r = zero_run(&z, &p, t, l, which);
                            state_bad += r.state != state_next; // the rank's runs are its state, in order
                            state_next += r.n;
                            align_bad += which == 0 && world > 1 && (r.n % SHARD_ALIGN || (r.param - p.offset[t]) % SHARD_ALIGN);
                            tails += which && r.n;
                            if (r.param + r.n > p.total) { // past the block: counted, not written
                                state_bad++;
                                continue;
                            }
                            if (which == 0 || rank == 0) runs[n_runs++] = r; // a tail once: every rank's is the same
                        }
                state_bad += state_next != z.state_total;
            }
            size_t wrong = runs_not_once(runs, n_runs, p.total);
            CHECK(wrong == 0 && state_bad == 0 && align_bad == 0,
                  "shards of %s at %d rank%s: each parameter in one part or the tail (%zu not), state runs in order (%zu "
                  "off), parts aligned to %d (%zu not); %zu tails", (const char*[]){"the 1B", "an odd shape", "the tied 1B"}[c], world,
                  world > 1 ? "s" : "", wrong, state_bad, SHARD_ALIGN, align_bad, tails);
            free(runs);
        }
    }
    ParamLayout p = param_layout(&odd);
    ZeroLayout one = zero_layout(&p, 0, 1, 0), three = zero_layout(&p, 1, 3, 0);
    CHECK(one.state_total == p.total && three.shard[P_FINAL_NORM].part == 168 && three.shard[P_FINAL_NORM].tail == 16,
          "one rank keeps every state; 520 norm weights at 3 ranks: parts of 168, a tail of 16 (%zu, %zu)",
          three.shard[P_FINAL_NORM].part, three.shard[P_FINAL_NORM].tail);
    ZeroLayout rep = zero_layout(&p, 1, 3, 1);
    ShardRun wte = zero_run(&rep, &p, P_WTE, 0, 1);
    CHECK(rep.shard[P_WTE].part == 0 && wte.param == 0 && wte.n == p.size[P_WTE] && wte.state == 0,
          "the sparse embedding's state is every rank's whole table (its rows are updated by every rank)");
    ParamLayout big = param_layout(&shapes[0]);
    ZeroLayout z8 = zero_layout(&big, 0, 8, 1);
    size_t expect = big.size[P_WTE] + (big.total - big.size[P_WTE]) / 8;
    CHECK(z8.state_total == expect, "1B at 8 ranks: each keeps 1/8 of the state beside the embedding's (%zu = %zu)",
          z8.state_total, expect);
}

// Shards: a glob and a comma list open their files in order, each header checked (a missing or
// truncated shard, the other token format, a glob of nothing: one line naming it); an epoch reads
// every step of every shard once, shuffled: the same order for the same seed, another per epoch and
// per seed; a shard smaller than a step is skipped; a loader sought to a saved position reads what
// the saving loader read next.
static void test_token_shards(void) {
    char err[L3_ERR_LEN];
    uint32_t toks[3][101];
    const char* names[3] = {"shard_a_000.bin", "shard_a_001.bin", "shard_a_002.bin"};
    int counts[3] = {101, 60, 15}; // steps of 20 tokens (and the last target): 5, 2 (60 = 3 * 20 lacks it), none
    for (int f = 0; f < 3; f++) {
        for (int i = 0; i < counts[f]; i++) toks[f][i] = (uint32_t)(f * 1000 + i);
        write_tokens(names[f], TOKENS_MAGIC_LLAMA3, 7, counts[f], toks[f], counts[f] * 4);
    }
    TokenSource s, list;
    int rc = token_source_open(&s, tmp_path("shard_a_*.bin"), "--input_bin", 5000, err);
    char spec[3 * L3_PATH_LEN];
    snprintf(spec, sizeof(spec), "%s,%s,%s", tmp_path(names[0]), tmp_path("shard_a_00[12].bin"), tmp_path(names[0]));
    rc |= token_source_open(&list, spec, "--input_bin", 5000, err);
    CHECK(rc == 0 && s.n == 3 && s.total == 176 && strstr(s.paths[2], "shard_a_002") && list.n == 4 &&
              list.total == 277 && s.hash != list.hash,
          "a glob opens its 3 shards in name order, a list of a file, a glob and the file again 4 (%s)", rc ? err : "ok");
    token_source_free(&list);
    expect_error(token_source_open(&list, tmp_path("shard_z_*.bin"), "--input_bin", 5000, err), err,
                 "a glob of nothing", "--input_bin", "no file matches");
    token_source_free(&list);
    snprintf(spec, sizeof(spec), "%s,%s", tmp_path(names[0]), tmp_path("shard_missing.bin"));
    expect_error(token_source_open(&list, spec, "--input_bin", 5000, err), err, "a list with a missing shard",
                 "shard_missing.bin: cannot open token file", NULL);
    token_source_free(&list);
    uint16_t t16[30] = {0};
    write_tokens("shard_b_000.bin", TOKENS_MAGIC_LLAMA3, 7, 30, toks[0], 30 * 4);
    write_tokens("shard_b_001.bin", TOKENS_MAGIC_GPT2, 1, 30, t16, sizeof(t16));
    expect_error(token_source_open(&list, tmp_path("shard_b_*.bin"), "--input_bin", 5000, err), err,
                 "GPT-2 tokens among LLaMA-3 shards", "shard_b_001.bin: GPT-2 (uint16) tokens", "one token format");
    token_source_free(&list);
    write_tokens("shard_c_000.bin", TOKENS_MAGIC_LLAMA3, 7, 30, toks[0], 29 * 4);
    expect_error(token_source_open(&list, tmp_path("shard_c_*.bin"), "--input_bin", 5000, err), err,
                 "a truncated shard", "shard_c_000.bin: truncated", NULL);
    token_source_free(&list);
    snprintf(spec, sizeof(spec), "%s,", tmp_path(names[0]));
    expect_error(token_source_open(&list, spec, "--input_bin", 5000, err), err, "a list ending in a comma",
                 "an empty item", NULL);
    token_source_free(&list);

    // Two micro-steps of B*T = 10: steps of 20 tokens; shards of 5, 2 and 0 steps.
    LoaderConfig c = {2, 5, 2, 0, 1, 0, 1, 42};
    DataLoader l, again;
    rc = loader_init(&l, &s, &c, err);
    int32_t x[10], y[10];
    int seen[3][5] = {{0}}, epoch_ok = 1, order[2][7], orders_differ = 0;
    for (int epoch = 0; epoch < 2; epoch++) {
        for (int step = 0; step < 7; step++) { // 5 + 2 steps an epoch
            next_batch(&l, x, y);
            int f = x[0] / 1000, at = x[0] % 1000;
            epoch_ok &= l.at.epoch == (uint64_t)epoch && at % 20 == 0 && y[9] == x[9] + 1;
            if (epoch == 0 && f < 3 && at / 20 < 5) seen[f][at / 20]++;
            order[epoch][step] = x[0];
            next_batch(&l, x, y);
            epoch_ok &= x[0] % 1000 == at + 10; // the step's second micro-batch follows the first
        }
    }
    int once = 1;
    for (int g = 0; g < 5; g++) once &= seen[0][g] == 1 && seen[1][g] == (g < 2);
    orders_differ = memcmp(order[0], order[1], sizeof(order[0])) != 0;
    CHECK(rc == 0 && epoch_ok && once && orders_differ,
          "--shuffle 1: each epoch reads the 5 + 2 steps of the shards once (the 15-token shard skipped), in another "
          "order the next epoch (%s)", rc ? err : "ok");
    CHECK(l.reads >= 5 && l.prefetched == l.reads - 1, "[prefetch] every shard read but the first was read ahead, "
          "into the next epoch's order (%zu of %zu)", l.prefetched, l.reads);
    loader_free(&l);
    int same_seed = 1, other_seed = 0, in_order = 1;
    LoaderConfig c2 = c, c3 = c, c0 = c;
    c3.seed = 43, c0.shuffle = 0;
    DataLoader l2, l3, l0;
    rc = loader_init(&l, &s, &c, err) | loader_init(&l2, &s, &c2, err) | loader_init(&l3, &s, &c3, err) |
         loader_init(&l0, &s, &c0, err);
    for (int k = 0; k < 16; k++) {
        int32_t x2[10], x3[10], x0[10];
        next_batch(&l, x, y), next_batch(&l2, x2, y), next_batch(&l3, x3, y), next_batch(&l0, x0, y);
        same_seed &= !memcmp(x, x2, sizeof(x)), other_seed |= memcmp(x, x3, sizeof(x)) != 0;
        in_order &= x0[0] == (k < 10 ? k * 10 : k < 14 ? 1000 + (k - 10) * 10 : (k - 14) * 10);
    }
    CHECK(rc == 0 && same_seed && other_seed && in_order,
          "the same seed reads the same order, another seed another; --shuffle 0 reads shard by shard in order");
    // A loader sought to where another stood after 11 steps (epoch 1, mid-shard) reads what it reads next.
    loader_free(&l2), loader_free(&l3), loader_free(&l0);
    for (int k = 0; k < 2 * 11 - 16; k++) next_batch(&l, x, y);
    rc = loader_init(&again, &s, &c, err) || loader_seek(&again, l.at, err);
    int resumes = rc == 0;
    for (int k = 0; k < 20; k++) {
        int32_t x2[10], y2[10];
        next_batch(&l, x, y), next_batch(&again, x2, y2);
        resumes &= !memcmp(x, x2, sizeof(x)) && !memcmp(y, y2, sizeof(y));
    }
    CHECK(resumes, "a loader sought to a saved position (epoch 1, its fourth step) reads on as the saving "
          "one (%s)", rc ? err : "ok");
    LoaderPos past = {0, 0, 6};
    expect_error(loader_seek(&again, past, err), err, "a saved position past its shard", "is past its shard", NULL);
    loader_free(&l), loader_free(&again);
    token_source_free(&s);
}

// The val loss reads its batches in file order whatever --shuffle 1 and --seed say (a shuffled val set
// would change the val loss between runs of another seed): the val loader the trainer makes from the
// flags (loader_config) gives three shards' batches in turn, one B*T each though the training step
// takes 2 micro-steps; the training loader of the same flags reads another order (the seed is live).
static void test_val_loader_order(void) {
    char err[L3_ERR_LEN], name[32];
    const int counts[3] = {101, 61, 41}; // batches of B*T = 10 (and the last target): 10, 6 and 4
    uint32_t toks[3][101];
    for (int f = 0; f < 3; f++) {
        for (int i = 0; i < counts[f]; i++) toks[f][i] = (uint32_t)((f * 101 + i) * 7919 % 5000); // (all distinct)
        snprintf(name, sizeof(name), "val_order_%d.bin", f);
        write_tokens(name, TOKENS_MAGIC_LLAMA3, 7, counts[f], toks[f], counts[f] * 4);
    }
    TokenSource s;
    int rc = token_source_open(&s, tmp_path("val_order_*.bin"), "--val_bin", 5000, err);
    TrainArgs a = train_args_default();
    a.loop.batch_size = 2, a.loop.sequence_length = 5, a.loop.total_batch_size = 20, a.loop.shuffle = 1;
    for (a.loop.seed = 1; a.loop.seed <= 2; a.loop.seed++) {
        LoaderConfig vc = loader_config(&a, false), tc = loader_config(&a, true);
        DataLoader val, train;
        rc = rc || loader_init(&val, &s, &vc, err) || loader_init(&train, &s, &tc, err);
        int in_order = rc == 0 && loader_groups(&val) == 20, train_differs = 0;
        for (int f = 0; f < 3 && rc == 0; f++)
            for (int at = 0; at + 10 < counts[f]; at += 10) {
                int32_t x[10], y[10], tx[10], ty[10];
                next_batch(&val, x, y), next_batch(&train, tx, ty);
                for (int i = 0; i < 10; i++)
                    in_order &= x[i] == (int32_t)toks[f][at + i] && y[i] == (int32_t)toks[f][at + i + 1];
                train_differs |= memcmp(x, tx, sizeof(x)) != 0;
            }
        CHECK(in_order && train_differs, "--shuffle 1 --seed %llu: the val loader reads the 3 shards' 20 batches in "
              "file order, the training loader another order (%s)", (unsigned long long)a.loop.seed, rc ? err : "ok");
        if (rc == 0) loader_free(&val), loader_free(&train);
    }
    token_source_free(&s);
}

// An eval file: two examples of 3 endings read back; each row is the context then its ending,
// zeros after, its loss positions the ending's; the pick is the lowest mean loss (the first of
// equals); bad files (magic, a cut, a label out of range, an example longer than T + 1, a token
// past the vocab, counts that disagree) refused in one line naming the file.
static const char* write_eval(const char* name, int32_t magic, int n, int E, const int32_t* records,
                              const uint32_t* toks, int n_toks, int size_cut) {
    int32_t h[256] = {0};
    h[0] = magic, h[1] = 1, h[2] = n, h[3] = E, h[4] = n_toks;
    const char* path = tmp_path(name);
    size_t rec = (size_t)n * (E + 2) * 4, bytes = rec + (size_t)n_toks * 4;
    unsigned char* body = malloc(bytes);
    memcpy(body, records, rec), memcpy(body + rec, toks, (size_t)n_toks * 4);
    write_file(path, h, sizeof(h), body, bytes - size_cut);
    free(body);
    return path;
}
static void test_eval_file(void) {
    char err[L3_ERR_LEN];
    // example 0: context 3, endings 1, 2, 1 (label 1); example 1: context 2, endings 2, 2, 3 (label 2)
    int32_t rec[2][5] = {{1, 3, 1, 2, 1}, {2, 2, 2, 2, 3}};
    uint32_t toks[16];
    for (int i = 0; i < 16; i++) toks[i] = 100 + i;
    EvalSet e;
    const char* ok = write_eval("eval_ok.bin", EVAL_MAGIC, 2, 3, &rec[0][0], toks, 16, 0);
    int rc = eval_read(&e, ok, 1000, 4, err);
    int32_t x[4], y[4];
    int from = -1, to = -1, rows_ok = rc == 0;
    if (rc == 0) {
        eval_row(&e, 0, 1, 4, x, y, &from, &to); // 100 101 102 | 104 105: x 100 101 102 104
        rows_ok &= x[0] == 100 && x[2] == 102 && x[3] == 104 && y[2] == 104 && y[3] == 105 && from == 2 && to == 4;
        eval_row(&e, 1, 2, 4, x, y, &from, &to); // 107 108 | 113 114 115: x 107 108 113 114, y 108 113 114 115
        rows_ok &= x[0] == 107 && x[1] == 108 && x[2] == 113 && y[3] == 115 && from == 1 && to == 4;
        eval_row(&e, 1, 0, 4, x, y, &from, &to); // 107 108 | 109 110: the last target a zero
        rows_ok &= x[3] == 110 && y[2] == 110 && y[3] == 0 && from == 1 && to == 3;
    }
    CHECK(rows_ok && e.n == 2 && e.n_endings == 3 && eval_label(&e, 1) == 2,
          "eval file: 2 examples of 3 endings; each row the context then its ending, zeros after (%s)", rc ? err : "ok");
    if (rc == 0) eval_free(&e);
    double means[3] = {2.0, 1.5, 1.5};
    CHECK(eval_pick(means, 3) == 1, "eval: the lowest mean loss is the pick, the first of equals");
    expect_error(eval_read(&e, write_eval("eval_magic.bin", 7, 2, 3, &rec[0][0], toks, 16, 0), 1000, 4, err), err,
                 "eval file bad magic", "bad magic 7", "eval_magic.bin");
    expect_error(eval_read(&e, write_eval("eval_cut.bin", EVAL_MAGIC, 2, 3, &rec[0][0], toks, 16, 4), 1000, 4, err),
                 err, "eval file cut short", "truncated", "eval_cut.bin");
    expect_error(eval_read(&e, ok, 1000, 3, err), err, "an example longer than T + 1", "more than --sequence_length 3",
                 "eval_ok.bin");
    expect_error(eval_read(&e, ok, 110, 4, err), err, "an eval token past the vocab", "token id 110", "eval_ok.bin");
    rec[1][0] = 3;
    expect_error(eval_read(&e, write_eval("eval_label.bin", EVAL_MAGIC, 2, 3, &rec[0][0], toks, 16, 0), 1000, 4, err),
                 err, "an eval label out of range", "label 3", "eval_label.bin");
    rec[1][0] = 2, rec[1][4] = 2;
    expect_error(eval_read(&e, write_eval("eval_count.bin", EVAL_MAGIC, 2, 3, &rec[0][0], toks, 16, 0), 1000, 4, err),
                 err, "eval lengths that do not add up to the header's count", "the header says 16", NULL);
    // Random mutations of the valid file's header, records and tokens: each read either passes or is
    // refused in one line naming the file; never a crash or an out-of-bounds read (ASan, UBSan).
    rec[1][4] = 3;
    unsigned char* image = malloc(1024 + 40 + 64);
    FILE* f = fopen(ok, "rb");
    size_t size = f ? fread(image, 1, 1024 + 40 + 64, f) : 0;
    if (f) fclose(f);
    uint64_t rng = 12345;
    int rounds = 600, refused = 0, bad = 0;
    const char* mutated = tmp_path("eval_mutated.bin");
    for (int r = 0; r < rounds && size == 1128; r++) {
        unsigned char copy[1128];
        memcpy(copy, image, size);
        for (int k = 0; k < 1 + r % 3; k++) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t at = (rng >> 33) % 8 == 0 ? (rng >> 40) % 24 : 1024 + (rng >> 40) % (size - 1024);
            copy[at] ^= (unsigned char)(1u << ((rng >> 20) % 8)) | (unsigned char)((rng >> 50) % 2 ? 0x80 : 0);
        }
        write_file(mutated, copy, size, NULL, 0);
        if (eval_read(&e, mutated, 1000, 4, err) == 0) eval_free(&e);
        else refused++, bad += !one_line(err, mutated);
    }
    free(image);
    CHECK(size == 1128 && bad == 0, "eval files: %d random mutations, %d refused, all in one line naming the file "
          "(%d not)", rounds, refused, bad);
}

// The ranks' slices of each global batch: N ranks of A micro-steps read what one rank of N*A does.
static int cmp_i32(const void* a, const void* b) { return *(const int32_t*)a - *(const int32_t*)b; }
static void test_loader_ranks(void) {
    uint32_t toks[101];
    for (int i = 0; i < 101; i++) toks[i] = i;
    TokenData d = {toks, 101};
    char err[L3_ERR_LEN];
    TokenSource s1, s2, s3;
    DataLoader one, r0, r1;
    int rc = memory_loader(&one, &s1, &d, 2, 5, 2, 0, 0, 1, 0, "data", err) |
             memory_loader(&r0, &s2, &d, 2, 5, 1, 0, 0, 2, 0, "data", err) |
             memory_loader(&r1, &s3, &d, 2, 5, 1, 0, 1, 2, 0, "data", err);
    int same = rc == 0;
    for (int round = 0; round < 7; round++) { // 100 tokens: 5 rounds of 20, then a wrap
        int32_t x[10], y[10], x0[10], y0[10], x1[10], y1[10];
        next_batch(&r0, x0, y0), next_batch(&r1, x1, y1);
        next_batch(&one, x, y), same &= !memcmp(x, x0, sizeof(x)) && !memcmp(y, y0, sizeof(y));
        next_batch(&one, x, y), same &= !memcmp(x, x1, sizeof(x)) && !memcmp(y, y1, sizeof(y));
        same &= r0.at.group == one.at.group && r1.at.group == one.at.group && r0.at.epoch == one.at.epoch;
    }
    CHECK(same, "two ranks read the batches one rank reads, side by side, through the wrap");
    memory_loader_free(&one, &s1), memory_loader_free(&r0, &s2), memory_loader_free(&r1, &s3);
    // 2 ranks of 3 micro-steps against one rank of 6, B*T = 10, on 157 tokens: 2 steps of 60 fit, then
    // the epoch ends (36 tokens left unread) and step 3 starts from token 0, for both; in order and
    // shuffled (the same order of the two steps for both).
    uint32_t more[157];
    for (int i = 0; i < 157; i++) more[i] = i;
    TokenData e = {more, 157};
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        DataLoader six, ranks[2];
        TokenSource s6, sr[2];
        rc = memory_loader(&six, &s6, &e, 2, 5, 6, 0, 0, 1, shuffle, "data", err);
        for (int r = 0; r < 2; r++) rc |= memory_loader(&ranks[r], &sr[r], &e, 2, 5, 3, 0, r, 2, shuffle, "data", err);
        same = rc == 0;
        int starts_ok = 1, firsts[2][2] = {{0}};
        for (int step = 0; step < 8; step++) {
            int32_t x[10], y[10], from_one[6], from_ranks[6], n = 0;
            for (int k = 0; k < 6; k++) next_batch(&six, x, y), from_one[k] = x[0], same &= y[9] == x[9] + 1;
            for (int a = 0; a < 3; a++)
                for (int r = 0; r < 2; r++) next_batch(&ranks[r], x, y), from_ranks[n++] = x[0];
            qsort(from_one, 6, sizeof(int32_t), cmp_i32), qsort(from_ranks, 6, sizeof(int32_t), cmp_i32);
            same &= !memcmp(from_one, from_ranks, sizeof(from_one));
            starts_ok &= from_one[0] % 60 == 0 && from_one[0] <= 60 && from_one[5] == from_one[0] + 50;
            firsts[step / 2 % 2][step % 2] = from_one[0]; // (epochs 0 and 1, then 2 and 3 again)
        }
        starts_ok &= firsts[0][0] != firsts[0][1] && firsts[1][0] != firsts[1][1]; // each epoch reads both steps
        CHECK(same && starts_ok, "2 ranks of 3 micro-steps read one rank's 6 micro-batches at every step, through "
              "4 epochs' ends (157 tokens: the 36 after 2 steps unread), --shuffle %d", shuffle);
        memory_loader_free(&six, &s6);
        for (int r = 0; r < 2; r++) memory_loader_free(&ranks[r], &sr[r]);
    }
    expect_error(memory_loader(&r1, &s1, &d, 10, 6, 1, 0, 1, 2, 0, "shakespeare.bin", err), err,
                 "two ranks' round past the data", "B*T*2 ranks+1 = 121 needed", NULL);
    memory_loader_free(&r1, &s1);
    expect_error(memory_loader(&r1, &s1, &d, 2, 5, 6, 0, 1, 2, 0, "shakespeare.bin", err), err,
                 "2 ranks of 6 micro-steps past the data", "one optimizer step: 101 tokens, B*T*micro-steps*2 ranks+1 = 121",
                 NULL);
    memory_loader_free(&r1, &s1);
    TrainArgs a;
    Llama3Config c = llama3_2_1b_config();
    rc = parse_ranks(&a, err, "--batch_size 2 --rendezvous file:/tmp/x", 4);
    CHECK(rc == 0 && a.loop.total_batch_size == 512 && micro_steps(&a.loop) == 1 && train_args_check(&a, &c, err) == 0,
          "4 ranks, no --total_batch_size: one micro-step of B*T on each (%d tokens)", a.loop.total_batch_size);
    rc = parse_ranks(&a, err, "--total_batch_size 2048 --rendezvous tcp:h:1", 2);
    CHECK(rc == 0 && micro_steps(&a.loop) == 4 && train_args_check(&a, &c, err) == 0,
          "2 ranks, 2048 tokens of 4x64: 4 micro-steps each");
    rc = parse_ranks(&a, err, "--total_batch_size 768", 2);
    expect_error(rc ? rc : train_args_check(&a, &c, err), err, "768 tokens over 2 ranks of 4x64",
                 "--batch_size * --sequence_length * 2 ranks = 512", "1024 (2 micro-steps) or 512");
    // what several ranks need, and what they do not do yet
    const struct { const char* flags; const char* frag; } dist[] = {
        {"--batch_size 4", "--rendezvous file:PATH or tcp:HOST:PORT is needed"},
        {"--rendezvous file:/x --shadow_weights 0", "--shadow_weights 0 under 2 ranks"}};
    for (int i = 0; i < 2; i++) {
        rc = parse_ranks(&a, err, dist[i].flags, 2);
        expect_error(rc ? rc : train_args_check(&a, &c, err), err, dist[i].flags, dist[i].frag, NULL);
    }
}

// Every flag and the model's shape go into the hash the ranks compare.
static void test_config_hash(void) {
    TrainArgs a = train_args_default(), b = a;
    Llama3Config c = llama3_2_1b_config(), c2 = c;
    uint64_t h = run_config_hash(&a, &c);
    int bad = h != run_config_hash(&b, &c);
    char err[L3_ERR_LEN];
    for (int i = 0; i < NUM_FLAGS; i++) { // another value of each flag (of those with one to give)
        const FlagSpec* f = &FLAGS[i];
        const char* other = f->kind == FLAG_PATH ? "/other" : f->kind == FLAG_BOOL ? (f->def && !strcmp(f->def, "1") ? "0" : "1")
                          : f->kind == FLAG_CHOICE ? (strchr(f->choices, '|') + 1) : f->kind == FLAG_ONLY ? NULL : "7";
        if (!other || (f->def && !strcmp(f->def, "7"))) continue;
        b = a;
        char value[64];
        snprintf(value, sizeof(value), "%s", other);
        char* bar = strchr(value, '|');
        if (bar) *bar = '\0';
        if (flag_set(&b, f, value, 0, err)) continue;
        bad += run_config_hash(&b, &c) == h;
    }
    c2.n_layer = 15;
    b = a, b.loop.world = 2;
    CHECK(!bad && run_config_hash(&a, &c2) != h && run_config_hash(&b, &c) != h,
          "the configuration hash: the same for the same run, another for any flag, the model or the world size (%d "
          "flags not told apart)", bad);
}

// The rendezvous, in forked processes: rank 0 hands its id to the others by file and by tcp, and a
// rank with another configuration is refused on both sides.
static int rendezvous_child(const RendezvousSpec* s, int rank, int world, uint64_t hash) {
    unsigned char id[RENDEZVOUS_ID_BYTES] = {0};
    char err[L3_ERR_LEN];
    if (rendezvous(s, rank, world, hash, id, 10, err)) return 2;
    for (int i = 0; i < RENDEZVOUS_ID_BYTES; i++)
        if (id[i] != (unsigned char)(i * 7 + 1)) return 3;
    return 0;
}
static void rendezvous_round(const char* spec_text, int world, uint64_t bad_hash, const char* what) {
    RendezvousSpec s;
    char err[L3_ERR_LEN];
    if (rendezvous_parse(spec_text, &s, err)) { CHECK(0, "%s: %s", what, err); return; }
    char label[64];
    snprintf(label, sizeof(label), "a rendezvous by %s of %d ranks", what, world);
    limit_start(label); // (a forked rank's own alarm: alarms do not pass through fork)
    pid_t kids[8];
    for (int r = 1; r < world; r++)
        if ((kids[r] = fork()) == 0) {
            limit_start(label);
            _exit(rendezvous_child(&s, r, world, r == 1 && bad_hash ? bad_hash : 42));
        }
    unsigned char id[RENDEZVOUS_ID_BYTES];
    for (int i = 0; i < RENDEZVOUS_ID_BYTES; i++) id[i] = (unsigned char)(i * 7 + 1);
    int rc0 = rendezvous(&s, 0, world, 42, id, 10, err), fails = 0;
    for (int r = 1; r < world; r++) {
        int st = 0;
        waitpid(kids[r], &st, 0);
        fails += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    limit_end();
    if (!bad_hash) CHECK(rc0 == 0 && fails == 0, "%s: %d ranks receive rank 0's id (%s)", what, world, rc0 ? err : "ok");
    else CHECK(fails == 1 && (s.tcp ? rc0 != 0 && strstr(err, "rank 1's configuration hash") : rc0 == 0),
               "%s: a rank with another configuration stops%s (%s)", what, s.tcp ? ", and rank 0 with it" : "",
               rc0 ? err : "rank 0: ok");
    if (!s.tcp) unlink(s.path);
}
// A rendezvous of rank `rank` that must fail with `frag` within `timeout_s`, under its own time limit.
static void rendezvous_refused(const RendezvousSpec* s, int rank, int world, double timeout_s, const char* what,
                               const char* frag) {
    unsigned char id[RENDEZVOUS_ID_BYTES] = {0};
    char err[L3_ERR_LEN];
    limit_start(what);
    int rc = rendezvous(s, rank, world, 42, id, timeout_s, err);
    limit_end();
    expect_error(rc, err, what, frag, NULL);
}
static void test_rendezvous(void) {
    char spec[600];
    snprintf(spec, sizeof(spec), "file:%s", tmp_path("rendezvous"));
    rendezvous_round(spec, 4, 0, "file");
    rendezvous_round(spec, 2, 7, "file");
    int port = 20000 + getpid() % 20000;
    snprintf(spec, sizeof(spec), "tcp:localhost:%d", port);
    rendezvous_round(spec, 4, 0, "tcp");
    snprintf(spec, sizeof(spec), "tcp:127.0.0.1:%d", port + 1);
    rendezvous_round(spec, 2, 7, "tcp");
    char err[L3_ERR_LEN];
    RendezvousSpec s;
    snprintf(spec, sizeof(spec), "file:%s", tmp_path("stale"));
    FILE* f = fopen(spec + 5, "w");
    if (f) fclose(f);
    rendezvous_parse(spec, &s, err);
    rendezvous_refused(&s, 0, 2, 1, "a rendezvous file left by another run", "exists already");
    snprintf(spec, sizeof(spec), "file:%s", tmp_path("never"));
    rendezvous_parse(spec, &s, err);
    rendezvous_refused(&s, 1, 2, 0.2, "rank 0 never writes", "did not write it within");
    snprintf(spec, sizeof(spec), "tcp:127.0.0.1:%d", port + 2);
    rendezvous_parse(spec, &s, err);
    rendezvous_refused(&s, 1, 2, 0.3, "rank 0 never listens", "did not answer within");
    rendezvous_refused(&s, 0, 3, 0.3, "no rank joins rank 0", "1 of 3 ranks joined");
    const char* bad[] = {"tcp:host", "tcp::80", "tcp:h:0", "tcp:h:65536", "nfs:/x", "file:"};
    int refused = 0;
    for (int i = 0; i < 6; i++) refused += rendezvous_parse(bad[i], &s, err) != 0 && strstr(err, "--rendezvous");
    CHECK(refused == 6, "malformed --rendezvous values refused (%d of 6)", refused);
}

// The JSON reader of Hugging Face folders (llama3.h json_parse): values, escapes, the last of
// repeated keys, and malformed texts each refused with what is wrong.
static void test_json_reader(void) {
    char err[L3_ERR_LEN];
    const char* good = " {\"a\": [1, -2.5e3, 0, true, false, null], \"s\": \"q\\\"\\u00e9\\n\", \"a\": {\"b\": {}}} ";
    JsonDoc d;
    int rc = json_parse(&d, strdup(good), strlen(good), "good.json", err);
    int a = json_member(&d, 0, "a"), s = json_member(&d, 0, "s");
    check_line(rc == 0 && a >= 0 && d.node[a].type == JSON_OBJECT && json_member(&d, a, "b") >= 0,
               "JSON: an object read; of two members \"a\" the last counts (%s)", rc ? err : "ok");
    check_line(rc == 0 && s >= 0 && d.node[s].str_len == 11 && memcmp(d.node[s].str, "q\\\"\\u00e9\\n", 11) == 0,
               "JSON: a string with escapes kept as written (length %d)", s >= 0 ? d.node[s].str_len : -1);
    json_free(&d);
    const char* nums = "[1, -2.5e3, 0, 1E+2, 0.125]";
    rc = json_parse(&d, strdup(nums), strlen(nums), "nums.json", err);
    double want[] = {1, -2500, 0, 100, 0.125}, got[5] = {0};
    int k = 0;
    for (int i = rc ? -1 : d.node[0].child; i >= 0 && k < 5; i = d.node[i].next) got[k++] = d.node[i].number;
    check_line(rc == 0 && k == 5 && memcmp(got, want, sizeof(want)) == 0, "JSON: numbers 1, -2.5e3, 0, 1E+2, 0.125");
    json_free(&d);
    const struct { const char* text; const char* says; } bad[] = {
        {"", "the text ends where a value is due"}, {"{\"a\" 1}", "a key without ':'"},
        {"[1, 2", "an array without ',' or ']'"}, {"{\"a\": 1,}", "an object member without a string key"},
        {"\"abc", "a string without its closing quote"}, {"\"a\\x\"", "an unknown escape"},
        {"\"\\u12g4\"", "a \\u escape without four hex digits"}, {"01", "a malformed number"},
        {"-", "a malformed number"}, {"1.e5", "a malformed number"}, {"nan", "an unexpected character"},
        {"[1] x", "characters after the value"}, {"\"a\tb\"", "a control character in a string"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        rc = json_parse(&d, strdup(bad[i].text), strlen(bad[i].text), "bad.json", err);
        check_line(rc != 0 && strstr(err, bad[i].says) != NULL, "JSON: %s refused: %s", bad[i].text, rc ? err : "read");
        json_free(&d);
    }
    char deep[200] = {0};
    for (int i = 0; i < 40; i++) deep[i] = '[', deep[79 - i] = ']';
    rc = json_parse(&d, strdup(deep), 80, "deep.json", err);
    check_line(rc != 0 && strstr(err, "nesting deeper than 32"), "JSON: 40 nested arrays refused: %s", rc ? err : "read");
    json_free(&d);
}

// --hf_to_seed HF_DIR OUT: llama3.h's reader of Hugging Face folders (--hf_dir) alone, its weights
// written as a seed model file, for scripts/test_hf_convert.py to compare with convert_hf.py's bytes.
// A folder it refuses: "error: ..." on stderr, exit 1.
static int hf_to_seed(const char* dir, const char* out) {
    char err[L3_ERR_LEN];
    HfModel h;
    int rc = hf_model_open(dir, &h, err);
    float *params = NULL, *buf = NULL;
    if (rc == 0) {
        size_t total = param_layout(&h.cfg).total, chunk = 2 * (size_t)h.cfg.n_embd * (h.cfg.n_embd / h.cfg.n_head);
        params = (float*)malloc(total * sizeof(float)), buf = (float*)malloc(chunk * sizeof(float));
        rc = hf_model_load(&h, buf, chunk, host_sink, params, err) || model_file_write(out, &h.cfg, params, err);
    }
    if (rc) fprintf(stderr, "error: %s\n", err);
    free(params), free(buf);
    hf_model_free(&h);
    return rc ? 1 : 0;
}

// --seed_to_hf MODEL OUT_DIR bfloat16|float32: a model file as --save_hf writes it (llama3.h hf_save),
// for scripts/test_hf_convert.py to compare with export_hf.py's folder.
static int seed_to_hf(const char* model, const char* out, const char* dtype) {
    char err[L3_ERR_LEN];
    Llama3Config c;
    ModelFileFormat fmt;
    float *params = NULL, buf[4096];
    int rc = model_header_read(model, &c, &fmt, err);
    if (rc == 0) {
        params = (float*)malloc(param_layout(&c).total * sizeof(float));
        rc = model_file_load(model, &c, fmt, buf, 4096, host_sink, params, err) ||
             hf_save(out, &c, params, strcmp(dtype, "bfloat16") == 0, NULL, err);
    }
    if (rc) fprintf(stderr, "error: %s\n", err);
    free(params);
    return rc ? 1 : 0;
}

// --rope_table HEAD_DIM FACTOR T OUT: llama3.h's RoPE of a head of HEAD_DIM with llama3 scaling at
// FACTOR (theta 500000, as every LLaMA 3), for positions 0..T-1, as the trainer uploads it: float32
// inv_freq (HEAD_DIM/2), then cos and sin (T, HEAD_DIM/2) each, for scripts/test_rope.py to compare
// with transformers' LlamaRotaryEmbedding.
static int rope_table_file(const char* head_dim, const char* factor, const char* positions, const char* out) {
    Llama3Config c = llama3_2_1b_config();
    int HD = atoi(head_dim), T = atoi(positions);
    c.n_embd = HD, c.n_head = c.n_kv_head = 1, c.rope_factor = (float)atof(factor);
    if (HD < 2 || HD % 2 || HD > 1024 || T < 1 || T > 1 << 24) {
        fprintf(stderr, "error: --rope_table: head_dim %s (even, 2..1024) and T %s (1..2^24)\n", head_dim, positions);
        return 1;
    }
    size_t half = HD / 2, n = (size_t)T * half;
    float* table = (float*)malloc(sizeof(float) * (half + 2 * n));
    rope_inv_freq(&c, table);
    rope_table(&c, T, table + half, table + half + n);
    Chunk chunk = {table, sizeof(float) * (half + 2 * n)};
    char err[L3_ERR_LEN];
    int rc = write_file_atomic(out, &chunk, 1, err);
    if (rc) fprintf(stderr, "error: %s\n", err);
    free(table);
    return rc ? 1 : 0;
}

int main(int argc, char** argv) {
    if (argc == 4 && strcmp(argv[1], "--hf_to_seed") == 0) return hf_to_seed(argv[2], argv[3]);
    if (argc == 5 && strcmp(argv[1], "--seed_to_hf") == 0) return seed_to_hf(argv[2], argv[3], argv[4]);
    if (argc == 6 && strcmp(argv[1], "--rope_table") == 0) return rope_table_file(argv[2], argv[3], argv[4], argv[5]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--hf_to_seed HF_DIR OUT.bin | --seed_to_hf MODEL OUT_DIR bfloat16|float32 | "
                "--rope_table HEAD_DIM FACTOR T OUT.bin]\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); // each line out as printed: stderr's (ASan's, a forked rank's) fall between them
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/llama3_host_test_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    // The hostile corpus goes to LLAMA3_CORPUS_DIR when given (run_tests.sh runs the trainer on it).
    const char* keep = getenv("LLAMA3_CORPUS_DIR");
    snprintf(corpus_dir, sizeof(corpus_dir), "%s", keep ? keep : tmpdir);
    if (keep) mkdir(keep, 0700);
    test_config_and_layout();
    test_tensor_table();
    test_segments_cover_params();
    test_seed_model_file();
    test_tied_embeddings();
    test_llmc_model_file();
    test_llmc_bf16_file();
    test_checkpoint_round_trip();
    test_resume_grown_shard();
    test_checkpoint_errors();
    test_checkpoint_ranks();
    test_checkpoint_bf16_moments();
    test_checkpoint_prune();
    test_checkpoint_killed_before_latest();
    test_token_files();
    test_vocab();
    test_loader();
    test_cli();
    test_user_flags();
    test_fp8_flags();
    test_doc_mask_flags();
    test_fit_advice();
    test_classifier_rows();
    test_widen_bf16_upper_half();
    test_family_shapes();
    test_gpu_and_val_paths();
    test_json_log();
    test_json_reader();
    test_flag_table();
    test_list_switches();
    test_step_plan();
    test_rank_env();
    test_shards();
    test_token_shards();
    test_val_loader_order();
    test_eval_file();
    test_loader_ranks();
    test_config_hash();
    test_rendezvous();
    test_lr_schedule();
    test_rope();
    test_hostile_values();
    test_hostile_sizes();
    test_shorter_than_header();
    test_log_file_kinds();
    test_outputs();
    launcher_corpus();
    corpus_models();
    corpus_tokens();
    corpus_odd_files();
    mutation_loop(3000);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
