#!/usr/bin/env python3
"""Host test (no GPU, no torch): every script of scripts/ answers --help and a bad argument, and does nothing else.

A script is a file of scripts/ that starts with "#!" or, for a .py file, has an `if __name__ == "__main__":`
block; the modules (cli.py, cli.sh, llama3_files.py, safe_write.py) have neither and are left out. Each script
runs in a copy of the tree (other tests running at once cannot disturb the comparison), as python3 NAME.py or
bash NAME.sh, with a time limit of 20 s:
  --help          from the copy's top folder and from an empty folder: exit 0, stdout its usage, whose first
                  line is "usage: scripts/NAME ...", nothing on stderr;
  --no_such_flag  from an empty folder: a non-zero exit, one line of output in all, on stderr, naming it;
and after each run the copy, the folder it ran in and its TMPDIR are as they were (no file made, changed or
deleted). The packages that a script may import only after its arguments are parsed (torch, numpy, ...) are
made unimportable (a stub of each name that raises ModuleNotFoundError), the network goes to a dead proxy and
no GPU is visible, so a script that imports one first, downloads, builds or trains fails here on any machine.
Then bench_checkpoint.sh, which deletes the checkpoints it wrote into its folder at the end, is given a folder
of another run's checkpoints: refused in one line, the folder as it was.
Runs after make train_llama3 (make test builds it first): scripts/profile.sh has ./train_llama3 check the flags it
passes on. Prints "ok ..." or "FAIL ..." per check, then "N passed, M failed".
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli import ArgumentParser  # noqa: E402

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
HEAVY = ("torch", "transformers", "numpy", "safetensors", "tiktoken", "matplotlib", "llama_models")
LIMIT_S = 20
NESTED = "LLAMA3_TEST_HELP_OF"  # (set in the scripts' environment: the script checked)
BAD = "--no_such_flag"
results = []


def check(ok, what, detail=""):
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {what}{'' if ok or not detail else ': ' + detail}")


def is_script(path):
    """A file run as a program: a #! line, or a Python file's __main__ block (not a module imported or sourced)."""
    if not path.endswith((".sh", ".py")) or not os.path.isfile(path):
        return False
    text = open(path, errors="replace").read()
    return text.startswith("#!") or (path.endswith(".py") and re.search(r"^if __name__ == .__main__.:", text, re.M))


def copy_tree(dest):
    """The tree as the scripts see it: the top folder's files, scripts/, data/ and dev/, without links, build
    outputs (executables without a suffix) or caches; ./train_llama3 linked when it is built (scripts/profile.sh
    has it check the trainer flags it is given)."""
    def skip(folder, n):
        p = os.path.join(folder, n)
        if os.path.islink(p) or os.path.isdir(p):
            return os.path.islink(p) or folder != ROOT or n not in ("scripts", "data", "dev")
        return "." not in n and os.access(p, os.X_OK)

    def ignore(folder, names):
        return [n for n in names if skip(folder, n)]
    shutil.copytree(ROOT, dest, ignore=ignore)
    if os.path.exists(os.path.join(ROOT, "train_llama3")):
        os.symlink(os.path.join(ROOT, "train_llama3"), os.path.join(dest, "train_llama3"))


