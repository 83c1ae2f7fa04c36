// dev/nccl.cu: the collectives of the data-parallel step (ZeRO-1), at the step's sizes, through
// NCCL: for each update group of LLaMA3.2-1B (one layer's six tensors, the head) a bf16
// reduce-scatter (average) of every tensor's gradient onto the ranks' parts and a bf16 all-gather of
// the parts' new weights, each group in one ncclGroupStart/End as the trainer issues it, both in
// place (llama3.h zero_layout: the parts and tails); the tail of a size that does not split evenly
// all-reduced; the gradient norm's partial sums all-reduced in fp32. Each is checked against a CPU
// reference on fresh random inputs with poisoned outputs, then timed (median of CUDA-event times),
// with the bus bandwidth NCCL's tests report: bytes * (N - 1) / N / time.
//
//   dev/nccl [--check] [--ranks N]   forks N ranks (default 2) over this machine's GPUs
//
// With fewer GPUs than ranks, ranks share a GPU: that needs NCCL >= 2.30 and
// NCCL_MULTI_RANK_GPU_ENABLE=1, and its times say nothing about speed (the ranks' kernels take turns
// on one GPU), so they are printed as such; without those it prints "skipped: ..." and exits 0 (make
// test counts it skipped). Keep NCCL_NVLS_ENABLE=0 on shared machines.
#include <nccl.h>
#include <sys/wait.h>

#include "common.h"

#define NCCL_CHECK(call) nccl_check((call), #call, __FILE__, __LINE__)
static void nccl_check(ncclResult_t r, const char* what, const char* file, int line) {
    if (r == ncclSuccess) return;
    fprintf(stderr, "NCCL error at %s:%d: %s\n  in %s\n", file, line, ncclGetErrorString(r), what);
    exit(EXIT_FAILURE);
}

typedef struct {
    int rank, world;
    bool shared_gpu; // ranks take turns on one GPU: no speed
    ncclComm_t comm;
    cudaStream_t stream;
} Ranks;

// A tensor of an update group, `n` elements, sharded over the ranks as the trainer's (range_shard).
typedef struct {
    const char* name;
    size_t n;
} Tensor;

// Inputs that keep the reductions of two ranks exact: multiples of 1/256 in [-1/4, 1/4], distinct
// per rank (seeded from dev_seed and the rank): the sum of two and its half fit bf16's 8
// significant bits, so 2 ranks are checked bit for bit. More ranks' partial sums round in bf16
// (NCCL's order): then each element may be off by two bf16 roundings (rtol 2^-7).
static std::vector<float> exact_inputs(size_t n, int rank) {
    rng_state = (dev_seed() + 7919ull * (rank + 1)) | 1;
    std::vector<float> v(n);
    for (auto& x : v) x = (float)((int)(rng_u32() % 129) - 64) / 256.0f;
    return v;
}

// The average of every rank's inputs: the reference of the reduce-scatter and the tail's all-reduce.
static std::vector<float> rank_average(size_t n, int world) {
    std::vector<double> sum(n, 0.0);
    for (int r = 0; r < world; r++) {
        std::vector<float> v = exact_inputs(n, r);
        for (size_t i = 0; i < n; i++) sum[i] += v[i];
    }
    std::vector<float> avg(n);
    for (size_t i = 0; i < n; i++) avg[i] = bf16_round((float)(sum[i] / world));
    return avg;
}

// One group's reduce-scatter: each tensor's equal parts in place, its tail (if any) all-reduced.
static void reduce_scatter_group(const Ranks& R, const std::vector<Tensor>& g, const std::vector<bf16*>& grads) {
    NCCL_CHECK(ncclGroupStart());
    for (size_t t = 0; t < g.size(); t++) {
        RangeShard s = range_shard(g[t].n, R.world);
        if (s.part)
            NCCL_CHECK(ncclReduceScatter(grads[t], grads[t] + (size_t)R.rank * s.part, s.part, ncclBfloat16, ncclAvg,
                                         R.comm, R.stream));
        if (s.tail)
            NCCL_CHECK(ncclAllReduce(grads[t] + R.world * s.part, grads[t] + R.world * s.part, s.tail, ncclBfloat16,
                                     ncclAvg, R.comm, R.stream));
    }
    NCCL_CHECK(ncclGroupEnd());
}

// One group's all-gather of the ranks' parts, in place (every rank updated the tail itself).
static void all_gather_group(const Ranks& R, const std::vector<Tensor>& g, const std::vector<bf16*>& weights) {
    NCCL_CHECK(ncclGroupStart());
    for (size_t t = 0; t < g.size(); t++) {
        RangeShard s = range_shard(g[t].n, R.world);
        if (s.part)
            NCCL_CHECK(ncclAllGather(weights[t] + (size_t)R.rank * s.part, weights[t], s.part, ncclBfloat16, R.comm,
                                     R.stream));
    }
    NCCL_CHECK(ncclGroupEnd());
}

