"""Reading NPZ archives that strangers wrote: the one reader the runtimes and the
coordinator share, never unpickling.

An NPZ is a zip of `.npy` members, and deflate packs a gigabyte of zeros into a
megabyte, so what an archive expands to is judged before it is expanded:

1. the zip's central directory: how many members, how each is compressed, and the
   size each one declares (`ZipInfo.file_size`); nothing is inflated.
2. each member's `.npy` header (its first bytes, at most ~10 KB, inflated through the
   bounded stream below): dtype and shape, so the exact size of its array, which must
   be what the zip declares for the member. Together they must fit `max_bytes`, or the
   archive is refused here (`NpzTooLarge`), before any array is read.
3. the arrays, each read through `_Member`, a bounded stream: it inflates a member
   chunk by chunk and never yields more than the member declares; a member whose data
   would inflate past that is stopped there and refused, as is one that holds less or
   fails its CRC. An array is allocated at its header's size, already checked.

Only stored and deflated members are read (what `numpy.savez` and
`numpy.savez_compressed` write); anything else is refused with the reason.

`check_npz` makes the same checks without keeping any array (each member streams through
the bounded reader and is dropped): how the coordinator judges an uploaded inputs file.
"""

import ast
import io
import math
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeVar

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

Array = npt.NDArray[np.generic]
T = TypeVar("T")

MiB = 1024 * 1024
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_NPY_MAGIC = b"\x93NUMPY"
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zipfile's structFileHeader
MAX_ARRAYS = 4096
MAX_HEADER_BYTES = 10000  # numpy's own limit when it reads the array
CHUNK_BYTES = 1 << 20  # compressed bytes read at a time


class NpzError(ValueError):
    """The file is not an NPZ that can be read; the message says why."""


class NpzTooLarge(NpzError):
    """The arrays would expand past the limit the reader was given: a resource limit,
    not bad inputs. Carries the sizes, so each caller can name its own limit."""

    def __init__(self, total: int, limit: int, largest: str, message: str | None = None) -> None:
        self.total = total
        self.limit = limit
        self.largest = largest  # the largest arrays, as `"X": float32[1000,20], …`
        super().__init__(
            message
            or f"the NPZ expands to {size_text(total)}, more than the {size_text(limit)} "
            f"allowed ({largest})"
        )


def size_text(size: int) -> str:
    return f"{size / MiB:.0f} MiB" if size >= MiB else f"{size} bytes"


def dtype_name(dtype: np.dtype[np.generic]) -> str:
    if dtype.kind == "U":
        return "str"
    if dtype.kind == "S":
        return "bytes"
    return dtype.name


@dataclass(frozen=True)
class _Array:
    info: zipfile.ZipInfo
    name: str
    dtype: np.dtype[np.generic]
    shape: tuple[int, ...]

    @property
    def data_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def describe(self) -> str:
        return f"{dtype_name(self.dtype)}[{','.join(str(d) for d in self.shape)}]"


def load_npz(source: Path | BinaryIO, *, max_bytes: int | None = None) -> dict[str, Array]:
    """Every array of an NPZ by name, in archive order; raises `NpzError`, and
    `NpzTooLarge` when the arrays would hold more than `max_bytes` together."""
    if isinstance(source, Path):
        with source.open("rb") as file:
            return _load(file, max_bytes)
    return _load(source, max_bytes)


def load_npz_bytes(data: bytes, *, max_bytes: int | None = None) -> dict[str, Array]:
    return load_npz(io.BytesIO(data), max_bytes=max_bytes)


