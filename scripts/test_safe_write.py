#!/usr/bin/env python3
"""Host test of scripts/safe_write.py (no GPU, no numpy): the file appears whole or not at all, an
input is never an output, and no temporary file is left. Ends with "N passed, M failed"."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safe_write import write_atomic  # noqa: E402

results = []


def check(ok, what):
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {what}")


def failing_chunks():
    yield b"new start"
    raise OSError("disk full (simulated)")


with tempfile.TemporaryDirectory() as d:
    out, src, link = os.path.join(d, "out.bin"), os.path.join(d, "in.bin"), os.path.join(d, "link.bin")
    write_atomic(out, [b"abc", memoryview(b"def")])
    check(open(out, "rb").read() == b"abcdef" and os.listdir(d) == ["out.bin"], "written whole, no temporary left")
    try:
        write_atomic(out, failing_chunks())
        raised = False
    except OSError:
        raised = True
    check(raised and open(out, "rb").read() == b"abcdef" and os.listdir(d) == ["out.bin"],
          "a write that fails midway leaves the old file whole and no temporary")
    open(src, "wb").write(b"input")
    os.symlink(src, link)
    for target in (src, link):
        try:
            write_atomic(target, [b"x"], inputs=[src])
            refused = False
        except SystemExit as e:
            refused = "not overwritten" in str(e)
        check(refused and open(src, "rb").read() == b"input", f"an output naming the input ({os.path.basename(target)})"
              " is refused, the input unchanged")
print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
sys.exit(0 if all(results) else 1)
