#!/usr/bin/env python3
"""The table of `make sanitize`: reads the compute-sanitizer logs scripts/sanitize.sh wrote
(DIR/CASE.TOOL.log, with the exit status in CASE.TOOL.rc) and counts each tool's reports per case,
attributed to our kernels or to NVIDIA's libraries by the kernel the report names.

    python3 scripts/sanitize_report.py DIR memcheck racecheck initcheck synccheck

A report is one block of the log: a line "========= <what happened>" and its indented lines. The
library kernels are cuBLASLt's GEMMs (nvjet_*, cutlass/xmma kernels), CUB's radix sort, which the
token sort of the sparse embedding gradient instantiates, and NCCL's collectives (two ranks): their
code is NVIDIA's, we cannot change it, and their results are checked by make test. A CUDA API error
that follows a library kernel's fault in the same log ("Program hit cudaErrorLaunchFailure": memcheck
and synccheck end the faulting kernel, and the next synchronization reports it) is counted with the
library. A case passes when it finished (a summary line, within the time limit), its program exited
0, and no report names a kernel of ours. The table gives each case's seconds (CASE.TOOL.seconds).
Ends with one line, "N passed, M failed; reports in our kernels: TOOL N, ...; in NVIDIA's libraries:
TOOL N, ..."; exits 1 if any case failed. --case NAME prints that case's line under each tool alone
(sanitize.sh, as each run ends).
"""
import collections
import os
import re
import sys

from cli import ArgumentParser

LIBRARY = re.compile(r"nvjet|cublas|cutlass|xmma|\bsm\d\d_|cub::|CUB_\d|nccl")
NOT_A_REPORT = re.compile(r"COMPUTE-SANITIZER|(ERROR|RACECHECK|LEAK) SUMMARY|Target application returned|"
                          r"process didn't terminate successfully")
SUMMARY = re.compile(r"(ERROR|RACECHECK) SUMMARY")
API_ERROR = re.compile(r"^Program hit cudaError")
KILLED = re.compile(r"process didn't terminate successfully")


def reports(log_text):
    """The blocks of a compute-sanitizer log, each its lines without the ========= prefix; only the
    device-side part (before the host backtrace), which names the kernel, except for a host API
    access (initcheck's "Host API memory access error"), which names no kernel: its host frames."""
    blocks, current = [], None
    for line in log_text.splitlines():
        if not line.startswith("========="):
            continue
        body = line[len("========="):]
        if body.startswith(" ") and not body.startswith("  ") and body.strip():
            current = None
            if not NOT_A_REPORT.search(body):
                current = [body.strip()]
                blocks.append(current)
        elif current is not None and "host backtrace" in body and not current[0].startswith("Host API"):
            current = None
        elif current is not None and body.strip():
            current.append(body.strip())
    return blocks


def kernel_of(block):
    """The first kernel the block names (the text before its argument list), or the first line; for
    a host API access, the first two host functions of its backtrace (caller last)."""
    if block[0].startswith("Host API"):
        frames = [re.sub(r"\(.*", "", line.split("Host Frame:", 1)[1].strip()) for line in block if "Host Frame:" in line]
        frames = [(re.search(r"[\w:~]+(?:<[^()\s]*>)?$", f) or re.search(".*", f)).group(0) for f in frames]
        return " <- ".join(frames[:2])[:90] if frames else block[0][:90]
    for line in block:
        m = re.search(r"(?:at|in) (?:void )?([A-Za-z_][\w:<>, ]*?)(?:\(|\+0x)", line)
        if m:
            return m.group(1)[:90]
    return block[0][:90]


def read_file(path, default=""):
    return open(path, errors="replace").read().strip() if os.path.exists(path) else default


def read_case(path_stem):
    text = read_file(path_stem + ".log")
    rc_text = read_file(path_stem + ".rc", "?")
    ours, library = [], []
    for block in reports(text):
        # an API error after a library kernel's fault is that fault's consequence
        is_library = LIBRARY.search("\n".join(block)) or (API_ERROR.search(block[0]) and library)
        (library if is_library else ours).append(block)
    return ours, library, rc_text, bool(SUMMARY.search(text)), bool(KILLED.search(text))


