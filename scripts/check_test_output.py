#!/usr/bin/env python3
"""What `make test` printed on the screen, against what it should print: at most --max_lines lines (60: the
screen of a machine without a GPU), each of a kind make test prints (the build's two lines, a line per part, a
FAIL line's detail, the skipped parts, the summary; not a progress line or a warning), the parts in the order
they started (the log's "-- start NAME" lines), the test time with the build's, and a summary whose counts are
the parts' and the skipped lines'.

    make test | tee screen.txt; python3 scripts/check_test_output.py screen.txt build/make_test.log

.ci/run checks its make test so; make test checks this script on made-up screens. Prints "ok ..." or
"FAIL ..." per check, then "N passed, M failed"; exits 1 if any failed.
"""
import re
import sys

from cli import ArgumentParser

# The kinds of line make test prints on the screen (Makefile's test target, scripts/run_tests.sh's show).
KINDS = [r"build: make .*", r"-- build: \d+ targets, \d+ s",
         r"== installing the Python packages .*", r"   .*",
         r"-- part .+: (\d+ FAILED, )?(\d+ passed(, \d+ skipped)?|skipped), \d+ s",
         r"SKIPPED .*", r"\d+ of the \d+ skipped parts are the GPU parts, .*", r"To run them: .*",
         r"with torch and transformers .*", r"test time: \d+ s \(build \d+ s, tests \d+ s\)",
         r"the whole output: .*", r"\d+ passed, \d+ failed, \d+ skipped"]
PART = re.compile(r"-- part (.+): (?:(\d+) FAILED, )?(?:(\d+) passed|skipped)")
START = re.compile(r"-- start (.+) at \d+ s$")
TIME = re.compile(r"test time: (\d+) s \(build (\d+) s, tests (\d+) s\)$")
SUMMARY = re.compile(r"(\d+) passed, (\d+) failed, (\d+) skipped$")
results = []


def check(ok, what, detail=""):
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {what}{'' if ok or not detail else ': ' + detail}")


def odd_line(lines):
    """The first line of no kind make test prints, with its number, or None."""
    return next((f"line {i + 1}: {line[:100]!r}" for i, line in enumerate(lines)
                 if not any(re.fullmatch(k, line) for k in KINDS)), None)


def part_counts(lines):
    """(names, passed, failed) of the part lines, in their order."""
    parts = [PART.match(line) for line in lines if PART.match(line)]
    return ([m.group(1) for m in parts], sum(int(m.group(3) or 0) for m in parts),
            sum(int(m.group(2) or 0) for m in parts))


def main():
    ap = ArgumentParser(__file__, description=__doc__.split("\n\n")[0])
    ap.add_argument("screen", metavar="SCREEN", help="make test's screen output, as a file")
    ap.add_argument("log", metavar="LOG", help="its whole output (build/make_test.log)")
    ap.add_argument("--max_lines", type=int, default=60, help="the most lines the screen may have (default 60)")
    args = ap.parse_args()
    try:
        lines = open(args.screen, errors="replace").read().splitlines()
        started = [m.group(1) for m in map(START.match, open(args.log, errors="replace").read().splitlines()) if m]
    except OSError as e:
        sys.exit(f"error: {e.filename}: {e.strerror}")
    check(len(lines) <= args.max_lines, f"{len(lines)} lines, at most {args.max_lines}")
    odd = odd_line(lines)
    check(odd is None, "every line is one of make test's kinds", f"{odd} is none")
    names, passed, failed = part_counts(lines)
    check(names and names == started, f"a line per part, {len(names)}, in the order they started",
          f"the parts {names} against the starts {started}")
    times = [TIME.match(line) for line in lines if TIME.match(line)]
    check(len(times) == 1 and int(times[0].group(1)) == int(times[0].group(2)) + int(times[0].group(3)),
          "one test time line, the build's time and the tests' added", f"{[t.group(0) for t in times]}")
    summary = SUMMARY.fullmatch(lines[-1]) if lines else None
    skipped = sum(line.startswith("SKIPPED ") for line in lines)
    counts = [int(g) for g in summary.groups()] if summary else []
    check(counts and counts[0] == passed and counts[1] >= failed and counts[2] == skipped,
          "the last line is the summary: the parts' passed and failed (and any failed outside them), the skipped lines",
          f"{lines[-1] if lines else '(no lines)'!r} against {passed} passed, {failed} failed, {skipped} skipped")
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
