#!/usr/bin/env python3
"""Test of scripts/plot_log.py (no GPU): a log like the trainer's is drawn into a PNG of the size
asked for, a series holds exactly the finite values of its field (val_loss only where measured, a
NaN loss left out), and bad logs or an output that is
the log stop with one line naming the file (and line). Skipped, without a passed count, when
matplotlib is missing. Ends with "N passed, M failed"."""
import json
import os
import struct
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot_log.py")
passed = failed = 0


def check(ok, what):
    global passed, failed
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    passed, failed = passed + ok, failed + (not ok)


def run(*args):
    r = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr).strip()


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    return struct.unpack(">II", head[16:24]) if head[:8] == b"\x89PNG\r\n\x1a\n" else None


def write_log(path, n, with_val, with_norm=False):
    """A log as the trainer writes it: with_val adds val_loss every 10 steps and a sample line after it."""
    with open(path, "w") as f:
        for step in range(1, n + 1):
            rec = {"step": step, "loss": 12.0 / step ** 0.3, "lr": 3e-4 * min(1, step / 10), "skipped": 0,
                   "ms": 12.7, "tok_per_s": 20000 + step, "peak_mib": 23859}
            if with_norm:
                rec["grad_norm"] = 2.0 / step ** 0.5
            if with_val and step % 10 == 0:
                rec["val_loss"] = rec["loss"] + 0.1
            f.write(json.dumps(rec) + "\n")
            if with_val and step % 10 == 0:
                f.write(json.dumps({"step": step, "sample_ids": [128000, 791, 1176]}) + "\n")


def main():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("skipped: test_plot_log.py needs matplotlib")
        return
    d = tempfile.mkdtemp()
    log, png = os.path.join(d, "log.jsonl"), os.path.join(d, "out.png")
    write_log(log, 100, True)
    rc, out = run(log, png)
    check(rc == 0 and png_size(png) == (800, 800) and "100 steps" in out,
          f"a 100-step log with val_loss and sample lines -> an 800x800 PNG, the samples skipped ({out})")
    write_log(log, 100, True, with_norm=True)
    rc, out = run(log, png)
    check(rc == 0 and png_size(png) == (800, 1000), f"a log with grad_norm gets its panel: 800x1000 ({out})")
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
    write_log(log, 5, False)
    before = open(log).read()
    rc, out = run(log, log)
    check(rc != 0 and open(log).read() == before, f"the output naming the log: refused, the log unchanged ({out})")
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import plot_log
    records = [{"step": 1, "loss": 3.0, "val_loss": 3.5}, {"step": 2, "loss": float("nan")}, {"step": 3, "loss": 2.0}]
    check(plot_log.series(records, "loss") == ([1, 3], [3.0, 2.0]) and
          plot_log.series(records, "val_loss") == ([1], [3.5]) and plot_log.series(records, "lr") == ([], []),
          "series: the finite values of a field, only where a line has it (a NaN loss left out)")
    rc, out = run(os.path.join(d, "missing.jsonl"), png)
    check(rc != 0 and "missing.jsonl: cannot read" in out, f"a missing log: {out}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
