#!/usr/bin/env python3
"""Tokenize text with the LLaMA-3 tokenizer into llm.c-format token files: Tiny Shakespeare by
default, or your own text with --input; and the tokenizer's id-to-bytes table, for printing tokens.

  scripts/prepare_data.py                      # Tiny Shakespeare -> data/tiny_shakespeare_{val,train}.bin
                                               #   and data/llama3_vocab.bin
  scripts/prepare_data.py --text input.txt --tokenizer tokenizer.model
  scripts/prepare_data.py --input my_texts/ --tokenizer Llama-3.2-1B/tokenizer.json
  scripts/prepare_data.py --input corpus.jsonl --text_field content \\
      --tokenizer Llama-3.2-1B/tokenizer.json --name corpus --val_tokens 100000
  scripts/prepare_data.py --input a.txt b.txt --input c.jsonl --name mine
  scripts/prepare_data.py --input a.txt --tokenizer tokenizer.json --vocab_out data/mine_vocab.bin
  scripts/prepare_data.py --input notes.txt --tokenizer tokenizer.json --val_tokens 0   # no val split
  scripts/prepare_data.py --input corpus.jsonl --tokenizer tokenizer.json --shard_tokens 100000000
  ./train_llama3 --input_bin data/mine_train.bin
  ./train_llama3 --input_bin 'data/corpus_train_*.bin' --val_bin data/corpus_val.bin
  scripts/prepare_data.py --hellaswag hellaswag_val.jsonl --tokenizer tokenizer.json   # data/hellaswag_eval.bin

Tiny Shakespeare (no --input): the text (downloaded, or --text) is split into sections on blank
lines ("\\n\\n"); each section gets a <|begin_of_text|> (BOS, id 128000) in front and is encoded as
ordinary text (no special tokens recognised), keeping its trailing "\\n\\n" as llm.c's
dev/data/tinyshakespeare.py does. The first 32768 tokens are the val split, the rest are train:
tiny_shakespeare_val.bin and tiny_shakespeare_train.bin in --out_dir.

Your own text (--input PATH..., repeatable): a file is one document, except a .jsonl file, whose
every non-blank line is a JSON object with the document in --text_field (default "text"), and a
.parquet file (FineWeb's format; needs pyarrow), whose every row holds one in that column; a folder
gives every file in it and its subfolders, sorted by path, names starting with "." skipped. Each
document gets BOS in front and is encoded as ordinary text (by --workers of tiktoken's threads, in
order, with a progress line: the share of the input, tokens per second, the time left); empty documents
are skipped (counted).
The val split is the first documents: up to the document boundary nearest to the target size
(--val_tokens, or --val_fraction of all tokens, default 0.005) when that boundary lies within a factor
of 2 of the target, else at exactly the target, inside a document; --val_tokens 0 makes no val split
(every token is train). Each split must hold at least 257 tokens (one batch of the trainer's default
B=4 x T=64, plus the last target), so a val split needs 514 tokens in all. Output in --out_dir (made
when missing, in a folder that exists: a missing parent is refused before any work, as the trainer's
--checkpoint_dir): NAME_val.bin (not with --val_tokens 0) and NAME_train.bin (--name; default: the one
input's name, or "data"); with --shard_tokens N the train split instead as shards of N tokens each (the
last one the rest), NAME_train_000000.bin, NAME_train_000001.bin, ..., which the trainer's --input_bin
takes as a glob ('NAME_train_*.bin') and reads in an order drawn per epoch.

--tokenizer (default: tokenizer.model of the llama-models package) is told apart by its content:
a tiktoken tokenizer.model ("base64token rank" lines; Meta's file is recognised by its sha256) or
an HF tokenizer.json (a byte-level BPE: model.vocab's keys are bytes through GPT-2's byte-to-unicode
table, the ids are the ranks, added_tokens the special tokens, the pre_tokenizer a Split regex then
ByteLevel). Either way the result must be the LLaMA-3 vocabulary: n_vocab 128256, BOS 128000 and
LLaMA-3's pre-tokenizer regex. A Hugging Face download of LLaMA 3.2-1B has Llama-3.2-1B/tokenizer.json
(and Llama-3.2-1B/original/tokenizer.model, unless it excludes original/*, as the README's does); both
give the same tokens.

Each file: a header of 256 little-endian int32 ([0]=20240801 magic, [1]=7 version, [2]=number of
tokens, rest 0), then the tokens as little-endian uint32; written whole (safe_write.write_atomic),
never over an input. Needs tiktoken and numpy (pip install -r requirements.txt), and for the default
tokenizer llama-models (pip install -r requirements-data.txt).

A multiple-choice eval set (--hellaswag JSONL: HellaSwag's validation file, hellaswag_val.jsonl of
github.com/rowanz/hellaswag, one {"ctx": ..., "endings": [4 strings], "label": N} per line) becomes
OUT_DIR/NAME_eval.bin (--name; default hellaswag) for the trainer's --eval_file: per example BOS and
the context's tokens, each ending encoded with a space in front (as llm.c's hellaswag.py renders it),
the label. The file: 256 little-endian int32 ([0]=20241206 magic, [1]=1 version, [2]=examples,
[3]=endings per example, [4]=tokens), per example endings+2 int32 (label, context length, each
ending's length), then the tokens as uint32, example by example (context, then the endings).

The vocabulary table (--vocab_out PATH; Tiny Shakespeare writes OUT_DIR/llama3_vocab.bin unless
given another path), for the trainer to print token ids as text: a header of 256 little-endian
int32 ([0]=20241202 magic, [1]=1 version, [2]=n_tokens, [3]=total bytes of all tokens, rest 0),
then n_tokens+1 little-endian uint32 offsets (offset[0]=0, non-decreasing, offset[n_tokens]=total),
then the bytes. Token i is bytes[offset[i]:offset[i+1]]: its raw BPE bytes (a UTF-8 character may
span tokens), or for a special token its name ("<|begin_of_text|>"). Every id below n_vocab must
be a token. data/llama3_vocab.bin is made with Meta's tokenizer.model by the default command.

Every failure (a missing package, a download that fails, an input that cannot be read or is not what it
should be, an output folder that cannot be made, too little text) stops with one line "error: ..."
naming the file or flag, exit status 1; a bad flag stops with one line naming it, exit 2.
"""
import base64, bisect, hashlib, http.client, importlib.util, json, os, struct, sys, time, urllib.request
from pathlib import Path

