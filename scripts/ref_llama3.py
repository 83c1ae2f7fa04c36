#!/usr/bin/env python3
"""PyTorch reference for test_llama3: HF transformers' LlamaForCausalLM (rope_type llama3, untied, or with --tied
one weight as embedding and lm_head, as Llama-3.2-1B/3B ship)
trained with fp32 master weights under torch.autocast(bfloat16), AdamW on every dense parameter and
the same AdamW restricted to the touched rows ("lazy", as SparseAdam) on the token embedding; weight
decay on the matrices and the embedding, not on the norm weights; the learning rate from a LambdaLR
schedule (--lr_schedule, --warmup_iters, ...) and, with --grad_clip, torch.nn.utils.clip_grad_norm_.

    python scripts/ref_llama3.py --name small_t64 --shape small --batch_size 4 --seq_len 64
    python scripts/ref_llama3.py --name small_accum --shape small --grad_accum 3
    python scripts/ref_llama3.py --name 1b --shape 1b --steps 2            # ~42 GB of files
    python scripts/ref_llama3.py --name small_dense --shape small --dense_embedding
    python scripts/ref_llama3.py --name small_sched --steps 5 --lr_schedule cosine --warmup_iters 2 --grad_clip 1
    python scripts/ref_llama3.py --name small_b8 --shape small --batch_size 8 --seq_len 128 --vocab 8000
    python scripts/ref_llama3.py --name small_tied --shape small --tied   # tied: dense embedding AdamW, no lm_head
    python scripts/ref_llama3.py --name 1b_tied --shape 1b --tied --model_only  # only NAME_model.bin (a bench model)
    python scripts/ref_llama3.py --name small_hd128 --shape small_hd128 --batch_size 2 --seq_len 1024 --qk_std 0.07 \\
        --rope_factor 8                                                            # head_dim 128, Llama-3.1's RoPE
    python scripts/ref_llama3.py --name 3b --shape 3b --tied --model_only          # LLaMA 3.2-3B's shape, 12.8 GB
    python scripts/ref_llama3.py --name small_t32768 --batch_size 1 --seq_len 32768 --qk_std 0.1 \\
        --attention efficient                           # a long sequence: memory-efficient SDPA, causal, no mask
    python scripts/ref_llama3.py --name small_docs --shape small --batch_size 4 --seq_len 128 --docs  # --doc_mask 1

The batches are consecutive windows of real text, the embedded Tiny Shakespeare
(data/tiny_shakespeare_train.bin), read as the trainer's data loader reads a token file, so that
the loss moves. The small shape's vocabulary is 1000 (--vocab N: N): its ids are the text's 999
(N - 1) most frequent LLaMA-3 tokens by rank, every other token becomes 0. Weights are N(0, 0.02)
(the q and k projections N(0, --qk_std)), norm weights U(0.5, 1.5) (all 1 would hide a norm reading
another norm's weight). With --docs the rows hold documents at fixed places (DOC_ROWS: the text's own
BOS become 0, then BOS, at its id in the vocabulary, where a row's pattern puts it) and each query
attends only within its document (the trainer's --doc_mask 1), by an explicit block-diagonal causal
boolean mask that HF hands to SDPA as it is; positions stay absolute (0..T-1), as in the trainer.

Writes into OUT_DIR (made when missing, in a folder that exists), each file to a temporary name, fsynced, then
renamed:
  NAME_model.bin       the random model, seed/InfiniTrain format (q/k rows in Meta's pair order)
  NAME_model_llmc.bin  the same model, llm.c llama3 format (--llmc)
  NAME_tokens.bin      the token stream the steps consume, llm.c uint32 format
  NAME_tokens16.bin    the same stream, llm.c uint16 format (vocabularies up to 65536)
  NAME_state.bin       batches, HF's RoPE tables, step-1 logits (bf16 autocast and plain fp32),
                       every step's loss, gradients (before clipping) and parameters after AdamW,
                       AdamW's exp_avg and exp_avg_sq after the last step, and every step's gradient
                       norm and lr (layout: ref_state_read in test_llama3.cu)
"""
import math
import os

import cli

