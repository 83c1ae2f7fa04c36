"""PyTorch reference for test_llama3: HF transformers' LlamaForCausalLM (rope_type llama3, untied)
trained with fp32 master weights under torch.autocast(bfloat16), AdamW on every dense parameter and
the same AdamW restricted to the touched rows ("lazy", as SparseAdam) on the token embedding.

    python scripts/ref_llama3.py --shape small   # 2 layers, seconds
    python scripts/ref_llama3.py --shape 1b      # LLaMA3.2-1B shape, ~24 GB of files
    python scripts/ref_llama3.py --shape small --dense_embedding   # plain AdamW on the embedding too

Writes OUT_DIR/{shape}_model.bin (the random model, seed/InfiniTrain format) and
OUT_DIR/{shape}_state.bin (batches, step-1 logits in bf16 autocast and in fp32, losses, step-1 gradients, parameters after one
step and after --steps steps). The state layout is documented in test_llama3.cu (ref_state_read).
"""
import argparse
import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {  # n_layer, n_embd, n_head, n_kv_head, vocab_size, max_seq_len
    "small": (2, 256, 8, 2, 1000, 8192),
    "1b": (16, 2048, 32, 8, 128256, 8192),
}
FFN_MULTIPLIER, MULTIPLE_OF, NORM_EPS, ROPE_THETA = 1.5, 256, 1e-5, 500000.0


