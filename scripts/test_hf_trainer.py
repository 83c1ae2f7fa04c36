#!/usr/bin/env python3
"""GPU test: a Hugging Face model through convert_hf.py into ./train_llama3, and the trainer's checkpoint back
through export_hf.py into transformers, each against PyTorch's loss on the same batch.

    make train_llama3 && python3 scripts/test_hf_trainer.py [--work_dir DIR]
    python3 scripts/test_hf_trainer.py --shape 1b --trainer_flags "--master_weights bf16 --optimizer_state bf16"

1. ref_llama3.py's small model (vocab 1000, N(0, 0.02) matrices, norm weights U(0.5, 1.5)) written by
   save_pretrained (safetensors) and converted by convert_hf.py; a token file of Tiny Shakespeare with
   the text's 999 most frequent ids (ref_llama3.py's text_tokens).
2. ./train_llama3 on them for 3 steps with --checkpoint_dir: its logged step-1 loss against HF's loss on
   batch 1. And --hf_dir on the saved folder itself: the converted file's losses of 4 steps, bit for bit.
   The eval (--eval_file, --eval_every 3) of 24 examples after step 3: its accuracy within what PyTorch's
   same rule gives on the exported step-3 checkpoint (examples whose endings tie within 0.05 either way).
   --save_hf after step 3 (float32) and after step 4 of the --hf_dir run (bfloat16), and that run's step-4
   checkpoint's hf/ (--save_hf_checkpoints 1): export_hf.py's files of the same step's checkpoint, byte for byte.
3. The checkpoint after step 3 (DIR/latest names it) exported by export_hf.py and loaded by
   from_pretrained: its loss on batch 4 against the step-4 loss of a second run of 4 steps, same flags
   (runs are deterministic).
HF's losses are those of ref_llama3.py: fp32 weights under torch.autocast(bfloat16), mean cross-entropy
in fp32. Batch k is the one step k trains on. llama3.h's loader_next is sequential:
x = tokens[pos : pos+B*T], y = tokens[pos+1 : pos+B*T+1], pos starts at 0 and advances by B*T per
micro-step, wrapping to 0 only when the next batch would not fit; with --total_batch_size = B*T each step
is one micro-step, so batch k starts at (k-1)*B*T, read as (B, T) row-major, and the file holds
8*B*T+1 tokens so that nothing wraps.
   The run of 3 steps also measures the val loss after step 3 on the token file's first 2 batches
   (--val_bin, --val_tokens): against HF's mean loss on them with the exported weights.
   The export's ties: its config.json's tie_word_embeddings false and model.safetensors an lm_head.weight
   tensor, and from_pretrained's lm_head.weight another tensor than embed_tokens.weight (data_ptr differ).
1-3 again on a tied model (ref_llama3.py --tied: tie_word_embeddings true, embed_tokens also the head, so
   save_pretrained writes no lm_head.weight), the same seed, tokens and flags: convert_hf.py keeps the tie
   (header slot 16 tied_embeddings), ./train_llama3 trains the one matrix as embedding and head, and the
   step-3 export must be tied: config.json's tie_word_embeddings true, no lm_head.weight in
   model.safetensors, and after from_pretrained (then .float().cuda()) lm_head.weight is embed_tokens.weight
   (one Parameter, data_ptr equal). HF's loss on batch 4 with it against the trainer's step-4 loss
   (weights after step 3), the step-1 and val losses as above, within TOL_LOSS.
--shape (another of ref_llama3.py's shapes) and --trainer_flags (added to every ./train_llama3 command) run
1-3 on the untied model only, with that shape and those flags: the round trip of another recipe (bf16 weights,
whose checkpoint holds them widened) or of a released model's shape.
4. Greedy generation (the small shape without --trainer_flags only): another random model of that shape whose
   next token is clear: its embedding scaled by EMBED_SCALE (the residual stream is then mostly the current
   token's embedding) and lm_head row j the unit embedding of token perm[j] times HEAD_SCALE, a random
   permutation, so greedy decoding walks a cycle of perm with the top logit tens of units above the next (a
   plain random model has near-ties that bf16 logits break either way). Trained one step with --sample_every 1
   --temperature 0; its 32 generated ids (the log's sample_ids, after token 0: this vocabulary has no LLaMA-3
   BOS) against HF generate(do_sample=False) on the exported step-1 checkpoint, in fp32; the smallest top-1
   margin along the path is printed.
Tolerance: test_llama3.cu's TOL_LOSS, 1e-2 absolute (the loss of a step whose weights equal PyTorch's;
about 1.5e-3 relative at this model's loss of ~6.9). Ends with "N passed, M failed".
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402


def parse_args():
    what, example = __doc__.split("\n\n")[:2]
    ap = cli.ArgumentParser(__file__, description=what, epilog=f"example:\n{example}")
    ap.add_argument("--work_dir", help="keep the files here, a folder made when missing (default: a temporary "
                    "folder)")
    ap.add_argument("--shape", choices=["small", "1b", "3b"], default="small", help="the model's shape "
                    "(ref_llama3.py's); another than small runs the untied round trip only (the 8B's fp32 HF "
                    "model stays on the GPU beside the trainer's runs: no card holds both)")
    ap.add_argument("--trainer_flags", default="", help="flags added to every ./train_llama3 command, e.g. "
                    "\"--master_weights bf16 --optimizer_state bf16\"; given, the untied round trip only")
    args = ap.parse_args()
    try:
        args.trainer_flags = shlex.split(args.trainer_flags)
    except ValueError as e:
        ap.error(f"--trainer_flags: {e}")
    own = sorted({f.split("=")[0] for f in args.trainer_flags} & OWN_FLAGS)
    if own:
        ap.error(f"--trainer_flags: {', '.join(own)} is set by the test itself")
    return args


# The flags the test's runs give (run() checks that each is here), and --resume, --stop_after and
# --checkpoint_every, which would change what it compares: --trainer_flags may not give them (the trainer
# takes the last of a repeated flag).
OWN_FLAGS = {"--llmc_filepath", "--hf_dir", "--input_bin", "--num_iteration", "--batch_size", "--sequence_length",
             "--total_batch_size", "--learning_rate", "--log_file", "--checkpoint_dir", "--shuffle", "--resume",
             "--save_hf", "--save_hf_dtype", "--save_hf_checkpoints", "--val_every", "--val_tokens", "--val_bin",
             "--stop_after", "--checkpoint_every", "--eval_file", "--eval_every", "--sample_every", "--sample_tokens",
             "--temperature"}

if __name__ == "__main__":
    ARGS = parse_args()  # (before torch's import: --help and a bad argument on any machine)
try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM
except ModuleNotFoundError as e:
    cli.missing_package(__file__, e, "requirements-gpu.txt")

import ref_llama3  # noqa: E402
from llama3_files import safetensors_index  # noqa: E402
from safe_write import write_atomic  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, T, LR, SEED = 4, 64, 1e-4, 1234
SAMPLE_TOKENS, EMBED_SCALE, HEAD_SCALE, VAL_BATCHES = 32, 50.0, 4.0, 2
TOL_LOSS = 1e-2  # test_llama3.cu
EVAL_EXAMPLES, EVAL_ENDINGS, EVAL_TIE = 24, 4, 0.05  # the eval test's set; endings this close are a tie
results = []


def check(ok, what):
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)


def run(cmd):
    """Runs cmd in the repository root; its output is shown when it fails. True if it succeeded."""
    if cmd[0] == "./train_llama3":
        unlisted = sorted({a for a in cmd if a.startswith("--")} - OWN_FLAGS - set(ARGS.trainer_flags))
        if unlisted:
            check(False, f"OWN_FLAGS names every flag the test gives the trainer (not {', '.join(unlisted)})")
            return False
    # (errors="replace": a sample prints raw token bytes, which need not be UTF-8 for a small vocabulary)
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, errors="replace")
    if p.returncode != 0:
        print(f"     {' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}", flush=True)
    return p.returncode == 0


def batch(tokens, k):
    """The (x, y) that the trainer's loader gives step k (1-based), on the GPU."""
    start = (k - 1) * B * T
    x = torch.from_numpy(tokens[start:start + B * T].reshape(B, T))
    y = torch.from_numpy(tokens[start + 1:start + B * T + 1].reshape(B, T))
    return x.cuda(), y.cuda()


