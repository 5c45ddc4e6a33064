"""Write outputs under a temporary name and publish them with one rename (shared by both programs).

A dataset (``atomic_directory``), a checkpoint or a report (``atomic_file``) is either complete
(every file written, fsynced) or absent: a crash, Ctrl-C or a full disk leaves at most a
``.NAME.tmp-*`` path, which this module removes on the way out when the process still can.
"""

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from proto.errors import UserError

__all__ = ["atomic_directory", "atomic_file", "fsync_directory", "io_error"]


def fsync_directory(path: Path) -> None:
    """fsync a directory so that renames and new entries in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def io_error(err: OSError, what: str) -> UserError:
    """Turn an OSError into a one-line UserError, naming disk-full explicitly."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return UserError(f"no space left on device while {what} ({os.strerror(err.errno or 0)})")
    return UserError(f"I/O error while {what}: {err.strerror or err}")


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """Yield a temporary file beside ``path``; on success flush, fsync, rename it to ``path`` and fsync
    the directory, on any failure remove it. OSErrors propagate (callers name what they were writing)."""
    parent = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=parent)
    try:
        with os.fdopen(fd, mode) as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        fsync_directory(parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_directory(out: Path) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``out``; rename it to ``out`` on success.

    Refuses an ``out`` that already exists. On any exception (including KeyboardInterrupt)
    the temporary directory is deleted and the exception propagates.
    """
    out = Path(out)
    if out.exists():
        raise UserError(f"output {out} already exists; choose a new path or remove it first")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"output parent directory {parent} does not exist")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    try:
        # mkdtemp makes the directory private (0700); publish it with the usual umask mode
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        yield tmp
        for entry in tmp.iterdir():
            if entry.is_file():
                fd = os.open(entry, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        fsync_directory(tmp)
        if out.exists():
            raise UserError(f"output {out} appeared while this command ran; not overwriting it")
        os.rename(tmp, out)
        fsync_directory(parent)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise io_error(err, f"writing {out}") from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
