// llama3.h: the host-side C of the LLaMA 3 trainer, in the order a run uses it: the flags and the
// model's config (config, lr schedule, each part's settings, the command line); the weights' layout
// (parameter layout, tensor table, the step's plan, RoPE); files (model files, the vocabulary); data
// (token files, the loader); the checks before the GPU; checkpoints and the JSON log; ranks (launch
// variables, ZeRO-1 shards, the configuration hash, the rendezvous); the outputs, checked before the GPU.
// No CUDA in here: `gcc -x c test_llama3_host.c` builds its unit tests on a machine without a GPU.
// Functions that can fail on bad input return 0 on success and -1 with a message in `err`
// (L3_ERR_LEN bytes) that names the file or flag and what is wrong; callers decide to exit.
#pragma once
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define L3_ERR_LEN 1024
#define L3_PATH_LEN 4352 // a path of PATH_MAX (4096) and a checkpoint's suffixes
#define MODEL_MAGIC 20240803
#define MODEL_VERSION_FP32 3
#define MODEL_VERSION_BF16 5 // llm.c's bf16 llama3 files
#define TOKENS_MAGIC_LLAMA3 20240801 // uint32 tokens, version 7
#define TOKENS_MAGIC_GPT2 20240520   // uint16 tokens, version 1

// FNV-1a, 64-bit: the checkpoint's hash of the data and the ranks' hash of their configuration.
#define FNV1A_OFFSET 1469598103934665603ULL
static inline uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char*)data)[i]) * 1099511628211ULL;
    return h;
}

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
    int use_scaled_rope; // llama3 frequency scaling by rope_factor: low 1, high 4, original context 8192
    int tied_embeddings; // 1: wte is also the output projection (no lm_head tensor), as Llama-3.2-1B/3B ship
    float rope_factor;   // llama3 scaling's factor: 32 in Llama-3.2, 8 in Llama-3.1
} Llama3Config;

#define LLAMA3_2_ROPE_FACTOR 32.0f // a seed header's slot 17 when it holds 0 (the seed's files)
#define LLMC_ROPE_FACTOR 8.0f      // llm.c's: its header has no field, its trainers hardcode Llama-3.1's 8

#define LLAMA3_MAX_FFN (1 << 20)
#define LLAMA3_MAX_LAYERS 1024

// LLaMA 3's FFN width: 4C, two thirds of it, times the multiplier (a float product, as Meta's
// code computes it), rounded up to multiple_of. -1 when the product is not in [1, 2^20]: its
// cast to int would overflow. n_embd and multiple_of must be in range (config_check).
static inline int ffn_hidden_dim(int n_embd, float multiplier, int multiple_of) {
    int hidden = 2 * (4 * n_embd) / 3;
    float scaled = multiplier * hidden;
    if (!(scaled >= 1.0f && scaled <= (float)LLAMA3_MAX_FFN)) return -1;
    hidden = (int)scaled;
    return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

static inline Llama3Config llama3_2_1b_config(void) {
    Llama3Config c = {131072, 128256, 16, 32, 8, 2048, 1.5f, 256, 0, 1e-5f, 500000.0f, 1, 0, LLAMA3_2_ROPE_FACTOR};
    c.ffn_hidden = ffn_hidden_dim(c.n_embd, c.ffn_dim_multiplier, c.multiple_of);
    return c;
}

// [family] The random init's shapes (--shape): LLaMA 3.2-1B (untied, as the seed's files; the
// released one is tied), 3.2-3B (tied, as released) and 3.1-8B (untied, RoPE factor 8), each with
// the 1B's vocabulary, norm eps, RoPE theta and 131,072 positions (max_position_embeddings of the
// released 3.2 and 3.1 models). A model file gives its own shape.
enum { SHAPE_1B, SHAPE_3B, SHAPE_8B };
#define SHAPE_CHOICES "1b|3b|8b" // (their order: the enum's)
static const char* const SHAPE_NAMES[] = {"LLaMA 3.2-1B", "LLaMA 3.2-3B", "LLaMA 3.1-8B"};
static inline Llama3Config family_config(int shape) {
    Llama3Config c = llama3_2_1b_config();
    if (shape == SHAPE_3B)
        c.n_layer = 28, c.n_embd = 3072, c.n_head = 24, c.ffn_dim_multiplier = 1.0f, c.tied_embeddings = 1;
    if (shape == SHAPE_8B)
        c.n_layer = 32, c.n_embd = 4096, c.ffn_dim_multiplier = 1.3f, c.multiple_of = 1024, c.rope_factor = 8.0f;
    c.ffn_hidden = ffn_hidden_dim(c.n_embd, c.ffn_dim_multiplier, c.multiple_of);
    return c;
}

// Checks every field of a config read from `source` against its range (bounds far above any
// LLaMA 3, so that no size computed from them overflows), then derives ffn_hidden. The message
// names the field, its value and the range.
static inline int config_check(Llama3Config* c, const char* source, char* err) {
    const struct { const char* name; long long value, lo, hi; } ints[] = {
        {"max_seq_len", c->max_seq_len, 1, 1 << 24},   {"vocab_size", c->vocab_size, 8, 1 << 24},
        {"n_layer", c->n_layer, 1, LLAMA3_MAX_LAYERS}, {"n_head", c->n_head, 1, 1024},
        {"n_kv_head", c->n_kv_head, 1, 1024},          {"n_embd", c->n_embd, 8, 1 << 20},
        {"multiple_of", c->multiple_of, 1, 1 << 20},   {"use_scaled_rope", c->use_scaled_rope, 0, 1},
        {"tied_embeddings", c->tied_embeddings, 0, 1}};
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
        if (ints[i].value < ints[i].lo || ints[i].value > ints[i].hi)
            return l3_fail(err, "%s: %s %lld is out of range [%lld, %lld]", source, ints[i].name, ints[i].value,
                           ints[i].lo, ints[i].hi);
    const struct { const char* name; double value, lo, hi; } floats[] = {
        {"ffn_dim_multiplier", c->ffn_dim_multiplier, 1e-2, 64.0}, {"norm_eps", c->norm_eps, 1e-12, 1.0},
        {"rope_theta", c->rope_theta, 1.0, 1e12}, {"rope_factor", c->rope_factor, 1.0, 1024.0}};
    for (size_t i = 0; i < sizeof(floats) / sizeof(floats[0]); i++)
        if (!(floats[i].value >= floats[i].lo && floats[i].value <= floats[i].hi)) // NaN fails too
            return l3_fail(err, "%s: %s %g is out of range [%g, %g]", source, floats[i].name, floats[i].value,
                           floats[i].lo, floats[i].hi);
    c->ffn_hidden = ffn_hidden_dim(c->n_embd, c->ffn_dim_multiplier, c->multiple_of);
    if (c->ffn_hidden < 1 || c->ffn_hidden > LLAMA3_MAX_FFN)
        return l3_fail(err, "%s: ffn_dim_multiplier %g with n_embd %d gives an FFN width out of range [1, %d]", source,
                       c->ffn_dim_multiplier, c->n_embd, LLAMA3_MAX_FFN);
    if (c->n_embd % c->n_head != 0 || c->n_head % c->n_kv_head != 0)
        return l3_fail(err, "%s: n_embd %d, n_head %d, n_kv_head %d do not divide evenly", source,
                       c->n_embd, c->n_head, c->n_kv_head);
    // The kernels move 8 bf16 (16 bytes) at a time along C, F, V and the head dimension.
    if (c->n_embd % 8 != 0 || c->ffn_hidden % 8 != 0 || c->vocab_size % 8 != 0 || (c->n_embd / c->n_head) % 8 != 0)
        return l3_fail(err, "%s: n_embd %d, ffn_hidden %d, vocab_size %d and head_dim %d must be multiples of 8",
                       source, c->n_embd, c->ffn_hidden, c->vocab_size, c->n_embd / c->n_head);
    return 0;
}

static inline void config_print(FILE* f, const Llama3Config* c) {
    fprintf(f, "| max_seq_len %d | vocab_size %d | n_layer %d | n_head %d | n_kv_head %d |\n",
            c->max_seq_len, c->vocab_size, c->n_layer, c->n_head, c->n_kv_head);
    fprintf(f, "| n_embd %d | head_dim %d | ffn_hidden %d | norm_eps %g | rope_theta %g | scaled_rope %d",
            c->n_embd, c->n_embd / c->n_head, c->ffn_hidden, c->norm_eps, c->rope_theta, c->use_scaled_rope);
    if (c->use_scaled_rope) fprintf(f, " (factor %g)", c->rope_factor);
    fprintf(f, " | tied %d |\n", c->tied_embeddings);
}

// Rows of the qkv weight: C query rows, then the key and value rows of the KV heads.
static inline int qkv_dim(const Llama3Config* c) { return c->n_embd + 2 * c->n_kv_head * (c->n_embd / c->n_head); }

// ---- learning-rate schedule ----
// The lr of optimizer step t (1 = the first update, total = the run's last step): a linear warmup
// to the peak over the first `warmup` steps (peak * t / warmup, never 0), then constant; cosine or
// linear from the peak down to peak * final_frac at step total; or wsd (warmup, stable, decay): the
// peak until the last decay_frac of the run, then linear down to peak * final_frac at step total.
// Compiled for the host and, by nvcc, for the device, where the step's first kernel evaluates it
// from the step counter (so a captured step replays with each step's own lr).
enum { LR_CONSTANT, LR_COSINE, LR_LINEAR, LR_WSD };
typedef struct {
    int kind;   // LR_CONSTANT, LR_COSINE, LR_LINEAR, LR_WSD
    int warmup; // --warmup_iters
    int total;  // --num_iteration: the run's optimizer steps, in one invocation or several (--stop_after)
    float peak_lr, final_frac, decay_frac;
} LrSchedule;
#ifdef __CUDACC__
#define L3_HOST_DEVICE __host__ __device__
#else
#define L3_HOST_DEVICE
#endif

// splitmix64's finaliser: every output bit depends on every input bit. The counter-based random
// streams (the kernels' init and [bf16 moments] rounding, the loader's orders) hash a counter with
// it instead of keeping generator state.
static inline L3_HOST_DEVICE uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline L3_HOST_DEVICE float lr_at(LrSchedule s, int t) {
    if (t <= s.warmup) return (float)((double)s.peak_lr * t / s.warmup);
    if (s.kind == LR_CONSTANT) return s.peak_lr;
    double start = s.warmup, wsd_start = s.total - (double)s.decay_frac * s.total; // where the decay starts
    if (s.kind == LR_WSD && wsd_start > start) start = wsd_start;
    if (t <= start) return s.peak_lr;
    double p = (t - start) / (s.total - start); // (0, 1] up to the last step
    if (!(p <= 1)) p = 1;
    double f = s.kind == LR_COSINE ? 0.5 * (1.0 + cos(M_PI * p)) : 1.0 - p; // 1 -> 0
    return (float)(s.peak_lr * (s.final_frac + (1.0 - s.final_frac) * f));
}

// ---- configuration ----
// Each part of the trainer owns one struct of settings, and the command line's table (FLAGS, below)
// parses every flag straight into its field there: one copy of each value, nothing repacked.

// The optimizer's: AdamW as torch.optim.AdamW, its lr schedule, and gradient clipping.
typedef struct {
    LrSchedule sched;
    float beta1, beta2, eps, weight_decay;
    float grad_clip; // 0: no clipping (and no gradient norm)
    int moments;     // --optimizer_state: MOMENTS_FP32, or MOMENTS_BF16 [bf16 moments] (m and v in bf16)
    int weights;     // --master_weights: WEIGHTS_FP32 (fp32 masters, bf16 copies), or WEIGHTS_BF16 [bf16 weights]
                     // (the matmul weights' bf16 copy is the only one, updated with stochastic rounding)
    int offload;     // --offload_optimizer: m and v in pinned host memory [offload]
} OptimConfig;
enum { MOMENTS_FP32, MOMENTS_BF16 };
enum { WEIGHTS_FP32, WEIGHTS_BF16 };
// Bytes of one value of AdamW's m (or v).
static inline size_t moment_bytes(int moments) { return moments == MOMENTS_BF16 ? 2 : 4; }

// The training loop's: its inputs and log, the batch, and how long it runs.
typedef struct {
    const char* input_bin;     // NULL: the embedded default data set
    const char* llmc_filepath; // NULL: random init (std 0.02, norms 1) of `shape`, or hf_dir
    const char* hf_dir;        // a Hugging Face model folder (NULL: llmc_filepath or the random init)
    const char* save_hf;       // a folder for the trained model in Hugging Face's format (NULL: none)
    int save_hf_dtype;         // --save_hf_dtype: HF_DTYPE_BF16 or HF_DTYPE_FP32
    int shape;                 // --shape: SHAPE_1B, _3B or _8B, the random init's [family]
    const char* log_file;      // NULL: no JSON log
    int batch_size, sequence_length, total_batch_size; // total: of all ranks
    int doc_mask; // --doc_mask: attention within each document of a packed row [document mask]
    int bos_id;   // --bos_id: the token that starts a document (-1: not given; bos_token decides)
    int recompute; // --recompute: RECOMPUTE_NONE, _NORMS or _BLOCKS, what the backward recomputes [recompute]
    int classifier_chunk; // --classifier_chunk: rows the classifier takes at a time (0: classifier_rows decides)
    int fp8;       // --fp8: the block linears' GEMMs in FP8 [fp8]
    int fp8_grads; // --fp8_grads: FP8_GRADS_E5M2 or _E4M3, the backward's output gradients' format [fp8]
    int rank, world; // this process's rank, of the ranks the run is spread over (the launcher's, RankEnv;
                     // not flags: train_args_parse sets world, its caller the rank)
    int stop_after; // 0: run to the schedule's last step; else the last step of this invocation
    int overfit_single_batch;
    int shuffle; // --shuffle: the shards and their steps' batches in an order drawn from the seed per epoch
    unsigned long long seed;
    int max_bad_steps; // skipped steps in a row that stop the run
    int dry_run;       // --dry_run 1: check the flags and inputs, print the setup, and exit before the GPU
} LoopConfig;
// [recompute] Activations the backward recomputes instead of keeping one copy per layer: none; the
// RMSNorm outputs and SwiGLU's (each layer keeps its residuals, q k v, attention output and gate_up);
// or whole blocks (each layer keeps only its input, resid; the block's forward runs again, all but
// the down projection, just before its backward). The recomputed values are the saved ones bit for
// bit: the same kernels on the same inputs.
enum { RECOMPUTE_NONE, RECOMPUTE_NORMS, RECOMPUTE_BLOCKS };
enum { FP8_GRADS_E5M2, FP8_GRADS_E4M3 };
// LLaMA 3's BOS, <|begin_of_text|>, which prepare_data.py puts before every document.
#define LLAMA3_BOS 128000
// The token that starts a document (--doc_mask's boundary, a sample's first token): --bos_id, else
// LLaMA 3's BOS when the vocabulary holds it; -1 when neither (another tokenizer's vocabulary, such as
// the tests' small ones, must name it).
static inline int bos_token(const LoopConfig* l, const Llama3Config* c) {
    return l->bos_id >= 0 ? l->bos_id : c->vocab_size > LLAMA3_BOS ? LLAMA3_BOS : -1;
}
enum { HF_DTYPE_BF16, HF_DTYPE_FP32 }; // --save_hf_dtype's choices, in order
#define FP8_GRADS_CHOICES "e5m2|e4m3" // (their order: the enum's)

// Evaluation's: the val loss and samples between steps.
typedef struct {
    const char* val_bin; // NULL: the embedded tiny shakespeare val split
    int val_every, val_tokens; // val_every 0: no validation
    int sample_every, sample_tokens, top_k; // sample_every 0: no sampling
    const char* eval_file;        // NULL: no multiple-choice eval (--eval_file, an eval file below)
    int eval_every, eval_examples; // eval_every 0: never; eval_examples 0: every example
    float temperature;                      // 0: greedy
} EvalConfig;

// Data parallel's: how the ranks find each other, and how long any of them waits for the others.
typedef struct {
    const char* rendezvous; // file:PATH or tcp:HOST:PORT (rendezvous, below); needed under several ranks
    int timeout_s;          // the rendezvous, NCCL's start, and any step
} DistConfig;

// Checkpoints'.
typedef struct {
    const char* dir; // NULL: no checkpoints
    int every;       // 0: only after the last step
    int keep;        // complete checkpoints kept
    int hf;          // --save_hf_checkpoints: each checkpoint folder also holds hf/, as --save_hf writes it
    const char* resume; // NULL: a fresh run; else a checkpoint folder or a --checkpoint_dir
} CheckpointConfig;

// Optimisations that can be switched off, one by one, for the ablation (scripts/bench.sh). A switch
// is its row here and the code that reads it: its Switches field, its flag and --help line, the
// scripts' list (--list_switches), the printed configuration, the checkpoint's record and the
// test's choice of what to re-check all come from the row. A row: field (and flag) name, flag
// kind, default, upper bound (ints), choices, what it changes (SWITCH_PASSES: the forward or
// backward pass; SWITCH_OPTIMIZER: only when and how AdamW runs), the values the tests and the
// ablation run it at, help.
enum { GRAD_ZERO_NONE, GRAD_ZERO_MEMSET, GRAD_ZERO_FILL };
typedef enum { NOT_A_SWITCH, SWITCH_PASSES, SWITCH_OPTIMIZER } SwitchScope;
#define LLAMA3_SWITCHES(X)                                                                                             \
    X(shadow_weights, FLAG_BOOL, "1", 0, NULL, SWITCH_PASSES, "0",                                                     \
      "1: AdamW writes bf16 copies of the weights; 0: cast each weight to bf16 before every GEMM that reads it")       \
    X(vector_adam, FLAG_BOOL, "1", 0, NULL, SWITCH_OPTIMIZER, "0", "1: 128-bit AdamW; 0: scalar AdamW kernels")       \
    X(grad_zeroing, FLAG_CHOICE, "none", 0, "none|memset|fill", SWITCH_PASSES, "memset fill",                          \
      "none: the first gradient GEMM writes; memset or fill: zero every gradient tensor each step and accumulate")    \
    X(metadata_by_value, FLAG_BOOL, "1", 0, NULL, SWITCH_PASSES, "0",                                                  \
      "1: shapes as kernel arguments; 0: copied host-to-device before each launch that takes them")                   \
    X(sparse_embedding, FLAG_BOOL, "1", 0, NULL, SWITCH_OPTIMIZER, "0",                                                \
      "1: lazy AdamW on the embedding rows the step touched; 0: dense embedding gradient and AdamW")                  \
    X(overlap_optimizer, FLAG_BOOL, "1", 0, NULL, SWITCH_OPTIMIZER, "0",                                               \
      "1: AdamW of each layer on a second stream during the backward; 0: after the backward pass")                    \
    X(flash_attention, FLAG_BOOL, "1", 0, NULL, SWITCH_PASSES, "0",                                                    \
      "1: flash attention; 0: unfused (batched GEMMs, T x T scores and P in memory)")                                 \
    X(bf16_grads, FLAG_BOOL, "1", 0, NULL, SWITCH_PASSES, "0",                                                         \
      "1: matmul weight gradients in bf16 when one micro-step makes the step; 0: fp32")                               \
    X(cuda_graph, FLAG_BOOL, "1", 0, NULL, SWITCH_OPTIMIZER, "0",                                                      \
      "1: steps 2.. replay one CUDA graph (not with metadata_by_value 0, whose copies a graph cannot hold); "         \
      "0: every kernel launched from the host")                                                                       \
    X(fused_rmsnorm, FLAG_BOOL, "1", 0, NULL, SWITCH_PASSES, "0",                                                      \
      "1: one kernel per RMSNorm forward/backward, residual add inside; 0: the separate ops autograd runs")           \
    X(deferred_adamw, FLAG_INT, "-1", BIG_INT, NULL, SWITCH_OPTIMIZER, "0 1",                                          \
      "AdamW of layers 0..N-1 in the next step's forward (not given: 12, or every layer of a smaller model; with "    \
      "grad_clip every group; only with overlap_optimizer 1 and grad_zeroing none)")                                  \
    X(delete_fills, FLAG_BOOL, "1", 0, NULL, SWITCH_PASSES, "0",                                                       \
      "1: no fill before a kernel that overwrites its whole output; 0: InfiniTrain's fills before the attention and " \
      "head-permute backward")
#define BIG_INT (1 << 30)

typedef struct {
#define SWITCH_FIELD(field, ...) int field;
    LLAMA3_SWITCHES(SWITCH_FIELD)
#undef SWITCH_FIELD
} Switches;

// The switches as they apply to model c, the one place a model overrides a flag: [tied embeddings]
// sparse_embedding off, since the head GEMM writes every row of a tied wte's gradient (no sparse
// rows to update lazily). The trainer prints what this changed (print_model).
static inline Switches switches_for_model(const Switches* sw, const Llama3Config* c) {
    Switches s = *sw;
    if (c->tied_embeddings) s.sparse_embedding = 0;
    return s;
}

typedef struct {
    LoopConfig loop;
    OptimConfig optim;
    EvalConfig eval;
    CheckpointConfig ckpt;
    DistConfig dist;
    Switches sw;
    int help;          // --help or -h: print the usage and exit
    int list_switches; // --list_switches: print each switch's ablation settings and exit
} TrainArgs;

// What model creation takes of a run besides the model's config: the micro-batch (B rows of T
// tokens) and the micro-steps per optimizer step, recompute, the precision recipe (--fp8 and its
// gradients' format), the optimizer and the switches. The trainer's comes from its flags
// (run_config, after train_args_resolve); test_llama3's from a reference's own values.
typedef struct {
    int B, T, grad_accum;
    int recompute;      // RECOMPUTE_NONE, _NORMS or _BLOCKS
    int classifier_chunk; // --classifier_chunk (0: automatic, classifier_rows)
    int fp8, fp8_grads; // --fp8 1: the block linears' GEMMs in FP8; FP8_GRADS_E5M2 or _E4M3
    const OptimConfig* opt;
    const Switches* sw;
    int doc_mask, bos; // [document mask] --doc_mask 1: attention within each document, which starts at token bos
} RunConfig;

// [chunked classifier] Rows of the classifier's chunks for N rows of a V-word vocabulary: --classifier_chunk
// `chunk` (at most N), or (0) all N while their bf16 logits take at most CLASSIFIER_AUTO_BYTES (the bench
// configs, up to B*T = 16384 on LLaMA 3's vocabulary: one chunk, as before chunks existed), else the fewest
// chunks within it, of equal rows rounded up to a multiple of 64 (the last one may be shorter).
#define CLASSIFIER_AUTO_BYTES ((size_t)4 << 30)
static inline int classifier_rows(long long N, int V, int chunk) {
    if (chunk > 0) return chunk < N ? chunk : (int)N;
    long long most = (long long)(CLASSIFIER_AUTO_BYTES / (2 * (size_t)V)) / 64 * 64; // (128 at V = 2^24)
    if (N <= most) return (int)N;
    long long chunks = (N + most - 1) / most, rows = (N + chunks - 1) / chunks;
    return (int)((rows + 63) / 64 * 64);
}

// The last step this invocation runs: --stop_after, or the schedule's last step.
static inline int last_step(const TrainArgs* a) { return a->loop.stop_after ? a->loop.stop_after : a->optim.sched.total; }

// ---- command line ----
// The seed report's flags (gflags style: --flag value or --flag=value) plus our own.
//
// One table drives parsing, the defaults, the usage text and the printed configuration: a new
// flag is one row. A row names the field its value lands in (by offset into TrainArgs, inside its
// consumer's struct), how the value parses, its default as it would be typed (applied without the
// range check: deferred_adamw's -1 means "not given"), its range or choices, and its help.
typedef enum {
    FLAG_INT,    // int in [lo, hi]
    FLAG_U64,    // unsigned long long in [lo, hi]
    FLAG_FLOAT,  // float in [lo, hi], as a 32-bit float
    FLAG_BOOL,   // 0, 1, true, false; given bare: 1
    FLAG_PATH,   // a non-empty path (default NULL: none)
    FLAG_CHOICE, // one of choices ("none|memset|fill"); stores its index
    FLAG_ONLY,   // accepted for the seed's command line: choices is the only value taken
} FlagKind;

typedef struct {
    const char* name;
    FlagKind kind;
    size_t offset;
    const char* def; // NULL: no default (a path: none)
    double lo, hi;
    const char* choices;
    const char* help;
    SwitchScope scope;          // a switch (an optimisation, on by default, off for the ablation), or not
    const char* ablation_values; // a switch's values other than its default that the tests and the ablation run
} FlagSpec;

#define ARG(field) offsetof(TrainArgs, field)
#define SWITCH_FLAG(field, kind, def, hi, choices, scope, values, help) \
    {"--" #field, kind, ARG(sw.field), def, 0, hi, choices, help, scope, values},
static const FlagSpec FLAGS[] = {
    {"--input_bin", FLAG_PATH, ARG(loop.input_bin), NULL, 0, 0, NULL, "llm.c token files, uint32 LLaMA-3 or uint16 GPT-2 tokens: a file, a glob of shards (quoted: 'data/train_*.bin') or a comma list of either (default: embedded tiny shakespeare)", NOT_A_SWITCH, NULL},
    {"--shuffle", FLAG_BOOL, ARG(loop.shuffle), "1", 0, 0, NULL, "1: each epoch reads the shards, and each shard's steps, in an order drawn from --seed and the epoch; 0: in order", NOT_A_SWITCH, NULL},
    {"--llmc_filepath", FLAG_PATH, ARG(loop.llmc_filepath), NULL, 0, 0, NULL, "model file: this trainer's format (convert_hf.py's, a checkpoint's model.bin, InfiniTrain's) or llm.c's llama3 format, told apart by size (default: random init)", NOT_A_SWITCH, NULL},
    {"--hf_dir", FLAG_PATH, ARG(loop.hf_dir), NULL, 0, 0, NULL, "a Hugging Face LLaMA 3 folder (config.json, model.safetensors or its index and shards; F32, F16 or BF16), read straight onto the GPU as convert_hf.py would convert it (default: --llmc_filepath, else random init)", NOT_A_SWITCH, NULL},
    {"--save_hf", FLAG_PATH, ARG(loop.save_hf), NULL, 0, 0, NULL, "after the last step, write the model as a Hugging Face folder here, as export_hf.py would at the same --dtype (model.safetensors, config.json, and --hf_dir's tokenizer files); made if missing", NOT_A_SWITCH, NULL},
    {"--save_hf_dtype", FLAG_CHOICE, ARG(loop.save_hf_dtype), "bfloat16", 0, 0, "bfloat16|float32", "--save_hf's and --save_hf_checkpoints' tensors: bf16 rounded to nearest even, or the fp32 weights (export_hf.py's --dtype default)", NOT_A_SWITCH, NULL},
    {"--shape", FLAG_CHOICE, ARG(loop.shape), "1b", 0, 0, SHAPE_CHOICES, "the random init's shape: LLaMA 3.2-1B (untied), 3.2-3B (tied) or 3.1-8B (untied, RoPE factor 8); a model file or --resume gives its own", NOT_A_SWITCH, NULL},
    {"--num_iteration", FLAG_INT, ARG(optim.sched.total), "100", 1, BIG_INT, NULL, "optimizer steps of the run: the lr schedule's length, and its last step", NOT_A_SWITCH, NULL},
    {"--stop_after", FLAG_INT, ARG(loop.stop_after), "0", 0, BIG_INT, NULL, "end this invocation after step N, to --resume later on the same schedule (0: at --num_iteration)", NOT_A_SWITCH, NULL},
    {"--batch_size", FLAG_INT, ARG(loop.batch_size), "4", 1, BIG_INT, NULL, "sequences per micro-batch", NOT_A_SWITCH, NULL},
    {"--sequence_length", FLAG_INT, ARG(loop.sequence_length), "64", 1, BIG_INT, NULL, "tokens per sequence, up to the model's max_seq_len (131072 for LLaMA 3.1 and 3.2; memory limits it before that: --dry_run 1 says)", NOT_A_SWITCH, NULL},
    {"--doc_mask", FLAG_BOOL, ARG(loop.doc_mask), "0", 0, 0, NULL, "1: attention within each document of a packed sequence, as LLaMA 3's pretraining: a query sees the keys from its document's BOS (--bos_id) on, and key tiles wholly before it are skipped; positions stay absolute", NOT_A_SWITCH, NULL},
    {"--bos_id", FLAG_INT, ARG(loop.bos_id), "-1", 0, BIG_INT, NULL, "the token that starts a document: --doc_mask's boundary and a sample's first token (not given: LLaMA 3's 128000 when the vocabulary holds it)", NOT_A_SWITCH, NULL},
    {"--recompute", FLAG_INT, ARG(loop.recompute), "0", 0, 2, NULL, "activations recomputed in the backward instead of kept per layer: 0 none; 1 the RMSNorm and SwiGLU outputs; 2 whole blocks (each layer keeps only its input); the same losses bit for bit", NOT_A_SWITCH, NULL},
    {"--classifier_chunk", FLAG_INT, ARG(loop.classifier_chunk), "0", 0, BIG_INT, NULL, "rows (tokens) of a micro-batch that the lm_head GEMM, the loss and the head's backward take at a time: the logits take chunk x vocab_size bf16 (0: all B*T rows while that is at most 4 GiB, else the fewest equal chunks within it, multiples of 64 rows)", NOT_A_SWITCH, NULL},
    {"--fp8", FLAG_INT, ARG(loop.fp8), "0", 0, 1, NULL, "1: the block linears' GEMMs (qkv, attn_out, gate_up, down) in FP8, e4m3 weights and activations, the output gradients in --fp8_grads, one dynamic scale per tensor; lm_head and attention stay bf16", NOT_A_SWITCH, NULL},
    {"--fp8_grads", FLAG_CHOICE, ARG(loop.fp8_grads), "e5m2", 0, 0, FP8_GRADS_CHOICES, "--fp8 1: the output gradients' format: e5m2 (range: max 57344, 2 mantissa bits) or e4m3 (precision: 3 mantissa bits, max 448; each tensor's dynamic scale maps its amax to 448)", NOT_A_SWITCH, NULL},
    {"--total_batch_size", FLAG_INT, ARG(loop.total_batch_size), "0", 0, BIG_INT, NULL, "tokens per optimizer step on all ranks, a multiple of B*T*ranks: N / (B*T*ranks) micro-steps on each rank accumulate gradients (0: B*T*ranks, one micro-step)", NOT_A_SWITCH, NULL},
    {"--learning_rate", FLAG_FLOAT, ARG(optim.sched.peak_lr), "1e-5", 0.0, 10.0, NULL, "AdamW peak lr", NOT_A_SWITCH, NULL},
    {"--lr_schedule", FLAG_CHOICE, ARG(optim.sched.kind), "constant", 0, 0, "constant|cosine|linear|wsd", "lr after the warmup: constant; cosine or linear to lr*final_lr_frac at the last step; wsd: constant, then linear over the last decay_frac", NOT_A_SWITCH, NULL},
    {"--warmup_iters", FLAG_INT, ARG(optim.sched.warmup), "0", 0, BIG_INT, NULL, "steps of linear warmup from lr/N to lr", NOT_A_SWITCH, NULL},
    {"--final_lr_frac", FLAG_FLOAT, ARG(optim.sched.final_frac), "0", 0.0, 1.0, NULL, "cosine, linear, wsd: the last step's lr over the peak", NOT_A_SWITCH, NULL},
    {"--decay_frac", FLAG_FLOAT, ARG(optim.sched.decay_frac), "0.2", 0.0, 1.0, NULL, "wsd: the fraction of the run that decays", NOT_A_SWITCH, NULL},
    {"--weight_decay", FLAG_FLOAT, ARG(optim.weight_decay), "0", 0.0, 10.0, NULL, "AdamW decoupled weight decay (matrices and wte; not the norm weights)", NOT_A_SWITCH, NULL},
    {"--grad_clip", FLAG_FLOAT, ARG(optim.grad_clip), "0", 0.0, 1e9, NULL, "clip the global gradient L2 norm to this, as clip_grad_norm_ (0: off; also measures the norm, printed and logged)", NOT_A_SWITCH, NULL},
    {"--max_bad_steps", FLAG_INT, ARG(loop.max_bad_steps), "5", 1, BIG_INT, NULL, "NaN guard: stop after this many steps in a row skipped for a non-finite loss or grad norm", NOT_A_SWITCH, NULL},
    {"--optimizer_state", FLAG_CHOICE, ARG(optim.moments), "fp32", 0, 0, "fp32|bf16", "AdamW's m and v: fp32, or bf16 with stochastic rounding (22 instead of 30 bytes of AdamW traffic per weight, 4 instead of 8 of memory; the weights stay fp32)", NOT_A_SWITCH, NULL},
    {"--master_weights", FLAG_CHOICE, ARG(optim.weights), "fp32", 0, 0, "fp32|bf16", "the matmul weights: fp32 masters with bf16 copies, or bf16 only, AdamW's update rounded into them stochastically (4 bytes of memory less per weight; the norm weights and an untied wte stay fp32)", NOT_A_SWITCH, NULL},
    {"--offload_optimizer", FLAG_BOOL, ARG(optim.offload), "0", 0, 0, NULL, "1: AdamW's m and v in pinned host memory, read and written by the update kernels over PCIe (frees their GPU memory; each step moves them across the bus twice)", NOT_A_SWITCH, NULL},
    {"--beta1", FLAG_FLOAT, ARG(optim.beta1), "0.9", 0.0, 0.999999, NULL, "AdamW beta1", NOT_A_SWITCH, NULL},
    {"--beta2", FLAG_FLOAT, ARG(optim.beta2), "0.999", 0.0, 0.9999999403953552, NULL, "AdamW beta2", NOT_A_SWITCH, NULL},
    {"--eps", FLAG_FLOAT, ARG(optim.eps), "1e-8", 1e-30, 1.0, NULL, "AdamW eps", NOT_A_SWITCH, NULL},
    {"--seed", FLAG_U64, ARG(loop.seed), "42", 0, 9.2233720368547758e18, NULL, "random init seed, and the data order's (--shuffle 1)", NOT_A_SWITCH, NULL},
    {"--overfit_single_batch", FLAG_BOOL, ARG(loop.overfit_single_batch), "0", 0, 0, NULL, "train on the first batch only", NOT_A_SWITCH, NULL},
    {"--dry_run", FLAG_BOOL, ARG(loop.dry_run), "0", 0, 0, NULL, "1: check the flags, the input files and the outputs (every check made before the GPU), print the setup (the rank and its launcher, a line per output), and exit 0 without starting the GPU or writing anything", NOT_A_SWITCH, NULL},
    {"--log_file", FLAG_PATH, ARG(loop.log_file), NULL, 0, 0, NULL, "one JSON line per step (step, loss, lr, grad_norm with clipping, val_loss when measured, skipped, ms, tok_per_s, peak_mib; non-finite: null) and per sample; continued by --resume", NOT_A_SWITCH, NULL},
    {"--val_bin", FLAG_PATH, ARG(eval.val_bin), NULL, 0, 0, NULL, "llm.c token files for the val loss, read in order: a file, a glob or a comma list (default: NAME_val.bin beside an --input_bin NAME_train.bin or 'NAME_train_*.bin', else the embedded val split)", NOT_A_SWITCH, NULL},
    {"--val_every", FLAG_INT, ARG(eval.val_every), "0", 0, BIG_INT, NULL, "val loss every N steps and after the last (0: never)", NOT_A_SWITCH, NULL},
    {"--val_tokens", FLAG_INT, ARG(eval.val_tokens), "32768", 1, BIG_INT, NULL, "tokens of val data per val loss (whole batches of B*T)", NOT_A_SWITCH, NULL},
    {"--eval_file", FLAG_PATH, ARG(eval.eval_file), NULL, 0, 0, NULL, "multiple-choice eval set (HellaSwag's format, written by prepare_data.py --hellaswag): with --eval_every, the accuracy of picking each example's ending of lowest mean loss", NOT_A_SWITCH, NULL},
    {"--eval_every", FLAG_INT, ARG(eval.eval_every), "0", 0, BIG_INT, NULL, "the --eval_file accuracy every N steps and after the last (0: never)", NOT_A_SWITCH, NULL},
    {"--eval_examples", FLAG_INT, ARG(eval.eval_examples), "0", 0, BIG_INT, NULL, "examples of --eval_file each eval scores, from its first (0: all)", NOT_A_SWITCH, NULL},
    {"--sample_every", FLAG_INT, ARG(eval.sample_every), "0", 0, BIG_INT, NULL, "generate text from BOS every N steps and after the last, printed decoded (0: never)", NOT_A_SWITCH, NULL},
    {"--sample_tokens", FLAG_INT, ARG(eval.sample_tokens), "32", 1, BIG_INT, NULL, "tokens generated per sample (at most sequence_length - 1)", NOT_A_SWITCH, NULL},
    {"--temperature", FLAG_FLOAT, ARG(eval.temperature), "1", 0.0, 100.0, NULL, "sampling temperature (0: greedy)", NOT_A_SWITCH, NULL},
    {"--top_k", FLAG_INT, ARG(eval.top_k), "0", 0, BIG_INT, NULL, "sample from the k most likely tokens (0: all)", NOT_A_SWITCH, NULL},
    {"--checkpoint_dir", FLAG_PATH, ARG(ckpt.dir), NULL, 0, 0, NULL, "save checkpoints there (PATH/step_N/, PATH/latest), always after the last step", NOT_A_SWITCH, NULL},
    {"--checkpoint_every", FLAG_INT, ARG(ckpt.every), "0", 0, BIG_INT, NULL, "also save every N steps (0: only after the last)", NOT_A_SWITCH, NULL},
    {"--checkpoint_keep", FLAG_INT, ARG(ckpt.keep), "2", 1, BIG_INT, NULL, "complete checkpoints kept, older ones deleted once a newer one is complete", NOT_A_SWITCH, NULL},
    {"--save_hf_checkpoints", FLAG_INT, ARG(ckpt.hf), "0", 0, 1, NULL, "1: each checkpoint folder also holds hf/, the model as --save_hf writes it (--save_hf_dtype, --hf_dir's tokenizer files); deleted with its checkpoint", NOT_A_SWITCH, NULL},
    {"--resume", FLAG_PATH, ARG(ckpt.resume), NULL, 0, 0, NULL, "continue a run: a checkpoint folder, or a --checkpoint_dir (its newest complete checkpoint)", NOT_A_SWITCH, NULL},
    {"--rendezvous", FLAG_PATH, ARG(dist.rendezvous), NULL, 0, 0, NULL, "several ranks: how they share NCCL's id, file:PATH (a new file every rank sees) or tcp:HOST:PORT (rank 0's host, a free port)", NOT_A_SWITCH, NULL},
    {"--nccl_timeout", FLAG_INT, ARG(dist.timeout_s), "300", 1, 86400, NULL, "several ranks: seconds a rank waits for the others (the rendezvous, NCCL's start, a step) before it stops the run", NOT_A_SWITCH, NULL},
    {"--dtype", FLAG_ONLY, 0, NULL, 0, 0, "bfloat16", "accepted for InfiniTrain's command line: the only precision (bf16 matmuls, fp32 master weights)", NOT_A_SWITCH, NULL},
    {"--device", FLAG_ONLY, 0, NULL, 0, 0, "cuda", "accepted for InfiniTrain's command line: the only device", NOT_A_SWITCH, NULL},
    LLAMA3_SWITCHES(SWITCH_FLAG)
};
#undef SWITCH_FLAG
#undef ARG
#define NUM_FLAGS ((int)(sizeof(FLAGS) / sizeof(FLAGS[0])))

// A number as the flag's value must start with a digit, '-' or '.': strtoll and strtod would also
// take leading spaces and '+', which a typo can produce.
static inline int number_start(const char* s) { return (*s >= '0' && *s <= '9') || *s == '-' || *s == '.'; }

static inline int parse_int(const char* flag, const char* s, long long lo, long long hi, long long* out, char* err) {
    char* end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!number_start(s) || errno || end == s || *end || v < lo || v > hi)
        return l3_fail(err, "%s: bad value '%s' (an integer in [%lld, %lld])", flag, s, lo, hi);
    *out = v;
    return 0;
}

// The range holds for the value as the trainer uses it, a 32-bit float: --beta2 0.99999999 rounds
// to 1 (AdamW's bias correction would divide by zero), --learning_rate 1e-50 to 0.
static inline int parse_float(const char* flag, const char* s, double lo, double hi, float* out, char* err) {
    char* end;
    errno = 0;
    double v = strtod(s, &end);
    float f = (float)v;
    if (!number_start(s) || errno || end == s || *end || !(f >= lo && f <= hi))
        return l3_fail(err, "%s: bad value '%s' (a number in [%.10g, %.10g] as a 32-bit float)", flag, s, lo, hi);
    if (v != 0.0 && !(fabsf(f) >= 1.17549435e-38f)) // 0 or subnormal in float: FLT_MIN
        return l3_fail(err, "%s: bad value '%s' (too small for a 32-bit float: it becomes %g)", flag, s, f);
    *out = f;
    return 0;
}

// A file flag's value: a path, not empty.
static inline int parse_path(const char* flag, const char* s, const char** out, char* err) {
    if (!*s) return l3_fail(err, "%s: empty path", flag);
    *out = s;
    return 0;
}

static inline int parse_bool(const char* flag, const char* s, int* out, char* err) {
    if (!strcmp(s, "1") || !strcmp(s, "true")) *out = 1;
    else if (!strcmp(s, "0") || !strcmp(s, "false")) *out = 0;
    else return l3_fail(err, "%s: bad value '%s' (0, 1, true or false)", flag, s);
    return 0;
}

// The index of `val` among choices "a|b|c", or -1.
static inline int choice_index(const char* choices, const char* val) {
    size_t n = strlen(val);
    for (int i = 0; *choices; i++) {
        const char* bar = strchr(choices, '|');
        size_t len = bar ? (size_t)(bar - choices) : strlen(choices);
        if (len == n && !strncmp(choices, val, n)) return i;
        if (!bar) break;
        choices = bar + 1;
    }
    return -1;
}

// Parses `val` for flag f into its field of *a; `check_range` is off for the table's own defaults.
static inline int flag_set(TrainArgs* a, const FlagSpec* f, const char* val, int check_range, char* err) {
    char* field = (char*)a + f->offset;
    double lo = check_range ? f->lo : -INFINITY, hi = check_range ? f->hi : INFINITY;
    long long v = 0;
    switch (f->kind) {
    case FLAG_INT:
        if (parse_int(f->name, val, check_range ? (long long)f->lo : INT_MIN, check_range ? (long long)f->hi : INT_MAX,
                      &v, err))
            return -1;
        *(int*)field = (int)v;
        return 0;
    case FLAG_U64:
        if (parse_int(f->name, val, 0, 0x7fffffffffffffffLL, &v, err)) return -1;
        *(unsigned long long*)field = (unsigned long long)v;
        return 0;
    case FLAG_FLOAT: return parse_float(f->name, val, lo, hi, (float*)field, err);
    case FLAG_BOOL: return parse_bool(f->name, val, (int*)field, err);
    case FLAG_PATH: return parse_path(f->name, val, (const char**)field, err);
    case FLAG_CHOICE: {
        int i = choice_index(f->choices, val);
        if (i < 0) return l3_fail(err, "%s: bad value '%s' (%s)", f->name, val, f->choices);
        *(int*)field = i;
        return 0;
    }
    case FLAG_ONLY:
        return strcmp(val, f->choices) ? l3_fail(err, "%s: '%s' is not supported (only %s)", f->name, val, f->choices)
                                       : 0;
    }
    return l3_fail(err, "%s: unknown flag kind", f->name);
}

static inline const FlagSpec* flag_find(const char* name) {
    for (int i = 0; i < NUM_FLAGS; i++)
        if (!strcmp(FLAGS[i].name, name)) return &FLAGS[i];
    return NULL;
}

// Edit distance between two flag names (insertions, deletions, substitutions), capped at 3.
static inline int flag_distance(const char* x, const char* y) {
    int nx = (int)strlen(x), ny = (int)strlen(y), row[64], prev;
    if (nx > 62 || ny > 62 || abs(nx - ny) > 2) return 3;
    for (int j = 0; j <= ny; j++) row[j] = j;
    for (int i = 1; i <= nx; i++) {
        prev = row[0], row[0] = i;
        for (int j = 1; j <= ny; j++) {
            int sub = prev + (x[i - 1] != y[j - 1]), del = row[j] + 1, ins = row[j - 1] + 1, was = row[j];
            row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            prev = was;
        }
    }
    return row[ny] < 3 ? row[ny] : 3;
}

// The flag a typo most likely meant: the nearest name within 2 edits, or NULL.
static inline const FlagSpec* flag_nearest(const char* name) {
    const FlagSpec* best = NULL;
    int best_d = 3;
    for (int i = 0; i < NUM_FLAGS; i++) {
        int d = flag_distance(name, FLAGS[i].name);
        if (d < best_d) best = &FLAGS[i], best_d = d;
    }
    return best;
}

// Every field at the table's default as typed (total_batch_size 0 means "B*T"); the rest zero.
static inline TrainArgs flag_defaults(void) {
    TrainArgs a;
    memset(&a, 0, sizeof(a));
    char err[L3_ERR_LEN];
    for (int i = 0; i < NUM_FLAGS; i++)
        if (FLAGS[i].def) flag_set(&a, &FLAGS[i], FLAGS[i].def, 0, err);
    return a;
}

// Values that follow from others once every flag is read: --total_batch_size not given (0) is one
// micro-step of B*T tokens on each rank, as in llm.c (a total too large for an int is refused by
// train_args_check).
static inline void train_args_resolve(TrainArgs* a, int world) {
    LoopConfig* l = &a->loop;
    long long total = (long long)l->batch_size * l->sequence_length * world;
    l->world = world;
    if (l->total_batch_size == 0 && total <= INT_MAX) l->total_batch_size = (int)total;
}

// The arguments of a command line with no flags, on one rank.
static inline TrainArgs train_args_default(void) {
    TrainArgs a = flag_defaults();
    train_args_resolve(&a, 1);
    return a;
}

// Micro-steps each rank runs per optimizer step: the total batch over B*T*ranks (train_args_check
// has refused one that does not divide).
static inline int micro_steps(const LoopConfig* l) {
    return l->total_batch_size / (l->batch_size * l->sequence_length * l->world);
}

// The run as the flags give it for model c (pointing into `a`, which must outlive it).
static inline RunConfig run_config(const TrainArgs* a, const Llama3Config* c) {
    const LoopConfig* l = &a->loop;
    RunConfig r = {l->batch_size, l->sequence_length, micro_steps(l), l->recompute, l->classifier_chunk, l->fp8,
                   l->fp8_grads, &a->optim, &a->sw, l->doc_mask, bos_token(l, c)};
    return r;
}

static inline void print_usage(FILE* f, const char* prog) {
    static const char* const META[] = {"N", "N", "F", "0/1", "PATH", "MODE", "VALUE"};
    fprintf(f, "usage: %s [flags]  (--flag value or --flag=value)\n  %-26s the usage text, and exit\n", prog,
            "--help, -h");
    fprintf(f, "  %-26s each optimisation's ablation settings, one per line, and exit\n", "--list_switches");
    for (int i = 0; i < NUM_FLAGS; i++) {
        const FlagSpec* g = &FLAGS[i];
        char head[64];
        if (g->scope && (i == 0 || !FLAGS[i - 1].scope))
            fprintf(f, "optimisations (all on by default; off for the ablation):\n");
        snprintf(head, sizeof(head), "%s %s", g->name, g->kind == FLAG_ONLY ? g->choices : META[g->kind]);
        fprintf(f, "  %-26s %s", head, g->help);
        if (g->kind == FLAG_CHOICE) fprintf(f, " (%s)", g->choices);
        // [default; lo..hi]: the default as typed (none for a path; deferred_adamw's -1 is "not
        // given", which its help explains), and a number's range
        bool has_def = g->def && strcmp(g->def, "-1"), numeric = g->kind == FLAG_INT || g->kind == FLAG_FLOAT;
        if (numeric) fprintf(f, " [%s%s%.10g..%.10g]", has_def ? g->def : "", has_def ? "; " : "", g->lo, g->hi);
        else if (has_def) fprintf(f, " [%s]", g->def);
        fprintf(f, "\n");
    }
}

// The value of flag f in *a, as it would be typed.
static inline void flag_format(const TrainArgs* a, const FlagSpec* f, char* out, size_t len) {
    const char* field = (const char*)a + f->offset;
    switch (f->kind) {
    case FLAG_INT: snprintf(out, len, "%d", *(const int*)field); break;
    case FLAG_U64: snprintf(out, len, "%llu", *(const unsigned long long*)field); break;
    case FLAG_FLOAT: snprintf(out, len, "%g", *(const float*)field); break;
    case FLAG_BOOL: snprintf(out, len, "%d", *(const int*)field); break;
    case FLAG_PATH: snprintf(out, len, "%s", *(const char* const*)field ? *(const char* const*)field : "-"); break;
    case FLAG_CHOICE: {
        const char* c = f->choices;
        for (int i = *(const int*)field; i > 0 && strchr(c, '|'); i--) c = strchr(c, '|') + 1;
        snprintf(out, len, "%.*s", (int)(strchr(c, '|') ? strchr(c, '|') - c : (long)strlen(c)), c);
        break;
    }
    case FLAG_ONLY: snprintf(out, len, "%s", f->choices); break;
    }
}

// The run's flags, every row of the table with its value: "flags: --num_iteration 100 | ..." and
// "optimisations: ..." (as given; main prints which of them take effect).
static inline void train_args_print(FILE* f, const TrainArgs* a) {
    char value[256];
    for (int group = 0; group < 2; group++) {
        fprintf(f, "%s", group ? "optimisations:" : "flags:");
        for (int i = 0; i < NUM_FLAGS; i++) {
            if ((FLAGS[i].scope != NOT_A_SWITCH) != group || FLAGS[i].kind == FLAG_ONLY) continue;
            flag_format(a, &FLAGS[i], value, sizeof(value));
            fprintf(f, " %s %s |", FLAGS[i].name + 2, value);
        }
        fprintf(f, "\n");
    }
}

// The value of switch f (a row with a scope) in *sw.
static inline int switch_value(const Switches* sw, const FlagSpec* f) {
    return *(const int*)((const char*)sw + (f->offset - offsetof(TrainArgs, sw)));
}

// Every setting of an optimisation other than its default, one per line ("--flash_attention 0"),
// in the table's order: the scripts' list of what to test and ablate (run_tests.sh, bench.sh,
// sanitize.sh read it from the binary).
static inline void print_switches(FILE* f) {
    for (int i = 0; i < NUM_FLAGS; i++) {
        if (!FLAGS[i].scope) continue;
        char values[256];
        snprintf(values, sizeof(values), "%s", FLAGS[i].ablation_values);
        for (char* v = strtok(values, " "); v; v = strtok(NULL, " ")) fprintf(f, "%s %s\n", FLAGS[i].name, v);
    }
}

// An argument that is no flag. After a path, most likely a glob or a path with a space that the shell
// split (--input_bin mix_*.bin reaches the trainer as --input_bin mix_a.bin mix_b.bin): quoted, it
// comes whole (the trainer expands a glob of token files itself).
static inline int unexpected_argument(const char* arg, const FlagSpec* prev, const char* prev_value, char* err) {
    if (prev && prev->kind == FLAG_PATH)
        return l3_fail(err, "unexpected argument '%s' after %s %s: a path flag takes one value; quote a glob "
                       "('data/train_*.bin', which the trainer expands) or a path with spaces", arg, prev->name,
                       prev_value);
    return l3_fail(err, "unexpected argument '%s'", arg);
}

// --flag value or --flag=value; a bool flag given without a value (next arg absent or a flag)
// means true. --help or -h (--list_switches) stops the parse with a->help (a->list_switches) set.
// The command line of one of `world` ranks (1: a run on one GPU).
static inline int train_args_parse(TrainArgs* a, int argc, char** argv, int world, char* err) {
    *a = flag_defaults();
    const FlagSpec* prev = NULL; // the flag before, and its value
    const char* prev_value = NULL;
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h") || !strcmp(arg, "--list_switches")) {
            *(strcmp(arg, "--list_switches") ? &a->help : &a->list_switches) = 1;
            return 0;
        }
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') return unexpected_argument(arg, prev, prev_value, err);
        char flag[128];
        const char* eq = strchr(arg, '=');
        const char* val;
        size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
        snprintf(flag, sizeof(flag), "%.*s", (int)(n < sizeof(flag) - 1 ? n : sizeof(flag) - 1), arg);
        const FlagSpec* f = flag_find(flag);
        if (!f) {
            const FlagSpec* near = flag_nearest(flag);
            if (near) return l3_fail(err, "unknown flag '%s': did you mean %s?", flag, near->name);
            return l3_fail(err, "unknown flag '%s'", flag);
        }
        if (eq) val = eq + 1;
        else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) val = argv[++i];
        else if (f->kind == FLAG_BOOL) val = "1";
        else return l3_fail(err, "%s: missing value", flag);
        if (flag_set(a, f, val, 1, err)) return -1;
        prev = f, prev_value = val;
    }
    train_args_resolve(a, world);
    return 0;
}

