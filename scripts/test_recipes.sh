#!/usr/bin/env bash
# usage: scripts/test_recipes.sh [--list | --check NAME DIR] [NAME ...]   (make test-recipes; needs a GPU)
# The README's recipes, run as written. A recipe is the ```bash block after a line
# "<!-- recipe NAME -->" in README.md; "<!-- recipe NAME; the test appends: ARGS -->" adds ARGS to
# each ./train_llama3 command of it (a long run cut short with --stop_after), and "<!-- recipe NAME:
# not run (WHY) -->" lists it as skipped. Every command runs in a scratch folder where train_llama3
# and scripts/ are links to this tree's and data/ a folder of links to its files (prepare_data.py
# writes there), so that no output lands in the tree. What a machine without network cannot run is
# replaced, and said: `hf` (the gated download) is not run; Llama-3.2-1B/ is instead a small random
# model of the LLaMA-3 vocabulary (ref_llama3.py --model_only, exported by export_hf.py) with a
# tokenizer.json made from data/llama3_vocab.bin, and my_texts/ is Tiny Shakespeare decoded from
# data/. A command with --shape 8b needs a GPU of 120 GiB or more (the README: 111.43 GiB), else it is
# skipped. A recipe passes when each command exits 0 and its outputs are whole (check_NAME below).
#   NAME ...         the recipes to run (default: all), then "N passed, M failed"
#   --list           the recipes and their commands as the test reads them, and exit (no GPU needed)
#   --check NAME DIR whether DIR holds what recipe NAME leaves (check_NAME below), exit 0 or 1 (no GPU
#                    needed: make test checks the checks on made-up folders)
#   RECIPES_KEEP=DIR keep the scratch folder (outputs and each command's log) there
# Example: scripts/test_recipes.sh embedded finetune
set -u
. "$(dirname "$0")/cli.sh"
list=0 names=() check_only=""
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help) usage ;;
    --list) list=1 ;;
    --check)
        [ $# -ge 3 ] || { echo "error: --check needs a recipe's name and a folder" >&2; exit 2; }
        check_only=$2
        work=$(cd "$3" 2> /dev/null && pwd) || { echo "error: --check $2 $3: no such folder" >&2; exit 2; }
        shift 2 ;;
    -*) unknown_argument "$1" ;;
    *) names+=("$1") ;;
    esac
    shift
done
cd "$(dirname "$0")/.."
repo=$PWD

# The recipes, one line each: "recipe NAME", "skip WHY", "cmd COMMAND" (continuations joined,
# comments dropped, the appended ARGS in place).
recipes() {
    python3 - README.md <<'PY'
import re, sys
lines = open(sys.argv[1]).read().split("\n")
for i, line in enumerate(lines):
    m = re.match(r"<!-- recipe (\w+)(?:; the test appends: (.*?))?(?:: not run \((.*)\))? -->$", line)
    if not m:
        continue
    name, append, skip = m.groups()
    print("recipe", name)
    if skip:
        print("skip", skip)
    if lines[i + 1] != "```bash":
        print("error", f"README.md:{i + 2}: the recipe's ```bash block must follow its marker")
    body = lines[i + 2:lines.index("```", i + 2)]
    for cmd in re.sub(r"\\\n\s*", "", "\n".join(body)).split("\n"):
        cmd = re.sub(r"\s+#.*$", "", cmd).strip()
        if cmd and not cmd.startswith("#"):
            print("cmd", cmd + (" " + append if append and cmd.startswith("./train_llama3") else ""))
PY
}
if [ "$list" = 1 ]; then recipes; exit; fi

# The outputs each recipe leaves, checked after its commands (steps STEPS of LOG, each once).
steps_once() { # LOG STEPS: the log's step lines are 1..STEPS, each once
    [ "$(grep -o '"step": [0-9]*, "loss"' "$work/$1" 2> /dev/null | tr -dc '0-9\n' | tr '\n' ' ')" = "$(seq -s ' ' 1 "$2") " ]
}
# (the val loss in the last step's line; a sample line follows it)
check_embedded() { steps_once run.jsonl 2000 && grep '"loss"' "$work/run.jsonl" | tail -n 1 | grep -q '"val_loss"' && [ -s "$work/run.png" ]; }
check_resume() { steps_once parts.jsonl 2000 && [ -f "$work/ckpt/step_00002000/state.bin" ]; }
check_finetune() {
    steps_once mine.jsonl 200 && grep -q '"val_loss"' "$work/mine.jsonl" &&
        for f in config.json model.safetensors tokenizer.json; do [ -s "$work/my-llama/$f" ] || return 1; done
}
check_longcontext() { steps_once long.jsonl 100 && grep -q '"val_loss"' "$work/long.jsonl"; }
check_larger() { :; }
check_fp8() { :; }
if [ -n "$check_only" ]; then
    declare -F "check_$check_only" > /dev/null || { echo "error: no check for a recipe '$check_only'" >&2; exit 2; }
    "check_$check_only"
    exit
fi
nvidia-smi -L > /dev/null 2>&1 || { echo "error: scripts/test_recipes.sh needs a GPU (nvidia-smi finds none)" >&2; exit 1; }
[ -x train_llama3 ] || { echo "error: no ./train_llama3: run make train_llama3 first" >&2; exit 1; }