SHAPES = {  # n_layer, n_embd, n_head, n_kv_head, vocab_size, max_seq_len, ffn_dim_multiplier, multiple_of
    "small": (2, 256, 8, 2, 1000, 131072, 1.5, 256),  # head_dim 32
    "small_hd64": (2, 256, 4, 2, 1000, 131072, 1.5, 256),  # head_dim 64 (the 1B's) at the small width
    "small_hd128": (2, 512, 4, 2, 1000, 131072, 1.5, 256),  # head_dim 128 at a small width
    "1b": (16, 2048, 32, 8, 128256, 131072, 1.5, 256),  # (131072 positions, as the released models)
    "3b": (28, 3072, 24, 8, 128256, 131072, 1.0, 256),  # LLaMA 3.2-3B's shape (released tied: --tied)
    "8b": (32, 4096, 32, 8, 128256, 131072, 1.3, 1024),  # LLaMA 3.1-8B's
}
SCHEDULES = ["constant", "cosine", "linear", "wsd"]  # the trainer's --lr_schedule, in its order
FP8_GRADS = {"e5m2": "float8_e5m2", "e4m3": "float8_e4m3fn"}  # the trainer's --fp8_grads: torch's dtypes


def parse_args():
    what, examples = __doc__.split("\n\n")[:2]
    ap = cli.ArgumentParser(__file__, description=what, epilog=f"examples:\n{examples}")
    ap.add_argument("--name", required=True, help="file prefix in --out_dir")
    ap.add_argument("--shape", choices=SHAPES, default="small")
    ap.add_argument("--out_dir", default="ref", help="made when missing (default: ref)")
    ap.add_argument("--batch_size", type=int, default=4)
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--grad_accum", type=int, default=1, help="micro-steps per optimizer step")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight_decay", type=float, default=0.1)
    ap.add_argument("--lr_schedule", choices=SCHEDULES, default="constant")
    ap.add_argument("--warmup_iters", type=int, default=0)
    ap.add_argument("--final_lr_frac", type=float, default=0.0)
    ap.add_argument("--decay_frac", type=float, default=0.2)
    ap.add_argument("--grad_clip", type=float, default=0.0, help="max global gradient norm (0: no clipping)")
    ap.add_argument("--vocab", type=int, default=0,
                    help="vocabulary size (0: the shape's), a multiple of 8: the text's N - 1 most frequent tokens "
                         "and 0 for the rest (above 4096 the cross-entropy kernel's threads take more than one load)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--qk_std", type=float, default=0.02,
                    help="init std of the q and k projections: larger peaks the attention, so that a row's max "
                         "moves between key tiles (at 0.02 the scores are ~N(0, 0.1) and the softmax nearly flat)")
    ap.add_argument("--dense_embedding", action="store_true", help="plain AdamW on the embedding too")
    ap.add_argument("--tied", action="store_true", help="tied embeddings: wte is also lm_head (its AdamW dense, as "
                    "the trainer's: the head's gradient reaches every row)")
    ap.add_argument("--rope_factor", type=float, help="llama3 RoPE scaling's factor (default: the shape's, 8 for "
                    "8b, 32 for the others, and 8 with --llmc); the seed header's slot 17")
    ap.add_argument("--fp8", action="store_true", help="the block linears in FP8 through torch._scaled_mm, as the "
                    "trainer's --fp8 1 (a GPU of compute capability 8.9 or newer)")
    ap.add_argument("--fp8_grads", choices=list(FP8_GRADS), default="e5m2", help="--fp8: the output gradients' "
                    "format, as the trainer's --fp8_grads")
    ap.add_argument("--attention", choices=["sdpa", "unfused", "efficient"], default="sdpa", help="sdpa: PyTorch's "
                    "fused attention (the trainer's flash attention lands on its bf16 output); unfused: the trainer's "
                    "--flash_attention 0 arithmetic (fp32 scores, softmax rounded to bf16, P V in bf16), which "
                    "--fp8 needs: FP8 rounds the attention output, so a bf16-level difference there becomes an "
                    "e4m3 step; efficient: PyTorch's memory-efficient SDPA kernel alone, causal by is_causal, no "
                    "T x T mask in memory (long sequences)")
    ap.add_argument("--docs", action="store_true", help="documents: BOS at fixed places of each row (DOC_ROWS) "
                    "and attention masked to each document, as the trainer's --doc_mask 1 (with --attention sdpa)")
    ap.add_argument("--model_only", action="store_true", help="write only NAME_model.bin (no training)")
    ap.add_argument("--llmc", action="store_true", help="also write the model in llm.c's format (RoPE factor 8, "
                    "as llm.c reads it)")
    ap.add_argument("--device", help="torch's device (default: cuda when torch finds a GPU, else cpu)")
    args = ap.parse_args()
    if args.vocab % 8 or args.vocab < 0 or args.vocab > 128256:
        ap.error(f"--vocab {args.vocab}: a multiple of 8 up to 128256 (the trainer's kernels take V % 8 == 0)")
    if args.tied and args.llmc:
        ap.error("--tied with --llmc: llm.c's model format has no tied embeddings")
    if args.rope_factor is not None and not 1.0 <= args.rope_factor <= 1024.0:
        ap.error(f"--rope_factor {args.rope_factor}: in [1, 1024], as llama3.h's config_check takes")
    if args.fp8_grads != "e5m2" and not args.fp8:
        ap.error(f"--fp8_grads {args.fp8_grads} takes --fp8")
    if args.docs and args.attention != "sdpa":
        ap.error("--docs takes --attention sdpa (the unfused attention here has no document mask)")
    return args