@dataclass(frozen=True)
class ArrayHeader:
    """What an array of an NPZ declares: its name, dtype and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]


def check_npz(
    source: Path | BinaryIO, *, verify_data_up_to: int | None = None
) -> list[ArrayHeader]:
    """The arrays of an NPZ, judged as `load_npz` judges them but never allocated: the
    directory and every header always; the data (each member inflated, never past what
    it declares, to exactly that size, and its CRC) while the arrays hold at most
    `verify_data_up_to` bytes together (all of them when None). Raises `NpzError`."""
    if isinstance(source, Path):
        with source.open("rb") as file:
            return _check(file, verify_data_up_to)
    return _check(source, verify_data_up_to)


def _check(file: BinaryIO, verify_data_up_to: int | None) -> list[ArrayHeader]:
    def verify(arrays_ahead: list[_Array]) -> list[ArrayHeader]:
        total = sum(array.data_bytes for array in arrays_ahead)
        if verify_data_up_to is None or total <= verify_data_up_to:
            for ahead in arrays_ahead:
                member = _Member(file, ahead.info, ahead.name)
                while member.read(CHUNK_BYTES):
                    pass
                member.finish()
        return [ArrayHeader(a.name, dtype_name(a.dtype), a.shape) for a in arrays_ahead]

    return _read_archive(file, verify)


def _load(file: BinaryIO, max_bytes: int | None) -> dict[str, Array]:
    def read(arrays_ahead: list[_Array]) -> dict[str, Array]:
        total = sum(array.data_bytes for array in arrays_ahead)
        if max_bytes is not None and total > max_bytes:
            largest = sorted(arrays_ahead, key=lambda a: a.data_bytes, reverse=True)[:3]
            raise NpzTooLarge(
                total, max_bytes, ", ".join(f'"{a.name}": {a.describe()}' for a in largest)
            )
        arrays: dict[str, Array] = {}
        for ahead in arrays_ahead:
            member = _Member(file, ahead.info, ahead.name)
            arrays[ahead.name] = np.lib.format.read_array(member, allow_pickle=False)
            member.finish()
        return arrays

    return _read_archive(file, read)


def _read_archive(file: BinaryIO, then: Callable[[list["_Array"]], T]) -> T:
    """`then` of the archive's arrays, once its directory and every header are checked."""
    _refuse_unreadable(file)
    try:
        with zipfile.ZipFile(file) as archive:
            infos = archive.infolist()
            _check_directory(infos)
            arrays_ahead = [_header_of(file, info) for info in infos]
            _check_unique(arrays_ahead)
            return then(arrays_ahead)
    except NpzError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        raise NpzError(f"the inputs file is a corrupt NPZ archive: {exc}") from exc


def _refuse_unreadable(file: BinaryIO) -> None:
    head = file.read(16)
    file.seek(0)
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


def _check_directory(infos: list[zipfile.ZipInfo]) -> None:
    """The central directory alone, before anything is inflated: how many members, and
    whether each is one this reader inflates."""
    if len(infos) > MAX_ARRAYS:
        raise NpzError(f"the inputs NPZ holds {len(infos)} members; at most {MAX_ARRAYS}")
    for info in infos:
        if info.flag_bits & 0x1:
            raise NpzError(f'member "{info.filename}" of the inputs NPZ is encrypted')
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise NpzError(
                f'member "{info.filename}" of the inputs NPZ is compressed with zip method '
                f"{info.compress_type}; write it with numpy.savez or numpy.savez_compressed"
            )


def _check_unique(arrays: list[_Array]) -> None:
    seen: set[str] = set()
    for array in arrays:
        if array.name in seen:
            raise NpzError(f'the inputs NPZ holds two arrays named "{array.name}"')
        seen.add(array.name)


def _header_of(file: BinaryIO, info: zipfile.ZipInfo) -> _Array:
    """A member's array header, checked against the size the zip declares for it."""
    name = info.filename.removesuffix(".npy")
    header_size, dtype, shape = _npy_header(_Member(file, info, name), name)
    array = _Array(info, name, dtype, shape)
    if info.file_size != header_size + array.data_bytes:
        raise NpzError(
            f'array "{name}" of the inputs NPZ declares {array.describe()} '
            f"({array.data_bytes} bytes of data) but its member holds "
            f"{max(0, info.file_size - header_size)}; the archive is corrupt or was not "
            "written by numpy.savez"
        )
    return array


