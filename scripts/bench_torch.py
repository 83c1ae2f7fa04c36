#!/usr/bin/env python3
"""The PyTorch peer of scripts/bench.sh: HF LlamaForCausalLM in the LLaMA3.2-1B shape, or another
of ref_llama3.py's shapes (--shape 3b --tied: the 3.2-3B as released) (random init, untied unless
--tied, sdpa attention) trained with fp32 master weights under bf16 autocast and fused
AdamW, on random tokens; with --fp8 its block linears run the trainer's --fp8 1 recipe through
torch._scaled_mm (ref_llama3.py's use_fp8: e4m3 / e5m2, one dynamic scale per tensor). Prints one JSON line: the median step time over --steps timed steps
(CUDA events, after --warmup steps), its min and max, tok/s and peak allocated memory.

    python scripts/bench_torch.py --mode eager --batch_size 4 --seq_len 64
    python scripts/bench_torch.py --mode compile --shape 3b --tied --batch_size 4 --seq_len 1024
    python scripts/bench_torch.py --mode eager --fp8 --batch_size 16 --seq_len 1024
    modes: eager, compile (torch.compile default), cudagraphs (torch.compile mode=reduce-overhead)
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from ref_llama3 import make_model, use_fp8  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "compile", "cudagraphs"], default="eager")
    ap.add_argument("--batch_size", type=int, default=4)
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--shape", default="1b", help="a shape of ref_llama3.py (1b, 3b, 8b)")
    ap.add_argument("--tied", action="store_true", help="lm_head tied to the embedding")
    ap.add_argument("--fp8", action="store_true", help="the block linears in FP8 (torch._scaled_mm), as --fp8 1")
    args = ap.parse_args()
    B, T = args.batch_size, args.seq_len
    model, cfg = make_model(args.shape, "cuda", 1337, tied=args.tied)
    if args.fp8:
        use_fp8(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    fwd = model
    if args.mode != "eager":
        fwd = torch.compile(model, mode="reduce-overhead" if args.mode == "cudagraphs" else None)
    x = torch.randint(0, cfg.vocab_size, (B, T), device="cuda")
    y = torch.randint(0, cfg.vocab_size, (B, T), device="cuda")

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = fwd(input_ids=x).logits
        loss = F.cross_entropy(logits.float().view(-1, cfg.vocab_size), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    med = times[len(times) // 2]
    print(json.dumps({"impl": f"pytorch {args.mode}", "shape": args.shape, "tied": args.tied, "fp8": args.fp8, "B": B, "T": T, "ms": med, "ms_min": times[0],
                      "ms_max": times[-1], "tok_s": B * T / (med / 1000.0),
                      "peak_mib": torch.cuda.max_memory_allocated() / 2**20}))


if __name__ == "__main__":
    main()