if __name__ == "__main__":
    ARGS = parse_args()  # (before torch's import: --help and a bad argument on any machine)
try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
except ModuleNotFoundError as e:
    cli.missing_package(__file__, e, "requirements-gpu.txt")

import llama3_files  # noqa: E402
from safe_write import check_new_folder, make_folder, write_atomic  # noqa: E402

ROPE_FACTORS = {"8b": 8.0}  # llama3 RoPE scaling's factor: Llama-3.1's 8; the others 3.2's 32 (--rope_factor)


def rope_factor_of(shape, given=None, llmc=False):
    """The llama3 RoPE factor a model of `shape` gets: --rope_factor when given, else llm.c's 8 for a model
    written in its format too (--llmc: its header has no field, llm.c reads 8), else the shape's."""
    return given or (llama3_files.LLMC_ROPE_FACTOR if llmc else ROPE_FACTORS.get(shape, 32.0))

NORM_EPS, ROPE_THETA = 1e-5, 500000.0
TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tiny_shakespeare_train.bin")
LLAMA3_BOS = 128000  # <|begin_of_text|>
DOC_ROWS = (  # --docs: the BOS positions (those < T) of each row pattern, and what each exercises at T = 128
    (0, 1, 7, 20, 45, 64, 66, 90, 100, 127),  # short documents, of 1 token too, one from key tile 1's first key
    (0, 20),  # a document of T - 20 tokens, over two 64-key tiles
    (0,),  # one document: no BOS after position 0
    (63, 65, 127),  # no BOS at 0 (the row goes on with a document), 63..64 across a tile boundary
)
STATE_MAGIC, STATE_VERSION = 20241129, 5


def lr_at(args, t):
    """The trainer's lr_at (llama3.h) for optimizer step t = 1..args.steps, in double."""
    if t <= args.warmup_iters:
        return args.lr * t / args.warmup_iters
    if args.lr_schedule == "constant":
        return args.lr
    start = args.warmup_iters
    if args.lr_schedule == "wsd":
        start = max(start, args.steps - args.decay_frac * args.steps)
    if t <= start:
        return args.lr
    p = min(1.0, (t - start) / (args.steps - start))
    f = 0.5 * (1 + math.cos(math.pi * p)) if args.lr_schedule == "cosine" else 1 - p
    return args.lr * (args.final_lr_frac + (1 - args.final_lr_frac) * f)