@torch.no_grad()
def hf_loss(model, tokens, k):
    """ref_llama3.py's loss: fp32 weights, autocast(bfloat16), cross-entropy of the fp32 logits."""
    x, y = batch(tokens, k)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        logits = model(input_ids=x).logits
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1)).item()


def train(work, name, model_file, tokens_file, steps, extra=(), model_flag="--llmc_filepath"):
    """./train_llama3 for `steps` steps with a log and a checkpoint folder: {step: loss}, {step: val loss},
    the folder. model_flag: --hf_dir to read model_file as a Hugging Face folder."""
    log, ck = os.path.join(work, f"{name}.jsonl"), os.path.join(work, f"{name}_ck")
    ok = run(["./train_llama3", model_flag, model_file, "--input_bin", tokens_file,
              "--num_iteration", str(steps), "--batch_size", str(B), "--sequence_length", str(T),
              "--total_batch_size", str(B * T), "--learning_rate", str(LR), "--log_file", log,
              "--checkpoint_dir", ck, "--shuffle", "0", *ARGS.trainer_flags, *extra])
    losses, val = {}, {}
    if ok and os.path.isfile(log):
        for line in open(log):
            entry = json.loads(line)
            losses[entry["step"]] = entry["loss"]
            if "val_loss" in entry:
                val[entry["step"]] = entry["val_loss"]
    check(ok and sorted(losses) == list(range(1, steps + 1)), f"train_llama3 {name}: {steps} steps logged")
    return losses, val, ck