// ---- parameter layout ----
// All fp32 master weights live in one block, in this order. The matmul weights (lm_head to
// down) are contiguous so their bf16 shadow copies form one block that one Adam launch writes;
// the norm weights come last (read in fp32 by the RMSNorm kernels, no shadow); wte comes first
// (its Adam is the sparse row update). Stacked tensors hold all L layers, layer-major.
// [tied embeddings] With tied_embeddings, lm_head is empty (0 elements) and the head GEMMs read
// wte (`head`), whose bf16 shadow then opens the shadow block (shadow_begin = wte); its gradient
// stays fp32 (the embedding backward adds rows to the head GEMM's), outside [matmul_begin, matmul_end).
// gate_up packs each layer's gate rows then up rows: one GEMM computes both in the forward pass,
// and one GEMM with K = 2F computes their input gradient in the backward pass.
enum {
    P_WTE,        // (V, C) token embedding
    P_LM_HEAD,    // (V, C) untied output projection; empty when tied
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
    int slices[NUM_PARAM_TENSORS];        // layers of a stacked tensor, 1 if unstacked, 0 if empty (tied lm_head)
    size_t total;
    int head;                        // the tensor the head GEMMs read: P_LM_HEAD, or P_WTE when tied
    size_t shadow_begin;             // [shadow weights] every GEMM's weight: [shadow_begin, matmul_end), from head
    size_t matmul_begin, matmul_end; // the matmul weights but a tied wte, [lm_head, down]: bf16 gradients
    size_t norm_begin;               // norm weights run from here to total
} ParamLayout;


static inline ParamLayout param_layout(const Llama3Config* c) {
    ParamLayout p;
    size_t V = c->vocab_size, C = c->n_embd, L = c->n_layer, F = c->ffn_hidden, QKV = qkv_dim(c);
    size_t per_layer[NUM_PARAM_TENSORS] = {V * C, V * C, QKV * C, C * C, 2 * F * C, C * F, C, C, C};
    int stacked[NUM_PARAM_TENSORS] = {0, 0, 1, 1, 1, 1, 1, 1, 0};
    if (c->tied_embeddings) per_layer[P_LM_HEAD] = 0;
    size_t off = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        p.layer_size[i] = per_layer[i];
        p.slices[i] = per_layer[i] == 0 ? 0 : stacked[i] ? (int)L : 1;
        p.size[i] = per_layer[i] * p.slices[i];
        p.offset[i] = off;
        off += p.size[i];
    }
    p.total = off;
    p.head = c->tied_embeddings ? P_WTE : P_LM_HEAD;
    p.shadow_begin = p.offset[p.head];
    p.matmul_begin = p.offset[P_LM_HEAD];
    p.matmul_end = p.offset[P_ATTN_NORM];
    p.norm_begin = p.offset[P_ATTN_NORM];
    return p;
}

// ---- the tensor table ----
// The step handles the weights slice by slice: a whole unstacked tensor, or one layer of a stacked
// one. Where each slice sits in each of the step's per-slice arrays is decided here, once, from the
// layout: its update group (when AdamW takes it), its slot of partial sums of squares (clipping),
// its FP8 slot (a block linear's scales) and its FP8 buffers' places. Nothing else depends on the
// order of the P_* enum, or counts slots.
#define FP8_LINEARS 4 // [fp8] the block linears whose GEMMs read FP8: qkv, attn_out, gate_up, down

typedef struct {
    int tensor, layer;
    size_t offset, n;      // in the parameter block
    int out, in;           // a matmul weight's (out, in) as its GEMMs read it (wte: as a tied head); 0 for a norm
    int group;             // the AdamW update group: wte 0, layer l 1 + l, the head (final norm, lm_head) last
    int sumsq_slot;        // [clipping] its partial sums of squares: wte 0, lm_head 1 (kept, empty, when tied),
                           // the final norm 2, then layer by layer qkv .. ffn_norm
    int fp8_slot;          // [fp8] a block linear's: layer * FP8_LINEARS + which; -1 for every other slice
    size_t fp8_weight_at;  // [fp8] its place among the block linears' FP8 copies (elements)
    size_t fp8_input_cols; // [fp8] where its input's transpose starts among every layer's, in columns of N tokens
} TensorSlice;

typedef struct {
    TensorSlice* slice;           // in the parameter block's order: a stacked tensor's layers consecutive
    int n_slices;
    int first[NUM_PARAM_TENSORS]; // each tensor's layer-0 slice (its layer l: first + l); -1 when empty
    int* in_group;                // the slices group by group: group g's are in_group[group_start[g] ..
    int* group_start;             // group_start[g + 1]), in the order AdamW takes them
    int n_groups, n_sumsq_slots, n_fp8_slots;
    size_t fp8_weights;           // [fp8] elements of the block linears' weights
    size_t fp8_input_cols;        // [fp8] columns of every layer's block linear inputs: L (3C + F)
} TensorTable;

// Within a group, AdamW takes its slices in this order (the backward writes a layer's linears'
// gradients before its norms'; the head's norm before lm_head).
static const int GROUP_ORDER[NUM_PARAM_TENSORS] = {P_WTE, P_QKV, P_ATTN_OUT, P_GATE_UP, P_DOWN,
                                                   P_ATTN_NORM, P_FFN_NORM, P_FINAL_NORM, P_LM_HEAD};

static inline TensorTable tensor_table(const Llama3Config* c) {
    ParamLayout p = param_layout(c);
    TensorTable tab;
    memset(&tab, 0, sizeof(tab));
    int L = c->n_layer, C = c->n_embd, F = c->ffn_hidden, V = c->vocab_size;
    const int out[NUM_PARAM_TENSORS] = {V, V, qkv_dim(c), C, 2 * F, C, 0, 0, 0};
    const int in[NUM_PARAM_TENSORS] = {C, C, C, C, C, F, 0, 0, 0};
    const int per_layer = P_FFN_NORM - P_QKV + 1; // a layer's tensors, each with a sum-of-squares slot
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) tab.n_slices += p.slices[t];
    tab.slice = (TensorSlice*)malloc(sizeof(TensorSlice) * tab.n_slices);
    tab.n_groups = L + 2;
    tab.n_sumsq_slots = 3 + L * per_layer;
    tab.n_fp8_slots = L * FP8_LINEARS;
    tab.fp8_input_cols = (size_t)L * (3 * C + F);
    int k = 0;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        tab.first[t] = p.slices[t] ? k : -1;
        for (int l = 0; l < p.slices[t]; l++, k++) {
            TensorSlice* s = &tab.slice[k];
            bool stacked = t >= P_QKV && t <= P_FFN_NORM, linear = t >= P_QKV && t <= P_DOWN;
            s->tensor = t, s->layer = l;
            s->offset = p.offset[t] + (size_t)l * p.layer_size[t], s->n = p.layer_size[t];
            s->out = out[t], s->in = in[t];
            s->group = t == P_WTE ? 0 : stacked ? 1 + l : L + 1;
            s->sumsq_slot = stacked ? 3 + l * per_layer + (t - P_QKV) : t == P_FINAL_NORM ? 2 : t;
            s->fp8_slot = linear ? l * FP8_LINEARS + (t - P_QKV) : -1;
            s->fp8_weight_at = linear ? tab.fp8_weights : 0;
            s->fp8_input_cols = linear ? (size_t)l * (3 * C + F) + (size_t)(t - P_QKV) * C : 0;
            if (linear) tab.fp8_weights += s->n;
        }
    }
    // the groups: each one's size, where each starts, then the slices dealt out in GROUP_ORDER
    tab.in_group = (int*)malloc(sizeof(int) * tab.n_slices);
    tab.group_start = (int*)calloc(tab.n_groups + 1, sizeof(int));
    int* filled = (int*)calloc(tab.n_groups, sizeof(int));
    for (int j = 0; j < tab.n_slices; j++) tab.group_start[tab.slice[j].group + 1]++;
    for (int g = 0; g < tab.n_groups; g++) tab.group_start[g + 1] += tab.group_start[g];
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        int t = GROUP_ORDER[i];
        for (int l = 0; l < p.slices[t]; l++) {
            int g = tab.slice[tab.first[t] + l].group;
            tab.in_group[tab.group_start[g] + filled[g]++] = tab.first[t] + l;
        }
    }
    free(filled);
    return tab;
}
static inline void tensor_table_free(TensorTable* tab) {
    free(tab->slice), free(tab->in_group), free(tab->group_start);
    memset(tab, 0, sizeof(*tab));
}
// Tensor `tensor`'s slice of layer `layer` (0 for an unstacked tensor).
static inline const TensorSlice* slice_of(const TensorTable* tab, int tensor, int layer) {
    return &tab->slice[tab->first[tensor] + layer];
}