// Checks one group's two collectives on this rank's buffers, then times them (rank 0 prints).
static void bench_group(const Ranks& R, const char* group, const std::vector<Tensor>& g, bool check_only) {
    std::vector<bf16*> bufs;
    size_t total = 0;
    // Each buffer is allocated to a whole 16 bytes: NCCL's LL protocol reads whole words, so a buffer
    // ending mid-word (the 13-element tail) is read past its end, which compute-sanitizer's memcheck
    // reports in NCCL's kernel (2026-12-06); the padding is zeroed so that initcheck sees it written.
    // The trainer's buffers are slices of one larger slab.
    for (const Tensor& t : g) {
        size_t padded = (t.n + 7) / 8 * 8;
        bufs.push_back(dev_alloc<bf16>(padded));
        CUDA_CHECK(cudaMemset(bufs.back(), 0, padded * sizeof(bf16)));
        total += t.n;
    }
    bool ok = true;
    char what[160];
    float rtol = R.world <= 2 ? 0.0f : 1.0f / 128;
    for (size_t t = 0; t < g.size(); t++) { // reduce-scatter: this rank's part and the tail hold the average
        upload_into(bufs[t], exact_inputs(g[t].n, R.rank));
    }
    reduce_scatter_group(R, g, bufs);
    for (size_t t = 0; t < g.size(); t++) {
        RangeShard s = range_shard(g[t].n, R.world);
        std::vector<float> got = from_bf16(dev_download(bufs[t], g[t].n)), ref = rank_average(g[t].n, R.world);
        size_t own = (size_t)R.rank * s.part, tail = (size_t)R.world * s.part;
        snprintf(what, sizeof(what), "rank %d: %s %s reduce-scatter part (%zu)", R.rank, group, g[t].name, s.part);
        if (s.part) ok &= dev_check(what, got.data() + own, ref.data() + own, s.part, 0.0f, rtol);
        if (s.tail) {
            snprintf(what, sizeof(what), "rank %d: %s %s tail all-reduce (%zu)", R.rank, group, g[t].name, s.tail);
            ok &= dev_check(what, got.data() + tail, ref.data() + tail, s.tail, 0.0f, rtol);
        }
    }
    for (size_t t = 0; t < g.size(); t++) { // all-gather: every rank ends with each rank's part
        RangeShard s = range_shard(g[t].n, R.world);
        std::vector<float> mine = exact_inputs(g[t].n, R.rank);
        dev_poison(bufs[t], g[t].n);
        upload_into(bufs[t] + (size_t)R.rank * s.part, std::vector<float>(mine.begin() + R.rank * s.part,
                                                                        mine.begin() + (R.rank + 1) * s.part));
    }
    all_gather_group(R, g, bufs);
    for (size_t t = 0; t < g.size(); t++) {
        RangeShard s = range_shard(g[t].n, R.world);
        if (!s.part) continue;
        std::vector<float> got = from_bf16(dev_download(bufs[t], s.part * R.world)), ref(s.part * R.world);
        for (int r = 0; r < R.world; r++) {
            std::vector<float> theirs = exact_inputs(g[t].n, r);
            std::copy(theirs.begin() + r * s.part, theirs.begin() + (r + 1) * s.part, ref.begin() + r * s.part);
        }
        snprintf(what, sizeof(what), "rank %d: %s %s all-gather (%d parts of %zu)", R.rank, group, g[t].name, R.world,
                 s.part);
        ok &= dev_check(what, got, ref, 0.0f, 0.0f);
    }
    if (!check_only) {
        double rs = median_ms([&] { reduce_scatter_group(R, g, bufs); });
        double ag = median_ms([&] { all_gather_group(R, g, bufs); });
        double bus = total * 2.0 * (R.world - 1) / R.world;
        if (R.rank == 0)
            for (int k = 0; k < 2; k++)
                printf("| %s | %s | %d ranks, %.1f MB | %.4f | %.0f GB/s bus%s | - | %s |\n",
                       k ? "all-gather bf16" : "reduce-scatter bf16 avg", group, R.world, total * 2 / 1e6,
                       k ? ag : rs, bus / ((k ? ag : rs) * 1e6), R.shared_gpu ? " (ranks share a GPU: not a speed)" : "",
                       ok ? "ok" : "FAILED");
    }
    for (bf16* b : bufs) CUDA_CHECK(cudaFree(b));
}

// The gradient norm's partial sums (llama3 SUMSQ_BLOCKS per tensor): one fp32 sum over the ranks.
static void check_norm_sum(const Ranks& R) {
    const size_t n = 4096;
    std::vector<float> mine(n), ref(n, 0.0f);
    for (int r = 0; r < R.world; r++) {
        rng_state = (dev_seed() + 31ull * (r + 1)) | 1;
        for (size_t i = 0; i < n; i++) {
            float v = (float)(rng_u32() % 1000) * 0.125f; // sums of these are exact in fp32
            ref[i] += v;
            if (r == R.rank) mine[i] = v;
        }
    }
    float* buf = dev_upload(mine);
    NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, R.comm, R.stream));
    char what[96];
    snprintf(what, sizeof(what), "rank %d: gradient norm partial sums, fp32 all-reduce", R.rank);
    dev_check(what, dev_download(buf, n), ref, 0.0f, 0.0f);
    CUDA_CHECK(cudaFree(buf));
}