def latest_checkpoint(ck, step):
    """DIR/latest must name step_%08d; its model.bin, or None."""
    latest = os.path.join(ck, "latest")
    name = open(latest).read().strip() if os.path.isfile(latest) else None
    model = os.path.join(ck, name or "", "model.bin")
    ok = name == f"step_{step:08d}" and os.path.isfile(model)
    check(ok, f"{latest} names step_{step:08d}, which holds model.bin (it says {name!r})")
    return model if ok else None


def write_eval_file(path, tokens):
    """An eval file (llama3.h EvalSet) of EVAL_EXAMPLES examples: 16 tokens of the text, then as endings its
    next 2 to 5 tokens (at the label, i % 4) and 3 runs of as many from further on; the examples, as lists."""
    records, flat, examples = [], [], []
    for i in range(EVAL_EXAMPLES):
        s, n = 37 * i, 2 + i % 4
        ctx = tokens[s:s + 16]
        ends = [tokens[900 + 45 * i + 9 * j:900 + 45 * i + 9 * j + n] for j in range(EVAL_ENDINGS - 1)]
        label = i % EVAL_ENDINGS
        ends.insert(label, tokens[s + 16:s + 16 + n])
        records += [label, len(ctx)] + [len(e) for e in ends]
        flat += list(ctx) + [t for e in ends for t in e]
        examples.append((ctx, ends, label))
    header = np.zeros(256, "<i4")
    header[:5] = [20241206, 1, EVAL_EXAMPLES, EVAL_ENDINGS, len(flat)]
    write_atomic(path, [header.tobytes() + np.array(records, "<i4").tobytes() + np.array(flat, "<u4").tobytes()])
    return examples


@torch.no_grad()
def hf_eval_range(model, examples):
    """(fewest, most) right of the examples by llm.c's rule in PyTorch (each ending's mean loss over its own
    tokens after the context, under autocast bf16 as hf_loss; the lowest is the pick), an example whose label
    is within EVAL_TIE of the lowest mean among others counted as either."""
    fewest = most = 0
    for ctx, ends, label in examples:
        means = []
        for e in ends:
            row = torch.from_numpy(np.concatenate([ctx, e]).astype(np.int64))[None].cuda()
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                logits = model(input_ids=row[:, :-1]).logits
            losses = F.cross_entropy(logits.float()[0], row[0, 1:], reduction="none")
            means.append(losses[len(ctx) - 1:].mean().item())
        near = [k for k in range(len(ends)) if means[k] - min(means) < EVAL_TIE]
        fewest += near == [label]
        most += label in near
    return fewest, most