def ffn_hidden(C, multiplier, multiple_of):
    hidden = int(multiplier * (2 * 4 * C // 3))
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class UnfusedAttention(torch.autograd.Function):
    """The trainer's --flash_attention 0, forward and backward (attention_forward, attention_backward), rounding where
    it rounds, so that --fp8's e4m3 quantising of the attention output and of its gradient sees its values:
    q, k and v rounded to autocast's bf16 on entry (autocast hands them over in fp32: RoPE's tables and HF's cache
    promote them; the trainer's rope kernel writes bf16; without autocast, the fp32 logits, nothing rounds),
    scores = q k^T * scaling in fp32 (bf16 products summed in fp32), the causal softmax in fp32 as
    exp(s - max) * (1 / sum) rounded to bf16, o = P v in bf16; dv = P^T dO, dP = dO v^T in fp32,
    dS = P (dP - rowsum(P dP)) rounded, dq = dS k and dk = dS^T q times scaling (after dk's sum over the G heads,
    as the GEMM's alpha), each rounded once; the gradients go back in the inputs' dtypes.
    q (B, NH, T, HD); k, v (B, KVH, T, HD), each kv head shared by G = NH / KVH query heads."""

    @staticmethod
    def forward(ctx, q, k, v, scaling):
        G, T, device = q.shape[1] // k.shape[1], q.shape[2], q.device.type
        ctx.in_dtypes = (q.dtype, k.dtype, v.dtype)
        ctx.dtype = dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else q.dtype
        with torch.autocast(device_type=device, enabled=False):
            q = q.to(dtype)
            kr, vr = k.repeat_interleave(G, dim=1).to(dtype), v.repeat_interleave(G, dim=1).to(dtype)
            scores = torch.matmul(q.float(), kr.float().transpose(2, 3)) * scaling
            causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
            e = torch.exp(scores - scores.amax(-1, keepdim=True))
            probs = (e * (1.0 / e.sum(-1, keepdim=True))).to(dtype)
            out = torch.matmul(probs, vr)
        ctx.save_for_backward(q, kr, vr, probs)
        ctx.scaling, ctx.G = scaling, G
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, kr, vr, probs = ctx.saved_tensors
        dtype, heads_of_kv = ctx.dtype, lambda x: x.unflatten(1, (-1, ctx.G)).sum(2)  # (B, NH, ..) -> (B, KVH, ..)
        with torch.autocast(device_type=q.device.type, enabled=False):
            p, do = probs.float(), d_out.to(dtype).float()
            dv = heads_of_kv(torch.matmul(p.transpose(2, 3), do)).to(dtype)
            dp = torch.matmul(do, vr.float().transpose(2, 3))
            ds = (p * (dp - (p * dp).sum(-1, keepdim=True))).to(dtype).float()
            dq = (torch.matmul(ds, kr.float()) * ctx.scaling).to(dtype)
            dk = (heads_of_kv(torch.matmul(ds.transpose(2, 3), q.float())) * ctx.scaling).to(dtype)
        q_dtype, k_dtype, v_dtype = ctx.in_dtypes
        return dq.to(q_dtype), dk.to(k_dtype), dv.to(v_dtype), None


def unfused_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """HF's attention interface for UnfusedAttention (causal, no padding: the mask is its own): q (B, NH, T, HD),
    k and v (B, KVH, T, HD); returns o as (B, T, NH, HD)."""
    return UnfusedAttention.apply(query, key, value, scaling).transpose(1, 2).contiguous(), None


def efficient_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """--attention efficient: PyTorch's memory-efficient SDPA kernel and no other, causal by is_causal=True: HF makes
    no mask for an attention it has no mask function of (attention_mask None), so nothing of T x T is in memory at
    any T. q (B, NH, T, HD); k and v (B, KVH, T, HD), repeated for their G query heads; returns o as (B, T, NH, HD)."""
    G = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(G, dim=1), value.repeat_interleave(G, dim=1)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("llama3cu_unfused", unfused_attention)
AttentionInterface.register("llama3cu_efficient", efficient_attention)
# --attention: HF's attn_implementation
ATTENTION = {"sdpa": "sdpa", "unfused": "llama3cu_unfused", "efficient": "llama3cu_efficient"}


def make_model(shape, device, seed, qk_std=0.02, vocab=0, tied=False, rope_factor=None, attention="sdpa"):
    L, C, NH, KVH, V, max_T, multiplier, multiple_of = SHAPES[shape]
    rope_factor = rope_factor_of(shape, rope_factor)
    V = vocab or V
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=ffn_hidden(C, multiplier, multiple_of),
                      num_hidden_layers=L, ffn_dim_multiplier=multiplier, multiple_of=multiple_of,
                      num_attention_heads=NH, num_key_value_heads=KVH, max_position_embeddings=max_T,
                      rms_norm_eps=NORM_EPS, tie_word_embeddings=tied, attn_implementation=ATTENTION[attention],
                      rope_parameters={"rope_type": "llama3", "rope_theta": ROPE_THETA, "factor": rope_factor,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192})
    with torch.device(device):
        model = LlamaForCausalLM(cfg).float()
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5, generator=gen)
            else:
                p.normal_(0.0, qk_std if name.endswith(("q_proj.weight", "k_proj.weight")) else 0.02, generator=gen)
    return model, cfg


FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def to_fp8(t, dtype):
    """t (bf16) in FP8 with one dynamic scale (the trainer's kernels.cuh fp8_scale: FP8_MAX / max(amax, 1e-12) in
    fp32; x * scale rounded to nearest even, saturated), and the inverse scale the GEMM multiplies by."""
    scale = FP8_MAX[dtype] / torch.clamp(t.abs().max().float(), min=1e-12)
    q = (t.float() * scale).clamp(-FP8_MAX[dtype], FP8_MAX[dtype]).to(dtype)
    return q, scale.reciprocal()


class Fp8Linear(torch.autograd.Function):
    """y = x w^T as the trainer's --fp8 1 computes it, through torch._scaled_mm: x and w in e4m3, the output
    gradient in grad_dtype (--fp8_grads), one dynamic scale per tensor, fp32 accumulation, bf16 out; the weight
    gradient bf16."""

    @staticmethod
    def forward(ctx, x, w, grad_dtype):
        ctx.dtypes, ctx.grad_dtype = (x.dtype, w.dtype), grad_dtype
        x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        x8, sx = to_fp8(x2, torch.float8_e4m3fn)
        w8, sw = to_fp8(w.to(torch.bfloat16), torch.float8_e4m3fn)
        ctx.save_for_backward(x8, sx, w8, sw)
        y = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x8, sx, w8, sw = ctx.saved_tensors
        dy8, sdy = to_fp8(dy.reshape(-1, dy.shape[-1]).to(torch.bfloat16), ctx.grad_dtype)
        col = lambda t: t.t().contiguous().t()  # _scaled_mm's second operand column-major
        dx = torch._scaled_mm(dy8, col(w8), scale_a=sdy, scale_b=sw, out_dtype=torch.bfloat16)
        dw = torch._scaled_mm(dy8.t().contiguous(), col(x8), scale_a=sdy, scale_b=sx, out_dtype=torch.bfloat16)
        return dx.reshape(*dy.shape[:-1], x8.shape[1]).to(ctx.dtypes[0]), dw.to(ctx.dtypes[1]), None


def fp8_fused(linears, grad_dtype):
    """The linears that read one input (q, k, v; gate, up) as the trainer's one fused weight: the first one's
    forward runs one Fp8Linear on their weights concatenated (one scale for the fused weight and one for the fused
    output gradient, in grad_dtype, as the trainer's qkv and gate_up tensors have), the others return their slice
    of it. HF calls them in this order on the same input."""
    held = {}

    def part(i):
        def forward(x):
            if i == 0:
                y = Fp8Linear.apply(x, torch.cat([lin.weight for lin in linears]), grad_dtype)
                held["out"], held["x"] = y.split([lin.out_features for lin in linears], dim=-1), x
            assert held["x"] is x, "fp8_fused: the fused linears must read the same input, first one first"
            return held["out"][i]
        return forward
    for i, lin in enumerate(linears):
        lin.forward = part(i)


def use_fp8(model, grads="e5m2"):
    """--fp8: every block linear through Fp8Linear (lm_head and attention stay bf16), as the trainer's --fp8 1, the
    output gradients in `grads` (--fp8_grads)."""
    for layer in model.model.layers:
        a, mlp = layer.self_attn, layer.mlp
        for group in ([a.q_proj, a.k_proj, a.v_proj], [a.o_proj], [mlp.gate_proj, mlp.up_proj], [mlp.down_proj]):
            fp8_fused(group, getattr(torch, FP8_GRADS[grads]))


