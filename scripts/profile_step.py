#!/usr/bin/env python3
"""Where one training step's GPU time goes, from Nsight Compute: its kernels grouped by what they do.

    scripts/profile_step.py NCU_OUTPUT      (scripts/profile.sh runs ncu, then this)

NCU_OUTPUT is the stdout of `ncu --metrics gpu__time_duration.sum --csv ./train_llama3 ...`: the
trainer's own lines, then one CSV row per kernel. ncu runs the kernels one at a time, so each
duration is that kernel alone on the GPU, and their sum over a step is the step's GPU work without
overlap (AdamW on the second stream beside the backward) and without launch gaps: not the step's
time. The step time is the trainer's own log of a run without ncu.

A step starts with adamw_next_step_kernel. The step reported is the last one that the next step's
start bounds: the run's final step is followed by end-of-training work (the flush of deferred AdamW),
and an ncu --launch-count may cut it short. Kernels are forward or backward by position: backward
from cross_entropy_kernel on, forward again from the next micro-step's embedding_forward_kernel.
"""
import csv
import re
import sys
from collections import defaultdict

from cli import ArgumentParser

STEP_START = "adamw_next_step_kernel"
PHASE_FROM = {"embedding_forward_kernel": "forward", "cross_entropy_kernel": "backward"}

# (pattern searched in the kernel's base name, group); "{phase}" is forward or backward. First match
# wins; a kernel no pattern matches lands in "other", listed by name.
GROUPS = [
    (r"^(embedding_|adamw_sparse_rows_)|DeviceRadixSort", "embedding + token sort + AdamW sparse rows"),
    (r"^adamw_", "AdamW dense"),
    (r"^(cross_entropy|mean)_kernel$", "cross-entropy + loss mean"),
    (r"^(flash_|attention_|permute_heads_)", "attention {phase}"),
    # column_sum finishes the weight gradient; the rest are the unfused path (--fused_rmsnorm 0)
    (r"^(rmsnorm_|column_sum_|square_|row_mean_|add_scalar_|rsqrt_|mul_broadcast_|mul_backward_|mean_backward_|"
     r"add_grads_|residual_add_)", "RMSNorm {phase}"),
    (r"^swiglu_", "SwiGLU {phase}"),
    (r"^rope_", "RoPE {phase}"),
    (r"nvjet|cutlass|xmma|gemm|sm90_|sm80_|ampere_|cublasLt::", "GEMM {phase} (cuBLASLt)"),
]

TO_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}


def base_name(demangled):
    """'void adamw_kernel<4, 1, __nv_bfloat16>(float *, ...)' -> 'adamw_kernel<4, 1, __nv_bfloat16>'."""
    name, depth = demangled[5:] if demangled.startswith("void ") else demangled, 0
    for i, c in enumerate(name):
        depth += (c == "<") - (c == ">")
        if c == "(" and depth == 0:
            return name[:i]
    return name


def read_kernels(path):
    """(name, ms) of every kernel in launch order; lines that are not rows of ncu's table are skipped."""
    header, kernels = None, []
    try:
        f = open(path, newline="", errors="replace")
    except OSError as e:
        sys.exit(f"error: {path}: cannot read: {e.strerror}")
    with f:
        for row in csv.reader(line for line in f if line.startswith('"')):
            if header is None:
                if "Kernel Name" in row and "Metric Value" in row:
                    header = {col: i for i, col in enumerate(row)}
                continue
            if len(row) != len(header) or row[header["Metric Name"]] != "gpu__time_duration.sum":
                continue
            value = float(row[header["Metric Value"]].replace(",", ""))
            kernels.append((base_name(row[header["Kernel Name"]]), value * TO_MS[row[header["Metric Unit"]]]))
    if header is None:
        sys.exit(f"{path}: no ncu CSV table (a header with 'Kernel Name' and 'Metric Value')")
    return kernels


def group_of(name, phase):
    for pattern, group in GROUPS:
        if re.search(pattern, name):
            return group.format(phase=phase)
    return "other"


def table(title, rows):
    print(f"| {' | '.join(title)} |\n|{'---|' * len(title)}")
    for r in rows:
        print(f"| {' | '.join(r)} |")


def main():
    ap = ArgumentParser(__file__, description=__doc__.split("\n\n")[0],
                        epilog="example: PROFILE_CSV=ncu.csv scripts/profile.sh 4 64   (ncu, then this script on ncu.csv);\n"
                               "         scripts/profile_step.py ncu.csv   (that step's table again)")
    ap.add_argument("ncu_output", metavar="NCU_OUTPUT", help="the stdout of ncu --metrics gpu__time_duration.sum "
                    "--csv ./train_llama3 ... (scripts/profile.sh's PROFILE_CSV)")
    path = ap.parse_args().ncu_output
    kernels = read_kernels(path)
    starts = [i for i, (name, _) in enumerate(kernels) if name == STEP_START]
    if not starts:
        sys.exit(f"{path}: no {STEP_START}, so no step to report")
    if len(starts) >= 2:
        begin, end = starts[-2], starts[-1]
        which = f"step {len(starts) - 1} of {len(starts)} (the last one a next step bounds)"
    else:
        begin, end, which = starts[0], len(kernels), "step 1 of 1 (to the run's end: may hold more than a step)"
    step = kernels[begin:end]

    groups = defaultdict(lambda: [0, 0.0])  # group -> [kernels, ms]
    per_name = defaultdict(lambda: [0, 0.0])
    others = set()
    phase = "forward"
    for name, ms in step:
        kernel = re.sub(r"<.*", "", name)  # the template's name: what the phase markers and patterns see
        phase = PHASE_FROM.get(kernel, phase)
        group = group_of(kernel, phase)
        if group == "other":
            others.add(kernel)
        groups[group][0] += 1
        groups[group][1] += ms
        per_name[name][0] += 1
        per_name[name][1] += ms
    total = sum(ms for _, ms in step)

    print(f"{path}: {which}, {len(step)} kernels, {total:.3f} ms of kernel time")
    print("(serialized durations: the step's GPU work without overlap, not its time)\n")
    by_time = sorted(groups.items(), key=lambda kv: -kv[1][1])
    table(["group", "kernels in step", "GPU ms", "% of kernel time"],
          [[g, str(n), f"{ms:.3f}", f"{100 * ms / total:.1f}%"] for g, (n, ms) in by_time]
          + [["total", str(len(step)), f"{total:.3f}", "100.0%"]])
    if others:
        print(f"\nother: {', '.join(sorted(others))}")
    print("\nThe 10 most expensive kernels:\n")
    top = sorted(per_name.items(), key=lambda kv: -kv[1][1])[:10]
    table(["kernel", "count", "GPU ms", "% of kernel time"],
          [[name[:60], str(n), f"{ms:.3f}", f"{100 * ms / total:.1f}%"] for name, (n, ms) in top])


if __name__ == "__main__":
    main()
