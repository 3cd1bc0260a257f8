"""Revealed rows on the wire: two bits an entry (-1, 0, 1 as 0, 1, 2), four entries a
byte, the first in the lowest bits; code 3 never occurs in a true answer."""

import numpy as np
import numpy.typing as npt

ENTRIES_PER_BYTE = 4


def packed_size(rows: int, width: int) -> int:
    return rows * width // ENTRIES_PER_BYTE


def pack(rows: npt.NDArray[np.generic]) -> bytes:
    """Rows of {-1, 0, 1} (any dtype; their width a multiple of 4) as bytes."""
    codes = (np.asarray(rows).astype(np.int8) + np.int8(1)).astype(np.uint8).reshape(-1, 4)
    packed = codes[:, 0] | codes[:, 1] << 2 | codes[:, 2] << 4 | codes[:, 3] << 6
    return packed.astype(np.uint8).tobytes()


def unpack(data: bytes, rows: int, width: int) -> npt.NDArray[np.int8]:
    """The rows `pack` made; ValueError for the wrong length or an entry that is none of
    -1, 0, 1."""
    if len(data) != packed_size(rows, width):
        raise ValueError(f"{len(data)} bytes are not {rows} packed rows of {width}")
    raw = np.frombuffer(data, dtype=np.uint8)
    codes = np.stack([(raw >> shift) & 3 for shift in (0, 2, 4, 6)], axis=1).reshape(rows, width)
    if (codes == 3).any():
        raise ValueError("an entry is not -1, 0 or 1")
    unpacked: npt.NDArray[np.int8] = codes.astype(np.int8) - np.int8(1)
    return unpacked