import cli

VOCAB_MAGIC, VOCAB_VERSION, VOCAB_NAME = 20241202, 1, "llama3_vocab.bin"


MIN_SPLIT_TOKENS = 4 * 64 + 1  # one batch of the trainer's default B=4 x T=64, plus the last target


def parse_args(argv):
    what, examples = __doc__.split("\n\n")[:2]  # (the rest of the docstring: the splits, the tokenizers, the files)
    ap = cli.ArgumentParser(__file__, description=what, epilog=f"examples:\n{examples}")
    ap.add_argument("--text", help="local text file for Tiny Shakespeare (default: download it)")
    ap.add_argument("--input", nargs="+", action="extend", metavar="PATH",
                    help="your own text: files, folders of them, .jsonl or .parquet files (instead of Tiny "
                    "Shakespeare)")
    ap.add_argument("--text_field", help="the document's field in a .jsonl line or column of a .parquet file "
                    "(default: text)")
    ap.add_argument("--name", help="with --input: output names NAME_{val,train}.bin")
    split = ap.add_mutually_exclusive_group()
    split.add_argument("--val_fraction", type=float,
                       help="with --input: val's share of the tokens (default 0.005)")
    split.add_argument("--val_tokens", type=int,
                       help="with --input: val's size in tokens; 0: no val split, NAME_train.bin only")
    ap.add_argument("--hellaswag", metavar="JSONL",
                    help="write HellaSwag's validation JSONL as an eval file, OUT_DIR/NAME_eval.bin (--eval_file)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, metavar="N",
                    help="threads that encode the text (default: this machine's cores, %(default)s)")
    ap.add_argument("--shard_tokens", type=int, metavar="N",
                    help="with --input: the train split as shards of N tokens, NAME_train_000000.bin, ...")
    ap.add_argument("--tokenizer",
                    help="LLaMA-3 tokenizer.model or tokenizer.json (default: Meta's, from the package "
                    "llama-models: pip install -r requirements-data.txt)")
    ap.add_argument("--out_dir", default="data",
                    help="folder of the token files, made when missing in a folder that exists (default: data)")
    ap.add_argument("--vocab_out", metavar="PATH", help="also write the tokenizer's id-to-bytes table here "
                    f"(Tiny Shakespeare's default: OUT_DIR/{VOCAB_NAME})")
    args = ap.parse_args(argv)
    own = [f for f in ("text_field", "name", "val_fraction", "val_tokens", "shard_tokens") if getattr(args, f) is not None]
    if args.hellaswag:
        own = [f for f in own if f != "name"]
    if args.input is None and own:
        ap.error(f"--{own[0]} applies to --input only")
    if args.input is not None and args.text:
        ap.error("--text (Tiny Shakespeare) and --input exclude each other")
    if args.hellaswag and (args.input is not None or args.text):
        ap.error("--hellaswag writes an eval file alone: not with --input or --text")
    if args.val_fraction is not None and not 0 < args.val_fraction < 1:
        ap.error(f"--val_fraction {args.val_fraction}: not in (0, 1)")
    if args.val_tokens is not None and args.val_tokens < 0:
        ap.error(f"--val_tokens {args.val_tokens}: negative")
    if args.workers < 1:
        ap.error(f"--workers {args.workers}: at least 1")
    if args.shard_tokens is not None and not MIN_SPLIT_TOKENS <= args.shard_tokens < 2**31:
        ap.error(f"--shard_tokens {args.shard_tokens}: not in [{MIN_SPLIT_TOKENS}, 2^31) (a shard holds one batch of "
                 "B=4 x T=64 at least, and its count fits the header's int32)")
    args.text_field = args.text_field or "text"
    args.val_fraction = args.val_fraction or 0.005
    return args


