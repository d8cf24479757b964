"""Generic file I/O: writing a file atomically, saving an ONNX model.

:func:`atomic_write` writes checkpoints (:mod:`ortlearn.training.checkpoint`)
and, through :func:`save_model`, every ONNX model ortlearn writes to a file.
Nothing here imports another ortlearn module.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable

__all__ = ["EXTERNAL_DATA_THRESHOLD", "MAX_TENSOR_BYTES", "atomic_write", "model_data_size",
           "save_model"]

#: A model whose tensors (:func:`model_data_size`) exceed this many bytes is
#: saved with its weights in an external ``<file>.data`` file: protobuf cannot
#: serialize a message of 2 GB or more, and the rest of the graph (names,
#: nodes) needs room too.
EXTERNAL_DATA_THRESHOLD = 1 << 30

#: The most bytes one tensor can hold in a ``TensorProto``: its ``raw_data`` is one protobuf
#: field, limited to 2 GB. A larger weight cannot become an initializer at all (building it
#: crashes the process inside protobuf), external data or not.
MAX_TENSOR_BYTES = (1 << 31) - 1


def atomic_write(path, data: bytes | Callable, what: str = "the checkpoint") -> None:
    """Write ``data`` to ``path`` so that the file is either the old one or the new one.

    The bytes go to a temporary file in the target directory, which is
    flushed, fsynced and renamed over ``path`` with :func:`os.replace`: a
    failure at any point (disk full, KeyboardInterrupt) leaves the previous
    file intact and no temporary file behind. Checkpoints and the files of
    :func:`ortlearn.artifacts.generate_artifacts` are written with it.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write. A symbolic link there is replaced by the file,
        never written through: the file it points to, maybe outside the
        directory, is left as it is.
    data : bytes or callable
        The whole content, or a function called with the binary file object
        open for writing, which writes the content (streamed, so that it
        needs not be held in memory at once).
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
    path = _entry(path)
    if os.path.isdir(path) and not os.path.islink(path):
        raise IsADirectoryError(
            f"Cannot save {what} to {path!r}: it is a directory; give a file "
            f"path such as {os.path.join(path, 'checkpoint')!r}."
        )
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"Cannot save {what} to {path!r}: directory {directory!r} does not exist."
        )
    _remove_stale_temporaries(directory, path)
    tmp, fd = _create_temporary(directory, path, what)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
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


def _temporary_pattern(path: str) -> re.Pattern:
    """The names of the temporary files of saves to ``path``: ``.<name>.<12 hex>.tmp``."""
    return re.compile(re.escape(f".{os.path.basename(path)}.") + r"[0-9a-f]{12}\.tmp")


def _remove_stale_temporaries(directory: str, path: str) -> None:
    """Remove what interrupted saves to ``path`` left (a killed process cannot clean up).

    Only names of :func:`_temporary_pattern` for this very target are
    touched: temporary files of other targets in the directory are left.
    """
    pattern = _temporary_pattern(path)
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if pattern.fullmatch(name):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:  # gone meanwhile, or not ours to remove: not this save's problem
                pass


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


# bytes per element of the ONNX TensorProto data types (the typed fields'
# elements are counted at the type's width, as raw_data would hold them)
_ONNX_ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8,
                  14: 8, 15: 16, 16: 2}


def _tensor_size(tensor) -> int:
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    count = 1
    for d in tensor.dims:
        count *= d
    if tensor.data_type == 8:  # strings: their lengths
        return sum(len(x) for x in tensor.string_data)
    return count * _ONNX_ITEMSIZE.get(tensor.data_type, 8)


def model_data_size(model) -> int:
    """Bytes held by the tensors of ``model`` (initializers, sparse ones included,
    in the main graph and its subgraphs), computed without serializing it."""
    total = 0
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        total += sum(_tensor_size(t) for t in graph.initializer)
        for sparse in graph.sparse_initializer:
            total += _tensor_size(sparse.values) + _tensor_size(sparse.indices)
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    total += _tensor_size(attr.t)
                total += sum(_tensor_size(t) for t in attr.tensors)
                if attr.HasField("g"):
                    graphs.append(attr.g)
                graphs.extend(attr.graphs)
    return total


