"""NPZ in and out of a runtime, never unpickling: tenants' files are untrusted.

`load_npz` reads every array up front, so a corrupt member fails here with a
message about the file rather than later in the middle of a run. Before any array
is read, each member's `.npy` header is checked against the size the zip directory
declares for it, and the arrays together against `max_bytes`: a 2 MiB archive that
would expand to gigabytes is refused by its headers, never decompressed. (The zip
reader then stops at the declared size, so a member cannot expand past it either.)

`save_npz` writes what `np.savez` writes (an uncompressed zip of `.npy` members)
but takes the names as a mapping, so an output called `file` or `allow_pickle`
cannot collide with a keyword argument, and it refuses object arrays instead of
pickling them.
"""

import ast
import io
import math
import struct
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

import numpy as np
import numpy.typing as npt

from gpu_share.agent.runtimes import limit_messages

Array = npt.NDArray[np.generic]

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_NPY_MAGIC = b"\x93NUMPY"
MAX_ARRAYS = 4096
MAX_HEADER_BYTES = 10000  # numpy's own limit when it reads the array


class NpzError(ValueError):
    """The file is not an NPZ the runtime can read; the message says why."""


class NpzTooLarge(NpzError):
    """The arrays would not fit in the job's memory limit (RESOURCE_LIMIT, not bad inputs)."""


@dataclass(frozen=True)
class _Member:
    info: zipfile.ZipInfo
    name: str
    dtype: np.dtype[np.generic]
    shape: tuple[int, ...]

    @property
    def data_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def describe(self) -> str:
        return f"{dtype_name(self.dtype)}[{','.join(str(d) for d in self.shape)}]"


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


def load_npz_bytes(data: bytes, *, max_bytes: int | None = None) -> dict[str, Array]:
    return load_npz(io.BytesIO(data), max_bytes=max_bytes)


def save_npz_bytes(arrays: Mapping[str, Array]) -> bytes:
    buffer = io.BytesIO()
    save_npz(buffer, arrays)
    return buffer.getvalue()


def load_npz(path: Path | BinaryIO, *, max_bytes: int | None = None) -> dict[str, Array]:
    """Every array of an NPZ by name, in archive order; raises `NpzError`, and
    `NpzTooLarge` when the arrays hold more than `max_bytes` together."""
    _refuse_unreadable(path)
    try:
        with zipfile.ZipFile(path) as archive:
            members = _members(archive)
            total = sum(member.data_bytes for member in members)
            if max_bytes is not None and total > max_bytes:
                largest = sorted(members, key=lambda m: m.data_bytes, reverse=True)[:3]
                listing = ", ".join(f'"{m.name}": {m.describe()}' for m in largest)
                raise NpzTooLarge(
                    f"{limit_messages.inputs_too_large(total, max_bytes)} ({listing})"
                )
            arrays: dict[str, Array] = {}
            for member in members:
                with archive.open(member.info) as stream:
                    arrays[member.name] = np.lib.format.read_array(stream, allow_pickle=False)
            return arrays
    except NpzError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        raise NpzError(f"the inputs file is a corrupt NPZ archive: {exc}") from exc


def _members(archive: zipfile.ZipFile) -> list[_Member]:
    """Each member's array header, checked against the size the zip declares for it."""
    infos = archive.infolist()
    if len(infos) > MAX_ARRAYS:
        raise NpzError(f"the inputs NPZ holds {len(infos)} members; at most {MAX_ARRAYS}")
    members: list[_Member] = []
    for info in infos:
        name = info.filename.removesuffix(".npy")
        if any(member.name == name for member in members):
            raise NpzError(f'the inputs NPZ holds two arrays named "{name}"')
        with archive.open(info) as stream:
            header_size, dtype, shape = _npy_header(stream, name)
        member = _Member(info, name, dtype, shape)
        if info.file_size != header_size + member.data_bytes:
            raise NpzError(
                f'array "{name}" of the inputs NPZ declares {member.describe()} '
                f"({member.data_bytes} bytes of data) but its member holds "
                f"{max(0, info.file_size - header_size)}; the archive is corrupt or was not "
                "written by numpy.savez"
            )
        members.append(member)
    return members


def _npy_header(stream: IO[bytes], name: str) -> tuple[int, np.dtype[np.generic], tuple[int, ...]]:
    """(bytes before the data, dtype, shape) of a `.npy` member, read without its data."""
    start = stream.read(len(_NPY_MAGIC) + 2)
    if len(start) < len(_NPY_MAGIC) + 2 or not start.startswith(_NPY_MAGIC):
        raise NpzError(f'member "{name}" of the inputs NPZ is not a .npy array')
    major = start[-2]
    if major not in (1, 2, 3):
        raise NpzError(f'array "{name}" is a .npy of unknown version {major}')
    length_format = "<H" if major == 1 else "<I"
    length_bytes = stream.read(struct.calcsize(length_format))
    if len(length_bytes) != struct.calcsize(length_format):
        raise NpzError(f'array "{name}" has a truncated header')
    (length,) = struct.unpack(length_format, length_bytes)
    if length > MAX_HEADER_BYTES:
        raise NpzError(f'array "{name}" has a {length}-byte header; at most {MAX_HEADER_BYTES}')
    text = stream.read(length)
    try:
        header = ast.literal_eval(text.decode("utf-8" if major == 3 else "latin1"))
        dtype = np.lib.format.descr_to_dtype(header["descr"])
        shape = header["shape"]
        if not (
            isinstance(shape, tuple)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise ValueError(f"shape {shape!r}")
    except (ValueError, SyntaxError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise NpzError(f'array "{name}" is not a valid .npy array: bad header ({exc})') from exc
    if dtype.hasobject:
        raise NpzError(
            f'array "{name}" holds Python objects (dtype=object), which are '
            "refused for safety; save numeric or fixed-width string arrays"
        )
    return len(start) + len(length_bytes) + len(text), dtype, shape


def save_npz(path: Path | BinaryIO, arrays: Mapping[str, Array]) -> None:
    """Raises `ValueError` for an object array, which NPZ cannot hold without pickle."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            if array.dtype.hasobject:
                raise ValueError(f'array "{name}" holds Python objects and cannot be saved')
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