def status_of(ours, library, rc_text, finished, killed):
    if rc_text == "124":
        return "timed out"
    if rc_text == "?":
        return "not finished (no exit status: the whole run was stopped)"
    if not finished:
        return f"no summary (exit {rc_text})"
    if ours:
        return "FAIL"
    if rc_text == "0":
        return "ok"
    if rc_text == "9" and killed:
        return "killed (signal 9)"
    return f"exit {rc_text}" + (" (after the library's fault)" if library else "")


Run = collections.namedtuple("Run", "tool case ours library status seconds")  # ours, library: the reports


def runs(out, tools, cases):
    """Each run's Run, tool after tool; a case not run under a tool (SANITIZE_CASES) is left out."""
    for tool in tools:
        for case in cases:
            stem = os.path.join(out, f"{case}.{tool}")
            if os.path.exists(stem + ".log"):
                ours, library, rc_text, finished, killed = read_case(stem)
                yield Run(tool, case, ours, library, status_of(ours, library, rc_text, finished, killed),
                          read_file(stem + ".seconds", "?"))


def summary(done, tools):
    """The last line: the runs that passed and failed, and each tool's reports, ours and the libraries'."""
    def per_tool(who):
        return ", ".join(f"{t} {sum(len(getattr(r, who)) for r in done if r.tool == t)}" for t in tools)
    passed = sum(r.status == "ok" for r in done)
    return (f"{passed} passed, {len(done) - passed} failed; reports in our kernels: {per_tool('ours')}; "
            f"in NVIDIA's libraries: {per_tool('library')}")


def main():
    ap = ArgumentParser(__file__, description=__doc__.split("\n\n")[0],
                        epilog="example: scripts/sanitize_report.py /tmp/sanitize memcheck racecheck\n"
                               "         (SANITIZE_OUT=/tmp/sanitize scripts/sanitize.sh keeps the logs there)")
    ap.add_argument("dir", metavar="DIR", help="the folder of CASE.TOOL.log and CASE.TOOL.rc (sanitize.sh's SANITIZE_OUT)")
    ap.add_argument("tools", metavar="TOOL", nargs="+", choices=("memcheck", "racecheck", "initcheck", "synccheck"),
                    help="the tools to report: memcheck, racecheck, initcheck, synccheck")
    ap.add_argument("--case", metavar="NAME", help="only this case: a line per tool, no table")
    args = ap.parse_args()
    out, tools = args.dir, args.tools
    if not os.path.isdir(out):
        sys.exit(f"error: {out}: not a folder")
    cases = sorted({f.rsplit(".", 2)[0] for f in os.listdir(out) if f.endswith(".log") and f.count(".") == 2})
    if args.case:
        for r in runs(out, tools, [args.case]):
            print(f"{r.tool} {r.case}: {r.status}, {len(r.ours)} reports in our kernels, {len(r.library)} in NVIDIA's "
                  f"libraries, {r.seconds} s")
        return
    if not cases:
        sys.exit(f"error: {out}: no CASE.TOOL.log files (scripts/sanitize.sh writes them)")
    groups = collections.Counter()
    done = list(runs(out, tools, cases))
    print("| tool | case | reports in our kernels | in NVIDIA libraries | status | s |")
    print("|---|---|---|---|---|---|")
    for r in done:
        print(f"| {r.tool} | {r.case} | {len(r.ours)} | {len(r.library)} | {r.status} | {r.seconds} |")
        for who, blocks in (("OURS", r.ours), ("library", r.library)):
            for b in blocks:
                groups[(r.tool, who, re.sub(r"0x[0-9a-f]+", "0x..", b[0])[:70], kernel_of(b))] += 1
    for (tool, who, what, kernel), n in sorted(groups.items()):
        print(f"{who:7s} {tool:9s} {n:6d} x {what} | {kernel}")
    if any(who == "library" for _, who, _, _ in groups):
        print("library: reports inside cuBLASLt's, CUB's or NCCL's own kernels, not code of this project")
    if any(r.status.startswith("killed") for r in done):
        print("killed (signal 9): most often the host's out-of-memory killer (dmesg names the process); under"
              " racecheck a training run's host memory grows 1.3-1.8 GB/s: SANITIZE_HEAVY_JOBS=1 (the default) runs them one"
              " at a time")
    print(f"logs in {out}")
    print(summary(done, tools))
    sys.exit(0 if all(r.status == "ok" for r in done) else 1)


if __name__ == "__main__":
    main()