// ---- the step's plan ----
// When each AdamW update group runs, decided once for the run from the switches and clipping: the
// step (train_llama3.cu step_work) only reads it. Update groups, in the order the forward reads them:
// wte (0), layer l (1 + l), the head (final norm and lm_head, n_layer + 1).
typedef enum {
    ADAMW_OVERLAPPED,     // [streams] on the optimizer stream as soon as the last backward has written the group
    ADAMW_DEFERRED,       // [deferred AdamW] at the start of the next step, beside its forward, which waits for it
    ADAMW_AFTER_BACKWARD, // on the main stream after the backward pass (every group: one pass over the block)
    ADAMW_SHARDED,        // [data parallel] reduce-scattered on the optimizer stream as the last backward writes
                          // it, then this rank's part updated and all-gathered (after the norm, with clipping)
} AdamWTiming;
static const char* const ADAMW_TIMING_NAMES[] = {"overlapped with the backward", "deferred to the next step",
                                                 "after the backward", "sharded over the ranks (ZeRO-1)"};
// [NaN guard] Which guard counts the step (good, or skipped: StepStats), once all that decides a skip
// is known: the loss guard on one rank without clipping; on several, after the ranks agree on the
// loss and the skip flag; with clipping, the norm's guard (a non-finite norm skips the step too).
typedef enum { COUNTED_BY_LOSS_GUARD, COUNTED_AFTER_RANKS, COUNTED_BY_NORM } StepCounter;
typedef struct {
    int n_groups;
    AdamWTiming timing[LLAMA3_MAX_LAYERS + 2]; // per update group
    bool measure_norm;   // [clipping] the last backward sums the gradients' squares as they become ready; no
                         // AdamW may start before the global norm, so none is overlapped
    bool after_backward; // every group ADAMW_AFTER_BACKWARD
    bool any_deferred;   // some group ADAMW_DEFERRED: anything that reads the weights between steps (a save,
                         // the val loss, a sample, the end of the run) first applies them (a flush)
    bool use_graph;      // [graphs] steps 2.. replay one CUDA graph
    int world;           // ranks: above 1 every group is ADAMW_SHARDED
    StepCounter counted_by;
} StepPlan;

// Layers whose AdamW is deferred without clipping: --deferred_adamw's value (12 when not given),
// capped at the model's layers (a 2-layer model defers both).
static inline int deferred_layers(const Switches* sw, int n_layer) {
    int k = sw->deferred_adamw >= 0 ? sw->deferred_adamw : 12;
    return k < n_layer ? k : n_layer;
}

// The plan. AdamW overlaps the backward with --overlap_optimizer (else it runs after it). Deferring
// also needs no gradient zeroing (zeroing at the next step's start would clear the gradients the
// deferred AdamW reads): layers 0..K-1 without clipping; with clipping, which measures the norm
// instead of overlapping, every group (or, when it cannot defer, all of AdamW after the backward).
// A graph cannot capture the ablation's per-launch shape copies from pageable host memory. Under
// several ranks every group is reduced and updated by shards as the backward writes it (nothing is
// deferred: the all-gathers end the step).
static inline StepPlan step_plan(const Switches* sw, const OptimConfig* o, int n_layer, int world) {
    StepPlan p;
    memset(&p, 0, sizeof(p));
    assert(n_layer >= 1 && n_layer <= LLAMA3_MAX_LAYERS); // (config_check bounds every model's)
    p.n_groups = n_layer + 2;
    p.measure_norm = o->grad_clip > 0;
    bool can_defer = sw->overlap_optimizer && sw->grad_zeroing == GRAD_ZERO_NONE;
    int k = deferred_layers(sw, n_layer);
    for (int g = 0; g < p.n_groups; g++) {
        if (world > 1) p.timing[g] = ADAMW_SHARDED;
        else if (!sw->overlap_optimizer || (p.measure_norm && !can_defer)) p.timing[g] = ADAMW_AFTER_BACKWARD;
        else if (can_defer && (p.measure_norm || (g >= 1 && g < 1 + k))) p.timing[g] = ADAMW_DEFERRED;
        else p.timing[g] = ADAMW_OVERLAPPED;
    }
    p.after_backward = p.timing[0] == ADAMW_AFTER_BACKWARD; // (all groups or none)
    for (int g = 0; g < p.n_groups; g++) p.any_deferred |= p.timing[g] == ADAMW_DEFERRED;
    p.use_graph = sw->cuda_graph && sw->metadata_by_value;
    p.world = world;
    p.counted_by = p.measure_norm ? COUNTED_BY_NORM : world > 1 ? COUNTED_AFTER_RANKS : COUNTED_BY_LOSS_GUARD;
    return p;
}

// The name of update group g: "wte", "layer 3", "head".
static inline const char* group_name(const StepPlan* p, int g, char* out, size_t len) {
    if (g == 0) snprintf(out, len, "wte");
    else if (g == p->n_groups - 1) snprintf(out, len, "head");
    else snprintf(out, len, "layer %d", g - 1);
    return out;
}

// One line: each timing with its groups as runs ("deferred to the next step: layer 0..layer 11"),
// then the norm and the graph.
static inline void step_plan_print(FILE* f, const StepPlan* p) {
    const char* sep = " AdamW ";
    fprintf(f, "step plan:");
    for (int t = ADAMW_OVERLAPPED; t <= ADAMW_SHARDED; t++) {
        int runs = 0;
        for (int g = 0; g < p->n_groups; g++) {
            if (p->timing[g] != (AdamWTiming)t || (g > 0 && p->timing[g - 1] == (AdamWTiming)t)) continue;
            int end = g; // the run of groups g..end
            while (end + 1 < p->n_groups && p->timing[end + 1] == (AdamWTiming)t) end++;
            char first[32], last[32];
            if (runs++ == 0) fprintf(f, "%s%s: ", sep, ADAMW_TIMING_NAMES[t]), sep = " | ";
            else fprintf(f, ", ");
            fprintf(f, "%s", group_name(p, g, first, sizeof(first)));
            if (end > g) fprintf(f, "..%s", group_name(p, end, last, sizeof(last)));
        }
    }
    fprintf(f, " | gradient norm %s | %s\n", p->measure_norm ? "measured (clipping)" : "not measured",
            p->use_graph ? "steps 2.. from one CUDA graph" : "every step launched from the host");
}

// ---- RoPE ----
// Inverse frequencies as HF transformers computes them for rope_type "llama3" (fp32 results),
// and the (T, HD/2) cos/sin table of angle = fp32(pos * inv_freq), as its rotary embedding does.
static inline void rope_inv_freq(const Llama3Config* c, float* inv_freq) {
    int HD = c->n_embd / c->n_head;
    const double factor = c->rope_factor, low_ff = 1.0, high_ff = 4.0, old_ctx = 8192.0;
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

// cos and sin of each fp32 angle are rounded once from double (scripts/test_rope.py holds the table to HF's
// at every position up to 131,071).
static inline void rope_table(const Llama3Config* c, int T, float* cos_out, float* sin_out) {
    int half = c->n_embd / c->n_head / 2;
    float* inv_freq = (float*)malloc(sizeof(float) * half);
    rope_inv_freq(c, inv_freq);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            float angle = (float)t * inv_freq[i];
            cos_out[(size_t)t * half + i] = (float)cos((double)angle);
            sin_out[(size_t)t * half + i] = (float)sin((double)angle);
        }
    free(inv_freq);
}

// ---- model files ----
// Two formats share magic 20240803 and version 3 (fp32); dev/FORMATS.md sections 1 and 2.
// seed: InfiniTrain's llmc_filepath file, 1024-byte header, tensors in the order of
//       seed_file_segments below. llmc: llm.c's llama3 branch, 2048-byte header, with zero biases.
// A file is read as a list of segments: `count` floats at `file_offset` that go to
// `param_offset` in our layout, or that must be zero (llm.c's biases, param_offset < 0).

typedef enum { MODEL_FILE_SEED = 1, MODEL_FILE_LLMC = 2, MODEL_FILE_LLMC_BF16 = 3, MODEL_FILE_HF = 4 } ModelFileFormat;
static inline const char* model_format_name(ModelFileFormat f) {
    return f == MODEL_FILE_SEED   ? "seed (InfiniTrain llmc_filepath, 1024-byte header)"
           : f == MODEL_FILE_LLMC ? "llm.c llama3 (2048-byte header, zero biases)"
           : f == MODEL_FILE_HF   ? "Hugging Face folder (config.json, safetensors; q and k rows reordered)"
                                  : "llm.c llama3 bf16 (version 5, 2048-byte header, zero biases; widened to fp32)";
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
    size_t end;     // file offset after the last segment = expected file size
    int elem_bytes; // 4: fp32; 2: bf16 (llm.c version 5)
} SegmentList;

static inline void seg_push(SegmentList* s, size_t* pos, size_t count, long long param_offset, const char* name) {
    s->seg[s->n++] = (FileSegment){*pos, count, param_offset, name};
    *pos += count * s->elem_bytes;
}

// The seed format's order: wte, attn_norm(L), qkv(L), attn_out(L), ffn_norm(L), gate(L), up(L),
// down(L), final_norm, lm_head (absent when tied). Gate and up of layer l land in the halves of gate_up[l].
// Also the order of the gradient and parameter blocks of the reference state file.
static inline SegmentList seed_file_segments(const Llama3Config* c, size_t header_bytes) {
    ParamLayout p = param_layout(c);
    SegmentList s = {(FileSegment*)malloc(sizeof(FileSegment) * (8 + 2 * c->n_layer)), 0, 0, 4};
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
    if (!c->tied_embeddings) seg_push(&s, &pos, p.size[P_LM_HEAD], p.offset[P_LM_HEAD], "lm_head");
    s.end = pos;
    return s;
}

// llm.c's order: wte, lm_head, then each weight (L-stacked) followed by its zero bias; its fc
// weight already packs gate rows then up rows per layer, as our gate_up does. elem_bytes: 4 for
// version 3 (fp32), 2 for version 5 (bf16). Untied only (llmc_header_config).
static inline SegmentList llmc_file_segments(const Llama3Config* c, size_t header_bytes, int elem_bytes) {
    ParamLayout p = param_layout(c);
    SegmentList s = {(FileSegment*)malloc(sizeof(FileSegment) * 16), 0, 0, elem_bytes};
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

// What a file is, for messages ("is a directory").
static inline const char* file_kind(mode_t mode) {
    return S_ISREG(mode) ? "a regular file" : S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a pipe or FIFO"
           : S_ISCHR(mode) ? "a character device" : S_ISBLK(mode) ? "a block device" : S_ISSOCK(mode) ? "a socket"
                                                                                       : "not a regular file";
}

// Opens `path` (a `what`: "model file", "token file") for reading if it is a regular file, with its
// size. Anything else is refused by name: a FIFO would block in open (so it is opened
// non-blocking and looked at first), a directory reads as empty, a pipe such as <(cat f) has no
// size to check against the file's header.
static inline FILE* open_regular(const char* path, const char* what, long long* size, char* err) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) {
        l3_fail(err, "%s: cannot open %s: %s", path, what, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        l3_fail(err, "%s: cannot open %s: %s", path, what, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        l3_fail(err, "%s: is %s, not a %s (a regular file, whose size is checked against its header)", path,
                file_kind(st.st_mode), what);
        return NULL;
    }
    *size = (long long)st.st_size;
    FILE* f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        l3_fail(err, "%s: cannot open %s: %s", path, what, strerror(errno));
    }
    return f;
}

// A file shorter than its format's header is no file of that format (a text file, an empty one): said
// so by every reader, rather than "truncated".
static inline int shorter_than_header(const char* path, const char* what, size_t size, size_t header, char* err) {
    return l3_fail(err, "%s: not a %s (%zu bytes, shorter than the %zu-byte header)", path, what, size, header);
}

static inline int32_t read_i32(const unsigned char* b, int byte) { int32_t v; memcpy(&v, b + byte, 4); return v; }
static inline float read_f32(const unsigned char* b, int byte) { float v; memcpy(&v, b + byte, 4); return v; }

static inline Llama3Config seed_header_config(const unsigned char* h) {
    Llama3Config c;
    c.max_seq_len = read_i32(h, 8), c.vocab_size = read_i32(h, 12), c.n_layer = read_i32(h, 16);
    c.n_head = read_i32(h, 20), c.n_kv_head = read_i32(h, 24), c.n_embd = read_i32(h, 28);
    c.ffn_dim_multiplier = read_f32(h, 32), c.multiple_of = read_i32(h, 36);
    c.norm_eps = read_f32(h, 40), c.rope_theta = read_f32(h, 44), c.use_scaled_rope = read_i32(h, 48);
    c.tied_embeddings = read_i32(h, 64); // slot 16 (the seed's files have 0 there: untied)
    c.rope_factor = read_f32(h, 68);     // slot 17: 0 in the seed's files, which are Llama-3.2's
    if (c.rope_factor == 0.0f) c.rope_factor = LLAMA3_2_ROPE_FACTOR;
    return c;
}

static inline Llama3Config llmc_header_config(const unsigned char* h) {
    Llama3Config c;
    c.max_seq_len = read_i32(h, 8), c.vocab_size = read_i32(h, 12), c.n_layer = read_i32(h, 16);
    c.n_head = read_i32(h, 20), c.n_kv_head = read_i32(h, 24), c.n_embd = read_i32(h, 28);
    c.multiple_of = read_i32(h, 32), c.use_scaled_rope = read_i32(h, 36);
    c.ffn_dim_multiplier = read_f32(h, 1024), c.norm_eps = read_f32(h, 1028), c.rope_theta = read_f32(h, 1032);
    c.tied_embeddings = 0; // llm.c's format always has its lm_head
    c.rope_factor = LLMC_ROPE_FACTOR; // its header has no field for it
    return c;
}

static inline SegmentList file_segments(const Llama3Config* c, ModelFileFormat fmt) {
    return fmt == MODEL_FILE_SEED ? seed_file_segments(c, 1024)
                                  : llmc_file_segments(c, 2048, fmt == MODEL_FILE_LLMC_BF16 ? 2 : 4);
}

// Size a header interpretation implies, or 0 with the reason in err when its fields are not a model.
static inline size_t implied_file_size(Llama3Config* c, ModelFileFormat fmt, const char* source, char* err) {
    if (config_check(c, source, err) != 0) return 0;
    SegmentList s = file_segments(c, fmt);
    free(s.seg);
    return s.end;
}

// Reads the header of `path`, tells the two formats apart by the file size each header implies,
// and returns the config and the format.
static inline int model_header_read(const char* path, Llama3Config* cfg, ModelFileFormat* fmt, char* err) {
    long long size;
    FILE* f = open_regular(path, "model file", &size, err);
    if (!f) return -1;
    unsigned char h[2048] = {0};
    size_t got = fread(h, 1, sizeof(h), f);
    fclose(f);
    if (got < 1024) return shorter_than_header(path, "model file", got, 1024, err);
    if (read_i32(h, 0) != MODEL_MAGIC)
        return l3_fail(err, "%s: bad magic %d (expected %d, a LLaMA 3 model file)", path, read_i32(h, 0), MODEL_MAGIC);
    int version = read_i32(h, 4);
    if (version != MODEL_VERSION_FP32 && version != MODEL_VERSION_BF16)
        return l3_fail(err, "%s: unknown version %d (this trainer reads version 3, fp32 weights, and llm.c's version "
                       "5, bf16)", path, version);
    int bf16 = version == MODEL_VERSION_BF16; // only llm.c writes bf16 files
    Llama3Config seed = seed_header_config(h), llmc = llmc_header_config(h);
    char seed_err[L3_ERR_LEN] = "seed format: version 5 (bf16) is llm.c's only";
    char llmc_err[L3_ERR_LEN] = "llm.c format: the file is shorter than its 2048-byte header";
    size_t seed_size = bf16 ? 0 : implied_file_size(&seed, MODEL_FILE_SEED, "seed format", seed_err);
    ModelFileFormat llmc_fmt = bf16 ? MODEL_FILE_LLMC_BF16 : MODEL_FILE_LLMC;
    size_t llmc_size = got == 2048 ? implied_file_size(&llmc, llmc_fmt, "llm.c format", llmc_err) : 0;
    if (seed_size && (long long)seed_size == size) {
        *cfg = seed;
        *fmt = MODEL_FILE_SEED;
        return 0;
    }
    if (llmc_size && (long long)llmc_size == size) {
        *cfg = llmc;
        *fmt = llmc_fmt;
        return 0;
    }
    if (!seed_size && !llmc_size)
        return l3_fail(err, "%s: not a valid model header (read as the %s; read as the %s)", path, seed_err, llmc_err);
    Llama3Config untied = seed;
    untied.tied_embeddings = 0;
    if (seed_size && seed.tied_embeddings && (long long)implied_file_size(&untied, MODEL_FILE_SEED, "", seed_err) == size)
        return l3_fail(err, "%s: its header says tied_embeddings 1 (no lm_head tensor), but its %lld bytes are those of "
                       "an untied model, with lm_head", path, size);
    return l3_fail(err, "%s: truncated or corrupt: %lld bytes, but its header implies %zu (seed format) or %zu (llm.c "
                   "format)", path, size, seed_size, llmc_size);
}

// Receives the file's floats for one span of the parameter block (a device copy in the trainer,
// a memcpy in the host tests).
typedef void (*ParamSink)(void* ctx, size_t param_offset, const float* src, size_t count);

// bf16 values (the upper half of an fp32's bits) in the first n*2 bytes of buf, widened in place to
// n floats: from the last, so that each float lands on bf16 values already read.
static inline void widen_bf16_in_place(float* buf, size_t n) {
    const uint16_t* b16 = (const uint16_t*)buf;
    for (size_t i = n; i-- > 0;) {
        uint32_t bits = (uint32_t)b16[i] << 16;
        memcpy(&buf[i], &bits, 4);
    }
}