def _npy_header(stream: "_Member", name: str) -> tuple[int, np.dtype[np.generic], tuple[int, ...]]:
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


class _Member(io.RawIOBase):
    """One member's bytes, inflated as they are read and never past what the zip
    declares for it (`file_size`): the bounded read that stops a member lying about
    its size. `finish()` then says whether the member held exactly that."""

    def __init__(self, file: BinaryIO, info: zipfile.ZipInfo, name: str) -> None:
        super().__init__()
        self._file = file
        self._info = info
        self._name = name
        self._left = info.file_size  # bytes it may still yield
        self._compressed_left = info.compress_size
        self._inflater = (
            zlib.decompressobj(-15) if info.compress_type == zipfile.ZIP_DEFLATED else None
        )
        self._pending = b""  # compressed bytes read but not yet inflated
        self._crc = 0
        file.seek(info.header_offset)
        fixed = file.read(_LOCAL_HEADER.size)
        if len(fixed) != _LOCAL_HEADER.size or fixed[:4] != b"PK\x03\x04":
            raise NpzError(f'member "{name}" of the inputs NPZ has no valid local header')
        fields = _LOCAL_HEADER.unpack(fixed)
        self._offset = info.header_offset + _LOCAL_HEADER.size + fields[10] + fields[11]

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: "WriteableBuffer") -> int:
        view = memoryview(buffer).cast("B")
        data = self._produce(min(len(view), self._left))
        view[: len(data)] = data
        return len(data)

    def _raw(self, most: int) -> bytes:
        """The member's next stored bytes, never past its declared compressed size."""
        if self._compressed_left <= 0 or most <= 0:
            return b""
        self._file.seek(self._offset)
        chunk = self._file.read(min(most, self._compressed_left))
        self._offset += len(chunk)
        self._compressed_left -= len(chunk)
        return chunk

    def _produce(self, wanted: int) -> bytes:
        """Up to `wanted` bytes of the member (fewer only at its end). Each turn yields
        bytes, takes in compressed ones, or ends: it cannot spin."""
        out = bytearray()
        while len(out) < wanted:
            if self._inflater is None:
                piece = self._raw(wanted - len(out))
            else:
                if not self._pending:
                    self._pending = self._raw(CHUNK_BYTES)
                    if not self._pending:
                        break
                piece = self._inflater.decompress(self._pending, wanted - len(out))
                self._pending = self._inflater.unconsumed_tail
                if self._inflater.eof:
                    out += piece
                    break
            if not piece and self._inflater is None:
                break
            out += piece
        self._left -= len(out)
        self._crc = zlib.crc32(out, self._crc)
        return bytes(out)

    def finish(self) -> None:
        """The member was read to the size it declares: refuse it if its data goes on (it
        would inflate past its header's size), stops short, or fails its CRC."""
        if self._left > 0:
            raise NpzError(
                f'array "{self._name}" of the inputs NPZ ends before the '
                f"{self._info.file_size} bytes it declares; the archive is corrupt"
            )
        inflater = self._inflater
        while inflater is not None and not inflater.eof:
            if not self._pending:
                self._pending = self._raw(CHUNK_BYTES)
                if not self._pending:
                    break
            more = inflater.decompress(self._pending, 1)  # one byte more is enough to know
            self._pending = inflater.unconsumed_tail
            if more:
                raise NpzError(
                    f'array "{self._name}" of the inputs NPZ inflates past the '
                    f"{self._info.file_size} bytes its header declares; refused while "
                    "reading it (the archive is corrupt or crafted)"
                )
        if inflater is None and self._compressed_left > 0:
            raise NpzError(
                f'array "{self._name}" of the inputs NPZ holds more than the '
                f"{self._info.file_size} bytes its header declares; the archive is corrupt"
            )
        if self._crc != self._info.CRC:
            raise NpzError(
                f'array "{self._name}" of the inputs NPZ fails its CRC check; the archive '
                "is corrupt"
            )
