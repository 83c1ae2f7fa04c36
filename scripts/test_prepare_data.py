#!/usr/bin/env python3
"""Host test of scripts/prepare_data.py (no GPU, no network): a small byte-level BPE learned here is
written as a tiktoken tokenizer.model and as an HF tokenizer.json (keys through GPT-2's
byte-to-unicode table, as HF stores them); both must give the same tokens. Then --input with a
folder, a JSONL file and a list of files must give token files with BOS before every document,
every document once and in order; bad inputs must stop with one line; the Tiny Shakespeare path
keeps its sections and split. The id-to-bytes table (--vocab_out) of either tokenizer file must hold
the tokenizer's bytes for every id and give a text back from its tokens. The checks run
prepare_data.main(..., llama3_only=False), since the command line takes the LLaMA-3 vocabulary only
(also checked). Every failure must be one line "error: ..." (a missing package, the default tokenizer
not installed, a download that fails, an unreadable input, an output folder that cannot be made or whose
parent is missing, too little text), and --val_tokens 0 must write NAME_train.bin alone. Without numpy or
tiktoken, only the checks that need neither run (the requirements files, the missing-package error) and the
rest is skipped ("skipped: ..."). Ends with "N passed, M failed"."""
import base64, json, os, random, re, socket, subprocess, sys, tempfile
from collections import Counter

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS)
from cli import ArgumentParser  # noqa: E402

if __name__ == "__main__":  # (before numpy's import: --help on any machine)
    ArgumentParser(__file__, description=__doc__, epilog="example: python3 scripts/test_prepare_data.py").parse_args()
try:
    import numpy as np
    import tiktoken  # noqa: F401 (prepare_data's dependency)
except ModuleNotFoundError as e:
    MISSING = e.name
else:
    MISSING = None
    import prepare_data as pd

MIXED = ("Hello, World! It's 2024: 1234567 tokens.\n\n  indented\tand tabbed\r\nCRLF line\n"
         "café naïve Ελληνικά русский 数字と日本語 🙂👍\u00a0nbsp   trailing spaces   \n\n\n"
         "x=3.14159; y = [1, 22, 333]; don't WON'T we'll\n")
WORDS = ("the of and to in that it was for on are with as his they be at one have this from or had by "
         "word but some what there we can out other were all your when up use how said an each she which "
         "Shakespeare Romeo Juliet thou thee hath doth café Straße ελληνικά 東京 🙂 1599 42 3.5").split()
results = []


def check(ok, what):
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {what}")


def bytes_to_unicode():
    """GPT-2's table (encoder.py), written out here so that the loader's inverse is checked against it."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def merge(word, a, b):
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def learn_bpe(text, n_merges=300):
    """Ranks: the 256 bytes in GPT-2's table order (not byte order), then the most frequent pairs."""
    ranks = {bytes([b]): i for i, b in enumerate(bytes_to_unicode())}
    words = Counter(tuple(bytes([b]) for b in w.encode()) for w in re.findall(r" ?\w+| ?[^\w\s]+|\s+", text))
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[a, b] += n
        if not pairs:
            break
        (a, b), _ = pairs.most_common(1)[0]
        merges.append((a, b))
        ranks.setdefault(a + b, len(ranks))
        words = Counter({merge(w, a, b): n for w, n in words.items()})
    return ranks, merges


def write_tokenizer_model(path, ranks):
    with open(path, "wb") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(token) + b" %d\n" % rank)


def write_tokenizer_json(path, ranks, merges):
    """The layout of Llama-3.2-1B/tokenizer.json, with this vocabulary."""
    u = bytes_to_unicode()
    s = lambda t: "".join(u[b] for b in t)  # noqa: E731
    added = [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for name, i in pd.llama3_specials(len(ranks)).items()]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
               {"type": "Split", "pattern": {"Regex": pd.PAT_STR}, "behavior": "Isolated", "invert": False},
               {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
           "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                                               "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": True, "vocab": {s(t): i for t, i in ranks.items()},
                     "merges": [[s(a), s(b)] for a, b in merges]}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)


def make_doc(rng, n_words):
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n_words // 7)]
    return "\n".join(lines) + "\n"