def same_files(saved, exported, what):
    """--save_hf's folder holds export_hf.py's config.json and model.safetensors, byte for byte."""
    names = ("config.json", "model.safetensors")
    read = lambda folder, n: open(os.path.join(folder, n), "rb").read() if os.path.isfile(os.path.join(folder, n)) else None
    same = all(read(saved, n) is not None and read(saved, n) == read(exported, n) for n in names)
    check(same, f"{what}: export_hf.py's config.json and model.safetensors of its checkpoint, byte for byte")


def compare(what, ours, theirs):
    diff = abs(ours - theirs)
    check(diff <= TOL_LOSS, f"{what}: train_llama3 {ours:.6f}, HF {theirs:.6f}, |diff| {diff:.2e} "
          f"(rel {diff / abs(theirs):.1e}; tol {TOL_LOSS:g} absolute)")


def setup(work, tied):
    """The HF model (on the GPU; tied: tie_word_embeddings, embed_tokens also its lm_head) and its seed file
    (None if convert failed)."""
    model, _ = ref_llama3.make_model(ARGS.shape, "cuda", SEED, 0.02, tied=tied)
    tag = "_tied" if tied else ""
    hf_dir, converted = os.path.join(work, f"hf{tag}"), os.path.join(work, f"converted{tag}.bin")
    model.save_pretrained(hf_dir)
    ok = run([sys.executable, "scripts/convert_hf.py", hf_dir, converted])
    check(ok, f"convert_hf.py {hf_dir} -> {converted}")
    return model, converted if ok else None


def export_tie(exported, tied):
    """The export's config.json and model.safetensors tie as the model file does: tie_word_embeddings true and
    no lm_head.weight tensor when tied, false and one when untied."""
    cfg = json.load(open(os.path.join(exported, "config.json")))
    names = set(safetensors_index(os.path.join(exported, "model.safetensors")))
    tie, head = cfg.get("tie_word_embeddings"), "lm_head.weight" in names
    check(tie is tied and head != tied, f"{exported}: config.json's tie_word_embeddings {tie} (want {tied}), "
          f"model.safetensors {'has' if head else 'has no'} lm_head.weight (want {'none' if tied else 'one'})")


def loaded_tie(model, tied, what):
    """from_pretrained's lm_head.weight is embed_tokens.weight (one Parameter, one storage) exactly when tied."""
    head, emb = model.lm_head.weight, model.model.embed_tokens.weight
    same_object, same_data = head is emb, head.data_ptr() == emb.data_ptr()
    ok = (same_object and same_data) if tied else not (same_object or same_data)
    check(ok, f"{what}: lm_head.weight {'is' if same_object else 'is not'} embed_tokens.weight, data_ptr "
          f"{'equal' if same_data else 'different'} (want {'one tensor' if tied else 'two'})")


