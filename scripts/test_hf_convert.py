#!/usr/bin/env python3
"""Host test of scripts/convert_hf.py and scripts/export_hf.py (no GPU; numpy and safetensors).

    python3 scripts/test_hf_convert.py

Builds random models of ref_llama3.py's small shape (2 layers, n_embd 256, 8 heads, 2 kv heads, vocab 1000,
ffn 1024 = ffn_dim_multiplier 1.5, multiple_of 256) in HF layout, written by the safetensors library itself,
and checks the scripts against the test's own formulation of the files (header by struct.pack, q/k rows by an
explicit index loop, llm.c's layout, bf16 rounding by distance): round trips bit for bit, tied embeddings,
shards, bf16 input and output, llm.c input, export's --tokenizer_from, and that every unsupported config or
file, an output that cannot be written and a missing numpy are refused in one line (without numpy and
safetensors only the last runs).
With torch and transformers (CPU): from_pretrained on the exported folder against the original model's logits,
the config round trip, bf16 against torch's rounding, AutoTokenizer on an export with --tokenizer_from, and a
save_pretrained model against ref_llama3.py's seed file. Prints "ok ..." / "FAIL ..." per check,
"skipped: ..." for what cannot run, then "N passed, M failed".
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli import ArgumentParser  # noqa: E402

if __name__ == "__main__":  # (before numpy's import: --help on any machine)
    ArgumentParser(__file__, description=__doc__, epilog="example: python3 scripts/test_hf_convert.py").parse_args()
try:
    import numpy as np
    import safetensors
    from safetensors.numpy import save_file
except ModuleNotFoundError as e:
    MISSING = e.name
else:
    MISSING = None

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = dict(max_seq=8192, V=1000, L=2, NH=8, KVH=2, C=256, F=1024, mult=1.5, multiple_of=256, eps=1e-5,
             theta=500000.0, scaled=1, factor=32.0)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
results = []


def check(ok, what):
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {what}")


def run(script, *args, blocked=None):
    """(exit status, stdout, stderr) of a script; `blocked`: a module made unimportable first."""
    block = f"import sys, runpy; sys.modules[{blocked!r}] = None; sys.argv = sys.argv[1:]; " \
            f"sys.path.insert(0, {HERE!r}); runpy.run_path(sys.argv[0], run_name='__main__')"
    p = subprocess.run([sys.executable, *(["-c", block] if blocked else []), os.path.join(HERE, script),
                        *map(str, args)], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


# ---- the test's own formulation of the models and files ----

def hf_tensors(hp, seed):
    """A random model in HF's names and q/k row order: N(0, 0.02) matrices, norm weights U(0.5, 1.5)."""
    rng = np.random.default_rng(seed)
    C, F, D = hp["C"], hp["F"], hp["C"] // hp["NH"]
    normal = lambda *shape: rng.normal(0.0, 0.02, shape).astype(np.float32)
    norm = lambda: rng.uniform(0.5, 1.5, C).astype(np.float32)
    t = {"model.embed_tokens.weight": normal(hp["V"], C)}
    for l in range(hp["L"]):
        p = f"model.layers.{l}."
        t.update({p + "input_layernorm.weight": norm(), p + "self_attn.q_proj.weight": normal(C, C),
                  p + "self_attn.k_proj.weight": normal(hp["KVH"] * D, C),
                  p + "self_attn.v_proj.weight": normal(hp["KVH"] * D, C),
                  p + "self_attn.o_proj.weight": normal(C, C), p + "post_attention_layernorm.weight": norm(),
                  p + "mlp.gate_proj.weight": normal(F, C), p + "mlp.up_proj.weight": normal(F, C),
                  p + "mlp.down_proj.weight": normal(C, F)})
    t["model.norm.weight"] = norm()
    t["lm_head.weight"] = normal(hp["V"], C)
    return t