def snapshot(folder):
    """Every path under folder (links not followed) with its type, size, mode and modification time."""
    out = {}
    for top, dirs, files in os.walk(folder):
        for n in dirs + files:
            p = os.path.join(top, n)
            st = os.lstat(p)
            out[os.path.relpath(p, folder)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def changes(before, after):
    """'made a, deleted b, changed c' (at most three of each), or ''."""
    kinds = (("made", sorted(set(after) - set(before))), ("deleted", sorted(set(before) - set(after))),
             ("changed", sorted(p for p in set(before) & set(after) if before[p] != after[p])))
    return "; ".join(f"{k} {', '.join(ps[:3])}{' ...' if len(ps) > 3 else ''}" for k, ps in kinds if ps)


def stubs(folder):
    """A module of each HEAVY name that raises ModuleNotFoundError, as on a machine without the package."""
    for name in HEAVY:
        with open(os.path.join(folder, f"{name}.py"), "w") as f:
            f.write(f"raise ModuleNotFoundError('scripts/test_help.py: {name} imported before the arguments "
                    f"were parsed', name={name!r})\n")


def run(cmd, cwd, env):
    """(exit status or 'timed out', stdout, stderr, seconds); the whole process group killed at LIMIT_S."""
    start = time.monotonic()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    try:
        out, err = p.communicate(timeout=LIMIT_S)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        rc = "timed out"
    return rc, out, err, time.monotonic() - start


def one_case(name, args, cwd, folders, env, judge):
    """Runs `name args` in cwd; judge(rc, out, err) gives '' or what is wrong; the folders must not change."""
    tree = os.path.join(folders["tree"], "scripts", name)
    cmd = [sys.executable if name.endswith(".py") else "bash", tree, *args]
    before = {k: snapshot(f) for k, f in folders.items()}
    rc, out, err, secs = run(cmd, cwd, dict(env, **{NESTED: name}))
    wrong = [judge(rc, out, err)] + [f"{k}: {c}" for k, f in folders.items() if (c := changes(before[k], snapshot(f)))]
    wrong = "; ".join(w for w in wrong if w)
    said = (err.strip() or out.strip()).splitlines()
    return wrong + (f" (exit {rc}, {secs:.1f} s; it said: {said[-1][:200]})" if wrong and said else ""), secs


def usage_judge(name):
    def judge(rc, out, err):
        if rc != 0:
            return f"exit {rc}"
        if not out.startswith(f"usage: scripts/{name}"):
            return f"stdout does not start with 'usage: scripts/{name}'"
        return "stderr not empty" if err.strip() else ""
    return judge


def error_judge(fragment):
    def judge(rc, out, err):
        lines = (out + err).strip().splitlines()
        if rc == 0 or rc == "timed out":
            return f"exit {rc}"
        if out.strip() or len(lines) != 1:
            return f"{len(lines)} lines of output{' (some on stdout)' if out.strip() else ''}, not one on stderr"
        return "" if fragment in lines[0] else f"its line does not say {fragment!r}"
    return judge


def another_runs_checkpoints(folder):
    """A --checkpoint_dir of an earlier run: a checkpoint folder and latest."""
    os.makedirs(os.path.join(folder, "step_00000050"))
    for name in ("step_00000050/model.bin", "latest"):
        with open(os.path.join(folder, name), "w") as f:
            f.write("an earlier run's\n")


def main():
    ArgumentParser(__file__, description=__doc__.split("\n\n")[0],
                   epilog="example: python3 scripts/test_help.py   (make test runs it)").parse_args()
    if os.environ.get(NESTED):  # (a script that ignores its argument, run_tests.sh say, runs this test again)
        sys.exit(f"error: scripts/test_help.py run by its own check of scripts/{os.environ[NESTED]}: not again")
    names = sorted(os.listdir(SCRIPTS))
    scripts = [n for n in names if is_script(os.path.join(SCRIPTS, n))]
    modules = [n for n in names if n.endswith((".sh", ".py")) and n not in scripts]
    check(os.path.basename(__file__) in scripts and any(n.endswith(".sh") for n in scripts),
          f"{len(scripts)} scripts found in scripts/ (this test among them); modules left out: {', '.join(modules)}")
    with tempfile.TemporaryDirectory() as work:
        folders = {k: os.path.join(work, k) for k in ("tree", "cwd", "tmp", "stubs")}
        copy_tree(folders["tree"])
        for k in ("cwd", "tmp", "stubs"):
            os.makedirs(folders[k])
        stubs(folders["stubs"])
        dead = "http://127.0.0.1:9"  # (nothing listens there: a download fails at once)
        env = dict(os.environ, PYTHONPATH=folders["stubs"], PYTHONDONTWRITEBYTECODE="1", TMPDIR=folders["tmp"],
                   CUDA_VISIBLE_DEVICES="", http_proxy=dead, https_proxy=dead, HTTP_PROXY=dead, HTTPS_PROXY=dead)
        watched = {k: folders[k] for k in ("tree", "cwd", "tmp")}
        for name in scripts:
            wrong_root, s1 = one_case(name, ["--help"], folders["tree"], watched, env, usage_judge(name))
            wrong_cwd, s2 = one_case(name, ["--help"], folders["cwd"], watched, env, usage_judge(name))
            wrong = "; ".join(f"from {where}: {w}" for where, w in (("the top folder", wrong_root),
                                                                     ("an empty folder", wrong_cwd)) if w)
            check(not wrong, f"scripts/{name} --help: its usage, exit 0, nothing made or changed "
                  f"({max(s1, s2):.2f} s)", wrong)
            wrong, secs = one_case(name, [BAD], folders["cwd"], watched, env, error_judge(BAD))
            check(not wrong, f"scripts/{name} {BAD}: one line naming it, a non-zero exit, nothing made or changed "
                  f"({secs:.2f} s)", wrong)
        old_run = os.path.join(folders["cwd"], "old_run")
        another_runs_checkpoints(old_run)
        wrong, _ = one_case("bench_checkpoint.sh", [old_run], folders["cwd"], watched, env,
                            error_judge(f"{old_run}: not a new or empty folder"))
        check(not wrong, "scripts/bench_checkpoint.sh DIR, a folder of another run's checkpoints: refused in one "
              "line, nothing deleted", wrong)
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    sys.exit(0 if results and all(results) else 1)


if __name__ == "__main__":
    main()
