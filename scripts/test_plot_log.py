#!/usr/bin/env python3
"""Test of scripts/plot_log.py (no GPU): a log like the trainer's is drawn into a PNG of the size
asked for, or a PDF or SVG by the output's suffix; a series holds exactly the finite values of its
field (val_loss only where measured, a NaN or null loss left out, as a skipped step's); bad logs, an
unknown suffix, an output folder that does not exist or an output that is one of the logs stop with one
line naming the file (and line); several logs are drawn in one figure, --label one per log. Without matplotlib only the one-line "needs matplotlib" error is checked
and the rest is skipped ("skipped: ..."). Ends with "N passed, M failed"."""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli import ArgumentParser  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot_log.py")
passed = failed = 0


def check(ok, what):
    global passed, failed
    what = " | ".join(what.splitlines())  # one line per result, also when it quotes several lines of output
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    passed, failed = passed + ok, failed + (not ok)


def run(*args, blocked=None):
    """(exit status, output) of plot_log.py; `blocked`: a module made unimportable first."""
    block = f"import sys, runpy; sys.modules[{blocked!r}] = None; sys.argv = sys.argv[1:]; " \
            "runpy.run_path(sys.argv[0], run_name='__main__')"
    r = subprocess.run([sys.executable, *(["-c", block] if blocked else []), SCRIPT, *args],
                       capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr).strip()


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    return struct.unpack(">II", head[16:24]) if head[:8] == b"\x89PNG\r\n\x1a\n" else None


def write_log(path, n, with_val, with_norm=False, skip_every=0, with_acc=False):
    """A log as the trainer writes it: with_val adds val_loss every 10 steps and a sample line after it,
    with_acc eval_acc every 20; every skip_every-th step is skipped, its loss and grad_norm null (the
    trainer's non-finite values)."""
    with open(path, "w") as f:
        for step in range(1, n + 1):
            skipped = skip_every and step % skip_every == 0
            rec = {"step": step, "loss": None if skipped else 12.0 / step ** 0.3, "skipped": int(skipped),
                   "lr": 3e-4 * min(1, step / 10), "ms": 12.7, "tok_per_s": 20000 + step, "peak_mib": 23859}
            if with_norm:
                rec["grad_norm"] = None if skipped else 2.0 / step ** 0.5
            if with_val and step % 10 == 0:
                rec["val_loss"] = 12.0 / step ** 0.3 + 0.1
            if with_acc and step % 20 == 0:
                rec["eval_acc"] = 0.25 + step / 1000
            f.write(json.dumps(rec) + "\n")
            if with_val and step % 10 == 0:
                f.write(json.dumps({"step": step, "sample_ids": [128000, 791, 1176]}) + "\n")


def check_formats(d, log):
    """The output's suffix picks the format; an unknown suffix is refused before anything is written."""
    write_log(log, 30, True)
    for suffix, magic in (("pdf", b"%PDF-"), ("svg", b"<svg")):
        out = os.path.join(d, f"out.{suffix}")
        rc, said = run(log, out)
        head = open(out, "rb").read(4096) if os.path.exists(out) else b""
        check(rc == 0 and magic in head, f"out.{suffix} holds {suffix.upper()}, not PNG bytes ({said})")
    rc, said = run(log, os.path.join(d, "out.xyz"))
    check(rc != 0 and len(said.splitlines()) == 1 and "out.xyz" in said and "'xyz'" in said
          and not os.path.exists(os.path.join(d, "out.xyz")), f"an unknown suffix: one line ({said[:90]}...)")


def check_skipped_steps(d, log, png):
    """A log with null loss and grad_norm on skipped steps plots, those points left out."""
    write_log(log, 100, True, with_norm=True, skip_every=7)
    rc, out = run(log, png)
    check(rc == 0 and png_size(png) == (800, 1000) and "14 without a finite loss left out" in out,
          f"null loss and grad_norm on 14 skipped steps: plotted, the points left out ({out})")
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import plot_log
    records = plot_log.read_log(log)
    steps, _ = plot_log.series(records, "grad_norm")
    check(len(steps) == 86 and 7 not in steps and 8 in steps, "series leaves the null grad_norms out")


def check_unwritable(d, log):
    out = os.path.join(d, "no_such_folder", "out.png")
    rc, said = run(log, out)
    check(rc != 0 and len(said.splitlines()) == 1 and out in said and ".tmp" not in said,
          f"an output in a folder that does not exist: one line naming it ({said})")