def hf_config(hp, rope_style="v5", **changes):
    """config.json as transformers 5 writes it (rope_parameters), or as LLaMA 3.2's (rope_scaling)."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": hp["V"],
           "hidden_size": hp["C"], "intermediate_size": hp["F"], "num_hidden_layers": hp["L"],
           "num_attention_heads": hp["NH"], "num_key_value_heads": hp["KVH"], "head_dim": hp["C"] // hp["NH"],
           "hidden_act": "silu", "max_position_embeddings": hp["max_seq"], "rms_norm_eps": hp["eps"],
           "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "dtype": "float32"}
    if rope_style == "v5":
        cfg["rope_parameters"] = dict(LLAMA3_ROPE, factor=hp["factor"], rope_theta=hp["theta"])
    else:
        cfg.update(rope_scaling=dict(LLAMA3_ROPE, factor=hp["factor"]), rope_theta=hp["theta"], torch_dtype="bfloat16")
    cfg.update(changes)
    return cfg


def bf16_bits_truncated(x):
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def widen(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def st_write(path, tensors):
    """With the safetensors library; uint16 arrays are bf16 bits (safetensors.numpy has no bf16)."""
    if all(a.dtype == np.float32 for a in tensors.values()):
        return save_file(tensors, path, metadata={"format": "pt"})
    specs = {}
    for name, a in tensors.items():
        dtype = "bfloat16" if a.dtype == np.uint16 else "float32"
        if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8
            specs[name] = safetensors.TensorSpec(dtype=dtype, shape=a.shape, data_ptr=a.ctypes.data,
                                                 data_len=a.nbytes)
        else:
            specs[name] = {"dtype": dtype, "shape": a.shape, "data": a.tobytes()}
    with open(path, "wb") as f:
        f.write(bytes(safetensors.serialize(specs, metadata={"format": "pt"})))


def st_read(path):
    """name -> (dtype, raw bytes), parsed by the safetensors library (checks the file is valid to it)."""
    with open(path, "rb") as f:
        items = safetensors.deserialize(f.read())
    dtypes = {"float32": "F32", "bfloat16": "BF16"}  # older versions name them so
    return {name: (dtypes.get(t["dtype"], t["dtype"]), bytes(t["data"])) for name, t in items}


def write_hf(d, cfg, tensors, shards=1):
    """config.json and model.safetensors, or an index and `shards` shard files."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if shards == 1:
        return st_write(os.path.join(d, "model.safetensors"), tensors)
    names, weight_map = list(tensors), {}
    for s in range(shards):
        shard = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s * len(names) // shards:(s + 1) * len(names) // shards]
        st_write(os.path.join(d, shard), {n: tensors[n] for n in part})
        weight_map.update({n: shard for n in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        total = sum(a.nbytes for a in tensors.values())
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)


def meta_rows_by_loop(w, heads):
    """Meta row h*D + 2i + j <- HF row h*D + j*D/2 + i."""
    D, out = w.shape[0] // heads, np.empty_like(w)
    for h in range(heads):
        for i in range(D // 2):
            for j in range(2):
                out[h * D + 2 * i + j] = w[h * D + j * D // 2 + i]
    return out


def layer_list(hp, t, name):
    return [t[f"model.layers.{l}.{name}.weight"] for l in range(hp["L"])]


def qkv_meta(hp, t, l):
    p = f"model.layers.{l}.self_attn."
    return np.concatenate([meta_rows_by_loop(t[p + "q_proj.weight"], hp["NH"]),
                           meta_rows_by_loop(t[p + "k_proj.weight"], hp["KVH"]), t[p + "v_proj.weight"]])


def seed_bytes(hp, t, tied=False):
    """The seed file (dev/FORMATS.md section 1) of HF tensors t; tied: slot 16 says so, no lm_head; slot 17 the RoPE
    factor."""
    header = struct.pack("<8i", 20240803, 3, hp["max_seq"], hp["V"], hp["L"], hp["NH"], hp["KVH"], hp["C"])
    header += struct.pack("<fiff5if", hp["mult"], hp["multiple_of"], hp["eps"], hp["theta"], hp["scaled"],
                          4, 3, 2, int(tied), hp["factor"])
    parts = [t["model.embed_tokens.weight"], *layer_list(hp, t, "input_layernorm"),
             *[qkv_meta(hp, t, l) for l in range(hp["L"])]]
    for name in ("self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
                 "mlp.down_proj"):
        parts += layer_list(hp, t, name)
    parts += [t["model.norm.weight"]] + ([] if tied else [t["lm_head.weight"]])
    return header.ljust(1024, b"\0") + b"".join(np.ascontiguousarray(p, "<f4").tobytes() for p in parts)


def llmc_bytes(hp, t, version, bias=0.0):
    """llm.c's llama3 file (dev/FORMATS.md section 2); version 5 stores bf16 (t must hold bf16 values)."""
    L, C, F, QKV = hp["L"], hp["C"], hp["F"], hp["C"] + 2 * hp["KVH"] * (hp["C"] // hp["NH"])
    ints = struct.pack("<12i", 20240803, version, hp["max_seq"], hp["V"], L, hp["NH"], hp["KVH"], C,
                       hp["multiple_of"], hp["scaled"], 3, 2)
    floats = struct.pack("<3f", hp["mult"], hp["eps"], hp["theta"])
    zeros = lambda n: np.full(n, bias, np.float32)
    gates, ups = layer_list(hp, t, "mlp.gate_proj"), layer_list(hp, t, "mlp.up_proj")
    fc = [np.concatenate([g, u]) for g, u in zip(gates, ups)]
    parts = [t["model.embed_tokens.weight"], t["lm_head.weight"], *layer_list(hp, t, "input_layernorm"),
             zeros(L * C), *[qkv_meta(hp, t, l) for l in range(L)], zeros(L * QKV),
             *layer_list(hp, t, "self_attn.o_proj"), zeros(L * C),
             *layer_list(hp, t, "post_attention_layernorm"), zeros(L * C), *fc, zeros(L * 2 * F),
             *layer_list(hp, t, "mlp.down_proj"), zeros(L * C), t["model.norm.weight"], zeros(C)]
    to_bytes = lambda p: (np.ascontiguousarray(p, "<f4") if version == 3
                          else bf16_bits_truncated(p)).tobytes()
    return ints.ljust(1024, b"\0") + floats.ljust(1024, b"\0") + b"".join(map(to_bytes, parts))


def bf16_nearest_even(x):
    """bf16 bits of x by distance: the nearer of the two bf16 neighbours, ties to the even one."""
    lo_bits = x.view(np.uint32) & 0xFFFF0000
    lo, hi = lo_bits.view(np.float32), (lo_bits + 0x10000).view(np.float32)
    d_lo, d_hi = np.abs(x.astype(np.float64) - lo), np.abs(x.astype(np.float64) - hi)
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & ((lo_bits >> 16) & 1 == 1))
    return np.where(take_hi, (lo_bits >> 16) + 1, lo_bits >> 16).astype(np.uint16)


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def same_tensors(path, want, dtype="F32"):
    """The safetensors file holds exactly `want` (name -> array whose bytes it must hold), all of `dtype`."""
    got = st_read(path)
    return set(got) == set(want) and all(got[n] == (dtype, np.ascontiguousarray(a).tobytes())
                                         for n, a in want.items())


def read_json(path):
    with open(path) as f:
        return json.load(f)


# ---- the checks ----

def convert_export(d, name, hf_dir, dtype="float32"):
    """convert_hf.py then export_hf.py; the seed file and the exported folder, or None where one failed."""
    seed, out = os.path.join(d, f"{name}.bin"), os.path.join(d, f"{name}_hf")
    rc, _, err = run("convert_hf.py", hf_dir, seed)
    if rc != 0:
        print(f"     convert_hf.py {hf_dir}: {err.strip()}")
        return None, None
    rc, _, err = run("export_hf.py", seed, out, "--dtype", dtype)
    if rc != 0:
        print(f"     export_hf.py {seed}: {err.strip()}")
        return seed, None
    return seed, out


def check_round_trips(d, t):
    """HF fp32 -> seed -> HF, and the seed file against the test's own; sharded input."""
    write_hf(os.path.join(d, "hf"), hf_config(SMALL), t)
    seed, out = convert_export(d, "hf", os.path.join(d, "hf"))
    check(seed and read_bytes(seed) == seed_bytes(SMALL, t), "HF -> convert: the seed file byte for byte as "
          "the test builds it (header by struct.pack, q/k rows by the loop Meta h*D+2i+j <- HF h*D+j*D/2+i)")
    check(out and same_tensors(os.path.join(out, "model.safetensors"), t),
          "HF fp32 -> convert -> export float32: every tensor bit for bit, no tensor more or less")
    write_hf(os.path.join(d, "sharded"), hf_config(SMALL), t, shards=2)
    sharded, _ = convert_export(d, "sharded", os.path.join(d, "sharded"))
    check(sharded and seed and read_bytes(sharded) == read_bytes(seed),
          "an index and 2 shards convert to the same bytes as one model.safetensors")
    return seed


def check_seed_first(d, t):
    """A seed file of other header values (no rope scaling, multiplier 1.2) -> export -> convert."""
    hp = dict(SMALL, max_seq=2048, mult=1.2, eps=1e-6, theta=10000.0, scaled=0)
    seed = os.path.join(d, "seed_first.bin")
    write_bytes(seed, seed_bytes(hp, t))
    out = os.path.join(d, "seed_first_hf")
    rc, _, err = run("export_hf.py", seed, out)
    back = os.path.join(d, "seed_first_back.bin")
    rc2, _, err2 = run("convert_hf.py", out, back) if rc == 0 else (1, "", "")
    check(rc == 0 and rc2 == 0 and read_bytes(back) == read_bytes(seed), "seed (no rope scaling, "
          f"ffn_dim_multiplier 1.2) -> export -> convert: identical bytes {err}{err2}".strip())
    cfg = read_json(os.path.join(out, "config.json")) if rc == 0 else {}
    want = {"rope_scaling": None, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 2048, "tie_word_embeddings": False, "bos_token_id": None,
            "eos_token_id": None}
    check(all(k in cfg and cfg[k] == v for k, v in want.items()), "its config.json: no rope scaling, theta, "
          "eps, context, untied, no LLaMA-3 bos/eos for a vocab of 1000")


def check_tied(d, t):
    """lm_head absent, tie_word_embeddings true, rope_scaling + rope_theta as the 3.2 releases write them: kept
    tied through convert, export and convert again."""
    tied = {n: a for n, a in t.items() if n != "lm_head.weight"}
    write_hf(os.path.join(d, "tied"), hf_config(SMALL, "v4", tie_word_embeddings=True), tied)
    seed, out = convert_export(d, "tied", os.path.join(d, "tied"))
    check(seed and read_bytes(seed) == seed_bytes(SMALL, tied, tied=True),
          "tied embeddings (lm_head absent): a tied seed file, slot 16 = 1 and no lm_head tensor")
    cfg = read_json(os.path.join(out, "config.json")) if out else {}
    check(out and same_tensors(os.path.join(out, "model.safetensors"), tied)
          and cfg.get("tie_word_embeddings") is True,
          "... and exported tied: tie_word_embeddings true, no lm_head.weight, every tensor bit for bit")
    back, _ = convert_export(d, "tied_back", out) if out else (None, None)
    check(back and read_bytes(back) == read_bytes(seed), "... which converts back to the same tied seed bytes")


def check_rope_factor8(d, t):
    """Llama-3.1's RoPE factor 8 (rope_scaling as the 3.1 releases write it): slot 17 holds it, the export's
    config.json says it, and it converts back to the same bytes."""
    hp = dict(SMALL, factor=8.0)
    write_hf(os.path.join(d, "factor8"), hf_config(hp, "v4"), t)
    seed, out = convert_export(d, "factor8", os.path.join(d, "factor8"))
    check(seed and read_bytes(seed) == seed_bytes(hp, t), "llama3 rope factor 8: the seed file's slot 17 is 8.0")
    rope = (read_json(os.path.join(out, "config.json")) if out else {}).get("rope_scaling") or {}
    check(rope == dict(LLAMA3_ROPE, factor=8.0), f"... exported as rope_scaling factor 8: {rope}")
    back, _ = convert_export(d, "factor8_back", out) if out else (None, None)
    check(back and read_bytes(back) == read_bytes(seed), "... which converts back to the same bytes")


def check_bf16(d, t, fp32_seed):
    """bf16 input widens exactly; fp32 exports to bf16 rounded to nearest even."""
    bits = {n: bf16_bits_truncated(a) for n, a in t.items()}
    write_hf(os.path.join(d, "bf16"), hf_config(SMALL), bits)
    seed, out = convert_export(d, "bf16", os.path.join(d, "bf16"), "bfloat16")
    check(seed and read_bytes(seed) == seed_bytes(SMALL, {n: widen(b) for n, b in bits.items()}),
          "bf16 input converts exactly (each value widened to fp32)")
    check(out and same_tensors(os.path.join(out, "model.safetensors"), bits, "BF16"),
          "bf16 -> convert -> export bfloat16: the input's bits")
    rc, _, err = run("export_hf.py", fp32_seed, os.path.join(d, "hf_bf16"), "--dtype", "bfloat16")
    want = {n: bf16_nearest_even(a) for n, a in t.items()}
    check(rc == 0 and same_tensors(os.path.join(d, "hf_bf16", "model.safetensors"), want, "BF16"),
          f"fp32 -> export bfloat16: each value the nearest bf16, ties to even {err}".strip())


def check_llmc(d, t):
    """llm.c's format, version 3 (fp32) and 5 (bf16), exports as the seed file does."""
    for version, dtype in ((3, "float32"), (5, "bfloat16")):
        model = os.path.join(d, f"llmc_v{version}.bin")
        values = t if version == 3 else {n: widen(bf16_bits_truncated(a)) for n, a in t.items()}
        write_bytes(model, llmc_bytes(SMALL, values, version))
        out = os.path.join(d, f"llmc_v{version}_hf")
        rc, said, err = run("export_hf.py", model, out, "--dtype", dtype)
        want = t if version == 3 else {n: bf16_bits_truncated(a) for n, a in t.items()}
        exported = os.path.join(out, "model.safetensors")
        check(rc == 0 and "llm.c" in said and same_tensors(exported, want, "F32" if version == 3 else "BF16"),
              f"llm.c format version {version} ({dtype}) -> export: the model's tensors, read as llm.c's "
              f"{err}".strip())
    write_bytes(os.path.join(d, "llmc_bias.bin"), llmc_bytes(SMALL, t, 3, bias=1e-3))
    expect_refusal("export_hf.py", [os.path.join(d, "llmc_bias.bin"), os.path.join(d, "llmc_bias_hf")],
                   "ln1 bias is not zero", "export: an llm.c file with a non-zero bias")


def expect_refusal(script, args, fragment, what, absent=None):
    """The script exits non-zero with one line on stderr naming the problem, and `absent` was not written."""
    rc, _, err = run(script, *args)
    lines = err.strip().splitlines()
    ok = rc != 0 and len(lines) == 1 and fragment in lines[0] and not (absent and os.path.exists(absent))
    check(ok, f"{what}: {lines[0] if len(lines) == 1 else f'exit {rc}, stderr {err.strip()!r}'}")


def refusal_cases(t):
    """(what, fragment the message must hold, config, tensors) of HF folders the trainer cannot run."""
    linear = dict(SMALL_CFG, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0})
    low2 = dict(SMALL_CFG, rope_parameters=dict(LLAMA3_ROPE, low_freq_factor=2.0, rope_theta=500000.0))
    text_factor = dict(SMALL_CFG, rope_parameters=dict(LLAMA3_ROPE, factor="8", rope_theta=500000.0))
    wide_hp = dict(SMALL, NH=1, KVH=1)
    no_up = {n: a for n, a in t.items() if n != "model.layers.1.mlp.up_proj.weight"}
    q_bias = dict(t, **{"model.layers.0.self_attn.q_proj.bias": np.zeros(256, np.float32)})
    extra = dict(t, **{"model.layers.0.self_attn.rotary_emb.inv_freq": np.zeros(16, np.float32)})
    bad_shape = dict(t, **{"model.layers.0.mlp.down_proj.weight": t["model.layers.0.mlp.gate_proj.weight"]})
    return [  # (the last: what llama3.h's reader says, or None where the trainer's kernel check refuses it)
        ("rope_type linear", "rope_type 'linear'", linear, t, "rope_type linear"),
        ("llama3 rope with low_freq_factor 2", "llama3 rope low_freq_factor 2.0", low2, t,
         "llama3 rope low_freq_factor"),
        ("llama3 rope factor not a number", "llama3 rope factor '8': not a number", text_factor, t,
         "llama3 rope factor: not a number"),
        ("attention_bias true", "attention_bias True", dict(SMALL_CFG, attention_bias=True), t, "attention_bias"),
        ("a bias tensor", "bias tensors model.layers.0.self_attn.q_proj.bias", SMALL_CFG, q_bias,
         "bias tensors model.layers.0.self_attn.q_proj.bias"),
        ("head_dim 256 (1 head of 256)", "head_dim 256", hf_config(wide_hp), hf_tensors(wide_hp, 3), None),
        ("a missing tensor", "missing tensors model.layers.1.mlp.up_proj.weight", SMALL_CFG, no_up,
         "missing tensors model.layers.1.mlp.up_proj.weight"),
        ("an unexpected tensor", "unexpected tensors model.layers.0.self_attn.rotary_emb.inv_freq", SMALL_CFG,
         extra, "unexpected tensors model.layers.0.self_attn.rotary_emb.inv_freq"),
        ("a tensor of the wrong shape", "model.layers.0.mlp.down_proj.weight has shape [1024, 256]",
         SMALL_CFG, bad_shape, "model.layers.0.mlp.down_proj.weight has shape [1024, 256]"),
        ("model_type mistral", "not a LlamaForCausalLM", dict(SMALL_CFG, model_type="mistral"), t,
         "not a LlamaForCausalLM"),
        ("hidden_act gelu", "hidden_act 'gelu'", dict(SMALL_CFG, hidden_act="gelu"), t, "hidden_act"),
        ("intermediate_size 1004", "must be multiples of 8", dict(SMALL_CFG, intermediate_size=1004), t,
         "must be multiples of 8"),
    ]


def check_convert_refusals(d, t):
    for i, (what, fragment, cfg, tensors, _) in enumerate(refusal_cases(t)):
        hf_dir, out = os.path.join(d, f"refuse{i}"), os.path.join(d, f"refuse{i}.bin")
        write_hf(hf_dir, cfg, tensors)
        expect_refusal("convert_hf.py", [hf_dir, out], fragment, f"convert refuses {what}", absent=out)
    weights = os.path.join(d, "hf", "model.safetensors")
    before = read_bytes(weights)
    expect_refusal("convert_hf.py", [os.path.join(d, "hf"), weights], "is the input",
                   "convert refuses an output that is an input (model.safetensors)")
    check(read_bytes(weights) == before, "... and that input is unchanged")


def check_export_refusals(d, seed):
    data = read_bytes(seed)
    cases = [("bad magic", b"\x01\x02\x03\x04" + data[4:], "bad magic 67305985"),
             ("a file cut 4 bytes short", data[:-4], "truncated or corrupt"),
             ("a file shorter than a header", data[:100],
              "not a model file (100 bytes, shorter than the 1024-byte header)"),
             ("version 4", data[:4] + struct.pack("<i", 4) + data[8:], "unknown version 4"),
             ("n_head 0", data[:20] + struct.pack("<i", 0) + data[24:], "n_head 0 is out of range")]
    for i, (what, content, fragment) in enumerate(cases):
        model, out = os.path.join(d, f"bad{i}.bin"), os.path.join(d, f"bad{i}_hf")
        write_bytes(model, content)
        expect_refusal("export_hf.py", [model, out], fragment, f"export refuses {what}", absent=out)
    out = os.path.join(d, "self_hf")
    os.makedirs(out)
    model = os.path.join(out, "model.safetensors")  # the model file where the output would go
    write_bytes(model, data)
    expect_refusal("export_hf.py", [model, out], "is the input", "export refuses an output that is its input")
    check(read_bytes(model) == data, "... and that input is unchanged")


def check_unwritable(d, seed):
    """Output paths that cannot be written: one line naming the output, never the temporary file."""
    out = os.path.join(d, "no_such_folder", "model.bin")
    rc, _, err = run("convert_hf.py", os.path.join(d, "hf"), out)
    check(rc != 0 and len(err.strip().splitlines()) == 1 and out in err and ".tmp" not in err,
          f"convert into a folder that does not exist: one line naming the output ({err.strip()})")
    under_file = os.path.join(seed, "hf_out")  # a folder whose parent is a file
    rc, _, err = run("export_hf.py", seed, under_file)
    check(rc != 0 and len(err.strip().splitlines()) == 1 and under_file in err and "Traceback" not in err,
          f"export into a folder that cannot be made: one line naming it ({err.strip()})")
    check_missing_folders(d, seed)


def check_missing_folders(d, seed):
    """A folder that is not there is named as such: convert's HF_DIR missing or a file (not "no config.json"),
    and export's OUT_DIR in a missing folder, refused before the model is read (here a bad one) with nothing
    made, as the trainer's --checkpoint_dir."""
    missing = os.path.join(d, "Llama-3.2-1B")
    expect_refusal("convert_hf.py", [missing, os.path.join(d, "out.bin")], f"{missing}: no such folder",
                   "convert from a folder that does not exist")
    expect_refusal("convert_hf.py", [seed, os.path.join(d, "out.bin")], f"{seed}: not a folder",
                   "convert from a file, not a folder")
    nested, bad = os.path.join(d, "a", "b", "c"), os.path.join(d, "not_a_model.bin")
    write_bytes(bad, b"x" * 42)
    expect_refusal("export_hf.py", [bad, nested],
                   f"{nested}: cannot be written: its folder {os.path.dirname(nested)} does not exist",
                   "export into a missing folder, before the model is read", absent=os.path.join(d, "a"))


def fake_tokenizer_folder(d, tied, names):
    """An HF download's tokenizer files (made-up contents) and its config.json."""
    os.makedirs(d)
    for name in names:
        write_bytes(os.path.join(d, name), json.dumps({"made_up": name, "bytes": "é"}).encode())
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(hf_config(SMALL, tie_word_embeddings=tied), f)


def check_tokenizer_from(d, seed):
    """--tokenizer_from copies the tokenizer files there, names the missing ones, notes a tied source."""
    src, out = os.path.join(d, "tok_src"), os.path.join(d, "tok_hf")
    have = ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]
    fake_tokenizer_folder(src, True, have)
    rc, said, err = run("export_hf.py", seed, out, "--tokenizer_from", src)
    copied = rc == 0 and all(read_bytes(os.path.join(out, n)) == read_bytes(os.path.join(src, n)) for n in have)
    check(copied and not os.path.exists(os.path.join(out, "special_tokens_map.json")),
          f"--tokenizer_from: the 3 tokenizer files there copied byte for byte {err.strip()}".strip())
    missing = [line for line in said.splitlines() if "special_tokens_map.json" in line]
    check(len(missing) == 1 and "not copied" in missing[0], f"... the missing one named in a line: {missing}")
    untied = [line for line in said.splitlines() if "untied" in line]
    check(len(untied) == 1 and "tie_word_embeddings false" in untied[0],
          f"... and the tied source's export said to be untied: {untied}")
    empty = os.path.join(d, "tok_empty")
    os.makedirs(empty)
    expect_refusal("export_hf.py", [seed, os.path.join(d, "tok_empty_hf"), "--tokenizer_from", empty],
                   "none of tokenizer.json", "--tokenizer_from a folder without tokenizer files",
                   absent=os.path.join(d, "tok_empty_hf"))
    other = os.path.join(d, "tok_other")
    fake_tokenizer_folder(other, False, have[:1])
    with open(os.path.join(other, "config.json"), "w") as f:
        json.dump(hf_config(dict(SMALL, V=128256)), f)
    expect_refusal("export_hf.py", [seed, os.path.join(d, "tok_other_hf"), "--tokenizer_from", other],
                   "vocab_size 128256, but the model's is 1000",
                   "--tokenizer_from a folder of another vocabulary", absent=os.path.join(d, "tok_other_hf"))


def check_missing_numpy():
    """Without numpy, convert_hf.py and export_hf.py stop with one line saying how to install it."""
    for script in ("convert_hf.py", "export_hf.py"):
        rc, _, err = run(script, "in", "out", blocked="numpy")
        check(rc != 0 and len(err.strip().splitlines()) == 1 and err.startswith("error: ") and "numpy" in err
              and "pip install" in err, f"{script} without numpy: one line with the pip command ({err.strip()})")


SMALL_CFG = hf_config(SMALL)


# ---- the trainer's own reader of HF folders (llama3.h, --hf_dir) ----

HOST_TEST = os.path.join(os.path.dirname(HERE), "test_llama3_host")


def c_read(hf_dir, out):
    """(exit status, stderr) of llama3.h's reader on hf_dir, its weights written as a seed file to out
    (test_llama3_host --hf_to_seed)."""
    p = subprocess.run([HOST_TEST, "--hf_to_seed", hf_dir, out], capture_output=True, text=True)
    return p.returncode, p.stderr


def st_write_f16(path, tensors):
    """A safetensors file of F16 tensors, header and data by the test itself."""
    header, offset = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F16", "shape": list(a.shape), "data_offsets": [offset, offset + a.size * 2]}
        offset += a.size * 2
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    write_bytes(path, struct.pack("<Q", len(text)) + text + b"".join(a.astype("<f2").tobytes()
                                                                     for a in tensors.values()))


def check_reader_same_bytes(d, t):
    """The reader's weights are convert_hf.py's, bit for bit: every folder converted above, F16 tensors
    (subnormals among them), and an intermediate_size whose ffn_dim_multiplier is searched for."""
    f16_dir = os.path.join(d, "f16")
    os.makedirs(f16_dir)
    with open(os.path.join(f16_dir, "config.json"), "w") as f:
        json.dump(SMALL_CFG, f)
    st_write_f16(os.path.join(f16_dir, "model.safetensors"), t)
    subnormal = sum(int(np.count_nonzero((a != 0) & (np.abs(a.astype(np.float16)) < 2.0 ** -14))) for a in t.values())
    hp = dict(SMALL, F=704)  # no LLaMA 3 pair gives 704: multiple_of 64 and a searched multiplier
    write_hf(os.path.join(d, "ffn704"), hf_config(hp), hf_tensors(hp, 4))
    for name in ("f16", "ffn704"):
        rc, _, err = run("convert_hf.py", os.path.join(d, name), os.path.join(d, f"{name}.bin"))
        check(rc == 0, f"convert_hf.py {name} {err.strip()}".strip())
    for name in ("hf", "sharded", "tied", "factor8", "bf16", "f16", "ffn704"):
        want, got = os.path.join(d, f"{name}.bin"), os.path.join(d, f"{name}_reader.bin")
        rc, err = c_read(os.path.join(d, name), got)
        same = rc == 0 and os.path.exists(want) and read_bytes(got) == read_bytes(want)
        check(same, f"--hf_dir's reader on {name}{f' ({subnormal} subnormal F16 values)' if name == 'f16' else ''}: "
              f"convert_hf.py's seed file byte for byte {err.strip()}".strip())


def check_tie_rule(d, t):
    """Tied where tie_word_embeddings is true or lm_head.weight is absent (the reader's and convert_hf.py's rule):
    a tied folder of an older export (no lm_head.weight, no tie_word_embeddings) reads tied, one with
    lm_head.weight and no key untied (transformers' default), and one with both and the key true tied (its
    lm_head.weight unread). Each folder's seed file, by the reader and by convert_hf.py, is the test's own."""
    cases = [("no lm_head.weight and no tie_word_embeddings (an older export)", False, None, True),
             ("lm_head.weight and no tie_word_embeddings", True, None, False),
             ("lm_head.weight and tie_word_embeddings true", True, True, True)]
    for i, (what, head, tie, tied) in enumerate(cases):
        cfg = hf_config(SMALL, tie_word_embeddings=tie)
        if tie is None:
            del cfg["tie_word_embeddings"]
        hf_dir = os.path.join(d, f"tie_rule{i}")
        write_hf(hf_dir, cfg, t if head else {n: a for n, a in t.items() if n != "lm_head.weight"})
        rc, err = c_read(hf_dir, hf_dir + "_reader.bin")
        rc2, _, err2 = run("convert_hf.py", hf_dir, hf_dir + ".bin")
        same = rc == rc2 == 0 and read_bytes(hf_dir + "_reader.bin") == read_bytes(hf_dir + ".bin") == \
            seed_bytes(SMALL, t, tied=tied)
        check(same, f"{what}: read {'tied' if tied else 'untied'} by --hf_dir's reader and convert_hf.py, the seed "
              f"file byte for byte {err.strip()} {err2.strip()}".strip())


def expect_reader_refusal(hf_dir, fragment, what):
    rc, err = c_read(hf_dir, hf_dir + ".bin")
    lines = err.strip().splitlines()
    ok = rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]
    check(ok and not os.path.exists(hf_dir + ".bin"),
          f"--hf_dir's reader refuses {what}: {lines[0] if len(lines) == 1 else f'exit {rc}, {err.strip()!r}'}")