// Streams every segment through `buf` (buf_floats long) into `sink`; checks llm.c's biases are zero.
static inline int segments_load(const char* path, const SegmentList* s, float* buf, size_t buf_floats,
                         ParamSink sink, void* ctx, char* err) {
    long long size;
    FILE* f = open_regular(path, "model file", &size, err);
    if (!f) return -1;
    for (int i = 0; i < s->n; i++) {
        const FileSegment* g = &s->seg[i];
        if (fseeko(f, (off_t)g->file_offset, SEEK_SET) != 0) {
            fclose(f);
            return l3_fail(err, "%s: cannot seek to tensor %s: %s", path, g->name, strerror(errno));
        }
        for (size_t done = 0; done < g->count;) {
            size_t n = g->count - done < buf_floats ? g->count - done : buf_floats;
            if (fread(buf, s->elem_bytes, n, f) != n) {
                fclose(f);
                return l3_fail(err, "%s: truncated inside tensor %s", path, g->name);
            }
            if (s->elem_bytes == 2) widen_bf16_in_place(buf, n);
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

// ---- JSON (a Hugging Face folder's config.json, index and safetensors headers) ----
// A reader of whole JSON texts into a tree of nodes in one array: each holds its type, its value (a
// number as a double; a string's bytes between the quotes, escapes left as written), as an object's
// member its key, and the indices of its first child and next sibling. Keys compare byte for byte (no
// name the trainer looks up has an escape); of repeated keys the last counts, as in Python's json.
// Nesting deeper than JSON_MAX_DEPTH is refused, so no input runs the parser out of stack.
typedef enum { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;
typedef struct {
    JsonType type;
    const char *key, *str; // a member's key, a string's contents: into the text, not NUL-terminated
    int key_len, str_len;
    double number;
    int child, next; // first element or member, next sibling (node indices; -1: none)
} JsonNode;
typedef struct {
    JsonNode* node; // node[0]: the whole text's value
    int n, cap;
    char* text;     // owned; NUL-terminated
    const char *p, *end, *source; // the parse position and end; the file, for messages
    char* err;
} JsonDoc;
#define JSON_MAX_DEPTH 32

static inline int json_fail(JsonDoc* d, const char* what) {
    return l3_fail(d->err, "%s: not valid JSON: %s at byte %td", d->source, what, d->p - d->text);
}
static inline void json_space(JsonDoc* d) {
    while (d->p < d->end && (*d->p == ' ' || *d->p == '\t' || *d->p == '\n' || *d->p == '\r')) d->p++;
}
static inline int json_new(JsonDoc* d, JsonType type) {
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 64;
        d->node = (JsonNode*)realloc(d->node, d->cap * sizeof(JsonNode));
    }
    d->node[d->n] = (JsonNode){type, NULL, NULL, 0, 0, 0.0, -1, -1};
    return d->n++;
}
// A string at d->p (its opening quote): its contents' span, the escapes checked.
static inline int json_string(JsonDoc* d, const char** s, int* len) {
    const char* start = ++d->p;
    for (; d->p < d->end && *d->p != '"'; d->p++) {
        unsigned char c = (unsigned char)*d->p;
        if (c < 0x20) return json_fail(d, "a control character in a string");
        if (c != '\\') continue;
        if (++d->p >= d->end) break;
        c = (unsigned char)*d->p;
        if (c == 'u') {
            for (int i = 1; i <= 4; i++)
                if (d->p + i >= d->end || !strchr("0123456789abcdefABCDEF", d->p[i]) || !d->p[i])
                    return json_fail(d, "a \\u escape without four hex digits");
            d->p += 4;
        } else if (!c || !strchr("\"\\/bfnrt", c)) {
            return json_fail(d, "an unknown escape in a string");
        }
    }
    if (d->p >= d->end) return json_fail(d, "a string without its closing quote");
    *s = start, *len = (int)(d->p++ - start);
    return 0;
}
// A number at d->p, in JSON's grammar (strtod alone would take hex, inf and nan).
static inline int json_number_at(JsonDoc* d, double* v) {
    const char* q = d->p;
    if (q < d->end && *q == '-') q++;
    const char* digits = q;
    while (q < d->end && *q >= '0' && *q <= '9') q++;
    if (q == digits || (*digits == '0' && q - digits > 1)) return json_fail(d, "a malformed number");
    if (q < d->end && *q == '.') {
        const char* frac = ++q;
        while (q < d->end && *q >= '0' && *q <= '9') q++;
        if (q == frac) return json_fail(d, "a malformed number");
    }
    if (q < d->end && (*q == 'e' || *q == 'E')) {
        if (++q < d->end && (*q == '+' || *q == '-')) q++;
        const char* exp = q;
        while (q < d->end && *q >= '0' && *q <= '9') q++;
        if (q == exp) return json_fail(d, "a malformed number");
    }
    *v = strtod(d->p, NULL); // (stops where the grammar did: the text is NUL-terminated)
    d->p = q;
    return 0;
}
static inline int json_value(JsonDoc* d, int depth);
// The elements of an array or the members of an object at d->p (its bracket), as node i's children.
static inline int json_children(JsonDoc* d, int i, int depth, bool object) {
    char close = object ? '}' : ']';
    d->p++;
    json_space(d);
    if (d->p < d->end && *d->p == close) return d->p++, 0;
    for (int last = -1;;) {
        const char* key = NULL;
        int key_len = 0;
        if (object) {
            if (d->p >= d->end || *d->p != '"') return json_fail(d, "an object member without a string key");
            if (json_string(d, &key, &key_len)) return -1;
            json_space(d);
            if (d->p >= d->end || *d->p != ':') return json_fail(d, "a key without ':'");
            d->p++;
        }
        int child = json_value(d, depth + 1);
        if (child < 0) return -1;
        d->node[child].key = key, d->node[child].key_len = key_len;
        if (last < 0) d->node[i].child = child;
        else d->node[last].next = child;
        last = child;
        json_space(d);
        if (d->p < d->end && *d->p == ',') {
            d->p++;
            json_space(d);
            continue;
        }
        if (d->p < d->end && *d->p == close) return d->p++, 0;
        return json_fail(d, object ? "an object without ',' or '}'" : "an array without ',' or ']'");
    }
}
static inline int json_value(JsonDoc* d, int depth) {
    if (depth > JSON_MAX_DEPTH) return json_fail(d, "nesting deeper than 32"), -1;
    json_space(d);
    if (d->p >= d->end) return json_fail(d, "the text ends where a value is due"), -1;
    static const struct { const char* word; JsonType type; } words[] = {
        {"null", JSON_NULL}, {"false", JSON_FALSE}, {"true", JSON_TRUE}};
    for (int w = 0; w < 3; w++) {
        size_t n = strlen(words[w].word);
        if ((size_t)(d->end - d->p) >= n && memcmp(d->p, words[w].word, n) == 0) {
            d->p += n;
            return json_new(d, words[w].type);
        }
    }
    char c = *d->p;
    if (c != '"' && c != '[' && c != '{' && c != '-' && !(c >= '0' && c <= '9'))
        return json_fail(d, "an unexpected character"), -1;
    int i = json_new(d, c == '"' ? JSON_STRING : c == '[' ? JSON_ARRAY : c == '{' ? JSON_OBJECT : JSON_NUMBER);
    int rc = c == '"'               ? json_string(d, &d->node[i].str, &d->node[i].str_len)
             : c == '[' || c == '{' ? json_children(d, i, depth, c == '{')
                                    : json_number_at(d, &d->node[i].number);
    return rc ? -1 : i;
}
static inline void json_free(JsonDoc* d) {
    free(d->node);
    free(d->text);
    d->node = NULL, d->text = NULL;
}
// Parses text[0..n) (owned by the doc from here on; text[n] must be NUL) from `source`.
static inline int json_parse(JsonDoc* d, char* text, size_t n, const char* source, char* err) {
    *d = (JsonDoc){NULL, 0, 0, text, text, text + n, source, err};
    if (json_value(d, 0) < 0) return -1;
    json_space(d);
    if (d->p != d->end) return json_fail(d, "characters after the value");
    return 0;
}
// The file `path` (a `what`, for messages), at most max_bytes, read whole into *data (NUL-terminated
// after its *bytes; the caller frees it).
static inline int file_read_whole(const char* path, const char* what, size_t max_bytes, char** data, size_t* bytes,
                                  char* err) {
    long long size;
    FILE* f = open_regular(path, what, &size, err);
    if (!f) return -1;
    if ((unsigned long long)size > max_bytes) {
        fclose(f);
        return l3_fail(err, "%s: %lld bytes, more than the %zu a %s may have", path, size, max_bytes, what);
    }
    if (!(*data = (char*)malloc((size_t)size + 1))) {
        fclose(f);
        return l3_fail(err, "%s: out of host memory for its %lld bytes", path, size);
    }
    *bytes = fread(*data, 1, (size_t)size, f);
    int bad = ferror(f) || *bytes != (size_t)size;
    fclose(f);
    (*data)[*bytes] = 0;
    if (bad) free(*data);
    return bad ? l3_fail(err, "%s: cannot read: %s", path, strerror(errno)) : 0;
}
// Reads and parses the file `path` (at most max_bytes).
static inline int json_read_file(JsonDoc* d, const char* path, size_t max_bytes, char* err) {
    *d = (JsonDoc){0};
    char* text = NULL;
    size_t n = 0;
    if (file_read_whole(path, "JSON file of a model folder", max_bytes, &text, &n, err)) return -1;
    return json_parse(d, text, n, path, err);
}
// The member `key` of object node `obj` (the last if repeated), or -1.
static inline int json_member(const JsonDoc* d, int obj, const char* key) {
    if (obj < 0 || d->node[obj].type != JSON_OBJECT) return -1;
    int found = -1, n = (int)strlen(key);
    for (int i = d->node[obj].child; i >= 0; i = d->node[i].next)
        if (d->node[i].key_len == n && memcmp(d->node[i].key, key, n) == 0) found = i;
    return found;
}
static inline bool json_is_string(const JsonDoc* d, int i, const char* s) {
    return i >= 0 && d->node[i].type == JSON_STRING && d->node[i].str_len == (int)strlen(s) &&
           memcmp(d->node[i].str, s, d->node[i].str_len) == 0;
}
// Node i's value as an integer in [lo, hi], or -1 (not a number, not whole, out of range).
static inline int json_integer(const JsonDoc* d, int i, long long lo, long long hi, long long* v) {
    if (i < 0 || d->node[i].type != JSON_NUMBER) return -1;
    double x = d->node[i].number;
    if (!(x >= (double)lo && x <= (double)hi) || x != floor(x)) return -1;
    *v = (long long)x;
    return 0;
}

// ---- Hugging Face folders (--hf_dir) ----
// A LLaMA 3 model as Hugging Face saves it: config.json, and model.safetensors or
// model.safetensors.index.json with the shards its weight_map names. A safetensors file is an 8-byte
// little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__"},
// then the data (offsets from the header's end). Read with scripts/convert_hf.py's rules, so that the
// weights land as its seed file's do, bit for bit: the same configs refused, F32, F16 and BF16
// widened exactly, and q and k rows from HF's half rotation to the pairs this trainer rotates.
#define HF_MAX_JSON_BYTES (64u << 20) // config.json, the index, a safetensors header
#define HF_MAX_DIMS 8

typedef struct {
    char* name;
    char dtype[8];      // safetensors' name; F32, F16 and BF16 are read (other names kept cut to 7)
    int n_dims;
    long long shape[HF_MAX_DIMS];
    int file;           // index into HfModel.files
    long long offset;   // of its first byte in the file
} HfTensor;

typedef struct {
    char config_path[L3_PATH_LEN];
    char (*files)[L3_PATH_LEN]; // the safetensors files
    int n_files;
    HfTensor* tensor;
    int n_tensors;
    Llama3Config cfg;
} HfModel;

static inline void hf_model_free(HfModel* h) {
    for (int i = 0; i < h->n_tensors; i++) free(h->tensor[i].name);
    free(h->tensor);
    free(h->files);
    memset(h, 0, sizeof(*h));
}
static inline int hf_find(const HfModel* h, const char* name) {
    for (int i = 0; i < h->n_tensors; i++)
        if (strcmp(h->tensor[i].name, name) == 0) return i;
    return -1;
}
static inline int hf_dtype_bytes(const char* dtype) {
    return strcmp(dtype, "F32") == 0 ? 4 : strcmp(dtype, "F16") == 0 || strcmp(dtype, "BF16") == 0 ? 2 : 0;
}

// One entry of a safetensors header: its dtype, shape and data_offsets, checked against the data's
// `data_bytes`, into t.
static inline int hf_entry(const JsonDoc* d, int e, const char* path, long long data_bytes, HfTensor* t, char* err) {
    int dtype = json_member(d, e, "dtype"), shape = json_member(d, e, "shape"), offsets = json_member(d, e, "data_offsets");
    bool ok = dtype >= 0 && d->node[dtype].type == JSON_STRING && shape >= 0 && d->node[shape].type == JSON_ARRAY &&
              offsets >= 0 && d->node[offsets].type == JSON_ARRAY;
    long long range[2] = {-1, -1}, count = 1;
    int k = 0;
    for (int i = ok ? d->node[offsets].child : -1; i >= 0 && ok; i = d->node[i].next, k++)
        ok = k < 2 && json_integer(d, i, 0, LLONG_MAX / 2, &range[k]) == 0;
    ok = ok && k == 2;
    t->n_dims = 0;
    for (int i = ok ? d->node[shape].child : -1; i >= 0 && ok; i = d->node[i].next) {
        long long n;
        ok = t->n_dims < HF_MAX_DIMS && json_integer(d, i, 0, 1LL << 40, &n) == 0;
        if (ok) t->shape[t->n_dims++] = n, count = n && count > (1LL << 60) / n ? 1LL << 60 : count * n; // (saturated)
    }
    if (!ok) return l3_fail(err, "%s: tensor %s: no valid dtype, shape and data_offsets", path, t->name);
    snprintf(t->dtype, sizeof(t->dtype), "%.*s", d->node[dtype].str_len, d->node[dtype].str);
    int bytes = hf_dtype_bytes(t->dtype);
    if (range[0] > range[1] || range[1] > data_bytes || (bytes && range[1] - range[0] != count * bytes))
        return l3_fail(err, "%s: tensor %s: data_offsets %lld..%lld do not fit its shape or the file's data (%lld "
                       "bytes)", path, t->name, range[0], range[1], data_bytes);
    t->offset = range[0];
    return 0;
}

// The tensors of safetensors file number `file` (h->files[file]) added to h's list; a name already
// in the list (from another shard) is refused.
static inline int hf_read_safetensors(HfModel* h, int file, char* err) {
    const char* path = h->files[file];
    long long size;
    FILE* f = open_regular(path, "safetensors file", &size, err);
    if (!f) return -1;
    uint64_t n = 0; // the header's length, little-endian as this host
    bool have = size >= 8 && fread(&n, 1, 8, f) == 8;
    if (!have || n < 2 || n > (uint64_t)size - 8 || n > HF_MAX_JSON_BYTES) {
        fclose(f);
        return l3_fail(err, "%s: not a safetensors file (header length %lld, file %lld bytes)", path,
                       have ? (long long)(n > LLONG_MAX ? LLONG_MAX : n) : -1LL, size);
    }
    char* text = (char*)malloc(n + 1);
    size_t got = fread(text, 1, n, f);
    fclose(f);
    text[got] = 0;
    JsonDoc d;
    if (got != n) {
        free(text);
        return l3_fail(err, "%s: cannot read its header: %s", path, strerror(errno));
    }
    if (json_parse(&d, text, n, path, err)) return json_free(&d), -1;
    if (d.node[0].type != JSON_OBJECT) return json_free(&d), l3_fail(err, "%s: the header is not a JSON object", path);
    int rc = 0;
    for (int e = d.node[0].child; e >= 0 && rc == 0; e = d.node[e].next) {
        char* name = (char*)malloc(d.node[e].key_len + 1);
        snprintf(name, d.node[e].key_len + 1, "%.*s", d.node[e].key_len, d.node[e].key);
        if (strcmp(name, "__metadata__") == 0 || json_member(&d, 0, name) != e) { // (a repeat: its last counts)
            free(name);
            continue;
        }
        int other = hf_find(h, name);
        h->tensor = (HfTensor*)realloc(h->tensor, (h->n_tensors + 1) * sizeof(HfTensor));
        HfTensor* t = &h->tensor[h->n_tensors++];
        *t = (HfTensor){name, "", 0, {0}, file, 0};
        if (other >= 0) rc = l3_fail(err, "%s: tensor %s is also in %s", path, name, h->files[h->tensor[other].file]);
        else rc = hf_entry(&d, e, path, size - 8 - (long long)n, t, err);
        t->offset += 8 + (long long)n;
    }
    json_free(&d);
    return rc;
}

// The folder's safetensors files into h->files: model.safetensors, or the shards the index's
// weight_map names (each once, in name order), each file's tensors then read; a tensor of a shard
// the index places elsewhere is refused.
static inline int hf_read_tensors(HfModel* h, const char* dir, char* err) {
    char single[L3_PATH_LEN], index[L3_PATH_LEN];
    snprintf(single, sizeof(single), "%s/model.safetensors", dir);
    snprintf(index, sizeof(index), "%s/model.safetensors.index.json", dir);
    struct stat st;
    if (stat(single, &st) == 0) {
        h->files = (char(*)[L3_PATH_LEN])malloc(sizeof(*h->files));
        snprintf(h->files[0], L3_PATH_LEN, "%s", single);
        h->n_files = 1;
        return hf_read_safetensors(h, 0, err);
    }
    if (stat(index, &st) != 0) return l3_fail(err, "%s: no model.safetensors and no model.safetensors.index.json", dir);
    JsonDoc d;
    if (json_read_file(&d, index, HF_MAX_JSON_BYTES, err)) return json_free(&d), -1;
    int map = json_member(&d, 0, "weight_map"), rc = 0;
    if (map < 0 || d.node[map].type != JSON_OBJECT || d.node[map].child < 0) rc = l3_fail(err, "%s: no weight_map", index);
    h->files = (char(*)[L3_PATH_LEN])malloc(sizeof(*h->files) * (rc ? 1 : d.n));
    for (int e = rc ? -1 : d.node[map].child; e >= 0 && rc == 0; e = d.node[e].next) {
        const JsonNode* v = &d.node[e];
        char file[L3_PATH_LEN];
        if (v->type != JSON_STRING || v->str_len == 0 || memchr(v->str, '/', v->str_len) || memchr(v->str, '\\', v->str_len)) {
            rc = l3_fail(err, "%s: weight_map: %.*s: not the name of a file in the folder", index, v->key_len, v->key);
            break;
        }
        snprintf(file, sizeof(file), "%s/%.*s", dir, v->str_len, v->str);
        int at = 0;
        while (at < h->n_files && strcmp(h->files[at], file) < 0) at++;
        if (at < h->n_files && strcmp(h->files[at], file) == 0) continue;
        memmove(h->files[at + 1], h->files[at], (h->n_files++ - at) * sizeof(*h->files));
        snprintf(h->files[at], L3_PATH_LEN, "%s", file);
    }
    for (int i = 0; i < h->n_files && rc == 0; i++)
        if (stat(h->files[i], &st) != 0) rc = l3_fail(err, "%s: missing: a shard %s names", h->files[i], index);
    for (int i = 0; i < h->n_files && rc == 0; i++) rc = hf_read_safetensors(h, i, err);
    for (int i = 0; i < h->n_tensors && rc == 0; i++) {
        const HfTensor* t = &h->tensor[i];
        int where = json_member(&d, map, t->name);
        const char* base = strrchr(h->files[t->file], '/') + 1;
        if (!json_is_string(&d, where, base))
            rc = l3_fail(err, "%s: holds %s, which the index places in %.*s", h->files[t->file], t->name,
                         where >= 0 ? d.node[where].str_len : 4, where >= 0 ? d.node[where].str : "None");
    }
    json_free(&d);
    return rc;
}

// config.json's number `key` into *v, or a message naming it.
static inline int hf_number(const JsonDoc* d, int obj, const char* key, double* v) {
    int i = json_member(d, obj, key);
    if (i < 0 || d->node[i].type != JSON_NUMBER) return -1;
    *v = d->node[i].number;
    return 0;
}

// LLaMA 3.x's own (ffn_dim_multiplier, multiple_of): 3.2-1B, 3.2-3B, 3.1-8B, 3.1-70B, 3.1-405B.
static const struct { float mult; int multiple_of; } LLAMA3_FFN[] = {{1.5f, 256}, {1.0f, 256}, {1.3f, 1024},
                                                                    {1.3f, 4096}, {1.2f, 4096}};
// The (ffn_dim_multiplier, multiple_of) that ffn_hidden_dim turns into intermediate_size F, as
// convert_hf.py picks it: the pair config.json names (export_hf.py writes it), else the first of LLaMA
// 3.x's that fits, else the largest power-of-two multiple_of up to 256 dividing F with the multiplier
// of fewest decimals that lands on it (k / 10^decimals: the double Python's round gives).
static inline int hf_ffn(const JsonDoc* d, int cfg, int C, long long F, Llama3Config* c, const char* path, char* err) {
    double mult;
    long long multiple_of;
    if (json_member(d, cfg, "ffn_dim_multiplier") >= 0 || json_member(d, cfg, "multiple_of") >= 0) {
        if (hf_number(d, cfg, "ffn_dim_multiplier", &mult) ||
            json_integer(d, json_member(d, cfg, "multiple_of"), 1, 1 << 20, &multiple_of) ||
            !(mult >= 1e-2 && mult <= 64) || ffn_hidden_dim(C, (float)mult, (int)multiple_of) != F)
            return l3_fail(err, "%s: ffn_dim_multiplier and multiple_of do not give intermediate_size %lld by the "
                           "trainer's formula", path, F);
        c->ffn_dim_multiplier = (float)mult, c->multiple_of = (int)multiple_of;
        return 0;
    }
    for (size_t i = 0; i < sizeof(LLAMA3_FFN) / sizeof(LLAMA3_FFN[0]); i++)
        if (ffn_hidden_dim(C, LLAMA3_FFN[i].mult, LLAMA3_FFN[i].multiple_of) == F) {
            c->ffn_dim_multiplier = LLAMA3_FFN[i].mult, c->multiple_of = LLAMA3_FFN[i].multiple_of;
            return 0;
        }
    long long base = 2 * (4 * (long long)C) / 3;
    for (multiple_of = 256; F % multiple_of; multiple_of /= 2) {}
    for (int decimals = 1; decimals < 8; decimals++) {
        double step = pow(10.0, -decimals), lo = (double)(F - multiple_of) / base, hi = (double)(F + 1) / base;
        for (long long k = (long long)floor(lo / step); k <= (long long)ceil(hi / step); k++) {
            mult = (double)k / pow(10.0, decimals);
            if (mult >= 1e-2 && mult <= 64 && ffn_hidden_dim(C, (float)mult, (int)multiple_of) == F) {
                c->ffn_dim_multiplier = (float)mult, c->multiple_of = (int)multiple_of;
                return 0;
            }
        }
    }
    return l3_fail(err, "%s: intermediate_size %lld with hidden_size %d: no ffn_dim_multiplier in [0.01, 64] gives "
                   "it by the trainer's formula", path, F, C);
}

// RoPE: transformers 5's rope_parameters or 4's rope_scaling with rope_theta; llama3 scaling of the
// constants rope_inv_freq hardcodes (low 1, high 4, original context 8192), or none.
static inline int hf_rope(const JsonDoc* d, int cfg, Llama3Config* c, const char* path, char* err) {
    int rope = json_member(d, cfg, "rope_parameters");
    if (rope < 0 || d->node[rope].type != JSON_OBJECT || d->node[rope].child < 0) rope = json_member(d, cfg, "rope_scaling");
    if (rope >= 0 && d->node[rope].type != JSON_OBJECT) rope = -1;
    int type = json_member(d, rope, "rope_type");
    if (type < 0) type = json_member(d, rope, "type");
    double theta = 10000.0, factor;
    if (hf_number(d, rope, "rope_theta", &theta)) hf_number(d, cfg, "rope_theta", &theta);
    c->rope_theta = (float)theta, c->use_scaled_rope = 0, c->rope_factor = LLAMA3_2_ROPE_FACTOR;
    if (type < 0 || json_is_string(d, type, "default")) return 0;
    if (!json_is_string(d, type, "llama3"))
        return l3_fail(err, "%s: rope_type %.*s: the trainer runs llama3 RoPE scaling or none", path,
                       d->node[type].type == JSON_STRING ? d->node[type].str_len : 1,
                       d->node[type].type == JSON_STRING ? d->node[type].str : "?");
    const struct { const char* key; double want; } fixed[] = {
        {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192.0}};
    for (int i = 0; i < 3; i++) {
        double v;
        if (hf_number(d, rope, fixed[i].key, &v) || v != fixed[i].want)
            return l3_fail(err, "%s: llama3 rope %s: the trainer hardcodes %g (llama3.h rope_inv_freq)", path,
                           fixed[i].key, fixed[i].want);
    }
    if (hf_number(d, rope, "factor", &factor)) return l3_fail(err, "%s: llama3 rope factor: not a number", path);
    c->use_scaled_rope = 1, c->rope_factor = (float)factor;
    return 0;
}

// The trainer's config for the folder's config.json (convert_hf.py's config_of): a LlamaForCausalLM,
// SiLU, no biases, head_dim hidden_size / num_attention_heads; then config_check's ranges.
static inline int hf_config(const JsonDoc* d, bool tied, Llama3Config* c, const char* path, char* err) {
    int arch = json_member(d, 0, "architectures"), act = json_member(d, 0, "hidden_act");
    bool llama_arch = arch < 0 || (d->node[arch].type == JSON_ARRAY && d->node[arch].child >= 0 &&
                                   json_is_string(d, d->node[arch].child, "LlamaForCausalLM") &&
                                   d->node[d->node[arch].child].next < 0);
    if (!json_is_string(d, json_member(d, 0, "model_type"), "llama") || !llama_arch)
        return l3_fail(err, "%s: model_type and architectures: not a LlamaForCausalLM", path);
    if (act >= 0 && !json_is_string(d, act, "silu")) return l3_fail(err, "%s: hidden_act: the trainer's LLaMA has silu", path);
    const char* biases[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++) {
        int b = json_member(d, 0, biases[i]);
        if (b >= 0 && d->node[b].type != JSON_FALSE)
            return l3_fail(err, "%s: %s: the trainer's LLaMA has %s false", path, biases[i], biases[i]);
    }
    const char* need[] = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "max_position_embeddings", "rms_norm_eps"};
    long long v[6];
    double eps;
    for (int i = 0; i < 7; i++) {
        int at = json_member(d, 0, need[i]);
        if (i < 6 ? json_integer(d, at, 0, 1LL << 40, &v[i]) : hf_number(d, 0, need[i], &eps))
            return l3_fail(err, "%s: %s: missing or not a %s", path, need[i], i < 6 ? "whole number" : "number");
    }
    *c = (Llama3Config){0};
    c->vocab_size = (int)(v[0] > INT_MAX ? INT_MAX : v[0]), c->n_embd = (int)(v[1] > INT_MAX ? INT_MAX : v[1]);
    c->n_layer = (int)(v[2] > INT_MAX ? INT_MAX : v[2]), c->n_head = (int)(v[3] > INT_MAX ? INT_MAX : v[3]);
    c->max_seq_len = (int)(v[5] > INT_MAX ? INT_MAX : v[5]), c->norm_eps = (float)eps;
    long long kv = c->n_head, head_dim;
    int kv_at = json_member(d, 0, "num_key_value_heads"), hd_at = json_member(d, 0, "head_dim");
    if (kv_at >= 0 && d->node[kv_at].type != JSON_NULL && json_integer(d, kv_at, 0, 1 << 20, &kv))
        return l3_fail(err, "%s: num_key_value_heads: not a whole number", path);
    c->n_kv_head = kv ? (int)kv : c->n_head, c->tied_embeddings = tied; // (0 or null: as many as the heads)
    if (c->n_head < 1 || c->n_embd % c->n_head ||
        (hd_at >= 0 && d->node[hd_at].type != JSON_NULL &&
         (json_integer(d, hd_at, 0, 1 << 20, &head_dim) || head_dim != c->n_embd / c->n_head)))
        return l3_fail(err, "%s: head_dim: the trainer's is hidden_size %d / num_attention_heads %d", path, c->n_embd,
                       c->n_head);
    if (hf_rope(d, 0, c, path, err)) return -1;
    if (c->n_embd < 8 || c->n_embd > (1 << 20)) return config_check(c, path, err);
    if (hf_ffn(d, 0, c->n_embd, v[4], c, path, err)) return -1;
    return config_check(c, path, err);
}

// Where an HF tensor goes: `count` floats (rows x cols) at param_offset; q and k (heads > 0) row by
// row from HF's half rotation (i, i + D/2) to the trainer's pairs (2i, 2i + 1).
typedef struct {
    char name[64];
    long long rows, cols; // cols 0: a vector of `rows`
    size_t param_offset;
    int heads;
} HfPlace;

// Every tensor the config implies, in the seed file's order (its layer-stacked tensors by layer).
static inline int hf_places(const Llama3Config* c, HfPlace* out) {
    ParamLayout p = param_layout(c);
    long long C = c->n_embd, F = c->ffn_hidden, KV = (long long)c->n_kv_head * (C / c->n_head), V = c->vocab_size;
    int n = 0;
    out[n++] = (HfPlace){"model.embed_tokens.weight", V, C, p.offset[P_WTE], 0};
    for (int l = 0; l < c->n_layer; l++) {
        size_t qkv = p.offset[P_QKV] + l * p.layer_size[P_QKV], gate_up = p.offset[P_GATE_UP] + l * p.layer_size[P_GATE_UP];
        const struct { const char* name; long long rows, cols; size_t offset; int heads; } layer[] = {
            {"input_layernorm", C, 0, p.offset[P_ATTN_NORM] + l * C, 0},
            {"self_attn.q_proj", C, C, qkv, c->n_head},
            {"self_attn.k_proj", KV, C, qkv + C * C, c->n_kv_head},
            {"self_attn.v_proj", KV, C, qkv + (C + KV) * C, 0},
            {"self_attn.o_proj", C, C, p.offset[P_ATTN_OUT] + l * p.layer_size[P_ATTN_OUT], 0},
            {"post_attention_layernorm", C, 0, p.offset[P_FFN_NORM] + l * C, 0},
            {"mlp.gate_proj", F, C, gate_up, 0},
            {"mlp.up_proj", F, C, gate_up + F * C, 0},
            {"mlp.down_proj", C, F, p.offset[P_DOWN] + l * p.layer_size[P_DOWN], 0}};
        for (int i = 0; i < 9; i++, n++) {
            out[n] = (HfPlace){"", layer[i].rows, layer[i].cols, layer[i].offset, layer[i].heads};
            snprintf(out[n].name, sizeof(out->name), "model.layers.%d.%s.weight", l, layer[i].name);
        }
    }
    out[n++] = (HfPlace){"model.norm.weight", C, 0, p.offset[P_FINAL_NORM], 0};
    if (!c->tied_embeddings) out[n++] = (HfPlace){"lm_head.weight", V, C, p.offset[P_LM_HEAD], 0};
    return n;
}
static inline int hf_places_count(const Llama3Config* c) { return 3 + 9 * c->n_layer; }

// "a, b, c, d ... (n in all)": the first four of n names.
static inline void hf_name_list(char* out, size_t len, const char* const* names, int n) {
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < n && i < 4; i++) at += snprintf(out + at, at < len ? len - at : 0, "%s%s", i ? ", " : "", names[i]);
    if (n > 4 && at < len) snprintf(out + at, len - at, " ... (%d in all)", n);
}
static inline void hf_shape_text(char* out, size_t len, const long long* shape, int n_dims) {
    size_t at = snprintf(out, len, "[");
    for (int i = 0; i < n_dims && at < len; i++) at += snprintf(out + at, len - at, "%s%lld", i ? ", " : "", shape[i]);
    if (at < len) snprintf(out + at, len - at, "]");
}
static inline int hf_cmp_names(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

// Every tensor the config implies is there, in a dtype read, with its shape; no bias, nothing else
// (a tied model's lm_head.weight is left unread, as convert_hf.py leaves it).
static inline int hf_check_tensors(const HfModel* h, const HfPlace* places, int n_places, const char* dir, char* err) {
    const char** odd = (const char**)malloc(sizeof(char*) * (h->n_tensors + n_places + 1));
    int n_extra = 0, n_bias = 0, n_missing = 0;
    for (int i = 0; i < h->n_tensors; i++) {
        const char* name = h->tensor[i].name;
        bool known = h->cfg.tied_embeddings && strcmp(name, "lm_head.weight") == 0;
        for (int j = 0; j < n_places && !known; j++) known = strcmp(name, places[j].name) == 0;
        if (!known) odd[n_extra++] = name;
    }
    qsort(odd, n_extra, sizeof(char*), hf_cmp_names);
    for (int i = 0; i < n_extra; i++) {
        size_t len = strlen(odd[i]);
        if (len >= 5 && strcmp(odd[i] + len - 5, ".bias") == 0) odd[n_bias++] = odd[i]; // (in place: n_bias <= i)
    }
    char list[L3_ERR_LEN / 2];
    int rc = 0;
    if (n_bias) {
        hf_name_list(list, sizeof(list), odd, n_bias);
        rc = l3_fail(err, "%s: bias tensors %s: the trainer's LLaMA has no biases", dir, list);
    } else if (n_extra) {
        hf_name_list(list, sizeof(list), odd, n_extra);
        rc = l3_fail(err, "%s: unexpected tensors %s", dir, list);
    }
    for (int j = 0; j < n_places && rc == 0; j++)
        if (hf_find(h, places[j].name) < 0) odd[n_missing++] = places[j].name;
    if (n_missing && rc == 0) {
        hf_name_list(list, sizeof(list), odd, n_missing);
        rc = l3_fail(err, "%s: missing tensors %s", dir, list);
    }
    for (int j = 0; j < n_places && rc == 0; j++) {
        const HfPlace* p = &places[j];
        const HfTensor* t = &h->tensor[hf_find(h, p->name)];
        int dims = p->cols ? 2 : 1;
        if (!hf_dtype_bytes(t->dtype))
            rc = l3_fail(err, "%s: tensor %s is %s; F32, F16 or BF16 are read", h->files[t->file], p->name, t->dtype);
        else if (t->n_dims != dims || t->shape[0] != p->rows || (dims == 2 && t->shape[1] != p->cols)) {
            long long want[2] = {p->rows, p->cols};
            char has[160], implied[64];
            hf_shape_text(has, sizeof(has), t->shape, t->n_dims);
            hf_shape_text(implied, sizeof(implied), want, dims);
            rc = l3_fail(err, "%s: tensor %s has shape %s, the config implies %s", h->files[t->file], p->name, has,
                         implied);
        }
    }
    free(odd);
    return rc;
}

// Everything of the folder `dir` that can be checked before the GPU: config.json and the config it
// implies (h->cfg), the safetensors headers, and every tensor the config needs. Tied as convert_hf.py
// decides: tie_word_embeddings, or no lm_head.weight.
static inline int hf_model_open(const char* dir, HfModel* h, char* err) {
    memset(h, 0, sizeof(*h));
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return l3_fail(err, "%s: %s (a Hugging Face model's folder, with config.json and model.safetensors)", dir,
                       stat(dir, &st) == 0 ? "not a folder" : "no such folder");
    snprintf(h->config_path, sizeof(h->config_path), "%s/config.json", dir);
    if (stat(h->config_path, &st) != 0) return l3_fail(err, "%s: no config.json (a Hugging Face model's folder)", dir);
    JsonDoc d;
    if (json_read_file(&d, h->config_path, HF_MAX_JSON_BYTES, err) || hf_read_tensors(h, dir, err)) {
        json_free(&d);
        return -1;
    }
    int tie = json_member(&d, 0, "tie_word_embeddings");
    bool tied = (tie >= 0 && (d.node[tie].type == JSON_TRUE || (d.node[tie].type == JSON_NUMBER && d.node[tie].number != 0)))
                || hf_find(h, "lm_head.weight") < 0;
    if (d.node[0].type != JSON_OBJECT) {
        json_free(&d);
        return l3_fail(err, "%s: not a JSON object", h->config_path);
    }
    int rc = hf_config(&d, tied, &h->cfg, h->config_path, err);
    json_free(&d);
    if (rc) return -1;
    HfPlace* places = (HfPlace*)malloc(sizeof(HfPlace) * hf_places_count(&h->cfg));
    int n = hf_places(&h->cfg, places);
    rc = hf_check_tensors(h, places, n, dir, err);
    free(places);
    return rc;
}

// fp16 values in the first n*2 bytes of buf, widened in place to n floats (from the last, as
// widen_bf16_in_place): exactly, subnormals, infinities and NaN payloads included.
static inline void widen_f16_in_place(float* buf, size_t n) {
    const uint16_t* h16 = (const uint16_t*)buf;
    for (size_t i = n; i-- > 0;) {
        uint32_t h = h16[i], sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
        if (exp == 0x1f) bits = sign | 0x7f800000u | (man << 13);
        else if (exp) bits = sign | ((exp + 112) << 23) | (man << 13);
        else if (!man) bits = sign;
        else { // subnormal: normalise
            int e = -1;
            do man <<= 1, e++; while (!(man & 0x400));
            bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
        }
        memcpy(&buf[i], &bits, 4);
    }
}

// Reads n elements of tensor t from f (positioned) into buf as floats.
static inline int hf_read_floats(FILE* f, const HfTensor* t, float* buf, size_t n, const char* path, char* err) {
    int bytes = hf_dtype_bytes(t->dtype);
    if (fread(buf, bytes, n, f) != n) return l3_fail(err, "%s: truncated inside tensor %s", path, t->name);
    if (strcmp(t->dtype, "BF16") == 0) widen_bf16_in_place(buf, n);
    if (strcmp(t->dtype, "F16") == 0) widen_f16_in_place(buf, n);
    return 0;
}

// Streams every tensor of an opened folder into `sink` through buf (buf_floats, at least twice a
// head's rows: 2 * head_dim * n_embd): in chunks, q and k a head at a time with its rows reordered.
static inline int hf_model_load(const HfModel* h, float* buf, size_t buf_floats, ParamSink sink, void* ctx, char* err) {
    const Llama3Config* c = &h->cfg;
    size_t D = c->n_embd / c->n_head, head = D * c->n_embd;
    if (buf_floats < 2 * head) return l3_fail(err, "internal error: hf_model_load's buffer holds less than two heads");
    HfPlace* places = (HfPlace*)malloc(sizeof(HfPlace) * hf_places_count(c));
    int n = hf_places(c, places), rc = 0;
    for (int j = 0; j < n && rc == 0; j++) {
        const HfPlace* p = &places[j];
        const HfTensor* t = &h->tensor[hf_find(h, p->name)];
        const char* path = h->files[t->file];
        FILE* f = fopen(path, "rb");
        if (!f || fseeko(f, (off_t)t->offset, SEEK_SET) != 0) {
            rc = l3_fail(err, "%s: cannot read tensor %s: %s", path, p->name, strerror(errno));
            if (f) fclose(f);
            break;
        }
        size_t count = (size_t)p->rows * (p->cols ? p->cols : 1), chunk = p->heads ? head : buf_floats;
        for (size_t done = 0; done < count && rc == 0; done += chunk) {
            size_t m = count - done < chunk ? count - done : chunk;
            rc = hf_read_floats(f, t, buf, m, path, err);
            if (rc || !p->heads) {
                if (!rc) sink(ctx, p->param_offset + done, buf, m);
                continue;
            }
            float* pairs = buf + head; // row 2i + j of the head is HF's row j * D/2 + i
            for (size_t i = 0; i < D / 2; i++)
                for (size_t k = 0; k < 2; k++)
                    memcpy(pairs + (2 * i + k) * c->n_embd, buf + (k * D / 2 + i) * c->n_embd, c->n_embd * sizeof(float));
            sink(ctx, p->param_offset + done, pairs, m);
        }
        fclose(f);
    }
    free(places);
    return rc;
}

// Loads the folder `dir` that hf_model_open checked before the GPU into `sink`; a folder whose config
// changed since is refused.
static_assert(sizeof(Llama3Config) == 14 * 4, "hf_dir_load compares two configs with memcmp: no padding");
static inline int hf_dir_load(const char* dir, const Llama3Config* cfg, float* buf, size_t buf_floats, ParamSink sink,
                              void* ctx, char* err) {
    HfModel h;
    int rc = hf_model_open(dir, &h, err);
    if (rc == 0 && memcmp(&h.cfg, cfg, sizeof(*cfg)) != 0)
        rc = l3_fail(err, "%s: its config.json changed since the run started", dir);
    if (rc == 0) rc = hf_model_load(&h, buf, buf_floats, sink, ctx, err);
    hf_model_free(&h);
    return rc;
}

// ---- model files: loading ----

static inline int model_file_load(const char* path, const Llama3Config* cfg, ModelFileFormat fmt,
                           float* buf, size_t buf_floats, ParamSink sink, void* ctx, char* err) {
    if (fmt == MODEL_FILE_HF) return hf_dir_load(path, cfg, buf, buf_floats, sink, ctx, err);
    SegmentList s = file_segments(cfg, fmt);
    int rc = segments_load(path, &s, buf, buf_floats, sink, ctx, err);
    free(s.seg);
    return rc;
}

// What can be known of a model file's data before the GPU is touched, beyond its header and size:
// llm.c's bias tensors must be zero (LLaMA has none). Reads only those, a few MB at the 1B.
static inline int model_file_check(const char* path, const Llama3Config* cfg, ModelFileFormat fmt, char* err) {
    if (fmt == MODEL_FILE_SEED || fmt == MODEL_FILE_HF) return 0; // (hf_model_open checked the folder)
    SegmentList s = file_segments(cfg, fmt), biases = {s.seg, 0, s.end, s.elem_bytes};
    for (int i = 0; i < s.n; i++)
        if (s.seg[i].param_offset < 0) biases.seg[biases.n++] = s.seg[i]; // in place: n <= i
    float buf[4096];
    int rc = segments_load(path, &biases, buf, 4096, NULL, NULL, err);
    free(s.seg);
    return rc;
}

// Writes a header for the seed format (the reference script writes the same bytes): slots 0..15 as
// InfiniTrain's (dev/FORMATS.md section 1), slot 16 (byte 64) tied_embeddings, 0 in the seed's own files,
// slot 17 (byte 68) the f32 rope_factor, 0 in the seed's own files (read as 32).
static inline void seed_header_write(unsigned char h[1024], const Llama3Config* c) {
    int32_t ints[256] = {0};
    ints[0] = MODEL_MAGIC, ints[1] = MODEL_VERSION_FP32, ints[2] = c->max_seq_len, ints[3] = c->vocab_size;
    ints[4] = c->n_layer, ints[5] = c->n_head, ints[6] = c->n_kv_head, ints[7] = c->n_embd;
    memcpy(&ints[8], &c->ffn_dim_multiplier, 4);
    ints[9] = c->multiple_of;
    memcpy(&ints[10], &c->norm_eps, 4);
    memcpy(&ints[11], &c->rope_theta, 4);
    ints[12] = c->use_scaled_rope, ints[13] = 4, ints[14] = 3, ints[15] = 2;
    ints[16] = c->tied_embeddings;
    memcpy(&ints[17], &c->rope_factor, 4);
    memcpy(h, ints, 1024);
}

// ---- vocabulary (decoding generated tokens) ----
// data/llama3_vocab.bin, written by scripts/prepare_data.py and linked into the trainer
// (_binary_data_llama3_vocab_bin_start/_end): a header of 256 little-endian int32 ([0] magic
// VOCAB_MAGIC, [1] version 1, [2] n_tokens, [3] total bytes of all tokens, rest 0), then n_tokens+1
// little-endian uint32 offsets (offset[0] = 0, non-decreasing, offset[n_tokens] = total), then the
// bytes. Token i is bytes[offset[i] : offset[i+1]]: its raw BPE bytes, or a special token's name
// ("<|begin_of_text|>"). The magic is not CKPT_MAGIC (20241201): a state.bin is refused as a table.

#define VOCAB_MAGIC 20241202
#define VOCAB_VERSION 1
#define VOCAB_MAX_TOKENS (1 << 24) // LLaMA 3 has 128256; more is a corrupt header

typedef struct {
    int n_tokens;
    uint32_t* offsets; // n_tokens + 1
    unsigned char* bytes;
} Vocab;

static inline void vocab_free(Vocab* v) {
    free(v->offsets);
    free(v->bytes);
    *v = (Vocab){0, NULL, NULL};
}

// Offsets start at 0, never decrease, stay inside the bytes and end at their total.
static inline int vocab_offsets_check(const Vocab* v, uint32_t total, const char* name, char* err) {
    const uint32_t* o = v->offsets;
    if (o[0] != 0) return l3_fail(err, "%s: offset[0] = %u, not 0", name, o[0]);
    for (int i = 1; i <= v->n_tokens; i++) {
        if (o[i] < o[i - 1])
            return l3_fail(err, "%s: offset[%d] = %u is less than offset[%d] = %u", name, i, o[i], i - 1,
                           o[i - 1]);
        if (o[i] > total)
            return l3_fail(err, "%s: offset[%d] = %u is past the end of the %u bytes of tokens", name, i, o[i],
                           total);
    }
    if (o[v->n_tokens] != total)
        return l3_fail(err, "%s: offset[%d] = %u, not the header's total of %u bytes", name, v->n_tokens,
                       o[v->n_tokens], total);
    return 0;
}

// Copies the table out of a file image (a linked blob need not be 4-byte aligned: integers are
// read with memcpy) once the header matches the size; then checks every offset.
static inline int vocab_parse(Vocab* v, const unsigned char* data, size_t size, const char* name, char* err) {
    *v = (Vocab){0, NULL, NULL};
    if (size < 1024) return shorter_than_header(name, "vocabulary table", size, 1024, err);
    int32_t magic = read_i32(data, 0), version = read_i32(data, 4);
    int32_t n = read_i32(data, 8), total = read_i32(data, 12);
    if (magic != VOCAB_MAGIC)
        return l3_fail(err, "%s: bad magic %d (expected %d, a vocabulary table)", name, magic, VOCAB_MAGIC);
    if (version != VOCAB_VERSION)
        return l3_fail(err, "%s: unknown version %d (this trainer reads version %d)", name, version,
                       VOCAB_VERSION);
    if (n <= 0 || n > VOCAB_MAX_TOKENS || total < 0)
        return l3_fail(err, "%s: corrupt header: %d tokens (1 to %d expected) of %d bytes", name, n,
                       VOCAB_MAX_TOKENS, total);
    size_t offsets_bytes = 4 * ((size_t)n + 1), want = 1024 + offsets_bytes + (size_t)total;
    if (size < want)
        return l3_fail(err, "%s: truncated: %zu bytes, but its header's %d tokens of %d bytes need %zu", name,
                       size, n, total, want);
    if (size > want)
        return l3_fail(err, "%s: %zu trailing bytes after the table of %d tokens of %d bytes", name,
                       size - want, n, total);
    v->n_tokens = n;
    v->offsets = (uint32_t*)malloc(offsets_bytes);
    v->bytes = (unsigned char*)malloc(total ? (size_t)total : 1);
    if (!v->offsets || !v->bytes) {
        vocab_free(v);
        return l3_fail(err, "%s: out of host memory for a table of %zu bytes", name, size);
    }
    memcpy(v->offsets, data + 1024, offsets_bytes);
    memcpy(v->bytes, data + 1024 + offsets_bytes, (size_t)total);
    if (vocab_offsets_check(v, (uint32_t)total, name, err)) {
        vocab_free(v);
        return -1;
    }
    return 0;
}

// Writes the text of ids[0..n) to f: each token's bytes raw (a UTF-8 character split over tokens
// comes out whole once all are written), an id outside the table (another vocabulary) as "<id>".
static inline void vocab_print(FILE* f, const Vocab* v, const int32_t* ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int32_t t = ids[i];
        if (t < 0 || t >= v->n_tokens) fprintf(f, "<%d>", t);
        else fwrite(v->bytes + v->offsets[t], 1, v->offsets[t + 1] - v->offsets[t], f);
    }
}

// ---- token files and the data loader ----

typedef struct {
    uint32_t* tokens;
    size_t n_tokens;
} TokenData;

// The 1024-byte header of an llm.c token file against the file's size: magic and version give
// the token width (4 or 2 bytes), and the count must fill the file exactly.
static inline int tokens_header_check(const unsigned char* h, size_t nbytes, const char* name, size_t* width,
                                      size_t* count, char* err) {
    if (nbytes < 1024) return shorter_than_header(name, "token file", nbytes, 1024, err);
    int32_t magic = read_i32(h, 0), version = read_i32(h, 4), n = read_i32(h, 8);
    if (magic == TOKENS_MAGIC_LLAMA3 && version == 7) *width = 4;
    else if (magic == TOKENS_MAGIC_GPT2 && version == 1) *width = 2;
    else if (magic == TOKENS_MAGIC_LLAMA3 || magic == TOKENS_MAGIC_GPT2)
        return l3_fail(err, "%s: unknown version %d for magic %d", name, version, magic);
    else return l3_fail(err, "%s: bad magic %d (expected %d for LLaMA 3 or %d for GPT-2 tokens)", name,
                        magic, TOKENS_MAGIC_LLAMA3, TOKENS_MAGIC_GPT2);
    if (n < 0 || (nbytes - 1024) != (size_t)n * *width)
        return l3_fail(err, "%s: truncated or corrupt: header says %d tokens of %zu bytes, file holds %zu bytes of tokens",
                       name, n, *width, nbytes - 1024);
    *count = (size_t)n;
    return 0;
}

// Room for `count` tokens, or the amount that could not be had named.
static inline int tokens_alloc(TokenData* d, size_t count, const char* name, char* err) {
    d->n_tokens = count;
    d->tokens = (uint32_t*)malloc(sizeof(uint32_t) * (count ? count : 1));
    if (!d->tokens)
        return l3_fail(err, "%s: out of host memory: its %zu tokens need %.2f GiB", name, count,
                       count * 4.0 / 1073741824.0);
    return 0;
}

// Widens `n` tokens of `width` bytes from src into dst[first..] and checks each against the vocab.
static inline int tokens_widen(uint32_t* dst, const unsigned char* src, size_t n, size_t width, size_t first,
                               int vocab_size, const char* name, char* err) {
    for (size_t i = 0; i < n; i++) {
        uint32_t t;
        if (width == 4) memcpy(&t, src + 4 * i, 4);
        else { uint16_t t16; memcpy(&t16, src + 2 * i, 2); t = t16; }
        if (t >= (uint32_t)vocab_size)
            return l3_fail(err, "%s: token id %u at position %zu is >= vocab_size %d", name, t, first + i, vocab_size);
        dst[first + i] = t;
    }
    return 0;
}

// Parses an llm.c token file image (header + tokens) and checks every token against the vocab.
static inline int tokens_parse(TokenData* d, const unsigned char* bytes, size_t nbytes, const char* name,
                        int vocab_size, char* err) {
    *d = (TokenData){NULL, 0};
    size_t width = 0, count = 0;
    if (tokens_header_check(bytes, nbytes, name, &width, &count, err) || tokens_alloc(d, count, name, err)) return -1;
    if (tokens_widen(d->tokens, bytes + 1024, count, width, 0, vocab_size, name, err)) {
        free(d->tokens);
        d->tokens = NULL;
        return -1;
    }
    return 0;
}

// Reads a token file: the header first (so that a wrong file is refused before it is read), then
// the tokens in chunks straight into their array, each checked against the vocab.
// A token file opened past its header, once the header is checked against the file's size: its
// token width and count; NULL with a message in err.
static inline FILE* tokens_open(const char* path, size_t* width, size_t* count, char* err) {
    long long size;
    FILE* f = open_regular(path, "token file", &size, err);
    if (!f) return NULL;
    unsigned char h[1024];
    size_t got = fread(h, 1, sizeof(h), f);
    if (tokens_header_check(h, got < sizeof(h) ? got : (size_t)size, path, width, count, err) == 0) return f;
    fclose(f);
    return NULL;
}
// The next n tokens of an open token file (of `count`), in chunks, widened into dst[0..n) and
// checked against the vocab.
static inline int tokens_read(FILE* f, uint32_t* dst, size_t n, size_t width, size_t count, int vocab_size,
                              const char* path, char* err) {
    unsigned char chunk[1 << 16];
    for (size_t done = 0; done < n;) {
        size_t k = n - done < sizeof(chunk) / width ? n - done : sizeof(chunk) / width;
        if (fread(chunk, width, k, f) != k)
            return l3_fail(err, "%s: read failed after %zu of %zu tokens: %s", path, done, count,
                           ferror(f) ? strerror(errno) : "end of file");
        if (tokens_widen(dst, chunk, k, width, done, vocab_size, path, err)) return -1;
        done += k;
    }
    return 0;
}

static inline int tokens_load_file(TokenData* d, const char* path, int vocab_size, char* err) {
    *d = (TokenData){NULL, 0};
    size_t width = 0, count = 0;
    FILE* f = tokens_open(path, &width, &count, err);
    if (!f) return -1;
    int rc = tokens_alloc(d, count, path, err);
    if (rc == 0) rc = tokens_read(f, d->tokens, count, width, count, vocab_size, path, err);
    fclose(f);
    if (rc && d->tokens) {
        free(d->tokens);
        d->tokens = NULL;
    }
    return rc;
}

static inline void tokens_free(TokenData* d) { free(d->tokens), d->tokens = NULL, d->n_tokens = 0; }

// ---- token sources: a token file, shards, or tokens in memory ----
// --input_bin and --val_bin take a token file, a glob of shards (expanded in name order) or a comma
// list of either. Opening a source checks every shard's header against its size (so a missing or
// truncated shard is named before the GPU starts) and that all hold the first one's token format;
// the loader checks each token against the vocab as it reads a shard. The embedded splits and the
// tests' arrays are sources of one shard in memory.
#define TOKENS_HASH_COUNT 65536 // tokens of each shard in the source's identity hash

typedef struct {
    int n;                   // shards
    char** paths;            // each shard's file; NULL: the one shard is in memory
    size_t* counts;          // tokens of each shard
    size_t width;            // bytes per token in the files: 4 (LLaMA-3) or 2 (GPT-2)
    const TokenData* memory; // the one shard in memory (not owned)
    const char* name;        // the flag's value, or what the memory holds: for messages
    size_t total;            // tokens of every shard
    uint64_t hash;           // FNV-1a over each shard's first TOKENS_HASH_COUNT tokens in turn
    int vocab_size;          // every token read is checked against it
} TokenSource;

// FNV-1a of the first TOKENS_HASH_COUNT of n tokens (each token's 4 bytes, little-endian), from h.
static inline uint64_t tokens_hash_from(uint64_t h, const uint32_t* tokens, size_t n) {
    return fnv1a(h, tokens, (n < TOKENS_HASH_COUNT ? n : TOKENS_HASH_COUNT) * sizeof(uint32_t));
}

// One shard in memory (an embedded split, a test's tokens), read in place.
static inline void token_source_memory(TokenSource* s, const TokenData* d, const char* name, int vocab_size) {
    memset(s, 0, sizeof(*s));
    s->n = 1, s->memory = d, s->name = name, s->total = d->n_tokens, s->vocab_size = vocab_size, s->width = 4;
    s->counts = (size_t*)malloc(sizeof(size_t));
    s->counts[0] = d->n_tokens;
    s->hash = tokens_hash_from(FNV1A_OFFSET, d->tokens, d->n_tokens);
}

// A shard file onto the source: its header against its size and the first shard's token format,
// its first tokens (checked against the vocab) into the hash.
static inline int source_add_file(TokenSource* s, const char* path, char* err) {
    size_t width = 0, count = 0;
    FILE* f = tokens_open(path, &width, &count, err);
    if (!f) return -1;
    int rc = 0;
    if (s->n > 0 && width != s->width)
        rc = l3_fail(err, "%s: %s tokens, but %s holds %s tokens: one token format per list", path,
                     width == 4 ? "LLaMA-3 (uint32)" : "GPT-2 (uint16)", s->paths[0],
                     s->width == 4 ? "LLaMA-3 (uint32)" : "GPT-2 (uint16)");
    size_t n_first = count < TOKENS_HASH_COUNT ? count : TOKENS_HASH_COUNT;
    uint32_t* first = (uint32_t*)malloc(TOKENS_HASH_COUNT * 4);
    if (rc == 0 && !first) rc = l3_fail(err, "%s: out of host memory", path);
    if (rc == 0) rc = tokens_read(f, first, n_first, width, count, s->vocab_size, path, err);
    fclose(f);
    if (rc == 0) s->hash = tokens_hash_from(s->hash, first, n_first);
    free(first);
    if (rc) return -1;
    s->paths = (char**)realloc(s->paths, sizeof(char*) * (s->n + 1));
    s->counts = (size_t*)realloc(s->counts, sizeof(size_t) * (s->n + 1));
    if (!s->paths || !s->counts) return l3_fail(err, "%s: out of host memory", path);
    s->paths[s->n] = strdup(path), s->counts[s->n] = count, s->total += count, s->width = width;
    s->n++;
    return 0;
}

// The shards `spec` names (`flag`'s value): each comma-separated item a file, or a glob (one with
// * ? or [) of at least one file, its matches in name order.
static inline int token_source_open(TokenSource* s, const char* spec, const char* flag, int vocab_size, char* err) {
    memset(s, 0, sizeof(*s));
    s->name = spec, s->hash = FNV1A_OFFSET, s->vocab_size = vocab_size;
    char item[L3_PATH_LEN];
    for (const char* p = spec;; p++) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof(item))
            return l3_fail(err, "%s %s: %s", flag, spec, n ? "an item is too long" : "an empty item in the list");
        memcpy(item, p, n), item[n] = 0;
        if (!strpbrk(item, "*?[")) {
            if (source_add_file(s, item, err)) return -1;
        } else {
            glob_t g;
            int rc = glob(item, 0, NULL, &g);
            if (rc == GLOB_NOMATCH) return l3_fail(err, "%s %s: no file matches %s", flag, spec, item);
            if (rc != 0) return l3_fail(err, "%s %s: cannot expand %s", flag, spec, item);
            for (size_t i = 0; i < g.gl_pathc && rc == 0; i++) rc = source_add_file(s, g.gl_pathv[i], err);
            globfree(&g);
            if (rc) return -1;
        }
        p += n;
        if (!*p) return 0;
    }
}

