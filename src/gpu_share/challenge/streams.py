"""Everything a challenge is made of, derived from its seed.

Each stream is NumPy's PCG64 with a state and an increment taken from SHA-256 of the
seed and the stream's number, read through `random_raw` (the generator's own 64-bit
outputs). PCG64 is a fixed algorithm, so these words are the same in every NumPy
version; `Generator.integers` and friends may change how they turn words into numbers,
so nothing here uses them. Words become entries by fixed arithmetic: 40 base-3 digits
a word for trits, 64 bits a word for signs.

The streams do not depend on the chain's rows or steps: B, the blocks and the weights
of a seed are the same whatever the shape, and a row of X₀ is computed from the blocks
alone (`chain.initial_rows`).
"""

import hashlib
import math
from enum import IntEnum

import numpy as np
import numpy.typing as npt

TRITS_PER_WORD = 40  # 3⁴⁰ < 2⁶⁴
# X₀'s row i combines row i mod p of three blocks: coprime periods, so rows repeat only
# after 1024·1023·1021 ≈ 10⁹ rows, more than any state has.
PERIODS = (1024, 1023, 1021)
SEED_HEX_CHARS = 32

Int8Array = npt.NDArray[np.int8]


class Stream(IntEnum):
    B = 1
    BLOCK_1 = 2
    BLOCK_2 = 3
    BLOCK_3 = 4
    ROW_WEIGHTS = 5
    COL_WEIGHTS = 6
    SHIFTS = 7


def words(seed: str, stream: Stream, count: int) -> npt.NDArray[np.uint64]:
    digest = hashlib.sha256(f"gpu-share challenge/{stream.value}/{seed}".encode()).digest()
    generator = np.random.PCG64()
    generator.state = {
        "bit_generator": "PCG64",
        "state": {
            "state": int.from_bytes(digest[:16], "little"),
            "inc": int.from_bytes(digest[16:], "little") | 1,
        },
        "has_uint32": 0,
        "uinteger": 0,
    }
    raw: npt.NDArray[np.uint64] = generator.random_raw(count)
    return raw


def trits(seed: str, stream: Stream, count: int) -> Int8Array:
    """`count` entries of {-1, 0, 1}: each word's base-3 digits, lowest first."""
    left = words(seed, stream, math.ceil(count / TRITS_PER_WORD)).copy()
    digits = np.empty((left.size, TRITS_PER_WORD), dtype=np.int8)
    three = np.uint64(3)
    for place in range(TRITS_PER_WORD):
        digits[:, place] = left % three
        left //= three
    flat: Int8Array = digits.reshape(-1)[:count] - np.int8(1)
    return flat


def signs(seed: str, stream: Stream, count: int) -> Int8Array:
    """`count` entries of ±1: each word's bits, lowest first (a set bit is +1)."""
    raw = words(seed, stream, math.ceil(count / 64)).astype("<u8").view(np.uint8)
    bits = np.unpackbits(raw, bitorder="little")[:count].astype(np.int8)
    return bits * np.int8(2) - np.int8(1)


def matrix_b(seed: str, width: int) -> Int8Array:
    return trits(seed, Stream.B, width * width).reshape(width, width)


def blocks(seed: str, width: int) -> tuple[Int8Array, Int8Array, Int8Array]:
    """X₀'s three blocks, entries in {0, 1, 2}."""
    one = np.int8(1)
    return (
        (trits(seed, Stream.BLOCK_1, PERIODS[0] * width) + one).reshape(PERIODS[0], width),
        (trits(seed, Stream.BLOCK_2, PERIODS[1] * width) + one).reshape(PERIODS[1], width),
        (trits(seed, Stream.BLOCK_3, PERIODS[2] * width) + one).reshape(PERIODS[2], width),
    )


def row_weights(seed: str, sketch_rows: int) -> Int8Array:
    return signs(seed, Stream.ROW_WEIGHTS, sketch_rows)


def col_weights(seed: str, width: int) -> Int8Array:
    return signs(seed, Stream.COL_WEIGHTS, width)


def chunk_shifts(seed: str, steps: int, chunks: int) -> list[int]:
    """k_t for each step: the roll of step t moves rows by k_t whole chunks, 1 ≤ k_t < chunks."""
    return [1 + int(word) % (chunks - 1) for word in words(seed, Stream.SHIFTS, steps)]
