#!/usr/bin/env python3
"""Host test of llama3.h's RoPE (rope_inv_freq and rope_table, the table the trainer uploads) against HF
transformers' LlamaRotaryEmbedding (rope_type llama3, its fp32 cos and sin) at every position of a sequence
of the released models' 131,072 positions: head_dim 64 with RoPE factor 32 (Llama 3.2-1B), 128 with 32
(3.2-3B) and 128 with 8 (3.1-8B). Needs torch and transformers (on the CPU) and ./test_llama3_host (make
test_llama3_host), whose --rope_table writes llama3.h's tables.

    python3 scripts/test_rope.py [--positions 131072]

Both sides take the angle as fp32(position * inv_freq). inv_freq: ours is 1 / theta^(2i/d) rounded once
(the llama3 scaling in double, as Meta's apply_scaling), HF's an fp32 pow and division (the scaling in fp32
ops): within 1e-6 relative (a few ulp; test_llama3.cu's TOL_ROPE_FREQ). The table: where the two inv_freq
are the same float, the angles are the same float and cos and sin may differ only by their own rounding
(ours from double, at most half an ulp; torch's fp32, about one): 2^-22 absolute (4 ulp of 1). Where they
differ, the angles differ by at most t |inv_ours - inv_hf| plus an ulp of the angle (each product rounds),
and cos and sin no more (their slopes are at most 1): that is added. Prints "ok ..." / "FAIL ..." per check,
"skipped: ..." without torch and transformers, then "N passed, M failed".
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli import ArgumentParser  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
HOST_TEST = os.path.join(HERE, "..", "test_llama3_host")
CASES = [(64, 32.0, "Llama 3.2-1B"), (128, 32.0, "Llama 3.2-3B"), (128, 8.0, "Llama 3.1-8B")]  # head_dim, factor
TOL_FREQ, TOL_TABLE = 1e-6, 2.0 ** -22
results = []


def parse_args():
    what, example = __doc__.split("\n\n")[:2]
    ap = ArgumentParser(__file__, description=what, epilog=f"example:\n{example}")
    ap.add_argument("--positions", type=int, default=131072, help="the sequence's positions (default: 131072)")
    args = ap.parse_args()
    if not 1 <= args.positions <= 1 << 24:
        ap.error(f"--positions {args.positions}: in [1, 2^24], as llama3.h's max_seq_len")
    return args


if __name__ == "__main__":
    ARGS = parse_args()  # (before torch's import: --help on any machine)
try:
    import numpy as np
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
except ModuleNotFoundError as e:
    MISSING = e.name
else:
    MISSING = None


def check(ok, what):
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)


def ours(head_dim, factor, T, work):
    """llama3.h's inv_freq (head_dim / 2) and its (T, head_dim / 2) cos and sin."""
    path = os.path.join(work, f"rope_{head_dim}_{factor:g}.bin")
    subprocess.run([HOST_TEST, "--rope_table", str(head_dim), f"{factor:g}", str(T), path], check=True)
    half, table = head_dim // 2, np.fromfile(path, dtype=np.float32)
    return table[:half], table[half:half + T * half].reshape(T, half), table[half + T * half:].reshape(T, half)


def hf(head_dim, factor, T):
    """HF's inv_freq and its cos and sin for positions 0..T-1 (their first head_dim / 2 columns), on the CPU."""
    cfg = LlamaConfig(hidden_size=head_dim, num_attention_heads=1, num_key_value_heads=1, head_dim=head_dim,
                      max_position_embeddings=131072,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": factor,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192})
    rope = LlamaRotaryEmbedding(cfg)
    cos, sin = rope(torch.zeros(1, 1, T, head_dim), torch.arange(T)[None])
    half = head_dim // 2
    return rope.inv_freq.float().numpy(), cos[0, :, :half].numpy(), sin[0, :, :half].numpy()


def table_bound(inv, inv_hf, T):
    """Per (position, pair): 2^-22, and where the inv_freq differ t |inv - inv_hf| + an ulp of the larger angle."""
    t = np.arange(T, dtype=np.float64)[:, None]
    differ = (inv != inv_hf)[None, :]
    angle = t * np.maximum(inv, inv_hf).astype(np.float64)[None, :]
    spread = t * np.abs(inv.astype(np.float64) - inv_hf) + np.spacing(angle.astype(np.float32)).astype(np.float64)
    return TOL_TABLE + np.where(differ, spread, 0.0)


def compare(head_dim, factor, name, T, work):
    inv, cos, sin = ours(head_dim, factor, T, work)
    inv_hf, cos_hf, sin_hf = hf(head_dim, factor, T)
    freq_err = float(np.max(np.abs(inv.astype(np.float64) - inv_hf) / inv_hf))
    check(freq_err <= TOL_FREQ, f"{name} (head_dim {head_dim}, factor {factor:g}): inv_freq against HF's, largest "
          f"relative error {freq_err:.3e} (tol {TOL_FREQ:g}; {int(np.sum(inv != inv_hf))} of {len(inv)} differ)")
    err = np.maximum(np.abs(cos.astype(np.float64) - cos_hf), np.abs(sin.astype(np.float64) - sin_hf))
    over = err / table_bound(inv, inv_hf, T)
    worst = np.unravel_index(int(np.argmax(over)), over.shape)
    same = inv == inv_hf
    check(float(over.max()) <= 1.0, f"{name}: cos and sin at positions 0..{T - 1} against HF's, largest error over "
          f"its bound {float(over.max()):.3f} (at position {worst[0]}, pair {worst[1]}); largest error where the "
          f"inv_freq agree {float(err[:, same].max()) if same.any() else 0.0:.3e} (tol {TOL_TABLE:.3e})")


def main(args):
    if MISSING:
        print(f"skipped: llama3.h's RoPE against transformers' (python3 has no {MISSING}; torch and transformers: "
              "requirements-gpu.txt)")
    elif not os.access(HOST_TEST, os.X_OK):
        check(False, f"{HOST_TEST} is missing: make test_llama3_host")
    else:
        with tempfile.TemporaryDirectory() as work:
            for head_dim, factor, name in CASES:
                compare(head_dim, factor, name, args.positions, work)
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main(ARGS)