static inline void token_source_free(TokenSource* s) {
    for (int i = 0; s->paths && i < s->n; i++) free(s->paths[i]);
    free(s->paths), free(s->counts);
    memset(s, 0, sizeof(*s));
}

// ---- the data loader ----
// Each optimizer step reads one "group": the step's micro-batches of every rank side by side,
// world*micro_steps*B*T tokens (and one more, the last target) from one shard, micro-step a of rank
// r reading x = group[(a*world + r)*B*T ...] and y the same one token later. A shard of n tokens
// holds (n - 1) / group groups; what is left at its end (fewer tokens than a step) is not read, and
// a shard smaller than one step is skipped. An epoch reads the shards in a permutation drawn from
// the seed and the epoch, and each shard's groups in a permutation drawn from the seed, the epoch
// and the shard (--shuffle 1), or both in order (--shuffle 0). Since a group depends only on the
// product world*micro_steps, N ranks of A micro-steps read, step by step, the same tokens as one
// rank of N*A, through every epoch's end (one rank reads them in another order within the step,
// which changes only the order of the gradients' sums). Position: the epoch, the shard's place in
// the epoch's order, and the group's in the shard's: a checkpoint keeps it, and a resumed run
// reads what the saving run would have read.
typedef struct {
    uint64_t epoch;
    uint64_t shard; // the shard's place in the epoch's order
    uint64_t group; // the next step's group's place in the shard's order (may equal its count: the shard is done)
} LoaderPos;

typedef struct {
    int batch_size, sequence_length, micro_steps; // micro_steps per optimizer step (1: the val loader)
    int rank, world;
    int overfit_single_batch; // every step reads the first group's first micro-batch (of its rank)
    int shuffle;              // --shuffle: shards and groups in permutations drawn from `seed` per epoch
    uint64_t seed;
} LoaderConfig;

// [prefetch] The shard after the current one in the loader's order, read whole on a thread of its
// own while the current one is used: entering it then costs nothing (two shards in host memory).
typedef struct {
    const TokenSource* src;
    size_t id;      // the shard read
    bool started;   // a read of shard `id` was started (and is joined before anything else)
    pthread_t thread;
    TokenData data; // its tokens, once joined
    int rc;
    char err[L3_ERR_LEN];
} ShardPrefetch;

typedef struct {
    const TokenSource* src;
    LoaderConfig cfg;
    size_t batch_tokens, group_tokens; // B*T, and world*micro_steps*B*T
    LoaderPos at;
    int micro;               // micro-steps of the current step read so far
    size_t* shard_order;     // the epoch's order of the shards (src->n)
    size_t* group_order;     // the current shard's order of its groups (n_groups)
    size_t n_groups;
    uint64_t order_epoch;    // the epoch shard_order is of (UINT64_MAX: none yet)
    size_t loaded;           // the shard in `owned` or read in place (SIZE_MAX: none)
    TokenData owned;         // a shard file's tokens, whole
    const TokenData* shard;  // the current shard's tokens
    ShardPrefetch ahead;     // [prefetch] the next shard's
    size_t reads, prefetched; // shard files entered, and of those read ahead (for the tests)
} DataLoader;

// out = 0..n-1 in order, or (shuffle) permuted by Fisher-Yates from the counter-based stream keyed
// by `key` (mix64, as the kernels' streams): the same key, the same permutation, on every host.
static inline void permutation(size_t* out, size_t n, bool shuffle, uint64_t key) {
    for (size_t i = 0; i < n; i++) out[i] = i;
    if (!shuffle) return;
    for (size_t i = n; i > 1; i--) {
        uint64_t r = mix64(key + i * 0x9E3779B97F4A7C15ull);
        size_t j = (size_t)(((unsigned __int128)r * i) >> 64); // uniform in [0, i)
        size_t t = out[i - 1];
        out[i - 1] = out[j], out[j] = t;
    }
}
// The key of epoch `epoch`'s order of the shards (shard UINT64_MAX) or of shard `shard`'s groups.
static inline uint64_t order_key(uint64_t seed, uint64_t epoch, uint64_t shard) {
    return mix64(seed ^ mix64((epoch + 1) * 0x9E3779B97F4A7C15ull ^ mix64((shard + 1) * 0xD1B54A32D192ED03ull)));
}

// Groups of step size in a shard of n tokens.
static inline size_t shard_groups(const DataLoader* l, size_t shard) {
    size_t n = l->src->counts[shard];
    return n ? (n - 1) / l->group_tokens : 0;
}

static inline void* shard_read_thread(void* arg) {
    ShardPrefetch* p = (ShardPrefetch*)arg;
    p->rc = tokens_load_file(&p->data, p->src->paths[p->id], p->src->vocab_size, p->err);
    return NULL;
}
// Waits for the read in flight, if any; its tokens stay in p->data.
static inline void prefetch_join(ShardPrefetch* p) {
    if (p->started) pthread_join(p->thread, NULL);
    p->started = false;
}
// The shard after place l->at.shard in the order: the epoch's next, or the next epoch's first.
static inline size_t next_shard_id(const DataLoader* l) {
    size_t n = (size_t)l->src->n, next;
    if (l->at.shard + 1 < n) return l->shard_order[l->at.shard + 1];
    size_t* order = (size_t*)malloc(sizeof(size_t) * n);
    permutation(order, n, l->cfg.shuffle, order_key(l->cfg.seed, l->at.epoch + 1, UINT64_MAX));
    next = order[0];
    free(order);
    return next;
}
// Shard `id`'s tokens into l->owned, checked against its size at the start: the prefetched read when
// it is that shard, else a read now; then the read of the shard after it started (when another).
static inline int shard_read(DataLoader* l, size_t id, char* err) {
    const TokenSource* s = l->src;
    ShardPrefetch* p = &l->ahead;
    bool ready = p->started && p->id == id;
    prefetch_join(p);
    l->reads++;
    int rc;
    if (ready) {
        l->owned = p->data, p->data = (TokenData){NULL, 0}, rc = p->rc, l->prefetched++;
        if (rc) snprintf(err, L3_ERR_LEN, "%s", p->err);
    } else {
        tokens_free(&p->data);
        rc = tokens_load_file(&l->owned, s->paths[id], s->vocab_size, err);
    }
    if (rc == 0 && l->owned.n_tokens != s->counts[id])
        rc = l3_fail(err, "%s: changed since the run started (%zu tokens, then %zu)", s->paths[id], l->owned.n_tokens,
                     s->counts[id]);
    size_t next = rc ? id : next_shard_id(l);
    if (next != id) {
        p->src = s, p->id = next, p->data = (TokenData){NULL, 0}, p->rc = 0;
        p->started = pthread_create(&p->thread, NULL, shard_read_thread, p) == 0; // (else read when due)
    }
    return rc;
}

// The shard at place l->at.shard of the epoch's order, loaded (and its tokens checked) unless it is
// the one already there, and its group order.
static inline int loader_enter_shard(DataLoader* l, char* err) {
    const TokenSource* s = l->src;
    if (l->order_epoch != l->at.epoch) {
        permutation(l->shard_order, (size_t)s->n, l->cfg.shuffle, order_key(l->cfg.seed, l->at.epoch, UINT64_MAX));
        l->order_epoch = l->at.epoch;
    }
    size_t id = l->shard_order[l->at.shard];
    if (id != l->loaded) {
        tokens_free(&l->owned);
        if (s->memory) l->shard = s->memory;
        else if (shard_read(l, id, err)) return -1;
        else l->shard = &l->owned;
        l->loaded = id;
    }
    l->n_groups = shard_groups(l, id);
    l->group_order = (size_t*)realloc(l->group_order, sizeof(size_t) * (l->n_groups ? l->n_groups : 1));
    if (!l->group_order) return l3_fail(err, "%s: out of host memory for its order", s->name);
    permutation(l->group_order, l->n_groups, l->cfg.shuffle, order_key(l->cfg.seed, l->at.epoch, id));
    return 0;
}

// Moves to the position `pos`, or past it to the first shard in the order with a group left (the
// next epoch's first after the last shard), entering its shard.
static inline int loader_seek(DataLoader* l, LoaderPos pos, char* err) {
    l->at = pos, l->micro = 0;
    for (bool first = true;; first = false, l->at.shard++, l->at.group = 0) {
        if (l->at.shard >= (uint64_t)l->src->n) l->at.epoch++, l->at.shard = 0, l->at.group = 0;
        if (loader_enter_shard(l, err)) return -1;
        if (l->at.group < l->n_groups) return 0;
        if (first && l->at.group > l->n_groups)
            return l3_fail(err, "%s: data position (epoch %llu, shard %llu, step %llu) is past its shard's %zu steps",
                           l->src->name, (unsigned long long)pos.epoch, (unsigned long long)pos.shard,
                           (unsigned long long)pos.group, l->n_groups);
    }
}

static inline int loader_init(DataLoader* l, const TokenSource* s, const LoaderConfig* c, char* err) {
    memset(l, 0, sizeof(*l));
    l->src = s, l->cfg = *c, l->loaded = SIZE_MAX, l->order_epoch = UINT64_MAX;
    l->batch_tokens = (size_t)c->batch_size * c->sequence_length;
    l->group_tokens = l->batch_tokens * c->world * c->micro_steps;
    size_t largest = 0;
    for (int i = 0; i < s->n; i++) largest = s->counts[i] > largest ? s->counts[i] : largest;
    if (largest < l->group_tokens + 1) {
        char per[64] = "";
        int k = snprintf(per, sizeof(per), "%s", c->micro_steps > 1 ? "*micro-steps" : "");
        if (c->world > 1) snprintf(per + k, sizeof(per) - k, "*%d ranks", c->world);
        return l3_fail(err, "%s: not enough tokens for one %s: %zu tokens%s, B*T%s+1 = %zu needed", s->name,
                       c->micro_steps > 1 ? "optimizer step" : "batch", largest, s->n > 1 ? " in its largest shard" : "",
                       per, l->group_tokens + 1);
    }
    l->shard_order = (size_t*)malloc(sizeof(size_t) * s->n);
    if (!l->shard_order) return l3_fail(err, "%s: out of host memory", s->name);
    LoaderPos start = {0, 0, 0};
    return loader_seek(l, start, err);
}

// The training loader's configuration from the flags (the val loader reads in order, one micro-step).
static inline LoaderConfig loader_config(const TrainArgs* a, bool train) {
    LoaderConfig c = {a->loop.batch_size, a->loop.sequence_length, train ? micro_steps(&a->loop) : 1, a->loop.rank, a->loop.world,
                      train && a->loop.overfit_single_batch, train && a->loop.shuffle, a->loop.seed};
    return c;
}

static inline void loader_free(DataLoader* l) {
    prefetch_join(&l->ahead);
    tokens_free(&l->ahead.data);
    tokens_free(&l->owned);
    free(l->shard_order), free(l->group_order);
    l->shard_order = NULL, l->group_order = NULL;
}

// The next micro-batch of this rank: B*T inputs and their targets. The step's first micro-batch
// moves to the next group (a new shard or epoch when this one is done); -1 when a shard cannot be
// read (err names it).
static inline int loader_next(DataLoader* l, int32_t* inputs, int32_t* targets, char* err) {
    if (l->micro == 0 && l->at.group >= l->n_groups && loader_seek(l, l->at, err)) return -1;
    size_t group = l->cfg.overfit_single_batch ? 0 : l->group_order[l->at.group];
    int slot = l->cfg.overfit_single_batch ? l->cfg.rank : l->micro * l->cfg.world + l->cfg.rank;
    const uint32_t* src = l->shard->tokens + group * l->group_tokens + (size_t)slot * l->batch_tokens;
    for (size_t i = 0; i < l->batch_tokens; i++) inputs[i] = (int32_t)src[i], targets[i] = (int32_t)src[i + 1];
    l->micro = (l->micro + 1) % l->cfg.micro_steps;
    if (l->micro == 0 && !l->cfg.overfit_single_batch) l->at.group++;
    return 0;
}

// Steps' groups in one epoch (every shard's): the val loader's batches, at most.
static inline size_t loader_groups(const DataLoader* l) {
    size_t n = 0;
    for (int i = 0; i < l->src->n; i++) n += shard_groups(l, (size_t)i);
    return n;
}

// ---- checks before the GPU ----
// What can be known wrong before the GPU starts: the model's widths against the kernels', the GPU's
// generation, the paths of the outputs, the flags that do not combine. Each says what to change.

// The widths the kernels of kernels.cuh take: RMSNorm rows of at most 8192 (one row in a block's
// registers, 8 values per thread; train_llama3.cu ties this to the kernel's constant) and, for
// flash attention, head_dim 32, 64 or 128 (kernels.cuh HEADDIM_SWITCH).
#define LLAMA3_MAX_N_EMBD 8192
// Rows that a grid of 64-row tiles takes along its y axis (CUDA's 65,535 blocks there): flash
// attention's query and key tiles of T positions, and [fp8] the transposing quantiser's of B*T tokens.
#define LLAMA3_MAX_TILED_ROWS (65535 * 64)
static inline int kernel_limits_check(const Llama3Config* c, int flash_attention, const char* source, char* err) {
    if (c->n_embd > LLAMA3_MAX_N_EMBD)
        return l3_fail(err, "%s: n_embd %d is more than the %d the RMSNorm kernels take", source, c->n_embd,
                       LLAMA3_MAX_N_EMBD);
    const int head_dim = c->n_embd / c->n_head;
    if (flash_attention && head_dim != 32 && head_dim != 64 && head_dim != 128)
        return l3_fail(err, "%s: head_dim %d: flash attention takes head_dim 32, 64 or 128 (--flash_attention 0 runs "
                       "attention unfused)", source, head_dim);
    return 0;
}

// The GPUs the build runs on: bf16 tensor cores (mma.sync, sm_80) and up. The Makefile builds sm_80
// and sm_90a machine code and compute_80 PTX, which the driver compiles for newer GPUs at start.
#define LLAMA3_MIN_COMPUTE_CAPABILITY 80
static inline int gpu_check(int major, int minor, const char* name, char* err) {
    if (major * 10 + minor < LLAMA3_MIN_COMPUTE_CAPABILITY)
        return l3_fail(err, "GPU 0 (%s) has compute capability %d.%d: train_llama3 needs %d.%d or newer (bf16 tensor "
                       "cores: A100, H100, H200 and later)", name, major, minor, LLAMA3_MIN_COMPUTE_CAPABILITY / 10,
                       LLAMA3_MIN_COMPUTE_CAPABILITY % 10);
    return 0;
}

