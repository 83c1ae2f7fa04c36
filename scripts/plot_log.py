#!/usr/bin/env python3
"""Plots training logs: ./train_llama3 --log_file LOG.jsonl, then

    python3 scripts/plot_log.py LOG.jsonl [LOG2.jsonl ...] OUT.png [--label TEXT ...] [--title TEXT]

Several logs are drawn over each other, one colour per run, to compare runs (fp32 and bf16 AdamW
state, say); --label names each run in the legend (one per log, in order; default: the file names).
Panels against the step: the train loss (and the val loss where a line has "val_loss"), the
learning rate, the gradient norm (when the log has "grad_norm": runs with --grad_clip), the eval
accuracy (when the log has "eval_acc": runs with --eval_file), and tokens per second. Each step line of the log is one JSON object with at least "step" and "loss" (the
trainer also writes "lr", "skipped", "ms", "tok_per_s", "peak_mib"); a field a line lacks, or whose
value is null or not finite (a skipped step's loss or grad_norm), is left out of its panel; the
trainer's sample lines ("sample_ids") are skipped. A line that is not JSON, or lacks step or loss,
stops with its file and line number. OUT's suffix is the format: png, pdf, svg, or any other that
matplotlib writes (an unknown one is refused). The figure goes to a temporary name, is fsynced and
renamed, and may not be one of the logs. Needs matplotlib (pip install -r requirements.txt).
"""
import io
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli import ArgumentParser  # noqa: E402
from safe_write import check_output, write_atomic  # noqa: E402


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display), or one line saying how to install it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as e:
        sys.exit(f"error: plot_log.py needs the Python package {e.name}: "
                 "python3 -m pip install -r requirements.txt")
    return plt


def out_format(path):
    """The format OUT's suffix names, if matplotlib writes it (after pyplot(): matplotlib is there)."""
    from matplotlib.backend_bases import FigureCanvasBase
    suffix = os.path.splitext(path)[1][1:].lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix not in formats:
        sys.exit(f"error: {path}: the suffix {suffix or '(none)'!r} is not a format matplotlib writes "
                 f"({', '.join(sorted(formats))})")
    return suffix


def read_log(path):
    """The log's records, each a dict with at least an int step and a loss (a float, or None for null)."""
    records = []
    try:
        lines = open(path).read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        sys.exit(f"error: {path}: cannot read: {e}")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if isinstance(rec, dict) and "sample_ids" in rec:
                continue
            rec["step"] = int(rec["step"])
            rec["loss"] = None if rec["loss"] is None else float(rec["loss"])
        except (ValueError, KeyError, TypeError) as e:
            sys.exit(f"error: {path}:{number}: not a log line with a step and a loss ({e.__class__.__name__}: {e})")
        records.append(rec)
    if not records:
        sys.exit(f"error: {path}: no log lines")
    return records


def series(records, field):
    """(steps, values) of the records that have `field` with a finite value (null and NaN left out)."""
    pairs = [(r["step"], float(r[field])) for r in records
             if isinstance(r.get(field), (int, float)) and math.isfinite(float(r[field]))]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def plot(plt, runs, title, fmt):
    """The figure's bytes: runs is [(label, records)], each run one colour in every panel."""
    has_norm = any(series(records, "grad_norm")[0] for _, records in runs)
    has_acc = any(series(records, "eval_acc")[0] for _, records in runs)
    n = 3 + has_norm + has_acc
    fig, axes = plt.subplots(n, 1, figsize=(8, 2 + 2 * n), sharex=True)
    ax_loss, ax_lr, ax_tok = axes[0], axes[1], axes[-1]
    ax_norm = axes[2] if has_norm else None
    ax_acc = axes[2 + has_norm] if has_acc else None
    for i, (label, records) in enumerate(runs):
        colour = f"C{i}"
        prefix = f"{label} " if len(runs) > 1 else ""
        ax_loss.plot(*series(records, "loss"), lw=0.8, color=colour, alpha=0.6 if len(runs) > 1 else 1,
                     label=prefix + "train")
        val_steps, val = series(records, "val_loss")
        if val:
            ax_loss.plot(val_steps, val, "o-", ms=3, color=colour if len(runs) > 1 else "C1", label=prefix + "val")
        if has_norm:
            ax_norm.plot(*series(records, "grad_norm"), lw=0.8, color=colour, label=label)
        if has_acc:
            ax_acc.plot(*series(records, "eval_acc"), "o-", ms=3, color=colour, label=label)
        ax_lr.plot(*series(records, "lr"), lw=0.8, color=colour, label=label)
        ax_tok.plot(*series(records, "tok_per_s"), lw=0.8, color=colour, label=label)
    if has_norm:
        ax_norm.set_ylabel("grad norm")
    if has_acc:
        ax_acc.set_ylabel("eval accuracy")
    ax_loss.set_ylabel("loss")
    ax_loss.legend()
    ax_lr.set_ylabel("learning rate")
    ax_tok.set_ylabel("tokens / s")
    ax_tok.set_xlabel("step")
    for ax in axes:
        ax.grid(alpha=0.3)
        if len(runs) > 1 and ax is not ax_loss:
            ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format=fmt, dpi=100)
    plt.close(fig)
    return out.getvalue()


def main():
    ap = ArgumentParser(__file__, description=__doc__.split("\n\n")[0],
                        epilog="example: python3 scripts/plot_log.py bf16.jsonl fp32.jsonl cmp.png --label bf16 --label fp32")
    ap.add_argument("logs", nargs="+", metavar="log")
    ap.add_argument("out", help="the figure; its suffix is the format (png, pdf, svg, ...)")
    ap.add_argument("--label", action="append", help="a run's name in the legend: one per log, in order")
    ap.add_argument("--title", help="default: the logs' file names")
    args = ap.parse_args()
    names = [os.path.basename(log) for log in args.logs]
    labels = args.label or names
    if len(labels) != len(args.logs):
        sys.exit(f"error: --label: {len(labels)} given for {len(args.logs)} logs (one per log, in order)")
    check_output(args.out)
    plt = pyplot()
    fmt = out_format(args.out)
    runs = [(label, read_log(log)) for label, log in zip(labels, args.logs)]
    write_atomic(args.out, [plot(plt, runs, args.title or ", ".join(names), fmt)], args.logs)
    for log, (_, records) in zip(args.logs, runs):
        no_loss = len(records) - len(series(records, "loss")[0])
        left_out = f" ({no_loss} without a finite loss left out)" if no_loss else ""
        print(f"{args.out}: {log}: {len(records)} steps plotted{left_out}")


if __name__ == "__main__":
    main()
