"""The chain's reference arithmetic in NumPy, exact in integers and in floats alike.

Every intermediate is an integer of at most `width` (≤ 2048) in magnitude and every
sketch one of at most `sketch_rows × width` (< 2²⁴), so float32 (and the GPU's FP16)
compute the same values as int32 would; the functions take either. Integer inputs are
widened to int32 before a product, float inputs keep their type (BLAS).

Why fmod 4 and then mod 3, not mod 3 twice: a step of mod 3 alone is affine over the
field of three elements, so a whole chain of them is too, and a state built from a few
periodic blocks would stay a combination of those blocks, computable on a few thousand
rows instead of all of them. Mixing the two moduli breaks that.
"""

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpu_share.challenge import streams
from gpu_share.challenge.sizing import Shape

Array = npt.NDArray[np.generic]
Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class ChainInputs:
    """What a seed makes for one shape: the same on the node and on the coordinator."""

    b: streams.Int8Array
    blocks: tuple[streams.Int8Array, streams.Int8Array, streams.Int8Array]
    row_weights: streams.Int8Array
    col_weights: streams.Int8Array
    shifts: list[int]  # k_t, in chunks

    @classmethod
    def derive(cls, seed: str, shape: Shape, *, with_blocks: bool = True) -> "ChainInputs":
        empty = np.zeros((0, shape.width), dtype=np.int8)
        return cls(
            b=streams.matrix_b(seed, shape.width),
            blocks=streams.blocks(seed, shape.width) if with_blocks else (empty, empty, empty),
            row_weights=streams.row_weights(seed, shape.sketch_rows),
            col_weights=streams.col_weights(seed, shape.width),
            shifts=streams.chunk_shifts(seed, shape.steps, shape.chunks),
        )


def initial_rows(
    blocks: tuple[streams.Int8Array, streams.Int8Array, streams.Int8Array],
    rows: npt.NDArray[np.int64],
) -> streams.Int8Array:
    """Rows of X₀: ((A₁[i mod 1024] + A₂[i mod 1023] + A₃[i mod 1021]) mod 3) − 1."""
    first, second, third = blocks
    total = first[rows % first.shape[0]] + second[rows % second.shape[0]]
    total = total + third[rows % third.shape[0]]
    result: streams.Int8Array = total % np.int8(3) - np.int8(1)
    return result


def initial_state(
    blocks: tuple[streams.Int8Array, streams.Int8Array, streams.Int8Array], rows: int
) -> streams.Int8Array:
    return initial_rows(blocks, np.arange(rows, dtype=np.int64))


def source_chunks(chunks: int, shift: int) -> Int64Array:
    """Which chunk each chunk's partner rows come from: the roll of a step by `shift`
    chunks pairs row r of chunk c with row r of chunk (c − shift) mod chunks."""
    found: Int64Array = (np.arange(chunks, dtype=np.int64) - shift) % chunks
    return found


def _product(x: Array, b: Array) -> Array:
    if np.issubdtype(x.dtype, np.integer):
        return np.asarray(x.astype(np.int32) @ b.astype(np.int32))
    return np.asarray(x @ b.astype(x.dtype))


def _finish(q: Array, partner: Array, like: np.dtype[np.generic]) -> Array:
    return np.asarray((np.mod(np.add(q, partner), 3) - 1).astype(like))


def step(x: Array, b: Array, shift_rows: int) -> Array:
    """X_{t+1} from X_t, in X_t's dtype."""
    q = np.fmod(_product(x, b), 4)
    return _finish(q, np.roll(q, shift_rows, axis=0), x.dtype)


def step_rows(rows: Array, partners: Array, b: Array) -> Array:
    """Rows of X_{t+1} from the same rows of X_t and their partners (`source_chunks`)."""
    return _finish(np.fmod(_product(rows, b), 4), np.fmod(_product(partners, b), 4), rows.dtype)


def sketches(x: Array, row_weights: Array, col_weights: Array) -> Int64Array:
    """One integer per chunk of `len(row_weights)` rows: Σ_r w_row[r]·(X[r]·w_col)."""
    if np.issubdtype(x.dtype, np.integer):
        per_row = x.astype(np.int64) @ col_weights.astype(np.int64)
    else:
        per_row = np.rint(x @ col_weights.astype(x.dtype)).astype(np.int64)
    chunked = per_row.reshape(-1, row_weights.shape[0])
    found: Int64Array = chunked @ row_weights.astype(np.int64)
    return found
