#!/usr/bin/env python3
"""The PyTorch peer of scripts/bench.sh: HF LlamaForCausalLM in the LLaMA3.2-1B shape, or another of
ref_llama3.py's shapes (--shape 3b --tied: the 3.2-3B as released) (random init, untied unless --tied, sdpa
attention) trained with fp32 master weights under bf16 autocast and fused AdamW, on random tokens; --accum N
micro-steps per optimizer step, as the trainer's --total_batch_size; --master_weights bf16 keeps the weights
and AdamW's moments in bf16 only, updated with stochastic rounding by torchao's
_AdamW(bf16_stochastic_round=True) (the trainer's --master_weights bf16 --optimizer_state bf16);
--checkpointing recomputes each layer in the backward (HF's gradient checkpointing); with --fp8 its block
linears run the trainer's --fp8 1 recipe through torch._scaled_mm (ref_llama3.py's use_fp8: e4m3, the
gradients in --fp8_grads, one dynamic scale per tensor). With --ddp, started by torchrun, each rank trains its
own tokens under DistributedDataParallel (NCCL, one GPU per rank: its LOCAL_RANK); the timed steps end with a
check that every rank holds the same weights. Prints one JSON line (rank 0): the median step time over --steps
timed steps (CUDA events, after --warmup steps), its min and max, tok/s of all ranks and peak allocated
memory.

    python scripts/bench_torch.py --mode eager --batch_size 4 --seq_len 64
    python scripts/bench_torch.py --mode compile --shape 3b --tied --batch_size 4 --seq_len 1024
    python scripts/bench_torch.py --mode eager --fp8 --batch_size 16 --seq_len 1024
    python scripts/bench_torch.py --mode compile --shape 8b --master_weights bf16 --checkpointing \\
        --batch_size 1 --seq_len 2048 --accum 4 --steps 2 --warmup 1
    python -m torch.distributed.run --standalone --nproc_per_node 2 scripts/bench_torch.py --ddp --mode compile \\
        --batch_size 16 --seq_len 1024
    modes: eager, compile (torch.compile default), cudagraphs (torch.compile mode=reduce-overhead; not with --ddp)
--device cpu runs the same on the CPU (gloo between the ranks, wall-clock times): a check that the
script works on a machine without a GPU (make test's host part), not a benchmark.
"""
import contextlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402


def parse_args():
    what, examples = __doc__.split("\n\n")[:2]
    ap = cli.ArgumentParser(__file__, description=what, epilog=f"examples:\n{examples}")
    ap.add_argument("--mode", choices=["eager", "compile", "cudagraphs"], default="eager")
    ap.add_argument("--batch_size", type=int, default=4, help="per rank")
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--accum", type=int, default=1, help="micro-steps (backward passes) per optimizer step")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--shape", default="1b", help="a shape of ref_llama3.py (1b, 3b, 8b, small)")
    ap.add_argument("--tied", action="store_true", help="lm_head tied to the embedding")
    ap.add_argument("--fp8", action="store_true", help="the block linears in FP8 (torch._scaled_mm), as --fp8 1")
    ap.add_argument("--fp8_grads", choices=["e5m2", "e4m3"], default="e5m2", help="--fp8: the output gradients' "
                    "format, as the trainer's --fp8_grads")
    ap.add_argument("--master_weights", choices=["fp32", "bf16"], default="fp32", help="bf16: the weights and "
                    "AdamW's moments in bf16 only, torchao's AdamW with stochastic rounding")
    ap.add_argument("--checkpointing", action="store_true", help="recompute each layer's activations in the "
                    "backward (HF's gradient checkpointing)")
    ap.add_argument("--ddp", action="store_true", help="one rank of torchrun's launch, DistributedDataParallel")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a check of the script, no timing")
    args = ap.parse_args()
    for name in ("batch_size", "seq_len", "accum", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} {getattr(args, name)}: want 1 or more")
    if args.ddp and args.mode == "cudagraphs":
        ap.error("--mode cudagraphs with --ddp: torch.compile's CUDA graphs do not take DDP's collectives")
    if args.ddp and "RANK" not in os.environ:
        ap.error("--ddp wants torchrun's RANK, WORLD_SIZE and LOCAL_RANK (python -m torch.distributed.run ...)")
    return args


if __name__ == "__main__":
    ARGS = parse_args()  # (before torch's import: --help and a bad argument on any machine)
try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
except ModuleNotFoundError as e:
    cli.missing_package(__file__, e, "requirements-gpu.txt")