// The val split of a user's token files when --val_bin is not given: prepare_data.py writes
// NAME_val.bin beside NAME_train.bin, or beside the shards NAME_train_*.bin. Written to out
// (L3_PATH_LEN bytes); -1 with a message when
// there is none (the embedded val split belongs to the embedded training data only).
static inline int val_path_beside(const char* input_bin, char* out, char* err) {
    static const char* const TRAIN[2] = {"_train.bin", "_train_*.bin"}; // (a file; prepare_data.py's shards)
    size_t n = strlen(input_bin), suffix = 0;
    struct stat st;
    for (int i = 0; i < 2; i++)
        if (n >= strlen(TRAIN[i]) && !strcmp(input_bin + n - strlen(TRAIN[i]), TRAIN[i])) suffix = strlen(TRAIN[i]);
    if (!suffix || n >= L3_PATH_LEN)
        return l3_fail(err, "--val_every with --input_bin %s: pass --val_bin (a val split is looked for beside the "
                       "token files only for NAME_train.bin or NAME_train_*.bin)", input_bin);
    snprintf(out, L3_PATH_LEN, "%.*s_val.bin", (int)(n - suffix), input_bin);
    if (stat(out, &st) != 0 || !S_ISREG(st.st_mode))
        return l3_fail(err, "--val_every with --input_bin %s: no val split %s beside it: pass --val_bin, or write one "
                       "with scripts/prepare_data.py", input_bin, out);
    return 0;
}

// Where the model's config comes from, for messages.
static inline const char* model_source(const TrainArgs* a) {
    return a->loop.hf_dir ? a->loop.hf_dir : a->loop.llmc_filepath ? a->loop.llmc_filepath
                                                                   : "the default LLaMA3.2-1B config";
}

// Whether two paths name one file (device and inode, links followed); false if either is missing.
static inline int same_file(const char* x, const char* y) {
    struct stat sx, sy;
    return x && y && stat(x, &sx) == 0 && stat(y, &sy) == 0 && sx.st_dev == sy.st_dev && sx.st_ino == sy.st_ino;
}
// Whether `path` names one of a token source's files (directly or through a link).
static inline bool source_holds(const TokenSource* s, const char* path) {
    for (int i = 0; s->paths && i < s->n; i++)
        if (same_file(path, s->paths[i])) return true;
    return false;
}

// What an existing --log_file may be: a file that takes the log's lines as they come (a regular file, a
// pipe such as >(jq .), a character device such as /dev/null or /dev/full); never a directory (which
// no open for writing takes), a block device (whose bytes the log would overwrite) or a socket. A
// resumed run reads and cuts its log (log_open): a regular file only. Checked without opening it.
static inline int log_file_kind_check(const char* path, int resumed, char* err) {
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode)) return 0;
    if (resumed)
        return l3_fail(err, "--log_file %s: is %s, not a regular file (a resumed run reads its log to continue it)",
                       path, file_kind(st.st_mode));
    if (!S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode))
        return l3_fail(err, "--log_file %s: is %s, not a file to write the log to (a regular file, a pipe, or a "
                       "device such as /dev/null)", path, file_kind(st.st_mode));
    return 0;
}

// No output may be one of the inputs: a --log_file naming the model or the eval file (directly or
// through a link) would empty it before anything is read (the token files: source_holds, as they
// are opened), a --save_hf naming the --hf_dir folder would be written over. The model is given one
// way. Whether each output can be written: outputs_writable, once the model's size is known.
static inline int outputs_check(const TrainArgs* a, char* err) {
    const char* inputs[2][2] = {{"--llmc_filepath", a->loop.llmc_filepath}, {"--eval_file", a->eval.eval_file}};
    for (int i = 0; i < 2; i++)
        if (same_file(a->loop.log_file, inputs[i][1]))
            return l3_fail(err, "--log_file %s is the same file as %s %s, an input: not overwritten", a->loop.log_file,
                           inputs[i][0], inputs[i][1]);
    if (a->loop.hf_dir && same_file(a->loop.save_hf, a->loop.hf_dir))
        return l3_fail(err, "--save_hf %s is the --hf_dir folder, an input: its files would be written over",
                       a->loop.save_hf);
    if (a->loop.hf_dir && a->loop.llmc_filepath)
        return l3_fail(err, "--hf_dir %s and --llmc_filepath %s: give the model one way", a->loop.hf_dir,
                       a->loop.llmc_filepath);
    if (a->ckpt.resume && (a->loop.llmc_filepath || a->loop.hf_dir))
        return l3_fail(err, "--resume loads the checkpoint's model: %s %s cannot be used with it",
                       a->loop.hf_dir ? "--hf_dir" : "--llmc_filepath", model_source(a));
    return 0;
}

// Checks that need the model: the widths the kernels take, sequence length, B*T dividing the
// total batch, deferred layers.
// Under several ranks: the rendezvous is given, and the ablation without shadow weights refused
// (each rank's fp32 masters are current in its own parts only).
static inline int dist_args_check(const TrainArgs* a, char* err) {
    if (!a->dist.rendezvous)
        return l3_fail(err, "%d ranks: --rendezvous file:PATH or tcp:HOST:PORT is needed, for rank 0 to hand NCCL's id "
                       "to the others", a->loop.world);
    if (!a->sw.shadow_weights)
        return l3_fail(err, "--shadow_weights 0 under %d ranks: the matmuls read the all-gathered bf16 shadow weights",
                       a->loop.world);
    return 0;
}

// [fp8] What --fp8 1 takes: the FP8 kernels' shapes (64 x 64 transpose tiles: every block linear's
// width and bt = B*T multiples of 64), and the shadow weights it quantises. The one owner of these rules:
// train_args_check calls it through fp8_args_check, the trainer's model_create directly.
static inline int fp8_check(const Llama3Config* c, long long bt, const Switches* sw, char* err) {
    if (bt % 64) return l3_fail(err, "--fp8 1: --batch_size * --sequence_length = %lld must be a multiple of 64", bt);
    if (bt > LLAMA3_MAX_TILED_ROWS)
        return l3_fail(err, "--fp8 1: --batch_size * --sequence_length = %lld: at most %d (the quantiser's 65535 tiles "
                       "of 64 rows)", bt, LLAMA3_MAX_TILED_ROWS);
    if (c->n_embd % 64 || qkv_dim(c) % 64 || c->ffn_hidden % 64)
        return l3_fail(err, "--fp8 1: the model's n_embd %d, qkv width %d and ffn_hidden %d must be multiples of 64",
                       c->n_embd, qkv_dim(c), c->ffn_hidden);
    if (!sw->shadow_weights) return l3_fail(err, "--fp8 1 needs --shadow_weights 1 (the default)");
    return 0;
}
static inline int fp8_args_check(const TrainArgs* a, const Llama3Config* c, char* err) {
    return fp8_check(c, (long long)a->loop.batch_size * a->loop.sequence_length, &a->sw, err);
}

// The out-of-memory message's advice: each flag that would shrink this run and that it can take,
// with what it frees: recompute frees activations, not the FP8 copies of the inputs that the
// backward keeps; --fp8 0 frees those; --flash_attention 1 the unfused attention's T x T buffers,
// first, since at long T they outgrow everything else; a --classifier_chunk of 4096 rows the logits
// beyond 4096 x vocab_size (1 GiB at LLaMA 3's vocabulary).
typedef struct {
    int moments, recompute, fp8;   // this run's --optimizer_state, --recompute and --fp8
    int weights;                   // and --master_weights
    double masters_gib;            // the fp32 masters of the matmul weights (what --master_weights bf16 frees)
    int offload;                   // and --offload_optimizer
    double moments_gib;            // AdamW's m and v on the GPU (what --offload_optimizer 1 frees)
    double acts_blocks_gib;        // the activations at --recompute 2
    double fp8_gib;                // the FP8 copies (0 without --fp8 1)
    double unfused_gib;            // the unfused attention's T x T scores and probabilities (0 with flash attention)
    int head_rows;                 // [chunked classifier] the rows of its chunks
    double logits_gib;             // and one chunk's logits
} FitAdvice;
#define CLASSIFIER_ADVICE_ROWS 4096
// Appends fmt's text to out (n bytes) at *k, cut at its end; *k moves by the whole text's length.
static inline void advise(char* out, size_t n, size_t* k, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(out + (*k < n ? *k : n - 1), *k < n ? n - *k : 1, fmt, ap);
    va_end(ap);
    *k += len > 0 ? (size_t)len : 0;
}
static inline void fit_advice(const FitAdvice* f, char* out, size_t n) {
    size_t k = 0;
#define ADVISE(...) advise(out, n, &k, __VA_ARGS__)
    out[0] = 0;
    if (f->unfused_gib > 0)
        ADVISE("--flash_attention 1 (frees the unfused attention's T x T scores and probabilities, %.2f GiB), ",
               f->unfused_gib);
    if (f->moments == MOMENTS_FP32) ADVISE("--optimizer_state bf16 (m and v in half), ");
    if (f->weights == WEIGHTS_FP32)
        ADVISE("--master_weights bf16 (frees the fp32 masters' %.2f GiB), ", f->masters_gib);
    if (f->recompute < RECOMPUTE_BLOCKS) ADVISE("--recompute 2 (activations %.2f GiB), ", f->acts_blocks_gib);
    if (!f->offload) ADVISE("--offload_optimizer 1 (m and v's %.2f GiB to host memory; slower), ", f->moments_gib);
    if (f->fp8) ADVISE("--fp8 0 (frees the FP8 copies' %.2f GiB), ", f->fp8_gib);
    if (f->head_rows > CLASSIFIER_ADVICE_ROWS)
        ADVISE("--classifier_chunk %d (frees %.2f GiB of logits), ", CLASSIFIER_ADVICE_ROWS,
               f->logits_gib * (1.0 - (double)CLASSIFIER_ADVICE_ROWS / f->head_rows));
    ADVISE("a smaller --batch_size or --sequence_length (activations%s scale with B*T; keep --total_batch_size for "
           "the same step), more ranks (ZeRO-1 divides m and v)", f->fp8 ? " and the FP8 copies of the inputs" : "");
#undef ADVISE
}

// [offload] Pinned host memory is never paged out: AdamW's state there may take at most 90 % of the
// machine's physical memory, the rest left to the process's other buffers (the checkpoints' host copy
// of the weights among them) and to the system.
static inline int offload_check(size_t need, size_t physical, char* err) {
    if (need <= physical / 10 * 9) return 0;
    return l3_fail(err, "--offload_optimizer 1: AdamW's m and v need %.2f GiB of pinned host memory, more than 90 %% "
                   "of this machine's %.2f GiB", need / 1073741824.0, physical / 1073741824.0);
}

// [family] --shape is the random init's: a model file or a checkpoint brings its own shape, so
// another --shape beside one is refused (checked before the file is read).
static inline int shape_args_check(const TrainArgs* a, char* err) {
    if (a->loop.shape == SHAPE_1B || !(a->loop.llmc_filepath || a->loop.hf_dir || a->ckpt.resume)) return 0;
    char shape[16];
    flag_format(a, flag_find("--shape"), shape, sizeof(shape));
    return l3_fail(err, "--shape %s: %s gives the model's shape; leave --shape out", shape,
                   a->ckpt.resume ? "--resume's model.bin" : a->loop.hf_dir ? "--hf_dir" : "--llmc_filepath");
}

static inline int train_args_check(const TrainArgs* a, const Llama3Config* c, char* err) {
    if (kernel_limits_check(c, a->sw.flash_attention, model_source(a), err)) return -1;
    if (a->sw.deferred_adamw > c->n_layer)
        return l3_fail(err, "--deferred_adamw %d is more than the model's %d layers", a->sw.deferred_adamw, c->n_layer);
    if (a->loop.sequence_length > c->max_seq_len)
        return l3_fail(err, "--sequence_length %d is longer than the model allows (max_seq_len %d)",
                       a->loop.sequence_length, c->max_seq_len);
    if (a->sw.flash_attention && a->loop.sequence_length > LLAMA3_MAX_TILED_ROWS)
        return l3_fail(err, "--sequence_length %d: flash attention takes at most %d (65535 tiles of 64 positions)",
                       a->loop.sequence_length, LLAMA3_MAX_TILED_ROWS);
    long long bt = (long long)a->loop.batch_size * a->loop.sequence_length * a->loop.world;
    char ranks[48] = ""; // the world size in the messages, under several ranks
    if (a->loop.world > 1) snprintf(ranks, sizeof(ranks), " * %d ranks", a->loop.world);
    if (bt > (1LL << 30)) return l3_fail(err, "--batch_size * --sequence_length%s = %lld is too large", ranks, bt);
    if (a->loop.total_batch_size % bt != 0) { // name the multiples on either side
        long long above = (a->loop.total_batch_size / bt + 1) * bt;
        char multiples[96];
        int len = snprintf(multiples, sizeof(multiples), "%lld (%lld micro-step%s)", above, above / bt, above > bt ? "s" : "");
        if (above > bt)
            snprintf(multiples + len, sizeof(multiples) - len, " or %lld (%lld micro-step%s)", above - bt,
                     above / bt - 1, above > 2 * bt ? "s" : "");
        return l3_fail(err, "--total_batch_size %d is not a multiple of --batch_size * --sequence_length%s = %lld: pass "
                       "%s, or leave it out for one micro-step", a->loop.total_batch_size, ranks, bt, multiples);
    }
    if (a->loop.stop_after > a->optim.sched.total)
        return l3_fail(err, "--stop_after %d is past the schedule's last step, --num_iteration %d", a->loop.stop_after,
                       a->optim.sched.total);
    if (!a->eval.eval_every != !a->eval.eval_file)
        return l3_fail(err, "%s", a->eval.eval_file ? "--eval_file takes --eval_every N (how often to score it)"
                                                    : "--eval_every takes --eval_file (the set to score)");
    if (a->ckpt.hf && !a->ckpt.dir)
        return l3_fail(err, "--save_hf_checkpoints 1 takes --checkpoint_dir (the folders that get hf/)");
    if (a->loop.save_hf_dtype != HF_DTYPE_BF16 && !a->loop.save_hf && !a->ckpt.hf)
        return l3_fail(err, "--save_hf_dtype float32 takes --save_hf or --save_hf_checkpoints 1 (the folders it is for)");
    if (a->eval.sample_every && a->eval.sample_tokens >= a->loop.sequence_length)
        return l3_fail(err, "--sample_tokens %d: at most --sequence_length - 1 = %d (a sample is one sequence)",
                       a->eval.sample_tokens, a->loop.sequence_length - 1);
    if (a->loop.world > 1 && dist_args_check(a, err)) return -1;
    if (a->loop.fp8 && fp8_args_check(a, c, err)) return -1;
    if (a->optim.weights == WEIGHTS_BF16 && !a->sw.shadow_weights)
        return l3_fail(err, "--master_weights bf16 needs --shadow_weights 1 (the default): the bf16 copy is the "
                       "weight");
    if (!a->loop.fp8 && a->loop.fp8_grads != FP8_GRADS_E5M2)
        return l3_fail(err, "--fp8_grads e4m3 takes --fp8 1 (without it no gradient is in FP8)");
    if (a->eval.top_k > c->vocab_size)
        return l3_fail(err, "--top_k %d is more than the vocabulary (%d)", a->eval.top_k, c->vocab_size);
    if (a->loop.bos_id >= c->vocab_size)
        return l3_fail(err, "--bos_id %d is past the vocabulary (%d tokens)", a->loop.bos_id, c->vocab_size);
    if (a->loop.doc_mask && bos_token(&a->loop, c) < 0)
        return l3_fail(err, "--doc_mask 1: the vocabulary of %d tokens has no LLaMA 3 BOS (%d): name the token that "
                       "starts a document with --bos_id", c->vocab_size, LLAMA3_BOS);
    return 0;
}

// ---- the multiple-choice eval file (--eval_file) ----
// A set of examples, each a context and n_endings endings of which one (the label) is right, as
// HellaSwag's; prepare_data.py --hellaswag writes it with the LLaMA-3 tokenizer. The file: 256 int32
// (magic EVAL_MAGIC, version 1, n_examples, n_endings, n_tokens, rest 0); per example n_endings + 2
// int32 (label, context length, each ending's length); then n_tokens uint32, example by example:
// its context, then its endings in order. An example is scored as llm.c scores HellaSwag: each
// ending after the context is one row, and the ending of lowest mean loss over its own tokens is
// the model's pick.
#define EVAL_MAGIC 20241206
#define EVAL_MAX_ENDINGS 16

typedef struct {
    int n, n_endings;
    int32_t* record;    // (n, n_endings + 2): label, context length, each ending's length
    size_t* first;      // each example's first token in `tokens`
    uint32_t* tokens;
    size_t n_tokens;
} EvalSet;

static inline int eval_label(const EvalSet* e, int i) { return e->record[(size_t)i * (e->n_endings + 2)]; }
static inline int eval_context(const EvalSet* e, int i) { return e->record[(size_t)i * (e->n_endings + 2) + 1]; }
static inline int eval_ending(const EvalSet* e, int i, int k) { return e->record[(size_t)i * (e->n_endings + 2) + 2 + k]; }

static inline void eval_free(EvalSet* e) {
    free(e->record), free(e->first), free(e->tokens);
    memset(e, 0, sizeof(*e));
}

// Every record against the file's counts, and each example against the rows it needs: context plus
// its longest ending, at most T + 1 tokens (T inputs and the shifted targets).
static inline int eval_records_check(EvalSet* e, const char* path, int T, char* err) {
    size_t at = 0;
    for (int i = 0; i < e->n; i++) {
        int label = eval_label(e, i), ctx = eval_context(e, i), longest = 0;
        if (label < 0 || label >= e->n_endings || ctx < 1)
            return l3_fail(err, "%s: example %d: label %d (of %d endings) or context length %d out of range", path, i,
                           label, e->n_endings, ctx);
        e->first[i] = at, at += (size_t)ctx;
        for (int k = 0; k < e->n_endings; k++) {
            int len = eval_ending(e, i, k);
            if (len < 1) return l3_fail(err, "%s: example %d: ending %d has length %d", path, i, k, len);
            longest = len > longest ? len : longest, at += (size_t)len;
        }
        if (at > e->n_tokens)
            return l3_fail(err, "%s: example %d: its tokens run past the file's %zu", path, i, e->n_tokens);
        if ((long long)ctx + longest > (long long)T + 1)
            return l3_fail(err, "%s: example %d is %d tokens (context %d, longest ending %d): more than "
                           "--sequence_length %d + 1", path, i, ctx + longest, ctx, longest, T);
    }
    if (at != e->n_tokens)
        return l3_fail(err, "%s: the examples hold %zu tokens, the header says %zu", path, at, e->n_tokens);
    return 0;
}

// Reads and checks an eval file (every token below vocab_size, every example at most T + 1 tokens).
static inline int eval_read(EvalSet* e, const char* path, int vocab_size, int T, char* err) {
    memset(e, 0, sizeof(*e));
    long long size;
    FILE* f = open_regular(path, "eval file", &size, err);
    if (!f) return -1;
    int32_t h[256];
    int rc = fread(h, 1, sizeof(h), f) == sizeof(h) ? 0 : shorter_than_header(path, "eval file", size, sizeof(h), err);
    if (rc == 0 && (h[0] != EVAL_MAGIC || h[1] != 1))
        rc = l3_fail(err, "%s: bad magic %d or version %d (expected %d, 1: an eval file of prepare_data.py --hellaswag)",
                     path, h[0], h[1], EVAL_MAGIC);
    if (rc == 0 && (h[2] < 1 || h[3] < 2 || h[3] > EVAL_MAX_ENDINGS || h[4] < 0))
        rc = l3_fail(err, "%s: corrupt header (%d examples, %d endings, %d tokens)", path, h[2], h[3], h[4]);
    long long records = rc ? 0 : (long long)h[2] * (h[3] + 2);
    if (rc == 0 && size != 1024 + 4 * records + 4LL * h[4])
        rc = l3_fail(err, "%s: truncated or corrupt: %lld bytes, its header says %lld", path, size,
                     1024 + 4 * records + 4LL * h[4]);
    if (rc == 0) {
        e->n = h[2], e->n_endings = h[3], e->n_tokens = (size_t)h[4];
        e->record = (int32_t*)malloc(4 * (size_t)records), e->first = (size_t*)malloc(sizeof(size_t) * e->n);
        e->tokens = (uint32_t*)malloc(4 * (e->n_tokens ? e->n_tokens : 1));
        if (!e->record || !e->first || !e->tokens) rc = l3_fail(err, "%s: out of host memory", path);
    }
    if (rc == 0 && (fread(e->record, 4, (size_t)records, f) != (size_t)records ||
                    fread(e->tokens, 4, e->n_tokens, f) != e->n_tokens))
        rc = l3_fail(err, "%s: read failed: %s", path, ferror(f) ? strerror(errno) : "end of file");
    fclose(f);
    for (size_t i = 0; rc == 0 && i < e->n_tokens; i++)
        if (e->tokens[i] >= (uint32_t)vocab_size)
            rc = l3_fail(err, "%s: token id %u at position %zu is >= vocab_size %d", path, e->tokens[i], i, vocab_size);
    if (rc == 0) rc = eval_records_check(e, path, T, err);
    if (rc) eval_free(e);
    return rc;
}

// Row k of example i: inputs and targets of T positions (the context then ending k, zeros after),
// and the positions whose targets are the ending's tokens, [*from, *to).
static inline void eval_row(const EvalSet* e, int i, int k, int T, int32_t* inputs, int32_t* targets, int* from,
                            int* to) {
    int ctx = eval_context(e, i), len = ctx + eval_ending(e, i, k);
    const uint32_t* c = e->tokens + e->first[i];
    const uint32_t* end = c + ctx;
    for (int j = 0; j < k; j++) end += eval_ending(e, i, j);
    for (int t = 0; t < T; t++) {
        int a = t, b = t + 1; // the row's token t and t + 1
        inputs[t] = a < len ? (int32_t)(a < ctx ? c[a] : end[a - ctx]) : 0;
        targets[t] = b < len ? (int32_t)(b < ctx ? c[b] : end[b - ctx]) : 0;
    }
    *from = ctx - 1, *to = len - 1;
}

// The pick among an example's endings: the lowest mean loss (the first of equals).
static inline int eval_pick(const double* mean_loss, int n_endings) {
    int best = 0;
    for (int k = 1; k < n_endings; k++)
        if (mean_loss[k] < mean_loss[best]) best = k;
    return best;
}

// ---- checkpoints ----
// --checkpoint_dir DIR holds one folder per saved step and a pointer to the newest complete one:
//   DIR/step_00000020/model.bin  the weights after step 20, seed format, fp32 (--llmc_filepath reads it)
//   DIR/step_00000020/state.bin  CheckpointState (256 bytes), then AdamW m and v (fp32, our layout)
//   DIR/latest                   "step_00000020\n"
// Every file is written to a temporary name in its folder, fsynced and renamed, the folder fsynced;
// model.bin first, then state.bin (a folder with state.bin is complete), then latest. A process
// killed at any moment of a save leaves the previous checkpoint intact, and --resume DIR takes the
// newest complete one: latest's, or the one whose save was killed after state.bin, before latest.

#define CKPT_MAGIC 20241201
#define CKPT_VERSION 4 // 4: the loader's epoch, shard and group, --shuffle and the shards; 3: the moments'
                       // dtype; 2: the rank, the world size and the state's length (1: one rank; 1 and 2
                       // hold fp32 moments, read as such; 1 to 3 one token file read in order)
#define CKPT_HEADER_BYTES 256

// What resumes a run exactly, besides the weights and AdamW's m and v. Fixed-width fields in
// natural alignment: the struct's bytes are the file's (little-endian hosts).
typedef struct {
    int32_t magic, version;
    int32_t step; // optimizer steps taken, AdamW's step counter (its bias corrections; the lazy
                  // embedding AdamW uses the same global count, as torch's SparseAdam)
    int32_t batch_size, sequence_length, total_batch_size; // must match on resume
    int32_t num_iteration;                                 // the saving run's, for the reader
    int32_t overfit_single_batch;
    float learning_rate, weight_decay, beta1, beta2, eps; // the saving run's; a resume may change them
    int32_t switches[12];                                  // the saving run's Switches (their rows' order), for the reader
    uint64_t seed;        // the random init's seed: the run's only randomness (no dropout)
    uint64_t n_params;    // parameters of the model (m and v hold this many floats each)
    uint64_t loader_pos;  // versions 1 to 3: token offset of the next step's batch (4: 0)
    uint64_t data_tokens; // the token data's identity: its length (every shard's) and the source's hash
    uint64_t data_hash;
    int32_t lr_schedule, warmup_iters; // the saving run's schedule and clipping, for the reader; the lr
    float final_lr_frac, decay_frac;   // of a resumed step follows the resuming run's flags
    float grad_clip;
    int32_t rank, world;   // [data parallel] whose share of AdamW's state this file holds, of how many ranks
    uint64_t state_floats; // values each of m and v in the file: n_params, or a rank's share (zero_layout)
    int32_t moments;       // their dtype: MOMENTS_FP32 (4 bytes each) or MOMENTS_BF16 (2), as --optimizer_state
    int32_t shuffle;       // the loader's --shuffle, and the shards of its source
    int32_t data_shards;
    uint64_t loader_epoch, loader_shard, loader_group; // the next step's LoaderPos
} CheckpointState;
static_assert(sizeof(CheckpointState) <= CKPT_HEADER_BYTES, "the state header fits its 256 bytes");
static_assert(sizeof(Switches) == sizeof(((CheckpointState*)0)->switches),
              "CheckpointState.switches records the Switches: another switch needs a new CKPT_VERSION");

// state_floats: this rank's values of m (n_params with one rank); l: the training loader after the step.
static inline CheckpointState checkpoint_state_make(const TrainArgs* a, int step, size_t n_params, size_t state_floats,
                                                    const DataLoader* l) {
    CheckpointState st;
    memset(&st, 0, sizeof(st));
    st.magic = CKPT_MAGIC, st.version = CKPT_VERSION, st.step = step;
    st.batch_size = a->loop.batch_size, st.sequence_length = a->loop.sequence_length, st.total_batch_size = a->loop.total_batch_size;
    st.num_iteration = a->optim.sched.total, st.overfit_single_batch = a->loop.overfit_single_batch;
    st.learning_rate = a->optim.sched.peak_lr, st.weight_decay = a->optim.weight_decay;
    st.beta1 = a->optim.beta1, st.beta2 = a->optim.beta2, st.eps = a->optim.eps;
    memcpy(st.switches, &a->sw, sizeof(a->sw));
    st.seed = a->loop.seed, st.n_params = n_params;
    st.data_tokens = l->src->total, st.data_hash = l->src->hash, st.data_shards = l->src->n;
    st.shuffle = l->cfg.shuffle, st.loader_epoch = l->at.epoch, st.loader_shard = l->at.shard, st.loader_group = l->at.group;
    st.lr_schedule = a->optim.sched.kind, st.warmup_iters = a->optim.sched.warmup;
    st.final_lr_frac = a->optim.sched.final_frac, st.decay_frac = a->optim.sched.decay_frac, st.grad_clip = a->optim.grad_clip;
    st.rank = a->loop.rank, st.world = a->loop.world, st.state_floats = state_floats, st.moments = a->optim.moments;
    return st;
}

// Formats a path into out (L3_PATH_LEN bytes); -1 with a message in err when it does not fit.
static inline int path_fmt(char* out, char* err, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, L3_PATH_LEN, fmt, ap);
    va_end(ap);
    return n < 0 || n >= L3_PATH_LEN ? l3_fail(err, "path too long: %.200s...", out) : 0;
}

// One piece of a file being written: `bytes` bytes at `data`.
typedef struct {
    const void* data;
    size_t bytes;
} Chunk;

static inline int write_all(int fd, const void* data, size_t bytes) {
    const char* p = (const char*)data;
    while (bytes) {
        ssize_t w = write(fd, p, bytes < (1u << 30) ? bytes : (1u << 30));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w, bytes -= (size_t)w;
    }
    return 0;
}