if __name__ == "__main__":
    ARGS = parse_args(None)  # (before numpy's and tiktoken's imports: --help and a bad flag on any machine)
try:
    import numpy as np
    import tiktoken
except ModuleNotFoundError as e:
    cli.missing_package(__file__, e)

from safe_write import check_new_folder, make_folder, refuse_input, write_atomic

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TOKENIZER_SHA256 = "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55"
PAT_STR = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
NUM_SPECIAL = 256
NAMED_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                 "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                 "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                 "<|python_tag|>", "<|image|>"]
BOS_NAME, LLAMA3_BOS, LLAMA3_VOCAB = "<|begin_of_text|>", 128000, 128256
MAGIC, VERSION, VAL_TOKENS = 20240801, 7, 32768
ONE_BATCH = "tokens (one batch of the trainer's default B=4 x T=64, plus the last target)"
CHUNK_CHARS = 1 << 20  # a text file is read and encoded in pieces of about this many characters
BLOCK_TOKENS = 1 << 20  # tokens are moved from a Python list into a numpy block every this many
BATCH_CHARS = 1 << 24  # text encoded in one batch of tiktoken's threads


def fail(what):
    """Every failure: one line "error: ...", exit status 1."""
    sys.exit(f"error: {what}")


# ---- tokenizers ----


def llama3_specials(n_ranks):
    """Meta's special tokens, numbered after the ranks as its llama3 Tokenizer does."""
    reserved = range(2, 2 + NUM_SPECIAL - len(NAMED_SPECIAL))
    names = NAMED_SPECIAL + [f"<|reserved_special_token_{i}|>" for i in reserved]
    return {name: n_ranks + i for i, name in enumerate(names)}


def make_encoding(path, ranks, pat_str, special):
    """The tiktoken Encoding, once the ranks can encode any text (every single byte a token)."""
    if not ranks:
        fail(f"{path}: no tokens in the vocabulary")
    if len(set(ranks.values())) != len(ranks):
        fail(f"{path}: two vocabulary entries share an id")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        fail(f"{path}: not a byte-level BPE: {len(missing)} single bytes are not tokens "
             f"(0x{missing[0]:02x} ...)")
    try:
        return tiktoken.Encoding(name="llama3", pat_str=pat_str, mergeable_ranks=ranks, special_tokens=special)
    except ValueError as e:  # the pre-tokenizer regex does not compile
        fail(f"{path}: tiktoken cannot use it: {e}")


def tiktoken_ranks(path, data):
    """{token bytes: rank} from a tokenizer.model's "base64token rank" lines."""
    ranks = {}
    for n, line in enumerate(data.splitlines(), 1):
        if line:
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except ValueError:  # binascii.Error is a ValueError too
                fail(f"{path}:{n}: neither a tokenizer.model line ('base64token rank') "
                     "nor a tokenizer.json")
    return ranks


def gpt2_unicode_to_byte():
    """The inverse of GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68
    bytes for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + i): b for i, b in enumerate(others)})
    return table


def hf_split_pattern(pre, refuse):
    """The regex of a pre_tokenizer that is a Split (regex, isolated) followed by ByteLevel."""
    steps = pre.get("pretokenizers", []) if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    steps = [s for s in steps if isinstance(s, dict)]
    splits = [s for s in steps if s.get("type") == "Split" and "Regex" in (s.get("pattern") or {})]
    byte_level = [s for s in steps if s.get("type") == "ByteLevel"]
    if len(splits) != 1 or not byte_level:
        refuse(f"its pre_tokenizer is not a Split regex and ByteLevel ({[s.get('type') for s in steps]})")
    if byte_level[0].get("use_regex") or splits[0].get("behavior") != "Isolated" or splits[0].get("invert"):
        refuse("its pre_tokenizer's Split or ByteLevel settings differ from LLaMA-3's")
    return splits[0]["pattern"]["Regex"]


def hf_ranks(vocab, refuse):
    """{token bytes: id} from model.vocab, each key mapped back to bytes through GPT-2's table."""
    to_byte = gpt2_unicode_to_byte()
    ranks = {}
    for key, i in vocab.items():
        try:
            ranks[bytes(to_byte[c] for c in key)] = i
        except KeyError:
            refuse(f"vocabulary entry {key!r} has a character outside GPT-2's byte-to-unicode table")
        if not isinstance(i, int):
            refuse(f"vocabulary entry {key!r} has id {i!r}")
    return ranks


