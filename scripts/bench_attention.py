#!/usr/bin/env python3
"""The PyTorch peer of dev/attention's timing: torch.nn.functional.scaled_dot_product_attention, causal, GQA, bf16,
forward and backward (torch.autograd.grad of q, k, v), on dev/attention's timed shapes, rows in its table's format.
Each shape runs on the fastest of sdpa's flash, efficient and cuDNN backends (sdpa_kernel), each with enable_gqa=True
where it takes it, else with K and V repeated per query head: each candidate's forward + backward is timed (median
of 3 after a warm-up), the choice printed, then the fastest timed as dev/common.h's median_ms times a kernel: CUDA
events around each call, queued behind a GPU sleep (about 1 ms) while the host issues it, the median of 5 to 30
calls (as many as take about a second) after a warm-up call and one that sizes the run, the inputs rotated where
they fit in L2. The FLOPs are dev/attention's: the full T x T square, 4 B NH T^2 HD forward, twice that backward;
in brackets the causal half. q, k, v and the output's gradient are token-major (B, T, heads, HD) seen as
(B, heads, T, HD), the layout Hugging Face's attention hands sdpa. Needs torch (requirements-gpu.txt) and a GPU.

    python3 scripts/bench_attention.py
    python3 scripts/bench_attention.py --sizes 1k,64k
scripts/bench_attention.sh runs it beside ./dev/attention and prints the two side by side.
"""
import argparse
import itertools
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402

NH, KVH = 32, 8  # the 1B's and the 8B's heads