def to_meta_rows(w, n_heads):
    """HF rotates halves (i, i+D/2) of each head; the seed/Meta files rotate pairs (2i, 2i+1)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, -1).transpose(1, 2).reshape(w.shape)


def layer_tensors(model, cfg, get):
    """Per-layer tensors by name, q/k rows in Meta order, of get(param) (weights or gradients)."""
    out = {k: [] for k in ("attn_norm", "qkv", "attn_out", "ffn_norm", "gate", "up", "down")}
    for l in model.model.layers:
        a, m = l.self_attn, l.mlp
        out["attn_norm"].append(get(l.input_layernorm.weight))
        out["qkv"].append(torch.cat([to_meta_rows(get(a.q_proj.weight), cfg.num_attention_heads),
                                     to_meta_rows(get(a.k_proj.weight), cfg.num_key_value_heads),
                                     get(a.v_proj.weight)]))
        out["attn_out"].append(get(a.o_proj.weight))
        out["ffn_norm"].append(get(l.post_attention_layernorm.weight))
        out["gate"].append(get(m.gate_proj.weight))
        out["up"].append(get(m.up_proj.weight))
        out["down"].append(get(m.down_proj.weight))
    return out


def flat(tensors):
    return np.concatenate([t.detach().float().cpu().reshape(-1).numpy() for t in tensors])


def seed_order(model, cfg, get):
    """The tensors of the seed model file, in its order: wte, attn_norm, qkv, attn_out, ffn_norm, gate, up,
    down (each of all layers), final_norm, lm_head (none when tied: wte is the head's weight)."""
    t = layer_tensors(model, cfg, get)
    head = [] if cfg.tie_word_embeddings else [get(model.lm_head.weight)]
    return flat([get(model.model.embed_tokens.weight), *t["attn_norm"], *t["qkv"], *t["attn_out"], *t["ffn_norm"],
                 *t["gate"], *t["up"], *t["down"], get(model.model.norm.weight), *head])


def llmc_order(model, cfg):
    """llm.c's llama3 file: wte, lm_head, then each weight of all layers followed by its zero bias; fc packs
    each layer's gate rows then up rows."""
    t = layer_tensors(model, cfg, lambda p: p)
    L, C, F_ = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size
    qkv_rows = t["qkv"][0].shape[0]
    zeros = lambda n: torch.zeros(n)
    fc = [torch.cat([g, u]) for g, u in zip(t["gate"], t["up"])]
    return flat([model.model.embed_tokens.weight, model.lm_head.weight, *t["attn_norm"], zeros(L * C), *t["qkv"],
                 zeros(L * qkv_rows), *t["attn_out"], zeros(L * C), *t["ffn_norm"], zeros(L * C), *fc,
                 zeros(L * 2 * F_), *t["down"], zeros(L * C), model.model.norm.weight, zeros(C)])


def seed_header(cfg):
    """The seed header of the HF config, written by llama3_files (the one writer of that format in scripts/)."""
    return llama3_files.seed_header(llama3_files.Config(
        cfg.max_position_embeddings, cfg.vocab_size, cfg.num_hidden_layers, cfg.num_attention_heads,
        cfg.num_key_value_heads, cfg.hidden_size, cfg.ffn_dim_multiplier, cfg.multiple_of, NORM_EPS, ROPE_THETA, 1,
        int(cfg.tie_word_embeddings), cfg.rope_parameters["factor"]))


def llmc_header(cfg):
    ints = np.zeros(512, dtype=np.int32)
    ints[:10] = [20240803, 3, cfg.max_position_embeddings, cfg.vocab_size, cfg.num_hidden_layers,
                 cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size, cfg.multiple_of, 1]
    ints[256:259] = np.array([cfg.ffn_dim_multiplier, NORM_EPS, ROPE_THETA], dtype=np.float32).view(np.int32)
    return ints


def token_file(tokens, uint16):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, len(tokens)] if uint16 else [20240801, 7, len(tokens)]
    return [header, tokens.astype(np.uint16 if uint16 else np.uint32)]


def text_tokens(V, count):
    """The first `count` tokens of the embedded text and BOS's id; for V < the LLaMA-3 vocab, ids by frequency
    rank (BOS 0 if it is not among the V - 1 most frequent)."""
    tokens = np.fromfile(TEXT, dtype=np.uint32, offset=1024).astype(np.int64)
    if count > len(tokens):
        raise SystemExit(f"{TEXT}: {len(tokens)} tokens, {count} needed")
    bos = LLAMA3_BOS
    if V < 128256:
        ids, counts = np.unique(tokens, return_counts=True)
        by_rank = ids[np.argsort(-counts, kind="stable")][: V - 1]
        remap = np.zeros(int(tokens.max()) + 1, dtype=np.int64)
        remap[by_rank] = np.arange(1, len(by_rank) + 1)
        tokens, bos = remap[tokens], int(remap[LLAMA3_BOS])
    return tokens[:count], bos