def hf_encoding(path, data):
    """The Encoding of an HF tokenizer.json holding a byte-level BPE (ranks = ids), as LLaMA-3's."""
    def refuse(why):
        fail(f"{path}: not a LLaMA-3 byte-level BPE tokenizer.json: {why}")
    try:
        tok = json.loads(data)
    except ValueError as e:
        fail(f"{path}: not valid JSON ({e})")
    model = tok.get("model") if isinstance(tok, dict) else None
    model = model if isinstance(model, dict) else {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        refuse(f"model.type is {model.get('type')!r}, not 'BPE' with a vocab")
    if tok.get("normalizer"):
        refuse(f"it has a normalizer ({str(tok['normalizer'])[:60]})")
    pat_str = hf_split_pattern(tok.get("pre_tokenizer"), refuse)
    ranks = hf_ranks(model["vocab"], refuse)
    ids = set(ranks.values())
    special = {}
    for t in tok.get("added_tokens", []):
        if not (isinstance(t, dict) and isinstance(t.get("content"), str) and isinstance(t.get("id"), int)):
            refuse(f"added token {t!r} has no content and id")
        if t["content"] in model["vocab"]:
            continue  # an ordinary token listed again
        if t["id"] in ids:
            refuse(f"added token {t['content']!r} has id {t['id']}, which the vocabulary also uses")
        special[t["content"]] = t["id"]
    return make_encoding(path, ranks, pat_str, special)


def load_tokenizer(path):
    """(Encoding, what the file is) from a tiktoken tokenizer.model or an HF tokenizer.json."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        fail(f"--tokenizer {path}: no such file. The LLaMA-3 tokenizer comes with a Hugging Face download, as its "
             "tokenizer.json (hf download meta-llama/Llama-3.2-1B --local-dir Llama-3.2-1B --exclude \"original/*\": "
             "Llama-3.2-1B/tokenizer.json); without --tokenizer, Meta's tokenizer.model of the package llama-models")
    except OSError as e:
        fail(f"{path}: cannot read the tokenizer ({e.strerror})")
    if data.lstrip()[:1] == b"{":  # base64 has no "{": JSON
        return hf_encoding(path, data), "HF tokenizer.json"
    ranks = tiktoken_ranks(path, data)
    sha = hashlib.sha256(data).hexdigest()
    what = "Meta's LLaMA-3 tokenizer.model"
    if sha != TOKENIZER_SHA256:
        what = f"tokenizer.model, not Meta's (sha256 {sha})"
    return make_encoding(path, ranks, PAT_STR, llama3_specials(len(ranks))), what


def llama3_mismatch(enc):
    """Why enc is not the LLaMA-3 tokenizer ("" when it is)."""
    why = []
    if enc.n_vocab != LLAMA3_VOCAB:
        why.append(f"n_vocab {enc.n_vocab}, not {LLAMA3_VOCAB}")
    if enc._special_tokens.get(BOS_NAME) != LLAMA3_BOS:
        why.append(f"{BOS_NAME} is {enc._special_tokens.get(BOS_NAME)}, not {LLAMA3_BOS}")
    if enc._pat_str != PAT_STR:
        why.append("its pre-tokenizer regex is not LLaMA-3's")
    return "; ".join(why)


def default_tokenizer_path():
    """Meta's tokenizer.model as the package llama-models ships it (requirements-data.txt)."""
    spec = importlib.util.find_spec("llama_models")  # locates the package without importing it
    path = spec and Path(spec.origin).parent / "llama3" / "tokenizer.model"
    if not path or not path.exists():
        why = "not in it" if spec else "not installed"
        fail(f"no --tokenizer, and the default, Meta's tokenizer.model from the Python package llama-models, is "
             f"{why}: python3 -m pip install -r requirements-data.txt, or pass --tokenizer PATH (an HF "
             "download's tokenizer.json or original/tokenizer.model)")
    return path


# ---- documents ----


def input_files(paths):
    """Every file the --input paths name: a file as given, a folder's files sorted by path."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            found = walk_files(p)
            if not found:
                fail(f"{p}: no files in this folder")
            files += found
        elif os.path.exists(p):
            files.append(p)
        else:
            fail(f"{p}: no such file or folder")
    return files


def walk_files(folder):
    """The files under folder, sorted by path, names starting with "." (files and folders) skipped."""
    found = []
    for d, dirs, names in os.walk(folder):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        found += [os.path.join(d, f) for f in names if not f.startswith(".")]
    return sorted(found)


def last_cut(text, start):
    """The last index >= start just after a newline followed by an ASCII letter or digit, else 0."""
    i = text.rfind("\n", start, len(text) - 1)
    while i >= 0:
        if text[i + 1].isascii() and text[i + 1].isalnum():
            return i + 1
        i = text.rfind("\n", start, i)
    return 0


def text_chunks(path, size=CHUNK_CHARS):
    """A text file in pieces of about `size` characters, each cut after a newline that a letter or
    digit follows: no piece of LLaMA-3's pre-tokenizer spans such a point, so the tokens of the
    pieces are those of the whole text."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rest = ""
            while block := f.read(size):
                rest += block
                cut = last_cut(rest, max(0, len(rest) - len(block) - 1))
                if cut:
                    yield rest[:cut]
                    rest = rest[cut:]
            yield rest
    except UnicodeDecodeError as e:
        fail(f"{path}: not UTF-8 text ({e.reason} in a block read at byte {e.start})")
    except OSError as e:
        fail(f"{path}: cannot read ({e.strerror})")


def jsonl_documents(path, field):
    """The `field` of every non-blank line of a JSONL file, each one document (a list of one text)."""
    try:
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):
                try:
                    text = line.decode("utf-8")
                    if not text.strip():
                        continue
                    obj = json.loads(text)
                except ValueError as e:  # UnicodeDecodeError and JSONDecodeError both
                    fail(f"{path}:{n}: not a line of UTF-8 JSON ({e})")
                if not isinstance(obj, dict) or not isinstance(obj.get(field), str):
                    fail(f"{path}:{n}: no string field {field!r}")
                yield [obj[field]]
    except OSError as e:
        fail(f"{path}: cannot read ({e.strerror})")


