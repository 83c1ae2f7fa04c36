"""Writing a file whole without losing anything (the scripts' rule, as the trainer's): never over one
of the inputs, and through a temporary file in the same folder that is flushed, fsynced and renamed,
so that a crash or a full disk leaves the old file or the new one, never a part. A write that fails
(no such folder, no permission, a full disk, a folder where the file would go) stops with one line
naming the output, not the temporary file. An output folder that a script makes follows the trainer's
rule for --checkpoint_dir: made when missing, but only it, in a folder that exists (check_new_folder
before any work, make_folder when the first file is written)."""
import contextlib
import os


def refuse_input(path, inputs):
    """Stops when `path` names one of `inputs` (links followed): no output may be an input."""
    for i in inputs:
        if os.path.exists(path) and os.path.exists(i) and os.path.samefile(path, i):
            raise SystemExit(f"error: {path}: is the input {i}; not overwritten")


@contextlib.contextmanager
def named_errors(path):
    """An OSError of writing `path` as one line naming `path`."""
    try:
        yield
    except OSError as e:
        raise SystemExit(f"error: {path}: cannot write: {e.strerror or e}") from None


def write_atomic(path, chunks, inputs=()):
    """Writes the bytes-like chunks (bytes, contiguous numpy arrays) to `path`. `inputs`: paths this run
    reads; `path` naming one of them is refused before anything is written. An error raised while making
    a chunk (the caller's, e.g. reading an input) passes through as it is."""
    refuse_input(path, inputs)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise SystemExit(f"error: {path}: cannot write: no folder {folder}")
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with named_errors(path):
            f = open(tmp, "wb")
        with f:
            for chunk in chunks:
                with named_errors(path):
                    f.write(chunk)
            with named_errors(path):
                f.flush()
                os.fsync(f.fileno())
        with named_errors(path):
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def folder_name(path, flag):
    """A folder as messages name it: with its flag (--out_dir DIR) when it has one."""
    return f"{flag} {path}" if flag else path


def check_new_folder(path, flag=None):
    """Stops unless `path` (the folder of `flag`, for the message) is a folder, or can be made as one: its
    parent is a writable folder. A missing parent is refused, not made: a mistyped path (a/b/c for a/c) is
    named, not created. Makes nothing."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise SystemExit(f"error: {folder_name(path, flag)}: exists and is not a folder")
        return
    parent = os.path.dirname(os.path.normpath(path)) or "."
    why = ("does not exist" if not os.path.exists(parent) else "is not a folder" if not os.path.isdir(parent)
           else "is not writable" if not os.access(parent, os.W_OK) else None)
    if why:
        raise SystemExit(f"error: {folder_name(path, flag)}: cannot make the folder: its parent {parent} {why} "
                         "(only the last folder of a path is made, as the trainer makes --checkpoint_dir)")


def make_folder(path, flag=None):
    """The folder check_new_folder passed, made when missing (itself only, never its parents)."""
    if os.path.isdir(path):
        return
    try:
        os.mkdir(path)
    except OSError as e:
        raise SystemExit(f"error: {folder_name(path, flag)}: cannot make the folder: {e.strerror}") from None