def ffn_hidden(C):
    hidden = int(FFN_MULTIPLIER * (2 * 4 * C // 3))
    return MULTIPLE_OF * ((hidden + MULTIPLE_OF - 1) // MULTIPLE_OF)


def make_model(shape, device, seed):
    L, C, NH, KVH, V, max_T = SHAPES[shape]
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=ffn_hidden(C), num_hidden_layers=L,
                      num_attention_heads=NH, num_key_value_heads=KVH, max_position_embeddings=max_T,
                      rms_norm_eps=NORM_EPS, tie_word_embeddings=False, attn_implementation="sdpa",
                      rope_parameters={"rope_type": "llama3", "rope_theta": ROPE_THETA, "factor": 32.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192})
    with torch.device(device):
        model = LlamaForCausalLM(cfg).float()
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():  # the trainer's random init: N(0, 0.02) matrices, norm weights 1
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=gen) if p.dim() == 2 else p.fill_(1.0)
    return model, cfg


def to_meta_rows(w, n_heads):
    """HF rotates halves (i, i+D/2) of each head; the seed/Meta files rotate pairs (2i, 2i+1)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, -1).transpose(1, 2).reshape(w.shape)


def seed_order(model, cfg, get):
    """The tensors of the seed model file, in its order, of get(param) (weights or gradients)."""
    m, layers = model.model, model.model.layers
    out = [get(m.embed_tokens.weight)]
    out += [get(l.input_layernorm.weight) for l in layers]
    out += [torch.cat([to_meta_rows(get(l.self_attn.q_proj.weight), cfg.num_attention_heads),
                       to_meta_rows(get(l.self_attn.k_proj.weight), cfg.num_key_value_heads),
                       get(l.self_attn.v_proj.weight)]) for l in layers]
    out += [get(l.self_attn.o_proj.weight) for l in layers]
    out += [get(l.post_attention_layernorm.weight) for l in layers]
    out += [get(l.mlp.gate_proj.weight) for l in layers]
    out += [get(l.mlp.up_proj.weight) for l in layers]
    out += [get(l.mlp.down_proj.weight) for l in layers]
    out += [get(m.norm.weight), get(model.lm_head.weight)]
    return np.concatenate([t.detach().float().cpu().reshape(-1).numpy() for t in out])


def model_header(cfg):
    ints = np.zeros(256, dtype=np.int32)
    ints[:8] = [20240803, 3, cfg.max_position_embeddings, cfg.vocab_size, cfg.num_hidden_layers,
                cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size]
    ints[8:12] = np.array([FFN_MULTIPLIER, 0, NORM_EPS, ROPE_THETA], dtype=np.float32).view(np.int32)
    ints[9] = MULTIPLE_OF
    ints[12:16] = [1, 4, 3, 2]  # use_scaled_rope, max_gen_batch_size, version major, minor
    return ints


def batches(shape, V, B, T, steps, gen):
    """1b: consecutive windows of real text (repeated tokens exercise the sparse rows); small: random ids."""
    path = os.path.join(os.path.dirname(__file__), "..", "data", "tiny_shakespeare_val.bin")
    if shape == "1b" and os.path.exists(path):
        tokens = torch.from_numpy(np.fromfile(path, dtype=np.uint32, offset=1024).astype(np.int64))
    else:
        tokens = torch.randint(0, V, (steps * B * T + 1,), generator=gen)
    x = torch.stack([tokens[s * B * T: (s + 1) * B * T] for s in range(steps)]).view(steps, B, T)
    y = torch.stack([tokens[s * B * T + 1: (s + 1) * B * T + 1] for s in range(steps)]).view(steps, B, T)
    return x, y


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=SHAPES, default="small")
    ap.add_argument("--out_dir", default="ref")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch_size", type=int, default=4)
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight_decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--dense_embedding", action="store_true", help="dense AdamW on the embedding (state file *_dense_state.bin)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev, B, T = args.device, args.batch_size, args.seq_len
    model, cfg = make_model(args.shape, dev, args.seed)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, f"{args.shape}_model.bin"), "wb") as f:
        f.write(model_header(cfg).tobytes())
        f.write(seed_order(model, cfg, lambda p: p).tobytes())

    emb = model.model.embed_tokens.weight
    dense = [p for p in model.parameters() if p is not emb or args.dense_embedding]
    opt = torch.optim.AdamW(dense, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                            weight_decay=args.weight_decay, fused=dev.startswith("cuda"))
    emb_m, emb_v = torch.zeros_like(emb), torch.zeros_like(emb)
    x, y = batches(args.shape, cfg.vocab_size, B, T, args.steps, torch.Generator().manual_seed(args.seed))
    with torch.no_grad():  # context for the bf16 errors: the same model's logits in plain fp32
        logits_fp32 = model(input_ids=x[0].to(dev)).logits.float().cpu().numpy()
    losses = []
    for step in range(1, args.steps + 1):
        inputs, targets = x[step - 1].to(dev), y[step - 1].to(dev)
        with torch.autocast(device_type=dev.split(":")[0], dtype=torch.bfloat16):
            logits = model(input_ids=inputs).logits
        loss = F.cross_entropy(logits.float().view(-1, cfg.vocab_size), targets.view(-1))
        model.zero_grad(set_to_none=True)
        loss.backward()
        losses.append(loss.item())
        if step == 1:
            logits1 = logits.detach().float().cpu().numpy()
            grads1 = seed_order(model, cfg, lambda p: p.grad)
        opt.step()
        if not args.dense_embedding:
            lazy_adamw_(emb, emb_m, emb_v, torch.unique(inputs), step, args.lr, args.beta1, args.beta2, args.eps,
                        args.weight_decay)
        if step == 1:
            params1 = seed_order(model, cfg, lambda p: p)
        print(f"step {step}: loss {losses[-1]:.6f}")

    header = np.zeros(256, dtype=np.int32)
    header[:7] = [20241129, 2, B, T, args.steps, cfg.vocab_size, 0 if args.dense_embedding else 1]
    header[16:21] = np.array([args.lr, args.beta1, args.beta2, args.eps, args.weight_decay], np.float32).view(np.int32)
    state_path = os.path.join(args.out_dir, f"{args.shape}{'_dense' if args.dense_embedding else ''}_state.bin")
    with open(state_path, "wb") as f:
        for arr in (header, x.numpy().astype(np.int32), y.numpy().astype(np.int32), logits1, logits_fp32,
                    np.array(losses, dtype=np.float32), grads1, params1, seed_order(model, cfg, lambda p: p)):
            f.write(np.ascontiguousarray(arr).tobytes())
    print(f"wrote {args.out_dir}/{args.shape}_model.bin and {state_path}")


if __name__ == "__main__":
    main()
