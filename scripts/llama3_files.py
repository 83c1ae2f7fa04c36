"""The trainer's model files and Hugging Face's safetensors files in numpy, no torch: what convert_hf.py
and export_hf.py share. The model header and its checks as llama3.h makes them (config_check,
kernel_limits_check), the tensor order of the seed format and of llm.c's (dev/FORMATS.md sections 1 and 2),
the q/k row order, bf16 bits, a reader of HF's JSON files, and a safetensors reader and writer that take
fp32, fp16 and bf16 (safetensors.numpy cannot hold bf16)."""
import json
import math
import struct
from dataclasses import dataclass

import numpy as np

MODEL_MAGIC = 20240803
SEED_HEADER_BYTES, LLMC_HEADER_BYTES = 1024, 2048
# The llama3 RoPE scaling constants llama3.h's rope_inv_freq hardcodes (use_scaled_rope 1); the factor is the
# header's rope_factor (32 in Llama-3.2, 8 in Llama-3.1).
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA3_2_ROPE_FACTOR = 32.0  # a seed header's slot 17 when it holds 0
LLMC_ROPE_FACTOR = 8.0  # llm.c's: its header has no field, its trainers hardcode Llama-3.1's 8 (llama3.h's too)
FLASH_HEAD_DIMS = (32, 64, 128)  # kernel_limits_check: the head sizes flash attention takes
MAX_N_EMBD = 8192  # LLAMA3_MAX_N_EMBD: the RMSNorm kernels' widest row
MAX_FFN = 1 << 20  # LLAMA3_MAX_FFN
REAL_VOCAB, BOS_ID, EOS_ID = 128256, 128000, 128001  # LLaMA 3's tokenizer


@dataclass
class Config:
    """llama3.h's Llama3Config (ffn_hidden derived)."""
    max_seq_len: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    ffn_dim_multiplier: float
    multiple_of: int
    norm_eps: float
    rope_theta: float
    use_scaled_rope: int
    tied_embeddings: int = 0  # 1: wte is also lm_head, which the seed file then lacks (llm.c's: always 0)
    rope_factor: float = LLAMA3_2_ROPE_FACTOR  # llama3 scaling's factor (use_scaled_rope 1)

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def ffn_hidden(self):
        return ffn_hidden_dim(self.n_embd, self.ffn_dim_multiplier, self.multiple_of)

    def describe(self):
        return (f"vocab {self.vocab_size}, {self.n_layer} layers, n_embd {self.n_embd}, {self.n_head} heads "
                f"({self.n_kv_head} kv) of {self.head_dim}, ffn {self.ffn_hidden} (ffn_dim_multiplier "
                f"{f32_text(self.ffn_dim_multiplier)}, multiple_of {self.multiple_of}), max_seq_len "
                f"{self.max_seq_len}, norm_eps {f32_text(self.norm_eps)}, rope_theta "
                f"{f32_text(self.rope_theta)}, scaled rope {self.use_scaled_rope} (factor "
                f"{f32_text(self.rope_factor)}), tied embeddings "
                f"{self.tied_embeddings}")


def f32_text(x):
    """The shortest decimal that reads back as the same float32 (1e-05, not 9.99999974738e-06)."""
    return str(np.float32(x))


