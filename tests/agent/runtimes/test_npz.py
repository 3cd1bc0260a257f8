"""Tenants' NPZ files are judged by their headers before a byte of their arrays is read."""

import io
import math
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_share.agent.runtimes.npz import NpzError, NpzTooLarge, load_npz, load_npz_bytes

MiB = 1024 * 1024


def npy_member(shape: tuple[int, ...], descr: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue() + data


def archive(**members: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zipped:
        for name, data in members.items():
            zipped.writestr(f"{name}.npy", data)
    return buffer.getvalue()


def test_a_small_archive_that_expands_past_the_limit_is_refused_unread() -> None:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, X=np.zeros((64, MiB), dtype=np.uint8), y=np.zeros(3))
    assert len(buffer.getvalue()) < MiB  # a bomb: 64 MiB of zeros in a few KiB
    with pytest.raises(NpzTooLarge) as refused:
        load_npz_bytes(buffer.getvalue(), max_bytes=16 * MiB)
    message = str(refused.value)
    assert "expands to 64 MiB, more than this job's 16 MiB of memory" in message
    assert '"X": uint8[64,1048576]' in message


def test_arrays_that_fit_the_limit_load_as_saved() -> None:
    buffer = io.BytesIO()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.savez_compressed(buffer, x=x, names=np.array(["a", "bc"]))
    size = x.nbytes + np.array(["a", "bc"]).nbytes
    arrays = load_npz(io.BytesIO(buffer.getvalue()), max_bytes=size)
    assert list(arrays) == ["x", "names"]
    np.testing.assert_array_equal(arrays["x"], x)
    assert arrays["names"].tolist() == ["a", "bc"]


def test_a_header_claiming_more_than_its_member_holds_is_refused_before_allocating() -> None:
    lying = archive(x=npy_member((10**15,), "<f8", b"\0" * 80))
    with pytest.raises(NpzError) as refused:
        load_npz_bytes(lying)  # numpy alone would try to allocate 8 PB for it
    assert not isinstance(refused.value, NpzTooLarge)
    message = str(refused.value)
    assert 'array "x" of the inputs NPZ declares float64[1000000000000000]' in message
    assert "8000000000000000 bytes of data) but its member holds 80" in message


def test_a_member_holding_more_than_its_header_says_is_refused() -> None:
    padded = archive(x=npy_member((2,), "<i4", b"\0" * 4096))
    with pytest.raises(NpzError, match=r"declares int32\[2\] \(8 bytes of data\) but its member"):
        load_npz_bytes(padded)


@pytest.mark.parametrize(
    ("member", "fragment"),
    [
        pytest.param(npy_member((-1,), "<f8", b""), "bad header", id="negative-shape"),
        pytest.param(b"\x93NUMPY\x09\x00", "unknown version", id="version"),
    ],
)
def test_malformed_members_are_invalid_inputs_naming_the_array(
    member: bytes, fragment: str
) -> None:
    with pytest.raises(NpzError, match=fragment) as refused:
        load_npz_bytes(archive(bad=member))
    assert '"bad"' in str(refused.value)


# Archives that inflate: built a MiB at a time from zeros, never held whole


def npy_header(shape: tuple[int, ...], descr: str = "<f8") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue()


def inflating_npz(
    path: Path, *, shape: tuple[int, ...], inflates_to: int | None = None, level: int = 9
) -> Path:
    """An NPZ of one float64 array "x" of zeros of `shape`, deflated by zipfile from a
    zero-filled stream. With `inflates_to`, a liar: its data inflates to that many bytes,
    while its `.npy` header and the zip's sizes and CRC (patched in) say `shape`."""
    header = npy_header(shape)
    declared = math.prod(shape) * 8
    data = declared if inflates_to is None else inflates_to
    chunk = bytes(MiB)
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=level) as zipped,
        zipped.open("x.npy", "w", force_zip64=data > 2**31 - MiB) as member,
    ):
        member.write(header)
        for start in range(0, data, MiB):
            member.write(chunk[: min(MiB, data - start)])
    if inflates_to is not None:
        raw = bytearray(path.read_bytes())
        crc = zlib.crc32(header + bytes(declared))
        size = len(header) + declared
        local, central = 0, raw.rfind(b"PK\x01\x02")
        struct.pack_into("<I", raw, local + 14, crc)
        struct.pack_into("<I", raw, local + 22, size)
        struct.pack_into("<I", raw, central + 16, crc)
        struct.pack_into("<I", raw, central + 24, size)
        path.write_bytes(bytes(raw))
    return path


def test_a_member_inflating_past_what_its_headers_declare_is_stopped_while_read(
    tmp_path: Path,
) -> None:
    """Its `.npy` header, the zip's size and the CRC all say 1 KiB; its data inflates to
    256 MiB. Reading stops at the declared size and refuses the rest."""
    liar = inflating_npz(tmp_path / "liar.npz", shape=(128,), inflates_to=256 * MiB)
    assert liar.stat().st_size < MiB
    with zipfile.ZipFile(liar) as zipped:
        assert zipped.getinfo("x.npy").file_size == len(npy_header((128,))) + 1024
    with pytest.raises(NpzError, match=r'array "x" of the inputs NPZ inflates past the 1152 bytes'):
        load_npz(liar, max_bytes=2**31)
    with pytest.raises(NpzError, match="inflates past"):
        load_npz_bytes(liar.read_bytes())


def test_members_written_by_numpy_load_as_saved_stored_or_deflated(tmp_path: Path) -> None:
    arrays: dict[str, Any] = {
        "f": np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)),
        "empty": np.zeros((0, 5), dtype=np.int16),
        "s": np.array(["a", "bcd"]),
        "big": np.arange(300_000, dtype=np.int64),  # several reads of the bounded stream
    }
    for write in (np.savez, np.savez_compressed):
        buffer = io.BytesIO()
        write(buffer, **arrays)
        loaded = load_npz_bytes(buffer.getvalue(), max_bytes=8 * MiB)
        assert list(loaded) == list(arrays)
        for name, array in arrays.items():
            np.testing.assert_array_equal(loaded[name], array)
            assert loaded[name].dtype == array.dtype
        assert loaded["f"].flags.f_contiguous


def test_a_member_whose_bytes_fail_their_crc_is_refused() -> None:
    buffer = io.BytesIO()
    np.savez(buffer, x=np.arange(64, dtype=np.uint8))
    damaged = bytearray(buffer.getvalue())
    at = damaged.find(bytes(range(10, 20)))
    damaged[at] ^= 0xFF
    with pytest.raises(NpzError, match=r'array "x" of the inputs NPZ fails its CRC check'):
        load_npz_bytes(bytes(damaged))
