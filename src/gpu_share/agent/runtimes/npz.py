"""NPZ in and out of a runtime, never unpickling: tenants' files are untrusted.

Reading is `gpu_share.npz_reading`'s (the one reader, shared with the coordinator):
every array is read up front, so a corrupt member fails here with a message about the
file rather than later in the middle of a run, and what the arrays expand to is judged
from the archive's headers before any array is inflated. Here the limit is named for
the tenant: the job's memory, or `MAX_INPUTS_EXPANDED_BYTES`, the most any job's
inputs may expand to on this node, whichever is smaller (`load_npz`).

`save_npz` writes what `np.savez` writes (an uncompressed zip of `.npy` members)
but takes the names as a mapping, so an output called `file` or `allow_pickle`
cannot collide with a keyword argument, and it refuses object arrays instead of
pickling them.
"""

import io
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np

from gpu_share.agent.runtimes import limit_messages
from gpu_share.npz_reading import Array, NpzError, NpzTooLarge, dtype_name
from gpu_share.npz_reading import load_npz as read_npz

__all__ = [
    "Array",
    "NpzError",
    "NpzTooLarge",
    "describe",
    "dtype_name",
    "load_npz",
    "load_npz_bytes",
    "save_npz",
    "save_npz_bytes",
]


def describe(array: Array) -> str:
    """`float32[5,64]`: how messages and logs name an array."""
    return f"{dtype_name(array.dtype)}[{','.join(str(d) for d in array.shape)}]"


def load_npz(
    path: Path | BinaryIO, *, max_bytes: int | None = None, cap: int | None = None
) -> dict[str, Array]:
    """Every array of an NPZ by name, in archive order; raises `NpzError`, and
    `NpzTooLarge` (its message naming the limit) when the arrays would expand past the
    job's memory (`max_bytes`) or past `cap` (`MAX_INPUTS_EXPANDED_BYTES`)."""
    limits = [limit for limit in (max_bytes, cap) if limit is not None]
    try:
        return read_npz(path, max_bytes=min(limits) if limits else None)
    except NpzTooLarge as exc:
        if cap is not None and (max_bytes is None or cap < max_bytes):
            words = limit_messages.inputs_past_cap(exc.total, cap)
        else:
            words = limit_messages.inputs_too_large(exc.total, exc.limit)
        raise NpzTooLarge(exc.total, exc.limit, exc.largest, f"{words} ({exc.largest})") from exc


def load_npz_bytes(
    data: bytes, *, max_bytes: int | None = None, cap: int | None = None
) -> dict[str, Array]:
    return load_npz(io.BytesIO(data), max_bytes=max_bytes, cap=cap)


def save_npz_bytes(arrays: Mapping[str, Array]) -> bytes:
    buffer = io.BytesIO()
    save_npz(buffer, arrays)
    return buffer.getvalue()


def save_npz(path: Path | BinaryIO, arrays: Mapping[str, Array]) -> None:
    """Raises `ValueError` for an object array, which NPZ cannot hold without pickle."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            if array.dtype.hasobject:
                raise ValueError(f'array "{name}" holds Python objects and cannot be saved')
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
