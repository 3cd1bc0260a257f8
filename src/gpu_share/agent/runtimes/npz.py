"""NPZ in and out of a runtime, never unpickling: tenants' files are untrusted.

`load_npz` reads every array up front, so a corrupt member fails here with a
message about the file rather than later in the middle of a run. `save_npz`
writes what `np.savez` writes (an uncompressed zip of `.npy` members) but takes
the names as a mapping, so an output called `file` or `allow_pickle` cannot
collide with a keyword argument, and it refuses object arrays instead of
pickling them.
"""

import io
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.generic]

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_NPY_MAGIC = b"\x93NUMPY"


class NpzError(ValueError):
    """The file is not an NPZ the runtime can read; the message says why."""


def describe(array: Array) -> str:
    """`float32[5,64]`: how messages and logs name an array."""
    return f"{dtype_name(array.dtype)}[{','.join(str(d) for d in array.shape)}]"


def dtype_name(dtype: np.dtype[np.generic]) -> str:
    if dtype.kind == "U":
        return "str"
    if dtype.kind == "S":
        return "bytes"
    return dtype.name


def _refuse_unreadable(source: Path | BinaryIO) -> None:
    if isinstance(source, Path):
        with source.open("rb") as file:
            head = file.read(16)
    else:
        head = source.read(16)
        source.seek(0)
    if not head:
        raise NpzError("the inputs file is empty; expected an NPZ archive written by numpy.savez")
    if head.startswith(_NPY_MAGIC):
        raise NpzError(
            "the inputs file is a single .npy array, not an NPZ archive; "
            "write it with numpy.savez(f, <input name>=array)"
        )
    if not head.startswith(_ZIP_MAGIC):
        raise NpzError(
            f"the inputs file is not an NPZ archive (it starts with {head[:8]!r}); "
            "write it with numpy.savez(f, <input name>=array)"
        )


def load_npz_bytes(data: bytes) -> dict[str, Array]:
    return load_npz(io.BytesIO(data))


def save_npz_bytes(arrays: Mapping[str, Array]) -> bytes:
    buffer = io.BytesIO()
    save_npz(buffer, arrays)
    return buffer.getvalue()


def load_npz(path: Path | BinaryIO) -> dict[str, Array]:
    """Every array of an NPZ by name, in archive order; raises `NpzError`."""
    _refuse_unreadable(path)
    arrays: dict[str, Array] = {}
    try:
        with np.load(path, allow_pickle=False) as archive:
            for name in archive.files:
                try:
                    value = archive[name]
                except ValueError as exc:
                    if "allow_pickle" in str(exc):
                        raise NpzError(
                            f'array "{name}" holds Python objects (dtype=object), which are '
                            "refused for safety; save numeric or fixed-width string arrays"
                        ) from exc
                    raise NpzError(f'array "{name}" is not a valid .npy array: {exc}') from exc
                if not isinstance(value, np.ndarray):
                    raise NpzError(f'member "{name}" of the inputs NPZ is not a .npy array')
                arrays[name] = value
    except NpzError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        raise NpzError(f"the inputs file is a corrupt NPZ archive: {exc}") from exc
    return arrays


def save_npz(path: Path | BinaryIO, arrays: Mapping[str, Array]) -> None:
    """Raises `ValueError` for an object array, which NPZ cannot hold without pickle."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            if array.dtype.hasobject:
                raise ValueError(f'array "{name}" holds Python objects and cannot be saved')
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