def parquet_documents(path, field):
    """The `field` column of a parquet file (FineWeb's format), each row one document (a list of one
    text), read a row group at a time. Needs pyarrow."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ModuleNotFoundError:
        fail(f"{path}: reading parquet needs pyarrow (python3 -m pip install -r requirements.txt)")
    try:
        table = pyarrow.parquet.ParquetFile(path)
        schema = table.schema_arrow
        if field not in schema.names:
            fail(f"{path}: no column {field!r} (its columns: {', '.join(schema.names[:8])})")
        if not pyarrow.types.is_string(schema.field(field).type) and \
                not pyarrow.types.is_large_string(schema.field(field).type):
            fail(f"{path}: column {field!r} holds {schema.field(field).type}, not strings")
        row = 0
        for group in range(table.num_row_groups):
            for text in table.read_row_group(group, columns=[field]).column(0).to_pylist():
                row += 1
                if text is None:
                    fail(f"{path}: row {row}: {field!r} is null")
                yield [text]
    except (OSError, ValueError, pyarrow.ArrowException) as e:
        fail(f"{path}: not a parquet file that can be read ({str(e).splitlines()[0] if str(e) else type(e).__name__})")


def documents(files, field):
    """Every document as an iterable of its text pieces."""
    for path in files:
        if path.lower().endswith(".jsonl"):
            yield from jsonl_documents(path, field)
        elif path.lower().endswith(".parquet"):
            yield from parquet_documents(path, field)
        else:
            yield text_chunks(path)


# ---- token files ----


class Tokens:
    """uint32 tokens gathered in numpy blocks (a Python int costs 8-36 bytes, a token here 4)."""

    def __init__(self):
        self.blocks, self.pending, self.count = [], [], 0

    def extend(self, ids):
        self.pending.extend(ids)
        self.count += len(ids)
        if len(self.pending) >= BLOCK_TOKENS:
            self.blocks.append(np.array(self.pending, dtype="<u4"))
            self.pending = []

    def array(self):
        return np.concatenate(self.blocks + [np.array(self.pending, dtype="<u4")])


class Progress:
    """A line on stdout as the text is encoded: its share of the input bytes, the rate, the time left;
    redrawn in place at most every half second on a terminal, else a line every 30 s and at the end."""

    def __init__(self, total_bytes):
        self.total, self.done, self.start = max(total_bytes, 1), 0, time.monotonic()
        self.shown = self.start  # (the first line after the first interval, not at the first piece)
        self.tty = sys.stdout.isatty()

    def add(self, n_bytes, n_tokens, final=False):
        self.done = self.total if final else self.done + n_bytes  # (a JSONL's syntax is not encoded text)
        now = time.monotonic()
        if not final and now - self.shown < (0.5 if self.tty else 30):
            return
        self.shown, elapsed = now, max(now - self.start, 1e-9)
        share = min(self.done / self.total, 1.0)
        eta = elapsed / share - elapsed if share > 0 else 0
        line = (f"encoded {self.done / 1e6:,.1f} of {self.total / 1e6:,.1f} MB ({100 * share:.0f} %), "
                f"{n_tokens / elapsed / 1e6:.2f} M tokens/s, {elapsed:.0f} s, ETA {eta:.0f} s")
        print(("\r" + line + ("\n" if final else "")) if self.tty else line, end="" if self.tty else "\n", flush=True)


def encode_documents(enc, files, field, workers):
    """(tokens, document start offsets, documents, empty documents skipped): BOS before each. The text
    pieces are encoded BATCH_CHARS at a time by tiktoken's threads (`workers` of them), in order."""
    bos = enc.encode_single_token(BOS_NAME)
    tokens, starts = Tokens(), []
    progress = Progress(sum(os.path.getsize(f) for f in files))
    batch, batch_chars, current = [], 0, [None]  # (document number, piece); the document being appended

    def flush():
        for (doc, _), ids in zip(batch, enc.encode_ordinary_batch([p for _, p in batch], num_threads=workers)):
            if doc != current[0]:  # the first piece of the next document
                current[0] = doc
                starts.append(tokens.count)
            if ids and tokens.count == starts[-1]:
                tokens.extend([bos])
            tokens.extend(ids)
        progress.add(sum(len(p.encode("utf-8", "surrogatepass")) for _, p in batch), tokens.count)
        batch.clear()

    for number, doc in enumerate(documents(files, field)):
        batch.append((number, ""))  # (every document has a piece: an empty one is counted too)
        for piece in doc:
            batch.append((number, piece))
            batch_chars += len(piece)
            if batch_chars >= BATCH_CHARS:
                flush()
                batch_chars = 0
    flush()
    progress.add(0, tokens.count, final=True)
    # documents that gave no token started where the next one starts: drop them, counted as empty
    kept = [s for i, s in enumerate(starts) if (starts[i + 1] if i + 1 < len(starts) else tokens.count) > s]
    return tokens.array(), kept, len(kept), len(starts) - len(kept)


