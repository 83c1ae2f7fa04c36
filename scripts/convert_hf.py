#!/usr/bin/env python3
"""Hugging Face LLaMA 3.x weights -> the trainer's model file (seed format, fp32); numpy, no torch, no GPU.

    python3 scripts/convert_hf.py HF_DIR OUT.bin
    ./train_llama3 --llmc_filepath OUT.bin ...

HF_DIR holds config.json and model.safetensors, or model.safetensors.index.json and its shards (tensors
in fp32, fp16 or bf16; bf16 is widened exactly). The config must be one the trainer runs: a
LlamaForCausalLM with llama3 RoPE scaling of the constants llama3.h hardcodes (low_freq_factor 1,
high_freq_factor 4, original context 8192; the factor, 32 in 3.2 and 8 in 3.1, goes to the header's slot 17)
or none, no biases, SiLU, head_dim = hidden_size / num_attention_heads in {32, 64, 128}, and an
intermediate_size that llama3.h's
formula gives (see ffn_params). Anything else is refused in one line. Tied embeddings (tie_word_embeddings,
as Llama-3.2-1B/3B ship) stay tied: the file's header says so and it has no lm_head tensor; q and k rows go
from HF's half-rotation order to Meta's adjacent pairs.
The output is written to a temporary name, fsynced and renamed; it may not be one of the inputs, and
its folder must exist. Before a tensor is read, OUT.bin is checked as the trainer checks its outputs
(its folder a folder this user may write in, a file system that is not read-only and has room for the
file); a write that fails stops with one line naming OUT.bin.
"""
import math
import os
import sys

import cli


def parse_args():
    ap = cli.ArgumentParser(__file__, description=__doc__.split("\n\n")[0],
                            epilog="example: python3 scripts/convert_hf.py Llama-3.2-1B llama3.2_1b.bin")
    ap.add_argument("hf_dir", metavar="HF_DIR",
                    help="folder of config.json and model.safetensors (or an index and shards)")
    ap.add_argument("out", metavar="OUT", help="the model file to write (seed format, fp32); its folder must exist")
    return ap.parse_args()


if __name__ == "__main__":
    ARGS = parse_args()  # (before numpy's import: --help and a bad argument on any machine)
try:
    import numpy as np
except ModuleNotFoundError as e:
    cli.missing_package(__file__, e)

from llama3_files import (LLAMA3_2_ROPE_FACTOR, LLAMA3_ROPE, SEED_HEADER_BYTES, Config, config_problem, ffn_hidden_dim,
                          kernel_problem, read_f32, read_json, safetensors_index, seed_header, seed_layout, to_meta_rows)
from safe_write import check_output, write_atomic

# LLaMA 3.x's own (ffn_dim_multiplier, multiple_of): 3.2-1B, 3.2-3B, 3.1-8B, 3.1-70B, 3.1-405B.
LLAMA3_FFN = ((1.5, 256), (1.0, 256), (1.3, 1024), (1.3, 4096), (1.2, 4096))


def fail(path, what):
    sys.exit(f"error: {path}: {what}")


def named_list(names):
    return ", ".join(names[:4]) + (f" ... ({len(names)} in all)" if len(names) > 4 else "")


# ---- the config ----

def config_file(hf_dir):
    """HF_DIR/config.json, once HF_DIR is a folder: one that does not exist, or a file, is named as that (not
    as a folder without config.json)."""
    what = "HF_DIR: a Hugging Face model's folder, with config.json and model.safetensors"
    if not os.path.isdir(hf_dir):
        fail(hf_dir, f"{'not a folder' if os.path.exists(hf_dir) else 'no such folder'} ({what})")
    config_path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(config_path):
        fail(hf_dir, f"no config.json ({what})")
    return config_path