work=${RECIPES_KEEP:-$(mktemp -d)}
mkdir -p "$work/data" || exit 1
[ -n "${RECIPES_KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
ln -sf "$repo/train_llama3" "$repo/scripts" "$work/"
for f in data/*; do ln -sf "$repo/$f" "$work/data/"; done
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
# The resume recipe keeps two checkpoints of the 1B (6 GB of weights and 12 GB of AdamW state each):
# with less than 40 GiB free where they go, it fails for its disk, not for the trainer.
free_gib=$(df -Pk "$work" | awk 'NR == 2 { print int($4 / 1048576) }')

# What the download would bring: a small model in Hugging Face's layout with the LLaMA-3 vocabulary,
# its tokenizer.json (the ranks are the ids of data/llama3_vocab.bin, the specials from 128000), and
# text to fine-tune on.
stand_ins() {
    python3 scripts/ref_llama3.py --name tiny --shape small --vocab 128256 --model_only --out_dir "$work" &&
        python3 scripts/export_hf.py "$work/tiny_model.bin" "$work/Llama-3.2-1B" && python3 - "$work" <<'PY'
import os, sys
import numpy as np
sys.path.insert(0, "scripts")
import prepare_data as pd
from test_prepare_data import write_tokenizer_json
work = sys.argv[1]
raw = open("data/llama3_vocab.bin", "rb").read()
n = int(np.frombuffer(raw[:12], "<i4")[2])
offsets = np.frombuffer(raw[1024:1024 + 4 * (n + 1)], "<u4")
body = raw[1024 + 4 * (n + 1):]
token = [body[offsets[i]:offsets[i + 1]] for i in range(n)]
ranks = {token[i]: i for i in range(pd.LLAMA3_BOS)}  # (the specials follow, numbered from 128000)
write_tokenizer_json(os.path.join(work, "Llama-3.2-1B", "tokenizer.json"), ranks, merges=[])
ids = np.frombuffer(open("data/tiny_shakespeare_train.bin", "rb").read()[1024:], "<u4")
text = b"".join(token[i] for i in ids if i < pd.LLAMA3_BOS)
os.makedirs(os.path.join(work, "my_texts"))
for k in range(4):  # four documents
    part = text[k * len(text) // 4:(k + 1) * len(text) // 4]
    open(os.path.join(work, "my_texts", f"part{k}.txt"), "wb").write(part)
PY
}

passed=0 failed=0
result() { # OK NAME DETAIL
    if [ "$1" = 1 ]; then echo "ok   $2"; passed=$((passed + 1)); else echo "FAIL $2: $3"; failed=$((failed + 1)); fi
}
# run_recipe NAME: its commands in order in the scratch folder, each logged to NAME.K.log; stops at
# the first that fails.
run_recipe() {
    local name=$1 k=0 cmd t0 why
    t0=$SECONDS
    while IFS= read -r cmd; do
        k=$((k + 1))
        why=""
        case $cmd in
        "hf "*) echo "     $name: not run, no network here (Llama-3.2-1B/ is the test's small model): $cmd"; continue ;;
        *"--shape 8b"*) [ "$gpu_mib" -ge 122880 ] || why="needs a GPU of 120 GiB or more; this one has $gpu_mib MiB" ;;
        *"--fp8 1"*) fp8_gpu || why="needs compute capability 8.9 or newer" ;;
        esac
        if [ -n "$why" ]; then echo "skipped: recipe $name, $cmd ($why)"; continue; fi
        if ! (cd "$work" && timeout 900 bash -c "$cmd") > "$work/$name.$k.log" 2>&1; then
            result 0 "recipe $name" "'$cmd' failed: $(tail -n 2 "$work/$name.$k.log" | tr '\n' ' ')"
            return
        fi
        echo "     $name: $cmd ($(grep -E '^(steady state|done:)' "$work/$name.$k.log" | tail -n 1))"
    done < <(recipes | awk -v n="$name" '$1 == "recipe" { on = ($2 == n) } on && $1 == "cmd" { sub(/^cmd /, ""); print }')
    if "check_$name"; then result 1 "recipe $name ($((SECONDS - t0)) s)"; else result 0 "recipe $name" "its outputs are not whole"; fi
}

all=$(recipes)
if echo "$all" | grep -q '^error '; then echo "$all" | grep '^error ' | sed 's/^error /error: /'; exit 1; fi
[ ${#names[@]} -gt 0 ] || mapfile -t names < <(echo "$all" | awk '$1 == "recipe" { print $2 }')
for name in "${names[@]}"; do
    echo "$all" | grep -qx "recipe $name" || { echo "error: README.md has no recipe '$name'" >&2; exit 2; }
    skip=$(echo "$all" | awk -v n="$name" '$1 == "recipe" { on = ($2 == n) } on && $1 == "skip" { sub(/^skip /, ""); print }')
    if [ -n "$skip" ]; then echo "skipped: recipe $name ($skip)"; continue; fi
    if [ "$name" = resume ] && [ "$free_gib" -lt 40 ]; then
        result 0 "recipe resume" "needs 40 GiB free in $work for its two checkpoints of the 1B; $free_gib GiB are"
        continue
    fi
    if [[ $name == finetune || $name == longcontext ]] && [ ! -d "$work/Llama-3.2-1B" ]; then
        stand_ins > "$work/stand_ins.log" 2>&1 || { result 0 "recipe $name" "the stand-in model: $(tail -n 2 "$work/stand_ins.log")"; continue; }
    fi
    run_recipe "$name"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
