#!/usr/bin/env python3
"""Tokenize Tiny Shakespeare with the LLaMA-3 tokenizer into llm.c-format token files.

The text is split into sections on blank lines ("\\n\\n"); each section gets a
<|begin_of_text|> (BOS, id 128000) in front and is encoded as ordinary text (no
special tokens recognised), keeping its trailing "\\n\\n" as llm.c's
dev/data/tinyshakespeare.py does. The first 32768 tokens are the val split,
the rest are train.

Output (in --out_dir): tiny_shakespeare_val.bin and tiny_shakespeare_train.bin.
Each file: a header of 256 little-endian int32 ([0]=20240801 magic,
[1]=7 version, [2]=number of tokens, rest 0), then the tokens as
little-endian uint32.

Needs only tiktoken and Meta's tokenizer.model (pip install tiktoken llama-models).
"""
import argparse, hashlib, importlib.util, os, struct, sys, urllib.request
from pathlib import Path

import tiktoken
from tiktoken.load import load_tiktoken_bpe

from safe_write import write_atomic

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TOKENIZER_SHA256 = "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55"
PAT_STR = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
NUM_SPECIAL = 256
NAMED_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                 "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                 "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                 "<|python_tag|>", "<|image|>"]
MAGIC, VERSION, VAL_TOKENS = 20240801, 7, 32768


def llama3_encoding(path):
    """The same tiktoken Encoding Meta's llama3 Tokenizer builds (vocab 128256)."""
    ranks = load_tiktoken_bpe(str(path), expected_hash=TOKENIZER_SHA256)
    names = NAMED_SPECIAL + [f"<|reserved_special_token_{i}|>" for i in range(2, 2 + NUM_SPECIAL - len(NAMED_SPECIAL))]
    special = {name: len(ranks) + i for i, name in enumerate(names)}
    return tiktoken.Encoding(name="llama3", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=special)


def default_tokenizer_path():
    spec = importlib.util.find_spec("llama_models")  # locates the package without importing it
    path = spec and Path(spec.origin).parent / "llama3" / "tokenizer.model"
    if not path or not path.exists():
        sys.exit("tokenizer.model not found: `pip install llama-models` or pass --tokenizer PATH")
    return path


def write_datafile(filename, tokens, inputs):
    header = struct.pack("<256i", MAGIC, VERSION, len(tokens), *([0] * 253))
    write_atomic(filename, [header, struct.pack(f"<{len(tokens)}I", *tokens)], inputs)
    print(f"wrote {len(tokens):,} tokens to {filename} ({1024 + 4 * len(tokens):,} bytes)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", help="local text file (default: download tiny shakespeare)")
    ap.add_argument("--tokenizer", help="LLaMA-3 tokenizer.model (default: from the llama_models package)")
    ap.add_argument("--out_dir", default="data")
    args = ap.parse_args()

    raw = Path(args.text).read_bytes() if args.text else urllib.request.urlopen(URL, timeout=60).read()
    print(f"text: {len(raw):,} bytes, sha256 {hashlib.sha256(raw).hexdigest()}")
    enc = llama3_encoding(args.tokenizer or default_tokenizer_path())
    bos = enc.encode_single_token("<|begin_of_text|>")
    assert bos == 128000 and enc.n_vocab == 128256

    sections = raw.decode("utf-8").split("\n\n")
    tokens = []
    for i, s in enumerate(sections):
        tokens.append(bos)
        tokens.extend(enc.encode_ordinary(s + "\n\n" if i < len(sections) - 1 else s))
    print(f"{len(sections):,} sections, {len(tokens):,} tokens, max token id {max(tokens)}")

    os.makedirs(args.out_dir, exist_ok=True)
    inputs = [p for p in (args.text, args.tokenizer) if p]
    write_datafile(os.path.join(args.out_dir, "tiny_shakespeare_val.bin"), tokens[:VAL_TOKENS], inputs)
    write_datafile(os.path.join(args.out_dir, "tiny_shakespeare_train.bin"), tokens[VAL_TOKENS:], inputs)


if __name__ == "__main__":
    main()