// This rank's GPU and communicator (ranks found each other through a file in /tmp).
static Ranks ranks_start(int rank, int world, const char* rendezvous_path) {
    Ranks R = {rank, world, false, NULL, NULL};
    char err[L3_ERR_LEN], spec[L3_PATH_LEN + 8];
    int n_devices = 0, version = 0, device = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n_devices));
    const char* multi = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    NCCL_CHECK(ncclGetVersion(&version));
    R.shared_gpu = world > n_devices;
    bool may_share = multi && !strcmp(multi, "1") && version >= 23000;
    // Whether the machine holds every rank is asked of the last one (the highest local rank), so that
    // all ranks skip alike: a rank 0 that went on alone would wait in NCCL's start for ever.
    RankEnv last = {world - 1, world, world - 1, "dev/nccl --ranks"}, env = {rank, world, rank, "dev/nccl --ranks"};
    if (rank_device(&last, n_devices, may_share, &device, err)) {
        if (rank == 0) printf("skipped: dev/nccl: %s (this NCCL is %d)\n0 passed, 0 failed\n", err, version);
        exit(EXIT_SUCCESS);
    }
    if (rank_device(&env, n_devices, may_share, &device, err)) exit(EXIT_FAILURE); // (cannot fail after the last's)
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaStreamCreate(&R.stream));
    ncclUniqueId id;
    if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    RendezvousSpec s;
    snprintf(spec, sizeof(spec), "file:%s", rendezvous_path);
    static_assert(sizeof(id) == RENDEZVOUS_ID_BYTES, "NCCL's id is the rendezvous's 128 bytes");
    if (rendezvous_parse(spec, &s, err) || rendezvous(&s, rank, world, 0, (unsigned char*)&id, 120, err)) {
        fprintf(stderr, "error: rank %d: %s\n", rank, err);
        exit(EXIT_FAILURE);
    }
    NCCL_CHECK(ncclCommInitRank(&R.comm, world, id, rank));
    if (rank == 0) unlink(rendezvous_path); // every rank has joined
    if (rank == 0) printf("NCCL %d, %d ranks on %d GPU%s\n", version, world, n_devices, n_devices > 1 ? "s" : "");
    return R;
}

static int run_rank(int rank, int world, bool check_only, const char* rendezvous_path) {
    alarm(600); // a rank whose peer died would wait in NCCL for ever: fail instead
    Ranks R = ranks_start(rank, world, rendezvous_path);
    Llama3Config c = llama3_2_1b_config();
    ParamLayout p = param_layout(&c);
    std::vector<Tensor> layer = {{"qkv", p.layer_size[P_QKV]}, {"attn_out", p.layer_size[P_ATTN_OUT]},
                                 {"gate_up", p.layer_size[P_GATE_UP]}, {"down", p.layer_size[P_DOWN]},
                                 {"attn_norm", p.layer_size[P_ATTN_NORM]}, {"ffn_norm", p.layer_size[P_FFN_NORM]}};
    std::vector<Tensor> head = {{"final_norm", p.layer_size[P_FINAL_NORM]}, {"lm_head", p.layer_size[P_LM_HEAD]}};
    std::vector<Tensor> odd = {{"odd", 1000003}, {"tiny", 13}}; // parts and a tail at any N; a tail only
    if (rank == 0 && !check_only) print_header();
    bench_group(R, "1B layer", layer, check_only);
    bench_group(R, "1B head", head, check_only);
    bench_group(R, "odd sizes", odd, true);
    check_norm_sum(R);
    int failed = dev_failed, *failed_dev = dev_upload(std::vector<int>{failed});
    NCCL_CHECK(ncclAllReduce(failed_dev, failed_dev, 1, ncclInt32, ncclSum, R.comm, R.stream));
    int all_failed = dev_download(failed_dev, 1)[0];
    NCCL_CHECK(ncclCommDestroy(R.comm));
    if (rank == 0) printf("(checks of every rank: %d failed)\n", all_failed);
    return rank == 0 ? dev_finish() : (failed ? EXIT_FAILURE : EXIT_SUCCESS);
}

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    bool check_only = false;
    long long world = 2;
    char err[L3_ERR_LEN];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) check_only = true;
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc && parse_int("--ranks", argv[i + 1], 1, 64, &world, err) == 0) i++;
        else {
            fprintf(stderr, "usage: %s [--check] [--ranks N (1..64, default 2)]\n", argv[0]);
            return EXIT_FAILURE;
        }
    }
    dev_seed(); // one seed for every rank: forked below, before CUDA starts in any of them
    char path[64];
    snprintf(path, sizeof(path), "/tmp/llama3_dev_nccl_%d", (int)getpid());
    std::vector<pid_t> kids;
    for (int r = 1; r < world; r++) {
        pid_t pid = fork();
        if (pid == 0) _exit(run_rank(r, (int)world, check_only, path));
        kids.push_back(pid);
    }
    int rc = run_rank(0, (int)world, check_only, path);
    for (pid_t k : kids) {
        int st = 0;
        waitpid(k, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = EXIT_FAILURE;
    }
    return rc;
}
