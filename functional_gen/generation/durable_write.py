"""Durable, atomic file writes: a file is either its old bytes or its new bytes, never a part.

`write_atomically` writes to a temporary file beside the target, `fsync`s it, renames it over
the target (`os.replace`, atomic on POSIX: `rename(2)`) and `fsync`s the directory so that the
rename itself survives a power cut. `SequenceState.save` writes through it.
"""

import contextlib
import os
import time

PARTIAL_SUFFIX = ".fg-partial"
"""The suffix of the temporary file `save` writes before renaming it over the target:
`.{name}.{pid}.{random}.fg-partial`, in the target's directory."""


def write_atomically(path: str, data: bytes) -> None:
    """Write `data` to `path` so that `path` is never partly written: a temporary file in the
    same directory, `fsync`, `os.replace`, then `fsync` of the directory (POSIX). The temporary
    file is removed when anything fails or is interrupted; stale ones (of processes no longer
    running) are removed first.

    **Raises:** `OSError` (e.g. `FileNotFoundError` for a missing directory) when the file cannot
    be written; `path` is then unchanged.
    """
    directory = os.path.dirname(os.path.abspath(path))
    _remove_stale_partials(directory)
    name = os.path.basename(path)
    partial = os.path.join(
        directory, f".{name}.{os.getpid()}.{os.urandom(4).hex()}{PARTIAL_SUFFIX}"
    )
    try:
        with open(partial, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: str) -> None:
    """Make a rename in `directory` durable (POSIX; a no-op elsewhere, and on file systems that
    cannot `fsync` a directory)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_partials(directory: str) -> None:
    """Remove the temporary files of saves into `directory` whose process is gone (killed
    mid-save). Those of running processes, this one included, are left alone (they may be
    saving right now). Elsewhere than POSIX, where a pid cannot be probed safely, files older
    than an hour count as stale."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not (name.startswith(".") and name.endswith(PARTIAL_SUFFIX)):
            continue
        parts = name[: -len(PARTIAL_SUFFIX)].rsplit(".", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        file = os.path.join(directory, name)
        if _save_may_be_running(int(parts[1]), file):
            continue
        with contextlib.suppress(OSError):
            os.unlink(file)


def _save_may_be_running(pid: int, file: str) -> bool:
    if os.name != "posix":
        try:
            return os.path.getmtime(file) > time.time() - 3600
        except OSError:
            return True
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's running process
        return True
    return True
