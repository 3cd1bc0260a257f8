"""The SDK reads the NPZ a server sends as a stranger's file (sdk/_npz.py over
gpu_share/npz_reading.py): arrays it would have to unpickle, an archive that would expand
past the client's limit (judged from its headers, before anything is inflated) and one
of more arrays than the reader takes are refused with a `GpuShareError` that says why,
the raw bytes still there; honest outputs, compressed or not, read as before."""

import io
import struct
import zipfile
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from gpu_share import AsyncClient, GpuShareError
from gpu_share.npz_reading import MAX_ARRAYS
from gpu_share.protocol import agent as wire
from gpu_share.sdk import _npz
from gpu_share.testing.models import identity_model
from gpu_share.testing.simulated_agent import SimulatedAgent, done_report

MODEL = identity_model()
UNPICKLED: list[str] = []  # what a pickle in an archive would run, if it ever were


def _mark_unpickled(what: str) -> str:
    UNPICKLED.append(what)
    return what


class Payload:
    """What a hostile server would hide in an object array: code run when unpickled."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (_mark_unpickled, ("ran",))


def pickled_npz() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive, archive.open("y.npy", "w") as member:
        array = np.array([Payload()], dtype=object)
        np.lib.format.write_array(member, array, allow_pickle=True)
    return buffer.getvalue()


def deflated(arrays: dict[str, np.ndarray]) -> bytes:
    """What numpy.savez_compressed writes: each array a deflated `.npy` member."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w") as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
    return buffer.getvalue()


def compressed_zeros(mib: int) -> bytes:
    """A small archive of one array of zeros that inflates to `mib` MiB."""
    return deflated({"y": np.zeros(mib * 1024 * 1024, dtype=np.uint8)})


def _set_sizes(data: bytearray, size: int) -> None:
    """Declare `size` as the only member's uncompressed size, in its local header and in
    the central directory, as a crafted archive would."""
    local = data.index(b"PK\x03\x04")
    struct.pack_into("<L", data, local + 22, size)
    central = data.index(b"PK\x01\x02")
    struct.pack_into("<L", data, central + 24, size)


def lying_npz(gib: int) -> bytes:
    """An archive of a few hundred bytes whose headers say its one array is `gib` GiB."""
    count = gib * 1024**3
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "|u1", "fortran_order": False, "shape": (count,)}
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("y.npy", header.getvalue() + bytes(4096))
    data = bytearray(buffer.getvalue())
    _set_sizes(data, len(header.getvalue()) + count)
    return bytes(data)


def many_arrays(count: int) -> bytes:
    return _npz.encode({f"a{i}": np.zeros(1, dtype=np.uint8) for i in range(count)})


def test_honest_outputs_stored_or_compressed_read_as_they_were_written() -> None:
    arrays = {"y": np.arange(6, dtype=np.float32).reshape(2, 3), "names": np.array(["a", "bc"])}
    for data in (_npz.encode(arrays), deflated(arrays)):
        decoded = _npz.decode(data)
        assert list(decoded) == ["y", "names"]
        for name, array in arrays.items():
            np.testing.assert_array_equal(decoded[name], array)
            assert decoded[name].dtype == array.dtype


def test_an_array_that_needs_unpickling_is_refused_and_never_unpickled() -> None:
    with pytest.raises(GpuShareError, match=r"refused the NPZ the server sent: .*Python objects"):
        _npz.decode(pickled_npz())
    assert UNPICKLED == []


def test_an_archive_whose_headers_say_it_expands_past_the_limit_is_refused_before_inflating() -> (
    None
):
    data = lying_npz(3)  # 3 GiB declared, past the 2 GiB default
    assert len(data) < 10_000
    with pytest.raises(GpuShareError) as refused:
        _npz.decode(data)
    message = str(refused.value)
    assert "3072 MiB in memory, more than the 2048 MiB this client reads" in message
    assert '"y": uint8[3221225472]' in message


def test_a_compressed_bomb_is_refused_past_the_limit_given_and_read_within_it() -> None:
    data = compressed_zeros(32)  # 32 MiB of zeros in a few dozen KiB
    assert len(data) < 1024 * 1024
    with pytest.raises(GpuShareError, match="32 MiB in memory, more than the 8 MiB"):
        _npz.decode(data, max_bytes=8 * 1024 * 1024)
    assert _npz.decode(data, max_bytes=32 * 1024 * 1024)["y"].nbytes == 32 * 1024 * 1024


def test_more_arrays_than_the_reader_takes_are_refused() -> None:
    with pytest.raises(
        GpuShareError, match=f"holds {MAX_ARRAYS + 1} members; at most {MAX_ARRAYS}"
    ):
        _npz.decode(many_arrays(MAX_ARRAYS + 1))


def test_garbage_is_refused_with_the_reason() -> None:
    with pytest.raises(GpuShareError, match="not an NPZ archive"):
        _npz.decode(b"<html>a proxy's error page</html>")


async def test_hostile_outputs_from_the_server_are_refused_and_the_raw_bytes_kept(
    sdk: AsyncClient,
    serving: Callable[..., Awaitable[SimulatedAgent]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the client: an invoke whose outputs would inflate past the client's limit
    comes back done, and reading its arrays is refused; nothing was inflated."""
    monkeypatch.setattr(_npz, "MAX_OUTPUTS_EXPANDED_BYTES", 8 * 1024 * 1024)
    bomb = compressed_zeros(32)

    async def hostile(job: wire.LeasedJob) -> wire.ResultReport:
        return done_report(job, bomb)

    await serving(hostile)
    out = await sdk.invoke_and_wait("onnx_cpu", MODEL, {"x": np.zeros(2, dtype=np.float32)})
    assert out.raw == bomb
    with pytest.raises(GpuShareError, match="more than the 8 MiB this client reads"):
        _ = out.arrays