from ref_llama3 import make_model, use_fp8  # noqa: E402


def start_ranks(args):
    """(rank, world, device): torchrun's rank on its GPU (its LOCAL_RANK) and the process group; one process alone."""
    if not args.ddp:
        return 0, 1, torch.device(args.device)
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local)
    device = torch.device(args.device, local) if args.device == "cuda" else torch.device("cpu")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", device_id=device if args.device == "cuda" else None)
    return rank, world, device


def ranks_agree(model, device):
    """Whether every rank holds the same weights (DDP's averaged gradients, the same AdamW): the sum and the sum
    of squares of all weights in float64, gathered and compared exactly."""
    flat = torch.cat([p.detach().double().view(-1) for p in model.parameters()])
    mine = torch.stack([flat.sum(), flat.square().sum()]).to(device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return all(torch.equal(e, every[0]) for e in every)


def make_optimizer(model, master_weights):
    """fp32: fused AdamW over the fp32 weights (autocast gives the matmuls bf16 copies). bf16: the weights cast to
    bf16 once, and torchao's AdamW, whose moments take the weights' dtype and whose update is rounded into the bf16
    weight stochastically."""
    if master_weights == "fp32":
        return torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    try:
        from torchao.optim import _AdamW  # (torchao 0.18's name for its AdamW over bf16 weights)
    except ModuleNotFoundError as e:
        cli.missing_package(__file__, e, "requirements-bench.txt")
    except ImportError as e:
        sys.exit(f"error: bench_torch.py --master_weights bf16 needs torchao's _AdamW (torchao 0.18, "
                 f"requirements-bench.txt): {e}")
    model.to(torch.bfloat16)
    return _AdamW(model.parameters(), lr=1e-5, bf16_stochastic_round=True)


def timed(step, device):
    """The milliseconds of one call of step: CUDA events on the GPU, the wall clock on the CPU."""
    if device.type == "cpu":
        t0 = time.perf_counter()
        step()
        return 1000.0 * (time.perf_counter() - t0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def main(args):
    B, T = args.batch_size, args.seq_len
    rank, world, device = start_ranks(args)
    model, cfg = make_model(args.shape, device, 1337, tied=args.tied)
    if args.fp8:
        use_fp8(model, args.fp8_grads)
    if args.checkpointing:
        model.gradient_checkpointing_enable()
    opt = make_optimizer(model, args.master_weights)
    fwd = model
    if args.ddp:
        fwd = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                                        gradient_as_bucket_view=True)
    # DDP averages the gradients once a step, after the last micro-step, as the trainer reduces them
    ddp = fwd if args.ddp else None
    if args.mode != "eager":
        fwd = torch.compile(fwd, mode="reduce-overhead" if args.mode == "cudagraphs" else None)
    gen = torch.Generator(device=device).manual_seed(1000 + rank)  # each rank its own tokens
    x = torch.randint(0, cfg.vocab_size, (B, T), device=device, generator=gen)
    y = torch.randint(0, cfg.vocab_size, (B, T), device=device, generator=gen)

    def step():
        for k in range(args.accum):  # (the same batch each micro-step: the timing does not depend on the tokens)
            with ddp.no_sync() if ddp is not None and k < args.accum - 1 else contextlib.nullcontext():
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                    logits = fwd(input_ids=x).logits
                loss = F.cross_entropy(logits.float().view(-1, cfg.vocab_size), y.view(-1)) / args.accum
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    torch.manual_seed(7)  # every rank the same stream: torchao's stochastic rounding draws from it
    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = sorted(timed(step, device) for _ in range(args.steps))
    med = statistics.median(times)  # (of two steps, their mean)
    out = {"impl": f"pytorch {args.mode}" + (" ddp" if args.ddp else ""), "shape": args.shape, "tied": args.tied,
           "fp8": args.fp8, "fp8_grads": args.fp8_grads if args.fp8 else None, "ranks": world, "B": B, "T": T,
           "accum": args.accum, "master_weights": args.master_weights, "checkpointing": args.checkpointing,
           "ms": med, "ms_min": times[0], "ms_max": times[-1],
           "tok_s": world * args.accum * B * T / (med / 1000.0),
           "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None}
    if args.ddp:
        out["ranks_agree"] = ranks_agree(model, device)
        dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(out))
    if not out.get("ranks_agree", True):
        sys.exit(f"error: rank {rank}: the ranks' weights differ after the timed steps (DDP did not average the gradients)")


if __name__ == "__main__":
    main(ARGS)
