#!/usr/bin/env python3
"""The trainer's model file -> a Hugging Face folder that transformers' LlamaForCausalLM.from_pretrained
loads; numpy, no torch.

    python3 scripts/export_hf.py MODEL.bin OUT_DIR [--dtype bfloat16|float32] [--tokenizer_from HF_DIR]

MODEL.bin: the seed format (1024-byte header, fp32: ref_llama3.py's files, convert_hf.py's, the trainer's
checkpoints DIR/step_%08d/model.bin) or llm.c's llama3 format (2048-byte header, version 3 fp32 or 5
bf16, zero biases), told apart by header layout and file size as llama3.h does. Writes
OUT_DIR/model.safetensors (q and k rows back to HF's half-rotation order; --dtype float32, the default,
is lossless, bfloat16 rounds to nearest even) and OUT_DIR/config.json (rope_type llama3 with its
constants and the header's factor, or no scaling; tie_word_embeddings as the file's header says, and a tied file's export has no
lm_head.weight; ffn_dim_multiplier and multiple_of kept so that convert_hf.py writes the same header
back). OUT_DIR is made when missing, in a folder that exists (a missing parent is refused before the model
is read, as the trainer's --checkpoint_dir); before the tensors are read it is checked as the trainer
checks its outputs (writable, not on a read-only file system, room for the tensors and tokenizer files,
no folder where a file goes).

--tokenizer_from HF_DIR (the folder the model came from, convert_hf.py's input) also copies its
tokenizer.json, tokenizer_config.json, special_tokens_map.json and generation_config.json, those it
has (each one missing is named; none at all is refused), so that AutoTokenizer.from_pretrained(OUT_DIR)
works; HF_DIR/config.json, if there, must have the model's vocab_size, and when it ties the embeddings
and the model file does not (a file of before tied files) the export says that it comes back untied. Every file goes through a temporary file, fsynced and
renamed; none may be MODEL.bin or a file of HF_DIR. Needs numpy (pip install -r requirements.txt).
"""
import json
import math
import os
import sys

import cli