def check_several_logs(d, log):
    """Two logs over each other with their labels; a label count that is not one per log is refused,
    and so is an output naming the second log."""
    log2 = os.path.join(d, "log2.jsonl")
    write_log(log, 50, True)
    write_log(log2, 40, True, with_norm=True)
    png = os.path.join(d, "two.png")
    rc, out = run(log, log2, png, "--label", "fp32", "--label", "bf16")
    check(rc == 0 and png_size(png) == (800, 1000) and "log.jsonl: 50 steps" in out and "log2.jsonl: 40 steps" in out,
          f"two logs, labelled, one with grad_norm: one 800x1000 PNG, each log's steps counted ({out})")
    rc, out = run(log, log2, png, "--label", "fp32")
    check(rc != 0 and len(out.splitlines()) == 1 and "--label" in out and "1 given for 2 logs" in out,
          f"one --label for two logs: one line ({out})")
    png_log = os.path.join(d, "second.png")  # a suffix matplotlib writes: refused as an input, not as the format
    write_log(png_log, 5, False)
    before = open(png_log).read()
    rc, out = run(log, png_log, png_log)
    check(rc != 0 and "not overwritten" in out and open(png_log).read() == before,
          f"the output naming the second log: refused, the log unchanged ({out})")


def main():
    ArgumentParser(__file__, description=__doc__, epilog="example: python3 scripts/test_plot_log.py").parse_args()
    d = tempfile.mkdtemp()
    log, png = os.path.join(d, "log.jsonl"), os.path.join(d, "out.png")
    write_log(log, 5, False)
    rc, out = run(log, png, blocked="matplotlib")
    check(rc != 0 and len(out.splitlines()) == 1 and out.startswith("error: ") and "matplotlib" in out
          and "pip install" in out, f"without matplotlib: one line with the pip command ({out})")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("skipped: test_plot_log.py's plots need matplotlib (pip install -r requirements.txt)")
        print(f"{passed} passed, {failed} failed")
        sys.exit(1 if failed else 0)
    write_log(log, 100, True)
    rc, out = run(log, png)
    check(rc == 0 and png_size(png) == (800, 800) and "100 steps" in out,
          f"a 100-step log with val_loss and sample lines -> an 800x800 PNG, the samples skipped ({out})")
    write_log(log, 100, True, with_norm=True)
    rc, out = run(log, png)
    check(rc == 0 and png_size(png) == (800, 1000), f"a log with grad_norm gets its panel: 800x1000 ({out})")
    write_log(log, 100, True, with_norm=True, with_acc=True)
    rc, out = run(log, png)
    check(rc == 0 and png_size(png) == (800, 1200), f"... and with eval_acc one more: 800x1200 ({out})")
    write_log(log, 1, False)
    rc, out = run(log, png, "--title", "one step")
    check(rc == 0 and png_size(png) == (800, 800), f"a one-step log without val_loss plots ({out})")
    with open(log, "a") as f:
        f.write('{"step": 2, "loss": 5.0}\nnot json\n')
    rc, out = run(log, png)
    check(rc != 0 and "log.jsonl:3:" in out and len(out.splitlines()) == 1, f"a line that is not JSON: {out}")
    with open(log, "w") as f:
        f.write('{"step": 1, "lr": 1e-4}\n')
    rc, out = run(log, png)
    check(rc != 0 and "log.jsonl:1:" in out and "KeyError" in out, f"a line without a loss: {out}")
    open(log, "w").close()
    rc, out = run(log, png)
    check(rc != 0 and "no log lines" in out, f"an empty log: {out}")
    png_log = os.path.join(d, "log.png")  # a suffix matplotlib writes: refused as the input, not the format
    write_log(png_log, 5, False)
    before = open(png_log).read()
    rc, out = run(png_log, png_log)
    check(rc != 0 and "not overwritten" in out and open(png_log).read() == before,
          f"the output naming the log: refused, the log unchanged ({out})")
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import plot_log
    records = [{"step": 1, "loss": 3.0, "val_loss": 3.5}, {"step": 2, "loss": float("nan")}, {"step": 3, "loss": 2.0}]
    check(plot_log.series(records, "loss") == ([1, 3], [3.0, 2.0]) and
          plot_log.series(records, "val_loss") == ([1], [3.5]) and plot_log.series(records, "lr") == ([], []),
          "series: the finite values of a field, only where a line has it (a NaN loss left out)")
    rc, out = run(os.path.join(d, "missing.jsonl"), png)
    check(rc != 0 and "missing.jsonl: cannot read" in out, f"a missing log: {out}")
    check_formats(d, log)
    check_skipped_steps(d, log, png)
    check_unwritable(d, log)
    check_several_logs(d, log)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