def place_documents(tokens, bos, B, T):
    """--docs: the stream with its own BOS made 0 and BOS where DOC_ROWS puts them: the stream's row r (of T
    tokens; micro-batch r // B, its row r % B) takes pattern (r % B + r // B) % 4, so that each micro-batch
    lays the patterns out on other rows."""
    out = np.where(tokens == bos, 0, tokens)
    for r in range((len(tokens) - 1) // T):
        out[[r * T + t for t in DOC_ROWS[(r % B + r // B) % len(DOC_ROWS)] if t < T]] = bos
    return out


def doc_mask(ids, bos):
    """--docs' attention mask of ids (B, T): (B, 1, T, T) booleans, True where query t sees key u, that is
    start[t] <= u <= t with start[t] the last BOS at or before t (0 if none), as the trainer's --doc_mask 1.
    HF hands a 4D mask to SDPA as it is. None without --docs (bos None): HF's own causal attention."""
    if bos is None:
        return None
    pos = torch.arange(ids.shape[1], device=ids.device)
    start = torch.where(ids == bos, pos, 0).cummax(dim=1).values
    return ((pos <= pos[:, None]) & (pos >= start[:, :, None]))[:, None]


def rope_tables(cfg, T):
    """HF's llama3 inverse frequencies and its cos/sin for positions 0..T-1 (first HD/2 columns), on the CPU."""
    rope = LlamaRotaryEmbedding(cfg)  # built outside make_model's device: on the CPU
    x = torch.zeros(1, 1, T, cfg.hidden_size // cfg.num_attention_heads)
    cos, sin = rope(x, torch.arange(T)[None])
    half = x.shape[-1] // 2
    return [np.ascontiguousarray(t) for t in (rope.inv_freq.float().numpy(), cos[0, :, :half], sin[0, :, :half])]


@torch.no_grad()
def lazy_adamw_(p, m, v, rows, step, lr, beta1, beta2, eps, wd):
    """torch.optim.AdamW's update on the given rows only; other rows keep p, m and v (lazy Adam)."""
    g = p.grad[rows]
    m_r = beta1 * m[rows] + (1 - beta1) * g
    v_r = beta2 * v[rows] + (1 - beta2) * g * g
    p_r = p[rows] - lr * wd * p[rows]
    denom = v_r.sqrt() / math.sqrt(1 - beta2 ** step) + eps
    p[rows] = p_r - (lr / (1 - beta1 ** step)) * m_r / denom
    m[rows], v[rows] = m_r, v_r


def adam_moments(model, cfg, opt, lazy):
    """AdamW's exp_avg, then exp_avg_sq, in seed order as they are when read: torch's state, and the lazy update's
    own for the embedding (lazy None: the embedding is in torch's). Untouched embedding rows are 0."""
    emb = model.model.embed_tokens.weight
    state = lambda p: lazy if lazy is not None and p is emb else opt.state[p]
    for key in ("exp_avg", "exp_avg_sq"):
        yield seed_order(model, cfg, lambda p: state(p)[key])


def train(model, cfg, args, x, y, dev):
    """Yields each step's loss, its first micro-batch's logits, its gradients (before clipping), its parameters
    after AdamW (seed order), its gradient norm (0 without --grad_clip), its lr, and adam_moments' generator
    (evaluated when read: main reads the last step's after the last step)."""
    emb = model.model.embed_tokens.weight
    dense = [p for p in model.parameters() if p is not emb or args.dense_embedding]
    groups = [{"params": [p for p in dense if p.dim() > 1], "weight_decay": args.weight_decay},
              {"params": [p for p in dense if p.dim() == 1], "weight_decay": 0.0}]  # norm weights: no decay
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                            fused=dev.startswith("cuda"))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(args, s + 1) / args.lr)  # s: updates so far
    lazy = None if args.dense_embedding else {"exp_avg": torch.zeros_like(emb), "exp_avg_sq": torch.zeros_like(emb)}
    for step in range(1, args.steps + 1):
        model.zero_grad(set_to_none=True)
        losses = []
        for micro in range(args.grad_accum):
            ids = x[step - 1, micro].to(dev)
            with torch.autocast(device_type=dev.split(":")[0], dtype=torch.bfloat16):
                logits = model(input_ids=ids, attention_mask=doc_mask(ids, args.bos)).logits
            loss = F.cross_entropy(logits.float().view(-1, cfg.vocab_size), y[step - 1, micro].to(dev).view(-1))
            (loss / args.grad_accum).backward()  # the step's loss is the mean over all its micro-batches
            losses.append(loss.item())
            if micro == 0:
                first_logits = logits.detach()
        grads = seed_order(model, cfg, lambda p: p.grad)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip).item() if args.grad_clip else 0.0
        lr = sched.get_last_lr()[0]
        opt.step()
        if lazy is not None:
            lazy_adamw_(emb, lazy["exp_avg"], lazy["exp_avg_sq"], torch.unique(x[step - 1].to(dev)), step, lr,
                        args.beta1, args.beta2, args.eps, args.weight_decay)
        sched.step()
        print(f"step {step}: loss {np.mean(losses):.6f} lr {lr:.6g} grad norm {norm:.6f}")
        yield (np.mean(losses), first_logits, grads, seed_order(model, cfg, lambda p: p), norm, lr,
               adam_moments(model, cfg, opt, lazy))


def main(args):
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.llmc and rope_factor_of(args.shape, args.rope_factor, True) != llama3_files.LLMC_ROPE_FACTOR:
        cli.argument_error(__file__, f"--llmc with --rope_factor {args.rope_factor}: llm.c's header has no field "
                           f"for it, and llm.c (and this trainer) read its files as {llama3_files.LLMC_ROPE_FACTOR:g}")
    if args.fp8 and not args.device.startswith("cuda"):
        cli.argument_error(__file__, "--fp8 needs a CUDA device (torch._scaled_mm)")
    args.rope_factor = rope_factor_of(args.shape, args.rope_factor, args.llmc)
    args.dense_embedding |= args.tied
    check_new_folder(args.out_dir, "--out_dir")
    dev, B, T, A, n = args.device, args.batch_size, args.seq_len, args.grad_accum, args.steps
    model, cfg = make_model(args.shape, dev, args.seed, args.qk_std, args.vocab, args.tied, args.rope_factor,
                            args.attention)
    out = lambda suffix: os.path.join(args.out_dir, f"{args.name}_{suffix}")
    make_folder(args.out_dir, "--out_dir")
    inputs = [TEXT]

    tokens, bos = text_tokens(cfg.vocab_size, n * A * B * T + 1)  # the loader's x, y windows, pos += B*T
    args.bos = None
    if args.docs:
        if bos == 0:
            cli.argument_error(__file__, f"--docs: BOS is not among the text's {cfg.vocab_size - 1} most frequent "
                               "tokens, so the vocabulary has no id for it")
        tokens, args.bos = place_documents(tokens, bos, B, T), bos
    x = torch.from_numpy(tokens[:-1].reshape(n, A, B, T))
    y = torch.from_numpy(tokens[1:].reshape(n, A, B, T))
    write_atomic(out("model.bin"), [seed_header(cfg), seed_order(model, cfg, lambda p: p)], inputs)
    if args.model_only:
        print(f"wrote {out('model.bin')}")
        return
    if args.llmc:
        write_atomic(out("model_llmc.bin"), [llmc_header(cfg), llmc_order(model, cfg)], inputs)
    write_atomic(out("tokens.bin"), token_file(tokens, False), inputs)
    if cfg.vocab_size <= 65536:
        write_atomic(out("tokens16.bin"), token_file(tokens, True), inputs)

    with torch.no_grad():  # context for the bf16 errors: the same model's logits in plain fp32
        ids = x[0, 0].to(dev)
        logits_fp32 = model(input_ids=ids, attention_mask=doc_mask(ids, args.bos)).logits.float().cpu().numpy()
    if args.fp8:
        use_fp8(model, args.fp8_grads)
    header = np.zeros(256, dtype=np.int32)
    header[:8] = [STATE_MAGIC, STATE_VERSION, B, T, n, cfg.vocab_size, 0 if args.dense_embedding else 1, A]
    header[8:12] = [SCHEDULES.index(args.lr_schedule), args.warmup_iters, int(args.docs), args.bos or 0]
    header[16:24] = np.array([args.lr, args.beta1, args.beta2, args.eps, args.weight_decay, args.grad_clip,
                              args.final_lr_frac, args.decay_frac], np.float32).view(np.int32)

    def state():  # streamed: the 1B's per-step blocks are 6 GB each; each array contiguous for write()
        losses, norms, lrs = [], [], []
        for step, (loss, logits, grads, params, norm, lr, moments) in enumerate(train(model, cfg, args, x, y, dev), 1):
            if step == 1:
                yield from [header, x.numpy().astype(np.int32), y.numpy().astype(np.int32), *rope_tables(cfg, T),
                            logits.float().cpu().numpy(), logits_fp32]
            losses.append(loss), norms.append(norm), lrs.append(lr)
            yield from [grads, params]
        yield from moments  # the last step's: exp_avg and exp_avg_sq after it
        yield from [np.array(v, dtype=np.float32) for v in (losses, norms, lrs)]
    write_atomic(out("state.bin"), state(), inputs)
    print(f"wrote {out('*')} ({n} steps of {A} x {B} x {T} tokens)")


if __name__ == "__main__":
    main(ARGS)