def greedy_test(work, tokens_file):
    """The trainer's greedy sample after step 1 against HF generate on the exported step-1 weights."""
    model, cfg = ref_llama3.make_model("small", "cuda", SEED + 1, 0.02)
    perm = torch.randperm(cfg.vocab_size, generator=torch.Generator(device="cuda").manual_seed(SEED), device="cuda")
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.mul_(EMBED_SCALE)
        rows = emb[perm]
        model.lm_head.weight.copy_(rows / rows.norm(dim=1, keepdim=True) * HEAD_SCALE)
    hf_dir, converted = os.path.join(work, "hf_greedy"), os.path.join(work, "greedy.bin")
    model.save_pretrained(hf_dir)
    log, ck, exported = (os.path.join(work, n) for n in ("greedy.jsonl", "greedy_ck", "greedy_hf"))
    ok = run([sys.executable, "scripts/convert_hf.py", hf_dir, converted]) and run(
        ["./train_llama3", "--llmc_filepath", converted, "--input_bin", tokens_file, "--num_iteration", "1",
         "--batch_size", str(B), "--sequence_length", str(T), "--total_batch_size", str(B * T), "--learning_rate",
         str(LR), "--sample_every", "1", "--temperature", "0", "--sample_tokens", str(SAMPLE_TOKENS),
         "--log_file", log, "--checkpoint_dir", ck]) and run(
        [sys.executable, "scripts/export_hf.py", os.path.join(ck, "step_00000001", "model.bin"), exported])
    samples = [json.loads(line)["sample_ids"] for line in open(log) if "sample_ids" in line] if ok else []
    check(len(samples) == 1 and len(samples[0]) == SAMPLE_TOKENS + 1 and samples[0][0] == 0,
          f"train_llama3 logged one greedy sample of token 0 + {SAMPLE_TOKENS} ids")
    if not samples:
        return
    trained = LlamaForCausalLM.from_pretrained(exported).float().cuda().eval()
    trained.generation_config.eos_token_id = None  # 32 tokens, whatever they are
    with torch.no_grad():
        hf = trained.generate(torch.zeros(1, 1, dtype=torch.long, device="cuda"), max_new_tokens=SAMPLE_TOKENS,
                              do_sample=False, pad_token_id=0)[0].tolist()
        top2 = trained(input_ids=torch.tensor([hf[:-1]], device="cuda")).logits[0].float().topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).min().item()
    same = sum(a == b for a, b in zip(samples[0], hf))
    check(samples[0] == hf, f"greedy ids == HF generate(do_sample=False) for {SAMPLE_TOKENS} tokens ({same} of "
          f"{len(hf)} equal; smallest HF top-1 margin {margin:.3f})")


