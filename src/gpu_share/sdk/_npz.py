"""NPZ to and from numpy, with numpy imported only here and only when called.

numpy is not a dependency of the SDK (the CLI and plain invokes by URL need none),
so every function imports it lazily and says how to install it when it is missing.
Archives are written member by member rather than with `np.savez(**arrays)`, so an
input called `file` or `allow_pickle` cannot collide with a keyword, and nothing is
ever pickled in either direction.

What a server sends back is read as a stranger's file: through the one bounded NPZ
reader (`gpu_share.npz_reading`), which judges from the archive's headers what it would
expand to before inflating anything, refuses past `MAX_OUTPUTS_EXPANDED_BYTES` (or the
`max_bytes` given) and past its count of arrays, never unpickles, and stops a member that
inflates past what it declares. A refused archive is a `GpuShareError` saying why.
"""

import io
import zipfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpu_share.sdk.errors import ConfigurationError, GpuShareError, api_error

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Array = npt.NDArray[Any]
else:
    Array = Any

SINGLE_ARRAY_NAME = "arr_0"  # what np.savez calls one unnamed array; feeds a single-input model
# The most a server's NPZ may expand to in memory: the runtimes' default cap on inputs
# (MAX_INPUTS_EXPANDED_BYTES), and what a server keeps of one job's outputs.
MAX_OUTPUTS_EXPANDED_BYTES = 2 * 1024**3


def require_numpy(purpose: str, *, instead: str = "") -> Any:
    try:
        import numpy
    except ImportError:
        hint = f"; {instead}" if instead else ""
        raise ConfigurationError(
            f"{purpose} needs numpy, which the SDK does not install by itself: "
            f"pip install numpy (or pip install 'gpu-share[onnx]'){hint}"
        ) from None
    return numpy


def is_array_like(value: object) -> bool:
    """numpy arrays and mappings of them, without importing numpy to find out."""
    if isinstance(value, Mapping):
        return True
    module = type(value).__module__
    return module.startswith(("numpy", "pandas")) or hasattr(value, "__array__")


def encode(arrays: "Array | Mapping[str, Any]", field: str = "inputs") -> bytes:
    np = require_numpy("sending arrays")
    named: Mapping[str, Any] = (
        arrays if isinstance(arrays, Mapping) else {SINGLE_ARRAY_NAME: arrays}
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, value in named.items():
            array = np.asarray(value)
            if array.dtype.kind == "O":
                raise api_error(
                    None,
                    "VALIDATION_ERROR",
                    f"{field}: array {name!r} has dtype object, which NPZ cannot hold without "
                    "pickling; convert it to a numeric or str dtype",
                )
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
    return buffer.getvalue()


def decode(data: bytes, *, max_bytes: int | None = None) -> "dict[str, Array]":
    """The arrays of an NPZ the server sent, by name; GpuShareError, reading nothing
    past the headers, when it would expand past `max_bytes` (by default
    `MAX_OUTPUTS_EXPANDED_BYTES`) or cannot be read safely."""
    require_numpy("reading outputs as arrays")
    from gpu_share.npz_reading import NpzError, NpzTooLarge, load_npz_bytes, size_text

    limit = MAX_OUTPUTS_EXPANDED_BYTES if max_bytes is None else max_bytes
    try:
        return load_npz_bytes(data, max_bytes=limit)
    except NpzTooLarge as exc:
        raise GpuShareError(
            f"refused the NPZ the server sent ({size_text(len(data))}): its arrays would "
            f"take {size_text(exc.total)} in memory, more than the {size_text(exc.limit)} "
            f"this client reads ({exc.largest})"
        ) from exc
    except NpzError as exc:
        raise GpuShareError(f"refused the NPZ the server sent: {exc}") from exc


def array_bytes(array: "Array") -> bytes:
    """A uint8 array holding a file (how runtimes return a model) back as bytes."""
    data: bytes = array.tobytes()
    return data


def describe(arrays: "Mapping[str, np.ndarray[Any, Any]]") -> str:
    return ", ".join(f"{name} {a.dtype}{list(a.shape)}" for name, a in arrays.items())