def parse_args():
    ap = cli.ArgumentParser(__file__, description=__doc__.split("\n\n")[0],
                            epilog="example: python3 scripts/export_hf.py ckpt/step_00001000/model.bin my_llama "
                                   "--tokenizer_from Llama-3.2-1B")
    ap.add_argument("model", metavar="MODEL", help="seed-format or llm.c llama3 model file")
    ap.add_argument("out_dir", metavar="OUT_DIR",
                    help="folder for config.json and model.safetensors (made if missing; its parent must exist)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="of the written tensors (default float32: the trainer's fp32 weights, lossless)")
    ap.add_argument("--tokenizer_from", metavar="HF_DIR",
                    help="also copy the tokenizer and generation config from this HF folder (the model's "
                    "source)")
    return ap.parse_args()


if __name__ == "__main__":
    ARGS = parse_args()  # (before numpy's import: --help and a bad argument on any machine)
try:
    import numpy as np
except ModuleNotFoundError as e:
    cli.missing_package(__file__, e)

from llama3_files import (BOS_ID, EOS_ID, LLAMA3_ROPE, LLMC_HEADER_BYTES, MODEL_MAGIC, REAL_VOCAB,
                          SEED_HEADER_BYTES, bf16_to_f32, config_problem, f32_text, layout_bytes,
                          llmc_header_config, llmc_layout, read_json, safetensors_chunks, seed_header_config,
                          seed_layout, to_hf_rows)
from safe_write import check_new_folder, make_folder, write_atomic

VERSIONS = {3: "fp32", 5: "bf16"}  # seed files are version 3 only
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


def fail(path, what):
    sys.exit(f"error: {path}: {what}")


# ---- the model file ----

def read_header(path):
    """(config, format, version) of a model file: magic, version, then the reading (seed or llm.c) whose
    header is valid and whose implied size is the file's, as llama3.h's model_header_read."""
    if not os.path.isfile(path):
        fail(path, "cannot open model file: " + ("not a regular file" if os.path.exists(path)
                                                 else "no such file"))
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        h = f.read(LLMC_HEADER_BYTES)
    if size < SEED_HEADER_BYTES:
        fail(path, f"not a model file ({size} bytes, shorter than the {SEED_HEADER_BYTES}-byte header)")
    magic, version = (int(x) for x in np.frombuffer(h[:8], "<i4"))
    if magic != MODEL_MAGIC:
        fail(path, f"bad magic {magic} (expected {MODEL_MAGIC}, a LLaMA 3 model file)")
    if version not in VERSIONS:
        fail(path, f"unknown version {version} (3: fp32, seed or llm.c format; 5: bf16, llm.c format)")
    seed_cfg = seed_header_config(h)
    llmc_cfg = llmc_header_config(h) if size >= LLMC_HEADER_BYTES else None
    seed_err = config_problem(seed_cfg, "seed format") if version == 3 else "seed format: version 3 only"
    llmc_err = (config_problem(llmc_cfg, "llm.c format") if llmc_cfg
                else "llm.c format: shorter than its header")
    itemsize = 4 if version == 3 else 2
    seed_size = 0 if seed_err else SEED_HEADER_BYTES + layout_bytes(seed_layout(seed_cfg), 4)
    llmc_size = 0 if llmc_err else LLMC_HEADER_BYTES + layout_bytes(llmc_layout(llmc_cfg), itemsize)
    if seed_size == size:
        return seed_cfg, "seed", version
    if llmc_size == size:
        return llmc_cfg, "llmc", version
    if not seed_size and not llmc_size:
        fail(path, f"not a valid model header (read as the {seed_err}; read as the {llmc_err})")
    fail(path, f"truncated or corrupt: {size} bytes, but its header implies {seed_size} (seed format) or "
               f"{llmc_size} (llm.c format)")


def read_tensors(path, c, fmt, version):
    """name -> the file's tensor, memory-mapped (read when used): fp32, or bf16 bits (uint16) in version 5."""
    layout = seed_layout(c) if fmt == "seed" else llmc_layout(c)
    dtype = np.dtype("<f4" if version == 3 else "<u2")
    offset = SEED_HEADER_BYTES if fmt == "seed" else LLMC_HEADER_BYTES
    out = {}
    for name, shape in layout:
        out[name] = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
        offset += math.prod(shape) * dtype.itemsize
    return out


def as_f32(a):
    return bf16_to_f32(a) if a.dtype == np.uint16 else np.asarray(a, dtype=np.float32)


def check_llmc_biases(path, tensors):
    for name, a in tensors.items():
        if name.endswith("bias") and np.any(as_f32(a) != 0):
            fail(path, f"{name} is not zero (LLaMA has no biases)")


# ---- the Hugging Face folder ----

def layer_entries(c, t, l):
    """HF name -> (shape, produce() -> fp32 array) of layer l's tensors; q/k rows back to HF's order."""
    C, F, p = c.n_embd, c.ffn_hidden, f"model.layers.{l}."
    q_end, k_end = C, C + c.n_kv_head * c.head_dim
    KV = k_end - q_end
    qkv = lambda begin, end: as_f32(t["qkv"][l, begin:end])
    ffn = lambda i: (as_f32(t["gate_up"][l, i * F:(i + 1) * F]) if "gate_up" in t  # llm.c: gate rows, up rows
                     else as_f32(t[("gate", "up")[i]][l]))
    return {
        p + "input_layernorm.weight": ((C,), lambda: as_f32(t["attn_norm"][l])),
        p + "self_attn.q_proj.weight": ((C, C), lambda: to_hf_rows(qkv(0, q_end), c.n_head)),
        p + "self_attn.k_proj.weight": ((KV, C), lambda: to_hf_rows(qkv(q_end, k_end), c.n_kv_head)),
        p + "self_attn.v_proj.weight": ((KV, C), lambda: qkv(k_end, None)),
        p + "self_attn.o_proj.weight": ((C, C), lambda: as_f32(t["attn_out"][l])),
        p + "post_attention_layernorm.weight": ((C,), lambda: as_f32(t["ffn_norm"][l])),
        p + "mlp.gate_proj.weight": ((F, C), lambda: ffn(0)),
        p + "mlp.up_proj.weight": ((F, C), lambda: ffn(1)),
        p + "mlp.down_proj.weight": ((C, F), lambda: as_f32(t["down"][l]))}


def hf_entries(c, t):
    """HF tensor name -> (shape, produce() -> fp32 array) of the file's tensors t, in HF's order."""
    V, C = c.vocab_size, c.n_embd
    entries = {"model.embed_tokens.weight": ((V, C), lambda: as_f32(t["wte"]))}
    for l in range(c.n_layer):
        entries.update(layer_entries(c, t, l))
    entries["model.norm.weight"] = ((C,), lambda: as_f32(t["final_norm"]))
    if not c.tied_embeddings:  # tied: from_pretrained ties lm_head to embed_tokens
        entries["lm_head.weight"] = ((V, C), lambda: as_f32(t["lm_head"]))
    return entries


def hf_config(c, dtype):
    """config.json as the LLaMA 3.2 releases write it (rope_scaling + rope_theta: transformers 4.43 on)."""
    real_vocab = c.vocab_size == REAL_VOCAB
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": c.vocab_size,
        "hidden_size": c.n_embd, "intermediate_size": c.ffn_hidden, "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_head, "head_dim": c.head_dim,
        "hidden_act": "silu", "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": float(f32_text(c.norm_eps)), "rope_theta": float(f32_text(c.rope_theta)),
        "rope_scaling": (dict(LLAMA3_ROPE, factor=float(f32_text(c.rope_factor)), rope_type="llama3")
                         if c.use_scaled_rope else None),
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "tie_word_embeddings": bool(c.tied_embeddings),
        "torch_dtype": dtype, "bos_token_id": BOS_ID if real_vocab else None,
        "eos_token_id": EOS_ID if real_vocab else None, "use_cache": True,
        # not read by transformers: the header's two FFN fields, for convert_hf.py
        "ffn_dim_multiplier": float(f32_text(c.ffn_dim_multiplier)), "multiple_of": c.multiple_of}


# ---- the tokenizer, from the source folder ----

def tokenizer_source(src, out_dir, c):
    """src's config.json ({} if none), once src is checked before anything is written: a folder other
    than out_dir, holding one of TOKENIZER_FILES at least, whose config.json has the model's vocab_size."""
    if not os.path.isdir(src):
        fail(src, "--tokenizer_from: not a folder")
    if os.path.isdir(out_dir) and os.path.samefile(src, out_dir):
        fail(src, "--tokenizer_from is OUT_DIR: its files would be written over")
    if not any(os.path.isfile(os.path.join(src, n)) for n in TOKENIZER_FILES):
        fail(src, f"--tokenizer_from: none of {', '.join(TOKENIZER_FILES)} is there")
    config = os.path.join(src, "config.json")
    cfg = read_json(config) if os.path.isfile(config) else {}
    if cfg.get("vocab_size", c.vocab_size) != c.vocab_size:
        fail(config, f"vocab_size {cfg['vocab_size']}, but the model's is {c.vocab_size}: not its tokenizer")
    return cfg


def copy_tokenizer(src, src_cfg, out_dir, model, c):
    """TOKENIZER_FILES copied whole from src into out_dir, each missing one named; tied embeddings untied by an
    earlier convert_hf.py noted."""
    for path in (os.path.join(src, n) for n in TOKENIZER_FILES):
        if not os.path.isfile(path):
            print(f"{path}: not there, not copied")
            continue
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            fail(path, f"cannot read: {e.strerror}")
        write_atomic(os.path.join(out_dir, os.path.basename(path)), [data], [model, path])
        print(f"copied {path}")
    if src_cfg.get("tie_word_embeddings") is True and not c.tied_embeddings:
        print(f"{src} ties lm_head to embed_tokens (tie_word_embeddings true); this model file is untied, and "
              "so is its export: tie_word_embeddings false, lm_head.weight a tensor of its own")


def write_model(args, c, tensors):
    """OUT_DIR/model.safetensors and OUT_DIR/config.json."""
    weights = os.path.join(args.out_dir, "model.safetensors")
    config = os.path.join(args.out_dir, "config.json")
    entries = hf_entries(c, tensors)
    write_atomic(weights, safetensors_chunks(entries, args.dtype, {"format": "pt"}), [args.model])
    text = json.dumps(hf_config(c, args.dtype), indent=2) + "\n"
    write_atomic(config, [text.encode()], [args.model])
    print(f"wrote {weights}: {len(entries)} tensors, {args.dtype}, {os.path.getsize(weights):,} bytes "
          f"(q/k rows in HF's half-rotation order); {config}")


def folder_bytes(c, dtype, tokenizer_from):
    """What OUT_DIR gets: the tensors in `dtype`, and the tokenizer files tokenizer_from holds."""
    sources = [os.path.join(tokenizer_from, n) for n in TOKENIZER_FILES] if tokenizer_from else []
    return layout_bytes(seed_layout(c), 2 if dtype == "bfloat16" else 4) + sum(
        os.path.getsize(s) for s in sources if os.path.isfile(s))


def main(args):
    check_new_folder(args.out_dir)  # (before the model is read; again with its size once its header is)
    c, fmt, version = read_header(args.model)
    check_new_folder(args.out_dir, size=folder_bytes(c, args.dtype, args.tokenizer_from),
                     files=("model.safetensors", "config.json") + (TOKENIZER_FILES if args.tokenizer_from else ()))
    tensors = read_tensors(args.model, c, fmt, version)
    if fmt == "llmc":
        check_llmc_biases(args.model, tensors)
    name = "seed (1024-byte header)" if fmt == "seed" else "llm.c llama3 (2048-byte header, zero biases)"
    print(f"read {args.model}: {name} format, {VERSIONS[version]}; {c.describe()}")
    src_cfg = tokenizer_source(args.tokenizer_from, args.out_dir, c) if args.tokenizer_from else None
    make_folder(args.out_dir)
    write_model(args, c, tensors)
    if args.tokenizer_from:
        copy_tokenizer(args.tokenizer_from, src_cfg, args.out_dir, args.model, c)


if __name__ == "__main__":
    main(ARGS)
