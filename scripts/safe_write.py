"""Writing a file whole without losing anything (the scripts' rule, as the trainer's): never over one
of the inputs, and through a temporary file in the same folder that is flushed, fsynced and renamed,
so that a crash or a full disk leaves the old file or the new one, never a part. A write that fails
(no such folder, no permission, a full disk, a folder where the file would go) stops with one line
naming the output, not the temporary file. An output folder that a script makes follows the trainer's
rule for --checkpoint_dir: made when missing, but only it, in a folder that exists (check_new_folder
before any work, make_folder when the first file is written). Before any work, check_output and
check_new_folder find, as the trainer's outputs_writable does and without making anything, what would
make a write fail: a part of the path that is a file or missing, a file where a folder goes or the
reverse, no permission, a read-only file system, and less free space than the output takes where its
size is known. Their one line: "error: FLAG PATH: cannot be written: WHY"."""
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
    """An output as messages name it: with its flag (--out_dir DIR) when it has one."""
    return f"{flag} {path}" if flag else path


def parent_of(path):
    """The folder a path goes in ("a/b" -> "a", "b" -> ".")."""
    return os.path.dirname(os.path.normpath(path)) or "."


def space_problem(folder, size):
    """Why the file system of `folder` cannot take `size` more bytes (None: it can; size None: not known):
    read-only (statvfs's ST_RDONLY), or less free space than that (the blocks this user may take)."""
    v = os.statvfs(folder)
    if v.f_flag & os.ST_RDONLY:
        return f"{folder} is on a read-only file system"
    free = v.f_bavail * v.f_frsize
    if size and size > free:
        return f"{folder} has {free / 2**30:.2f} GiB free, and {size / 2**30:.2f} GiB are written there"
    return None


def folder_problem(folder, size=None):
    """Why `folder`, which exists, cannot take new files of `size` bytes: it is no folder, this user may
    not write in it, or its file system (space_problem). None if it can."""
    if not os.path.isdir(folder):
        return f"{folder} is a file, not a folder"
    return space_problem(folder, size) or (None if os.access(folder, os.W_OK | os.X_OK)
                                           else f"{folder} is not writable")


def place_problem(path, size=None):
    """Why nothing of `size` bytes can be made at `path` (a new file or folder, or a file replacing the one
    there): its folder's problem, or the first part of the path that is a file (a/b/c under a file a: a),
    or its folder missing (only the last part of a path is made). None if it can."""
    folder = parent_of(path)
    if os.path.exists(folder):
        return folder_problem(folder, size)
    up = folder
    while not os.path.exists(up) and up not in (".", "/"):
        up = parent_of(up)
    if not os.path.isdir(up):
        return f"{up} is a file, not a folder"
    return f"its folder {folder} does not exist (only the last folder of a path is made)"


def refuse(path, flag, why):
    if why:
        raise SystemExit(f"error: {folder_name(path, flag)}: cannot be written: {why}")


def check_output(path, flag=None, size=None):
    """Stops unless write_atomic can write the file `path` (`size` bytes, when known): not a folder, in a
    folder this user may write in, on a file system with room. Makes nothing."""
    refuse(path, flag, "is a folder, where a file goes" if os.path.isdir(path) else place_problem(path, size))


def check_new_folder(path, flag=None, size=None, files=()):
    """Stops unless `path` is a folder that can take `size` more bytes (when known), or can be made as one:
    its parent is such a folder; and none of `files`, the names it is to hold, is a folder there. A missing
    parent is refused, not made: a mistyped path (a/b/c for a/c) is named, not created. Makes nothing."""
    refuse(path, flag, folder_problem(path, size) if os.path.exists(path) else place_problem(path, size))
    for name in files:
        if os.path.isdir(os.path.join(path, name)):
            refuse(path, flag, f"{os.path.join(path, name)} is a folder, where a file goes")


def make_folder(path, flag=None):
    """The folder check_new_folder passed, made when missing (itself only, never its parents)."""
    if os.path.isdir(path):
        return
    try:
        os.mkdir(path)
    except OSError as e:
        raise SystemExit(f"error: {folder_name(path, flag)}: cannot make the folder: {e.strerror}") from None
