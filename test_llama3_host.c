// test_llama3_host.c: unit tests of llama3.h (config, layout, file formats, loader, CLI, RoPE)
// with gcc alone, no GPU. Crafted files go to a temporary directory. Ends with "N passed, M failed".
#include "llama3.h"

#include <unistd.h>

static int n_passed = 0, n_failed = 0;
static char tmpdir[256];

#define CHECK(cond, ...)                                              \
    do {                                                              \
        int ok_ = (cond);                                             \
        printf("%s ", ok_ ? "ok  " : "FAIL");                         \
        printf(__VA_ARGS__);                                          \
        printf("\n");                                                 \
        ok_ ? n_passed++ : n_failed++;                                \
    } while (0)

// A function that must fail: its message must mention every given fragment.
static void expect_error(int rc, const char* err, const char* what, const char* frag1, const char* frag2) {
    int ok = rc != 0 && strstr(err, frag1) && (!frag2 || strstr(err, frag2));
    CHECK(ok, "%s -> \"%s\"", what, rc ? err : "(no error)");
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

static Llama3Config small_config(void) {
    Llama3Config c = {256, 1000, 2, 8, 2, 256, 1.5f, 256, 0, 1e-5f, 500000.0f, 1};
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

// Every parameter is written by exactly one segment of both file formats.
static void test_segments_cover_params(void) {
    Llama3Config c = small_config();
    ParamLayout p = param_layout(&c);
    for (int fmt = MODEL_FILE_SEED; fmt <= MODEL_FILE_LLMC; fmt++) {
        SegmentList s = fmt == MODEL_FILE_SEED ? seed_file_segments(&c, 1024) : llmc_file_segments(&c, 2048);
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

static void test_seed_model_file(void) {
    Llama3Config c = small_config(), got;
    size_t n;
    float* vals = seed_file_values(&c, &n);
    unsigned char h[1024];
    seed_header_write(h, &c);
    const char* path = tmp_path("seed.bin");
    write_file(path, h, 1024, vals, n * 4);
    char err[L3_ERR_LEN];
    ModelFileFormat fmt;
    int rc = model_header_read(path, &got, &fmt, err);
    CHECK(rc == 0 && fmt == MODEL_FILE_SEED, "seed file detected as seed format (%s)", rc ? err : "ok");
    CHECK(got.n_layer == 2 && got.n_embd == 256 && got.ffn_hidden == 1024 && got.n_kv_head == 2 &&
              got.rope_theta == 500000.0f && got.use_scaled_rope == 1 && got.norm_eps == 1e-5f,
          "seed header fields round-trip");
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
    bad[4] = 5;
    const char* bv = tmp_path("seed_version.bin");
    write_file(bv, bad, 1024, vals, n * 4);
    expect_error(model_header_read(bv, &got, &fmt, err), err, "unknown version", "unknown version 5", NULL);
    Llama3Config huge = c;
    huge.n_layer = 0x7fffffff; // sizes computed from it would overflow
    seed_header_write(bad, &huge);
    const char* bl = tmp_path("seed_layers.bin");
    write_file(bl, bad, 1024, vals, n * 4);
    expect_error(model_header_read(bl, &got, &fmt, err), err, "header with n_layer 2^31-1",
                 "does not describe a valid model", "seed_layers.bin");
    expect_error(model_header_read(tmp_path("missing.bin"), &got, &fmt, err), err, "missing model file",
                 "cannot open", "missing.bin");
    free(vals), free(params);
}

static void test_llmc_model_file(void) {
    Llama3Config c = small_config(), got;
    SegmentList s = llmc_file_segments(&c, 2048);
    size_t n_floats = (s.end - 2048) / 4;
    float* vals = malloc(s.end - 2048);
    for (int i = 0; i < s.n; i++)
        for (size_t j = 0; j < s.seg[i].count; j++)
            vals[(s.seg[i].file_offset - 2048) / 4 + j] = s.seg[i].param_offset < 0 ? 0.0f : (float)(i * 1000 + j % 997);
    int32_t h[512] = {0};
    h[0] = MODEL_MAGIC, h[1] = 3, h[2] = c.max_seq_len, h[3] = c.vocab_size, h[4] = c.n_layer, h[5] = c.n_head;
    h[6] = c.n_kv_head, h[7] = c.n_embd, h[8] = c.multiple_of, h[9] = 1, h[10] = 3, h[11] = 2;
    memcpy(&h[256], &c.ffn_dim_multiplier, 4), memcpy(&h[257], &c.norm_eps, 4), memcpy(&h[258], &c.rope_theta, 4);
    const char* path = tmp_path("llmc.bin");
    write_file(path, h, sizeof(h), vals, n_floats * 4);
    char err[L3_ERR_LEN];
    ModelFileFormat fmt;
    int rc = model_header_read(path, &got, &fmt, err);
    CHECK(rc == 0 && fmt == MODEL_FILE_LLMC && got.ffn_hidden == c.ffn_hidden && got.n_kv_head == 2,
          "llm.c file detected as llm.c format (%s)", rc ? err : "ok");
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

static void test_loader(void) {
    uint32_t toks[21];
    for (int i = 0; i < 21; i++) toks[i] = i;
    TokenData d = {toks, 21};
    DataLoader l;
    char err[L3_ERR_LEN];
    int32_t x[10], y[10];
    int rc = loader_init(&l, &d, 2, 5, 0, "data", err);
    loader_next(&l, x, y);
    int ok = rc == 0 && x[0] == 0 && y[0] == 1 && x[9] == 9 && y[9] == 10;
    loader_next(&l, x, y);
    ok &= x[0] == 10 && y[9] == 20;
    loader_next(&l, x, y); // 20 + 10 + 1 > 21: wraps
    ok &= x[0] == 0;
    CHECK(ok, "loader: shifted targets, sequential batches, wrap-around");
    rc = loader_init(&l, &d, 2, 5, 1, "data", err);
    loader_next(&l, x, y);
    for (int i = 0; i < 10; i++) x[i] = y[i] = -1; // poison: the second batch must be written again
    loader_next(&l, x, y);
    CHECK(rc == 0 && x[0] == 0 && x[9] == 9 && y[0] == 1 && y[9] == 10,
          "loader: overfit_single_batch repeats the first batch");
    expect_error(loader_init(&l, &d, 4, 6, 0, "shakespeare.bin", err), err, "fewer tokens than one batch",
                 "not enough tokens for one batch", "shakespeare.bin");
}

static int parse(TrainArgs* a, char* err, const char* line) {
    static char copy[1024];
    char* argv[64];
    int argc = 0;
    snprintf(copy, sizeof(copy), "prog %s", line);
    for (char* tok = strtok(copy, " "); tok && argc < 64; tok = strtok(NULL, " ")) argv[argc++] = tok;
    return train_args_parse(a, argc, argv, err);
}

static void test_cli(void) {
    TrainArgs a;
    char err[L3_ERR_LEN];
    int rc = parse(&a, err,
                   "--device cuda --dtype bfloat16 --input_bin data/llama3/tiny_shakespeare_train.bin "
                   "--llmc_filepath data/llama3/llama3.2_1B_fp32.bin --num_iteration 5 --batch_size 4 "
                   "--sequence_length 64 --total_batch_size 256");
    CHECK(rc == 0 && a.num_iteration == 5 && a.batch_size == 4 && a.sequence_length == 64 &&
              a.total_batch_size == 256 && !strcmp(a.llmc_filepath, "data/llama3/llama3.2_1B_fp32.bin"),
          "the seed report's command line parses (%s)", rc ? err : "ok");
    CHECK(a.learning_rate == 1e-5f && a.beta1 == 0.9f && a.beta2 == 0.999f && a.eps == 1e-8f &&
              a.weight_decay == 0.0f,
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
    CHECK(rc == 0 && a.learning_rate == 3e-4f && a.overfit_single_batch == 1 && a.seed == 7 &&
              a.weight_decay == 0.1f && a.sw.sparse_embedding == 0,
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
    wide.n_head = 8, wide.n_kv_head = 2; // head_dim 256
    expect_error(train_args_check(&a, &wide, err), err, "flash attention with head_dim 256", "head_dim 32 or 64",
                 "not 256");
    rc = parse(&a, err, "--flash_attention 0");
    checked = train_args_check(&a, &wide, err);
    CHECK(rc == 0 && checked == 0, "head_dim 256 with --flash_attention 0 (%s)", checked ? err : "ok");
    wide.n_embd = 16384, wide.n_head = 256, wide.n_kv_head = 64;
    expect_error(train_args_check(&a, &wide, err), err, "n_embd wider than the RMSNorm kernels", "n_embd 16384",
                 "8192");
    rc = parse(&a, err, "--sequence_length 9000");
    expect_error(train_args_check(&a, &c, err), err, "sequence longer than the model allows", "--sequence_length 9000",
                 "max_seq_len 8192");
    rc |= parse(&a, err, "--deferred_adamw 17");
    expect_error(train_args_check(&a, &c, err), err, "more deferred layers than the model has", "--deferred_adamw 17",
                 "16 layers");
    rc |= parse(&a, err, "--deferred_adamw 16");
    CHECK(rc == 0 && a.sw.deferred_adamw == 16 && train_args_check(&a, &c, err) == 0, "--deferred_adamw 16: every layer");
    rc = parse(&a, err, "--batch_size 3 --sequence_length 64 --total_batch_size 256");
    expect_error(rc ? rc : train_args_check(&a, &c, err), err, "B*T not dividing total_batch_size",
                 "--total_batch_size 256", "192");
    rc = parse(&a, err, "--batch_size 4 --sequence_length 64 --total_batch_size 1024");
    CHECK(rc == 0 && a.total_batch_size == 1024 && train_args_check(&a, &c, err) == 0,
          "total_batch_size 1024 = 4 micro-steps of 4x64");
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
    rope_table(&c, 4, cs, sn);
    CHECK(cs[0] == 1.0f && sn[0] == 0.0f && fabs(cs[32] - cos(1.0)) < 1e-7 && fabs(sn[3 * 32] - sin(3.0)) < 1e-7,
          "rope table: angle = position * inv_freq");
}

int main(void) {
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/llama3_host_test_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    test_config_and_layout();
    test_segments_cover_params();
    test_seed_model_file();
    test_llmc_model_file();
    test_token_files();
    test_loader();
    test_cli();
    test_rope();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
