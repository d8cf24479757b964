"""Generic file I/O: writing a file atomically.

:func:`atomic_write` writes checkpoints (:mod:`ortlearn.training.checkpoint`)
and the files of :func:`ortlearn.artifacts.generate_artifacts`. Nothing here
imports another ortlearn module.
"""

from __future__ import annotations

import os
import secrets

__all__ = ["atomic_write"]


def atomic_write(path, data: bytes, what: str = "the checkpoint") -> None:
    """Write ``data`` to ``path`` so that the file is either the old one or the new one.

    The bytes go to a temporary file in the target directory, which is
    flushed, fsynced and renamed over ``path`` with :func:`os.replace`: a
    failure at any point (disk full, KeyboardInterrupt) leaves the previous
    file intact and no temporary file behind. Checkpoints and the files of
    :func:`ortlearn.artifacts.generate_artifacts` are written with it.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write; a symbolic link is followed (the file it points
        to is replaced).
    data : bytes
        The whole content.
    what : str, default='the checkpoint'
        What the file is, for the error messages.

    Raises
    ------
    IsADirectoryError
        If ``path`` is a directory.
    FileNotFoundError
        If its directory does not exist.
    PermissionError
        If its directory is not writable.

    Examples
    --------
    >>> import os, tempfile
    >>> from ortlearn.fileio import atomic_write
    >>> path = os.path.join(tempfile.mkdtemp(), "file.bin")
    >>> atomic_write(path, b"abc", what="the example")
    >>> open(path, "rb").read()
    b'abc'
    """
    # through symbolic links: update the file they point to
    path = os.path.realpath(os.fsdecode(os.fspath(path)))
    if os.path.isdir(path):
        raise IsADirectoryError(
            f"Cannot save {what} to {path!r}: it is a directory; give a file "
            f"path such as {os.path.join(path, 'checkpoint')!r}."
        )
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"Cannot save {what} to {path!r}: directory {directory!r} does not exist."
        )
    tmp, fd = _create_temporary(directory, path, what)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_directory(directory)


def _create_temporary(directory: str, path: str, what: str) -> tuple[str, int]:
    """Create a new file next to ``path`` (mode 0o666 minus umask, like any new file)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
        try:
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
        except PermissionError as exc:
            raise PermissionError(
                f"Cannot save {what} to {path!r}: directory {directory!r} "
                "is not writable."
            ) from exc


def _fsync_directory(directory: str) -> None:
    """Make the rename durable (POSIX); best effort where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