def run_cli(*args, strict=False, blocked=None, env=None):
    """(exit status, stdout, stderr) of prepare_data.py; llama3_only=False unless strict; `blocked`: a
    module made unimportable first; `env`: added to the environment."""
    if strict:
        cmd = [sys.executable, os.path.join(SCRIPTS, "prepare_data.py"), *args]
    else:
        block = f"sys.modules[{blocked!r}] = None; " if blocked else ""
        cmd = [sys.executable, "-c", f"import sys; {block}sys.path.insert(0, {SCRIPTS!r}); "
               "import prepare_data as p; p.main(p.parse_args(sys.argv[1:]), llama3_only=False)", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout, p.stderr


def one_error(rc, err, *fragments):
    """A failure as the script must report it: exit 1, one line "error: ..." holding every fragment."""
    return rc == 1 and err.count("\n") == 1 and err.startswith("error: ") and all(f in err for f in fragments)


def said(rc, err):
    return f" (exit {rc}: {err.strip()})" if rc else ""


def read_tokens(path):
    """The tokens of a token file whose header is right (magic, version, count = size, rest 0), else None."""
    if not os.path.exists(path):
        return None
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    ok = (header[0] == 20240801 and header[1] == 7 and not header[3:].any()
          and len(raw) == 1024 + 4 * int(header[2]))
    return np.frombuffer(raw[1024:], dtype="<u4").tolist() if ok else None


def expected_stream(enc, docs):
    bos = enc.encode_single_token(pd.BOS_NAME)
    return [t for d in docs if d for t in [bos] + enc.encode_ordinary(d)]


def check_outputs(enc, out_dir, name, docs, what, val_len=None):
    val = read_tokens(os.path.join(out_dir, f"{name}_val.bin"))
    train = read_tokens(os.path.join(out_dir, f"{name}_train.bin"))
    want = expected_stream(enc, docs)
    ok = val is not None and train is not None and val + train == want
    check(ok, f"{what}: headers right, train+val = BOS + tokens of each of the {len(docs)} documents, "
          "in order, once")
    if val_len is not None:
        check(ok and len(val) == val_len, f"{what}: val is the first {val_len} tokens")


def check_tokenizers(d, text):
    ranks, merges = learn_bpe(text)
    model, hf = os.path.join(d, "tokenizer.model"), os.path.join(d, "tok.json")
    write_tokenizer_model(model, ranks)
    write_tokenizer_json(hf, ranks, merges)
    u = bytes_to_unicode()
    check(u[ord(" ")] == "Ġ" and u[ord("\n")] == "Ċ" and u[0xAD] == "Ń",
          "the test's GPT-2 table: ' '->Ġ, \\n->Ċ, 0xad->Ń")
    enc_m, what_m = pd.load_tokenizer(model)
    enc_j, what_j = pd.load_tokenizer(hf)
    ids_m, ids_j = enc_m.encode_ordinary(MIXED), enc_j.encode_ordinary(MIXED)
    check(ids_m == ids_j and len(ids_m) < len(MIXED.encode()) * 0.8,
          f"tokenizer.model and tokenizer.json give the same {len(ids_m)} ids on mixed text "
          f"({len(MIXED.encode())} bytes)")
    check(enc_m.decode(ids_m) == MIXED and enc_j.decode(ids_j) == MIXED,
          "decoding gives the text back, both loaders")
    check("not Meta's" in what_m and what_j == "HF tokenizer.json", "told apart by content")
    bos = enc_j.encode_single_token(pd.BOS_NAME)
    check(bos == len(ranks) == enc_m.encode_single_token(pd.BOS_NAME) and enc_j.n_vocab == len(ranks) + 256,
          f"BOS = {bos} (after the ranks) and n_vocab = ranks + 256 in both")
    return enc_j, model, hf


def check_tokenizer_refusals(d, hf, text_file):
    rc, _, err = run_cli("--text", text_file, "--tokenizer", hf, "--out_dir", d, strict=True)
    check(rc != 0 and "not the LLaMA-3 tokenizer: n_vocab" in err and err.count("\n") == 1,
          f"the command line refuses a vocabulary that is not LLaMA-3's: {err.strip()[:90]}...")
    spm = os.path.join(d, "spm.json")
    json.dump({"model": {"type": "BPE", "vocab": {"▁the": 0}}, "normalizer": None,
               "pre_tokenizer": {"type": "Metaspace", "replacement": "▁"}}, open(spm, "w"))
    rc, _, err = run_cli("--input", text_file, "--tokenizer", spm, "--out_dir", d)
    check(rc != 0 and "not a LLaMA-3 byte-level BPE tokenizer.json" in err,
          f"a SentencePiece-style tokenizer.json is refused: {err.strip()}")


def check_chunks(d, enc):
    rng = random.Random(7)
    text = "".join(rng.choice(["a", "B", "7", "42", " ", "  ", "\n", "\n\n", "\r\n", "\t", "é", "!?\n", "🙂"])
                   for _ in range(5000))
    path = os.path.join(d, "chunky.txt")
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    chunks = list(pd.text_chunks(path, size=37))
    ids = [t for c in chunks for t in enc.encode_ordinary(c)]
    check(len(chunks) > 50 and "".join(chunks) == text and ids == enc.encode_ordinary(text),
          f"a text read in {len(chunks)} pieces encodes to the tokens of the whole")


def check_own_data(d, enc, hf, docs):
    folder = os.path.join(d, "texts")
    os.makedirs(os.path.join(folder, "sub"))
    for name, doc in zip(["b.txt", "a.txt", "sub/c.txt"], [docs[1], docs[0], docs[2]]):
        open(os.path.join(folder, name), "w", encoding="utf-8").write(doc)
    open(os.path.join(folder, ".hidden.txt"), "w").write("never read")
    n0 = len(expected_stream(enc, docs[:1]))
    rc, out, err = run_cli("--input", folder, "--tokenizer", hf, "--out_dir", d, "--val_tokens", str(n0 - 10))
    check(rc == 0 and "3 documents" in out, f"--input a folder: exit 0, 3 documents{said(rc, err)}")
    check_outputs(enc, d, "texts", docs[:3], "folder (sorted by path, subfolder read, hidden file skipped)",
                  n0)

    jsonl = os.path.join(d, "docs.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        f.write(json.dumps({"text": docs[3]}) + "\n\n" + json.dumps({"text": "", "id": 2}) + "\n")
        f.write(json.dumps({"id": 3, "text": docs[4]}, ensure_ascii=False) + "\n")
    rc, out, err = run_cli("--input", jsonl, "--tokenizer", hf, "--out_dir", d, "--name", "j",
                           "--val_fraction", "0.4")
    check(rc == 0 and "2 documents" in out and "1 empty" in out,
          f"--input a JSONL file: 2 documents, 1 empty{said(rc, err)}")
    check_outputs(enc, d, "j", docs[3:5], "JSONL")

    a, b = os.path.join(folder, "a.txt"), os.path.join(folder, "b.txt")
    rc, out, err = run_cli("--input", b, jsonl, "--input", a, "--tokenizer", hf, "--out_dir", d,
                           "--val_tokens", "300")
    check(rc == 0 and "inside a document" in out, f"--input a list of files: exit 0{said(rc, err)}")
    listed = [docs[1], docs[3], docs[4], docs[0]]
    check_outputs(enc, d, "data", listed, "list (b.txt, docs.jsonl, a.txt)", 300)
    check_blocks(enc, [b, jsonl, a], listed)
    check_parquet(d, enc, hf, docs)


def check_parquet(d, enc, hf, docs):
    """A parquet file's column of documents, as FineWeb ships them: the JSONL's documents, an empty row
    counted; a missing column, a file that is not parquet and no pyarrow each refused in one line."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ModuleNotFoundError:
        print("skipped: --input PARQUET (no pyarrow: pip install -r requirements.txt)")
        return
    path = os.path.join(d, "docs.parquet")
    table = pyarrow.table({"id": [1, 2, 3], "text": [docs[3], "", docs[4]]})
    pyarrow.parquet.write_table(table, path, row_group_size=2)  # (two row groups)
    rc, out, err = run_cli("--input", path, "--tokenizer", hf, "--out_dir", d, "--name", "p", "--val_fraction", "0.4")
    check(rc == 0 and "2 documents" in out and "1 empty" in out,
          f"--input a parquet file (2 row groups): 2 documents, 1 empty{said(rc, err)}")
    check_outputs(enc, d, "p", docs[3:5], "parquet")
    rc, _, err = run_cli("--input", path, "--text_field", "body", "--tokenizer", hf, "--out_dir", d)
    check(one_error(rc, err, f"{path}: no column 'body' (its columns: id, text)"),
          f"a parquet file without the column: {err.strip()}")
    fake = os.path.join(d, "fake.parquet")
    open(fake, "w").write("not parquet at all")
    rc, _, err = run_cli("--input", fake, "--tokenizer", hf, "--out_dir", d)
    check(one_error(rc, err, f"{fake}: not a parquet file"), f"a .parquet file that is not parquet: {err.strip()}")
    rc, _, err = run_cli("--input", path, "--tokenizer", hf, "--out_dir", d, blocked="pyarrow")
    check(one_error(rc, err, "pyarrow", "pip install"), f"parquet without pyarrow: one line with the pip "
          f"command ({err.strip()})")


def check_blocks(enc, files, docs):
    """encode_documents with numpy blocks of 100 tokens, and batches of 37 characters on 3 threads (a
    batch ends inside documents and pieces): the same stream and document starts."""
    block, batch = pd.BLOCK_TOKENS, pd.BATCH_CHARS
    pd.BLOCK_TOKENS, pd.BATCH_CHARS = 100, 37
    tokens, starts, n_docs, empty = pd.encode_documents(enc, files, "text", 3)
    pd.BLOCK_TOKENS, pd.BATCH_CHARS = block, batch
    sizes = [1 + len(enc.encode_ordinary(x)) for x in docs]
    check(tokens.dtype == np.uint32 and tokens.tolist() == expected_stream(enc, docs)
          and (n_docs, empty) == (4, 1) and starts == [sum(sizes[:i]) for i in range(4)],
          "tokens in numpy blocks of 100, encoded in batches of 37 characters on 3 threads: the same stream, "
          "document starts and counts")


def check_refusals(d, hf, docs):
    bad = os.path.join(d, "bad.jsonl")
    open(bad, "w").write(json.dumps({"text": "one"}) + "\n" + json.dumps({"text": "two"}) + "\n"
                         + json.dumps({"body": "three"}) + "\n")
    rc, _, err = run_cli("--input", bad, "--tokenizer", hf, "--out_dir", d)
    check(rc != 0 and err.count("\n") == 1 and f"{bad}:3: no string field 'text'" in err,
          f"a JSONL line without the field: {err.strip()}")
    open(bad, "w").write(json.dumps({"text": "one"}) + "\n{not json\n")
    rc, _, err = run_cli("--input", bad, "--tokenizer", hf, "--out_dir", d)
    check(rc != 0 and err.count("\n") == 1 and f"{bad}:2: not a line of UTF-8 JSON" in err,
          f"a JSONL line that is not JSON: {err.strip()[:100]}")
    same = os.path.join(d, "mine_train.bin")
    open(same, "w").write(docs[0] * 3)
    rc, _, err = run_cli("--input", same, "--tokenizer", hf, "--out_dir", d, "--name", "mine",
                         "--val_tokens", "300")
    check(rc != 0 and "not overwritten" in err and open(same).read() == docs[0] * 3
          and not os.path.exists(os.path.join(d, "mine_val.bin")),
          f"an output that is an input is refused before anything is written: {err.strip()}")
    empty = os.path.join(d, "empty")
    os.makedirs(empty)
    rc, _, err = run_cli("--input", empty, "--tokenizer", hf, "--out_dir", d)
    check(rc != 0 and "no files" in err, f"an empty folder: {err.strip()}")
    open(os.path.join(empty, "e.txt"), "w").close()
    rc, _, err = run_cli("--input", empty, "--tokenizer", hf, "--out_dir", d)
    check(rc != 0 and "no text" in err and "all empty" in err, f"only empty documents: {err.strip()}")
    small = os.path.join(d, "small.txt")
    open(small, "w").write(docs[0])
    rc, _, err = run_cli("--input", small, "--tokenizer", hf, "--out_dir", d)
    check(rc != 0 and re.search(r"val would get \d+ tokens and train [\d,]+ of [\d,]+", err),
          f"a split too small, the sizes named: {err.strip()[:110]}...")
    check(one_error(rc, err, "at least 257 tokens", "B=4 x T=64", "514", "--val_tokens 0"),
          f"... the minimum named, per split and for which B and T, and how to make no val split: "
          f"...{err.strip()[-190:]}")


def check_no_val(d, enc, hf, docs):
    """--val_tokens 0: every token in NAME_train.bin, no NAME_val.bin, and the output says so."""
    small = os.path.join(d, "few.txt")
    open(small, "w").write(docs[0])
    out = os.path.join(d, "noval")
    rc, printed, err = run_cli("--input", small, "--tokenizer", hf, "--out_dir", out, "--val_tokens", "0")
    train = read_tokens(os.path.join(out, "few_train.bin"))
    check(rc == 0 and train == expected_stream(enc, docs[:1]) and os.listdir(out) == ["few_train.bin"],
          f"--val_tokens 0: all {len(train or [])} tokens in few_train.bin, no few_val.bin{said(rc, err)}")
    check("no val split" in printed and "few_val.bin not written" in printed,
          f"... and the output says so: {[x for x in printed.splitlines() if 'val' in x]}")
    tiny = os.path.join(d, "tiny.txt")
    open(tiny, "w").write("a few words\n")
    rc, _, err = run_cli("--input", tiny, "--tokenizer", hf, "--out_dir", out, "--val_tokens", "0")
    check(one_error(rc, err, "train split needs at least 257 tokens", "B=4 x T=64"),
          f"--val_tokens 0 on too little text: {err.strip()}")


def check_shards(d, enc, hf, docs):
    """--shard_tokens N: the train split as NAME_train_000000.bin, ... of N tokens each, the last the rest
    (merged into the one before when shorter than a batch: 4858 tokens in shards of 400 leave 58), which
    together are the split's tokens; no NAME_train.bin; a size below one batch is refused."""
    text = os.path.join(d, "sharded.txt")
    open(text, "w").write("".join(docs))
    out = os.path.join(d, "shards")
    rc, printed, err = run_cli("--input", text, "--tokenizer", hf, "--out_dir", out, "--val_tokens", "0",
                               "--shard_tokens", "400")
    names = sorted(os.listdir(out)) if os.path.isdir(out) else []
    parts = [read_tokens(os.path.join(out, n)) or [] for n in names]
    stream = expected_stream(enc, ["".join(docs)])  # (one file: one document)
    sizes = [len(p) for p in parts]
    ok = rc == 0 and names and all(n == f"sharded_train_{i:06d}.bin" for i, n in enumerate(names))
    ok = ok and sum(parts, []) == stream and all(s == 400 for s in sizes[:-1]) and 257 <= sizes[-1] < 400 + 257
    check(ok, f"--shard_tokens 400: {len(names)} shards of {sizes} tokens, together the split's {len(stream)}"
          f"{said(rc, err)}")
    check("train shards: --input_bin" in printed, "... and the output names the glob for --input_bin")
    rc, _, err = run_cli("--input", text, "--tokenizer", hf, "--out_dir", out, "--shard_tokens", "100")
    check(rc == 2 and "--shard_tokens 100" in err and len(err.strip().splitlines()) == 1,
          f"--shard_tokens below one batch: {err.strip()}")


def check_hellaswag(d, enc, hf):
    """--hellaswag JSONL: OUT_DIR/hellaswag_eval.bin holds each example's label, BOS and its context,
    its endings each encoded with a space in front, as the docstring lays them out; a line without an
    example is refused in one line naming it."""
    import numpy as np
    examples = [{"ctx": "A man is sitting on a roof. he", "endings": ["is using wrap.", "starts pulling up roofing.",
                                                                       "is ripping level tiles.", "holds a sandwich."],
                 "label": 1},
                {"ctx": "Sugar is added", "endings": ["to a bowl.", "and stirred.", "slowly.", "then milk."], "label": 3}]
    jsonl = os.path.join(d, "hs.jsonl")
    with open(jsonl, "w") as f:
        f.write("\n".join(json.dumps(e) for e in examples) + "\n")
    out = os.path.join(d, "hs")
    rc, _, err = run_cli("--hellaswag", jsonl, "--tokenizer", hf, "--out_dir", out)
    path = os.path.join(out, "hellaswag_eval.bin")
    ok = rc == 0 and os.path.exists(path)
    if ok:
        raw = open(path, "rb").read()
        h = np.frombuffer(raw[:1024], "<i4")
        rec = np.frombuffer(raw[1024:1024 + 4 * 2 * 6], "<i4").reshape(2, 6)
        toks = np.frombuffer(raw[1024 + 48:], "<u4").tolist()
        bos = enc.encode_single_token(pd.BOS_NAME)
        want_rec, want_toks = [], []
        for e in examples:
            c = [bos] + enc.encode_ordinary(e["ctx"])
            ends = [enc.encode_ordinary(" " + x) for x in e["endings"]]
            want_rec.append([e["label"], len(c)] + [len(x) for x in ends])
            want_toks += c + [t for x in ends for t in x]
        ok = (h[:5].tolist() == [20241206, 1, 2, 4, len(want_toks)] and rec.tolist() == want_rec
              and toks == want_toks and len(raw) == 1024 + 48 + 4 * len(want_toks))
    check(ok, f"--hellaswag: hellaswag_eval.bin holds the 2 examples' labels, BOS + context, \" \" + endings{said(rc, err)}")
    with open(jsonl, "a") as f:
        f.write('{"ctx": "no endings", "label": 0}\n')
    rc, _, err = run_cli("--hellaswag", jsonl, "--tokenizer", hf, "--out_dir", out)
    check(one_error(rc, err, "line 3: not an example"), f"--hellaswag: a line without endings: {err.strip()}")


def check_failures_are_one_line(d, model, hf, text_file):
    """User errors end in one "error: ..." line naming the file or flag, never in a traceback."""
    rc, _, err = run_cli("--out_dir", d, blocked="llama_models")
    check(one_error(rc, err, "llama-models", "pip install -r requirements-data.txt", "--tokenizer"),
          f"no --tokenizer and no llama-models: the pip command ({err.strip()[:120]}...)")
    rc, _, err = run_cli("--tokenizer", model, "--out_dir", d, env={"https_proxy": "http://127.0.0.1:9",
                                                                     "no_proxy": "", "NO_PROXY": ""})
    check(one_error(rc, err, "cannot download Tiny Shakespeare", "--text"),
          f"a download that fails: {err.strip()}")
    rc, _, err = run_cli("--input", text_file, "--tokenizer", os.path.join(d, "absent.json"), "--out_dir", d)
    check(one_error(rc, err, "--tokenizer", "absent.json: no such file", "tokenizer.json (hf download "
                    "meta-llama/Llama-3.2-1B"), f"a --tokenizer that is not there: where the file comes from ({err.strip()[:90]}...)")
    rc, _, err = run_cli("--text", os.path.join(d, "absent.txt"), "--tokenizer", model, "--out_dir", d)
    check(one_error(rc, err, "--text", "absent.txt: cannot read"), f"a --text that is not there: {err.strip()}")
    sock = os.path.join(d, "sock.txt")  # exists, but open() fails even for root
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(sock)
        rc, _, err = run_cli("--input", text_file, sock, "--tokenizer", hf, "--out_dir", d)
    check(one_error(rc, err, f"{sock}: cannot read"), f"an input that cannot be read: {err.strip()}")
    rc, _, err = run_cli("--input", text_file, "--tokenizer", hf, "--val_tokens", "300",
                         "--out_dir", os.path.join(text_file, "out"))
    check(one_error(rc, err, "--out_dir", "cannot be written", "is a file, not a folder"),
          f"an --out_dir that cannot be made: {err.strip()}")
    rc, _, err = run_cli("--input", text_file, "--tokenizer", hf, "--val_tokens", "300", "--out_dir", d,
                         "--vocab_out", os.path.join(text_file, "v.bin"))
    check(one_error(rc, err, "--vocab_out"), f"a --vocab_out folder that cannot be made: {err.strip()}")
    bad_regex = os.path.join(d, "regex.json")
    tok = json.load(open(hf, encoding="utf-8"))
    tok["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"
    json.dump(tok, open(bad_regex, "w", encoding="utf-8"), ensure_ascii=False)
    rc, _, err = run_cli("--input", text_file, "--tokenizer", bad_regex, "--out_dir", d)
    check(one_error(rc, err, "regex.json", "tiktoken cannot use it"),
          f"a tokenizer.json whose regex does not compile: {err.strip()[:110]}")
    check_missing_parents(d, hf, text_file)


def check_missing_parents(d, hf, text_file):
    """An output folder whose parent is missing is refused before any work (here before the tokenizer, which
    does not exist, is read) and nothing is made, as the trainer's --checkpoint_dir; the last folder alone is
    made (check_no_val), and only when a file is written."""
    nested = os.path.join(d, "a", "b", "c")
    absent = os.path.join(d, "no_tokenizer.json")
    rc, _, err = run_cli("--input", text_file, "--tokenizer", absent, "--out_dir", nested)
    check(one_error(rc, err, f"--out_dir {nested}: cannot be written: its folder {os.path.dirname(nested)} "
                    "does not exist") and not os.path.exists(os.path.join(d, "a")),
          f"an --out_dir in a missing folder: refused before any work, nothing made: {err.strip()}")
    vocab = os.path.join(d, "x", "y", "v.bin")
    rc, _, err = run_cli("--input", text_file, "--tokenizer", absent, "--out_dir", d, "--vocab_out", vocab)
    check(one_error(rc, err, "--vocab_out's folder", "its folder", "does not exist")
          and not os.path.exists(os.path.join(d, "x")), f"a --vocab_out in a missing folder: {err.strip()}")
    tiny, new = os.path.join(d, "few_words.txt"), os.path.join(d, "new_out")
    open(tiny, "w").write("a few words\n")
    rc, _, err = run_cli("--input", tiny, "--tokenizer", hf, "--out_dir", new, "--val_tokens", "0")
    check(one_error(rc, err, "too little text") and not os.path.exists(new),
          f"a new --out_dir is not made by a run that stops before writing: {err.strip()[:60]}...")


def check_requirements():
    """The scripts' packages are declared: requirements.txt, and llama-models in requirements-data.txt."""
    root = os.path.dirname(SCRIPTS)

    def names(file):
        path = os.path.join(root, file)
        lines = open(path).read().splitlines() if os.path.exists(path) else []
        return {re.split(r"[\s=<>~#\[]", x.strip())[0].lower() for x in lines if x.strip()[:1].isalnum()}
    check({"numpy", "safetensors", "tiktoken", "matplotlib", "pyarrow"} <= names("requirements.txt"),
          f"requirements.txt names numpy, safetensors, tiktoken, matplotlib, pyarrow: "
          f"{sorted(names('requirements.txt'))}")
    check("llama-models" in names("requirements-data.txt"),
          f"requirements-data.txt names llama-models: {sorted(names('requirements-data.txt'))}")


def check_missing_package():
    rc, _, err = run_cli("--input", "x.txt", blocked="numpy")
    check(one_error(rc, err, "numpy", "pip install -r requirements.txt"),
          f"without numpy: one line with the pip command ({err.strip()})")


def read_vocab(path):
    """Every token's bytes from a vocabulary table whose header and offsets are right, else None."""
    if not os.path.exists(path):
        return None
    raw = open(path, "rb").read()
    magic, version, n, total = np.frombuffer(raw[:16], dtype="<i4").tolist()
    off = np.frombuffer(raw[1024:1024 + 4 * (n + 1)], dtype="<u4").astype(np.int64)
    body = raw[1024 + 4 * (n + 1):]
    ok = ((magic, version) == (20241202, 1) and not np.frombuffer(raw[16:1024], dtype="<i4").any()
          and len(off) == n + 1 and off[0] == 0 and (np.diff(off) >= 0).all() and off[-1] == total == len(body))
    return [body[off[i]:off[i + 1]] for i in range(n)] if ok else None


def check_vocab(d, enc, model, hf, text_file):
    """The table written with --vocab_out from either tokenizer file: every id's bytes are the
    tokenizer's, and the tokens of a text give the text back byte for byte."""
    want = [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)]
    ids = enc.encode_ordinary(MIXED) + [enc.encode_single_token(pd.BOS_NAME)]
    for tok, what in ((model, "tokenizer.model"), (hf, "tokenizer.json")):
        out = os.path.join(d, "v", f"{what}.vocab")
        rc, _, err = run_cli("--input", text_file, "--tokenizer", tok, "--out_dir", d, "--name", "v",
                             "--val_tokens", "300", "--vocab_out", out)
        table = read_vocab(out)
        check(rc == 0 and table == want, f"--vocab_out from a {what}: header right, the bytes of all "
              f"{len(want)} ids are the tokenizer's{said(rc, err)}")
        check(table and b"".join(table[i] for i in ids) == MIXED.encode() + pd.BOS_NAME.encode(),
              f"{what}'s table: the tokens of mixed text (split UTF-8 characters too) give it back byte for byte")
    gap = os.path.join(d, "gap.json")
    tok = json.load(open(hf, encoding="utf-8"))
    tok["added_tokens"][-1]["id"] += 1
    json.dump(tok, open(gap, "w", encoding="utf-8"), ensure_ascii=False)
    rc, _, err = run_cli("--input", text_file, "--tokenizer", gap, "--out_dir", d, "--name", "g",
                         "--val_tokens", "300", "--vocab_out", os.path.join(d, "gap.vocab"))
    check(rc != 0 and "gap.vocab: not written: id" in err and "have a gap" in err,
          f"a tokenizer whose ids have a gap writes no table: {err.strip()[:100]}")


def check_shakespeare(d, enc, model):
    bos = enc.encode_single_token(pd.BOS_NAME)
    want = ([bos] + enc.encode_ordinary("First:\nHi.\n\n") + [bos] + enc.encode_ordinary("Second, two\n\n")
            + [bos] + enc.encode_ordinary("Third"))
    check(pd.shakespeare_tokens("First:\nHi.\n\nSecond, two\n\nThird", enc).tolist() == want,
          "Tiny Shakespeare: BOS before each blank-line section, its \"\\n\\n\" kept")
    rng = random.Random(3)
    text = "\n\n".join(make_doc(rng, 60).rstrip("\n") for _ in range(1200))
    path = os.path.join(d, "input.txt")
    open(path, "w", encoding="utf-8").write(text)
    rc, _, err = run_cli("--text", path, "--tokenizer", model, "--out_dir", d)
    val = read_tokens(os.path.join(d, "tiny_shakespeare_val.bin"))
    train = read_tokens(os.path.join(d, "tiny_shakespeare_train.bin"))
    ok = rc == 0 and val is not None and train is not None
    check(ok and len(val) == 32768 and val + train == pd.shakespeare_tokens(text, enc).tolist(),
          "Tiny Shakespeare from --text: tiny_shakespeare_{val,train}.bin, first 32768 tokens val"
          + said(rc, err))
    table = read_vocab(os.path.join(d, "llama3_vocab.bin"))
    check(ok and table == [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)],
          "Tiny Shakespeare also writes the vocabulary table, OUT_DIR/llama3_vocab.bin")


def main():
    check_requirements()
    check_missing_package()
    if MISSING:
        print(f"skipped: the tokenizer and token file checks of scripts/test_prepare_data.py need {MISSING} "
              "(pip install -r requirements.txt)")
        print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
        sys.exit(0 if all(results) else 1)
    rng = random.Random(1)
    docs = [make_doc(rng, n) for n in (900, 700, 800, 600, 750)]
    with tempfile.TemporaryDirectory() as d:
        enc, model, hf = check_tokenizers(d, "".join(docs) + MIXED)
        text_file = os.path.join(d, "one.txt")
        open(text_file, "w").write(docs[0])
        check_tokenizer_refusals(d, hf, text_file)
        check_chunks(d, enc)
        check_own_data(d, enc, hf, docs)
        check_refusals(d, hf, docs)
        check_no_val(d, enc, hf, docs)
        check_shards(d, enc, hf, docs)
        check_hellaswag(d, enc, hf)
        check_failures_are_one_line(d, model, hf, text_file)
        check_vocab(d, enc, model, hf, text_file)
        check_shakespeare(d, enc, model)
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
