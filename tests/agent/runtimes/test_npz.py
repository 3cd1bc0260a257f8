"""Tenants' NPZ files are judged by their headers before a byte of their arrays is read."""

import io
import zipfile

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
