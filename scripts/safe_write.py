"""Writing a file whole without losing anything (the scripts' rule, as the trainer's): never over one
of the inputs, and through a temporary file in the same folder that is flushed, fsynced and renamed,
so that a crash or a full disk leaves the old file or the new one, never a part."""
import os


def write_atomic(path, chunks, inputs=()):
    """Writes the bytes-like chunks (bytes, contiguous numpy arrays) to `path`. `inputs`: paths this run
    reads; `path` naming one of them (links followed) is refused before anything is written."""
    for i in inputs:
        if os.path.exists(path) and os.path.exists(i) and os.path.samefile(path, i):
            raise SystemExit(f"{path}: is the input {i}; not overwritten")
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
