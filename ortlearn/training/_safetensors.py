"""The safetensors file format, read and written with bounded effort.

A checkpoint is a safetensors file (``doc/artifacts_format.md``). This module reads one
without trusting it (only a regular file, the header's length and every declared tensor
checked against the file's size before the body is read, each tensor read straight into its
array) and writes one a tensor at a time, byte for byte what ``safetensors.numpy.save``
writes. What the tensors and the metadata mean is :mod:`~ortlearn.training.checkpoint`'s
business.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Mapping

import numpy as np

# Largest safetensors header read (safetensors itself refuses more than 100 MB):
# a header is a few hundred bytes per tensor, so a larger one is not a checkpoint.
MAX_HEADER = 1 << 26


# Bytes per element of the safetensors dtypes, to check declared sizes before
# any tensor is read.
_ST_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
                "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def _header_length(first8: bytes, file_size: int) -> int:
    """The safetensors header length, ValueError if it cannot fit in the file."""
    if file_size < 8 or len(first8) < 8:
        raise ValueError(f"{file_size} bytes, too short for a safetensors file")
    size = int.from_bytes(first8[:8], "little")
    if size > file_size - 8:
        raise ValueError(
            f"the header declares {size} bytes, longer than the file's {file_size - 8} "
            "after its length (truncated, or not a safetensors file)")
    if size > MAX_HEADER:
        raise ValueError(
            f"the header declares {size} bytes, more than the {MAX_HEADER} a checkpoint "
            "header may have (not an ortlearn checkpoint)")
    return size


def _check_layout(header: dict, body_size: int) -> None:
    """ValueError unless every tensor the header declares fits in the body.

    Checked before the body is read, so that a hostile header cannot make the
    loader allocate more than the file's size.
    """
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise ValueError(f"tensor {key!r} has a malformed entry")
        itemsize = _ST_ITEMSIZE.get(info.get("dtype"))
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if (itemsize is None or not isinstance(shape, list)
                or not all(type(d) is int and d >= 0 for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(type(o) is int for o in offsets)):
            raise ValueError(f"tensor {key!r} has a malformed entry")
        nbytes = itemsize
        for d in shape:
            nbytes *= d  # Python ints: no overflow on absurd shapes
        begin, end = offsets
        if not 0 <= begin <= end <= body_size or end - begin != nbytes:
            raise ValueError(
                f"tensor {key!r} declares {nbytes} bytes at offsets {offsets}, out of "
                f"proportion to the file's {body_size} bytes of data (truncated or damaged)")


def open_regular(path: str):
    """``path`` opened for binary reading; ValueError unless it is a regular file.

    A FIFO would block the reader forever and a device such as ``/dev/zero``
    never ends, so neither is read.
    """
    # O_NONBLOCK: opening a FIFO without a writer must not block; the check
    # on the open descriptor (not on the path) leaves no window for a swap.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                 | getattr(os, "O_BINARY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):  # what open() raises for one, as before
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(mode):
            raise ValueError(
                "it is not a regular file (a FIFO, socket or device); "
                "give the path of a checkpoint file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return open(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def read_file(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """The metadata and tensors of the checkpoint file ``path``, read with bounded effort.

    Only a regular file is read: a FIFO would block forever and a device such
    as ``/dev/zero`` would be read until memory runs out. The header length
    and the declared tensor layout are checked against the file's size before
    the body is read, and each tensor is read straight into its own array:
    the file's bytes are never held a second time.
    """
    with open_regular(path) as f:
        file_size = os.fstat(f.fileno()).st_size
        first8 = f.read(8)
        size = _header_length(first8, file_size)
        header_bytes = f.read(size)
        if len(header_bytes) != size:
            raise ValueError("the file is shorter than its header (it changed while read)")
        header = json.loads(header_bytes)
        if not isinstance(header, dict):
            raise ValueError("not a safetensors header")
        body_size = file_size - 8 - size
        _check_layout(header, body_size)
        metadata = header.pop("__metadata__", {})
        if not isinstance(metadata, dict):
            raise ValueError("not a safetensors header")
        # as safetensors requires: the tensors tile the body, in file order
        entries = sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))
        end = 0
        for key, info in entries:
            if info["data_offsets"][0] != end:
                raise ValueError(f"tensor {key!r} does not start where the previous one ends")
            end = info["data_offsets"][1]
        if end != body_size:
            raise ValueError("the tensors do not cover the file's data")
        tensors = {}
        for key, info in entries:
            dtype = _NP_DTYPE.get(info["dtype"])
            if dtype is None:
                raise ValueError(f"tensor {key!r} has the unsupported dtype {info['dtype']!r}")
            arr = np.empty(info["shape"], dtype=dtype)
            if arr.nbytes and f.readinto(memoryview(arr.reshape(-1).view(np.uint8))) != arr.nbytes:
                raise ValueError("the file is shorter than its size (it changed while read)")
            tensors[key] = arr.astype(dtype.newbyteorder("="), copy=False)
    return metadata, tensors


def read_metadata(data: bytes, layout: bool = True) -> dict:
    """The ``__metadata__`` of a safetensors file, read before loading any tensor.

    With ``layout``, also checks that the declared tensors fit in ``data``
    (``data`` is then the whole file, not only its header).
    """
    size = _header_length(data[:8], len(data))
    header = json.loads(data[8:8 + size])
    if layout and isinstance(header, dict):
        _check_layout(header, len(data) - 8 - size)
    metadata = header.get("__metadata__", {}) if isinstance(header, dict) else None
    if not isinstance(metadata, dict):
        raise ValueError("not a safetensors header")
    return metadata


# safetensors' dtype names, and its order of the tensors in a file: by
# decreasing rank of the dtype (its Rust enum), then by name
_ST_DTYPE = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
             "float16": "F16", "int32": "I32", "uint32": "U32", "float32": "F32",
             "float64": "F64", "int64": "I64", "uint64": "U64"}


_ST_RANK = {name: rank for rank, name in enumerate(_ST_DTYPE.values())}


_NP_DTYPE = {st: np.dtype(name).newbyteorder("<") for name, st in _ST_DTYPE.items()}


def _header(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]
                        ) -> tuple[bytes, list[str]]:
    """The header (length prefix and padding included) and tensor order of a safetensors file.

    What ``safetensors.numpy.save`` writes (``safetensors/src/tensor.rs``):
    ``__metadata__`` first, then the tensors sorted by decreasing dtype rank
    and name, with contiguous ``data_offsets``; compact JSON with non-ASCII
    text as is; the header padded with spaces to a multiple of 8 bytes. The
    metadata keys are written sorted (safetensors writes them in its hash
    map's order, which varies from run to run).
    """
    order = sorted(tensors, key=lambda k: (-_ST_RANK[_ST_DTYPE[tensors[k].dtype.name]], k))
    header = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for key in order:
        arr = tensors[key]
        header[key] = {"dtype": _ST_DTYPE[arr.dtype.name], "shape": list(arr.shape),
                       "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, order


def write(f, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]
                       ) -> None:
    """Write a safetensors file to ``f``, one tensor at a time (no copy of the whole)."""
    header, order = _header(tensors, metadata)
    f.write(header)
    for key in order:
        arr = tensors[key]
        # little-endian and contiguous: no copy for the usual native arrays
        arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        if arr.nbytes:
            f.write(memoryview(arr.reshape(-1).view(np.uint8)))


def is_panic(exc: BaseException) -> bool:
    """True for pyo3's ``PanicException`` (a Rust panic inside safetensors).

    It derives from BaseException and is not importable by name, so it is
    recognised by its class name.
    """
    return type(exc).__name__ == "PanicException"