def round_trip(work, tokens, tokens_file, tied):
    """Parts 1-3 on the untied model, or (tied) on the tied one: convert, 3 and 4 steps, export, from_pretrained."""
    tag, of = ("_tied", " (tied)") if tied else ("", "")
    model, converted = setup(work, tied)
    if not converted:
        return
    # val: the token file's first VAL_BATCHES batches (batches 1, 2), after step 3
    saved3, eval_file = os.path.join(work, f"run3_save_hf{tag}"), os.path.join(work, "eval.bin")
    examples = write_eval_file(eval_file, tokens)
    losses3, val3, ck3 = train(work, f"run3{tag}", converted, tokens_file, 3,
                               ["--val_every", "3", "--val_bin", tokens_file, "--val_tokens", str(VAL_BATCHES * B * T),
                                "--save_hf", saved3, "--save_hf_dtype", "float32", "--eval_file", eval_file,
                                "--eval_every", "3"])
    if 1 in losses3:
        compare(f"step 1 loss on the converted model{of}, batch 1", losses3[1], hf_loss(model, tokens, 1))
    checkpoint = latest_checkpoint(ck3, 3)
    exported = os.path.join(work, f"step3_hf{tag}")
    if not checkpoint or not run([sys.executable, "scripts/export_hf.py", checkpoint, exported]):
        check(False, f"export_hf.py on the step-3 checkpoint{of}")
        return
    export_tie(exported, tied)
    same_files(saved3, exported, f"--save_hf --save_hf_dtype float32 after step 3{of}")
    trained = LlamaForCausalLM.from_pretrained(exported).float().cuda().eval()
    loaded_tie(trained, tied, f"from_pretrained({exported})")
    moved = max((a - b).abs().max().item() for a, b in zip(trained.parameters(), model.parameters()))
    check(moved > 0, f"the step-3 checkpoint's weights{of} moved from the initial ones (max |change| "
          f"{moved:.1e})")
    accuracy = [json.loads(x).get("eval_acc") for x in open(os.path.join(work, f"run3{tag}.jsonl"))
                if '"step": 3,' in x and "eval_acc" in x]
    fewest, most = hf_eval_range(trained, examples)
    check(len(accuracy) == 1 and fewest / EVAL_EXAMPLES - 1e-6 <= accuracy[0] <= most / EVAL_EXAMPLES + 1e-6,
          f"eval after step 3{of}: train_llama3's accuracy {accuracy} of {EVAL_EXAMPLES} examples, PyTorch's rule on "
          f"the exported checkpoint {fewest} to {most} right (ties within {EVAL_TIE})")
    if 3 in val3:
        hf_val = sum(hf_loss(trained, tokens, k) for k in range(1, VAL_BATCHES + 1)) / VAL_BATCHES
        compare(f"val loss after step 3 vs the exported step-3 checkpoint{of} on val batches 1-2", val3[3], hf_val)
        initial = sum(hf_loss(model, tokens, k) for k in range(1, VAL_BATCHES + 1)) / VAL_BATCHES
        check(abs(initial - val3[3]) > TOL_LOSS, f"... which tells the weights apart: the initial weights' "
              f"val loss is {initial:.6f}")
    else:
        check(False, f"run3{tag} logged a val_loss at step 3")
    losses4, _, ck4 = train(work, f"run4{tag}", converted, tokens_file, 4)
    check(all(losses4.get(s) == losses3[s] for s in losses3), f"the 4-step run logs the 3-step run's losses{of}")
    if 4 in losses4:
        compare(f"step 4 loss (weights after step 3) vs the exported step-3 checkpoint{of}, batch 4", losses4[4],
                hf_loss(trained, tokens, 4))
        initial = hf_loss(model, tokens, 4)
        check(abs(initial - losses4[4]) > TOL_LOSS, f"... a comparison that tells the weights apart: the "
              f"initial weights' HF loss on batch 4 is {initial:.6f}, more than {TOL_LOSS:g} away")
    latest_checkpoint(ck4, 4)
    saved4 = os.path.join(work, f"run4_save_hf{tag}")
    direct, _, ck4_direct = train(work, f"run4_hf_dir{tag}", os.path.join(work, f"hf{tag}"), tokens_file, 4,
                                  ["--save_hf", saved4, "--save_hf_checkpoints", "1"], model_flag="--hf_dir")
    check(direct and direct == losses4, f"--hf_dir on the saved folder{of}: the converted file's 4 losses, bit for "
          f"bit ({direct.get(4)} and {losses4.get(4)} at step 4)")
    exported4 = os.path.join(work, f"step4_hf_bf16{tag}")
    checkpoint4 = latest_checkpoint(ck4_direct, 4)
    if checkpoint4 and run([sys.executable, "scripts/export_hf.py", checkpoint4, exported4, "--dtype", "bfloat16"]):
        same_files(saved4, exported4, f"--save_hf (bfloat16) after step 4{of}")
        same_files(os.path.join(os.path.dirname(checkpoint4), "hf"), exported4,
                   f"--save_hf_checkpoints 1: the step-4 checkpoint's hf/{of}")


def main(work):
    if not os.access(os.path.join(ROOT, "train_llama3"), os.X_OK) or not torch.cuda.is_available():
        check(False, "needs ./train_llama3 (make train_llama3) and a CUDA GPU for PyTorch")
        return
    vocab_size = ref_llama3.SHAPES[ARGS.shape][4]  # (n_layer, n_embd, n_head, n_kv_head, vocab_size, ...)
    tokens, _ = ref_llama3.text_tokens(vocab_size, 8 * B * T + 1)
    tokens_file = os.path.join(work, "tokens.bin")
    write_atomic(tokens_file, ref_llama3.token_file(tokens, False))
    round_trip(work, tokens, tokens_file, tied=False)
    if ARGS.shape == "small" and not ARGS.trainer_flags:
        round_trip(work, tokens, tokens_file, tied=True)
        greedy_test(work, tokens_file)


if __name__ == "__main__":
    if ARGS.work_dir:
        os.makedirs(ARGS.work_dir, exist_ok=True)
        main(ARGS.work_dir)
    else:
        with tempfile.TemporaryDirectory() as d:
            main(d)
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    sys.exit(0 if results and all(results) else 1)