static inline int fsync_dir_of(const char* path) {
    char dir[L3_PATH_LEN], err[L3_ERR_LEN];
    if (path_fmt(dir, err, "%s", path)) return -1;
    char* slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    int fd = open(slash ? (dir[0] ? dir : "/") : ".", O_RDONLY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

// A file's bytes produced piece by piece: each call sets *data to the next piece and returns its
// length, 0 at the end (a piece is only read before the next call).
typedef size_t (*PieceSource)(void* ctx, const void** data);

// Writes the pieces of `source` to `path` whole or not at all: a temporary file beside it, fsynced,
// renamed over `path`, then the folder fsynced so that the rename itself survives a crash.
static inline int write_pieces_atomic(const char* path, PieceSource source, void* ctx, char* err) {
    char tmp[L3_PATH_LEN];
    if (path_fmt(tmp, err, "%s.tmp.%d", path, (int)getpid())) return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return l3_fail(err, "%s: cannot create: %s", tmp, strerror(errno));
    const void* data;
    for (size_t bytes; (bytes = source(ctx, &data)) > 0;)
        if (write_all(fd, data, bytes)) {
            l3_fail(err, "%s: write failed: %s", tmp, strerror(errno));
            close(fd), unlink(tmp);
            return -1;
        }
    if (fsync(fd) || close(fd)) {
        l3_fail(err, "%s: write failed: %s", tmp, strerror(errno));
        unlink(tmp);
        return -1;
    }
    if (rename(tmp, path) || fsync_dir_of(path)) {
        l3_fail(err, "%s: cannot rename into place: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}
// The n chunks as pieces, in order (a Chunk of 0 bytes is skipped).
typedef struct {
    const Chunk* chunk;
    int n, next;
} ChunkList;
static inline size_t next_chunk(void* ctx, const void** data) {
    ChunkList* l = (ChunkList*)ctx;
    while (l->next < l->n && l->chunk[l->next].bytes == 0) l->next++;
    if (l->next == l->n) return 0;
    *data = l->chunk[l->next].data;
    return l->chunk[l->next++].bytes;
}
static inline int write_file_atomic(const char* path, const Chunk* chunks, int n, char* err) {
    ChunkList list = {chunks, n, 0};
    return write_pieces_atomic(path, next_chunk, &list, err);
}

// The weights (our layout, host memory) as a seed-format model file.
static inline int model_file_write(const char* path, const Llama3Config* c, const float* params, char* err) {
    unsigned char header[1024];
    seed_header_write(header, c);
    SegmentList s = seed_file_segments(c, 1024);
    Chunk* chunks = (Chunk*)malloc(sizeof(Chunk) * (s.n + 1));
    chunks[0] = (Chunk){header, sizeof(header)};
    for (int i = 0; i < s.n; i++) chunks[i + 1] = (Chunk){params + s.seg[i].param_offset, s.seg[i].count * 4};
    int rc = write_file_atomic(path, chunks, s.n + 1, err);
    free(chunks), free(s.seg);
    return rc;
}

// The header, then m and v, each st->state_floats values of st->moments' dtype.
static inline int state_file_write(const char* path, const CheckpointState* st, const void* adam_m,
                                   const void* adam_v, char* err) {
    unsigned char header[CKPT_HEADER_BYTES] = {0};
    memcpy(header, st, sizeof(*st));
    size_t bytes = st->state_floats * moment_bytes(st->moments);
    Chunk chunks[3] = {{header, sizeof(header)}, {adam_m, bytes}, {adam_v, bytes}};
    return write_file_atomic(path, chunks, 3, err);
}

// A checkpoint folder's files (L3_PATH_LEN bytes each); the folder's name is "step_%08d".
static inline int checkpoint_paths(const char* dir, int step, char* folder, char* model, char* state, char* err) {
    return path_fmt(folder, err, "%s/step_%08d", dir, step) || path_fmt(model, err, "%s/model.bin", folder) ||
           path_fmt(state, err, "%s/state.bin", folder) ? -1 : 0;
}

static inline int make_dir(const char* path, char* err) {
    if (mkdir(path, 0755) == 0 || errno == EEXIST) {
        struct stat st;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
        return l3_fail(err, "%s: exists and is not a directory", path);
    }
    return l3_fail(err, "%s: cannot create directory: %s", path, strerror(errno));
}

// [data parallel] The state file of `rank` beside rank 0's `state` (.../state.bin): rank 0's is
// state.bin itself, rank r's state_rank<r>.bin.
static inline int rank_state_path(const char* state, int rank, char* out, char* err) {
    size_t n = strlen(state), base = strlen("state.bin");
    if (rank == 0) return path_fmt(out, err, "%s", state);
    return path_fmt(out, err, "%.*sstate_rank%d.bin", (int)(n >= base ? n - base : 0), state, rank);
}

// A save of step `step` from host copies, in its order: model.bin (rank 0's part), then state.bin
// and the latest pointer (rank 0's last part: a folder with state.bin is complete); with
// --save_hf_checkpoints its hf/ between the two (checkpoint_write_hf). With one rank one after the
// other; [data parallel] the other ranks write their state_rank files in between
// (checkpoint_write_rank), and rank 0 writes state.bin only once every rank has written.
static inline int checkpoint_write_model(const char* dir, const Llama3Config* c, int step, const float* params,
                                         char* err) {
    char folder[L3_PATH_LEN], model[L3_PATH_LEN], state[L3_PATH_LEN];
    return checkpoint_paths(dir, step, folder, model, state, err) || make_dir(folder, err) ||
           model_file_write(model, c, params, err) ? -1 : 0;
}
static inline int checkpoint_write_state(const char* dir, const CheckpointState* st, const void* adam_m,
                                         const void* adam_v, char* err) {
    char folder[L3_PATH_LEN], model[L3_PATH_LEN], state[L3_PATH_LEN], latest[L3_PATH_LEN], name[32];
    if (checkpoint_paths(dir, st->step, folder, model, state, err) || path_fmt(latest, err, "%s/latest", dir) ||
        state_file_write(state, st, adam_m, adam_v, err))
        return -1;
    int n = snprintf(name, sizeof(name), "step_%08d\n", st->step);
    Chunk chunk = {name, (size_t)n};
    return write_file_atomic(latest, &chunk, 1, err);
}
static inline int checkpoint_write_rank(const char* dir, const CheckpointState* st, const void* adam_m,
                                        const void* adam_v, char* err) {
    char folder[L3_PATH_LEN], model[L3_PATH_LEN], state[L3_PATH_LEN], mine[L3_PATH_LEN];
    return checkpoint_paths(dir, st->step, folder, model, state, err) || make_dir(folder, err) ||
           rank_state_path(state, st->rank, mine, err) || state_file_write(mine, st, adam_m, adam_v, err) ? -1 : 0;
}

// The step of a folder name "step_%08d", or -1.
static inline int checkpoint_step_of(const char* name) {
    if (strncmp(name, "step_", 5) != 0 || strlen(name) != 13) return -1;
    for (int i = 5; i < 13; i++)
        if (name[i] < '0' || name[i] > '9') return -1;
    return atoi(name + 5);
}

static inline int checkpoint_complete(const char* dir, int step) {
    char folder[L3_PATH_LEN], model[L3_PATH_LEN], state[L3_PATH_LEN], err[L3_ERR_LEN];
    return !checkpoint_paths(dir, step, folder, model, state, err) && file_size_of(model) > 0 &&
           file_size_of(state) > 0;
}

// The steps of DIR's checkpoint folders, complete or not, ascending, in steps[max]; their count.
static inline int checkpoint_list(const char* dir, int* steps, int max) {
    DIR* d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    for (struct dirent* e; (e = readdir(d)) != NULL && n < max;) {
        int step = checkpoint_step_of(e->d_name);
        if (step >= 0) steps[n++] = step;
    }
    closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && steps[j - 1] > steps[j]; j--) { int t = steps[j]; steps[j] = steps[j - 1], steps[j - 1] = t; }
    return n;
}

// Deletes a checkpoint folder and everything in it (temporary files a killed save left included).
// Deletes the folder and its files, and (depth 1) a folder in it with its files: a checkpoint's hf/.
static inline int delete_folder(const char* folder, int depth, char* err) {
    char path[L3_PATH_LEN];
    DIR* d = opendir(folder);
    if (!d) return l3_fail(err, "%s: cannot open: %s", folder, strerror(errno));
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        struct stat st;
        int rc = path_fmt(path, err, "%s/%s", folder, e->d_name);
        if (rc == 0 && depth > 0 && lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) rc = delete_folder(path, depth - 1, err);
        else if (rc == 0 && unlink(path)) rc = l3_fail(err, "%s: cannot delete: %s", path, strerror(errno));
        if (rc) {
            closedir(d);
            return -1;
        }
    }
    closedir(d);
    return rmdir(folder) ? l3_fail(err, "%s: cannot delete: %s", folder, strerror(errno)) : 0;
}
static inline int checkpoint_delete(const char* dir, int step, char* err) {
    char folder[L3_PATH_LEN];
    return path_fmt(folder, err, "%s/step_%08d", dir, step) || delete_folder(folder, 1, err) ? -1 : 0;
}

// After a save of step `newest` is complete: keeps the `keep` newest complete checkpoints and
// deletes the rest older than `newest` (and incomplete folders older than it, which no resume
// can use). Never touches a folder newer than `newest`.
static inline int checkpoint_prune(const char* dir, int newest, int keep, char* err) {
    int steps[4096], n = checkpoint_list(dir, steps, 4096), kept = 0;
    for (int i = n - 1; i >= 0; i--) {
        if (steps[i] > newest) continue;
        int complete = checkpoint_complete(dir, steps[i]);
        if (complete && kept < keep) {
            kept++;
            continue;
        }
        if (checkpoint_delete(dir, steps[i], err)) return -1;
    }
    return 0;
}

// --resume PATH: a checkpoint folder (it has state.bin), or a --checkpoint_dir: its newest complete
// folder. That is the one latest names, or a newer one when a save was killed after its state.bin
// was renamed (the folder is complete) and before latest was replaced. A latest naming a folder
// without its files, or no folder, is refused. Writes the model.bin and state.bin paths
// (L3_PATH_LEN bytes each).
static inline int checkpoint_resolve(const char* path, char* model, char* state, char* err) {
    if (path_fmt(state, err, "%s/state.bin", path) || path_fmt(model, err, "%s/model.bin", path)) return -1;
    if (file_size_of(state) >= 0) return 0;
    char latest[L3_PATH_LEN], name[64] = {0};
    if (path_fmt(latest, err, "%s/latest", path)) return -1;
    FILE* f = fopen(latest, "rb");
    if (f) {
        size_t got = fread(name, 1, sizeof(name) - 1, f);
        fclose(f);
        if (got > 0 && name[got - 1] == '\n') name[got - 1] = '\0';
        int step = checkpoint_step_of(name);
        if (step < 0) return l3_fail(err, "%s: does not name a checkpoint (\"%.20s\")", latest, name);
        if (!checkpoint_complete(path, step))
            return l3_fail(err, "%s/%s: model.bin or state.bin missing (%s names an incomplete checkpoint)", path, name,
                           latest);
    }
    int steps[4096], n = checkpoint_list(path, steps, 4096), newest = -1;
    for (int i = n - 1; i >= 0 && newest < 0; i--)
        if (checkpoint_complete(path, steps[i])) newest = steps[i];
    if (newest < 0) {
        if (file_size_of(path) < 0) return l3_fail(err, "--resume %s: no such file or directory", path);
        return l3_fail(err, "--resume %s: neither a checkpoint (no state.bin) nor a checkpoint folder (no complete "
                       "step_N)", path);
    }
    char folder[L3_PATH_LEN];
    return checkpoint_paths(path, newest, folder, model, state, err);
}

// Reads and checks a state file's header against the model it goes with (n_params).
static inline int state_header_read(const char* path, size_t n_params, CheckpointState* st, char* err) {
    long long size;
    FILE* f = open_regular(path, "checkpoint state file", &size, err);
    if (!f) return -1;
    unsigned char h[CKPT_HEADER_BYTES];
    size_t got = fread(h, 1, sizeof(h), f);
    fclose(f);
    if (got < sizeof(h)) return shorter_than_header(path, "checkpoint state file", got, sizeof(h), err);
    memcpy(st, h, sizeof(*st));
    if (st->magic != CKPT_MAGIC)
        return l3_fail(err, "%s: bad magic %d (expected %d, a checkpoint state file)", path, st->magic, CKPT_MAGIC);
    if (st->version < 1 || st->version > CKPT_VERSION)
        return l3_fail(err, "%s: unknown version %d (expected %d)", path, st->version, CKPT_VERSION);
    if (st->version == 1) st->rank = 0, st->world = 1, st->state_floats = st->n_params; // (one rank's, before ranks)
    if (st->version < 3) st->moments = MOMENTS_FP32;
    if (st->version < 4 && st->total_batch_size > 0) // one token file, in order: its group is the offset's
        st->shuffle = 0, st->data_shards = 1, st->loader_epoch = st->loader_shard = 0,
        st->loader_group = st->loader_pos / (uint64_t)st->total_batch_size;
    if (st->n_params != n_params)
        return l3_fail(err, "%s: from another model: %llu parameters, but its model.bin has %zu", path,
                       (unsigned long long)st->n_params, n_params);
    if (st->world < 1 || st->rank < 0 || st->rank >= st->world || st->state_floats > n_params ||
        (st->moments != MOMENTS_FP32 && st->moments != MOMENTS_BF16))
        return l3_fail(err, "%s: corrupt header (rank %d of %d, %llu state values, moments dtype %d)", path, st->rank,
                       st->world, (unsigned long long)st->state_floats, st->moments);
    long long expected = CKPT_HEADER_BYTES + 2LL * (long long)moment_bytes(st->moments) * (long long)st->state_floats;
    if (size != expected) return l3_fail(err, "%s: truncated or corrupt: %lld bytes, expected %lld", path, size, expected);
    if (st->step < 1 || st->batch_size < 1 || st->sequence_length < 1 || st->total_batch_size < 1)
        return l3_fail(err, "%s: corrupt header (step %d, B %d, T %d)", path, st->step, st->batch_size, st->sequence_length);
    return 0;
}

// Reads m and v (n values each of `bytes` bytes: moment_bytes of the header's dtype) after the header.
static inline int state_arrays_read(const char* path, size_t n, size_t bytes, void* adam_m, void* adam_v, char* err) {
    long long size;
    FILE* f = open_regular(path, "checkpoint state file", &size, err);
    if (!f) return -1;
    int ok = fseeko(f, CKPT_HEADER_BYTES, SEEK_SET) == 0 && fread(adam_m, bytes, n, f) == n &&
             fread(adam_v, bytes, n, f) == n;
    fclose(f);
    return ok ? 0 : l3_fail(err, "%s: truncated inside AdamW's state", path);
}

// A resume continues the saved run: the same batch shape and token data (the data position and
// AdamW's steps mean nothing otherwise), and steps left to run. The lr, the betas, weight decay,
// --num_iteration (the schedule's length) and the switches may change.
static inline int resume_check(const CheckpointState* st, const TrainArgs* a, const TokenSource* d, const char* path,
                               char* err) {
    const struct { const char* flag; int now, saved; } same[] = {
        {"--batch_size", a->loop.batch_size, st->batch_size},
        {"--sequence_length", a->loop.sequence_length, st->sequence_length},
        {"--total_batch_size", a->loop.total_batch_size, st->total_batch_size},
        {"--overfit_single_batch", a->loop.overfit_single_batch, st->overfit_single_batch}};
    for (int i = 0; i < 4; i++)
        if (same[i].now != same[i].saved)
            return l3_fail(err, "--resume %s: %s %d differs from the checkpoint's %d (B, T and the total batch must stay "
                           "as saved)", path, same[i].flag, same[i].now, same[i].saved);
    if (st->moments != a->optim.moments)
        return l3_fail(err, "--resume %s: AdamW's m and v were saved in %s: resume with --optimizer_state %s "
                       "(converting them on load is not done)", path, st->moments == MOMENTS_BF16 ? "bf16" : "fp32",
                       st->moments == MOMENTS_BF16 ? "bf16" : "fp32");
    if (st->world != a->loop.world)
        return l3_fail(err, "--resume %s: saved by %d rank%s, resumed by %d: resume it on %d (re-sharding the AdamW state "
                       "on load is not done)", path, st->world, st->world > 1 ? "s" : "", a->loop.world, st->world);
    if (st->data_tokens != d->total || st->data_hash != d->hash || st->data_shards != d->n)
        return l3_fail(err, "--resume %s: --input_bin %s differs from the checkpoint's token data (%d file%s of %llu "
                       "tokens, hash %016llx; now %d of %zu, %016llx)", path, d->name, st->data_shards,
                       st->data_shards == 1 ? "" : "s", (unsigned long long)st->data_tokens,
                       (unsigned long long)st->data_hash, d->n, d->total, (unsigned long long)d->hash);
    if (st->shuffle != a->loop.shuffle || (st->shuffle && st->seed != a->loop.seed))
        return l3_fail(err, "--resume %s: saved with --shuffle %d%s: resume with the same (the data's order follows "
                       "them)", path, st->shuffle, st->shuffle ? " and its --seed" : "");
    if (st->loader_shard >= (uint64_t)d->n)
        return l3_fail(err, "--resume %s: data position (shard %llu) is past the token data's %d shards", path,
                       (unsigned long long)st->loader_shard, d->n);
    if (last_step(a) <= st->step)
        return l3_fail(err, "--resume %s: the checkpoint is at step %d; %s %d leaves nothing to run", path, st->step,
                       a->loop.stop_after ? "--stop_after" : "--num_iteration", last_step(a));
    return 0;
}

// The checkpoints this run will write must not replace another run's: --checkpoint_dir may not
// hold a complete checkpoint after the step the run starts from (0, or the resumed step).
static inline int checkpoint_dir_check(const char* dir, int start_step, char* err) {
    int steps[4096], n = checkpoint_list(dir, steps, 4096);
    for (int i = n - 1; i >= 0; i--)
        if (steps[i] > start_step && checkpoint_complete(dir, steps[i]))
            return l3_fail(err, "--checkpoint_dir %s already holds step_%08d, after this run's start (step %d): "
                           "--resume from it, or use another folder", dir, steps[i], start_step);
    return 0;
}

// ---- Hugging Face folders written (--save_hf) ----
// The weights as export_hf.py writes them, byte for byte: model.safetensors (the tensors in HF's
// names and order, q and k rows back in HF's half rotation, bf16 rounded to nearest even or fp32),
// config.json (its text as Python's json.dumps(indent=2) prints export_hf.py's dict), and the
// tokenizer files copied from the folder the model came from.
static const char* const HF_TOKENIZER_FILES[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                                  "generation_config.json"};

// Python's repr of float(numpy's str(np.float32(f))), as export_hf.py writes config.json's floats:
// the shortest digits that read back as the float32; fixed notation for exponents -4 to 15 (".0" when
// whole), else d.ddde-05.
static inline void py_float_text(char* out, size_t len, float f) {
    char sci[32], digits[16];
    for (int p = 1; p <= 9; p++) {
        snprintf(sci, sizeof(sci), "%.*e", p - 1, (double)f);
        if (strtof(sci, NULL) == f) break;
    }
    const char* q = sci + (sci[0] == '-');
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    size_t at = snprintf(out, len, "%s", sci[0] == '-' ? "-" : "");
    if (exp < -4 || exp >= 16) {
        snprintf(out + at, len - at, "%c%s%se%c%02d", digits[0], nd > 1 ? "." : "", digits + 1, exp < 0 ? '-' : '+',
                 exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        snprintf(out + at, len - at, "0.%.*s%s", -exp - 1, "0000", digits);
    } else {
        for (int i = 0; i <= exp; i++) at += snprintf(out + at, len - at, "%c", i < nd ? digits[i] : '0');
        snprintf(out + at, len - at, ".%s", nd > exp + 1 ? digits + exp + 1 : "0");
    }
}

// config.json's text as export_hf.py writes it for config c and dtype ("bfloat16" or "float32").
static inline void hf_config_text(char* out, size_t len, const Llama3Config* c, const char* dtype) {
    char eps[32], theta[32], factor[32], mult[32], special[2][16] = {"null", "null"};
    py_float_text(eps, sizeof(eps), c->norm_eps), py_float_text(theta, sizeof(theta), c->rope_theta);
    py_float_text(factor, sizeof(factor), c->rope_factor), py_float_text(mult, sizeof(mult), c->ffn_dim_multiplier);
    if (c->vocab_size == 128256) snprintf(special[0], 16, "128000"), snprintf(special[1], 16, "128001");
    char rope[256] = "null";
    if (c->use_scaled_rope)
        snprintf(rope, sizeof(rope), "{\n    \"low_freq_factor\": 1.0,\n    \"high_freq_factor\": 4.0,\n    "
                 "\"original_max_position_embeddings\": 8192,\n    \"factor\": %s,\n    \"rope_type\": \"llama3\"\n  }",
                 factor);
    snprintf(out, len,
             "{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n  \"model_type\": \"llama\",\n"
             "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n"
             "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
             "  \"hidden_act\": \"silu\",\n  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %s,\n"
             "  \"rope_theta\": %s,\n  \"rope_scaling\": %s,\n  \"attention_bias\": false,\n"
             "  \"attention_dropout\": 0.0,\n  \"mlp_bias\": false,\n  \"tie_word_embeddings\": %s,\n"
             "  \"torch_dtype\": \"%s\",\n  \"bos_token_id\": %s,\n  \"eos_token_id\": %s,\n  \"use_cache\": true,\n"
             "  \"ffn_dim_multiplier\": %s,\n  \"multiple_of\": %d\n}\n",
             c->vocab_size, c->n_embd, c->ffn_hidden, c->n_layer, c->n_head, c->n_kv_head, c->n_embd / c->n_head,
             c->max_seq_len, eps, theta, rope, c->tied_embeddings ? "true" : "false", dtype, special[0], special[1],
             mult, c->multiple_of);
}

// [bf16 weights] n bf16 values held in the upper half of the bytes of x[0, n) (from byte 2n on), widened
// in place to floats x[0, n) (exact): the trainer copies a range of bf16 weights there to hand a
// model file fp32 weights without a second host buffer. Front to back, each value is read before
// any write reaches it: x[i]'s bytes end at 4i + 4 <= 2n + 2(i + 1), where the unread values start.
static inline void widen_bf16_upper_half(float* x, size_t n) {
    const unsigned char* half = (const unsigned char*)x + 2 * n;
    for (size_t i = 0; i < n; i++) {
        uint16_t b;
        memcpy(&b, half + 2 * i, 2);
        uint32_t u = (uint32_t)b << 16;
        memcpy(&x[i], &u, 4);
    }
}

// fp32 to bf16 bits, rounded to nearest even as torch rounds; a NaN stays a (quiet) NaN.
static inline uint16_t bf16_nearest_even(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (isnan(x)) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

// model.safetensors as pieces (write_pieces_atomic): its header, then each tensor converted a
// buffer (or, for q and k, a head) at a time.
typedef struct {
    const Llama3Config* c;
    const float* params; // our layout, host memory
    bool bf16;
    HfPlace* places;
    int n_places, place;  // the tensor being written
    size_t done;          // its elements written so far
    char* header;         // the header piece (length prefix, JSON, padding), given first
    size_t header_bytes;
    float* rows;          // q or k: one head's rows in HF's order
    void* out;            // the piece: buf_elems converted elements
    size_t buf_elems;
} HfWriter;

static inline size_t hf_tensor_elems(const HfPlace* p) { return (size_t)p->rows * (p->cols ? p->cols : 1); }

static inline void hf_writer_header(HfWriter* w) {
    size_t cap = 256 + (size_t)w->n_places * 160, at = 8, offset = 0, item = w->bf16 ? 2 : 4;
    w->header = (char*)malloc(cap + 8);
    at += snprintf(w->header + at, cap - at, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int j = 0; j < w->n_places; j++) {
        const HfPlace* p = &w->places[j];
        size_t end = offset + hf_tensor_elems(p) * item;
        char shape[64];
        if (p->cols) snprintf(shape, sizeof(shape), "%lld,%lld", p->rows, p->cols);
        else snprintf(shape, sizeof(shape), "%lld", p->rows);
        at += snprintf(w->header + at, cap - at, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                       p->name, w->bf16 ? "BF16" : "F32", shape, offset, end);
        offset = end;
    }
    at += snprintf(w->header + at, cap - at, "}");
    while ((at - 8) % 8) w->header[at++] = ' '; // the data 8-byte aligned, as safetensors pads
    uint64_t n = at - 8;
    memcpy(w->header, &n, 8);
    w->header_bytes = at;
}

static inline size_t hf_next_piece(void* ctx, const void** data) {
    HfWriter* w = (HfWriter*)ctx;
    if (w->header_bytes) { // (the first piece; hf_write_weights frees it)
        size_t bytes = w->header_bytes;
        w->header_bytes = 0, *data = w->header;
        return bytes;
    }
    while (w->place < w->n_places && w->done == hf_tensor_elems(&w->places[w->place])) w->place++, w->done = 0;
    if (w->place == w->n_places) return 0;
    const HfPlace* p = &w->places[w->place];
    size_t C = w->c->n_embd, D = C / w->c->n_head, head = D * C;
    size_t n = p->heads ? head : hf_tensor_elems(p) - w->done < w->buf_elems ? hf_tensor_elems(p) - w->done : w->buf_elems;
    const float* src = w->params + p->param_offset + w->done;
    if (p->heads) { // HF's row k * D/2 + i is the trainer's row 2i + k
        for (size_t i = 0; i < D / 2; i++)
            for (size_t k = 0; k < 2; k++) memcpy(w->rows + (k * D / 2 + i) * C, src + (2 * i + k) * C, C * sizeof(float));
        src = w->rows;
    }
    for (size_t i = 0; i < n; i++)
        if (w->bf16) ((uint16_t*)w->out)[i] = bf16_nearest_even(src[i]);
        else ((float*)w->out)[i] = src[i];
    w->done += n;
    *data = w->out;
    return n * (w->bf16 ? 2 : 4);
}

// DIR/model.safetensors from the weights (our layout, host memory).
static inline int hf_write_weights(const char* path, const Llama3Config* c, const float* params, bool bf16, char* err) {
    size_t head = (size_t)c->n_embd * (c->n_embd / c->n_head), buf_elems = head > (1u << 22) ? head : (1u << 22);
    HfWriter w = {c, params, bf16, (HfPlace*)malloc(sizeof(HfPlace) * hf_places_count(c)), 0, 0, 0, NULL, 0,
                  (float*)malloc(head * sizeof(float)), malloc(buf_elems * 4), buf_elems};
    w.n_places = hf_places(c, w.places);
    hf_writer_header(&w);
    char* header = w.header;
    int rc = write_pieces_atomic(path, hf_next_piece, &w, err);
    free(header), free(w.places), free(w.rows), free(w.out);
    return rc;
}

// The folder `dir` (made if missing, in a folder that exists) with model.safetensors and config.json
// from the weights (our layout, host memory), and of tokenizer_from's HF_TOKENIZER_FILES (NULL: none)
// those it has, copied.
static inline int hf_save(const char* dir, const Llama3Config* c, const float* params, bool bf16,
                          const char* tokenizer_from, char* err) {
    char path[L3_PATH_LEN], src[L3_PATH_LEN], text[4096];
    if (make_dir(dir, err) || path_fmt(path, err, "%s/model.safetensors", dir) ||
        hf_write_weights(path, c, params, bf16, err) || path_fmt(path, err, "%s/config.json", dir))
        return -1;
    hf_config_text(text, sizeof(text), c, bf16 ? "bfloat16" : "float32");
    Chunk config = {text, strlen(text)};
    if (write_file_atomic(path, &config, 1, err)) return -1;
    for (int i = 0; tokenizer_from && i < 4; i++) {
        struct stat st;
        if (path_fmt(src, err, "%s/%s", tokenizer_from, HF_TOKENIZER_FILES[i]) ||
            path_fmt(path, err, "%s/%s", dir, HF_TOKENIZER_FILES[i]))
            return -1;
        if (stat(src, &st) != 0) continue;
        char* data = NULL;
        size_t bytes = 0;
        if (file_read_whole(src, "tokenizer file", SIZE_MAX, &data, &bytes, err)) return -1;
        Chunk copy = {data, bytes};
        int rc = write_file_atomic(path, &copy, 1, err);
        free(data);
        if (rc) return -1;
    }
    return 0;
}

// [--save_hf_checkpoints] Checkpoint `step`'s hf/ folder, as hf_save writes it; written after its
// model.bin and before its state.bin, which completes it.
static inline int checkpoint_write_hf(const char* dir, int step, const Llama3Config* c, const float* params, bool bf16,
                                      const char* tokenizer_from, char* err) {
    char folder[L3_PATH_LEN];
    return path_fmt(folder, err, "%s/step_%08d/hf", dir, step) || hf_save(folder, c, params, bf16, tokenizer_from, err)
               ? -1 : 0;
}

// ---- the JSON log (--log_file) ----

// A number for the JSON log as fmt prints it, or null when it is not finite: a skipped step's NaN
// loss, printed as %f, would be `nan`, which no JSON reader takes.
static inline const char* json_number(char* out, size_t len, const char* fmt, double v) {
    if (isfinite(v)) snprintf(out, len, fmt, v);
    else snprintf(out, len, "null");
    return out;
}

// The step of a log line written by the trainer ({"step": N, ...}), or -1 for any other line.
static inline long log_line_step(const char* line) {
    long step;
    return sscanf(line, "{\"step\": %ld", &step) == 1 ? step : -1;
}

// Opens the JSON log of a run that starts after step `resumed` (0: a fresh run). A fresh run
// starts the log anew. A resumed run continues it: the lines up to and including step `resumed`
// are kept and any later ones (written by the first part after its last checkpoint) are cut off,
// as is a last line left half written, so that the file reads as one run. The file is created when
// missing. NULL with a message in err on failure.
static inline FILE* log_open(const char* path, int resumed, char* err) {
    FILE* f = fopen(path, resumed ? "a+" : "w");
    if (!f) {
        l3_fail(err, "--log_file %s: cannot open for writing: %s", path, strerror(errno));
        return NULL;
    }
    if (!resumed) return f;
    char* line = NULL;
    size_t cap = 0;
    long keep = 0; // bytes of the lines kept
    ssize_t n;
    rewind(f);
    while ((n = getline(&line, &cap, f)) > 0 && line[n - 1] == '\n' && log_line_step(line) <= resumed) keep += n;
    free(line);
    if (ferror(f) || ftruncate(fileno(f), keep) != 0 || fseek(f, 0, SEEK_END) != 0) {
        l3_fail(err, "--log_file %s: cannot continue the log of the resumed run: %s", path, strerror(errno));
        fclose(f);
        return NULL;
    }
    return f;
}

// ---- ranks ----
// A launcher starts one process per rank and tells each its rank, the world size and its rank on its
// node in variables of its own. The innermost launcher decides, looked for in this order: torchrun's
// (RANK, WORLD_SIZE, LOCAL_RANK; also DeepSpeed's and accelerate's), Open MPI's mpirun's, PMI's
// (MPICH's and Intel MPI's mpirun, srun --mpi=pmi2), Slurm's srun's. torchrun under srun, or mpirun
// in a Slurm job, leaves the outer launcher's variables beside its own: those count torchrun's or the
// job's processes, not the trainer's, and are not compared. Slurm's count is the step's tasks
// (SLURM_STEP_NUM_TASKS), else the job's (SLURM_NTASKS): a batch script's own process, started without
// srun, counts as task 0 of them.
typedef struct {
    const char* name;
    const char* size[2]; // the world size's variable, and the one read where it is unset (NULL: none)
    const char* rank;
    const char* local; // the rank on its node; unset: the rank (one node)
} Launcher;
static const Launcher LAUNCHERS[] = {
    {"torchrun", {"WORLD_SIZE", NULL}, "RANK", "LOCAL_RANK"},
    {"Open MPI", {"OMPI_COMM_WORLD_SIZE", NULL}, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"PMI", {"PMI_SIZE", NULL}, "PMI_RANK", "MPI_LOCALRANKID"},
    {"Slurm", {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, "SLURM_PROCID", "SLURM_LOCALID"},
};
#define NUM_LAUNCHERS ((int)(sizeof(LAUNCHERS) / sizeof(LAUNCHERS[0])))

typedef struct {
    int rank, world, local_rank;
    char from[256]; // the launcher and its variables ("torchrun: RANK=1 WORLD_SIZE=2"); "": none, one process
} RankEnv;

// A launcher's variable: its value, or NULL when it is unset or empty (`export RANK=` unsets it).
static inline const char* env_text(const char* (*get)(const char*), const char* name) {
    const char* s = name ? get(name) : NULL;
    return s && *s ? s : NULL;
}

// Launcher l's rank, world size and local rank in *r: 1 when its variables give them, 0 when it set
// none (Slurm: no task id, as in salloc's shell, which holds SLURM_NTASKS), -1 with a message naming
// the variables when the set is partial (RANK=1 alone) or contradictory (WORLD_SIZE=0, WORLD_SIZE=abc,
// RANK=3 with WORLD_SIZE=2). A set that can name one process only is whole: WORLD_SIZE=1 alone, and
// Slurm's task 0 without a count (a batch script without --ntasks).
static inline int launcher_read(const Launcher* l, const char* (*get)(const char*), RankEnv* r, char* err) {
    const char* size_var = env_text(get, l->size[0]) || !l->size[1] ? l->size[0] : l->size[1];
    const char *size = env_text(get, size_var), *rank = env_text(get, l->rank), *local = env_text(get, l->local);
    bool slurm = l->size[1] != NULL;
    if (!rank && (slurm || !size)) return 0;
    const char* vars[3][2] = {{l->rank, rank}, {size_var, size}, {l->local, local}}; // (as set, for r->from)
    if (!size && slurm && !strcmp(rank, "0")) size = "1";
    if (!rank && !strcmp(size, "1")) rank = "0";
    char sizes[64], why[L3_ERR_LEN];
    snprintf(sizes, sizeof(sizes), slurm ? "%s or %s" : "%s", l->size[0], l->size[1]);
    if (!size || !rank)
        return l3_fail(err, "%s=%s without %s: %s's variables are partial (a launch of several ranks sets both)",
                       rank ? l->rank : size_var, rank ? rank : size, rank ? sizes : l->rank, l->name);
    long long world = 1, k = 0, k_local = 0;
    if (parse_int(size_var, size, 1, INT_MAX, &world, why))
        return l3_fail(err, "%s=%s: not a number of ranks (a whole number, 1 or more; from %s)", size_var, size, l->name);
    if (parse_int(l->rank, rank, 0, world - 1, &k, why))
        return l3_fail(err, "%s=%s with %s=%s: a rank is a whole number of 0..%lld (%s)", l->rank, rank, size_var,
                       size, world - 1, l->name);
    if (local && parse_int(l->local, local, 0, world - 1, &k_local, why))
        return l3_fail(err, "%s=%s with %s=%s: a local rank is a whole number of 0..%lld (%s)", l->local, local,
                       size_var, size, world - 1, l->name);
    r->rank = (int)k, r->world = (int)world, r->local_rank = local ? (int)k_local : (int)k;
    int n = snprintf(r->from, sizeof(r->from), "%s:", l->name);
    for (int i = 0; i < 3 && n < (int)sizeof(r->from); i++)
        if (vars[i][1]) n += snprintf(r->from + n, sizeof(r->from) - n, " %s=%s", vars[i][0], vars[i][1]);
    return 1;
}

// This process's rank, the world size and its local rank, decided once (main, before anything else):
// the first launcher of LAUNCHERS whose variables are set, else one process, rank 0 of 1. -1 with a
// message naming the variables where that launcher's set is partial or contradictory, which would
// otherwise start N processes that each train alone on the same outputs. `get` looks a variable up
// (getenv; the host tests give their own).
static inline int rank_env_read(const char* (*get)(const char*), RankEnv* r, char* err) {
    const RankEnv one = {0, 1, 0, ""};
    *r = one;
    for (int i = 0; i < NUM_LAUNCHERS; i++) {
        int got = launcher_read(&LAUNCHERS[i], get, r, err);
        if (got < 0) *r = one;
        if (got) return got < 0 ? -1 : 0;
    }
    return 0;
}

// The start's first line, and the dry run's: "rank 1 of 2 (from torchrun: RANK=1 WORLD_SIZE=2)".
static inline void rank_env_print(FILE* f, const RankEnv* r) {
    fprintf(f, "rank %d of %d (%s%s)\n", r->rank, r->world, r->from[0] ? "from " : "",
            r->from[0] ? r->from : "no launcher's variables: one process");
}

// A trainer that trains at most max_world ranks (1 without NCCL: every process would train alone on
// the same outputs) refuses a launch of more.
static inline int rank_env_check(const RankEnv* r, int max_world, char* err) {
    if (r->world <= max_world) return 0;
    return l3_fail(err, "launched as rank %d of %d ranks (%s): this train_llama3 is built without NCCL and trains as "
                   "one process on one GPU, where %d processes would each train alone on the same outputs: start one",
                   r->rank, r->world, r->from, r->world);
}

// The GPU of a rank: its local rank, on a node of n_devices GPUs. More local ranks than GPUs is a
// mistake unless NCCL is told to let two ranks share one GPU (shared: NCCL_MULTI_RANK_GPU_ENABLE=1,
// correctness tests only), when rank r takes GPU r % n_devices.
static inline int rank_device(const RankEnv* r, int n_devices, int shared, int* device, char* err) {
    if (r->local_rank < n_devices) return *device = r->local_rank, 0;
    if (shared) return *device = r->local_rank % n_devices, 0;
    return l3_fail(err, "rank %d is local rank %d, but this machine has %d GPU%s: start at most %d ranks per node "
                   "(two ranks share one GPU only with NCCL_MULTI_RANK_GPU_ENABLE=1 and NCCL >= 2.30, for tests)",
                   r->rank, r->local_rank, n_devices, n_devices == 1 ? "" : "s", n_devices);
}

// ---- data parallel: shards of the optimizer state (ZeRO-1) ----
// Each parameter tensor's slice of one layer (a contiguous range, reduced as the backward writes
// it) is split over the ranks: rank r owns the equal part [begin + r*part, begin + (r+1)*part),
// part a multiple of SHARD_ALIGN elements so that a part of an aligned range starts on a 16-byte
// boundary in bf16 (and the float4 AdamW takes it); the gradients are reduce-scattered onto the
// parts, each rank updates its part and keeps its part's AdamW m and v, and the parts' new bf16
// weights are all-gathered. What does not split evenly, a tail of fewer than ranks*SHARD_ALIGN
// elements at begin + ranks*part, is all-reduced and updated by every rank alike (each keeps its
// state): NCCL's reduce-scatter takes equal parts only, and the tail is a few elements of the odd
// shapes (every LLaMA 3 tensor divides by 8 ranks * 8). One rank owns the whole range, no tail.
#define SHARD_ALIGN 8
typedef struct {
    size_t part, tail; // elements of each rank's part; of the tail, owned by every rank
} RangeShard;

static inline RangeShard range_shard(size_t n, int world) {
    RangeShard s;
    s.part = world == 1 ? n : n / ((size_t)world * SHARD_ALIGN) * SHARD_ALIGN;
    s.tail = n - s.part * world;
    return s;
}

// Where one rank's AdamW state lies: for each tensor (of NUM_PARAM_TENSORS, one layer's slice
// sharded as above) its part then its tail, layer after layer, tensor after tensor in the order of
// the parameter block. The state of one rank is `state_total` floats each of m and v.
typedef struct {
    int rank, world;
    RangeShard shard[NUM_PARAM_TENSORS];  // of one layer's slice
    size_t state_offset[NUM_PARAM_TENSORS]; // layer 0's part in the rank's state
    size_t state_total;
} ZeroLayout;

// sparse_wte: [sparse rows] the embedding's rows are updated by every rank (the union of the rows
// the ranks touched, reduced), so its state is every rank's whole table: all of it a tail.
static inline ZeroLayout zero_layout(const ParamLayout* p, int rank, int world, bool sparse_wte) {
    ZeroLayout z;
    memset(&z, 0, sizeof(z));
    z.rank = rank, z.world = world;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        z.shard[t] = range_shard(p->layer_size[t], world);
        if (t == P_WTE && sparse_wte) z.shard[t].part = 0, z.shard[t].tail = p->layer_size[t];
        z.state_offset[t] = z.state_total;
        z.state_total += (z.shard[t].part + z.shard[t].tail) * p->slices[t];
    }
    return z;
}

// A run of parameters a rank updates: params[param, param + n) with its AdamW state at
// m[state, state + n).
typedef struct {
    size_t param, state, n;
} ShardRun;

// The rank's part (which = 0) or the tail (which = 1) of tensor t's slice of layer `layer`.
static inline ShardRun zero_run(const ZeroLayout* z, const ParamLayout* p, int t, int layer, int which) {
    const RangeShard* s = &z->shard[t];
    size_t begin = p->offset[t] + (size_t)layer * p->layer_size[t];
    size_t state = z->state_offset[t] + (size_t)layer * (s->part + s->tail);
    ShardRun r = {begin + (size_t)z->rank * s->part, state, s->part};
    if (which) r.param = begin + (size_t)z->world * s->part, r.state = state + s->part, r.n = s->tail;
    return r;
}

// ---- data parallel: every rank runs the same configuration ----
// FNV-1a over the model's shape and every flag as the configuration prints them (train_args_print):
// the ranks compare it at start, so that a rank launched with another flag stops the run instead of
// training a different model.
static inline uint64_t run_config_hash(const TrainArgs* a, const Llama3Config* c) {
    char* text = NULL;
    size_t len = 0;
    FILE* f = open_memstream(&text, &len);
    if (!f) return 0;
    train_args_print(f, a);
    config_print(f, c);
    fprintf(f, "ranks %d\n", a->loop.world);
    fclose(f);
    uint64_t h = fnv1a(FNV1A_OFFSET, text, len);
    free(text);
    return h;
}

// ---- data parallel: the rendezvous ----
// Before NCCL can connect the ranks, rank 0's NCCL id (128 opaque bytes, ncclGetUniqueId) must
// reach every rank, with the configuration to compare (run_config_hash). The spec (the value of the
// flag --rendezvous that the data-parallel trainer takes) says how:
//   file:PATH       rank 0 writes PATH whole (temporary name, fsync, rename); the others wait for
//                   it. PATH must not exist yet (an old run's would hand out a stale id): rank 0
//                   refuses it, and removes its own once every rank has joined (ncclCommInitRank
//                   returned). Any folder every rank sees: a shared file system across nodes.
//   tcp:HOST:PORT   rank 0 listens on PORT; the others connect to HOST:PORT, each sends its rank
//                   and hash and is answered with the id. Both sides compare the hashes.
// Every wait ends after timeout_s with a message naming what did not come.
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

#define RENDEZVOUS_MAGIC 20241203
#define RENDEZVOUS_ID_BYTES 128 // NCCL_UNIQUE_ID_BYTES
typedef struct {
    int32_t magic, world;
    uint64_t config_hash;
    unsigned char id[RENDEZVOUS_ID_BYTES];
} RendezvousMsg;

typedef struct {
    int tcp;               // 0: file
    char path[L3_PATH_LEN]; // file: the path; tcp: the host
    int port;
} RendezvousSpec;

static inline int rendezvous_parse(const char* s, RendezvousSpec* r, char* err) {
    memset(r, 0, sizeof(*r));
    if (!strncmp(s, "file:", 5) && s[5]) return path_fmt(r->path, err, "%s", s + 5);
    const char* colon = strncmp(s, "tcp:", 4) ? NULL : strrchr(s + 4, ':');
    long long port = 0;
    if (!colon || colon == s + 4 || parse_int("--rendezvous", colon + 1, 1, 65535, &port, err))
        return l3_fail(err, "--rendezvous %s: expected file:PATH or tcp:HOST:PORT (a port of 1..65535)", s);
    r->tcp = 1, r->port = (int)port;
    snprintf(r->path, sizeof(r->path), "%.*s", (int)(colon - (s + 4)), s + 4);
    return 0;
}

static inline double monotonic_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// The message every rank must agree with: the same world size and configuration.
static inline int rendezvous_agree(const RendezvousMsg* got, int rank, int world, uint64_t hash, const char* where,
                                   char* err) {
    if (got->magic != RENDEZVOUS_MAGIC) return l3_fail(err, "%s: not a rendezvous message of train_llama3", where);
    if (got->world != world || got->config_hash != hash)
        return l3_fail(err, "%s: rank %d's configuration differs from rank 0's (%d ranks, configuration hash %016llx; "
                       "rank 0: %d ranks, %016llx): launch every rank with the same flags and files", where, rank,
                       world, (unsigned long long)hash, got->world, (unsigned long long)got->config_hash);
    return 0;
}

// file: rank 0 publishes its message, in a file that is not there yet (checked before the GPU too:
// outputs_writable).
#define RENDEZVOUS_FILE_STALE "exists already (an earlier run's, or one that stopped): remove it, or name a new file"
static inline int rendezvous_file_publish(const char* path, const RendezvousMsg* msg, char* err) {
    if (file_size_of(path) >= 0) return l3_fail(err, "--rendezvous file:%s " RENDEZVOUS_FILE_STALE, path);
    Chunk c = {msg, sizeof(*msg)};
    return write_file_atomic(path, &c, 1, err);
}

// file: the other ranks wait for it and read it.
static inline int rendezvous_file_fetch(const char* path, RendezvousMsg* msg, double timeout_s, char* err) {
    double end = monotonic_seconds() + timeout_s;
    for (;;) {
        FILE* f = file_size_of(path) == (long long)sizeof(*msg) ? fopen(path, "rb") : NULL;
        if (f) {
            size_t got = fread(msg, 1, sizeof(*msg), f);
            fclose(f);
            if (got == sizeof(*msg)) return 0;
        }
        if (monotonic_seconds() > end)
            return l3_fail(err, "--rendezvous file:%s: rank 0 did not write it within %g s (is rank 0 running, and "
                           "does every rank see that folder?)", path, timeout_s);
        usleep(20000);
    }
}

// Reads or writes exactly n bytes on a socket before the deadline; -1 on error, end of stream or time.
static inline int socket_io(int fd, void* buf, size_t n, int writing, double end) {
    char* p = (char*)buf;
    while (n) {
        struct pollfd pfd = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
        int ms = (int)((end - monotonic_seconds()) * 1000);
        if (ms <= 0 || poll(&pfd, 1, ms) <= 0) return -1;
        ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

// What a joining rank sends over tcp.
typedef struct {
    int32_t magic, rank;
    uint64_t config_hash;
} RendezvousJoin;

// tcp: rank 0 answers world - 1 ranks, each with its message, and checks their hashes.
static inline int rendezvous_tcp_serve(int port, const RendezvousMsg* msg, double timeout_s, char* err) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0), one = 1, zero = 0, rc = 0;
    struct sockaddr_in6 addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin6_family = AF_INET6, addr.sin6_port = htons((uint16_t)port), addr.sin6_addr = in6addr_any;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) ||
        bind(fd, (struct sockaddr*)&addr, sizeof(addr)) || listen(fd, 64)) {
        rc = l3_fail(err, "--rendezvous tcp port %d: rank 0 cannot listen on it: %s", port, strerror(errno));
        if (fd >= 0) close(fd);
        return rc;
    }
    double end = monotonic_seconds() + timeout_s;
    for (int joined = 1; joined < msg->world && rc == 0; joined++) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int ms = (int)((end - monotonic_seconds()) * 1000);
        int c = ms > 0 && poll(&pfd, 1, ms) > 0 ? accept(fd, NULL, NULL) : -1;
        RendezvousJoin j;
        if (c < 0) {
            rc = l3_fail(err, "--rendezvous tcp port %d: %d of %d ranks joined within %g s", port, joined, msg->world,
                         timeout_s);
        } else if (socket_io(c, &j, sizeof(j), 0, end) || j.magic != RENDEZVOUS_MAGIC ||
                   socket_io(c, (void*)msg, sizeof(*msg), 1, end)) {
            rc = l3_fail(err, "--rendezvous tcp port %d: a connection that is not a rank of this run", port);
        } else if (j.config_hash != msg->config_hash) {
            rc = l3_fail(err, "--rendezvous: rank %d's configuration hash %016llx differs from rank 0's %016llx: "
                         "launch every rank with the same flags and files", j.rank,
                         (unsigned long long)j.config_hash, (unsigned long long)msg->config_hash);
        }
        if (c >= 0) close(c);
    }
    close(fd);
    return rc;
}

// tcp: a rank other than 0 connects (retrying until rank 0 listens), sends its rank and hash, and
// reads rank 0's message.
static inline int rendezvous_tcp_fetch(const char* host, int port, int rank, uint64_t hash, RendezvousMsg* msg,
                                       double timeout_s, char* err) {
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC, hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai) return l3_fail(err, "--rendezvous tcp:%s:%d: cannot resolve %s: %s", host, port, host, gai_strerror(gai));
    double end = monotonic_seconds() + timeout_s;
    RendezvousJoin j = {RENDEZVOUS_MAGIC, rank, hash};
    int rc = -1;
    while (rc != 0 && monotonic_seconds() < end) {
        int fd = socket(res->ai_family, SOCK_STREAM, 0);
        if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0)
            rc = socket_io(fd, &j, sizeof(j), 1, end) || socket_io(fd, msg, sizeof(*msg), 0, end) ? -2 : 0;
        if (fd >= 0) close(fd);
        if (rc == -2) break; // connected, but the exchange broke off: rank 0 refused this rank
        if (rc != 0) usleep(50000);
    }
    freeaddrinfo(res);
    if (rc == -2) return l3_fail(err, "--rendezvous tcp:%s:%d: rank 0 ended the exchange (see its message)", host, port);
    if (rc) return l3_fail(err, "--rendezvous tcp:%s:%d: rank 0 did not answer within %g s", host, port, timeout_s);
    return 0;
}