def timed_shapes():
    """(B, T, HD) as dev/attention times them: the 1B's B=4,T=64 and B=16,T=1024, then the 1B's and the 8B's heads
    (HD 64 and 128) at T = 1k, 4k, 16k and 64k, 65,536 tokens each."""
    return [(4, 64, 64), (16, 1024, 64)] + [(65536 // T, T, HD) for HD in (64, 128) for T in (1024, 4096, 16384, 65536)]


def parse_sizes(text):
    """dev/attention's --sizes: sequence lengths, comma-separated, each a number with an optional k (x1024)."""
    known = sorted({T for _, T, _ in timed_shapes()})
    try:
        sizes = [int(s[:-1]) * 1024 if s.endswith("k") else int(s) for s in text.split(",")]
    except ValueError:
        sizes = None
    if not sizes or any(T not in known for T in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: want T,T,... of {','.join(map(str, known))} (1k = 1024)")
    return sizes


def parse_args():
    what, examples = __doc__.split("\n\n")[:2]
    ap = cli.ArgumentParser(__file__, description=what, epilog=f"examples:\n{examples}")
    ap.add_argument("--sizes", type=parse_sizes, metavar="T,T,...",
                    help="time only the shapes of these T (as dev/attention --sizes: 64,1k,...)")
    return ap.parse_args()


if __name__ == "__main__":
    ARGS = parse_args()  # (before torch's import: --help and a bad argument on any machine)
try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ModuleNotFoundError as e:
    cli.missing_package(__file__, e, "requirements-gpu.txt")

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION}
SLEEP_CYCLES = 2_000_000  # (about 1 ms at the GPU's clock: longer than the host takes to issue a call)


def median_ms(fn, warmup, reps):
    """dev/common.h's median_ms: the median of reps timed calls after warmup untimed ones, each between two CUDA events
    and queued behind a GPU sleep during which the host issues it, so that the host's launch cost is not timed."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[reps // 2]


def median_ms_sized(fn):
    """dev/attention's median_ms_sized: a warm-up call and one that sizes the run, then about a second of calls."""
    first = median_ms(fn, 1, 1)
    return median_ms(fn, 0, 30 if 30 * first < 1000.0 else max(5, int(1000.0 / first)))


def gemm_ceiling_tflops():
    """An 8192^3 bf16 GEMM on random data (torch.matmul: cuBLAS), dev/common.h's ceiling."""
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    tflops = 2.0 * n**3 / (median_ms(lambda: a @ b.T, 3, 10) * 1e9)
    print(f"ceiling: bf16 GEMM 8192^3 {tflops:.0f} TFLOP/s (torch.matmul, random data)")
    return tflops


def rotations(bytes_per_call):
    """dev/common.h's rotations: sets of inputs to span twice the L2 (one when a single call already does)."""
    return min(64, 2 * torch.cuda.get_device_properties(0).L2_cache_size // bytes_per_call + 1)


def make_inputs(B, T, HD):
    """q, k, v (requiring gradients) and dy, each a token-major (B, T, heads, HD) tensor seen as (B, heads, T, HD)."""
    def heads(n):
        return torch.randn(B, T, n, HD, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    return heads(NH).requires_grad_(), heads(KVH).requires_grad_(), heads(KVH).requires_grad_(), heads(NH)


def attention(gqa):
    """sdpa, causal, with enable_gqa (gqa) or with K and V repeated per query head (their gradients summed back)."""
    if gqa:
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k.repeat_interleave(NH // KVH, 1),
                                                          v.repeat_interleave(NH // KVH, 1), is_causal=True)


def rotating(sets, call):
    """A function of no arguments that calls call(set) on the next of sets each time."""
    it = itertools.cycle(sets)
    return lambda: call(next(it))


def forward_backward(attn, s):
    """The gradients of q, k, v of set s = (q, k, v, dy) through attn, its forward run first."""
    q, k, v, dy = s
    return torch.autograd.grad(attn(q, k, v), (q, k, v), dy)


def choose(sets, size):
    """(way, backend, attention function) of the backend (and GQA way) whose forward + backward is fastest on sets;
    prints each one's time."""
    timed, said = {}, []
    for name, backend in BACKENDS.items():
        for gqa in (True, False):
            way, attn = f"{name}, {'enable_gqa' if gqa else 'repeated K/V'}", attention(gqa)
            try:
                with sdpa_kernel(backend), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # (a backend that does not take the shape says why at length)
                    timed[way] = (median_ms(rotating(sets, lambda s: forward_backward(attn, s)), 1, 3), backend, attn)
                said.append(f"{way} {timed[way][0]:.3f} ms")
                break  # (enable_gqa taken: repeating K and V would only add copies)
            except RuntimeError as e:  # (not this shape, or out of memory)
                said.append(f"{way} not taken ({str(e).splitlines()[0][:60]})")
                torch.cuda.empty_cache()
    best = min(timed, key=lambda w: timed[w][0])
    print(f"sdpa {size} forward + backward: {'; '.join(said)} -> {best}")
    _, backend, attn = timed[best]
    return best, backend, attn


def row(kernel, label, size, ms, flops, ceiling):
    """A row of dev/attention's table (its check column '-': PyTorch is not validated here)."""
    rate = flops / (ms * 1e9)
    return (f"| {kernel} | {label} | {size} | {ms:.4f} | {rate:.0f} TFLOP/s (causal {rate / 2:.0f}) | "
            f"{100 * rate / ceiling:.0f}% | - |")


def time_shape(B, T, HD, ceiling):
    """The forward and the backward rows of one shape on its fastest backend."""
    size = f"B={B} T={T} HD {HD}"
    sets = [make_inputs(B, T, HD) for _ in range(rotations(2 * B * T * (2 * NH + 2 * KVH) * HD))]  # q, k, v, out
    way, backend, attn = choose(sets, size)
    flops = 4.0 * B * NH * T * T * HD
    with sdpa_kernel(backend):
        fwd = median_ms_sized(rotating(sets, lambda s: attn(*s[:3])))
        outs = [(attn(*s[:3]), s) for s in sets]  # (each set's graph, kept for the timed backward calls)
        bwd = median_ms_sized(rotating(outs, lambda o: torch.autograd.grad(o[0], o[1][:3], o[1][3],
                                                                          retain_graph=True)))
    label = f"torch sdpa ({way})"
    return [row("attention forward", label, size, fwd, flops, ceiling),
            row("attention backward", label, size, bwd, 2 * flops, ceiling)]


def main(args):
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    ceiling = gemm_ceiling_tflops()
    rows = []
    for B, T, HD in timed_shapes():
        if args.sizes is None or T in args.sizes:
            rows += time_shape(B, T, HD, ceiling)
            torch.cuda.empty_cache()
    print("| kernel | version | size | ms (median) | rate | of ceiling | check |\n|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main(ARGS)