def _entry(path) -> str:
    """The absolute path of the directory entry ``path`` names: its directory resolved (the
    place the user named), its last component not (a link there is the entry to replace)."""
    path = os.path.abspath(os.fsdecode(os.fspath(path)))
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def save_model(model, path, what: str | None = None) -> None:
    """Write the ONNX ``model`` to ``path``, atomically; large weights go to ``<name>.data``.

    A model whose tensors take at most :data:`EXTERNAL_DATA_THRESHOLD` bytes
    is written as one file, the bytes of ``model.SerializeToString()``. A
    larger one (protobuf cannot serialize 2 GB) has its initializers written
    to ``<file name>.data`` next to it, as ONNX external data, which
    ``onnx.load`` and ``onnxruntime.InferenceSession`` read from the model's
    path. ``model`` itself is not modified.

    Parameters
    ----------
    model : onnx.ModelProto
    path : str or os.PathLike
        The file to write (its directory must exist); a symbolic link there is
        replaced, as by :func:`atomic_write`.
    what : str, optional
        What the file is, for the error messages (default: ``the model '<name>'``).

    Raises
    ------
    IsADirectoryError, FileNotFoundError, PermissionError
        As :func:`atomic_write`.
    """
    path = _entry(path)
    name = os.path.basename(path)
    what = what or f"the model {name!r}"
    if model_data_size(model) <= EXTERNAL_DATA_THRESHOLD:
        atomic_write(path, model.SerializeToString(), what=what)
        return
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"Cannot save {what} to {path!r}: directory {directory!r} does not exist.")
    # staged in a directory next to the target, then both files are renamed
    # into place (the data first: the model file never points to missing data)
    staging = tempfile.mkdtemp(dir=directory, prefix=f".{name}.")
    try:
        staged = os.path.join(staging, name)
        _write_external(model, staged, name + ".data")
        os.replace(staged + ".data", path + ".data")
        os.replace(staged, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _fsync_directory(directory)


def _initializers(model):
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        yield from graph.initializer
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("g"):
                    graphs.append(attr.g)
                graphs.extend(attr.graphs)


def _write_external(model, path: str, location: str) -> None:
    """Write ``model`` to ``path`` with its initializers' bytes in ``<path>.data``.

    What ``onnx.save_model(..., save_as_external_data=True)`` writes, without
    its side effect: the initializers are moved out of ``model`` one at a
    time (so that no second copy of the weights is held) and put back after.
    """
    from onnx import TensorProto

    moved = []
    try:
        with open(path + ".data", "wb") as data:
            for tensor in _initializers(model):
                if (tensor.data_location == TensorProto.EXTERNAL
                        or not tensor.HasField("raw_data") or len(tensor.raw_data) < 1024):
                    continue  # small ones stay in the model, as onnx does
                raw = tensor.raw_data
                offset = data.tell()
                data.write(raw)
                tensor.ClearField("raw_data")
                moved.append((tensor, raw, tensor.HasField("data_location")))
                tensor.data_location = TensorProto.EXTERNAL
                for key, value in (("location", location), ("offset", str(offset)),
                                   ("length", str(len(raw)))):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, value
            data.flush()
            os.fsync(data.fileno())
        with open(path, "wb") as f:
            f.write(model.SerializeToString())
            f.flush()
            os.fsync(f.fileno())
    finally:
        while moved:
            tensor, raw, had_location = moved.pop()
            # back as it was: a field absent before stays absent (same bytes)
            tensor.ClearField("external_data")
            tensor.ClearField("data_location")
            if had_location:
                tensor.data_location = TensorProto.DEFAULT
            tensor.raw_data = raw