def ffn_params(n_embd, intermediate_size, cfg, path):
    """(ffn_dim_multiplier, multiple_of) that llama3.h's ffn_hidden_dim turns into intermediate_size: the
    pair config.json names (export_hf.py writes it), else the first of LLaMA 3.x's own pairs that fits
    (1.5, 256 for the 3.2-1B), else the largest power-of-two multiple_of up to 256 that divides
    intermediate_size, with the multiplier of fewest decimals that lands on it."""
    if "ffn_dim_multiplier" in cfg or "multiple_of" in cfg:
        mult, multiple_of = cfg.get("ffn_dim_multiplier"), cfg.get("multiple_of")
        if not (isinstance(multiple_of, int) and multiple_of >= 1 and isinstance(mult, (int, float))
                and ffn_hidden_dim(n_embd, mult, multiple_of) == intermediate_size):
            fail(path, f"ffn_dim_multiplier {mult} and multiple_of {multiple_of} do not give "
                       f"intermediate_size {intermediate_size} by llama3.h's formula")
        return float(mult), multiple_of
    for mult, multiple_of in LLAMA3_FFN:
        if ffn_hidden_dim(n_embd, mult, multiple_of) == intermediate_size:
            return mult, multiple_of
    base = 2 * (4 * n_embd) // 3
    multiple_of = 256
    while intermediate_size % multiple_of:
        multiple_of //= 2
    for decimals in range(1, 8):
        step = 10.0 ** -decimals
        lo, hi = (intermediate_size - multiple_of) / base, (intermediate_size + 1) / base
        for k in range(math.floor(lo / step), math.ceil(hi / step) + 1):
            mult = round(k * step, decimals)
            if 1e-2 <= mult <= 64 and ffn_hidden_dim(n_embd, mult, multiple_of) == intermediate_size:
                return mult, multiple_of
    fail(path, f"intermediate_size {intermediate_size} with hidden_size {n_embd}: no ffn_dim_multiplier "
               f"in [0.01, 64] gives it by llama3.h's formula")


