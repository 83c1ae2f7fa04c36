#!/usr/bin/env python3
"""Host test of scripts/safe_write.py (no GPU, no numpy): the file appears whole or not at all, an
input is never an output, no temporary file is left, and a write that cannot be made stops with one
line naming the output (not the temporary file). An output folder is made when missing, but a missing
parent is refused in one line and not made (the trainer's --checkpoint_dir rule). Ends with "N passed, M
failed"."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli import ArgumentParser  # noqa: E402
from safe_write import check_new_folder, make_folder, write_atomic  # noqa: E402

results = []


def check(ok, what):
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {what}")


def refusal(path):
    """The message of the SystemExit that write_atomic(path) raises (another exception: its type and text)."""
    try:
        write_atomic(path, [b"x"])
    except SystemExit as e:
        return str(e)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def check_unwritable(d):
    missing = os.path.join(d, "no_such_folder", "out.bin")
    said = refusal(missing)
    check(said and said.startswith("error: ") and missing in said and ".tmp" not in said,
          f"into a folder that does not exist: one line naming the output ({said})")
    folder = os.path.join(d, "a_folder")
    os.makedirs(folder)
    said = refusal(folder)
    check(said and folder in said and ".tmp" not in said and os.listdir(folder) == []
          and sorted(os.listdir(d)) == ["a_folder", "out.bin"],
          f"onto a folder: one line naming it, no temporary left ({said})")


def said_by(f, *args):
    """The SystemExit message of f(*args), or None when it returns."""
    try:
        f(*args)
    except SystemExit as e:
        return str(e)
    return None


def check_folders(d):
    new, nested = os.path.join(d, "new_out"), os.path.join(d, "a", "b", "c")
    check(said_by(check_new_folder, new, "--out_dir") is None and not os.path.exists(new)
          and said_by(make_folder, new, "--out_dir") is None and os.path.isdir(new),
          "a new folder in one that exists: passes the check (which makes nothing), then is made")
    said = said_by(check_new_folder, nested, "--out_dir")
    check(said == f"error: --out_dir {nested}: cannot make the folder: its parent {os.path.dirname(nested)} does "
          "not exist (only the last folder of a path is made, as the trainer makes --checkpoint_dir)"
          and not os.path.exists(os.path.join(d, "a")),
          f"a folder whose parent is missing: refused, nothing made ({said})")
    said = said_by(check_new_folder, os.path.join(d, "out.bin"))
    check(said and said.endswith("out.bin: exists and is not a folder"), f"a file where the folder would be ({said})")


def failing_chunks():
    yield b"new start"
    raise OSError("an input cannot be read (simulated)")


def main():
    ArgumentParser(__file__, description=__doc__, epilog="example: python3 scripts/test_safe_write.py").parse_args()
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
              "an error making a chunk midway passes through as it is, the old file whole and no temporary")
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
        os.remove(link)
        os.remove(src)
        check_unwritable(d)
        check_folders(d)
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
