"""NPZ to and from numpy, with numpy imported only here and only when called.

numpy is not a dependency of the SDK (the CLI and plain invokes by URL need none),
so every function imports it lazily and says how to install it when it is missing.
Archives are written member by member rather than with `np.savez(**arrays)`, so an
input called `file` or `allow_pickle` cannot collide with a keyword, and nothing is
ever pickled in either direction.
"""

import io
import zipfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpu_share.sdk.errors import ConfigurationError, api_error

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Array = npt.NDArray[Any]
else:
    Array = Any

SINGLE_ARRAY_NAME = "arr_0"  # what np.savez calls one unnamed array; feeds a single-input model


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


def decode(data: bytes) -> "dict[str, Array]":
    np = require_numpy("reading outputs as arrays")
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def array_bytes(array: "Array") -> bytes:
    """A uint8 array holding a file (how runtimes return a model) back as bytes."""
    data: bytes = array.tobytes()
    return data


def describe(arrays: "Mapping[str, np.ndarray[Any, Any]]") -> str:
    return ", ".join(f"{name} {a.dtype}{list(a.shape)}" for name, a in arrays.items())