def rope_params(cfg, path):
    """(use_scaled_rope, rope_theta, rope_factor): transformers 5's rope_parameters, or 4's rope_scaling +
    rope_theta."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if rope_type == "default":
        return 0, theta, LLAMA3_2_ROPE_FACTOR
    if rope_type != "llama3":
        fail(path, f"rope_type {rope_type!r}: the trainer runs llama3 RoPE scaling or none")
    for key, want in LLAMA3_ROPE.items():
        if rope.get(key) != want:
            fail(path, f"llama3 rope {key} {rope.get(key)}: the trainer hardcodes {want:g} "
                       f"(llama3.h rope_inv_freq)")
    factor = rope.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool):
        fail(path, f"llama3 rope factor {factor!r}: not a number")
    return 1, theta, float(factor)


def check_architecture(cfg, path):
    architectures = cfg.get("architectures", ["LlamaForCausalLM"])
    if cfg.get("model_type") != "llama" or architectures != ["LlamaForCausalLM"]:
        fail(path, f"model_type {cfg.get('model_type')!r}, architectures {architectures}: "
                   f"not a LlamaForCausalLM")
    for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if cfg.get(key, want) != want:
            fail(path, f"{key} {cfg[key]!r}: the trainer's LLaMA has {key} {want!r}")
    need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "rms_norm_eps")
    missing = [k for k in need if not isinstance(cfg.get(k), (int, float)) or isinstance(cfg.get(k), bool)]
    if missing:
        fail(path, f"missing or not a number: {', '.join(missing)}")


def config_of(cfg, path, tied):
    """The trainer's config for an HF config.json (tied: its embeddings), or exits naming what the trainer does
    not run."""
    check_architecture(cfg, path)
    C, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
    if cfg.get("head_dim") not in (None, C // n_head) or C % n_head:
        fail(path, f"head_dim {cfg.get('head_dim')}: the trainer's is hidden_size {C} / "
                   f"num_attention_heads {n_head}")
    use_scaled_rope, theta, rope_factor = rope_params(cfg, path)
    mult, multiple_of = ffn_params(C, cfg["intermediate_size"], cfg, path)
    c = Config(cfg["max_position_embeddings"], cfg["vocab_size"], cfg["num_hidden_layers"], n_head,
               cfg.get("num_key_value_heads") or n_head, C, mult, multiple_of, cfg["rms_norm_eps"], theta,
               use_scaled_rope, int(tied), rope_factor)
    problem = config_problem(c, path) or kernel_problem(c, path)
    if problem:
        sys.exit(f"error: {problem}")
    return c


# ---- the tensors ----

def safetensors_files(hf_dir):
    """The safetensors files of HF_DIR: model.safetensors, or the index and the shards it names."""
    single = os.path.join(hf_dir, "model.safetensors")
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.isfile(single):
        return [single]
    if not os.path.isfile(index):
        fail(hf_dir, "no model.safetensors and no model.safetensors.index.json")
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        fail(index, "no weight_map")
    shards = [os.path.join(hf_dir, s) for s in sorted(set(weight_map.values()))]
    for shard in shards:
        if not os.path.isfile(shard):
            fail(shard, f"missing: a shard {index} names")
    return [index] + shards


def tensor_index(files):
    """name -> StTensor over every shard; a tensor in two shards, or not where the index says, is refused."""
    out, index = {}, None
    if files[0].endswith(".json"):
        index = read_json(files[0])["weight_map"]
        files = files[1:]
    for path in files:
        for name, t in safetensors_index(path).items():
            if name in out:
                fail(path, f"tensor {name} is also in {out[name].path}")
            if index is not None and os.path.basename(path) != index.get(name):
                fail(path, f"holds {name}, which the index places in {index.get(name)}")
            out[name] = t
    return out


def expected_shapes(c, tied):
    """HF tensor name -> shape, for the config."""
    C, F, KV = c.n_embd, c.ffn_hidden, c.n_kv_head * c.head_dim
    per_layer = {"input_layernorm": (C,), "self_attn.q_proj": (C, C), "self_attn.k_proj": (KV, C),
                 "self_attn.v_proj": (KV, C), "self_attn.o_proj": (C, C), "post_attention_layernorm": (C,),
                 "mlp.gate_proj": (F, C), "mlp.up_proj": (F, C), "mlp.down_proj": (C, F)}
    shapes = {"model.embed_tokens.weight": (c.vocab_size, C), "model.norm.weight": (C,)}
    if not tied:
        shapes["lm_head.weight"] = (c.vocab_size, C)
    for l in range(c.n_layer):
        shapes.update({f"model.layers.{l}.{n}.weight": s for n, s in per_layer.items()})
    return shapes


def check_tensors(tensors, c, tied, hf_dir):
    """Every expected tensor present, in a dtype read, with its shape; no bias, nothing unexpected."""
    want = expected_shapes(c, tied)
    extra = sorted(set(tensors) - set(want) - ({"lm_head.weight"} if tied else set()))
    biases = [n for n in extra if n.endswith(".bias")]
    if biases:
        fail(hf_dir, f"bias tensors {named_list(biases)}: the trainer's LLaMA has no biases")
    if extra:
        fail(hf_dir, f"unexpected tensors {named_list(extra)}")
    missing = [n for n in want if n not in tensors]
    if missing:
        fail(hf_dir, f"missing tensors {named_list(missing)}")
    for name, shape in want.items():
        t = tensors[name]
        if t.dtype not in ("F32", "F16", "BF16"):
            fail(t.path, f"tensor {name} is {t.dtype}; F32, F16 or BF16 are read")
        if t.shape != shape:
            fail(t.path, f"tensor {name} has shape {list(t.shape)}, the config implies {list(shape)}")


def seed_chunks(c, tensors, tied):
    """The seed file as chunks: its header, then each tensor in fp32 in the file's order, q/k rows in
    Meta's order."""
    layers = range(c.n_layer)

    def layer(l, name):
        return read_f32(tensors[f"model.layers.{l}.{name}.weight"])

    yield seed_header(c)
    yield read_f32(tensors["model.embed_tokens.weight"])
    yield from (layer(l, "input_layernorm") for l in layers)
    for l in layers:
        yield np.concatenate([to_meta_rows(layer(l, "self_attn.q_proj"), c.n_head),
                              to_meta_rows(layer(l, "self_attn.k_proj"), c.n_kv_head),
                              layer(l, "self_attn.v_proj")])
    for name in ("self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
                 "mlp.down_proj"):
        yield from (layer(l, name) for l in layers)
    yield read_f32(tensors["model.norm.weight"])
    if not tied:
        yield read_f32(tensors["lm_head.weight"])


def main(args):
    config_path = config_file(args.hf_dir)
    hf_cfg = read_json(config_path)
    files = safetensors_files(args.hf_dir)
    tensors = tensor_index(files)
    tied = bool(hf_cfg.get("tie_word_embeddings", False)) or "lm_head.weight" not in tensors
    c = config_of(hf_cfg, config_path, tied)
    check_tensors(tensors, c, tied, args.hf_dir)
    dtypes = "/".join(sorted({t.dtype for t in tensors.values()}))
    print(f"read {args.hf_dir}: {len(tensors)} tensors ({dtypes}) in {len(files)} file(s); {c.describe()}")
    if tied:
        print("tied embeddings: kept (the file has no lm_head; the trainer uses embed_tokens as its head)")
    n_params = sum(math.prod(s) for _, s in seed_layout(c))
    check_output(args.out, size=SEED_HEADER_BYTES + 4 * n_params)  # (before the tensors are read)
    write_atomic(args.out, seed_chunks(c, tensors, tied), [config_path, *files])
    print(f"wrote {args.out}: seed format, fp32, {n_params:,} parameters, {os.path.getsize(args.out):,} "
          f"bytes (q/k rows in Meta's pair order)")


if __name__ == "__main__":
    main(ARGS)
