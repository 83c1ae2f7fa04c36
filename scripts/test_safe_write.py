#!/usr/bin/env python3
"""Host test of scripts/safe_write.py (no GPU, no numpy): the file appears whole or not at all, an
input is never an output, no temporary file is left, and a write that cannot be made stops with one
line naming the output (not the temporary file). An output folder is made when missing, but a missing
parent is refused in one line and not made (the trainer's --checkpoint_dir rule); check_output and
check_new_folder refuse what would make a write fail, as the trainer's outputs_writable. Ends with "N
passed, M failed"."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli import ArgumentParser  # noqa: E402
from safe_write import check_new_folder, check_output, make_folder, write_atomic  # noqa: E402

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
    check(said == f"error: --out_dir {nested}: cannot be written: its folder {os.path.dirname(nested)} does not "
          "exist (only the last folder of a path is made)" and not os.path.exists(os.path.join(d, "a")),
          f"a folder whose parent is missing: refused, nothing made ({said})")
    said = said_by(check_new_folder, os.path.join(d, "out.bin"))
    check(said and said.endswith("out.bin: cannot be written: " + os.path.join(d, "out.bin") + " is a file, not a folder"),
          f"a file where the folder would be ({said})")
    os.mkdir(os.path.join(new, "model.safetensors"))
    said = said_by(check_new_folder, new, "OUT_DIR", None, ("config.json", "model.safetensors"))
    check(said and said.endswith("is a folder, where a file goes") and "model.safetensors" in said,
          f"a folder where one of the folder's files goes ({said})")


def check_outputs(d):
    """check_output, as the trainer's outputs_writable: a path under a file, a folder where the file goes,
    a missing folder, a file system too small or read-only (statvfs's answer replaced), no permission
    (a child as another user when this one is root); each one line naming the output, nothing made."""
    under = os.path.join(d, "out.bin", "x", "y.bin")
    said = said_by(check_output, under, "--vocab_out")
    check(said == f"error: --vocab_out {under}: cannot be written: {os.path.join(d, 'out.bin')} is a file, not a "
          "folder", f"a file under a regular file ({said})")
    said = said_by(check_output, d, "OUT")
    check(said and said.endswith(": cannot be written: is a folder, where a file goes"), f"a folder as the file ({said})")
    said = said_by(check_output, os.path.join(d, "new.bin"), None, 1 << 60)
    check(said and "GiB free, and 1073741824.00 GiB are written there" in said, f"a file larger than the free space ({said})")
    check(said_by(check_output, os.path.join(d, "new.bin"), None, 1 << 20) is None and not
          os.path.exists(os.path.join(d, "new.bin")), "a new file that fits: taken, nothing made")
    real = os.statvfs
    os.statvfs = lambda p: os.statvfs_result((4096, 4096, 1, 1, 1, 1, 1, 1, os.ST_RDONLY, 255))
    try:
        said = said_by(check_output, os.path.join(d, "new.bin"), "--out")
    finally:
        os.statvfs = real
    check(said and said.endswith(f"{d} is on a read-only file system"), f"a read-only file system ({said})")
    check_permission(d)


def check_permission(d):
    locked = os.path.join(d, "locked")
    os.mkdir(locked, 0o555)
    pid = os.fork()
    if pid == 0:  # (as nobody when root, for whom 0555 holds)
        try:
            if os.getuid() == 0:
                os.chmod(d, 0o755)
                os.setuid(65534)
            said = said_by(check_output, os.path.join(locked, "x.bin"))
            os._exit(0 if said and said.endswith(f"{locked} is not writable") else 1)
        except BaseException:
            os._exit(2)
    check(os.waitpid(pid, 0)[1] == 0, "a folder this user may not write in: refused in one line")


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
        check_outputs(d)
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