// The rendezvous of rank `rank` of `world`: rank 0 hands out `id` (its ncclGetUniqueId); every
// other rank receives it into `id`, after checking that rank 0 runs the same configuration.
static inline int rendezvous(const RendezvousSpec* s, int rank, int world, uint64_t hash,
                             unsigned char id[RENDEZVOUS_ID_BYTES], double timeout_s, char* err) {
    RendezvousMsg msg;
    memset(&msg, 0, sizeof(msg));
    msg.magic = RENDEZVOUS_MAGIC, msg.world = world, msg.config_hash = hash;
    if (rank == 0) {
        memcpy(msg.id, id, RENDEZVOUS_ID_BYTES);
        return s->tcp ? rendezvous_tcp_serve(s->port, &msg, timeout_s, err) : rendezvous_file_publish(s->path, &msg, err);
    }
    int rc = s->tcp ? rendezvous_tcp_fetch(s->path, s->port, rank, hash, &msg, timeout_s, err)
                    : rendezvous_file_fetch(s->path, &msg, timeout_s, err);
    if (rc == 0) rc = rendezvous_agree(&msg, rank, world, hash, "--rendezvous", err);
    if (rc == 0) memcpy(id, msg.id, RENDEZVOUS_ID_BYTES);
    return rc;
}

// ---- the outputs ----
// Every file and folder a run writes, named and checked before the GPU starts for what would make its
// write fail, without creating or changing anything: a part of the path that is a file or missing, a
// target of the wrong kind, no permission, a read-only file system, and too little free space where the
// size is known (the checkpoints', --save_hf's). Rank 0 writes the log, model.bin, --save_hf's folder
// and the rendezvous file; every rank its share of AdamW's state in the checkpoint folders. Each output
// is checked against its own file system's free space (two on one file system are not added up).
typedef enum {
    OUT_FOLDER,        // a folder, made when missing (only it: its parent must be a folder), holding new files
    OUT_LOG,           // the JSON log, opened in place: a file, a pipe or a device (log_file_kind_check)
    OUT_LOG_CONTINUED, // the log of a resumed run, which reads and cuts it: a regular file
    OUT_NEW_FILE,      // a file that must not exist yet (the rendezvous file: an old one hands out a stale id)
} OutputKind;

typedef struct {
    const char* flag;
    const char* path;
    OutputKind kind;
    unsigned long long bytes;      // the most the run holds there at once, where known (0: not known, or small)
    char what[96];                 // what it holds, for the dry run
    bool exists;                   // output_check's findings: whether it is there already,
    unsigned long long free_bytes; // and the free space of the file system it goes on
} Output;
#define MAX_OUTPUTS 4

// A size for messages, in GiB from 1 GiB on, else in MiB ("16.75 GiB", "0.31 MiB"); out: 16 bytes.
static inline const char* size_text(unsigned long long bytes, char* out) {
    snprintf(out, 16, bytes >> 30 ? "%.2f GiB" : "%.2f MiB", bytes / (bytes >> 30 ? 1073741824.0 : 1048576.0));
    return out;
}

// What hf_save writes, at most: the tensors, model.safetensors' header (hf_writer_header's bound),
// config.json (its text buffer) and the tokenizer files that tokenizer_from holds.
static inline unsigned long long hf_folder_bytes(const Llama3Config* c, bool bf16, const char* tokenizer_from) {
    unsigned long long bytes = (unsigned long long)param_layout(c).total * (bf16 ? 2 : 4) + 264 +
                               160ull * hf_places_count(c) + 4096;
    char path[L3_PATH_LEN], err[L3_ERR_LEN];
    for (int i = 0; tokenizer_from && i < 4; i++)
        if (path_fmt(path, err, "%s/%s", tokenizer_from, HF_TOKENIZER_FILES[i]) == 0 && file_size_of(path) > 0)
            bytes += (unsigned long long)file_size_of(path);
    return bytes;
}

// One checkpoint's bytes, the files of every rank together: model.bin (a seed file), each rank's
// state file (its share of m and v, zero_layout, after a 256-byte header) and, with
// --save_hf_checkpoints 1, its hf/ folder.
static inline unsigned long long checkpoint_bytes(const TrainArgs* a, const Llama3Config* c) {
    ParamLayout p = param_layout(c);
    ZeroLayout z = zero_layout(&p, 0, a->loop.world, switches_for_model(&a->sw, c).sparse_embedding != 0);
    unsigned long long state = CKPT_HEADER_BYTES + 2ull * z.state_total * moment_bytes(a->optim.moments);
    unsigned long long hf = a->ckpt.hf ? hf_folder_bytes(c, a->loop.save_hf_dtype == HF_DTYPE_BF16, a->loop.hf_dir) : 0;
    return 1024 + 4ull * p.total + (unsigned long long)a->loop.world * state + hf;
}

// The checkpoints a folder holds at once beyond the `held` complete ones there before: this run's
// saves (every --checkpoint_every steps after step `start`, and after its last step), until
// --checkpoint_keep are kept; then one more while a save completes, before the oldest is deleted.
static inline int checkpoints_at_once(const TrainArgs* a, int start, int held) {
    long long last = last_step(a), every = a->ckpt.every;
    long long saves = every ? last / every - start / every + (last % every != 0) : 1;
    long long most = saves + held < a->ckpt.keep + 1LL ? saves + held : a->ckpt.keep + 1LL;
    return most - held > 1 ? (int)(most - held) : 1;
}
// The complete checkpoints in a --checkpoint_dir (0 when it is not there yet).
static inline int checkpoints_held(const char* dir) {
    int steps[4096], n = checkpoint_list(dir, steps, 4096), held = 0;
    for (int i = 0; i < n; i++) held += checkpoint_complete(dir, steps[i]);
    return held;
}

// An output and what it holds (printf's format and arguments), not yet checked.
static inline Output output_of(const char* flag, const char* path, OutputKind kind, unsigned long long bytes,
                               const char* fmt, ...) {
    Output o;
    memset(&o, 0, sizeof(o));
    o.flag = flag, o.path = path, o.kind = kind, o.bytes = bytes;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o.what, sizeof(o.what), fmt, ap);
    va_end(ap);
    return o;
}

// This rank's outputs (at most MAX_OUTPUTS) and what each holds at most at once. `start`: the step the
// run starts after (0, or the resumed checkpoint's). -1 with a message for a --rendezvous that is no
// spec.
static inline int run_outputs(const TrainArgs* a, const Llama3Config* c, int start, Output* out, char* err) {
    int n = 0;
    bool rank0 = a->loop.rank == 0, resumed = a->ckpt.resume != NULL;
    if (rank0 && a->loop.log_file)
        out[n++] = output_of("--log_file", a->loop.log_file, resumed ? OUT_LOG_CONTINUED : OUT_LOG, 0, "the JSON log%s",
                             resumed ? ", continued" : "");
    if (a->ckpt.dir) {
        unsigned long long one = checkpoint_bytes(a, c);
        int k = checkpoints_at_once(a, start, checkpoints_held(a->ckpt.dir));
        char size[16];
        out[n++] = output_of("--checkpoint_dir", a->ckpt.dir, OUT_FOLDER, one * k, "%d checkpoint%s of %s at once", k,
                             k > 1 ? "s" : "", size_text(one, size));
    }
    if (rank0 && a->loop.save_hf)
        out[n++] = output_of("--save_hf", a->loop.save_hf, OUT_FOLDER,
                             hf_folder_bytes(c, a->loop.save_hf_dtype == HF_DTYPE_BF16, a->loop.hf_dir),
                             "the Hugging Face folder");
    RendezvousSpec s;
    if (a->loop.world > 1 && a->dist.rendezvous && rendezvous_parse(a->dist.rendezvous, &s, err)) return -1;
    if (rank0 && a->loop.world > 1 && a->dist.rendezvous && !s.tcp)
        out[n++] = output_of("--rendezvous", a->dist.rendezvous + strlen("file:"), OUT_NEW_FILE, 0, "the rendezvous file");
    return n;
}

// The folder a path goes in: "a/b" -> "a", "a/b/" -> "a", "/b" -> "/", "b" -> "." (out: L3_PATH_LEN).
static inline void parent_folder(const char* path, char* out) {
    char p[L3_PATH_LEN];
    snprintf(p, sizeof(p), "%s", path);
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') p[--n] = '\0';
    char* slash = strrchr(p, '/');
    if (!slash) snprintf(p, sizeof(p), ".");
    else slash[slash == p] = '\0';
    memcpy(out, p, strlen(p) + 1);
}

// Why a file system cannot take `bytes` more (0: not known): read-only (statvfs's ST_RDONLY), or less
// free space than that (the blocks available to this user). 0 if it can; *free_bytes: its free space.
static inline int space_problem(const char* folder, const struct statvfs* v, unsigned long long bytes,
                                unsigned long long* free_bytes, char* why, size_t n) {
    char free_text[16], bytes_text[16];
    *free_bytes = (unsigned long long)v->f_bavail * v->f_frsize;
    if (v->f_flag & ST_RDONLY) return snprintf(why, n, "%s is on a read-only file system", folder), -1;
    if (bytes > *free_bytes)
        return snprintf(why, n, "%s has %s free, and the run writes up to %s there", folder,
                        size_text(*free_bytes, free_text), size_text(bytes, bytes_text)), -1;
    return 0;
}

// Why an existing path cannot take new files as a folder: it is not one, this user may not write in
// it, or its file system (space_problem). 0 if it can.
static inline int folder_problem(const char* folder, unsigned long long bytes, unsigned long long* free_bytes,
                                 char* why, size_t n) {
    struct stat st;
    struct statvfs v;
    if (stat(folder, &st) != 0) return snprintf(why, n, "%s: %s", folder, strerror(errno)), -1;
    if (!S_ISDIR(st.st_mode)) return snprintf(why, n, "%s is %s, not a folder", folder, file_kind(st.st_mode)), -1;
    if (statvfs(folder, &v) != 0) return snprintf(why, n, "%s: %s", folder, strerror(errno)), -1;
    if (!(v.f_flag & ST_RDONLY) && access(folder, W_OK | X_OK) != 0)
        return snprintf(why, n, "%s is not writable (%s)", folder, strerror(errno)), -1;
    return space_problem(folder, &v, bytes, free_bytes, why, n);
}

// Why a path that is not there cannot be made: the folder it goes in is a file or not writable, or
// missing (only the last part of a path is made), named as the first part of the path that is not a
// folder (afile/sub/x under a regular file afile: afile).
static inline int missing_path_problem(Output* o, char* why, size_t n) {
    char folder[L3_PATH_LEN], up[L3_PATH_LEN];
    struct stat st = {0};
    parent_folder(o->path, folder);
    if (stat(folder, &st) == 0 || (errno != ENOENT && errno != ENOTDIR))
        return folder_problem(folder, o->bytes, &o->free_bytes, why, n);
    for (parent_folder(folder, up); stat(up, &st) != 0 && strcmp(up, ".") && strcmp(up, "/");) parent_folder(up, up);
    if (stat(up, &st) == 0 && !S_ISDIR(st.st_mode)) return folder_problem(up, 0, &o->free_bytes, why, n);
    return snprintf(why, n, "its folder %s does not exist (only the last folder of a path is made)", folder), -1;
}

// Why an existing path cannot take output o: a folder where a file goes or the reverse, a log that
// is no file to write it to (log_file_kind_check), a rendezvous file of an earlier run, or no
// permission or room (folder_problem).
static inline int existing_output_problem(Output* o, const struct stat* st, char* why, size_t n) {
    if (o->kind == OUT_FOLDER) return folder_problem(o->path, o->bytes, &o->free_bytes, why, n);
    if (o->kind == OUT_NEW_FILE)
        return snprintf(why, n, RENDEZVOUS_FILE_STALE), -1;
    if (log_file_kind_check(o->path, o->kind == OUT_LOG_CONTINUED, why)) return -2; // (a whole message of its own)
    if (S_ISREG(st->st_mode) && access(o->path, W_OK) != 0)
        return snprintf(why, n, "%s is not writable (%s)", o->path, strerror(errno)), -1;
    return 0;
}

// That output o can be written, found without creating or changing anything; sets o->exists and
// o->free_bytes. The message: "--save_hf afile/sub: cannot be written: afile is a regular file, not a
// folder".
static inline int output_check(Output* o, char* err) {
    char why[L3_ERR_LEN];
    struct stat st;
    o->exists = stat(o->path, &st) == 0;
    int rc = o->exists ? existing_output_problem(o, &st, why, sizeof(why)) : missing_path_problem(o, why, sizeof(why));
    if (rc == -2) return l3_fail(err, "%s", why);
    return rc ? l3_fail(err, "%s %s: cannot be written: %s", o->flag, o->path, why) : 0;
}

// Every output of this rank (run_outputs), each checked (output_check); their count in *n.
static inline int outputs_writable(const TrainArgs* a, const Llama3Config* c, int start, Output* out, int* n,
                                   char* err) {
    *n = run_outputs(a, c, start, out, err);
    if (*n < 0) return -1;
    for (int i = 0; i < *n; i++)
        if (output_check(&out[i], err)) return -1;
    return 0;
}

// One line per output, as the dry run and the start print them: "output: --checkpoint_dir ckpt (a new
// folder; 3 checkpoints of 18.40 GiB at once, 55.20 GiB free): can be written".
static inline void outputs_print(FILE* f, const Output* out, int n) {
    if (n == 0) fprintf(f, "outputs: none on this rank (no --log_file, --checkpoint_dir or --save_hf)\n");
    for (int i = 0; i < n; i++) {
        const Output* o = &out[i];
        const char* kind = o->kind == OUT_FOLDER ? "folder" : "file";
        fprintf(f, "output: %s %s (%s %s; %s", o->flag, o->path, o->exists ? "an existing" : "a new", kind, o->what);
        char bytes[16], free_bytes[16];
        if (o->bytes) fprintf(f, ", %s of %s free", size_text(o->bytes, bytes), size_text(o->free_bytes, free_bytes));
        fprintf(f, "): can be written\n");
    }
}