def val_split(starts, total, target):
    """Where val ends: the document boundary nearest to target if within a factor of 2, else target."""
    bounds = starts + [total]
    i = bisect.bisect_left(bounds, target)
    near = min(bounds[max(i - 1, 0):i + 1], key=lambda b: abs(b - target))
    return near if target / 2 <= near <= 2 * target else target


def write_datafile(filename, tokens, inputs):
    if len(tokens) >= 2**31:
        fail(f"{filename}: {len(tokens):,} tokens do not fit the header's int32 count")
    header = struct.pack("<256i", MAGIC, VERSION, len(tokens), *([0] * 253))
    write_atomic(filename, [header, np.ascontiguousarray(tokens, dtype="<u4")], inputs)
    print(f"wrote {len(tokens):,} tokens to {filename} ({1024 + 4 * len(tokens):,} bytes)")


def vocab_tokens(enc, path):
    """The bytes of every id 0..n_vocab-1: its BPE bytes, or a special token's name (tiktoken's)."""
    tokens = []
    for i in range(enc.n_vocab):
        try:
            tokens.append(enc.decode_single_token_bytes(i))
        except KeyError:
            fail(f"{path}: not written: id {i} is no token (the tokenizer's ids below {enc.n_vocab} have a gap)")
    return tokens


def write_vocab(path, enc, inputs):
    """The id-to-bytes table (format in the docstring), written whole."""
    tokens = vocab_tokens(enc, path)
    offsets = np.cumsum([0] + [len(t) for t in tokens], dtype=np.int64)
    if offsets[-1] >= 2**31:
        fail(f"{path}: {offsets[-1]:,} bytes of tokens do not fit the header's int32 total")
    header = struct.pack("<256i", VOCAB_MAGIC, VOCAB_VERSION, len(tokens), int(offsets[-1]), *([0] * 252))
    write_atomic(path, [header, offsets.astype("<u4"), b"".join(tokens)], inputs)
    print(f"wrote the table of {len(tokens):,} tokens to {path} ({os.path.getsize(path):,} bytes)")


def output_folders(args):
    """(folder, flag) of the outputs: --out_dir, and --vocab_out's folder when given."""
    return [(args.out_dir, "--out_dir")] + ([(os.path.dirname(args.vocab_out) or ".", "--vocab_out's folder")]
                                            if args.vocab_out else [])


def own_name(args):
    """--input's output name: --name, else the one input's name, else "data"."""
    return args.name or (Path(os.path.abspath(args.input[0])).stem if len(args.input) == 1 else "data")


def eval_path(args):
    return os.path.join(args.out_dir, f"{args.name or 'hellaswag'}_eval.bin")


def output_files(args):
    """The files this run writes (with --shard_tokens, its first train shard's name)."""
    if args.hellaswag:
        return [eval_path(args)]
    vocab = [args.vocab_out] if args.vocab_out else []
    if args.input is None:
        return [os.path.join(args.out_dir, f"tiny_shakespeare_{s}.bin") for s in ("val", "train")] + (
            vocab or [os.path.join(args.out_dir, VOCAB_NAME)])
    stem = os.path.join(args.out_dir, own_name(args))
    return [f"{stem}_val.bin", f"{stem}_train_000000.bin" if args.shard_tokens else f"{stem}_train.bin"] + vocab