def copy_folder(d, src, name, files=None):
    """A copy of folder src as d/name, with `files` (name -> bytes, or None: left out) changed."""
    out = os.path.join(d, name)
    os.makedirs(out)
    for f in os.listdir(src):
        write_bytes(os.path.join(out, f), read_bytes(os.path.join(src, f)))
    for f, data in (files or {}).items():
        if data is None:
            os.remove(os.path.join(out, f))
        else:
            write_bytes(os.path.join(out, f), data)
    return out


def st_with_header(data, header):
    """A safetensors file's bytes with its JSON header replaced (the data, which its offsets count from the
    header's end, kept)."""
    n = struct.unpack("<Q", data[:8])[0]
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data[8 + n:]


def check_reader_refusals(d, t):
    """Each folder convert refuses (above), and hostile files: one line, nothing written."""
    for i, (what, _, _, _, fragment) in enumerate(refusal_cases(t)):
        if fragment:
            expect_reader_refusal(os.path.join(d, f"refuse{i}"), fragment, what)
    hf, st = os.path.join(d, "hf"), read_bytes(os.path.join(d, "hf", "model.safetensors"))
    n = struct.unpack("<Q", st[:8])[0]
    header = json.loads(st[8:8 + n])
    name = "model.layers.0.mlp.up_proj.weight"
    cases = [
        ("a safetensors file cut short", st[:len(st) // 2], "do not fit its shape or the file's data"),
        ("a header length past the file", struct.pack("<Q", len(st)) + st[8:], "not a safetensors file"),
        ("a 5-byte safetensors file", st[:5], "not a safetensors file (header length -1"),
        ("a header that is not JSON", st[:8] + b"x" + st[9:], "not valid JSON"),
        ("data_offsets that lie about the size",
         st_with_header(st, dict(header, **{name: dict(header[name], data_offsets=[0, 8])})),
         "do not fit its shape"),
        ("a dtype not read (I8)", st_with_header(st, dict(header, **{name: dict(header[name], dtype="I8")})),
         f"tensor {name} is I8"),
        ("a shape of 2^120 elements", st_with_header(st, dict(header, **{name: dict(header[name], shape=[1 << 40] * 3)})),
         "do not fit its shape"),
    ]
    for i, (what, data, fragment) in enumerate(cases):
        expect_reader_refusal(copy_folder(d, hf, f"hostile{i}", {"model.safetensors": data}), fragment, what)
    sharded = os.path.join(d, "sharded")
    index = read_json(os.path.join(sharded, "model.safetensors.index.json"))
    shards = sorted(set(index["weight_map"].values()))
    moved = dict(index, weight_map=dict(index["weight_map"], **{"model.norm.weight": shards[0]}))
    missing = dict(index, weight_map=dict(index["weight_map"], **{"model.norm.weight": "model-9.safetensors"}))
    outside = dict(index, weight_map=dict(index["weight_map"], **{"model.norm.weight": "../model.safetensors"}))
    for i, (what, idx, fragment) in enumerate([
            ("an index that places a tensor in another shard", moved, "which the index places in " + shards[0]),
            ("an index naming a missing shard", missing, "missing: a shard"),
            ("an index naming a file outside the folder", outside, "not the name of a file in the folder")]):
        files = {"model.safetensors.index.json": json.dumps(idx).encode()}
        expect_reader_refusal(copy_folder(d, sharded, f"bad_index{i}", files), fragment, what)
    both = copy_folder(d, sharded, "in_two_shards", {shards[1]: read_bytes(os.path.join(sharded, shards[0]))})
    expect_reader_refusal(both, "is also in", "a tensor in two shards")
    deep = copy_folder(d, hf, "deep_config", {"config.json": b"[" * 100 + b"]" * 100})
    expect_reader_refusal(deep, "nesting deeper than 32", "a config.json nested 100 deep")
    listed = copy_folder(d, hf, "list_config", {"config.json": b"[1, 2]"})
    expect_reader_refusal(listed, "not a JSON object", "a config.json that is a list")
    expect_reader_refusal(copy_folder(d, hf, "no_config", {"config.json": None}), "no config.json",
                          "a folder without config.json")
    expect_reader_refusal(os.path.join(d, "Llama-3.2-1B"), "no such folder", "a folder that does not exist")
    expect_reader_refusal(os.path.join(d, "hf", "config.json"), "not a folder", "a file, not a folder")


def check_writer_same_bytes(d):
    """--save_hf's writer (llama3.h hf_save, through test_llama3_host --seed_to_hf) gives export_hf.py's
    config.json and model.safetensors byte for byte, in both dtypes: untied, tied, RoPE factor 8, no rope
    scaling (multiplier 1.2, eps 1e-6, theta 10000), a searched multiplier, and LLaMA 3's own vocabulary
    (whose bos and eos ids config.json names)."""
    hp = dict(SMALL, V=128256, L=1, C=64, NH=2, KVH=1, F=256)
    write_bytes(os.path.join(d, "vocab128256.bin"), seed_bytes(hp, {n: a for n, a in hf_tensors(hp, 6).items()
                                                                   if n != "lm_head.weight"}, tied=True))
    for name in ("hf", "tied", "factor8", "seed_first", "ffn704", "vocab128256"):
        for dtype in ("bfloat16", "float32"):
            want, got = os.path.join(d, f"{name}_py_{dtype}"), os.path.join(d, f"{name}_c_{dtype}")
            rc, _, err = run("export_hf.py", os.path.join(d, f"{name}.bin"), want, "--dtype", dtype)
            p = subprocess.run([HOST_TEST, "--seed_to_hf", os.path.join(d, f"{name}.bin"), got, dtype],
                               capture_output=True, text=True)
            files = ("config.json", "model.safetensors")
            same = rc == 0 and p.returncode == 0 and all(
                read_bytes(os.path.join(got, f)) == read_bytes(os.path.join(want, f)) for f in files)
            check(same, f"--save_hf's writer on {name} ({dtype}): export_hf.py's config.json and model.safetensors "
                  f"byte for byte {err.strip()} {p.stderr.strip()}".strip())


def check_reader_fuzz(d, cases=120):
    """Random bytes written over the safetensors header or config.json of a good folder (a fixed seed): the
    reader (under AddressSanitizer) reads the folder or refuses it in one line, every time."""
    import random
    st, cfg = read_bytes(os.path.join(d, "hf", "model.safetensors")), read_bytes(os.path.join(d, "hf", "config.json"))
    n, rng, bad, refused = struct.unpack("<Q", st[:8])[0], random.Random(1), [], 0
    for i in range(cases):
        text = bytearray(st[8:8 + n] if i % 2 else cfg)
        for _ in range(rng.randint(1, 6)):
            text[rng.randrange(len(text))] = rng.choice([rng.randrange(256), *b'{}[]",:0123456789-.eE\\'])
        files = {"model.safetensors": st[:8] + bytes(text) + st[8 + n:]} if i % 2 else {"config.json": bytes(text)}
        folder = copy_folder(d, os.path.join(d, "hf"), f"fuzz{i}", files)
        p = subprocess.run([HOST_TEST, "--hf_to_seed", folder, folder + ".bin"], capture_output=True, text=True,
                           errors="replace")
        lines = p.stderr.strip().splitlines()
        refused += p.returncode == 1
        if not ((p.returncode == 0 and not lines) or (p.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "))):
            bad.append(f"case {i}: exit {p.returncode}, {p.stderr.strip()[:200]!r}")
    check(not bad, f"--hf_dir's reader on {cases} folders with random bytes in a header or config.json: read or "
          f"refused in one line every time ({refused} refused){': ' + bad[0] if bad else ''}")


def check_reader(d, t):
    if not os.path.exists(HOST_TEST):
        print("skipped: --hf_dir's reader and --save_hf's writer against convert_hf.py and export_hf.py: no "
              "./test_llama3_host (make test_llama3_host)")
        return
    check_reader_same_bytes(d, t)
    check_tie_rule(d, t)
    check_reader_refusals(d, t)
    check_reader_fuzz(d)
    check_writer_same_bytes(d)


# ---- with torch and transformers (CPU) ----

def rope_of(cfg):
    """RoPE settings of a LlamaConfig: transformers 5's rope_parameters, or 4's rope_scaling, rope_theta."""
    if getattr(cfg, "rope_parameters", None):
        return dict(cfg.rope_parameters)
    return dict(cfg.rope_scaling or {"rope_type": "default"}, rope_theta=cfg.rope_theta)


def config_fields(cfg):
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
            "tie_word_embeddings", "hidden_act", "attention_bias", "mlp_bias")
    return {k: getattr(cfg, k, None) for k in keys} | {"rope": rope_of(cfg)}


def check_transformers(d, t, torch, transformers):
    """from_pretrained(exported) against a model holding the original state dict; the config round trip."""
    from transformers import LlamaConfig, LlamaForCausalLM
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    original_cfg = LlamaConfig.from_pretrained(os.path.join(d, "hf"))
    original = LlamaForCausalLM(original_cfg).float().eval()
    original.load_state_dict({n: torch.from_numpy(a) for n, a in t.items()}, strict=True)
    exported, info = LlamaForCausalLM.from_pretrained(os.path.join(d, "hf_hf"), output_loading_info=True)
    exported = exported.float().eval()
    problems = {k: v for k, v in info.items()
                if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    check(not problems, "from_pretrained(exported folder): no missing, unexpected or mismatched keys"
          + (f" {problems}" if problems else ""))
    tokens = torch.from_numpy(np.random.default_rng(5).integers(0, SMALL["V"], (2, 24)))
    with torch.no_grad():
        want, got = original(input_ids=tokens).logits, exported(input_ids=tokens).logits
    err = (want - got).abs().max().item()
    check(err <= 1e-5, f"its logits on a random batch equal the original state dict's (fp32, CPU): "
          f"max |diff| {err:.1e} (atol 1e-5)")
    same = config_fields(original_cfg) == config_fields(exported.config)
    check(same, "config round trip: shape, context, eps, rope llama3 with its constants and theta, untied"
          + ("" if same else f" {config_fields(original_cfg)} != {config_fields(exported.config)}"))
    plain = LlamaConfig.from_pretrained(os.path.join(d, "seed_first_hf"))
    check(rope_of(plain) == {"rope_type": "default", "rope_theta": 10000.0},
          f"a model without rope scaling exports as rope_type default, theta 10000: {rope_of(plain)}")
    bits = st_read(os.path.join(d, "hf_bf16", "model.safetensors"))
    by_torch = {n: torch.from_numpy(a).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
                for n, a in t.items()}
    check(set(bits) == set(by_torch) and all(bits[n] == ("BF16", b) for n, b in by_torch.items()),
          "export bfloat16 rounds as torch's .to(bfloat16)")


def check_auto_tokenizer(d, seed, transformers):
    """AutoTokenizer.from_pretrained loads an export made with --tokenizer_from, as it loads the source."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bos = "<|begin_of_text|>"
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[bos],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the cat sat on the mat, hello world"] * 10, trainer)
    src, out = os.path.join(d, "auto_src"), os.path.join(d, "auto_hf")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos).save_pretrained(src)
    rc, _, err = run("export_hf.py", seed, out, "--tokenizer_from", src)
    ids = lambda folder: transformers.AutoTokenizer.from_pretrained(folder)("hello world, the mat").input_ids
    got = ids(out) if rc == 0 else None
    check(got == ids(src), f"AutoTokenizer.from_pretrained(export --tokenizer_from): the source's ids {got} "
          f"{err}".strip())


def check_against_ref(d):
    """A model transformers saves (save_pretrained) converts to the bytes ref_llama3.py writes for it, untied
    and tied."""
    sys.path.insert(0, HERE)
    import ref_llama3
    for tied in (False, True):
        model, cfg = ref_llama3.make_model("small", "cpu", 1337, 0.02, tied=tied)
        saved = os.path.join(d, f"saved_tied{int(tied)}")
        model.save_pretrained(saved)
        rc, _, err = run("convert_hf.py", saved, saved + ".bin")
        ref = ref_llama3.seed_header(cfg).tobytes() + ref_llama3.seed_order(model, cfg, lambda p: p).tobytes()
        check(rc == 0 and read_bytes(saved + ".bin") == ref, f"save_pretrained -> convert: the bytes ref_llama3.py "
              f"writes for the model{' (tied)' if tied else ''} {err.strip()}".strip())


def all_checks(d, t):
    seed = check_round_trips(d, t)
    if not seed:
        check(False, "the other checks need that first conversion")
        return
    check_seed_first(d, hf_tensors(SMALL, 2))
    check_tied(d, t)
    check_rope_factor8(d, t)
    check_bf16(d, t, seed)
    check_llmc(d, t)
    check_convert_refusals(d, t)
    check_export_refusals(d, seed)
    check_unwritable(d, seed)
    check_tokenizer_from(d, seed)
    check_reader(d, t)
    try:
        import torch
        import transformers
    except ImportError:
        print("skipped: no torch/transformers (from_pretrained on the exported folder, the config round "
              "trip, bf16 against torch, AutoTokenizer on an export with --tokenizer_from, save_pretrained "
              "against ref_llama3.py)")
        return
    try:
        check_transformers(d, t, torch, transformers)
        check_auto_tokenizer(d, seed, transformers)
        check_against_ref(d)
    except Exception as e:  # an earlier failure left a file out: one failure, not a traceback
        check(False, f"the torch/transformers checks stopped: {e!r}")


def main():
    sys.stdout.reconfigure(line_buffering=True)  # in order with the subprocesses' and transformers' stderr
    check_missing_numpy()
    if MISSING:
        print(f"skipped: the conversion checks of scripts/test_hf_convert.py need {MISSING} "
              "(pip install -r requirements.txt)")
    else:
        with tempfile.TemporaryDirectory() as d:
            all_checks(d, hf_tensors(SMALL, 1))
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    sys.exit(0 if results and all(results) else 1)


if __name__ == "__main__":
    main()