def ffn_hidden_dim(n_embd, multiplier, multiple_of):
    """llama3.h's ffn_hidden_dim: 2*(4C)/3, times the multiplier as a float32 product, truncated, rounded up
    to multiple_of; -1 when the product is outside [1, 2^20]."""
    scaled = np.float32(multiplier) * np.float32(2 * (4 * n_embd) // 3)
    if not (1.0 <= scaled <= MAX_FFN):
        return -1
    hidden = int(scaled)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def config_problem(c, source):
    """llama3.h's config_check: what is wrong with the config read from `source`, or None."""
    ints = [("max_seq_len", c.max_seq_len, 1, 1 << 24), ("vocab_size", c.vocab_size, 8, 1 << 24),
            ("n_layer", c.n_layer, 1, 1024), ("n_head", c.n_head, 1, 1024),
            ("n_kv_head", c.n_kv_head, 1, 1024), ("n_embd", c.n_embd, 8, 1 << 20),
            ("multiple_of", c.multiple_of, 1, 1 << 20), ("use_scaled_rope", c.use_scaled_rope, 0, 1),
            ("tied_embeddings", c.tied_embeddings, 0, 1)]
    for name, value, lo, hi in ints:
        if not lo <= value <= hi:
            return f"{source}: {name} {value} is out of range [{lo}, {hi}]"
    floats = [("ffn_dim_multiplier", c.ffn_dim_multiplier, 1e-2, 64.0), ("norm_eps", c.norm_eps, 1e-12, 1.0),
              ("rope_theta", c.rope_theta, 1.0, 1e12), ("rope_factor", c.rope_factor, 1.0, 1024.0)]
    for name, value, lo, hi in floats:
        if not lo <= float(np.float32(value)) <= hi:  # NaN fails too
            return f"{source}: {name} {f32_text(value)} is out of range [{lo:g}, {hi:g}]"
    if not 1 <= c.ffn_hidden <= MAX_FFN:
        return (f"{source}: ffn_dim_multiplier {f32_text(c.ffn_dim_multiplier)} with n_embd {c.n_embd} "
                f"gives an FFN width out of range [1, {MAX_FFN}]")
    if c.n_embd % c.n_head or c.n_head % c.n_kv_head:
        return f"{source}: n_embd {c.n_embd}, n_head {c.n_head}, n_kv_head {c.n_kv_head} do not divide evenly"
    if any(x % 8 for x in (c.n_embd, c.ffn_hidden, c.vocab_size, c.head_dim)):
        return (f"{source}: n_embd {c.n_embd}, ffn_hidden {c.ffn_hidden}, vocab_size {c.vocab_size} and "
                f"head_dim {c.head_dim} must be multiples of 8")
    return None


def kernel_problem(c, source):
    """llama3.h's kernel_limits_check with flash attention on (the trainer's default), or None."""
    if c.n_embd > MAX_N_EMBD:
        return f"{source}: n_embd {c.n_embd} is more than the {MAX_N_EMBD} the trainer's RMSNorm kernels take"
    if c.head_dim not in FLASH_HEAD_DIMS:
        return f"{source}: head_dim {c.head_dim}: the trainer's flash attention takes head_dim 32, 64 or 128"
    return None


# ---- the trainer's model files ----

def seed_header(c):
    """The 1024-byte seed header, as llama3.h's seed_header_write and ref_llama3.py's seed_header write it."""
    ints = np.zeros(256, dtype="<i4")
    ints[:8] = [MODEL_MAGIC, 3, c.max_seq_len, c.vocab_size, c.n_layer, c.n_head, c.n_kv_head, c.n_embd]
    ints[8:12] = np.array([c.ffn_dim_multiplier, 0, c.norm_eps, c.rope_theta], dtype="<f4").view("<i4")
    ints[9] = c.multiple_of
    ints[12:16] = [c.use_scaled_rope, 4, 3, 2]  # use_scaled_rope, max_gen_batch_size, version major, minor
    ints[16] = c.tied_embeddings
    ints[17] = np.array([c.rope_factor], dtype="<f4").view("<i4")[0]
    return ints


def seed_header_config(h):
    """The config a seed header holds (h: its first 1024 bytes)."""
    i, f = np.frombuffer(h[:72], "<i4"), np.frombuffer(h[:72], "<f4")
    return Config(int(i[2]), int(i[3]), int(i[4]), int(i[5]), int(i[6]), int(i[7]), float(f[8]), int(i[9]),
                  float(f[10]), float(f[11]), int(i[12]), int(i[16]), float(f[17]) or LLAMA3_2_ROPE_FACTOR)


def llmc_header_config(h):
    """The config an llm.c llama3 header holds (h: its 2048 bytes): 256 int32 then 256 float32."""
    i, f = np.frombuffer(h[:64], "<i4"), np.frombuffer(h[1024:1036], "<f4")
    return Config(int(i[2]), int(i[3]), int(i[4]), int(i[5]), int(i[6]), int(i[7]), float(f[0]), int(i[8]),
                  float(f[1]), float(f[2]), int(i[9]), rope_factor=LLMC_ROPE_FACTOR)


def seed_layout(c):
    """(name, shape) of the seed format's tensors in file order; stacked tensors hold all layers; no lm_head
    when tied."""
    L, C, V, F = c.n_layer, c.n_embd, c.vocab_size, c.ffn_hidden
    qkv = C + 2 * c.n_kv_head * c.head_dim
    head = [] if c.tied_embeddings else [("lm_head", (V, C))]
    return [("wte", (V, C)), ("attn_norm", (L, C)), ("qkv", (L, qkv, C)), ("attn_out", (L, C, C)),
            ("ffn_norm", (L, C)), ("gate", (L, F, C)), ("up", (L, F, C)), ("down", (L, C, F)),
            ("final_norm", (C,)), *head]


def llmc_layout(c):
    """(name, shape) of llm.c's llama3 tensors in file order; names ending in "bias" hold zeros."""
    L, C, V, F = c.n_layer, c.n_embd, c.vocab_size, c.ffn_hidden
    qkv = C + 2 * c.n_kv_head * c.head_dim
    return [("wte", (V, C)), ("lm_head", (V, C)), ("attn_norm", (L, C)), ("ln1 bias", (L, C)),
            ("qkv", (L, qkv, C)), ("qkv bias", (L, qkv)), ("attn_out", (L, C, C)), ("attn proj bias", (L, C)),
            ("ffn_norm", (L, C)), ("ln2 bias", (L, C)), ("gate_up", (L, 2 * F, C)), ("fc bias", (L, 2 * F)),
            ("down", (L, C, F)), ("fc proj bias", (L, C)), ("final_norm", (C,)), ("lnf bias", (C,))]


def layout_bytes(layout, itemsize):
    return sum(math.prod(shape) for _, shape in layout) * itemsize


# ---- q/k row order and bf16 ----

def to_meta_rows(w, n_heads):
    """HF rotates halves (i, i+D/2) of each head; the trainer's files rotate pairs (2i, 2i+1):
    Meta row h*D + 2i + j is HF row h*D + j*D/2 + i."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


def to_hf_rows(w, n_heads):
    """The inverse of to_meta_rows."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


def bf16_to_f32(bits):
    """bf16 bit patterns (uint16) to float32, exactly: they are float32's high 16 bits."""
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """float32 to bf16 bit patterns (uint16), rounded to nearest even as torch rounds; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    return np.where(np.isnan(x), (u >> 16) | 0x40, rounded).astype("<u2")


# ---- Hugging Face's files ----

def read_json(path):
    """A JSON file holding one object (config.json, an index), or exits naming the file."""
    try:
        with open(path) as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {path}: cannot read: {e}")
    if not isinstance(obj, dict):
        raise SystemExit(f"error: {path}: not a JSON object")
    return obj


# ---- safetensors ----
# An 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__"},
# then the data; offsets count from the end of the header.

ST_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}  # the ones read; BF16 as its bits


@dataclass
class StTensor:
    path: str
    dtype: str  # safetensors' name: F32, BF16, ...
    shape: tuple
    offset: int  # of its first byte in the file


def safetensors_index(path):
    """name -> StTensor of a safetensors file, each entry checked against the file size (exits if bad)."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        n = struct.unpack("<Q", f.read(8))[0] if size >= 8 else -1
        if not 2 <= n <= size - 8:
            raise SystemExit(f"error: {path}: not a safetensors file (header length {n}, file {size} bytes)")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise SystemExit(f"error: {path}: safetensors header is not JSON: {e}")
    if not isinstance(header, dict):
        raise SystemExit(f"error: {path}: safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        try:
            dtype, (begin, end) = str(e["dtype"]), (int(x) for x in e["data_offsets"])
            shape = tuple(int(x) for x in e["shape"])
        except (KeyError, TypeError, ValueError):
            raise SystemExit(f"error: {path}: tensor {name}: no valid dtype, shape and data_offsets")
        itemsize = np.dtype(ST_DTYPES[dtype]).itemsize if dtype in ST_DTYPES else None
        if not 0 <= begin <= end <= size - 8 - n or (itemsize and end - begin != math.prod(shape) * itemsize):
            raise SystemExit(f"error: {path}: tensor {name}: data_offsets {begin}..{end} do not fit its "
                             f"shape {list(shape)} or the file's {size} bytes")
        out[name] = StTensor(path, dtype, shape, 8 + n + begin)
    return out


def read_f32(t):
    """The tensor as float32 (fp16 and bf16 widened, exactly)."""
    a = np.fromfile(t.path, dtype=ST_DTYPES[t.dtype], count=math.prod(t.shape), offset=t.offset)
    a = bf16_to_f32(a) if t.dtype == "BF16" else a.astype(np.float32)
    return a.reshape(t.shape)


def safetensors_chunks(entries, dtype, metadata):
    """A safetensors file as chunks for write_atomic. entries: name -> (shape, produce), produce() giving the
    float32 tensor when its turn comes; each is written as `dtype` ("float32" or "bfloat16")."""
    st_dtype, itemsize = {"float32": ("F32", 4), "bfloat16": ("BF16", 2)}[dtype]
    header, offset = {"__metadata__": metadata}, 0
    for name, (shape, _) in entries.items():
        end = offset + math.prod(shape) * itemsize
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data 8-byte aligned, as safetensors pads
    yield struct.pack("<Q", len(text)) + text
    for name, (shape, produce) in entries.items():
        a = produce()
        assert a.shape == tuple(shape), f"{name}: {a.shape} != {shape}"
        yield f32_to_bf16(a) if dtype == "bfloat16" else np.ascontiguousarray(a, dtype="<f4")