def check_folders(args):
    """Before any work: each output folder exists, or can be made (its parent exists), and can be written,
    with no folder where a file of this run goes (safe_write's rules)."""
    files = output_files(args)
    for folder, flag in output_folders(args):
        here = [os.path.basename(f) for f in files
                if os.path.normpath(os.path.dirname(f) or ".") == os.path.normpath(folder)]
        check_new_folder(folder, flag, files=here)


def make_folders(args):
    """The output folders, made when the first file is about to be written."""
    for folder, flag in output_folders(args):
        make_folder(folder, flag)


# ---- main ----


def shakespeare_text(path):
    """The Tiny Shakespeare text: the file --text names, else downloaded."""
    try:
        raw = Path(path).read_bytes() if path else urllib.request.urlopen(URL, timeout=60).read()
    except (OSError, http.client.HTTPException) as e:  # urllib's URLError and timeouts are OSErrors
        fail(f"--text {path}: cannot read ({e.strerror})" if path else
             f"cannot download Tiny Shakespeare from {URL} ({getattr(e, 'reason', None) or e}): "
             "pass --text PATH with a copy of it")
    print(f"text: {len(raw):,} bytes, sha256 {hashlib.sha256(raw).hexdigest()}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"{path or URL}: not UTF-8 text ({e.reason} at byte {e.start})")


def shakespeare(args, enc, inputs):
    tokens = shakespeare_tokens(shakespeare_text(args.text), enc)
    sections = int((tokens == enc.encode_single_token(BOS_NAME)).sum())
    print(f"{sections:,} sections, {len(tokens):,} tokens, max token id {tokens.max()}")
    make_folders(args)
    write_datafile(os.path.join(args.out_dir, "tiny_shakespeare_val.bin"), tokens[:VAL_TOKENS], inputs)
    write_datafile(os.path.join(args.out_dir, "tiny_shakespeare_train.bin"), tokens[VAL_TOKENS:], inputs)
    write_vocab(args.vocab_out or os.path.join(args.out_dir, VOCAB_NAME), enc, inputs)


def shakespeare_tokens(text, enc):
    """BOS, then each blank-line-separated section with its trailing "\\n\\n", as ordinary text."""
    bos = enc.encode_single_token(BOS_NAME)
    sections = text.split("\n\n")
    tokens = []
    for i, s in enumerate(sections):
        tokens.append(bos)
        tokens.extend(enc.encode_ordinary(s + "\n\n" if i < len(sections) - 1 else s))
    return np.array(tokens, dtype="<u4")


def val_end(args, starts, total):
    """Where val ends (0: no val split, --val_tokens 0), once each split holds one batch at least."""
    if args.val_tokens == 0:
        if total < MIN_SPLIT_TOKENS:
            fail(f"too little text: {total:,} tokens, and the train split needs at least {MIN_SPLIT_TOKENS} "
                 f"{ONE_BATCH}: more text")
        return 0
    target = args.val_tokens or max(1, round(args.val_fraction * total))
    cut = val_split(starts, total, target)
    if min(cut, total - cut) < MIN_SPLIT_TOKENS:
        fail(f"too little text for a val split: val would get {cut:,} tokens and train {total - cut:,} of "
             f"{total:,}; each split needs at least {MIN_SPLIT_TOKENS} {ONE_BATCH}, {2 * MIN_SPLIT_TOKENS} "
             "in all: more text, another --val_fraction / --val_tokens, or --val_tokens 0 for no val split")
    where = "at a document boundary" if cut in starts else "inside a document"
    print(f"val: tokens [0, {cut:,}) (target {target:,}, cut {where})")
    return cut


def own_data(args, enc, inputs):
    files = input_files(args.input)
    name = own_name(args)
    val_out, train_out = (os.path.join(args.out_dir, f"{name}_{split}.bin") for split in ("val", "train"))
    for out in (train_out, val_out, args.vocab_out):  # before any work (write_atomic checks again)
        if out:
            refuse_input(out, files + inputs)
    shard_stem = os.path.join(args.out_dir, f"{name}_train_")
    if args.shard_tokens:  # (a shard's name: the stem and 6 digits)
        for f in files + inputs:
            base = os.path.basename(f)
            if os.path.abspath(f).startswith(os.path.abspath(shard_stem)) and base.endswith(".bin"):
                fail(f"--input {f}: would be overwritten by a train shard {shard_stem}NNNNNN.bin: another --name or --out_dir")
    tokens, starts, n_docs, empty = encode_documents(enc, files, args.text_field, args.workers)
    if n_docs == 0:
        fail(f"no text: {len(files)} input files hold {empty} documents, all empty")
    print(f"{n_docs:,} documents from {len(files):,} files ({empty:,} empty, skipped), "
          f"{len(tokens):,} tokens, max token id {tokens.max()}")
    cut = val_end(args, starts, len(tokens))
    make_folders(args)
    if cut:
        write_datafile(val_out, tokens[:cut], files + inputs)
    else:
        older = " (the one there, an older file, is left as it was)" if os.path.exists(val_out) else ""
        print(f"no val split (--val_tokens 0): every token goes to train; {val_out} not written{older}")
    if not args.shard_tokens:
        write_datafile(train_out, tokens[cut:], files + inputs)
    else:
        write_shards(shard_stem, tokens[cut:], args.shard_tokens, files + inputs)
    if args.vocab_out:
        write_vocab(args.vocab_out, enc, files + inputs)


def write_shards(stem, tokens, shard_tokens, inputs):
    """The train split as files of shard_tokens tokens each (the last one the rest: merged into the one
    before when shorter than a batch), STEM000000.bin, STEM000001.bin, ..."""
    starts = list(range(0, len(tokens), shard_tokens))
    if len(starts) > 1 and len(tokens) - starts[-1] < MIN_SPLIT_TOKENS:
        starts.pop()
    if len(starts) > 1_000_000:
        fail(f"--shard_tokens {shard_tokens}: {len(starts):,} shards, more than the 6 digits of their names")
    for i, begin in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(tokens)
        write_datafile(f"{stem}{i:06d}.bin", tokens[begin:end], inputs)
    print(f"{len(starts)} train shards: --input_bin '{stem}*.bin'")


EVAL_MAGIC = 20241206


def hellaswag_examples(path):
    """[(ctx, endings, label)] of a HellaSwag JSONL; a line without them stops with its number."""
    examples = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    ex = json.loads(line)
                    ctx, endings, label = ex["ctx"], ex["endings"], int(ex["label"])
                    ok = isinstance(ctx, str) and isinstance(endings, list) and len(endings) >= 2 and all(
                        isinstance(e, str) for e in endings) and 0 <= label < len(endings)
                except (ValueError, KeyError, TypeError):
                    ok = False
                if not ok:
                    fail(f"--hellaswag {path}: line {n}: not an example (\"ctx\", \"endings\", \"label\")")
                if examples and len(endings) != len(examples[0][1]):
                    fail(f"--hellaswag {path}: line {n}: {len(endings)} endings, the first example has {len(examples[0][1])}")
                examples.append((ctx, endings, label))
    except OSError as e:
        fail(f"--hellaswag {path}: cannot read ({e.strerror})")
    except UnicodeDecodeError:
        fail(f"--hellaswag {path}: not UTF-8 text")
    if not examples:
        fail(f"--hellaswag {path}: no examples")
    return examples


def hellaswag(args, enc, inputs):
    """The eval file of HellaSwag's JSONL (format in the docstring), written whole."""
    out = eval_path(args)
    refuse_input(out, inputs)
    examples = hellaswag_examples(args.hellaswag)
    bos = enc.encode_single_token(BOS_NAME)
    records, tokens, longest = [], [], 0
    for ctx, endings, label in examples:
        c = [bos] + enc.encode_ordinary(ctx)
        ends = [enc.encode_ordinary(" " + e) for e in endings]
        records += [label, len(c)] + [len(e) for e in ends]
        tokens += c + [t for e in ends for t in e]
        longest = max(longest, len(c) + max(len(e) for e in ends))
    if len(tokens) >= 2**31:
        fail(f"{out}: {len(tokens):,} tokens do not fit the header's int32 count")
    header = struct.pack("<256i", EVAL_MAGIC, 1, len(examples), len(examples[0][1]), len(tokens), *([0] * 251))
    make_folders(args)
    write_atomic(out, [header, np.array(records, dtype="<i4"), np.array(tokens, dtype="<u4")], inputs)
    print(f"wrote {len(examples):,} examples of {len(examples[0][1])} endings ({len(tokens):,} tokens; the longest "
          f"example {longest}, which --sequence_length must reach less one) to {out}")


def main(args, llama3_only=True):
    """args: parse_args's; llama3_only=False (tests only) takes any byte-level BPE with a <|begin_of_text|> token."""
    check_folders(args)
    tokenizer = args.tokenizer or default_tokenizer_path()
    enc, what = load_tokenizer(tokenizer)
    print(f"tokenizer: {tokenizer}: {what}, n_vocab {enc.n_vocab}")
    why = llama3_mismatch(enc)
    if llama3_only and why:
        fail(f"{tokenizer}: not the LLaMA-3 tokenizer: {why}")
    if BOS_NAME not in enc._special_tokens:
        fail(f"{tokenizer}: no {BOS_NAME} token")
    inputs = [p for p in (args.text, args.tokenizer, args.hellaswag) if p]
    if args.hellaswag:
        hellaswag(args, enc, inputs)
    elif args.input:
        own_data(args, enc, inputs)
    else:
        shakespeare(args, enc, inputs)


if __name__ == "__main__":
    main(ARGS)
