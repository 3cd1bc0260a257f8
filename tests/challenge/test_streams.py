"""The seed makes the same matrices everywhere: on the node, on the coordinator, in any
NumPy version (PCG64's raw words, turned into entries by fixed arithmetic)."""

import numpy as np

from gpu_share.challenge import chain, sizing, streams

SEED = "0" * 32
SHAPE = sizing.Shape(sizing.Kind.CPU, width=16, rows=64, steps=8, sketch_rows=8)


def test_the_raw_words_of_a_seed_are_pinned() -> None:
    """A change here would make agents and coordinators of different versions disagree."""
    assert streams.words(SEED, streams.Stream.B, 3).tolist() == [
        9760093725672428651,
        11519554105509786817,
        7913954190427628014,
    ]


def test_trits_are_the_base_three_digits_of_the_words_lowest_first() -> None:
    words = [int(w) for w in streams.words(SEED, streams.Stream.BLOCK_2, 3)]
    expected = []
    for word in words:
        for _ in range(streams.TRITS_PER_WORD):
            word, digit = divmod(word, 3)
            expected.append(digit - 1)
    assert streams.trits(SEED, streams.Stream.BLOCK_2, 120).tolist() == expected


def test_signs_are_the_bits_of_the_words_lowest_first() -> None:
    (word,) = [int(w) for w in streams.words(SEED, streams.Stream.COL_WEIGHTS, 1)]
    expected = [1 if word >> bit & 1 else -1 for bit in range(64)]
    assert streams.signs(SEED, streams.Stream.COL_WEIGHTS, 64).tolist() == expected


def test_the_same_seed_gives_the_same_matrices_and_another_seed_others() -> None:
    first = chain.ChainInputs.derive(SEED, SHAPE)
    again = chain.ChainInputs.derive(SEED, SHAPE)
    other = chain.ChainInputs.derive("1" * 32, SHAPE)
    assert np.array_equal(first.b, again.b) and first.shifts == again.shifts
    assert all(np.array_equal(a, b) for a, b in zip(first.blocks, again.blocks, strict=True))
    assert np.array_equal(first.row_weights, again.row_weights)
    assert not np.array_equal(first.b, other.b)
    assert set(np.unique(first.b)) == {-1, 0, 1}
    assert all(1 <= k < SHAPE.chunks for k in first.shifts)


def test_the_streams_do_not_depend_on_the_rows_or_steps() -> None:
    """B and the blocks of a seed are the same whatever the state's height: the
    coordinator derives X₀'s rows without knowing more than the width."""
    taller = sizing.Shape(sizing.Kind.CPU, width=16, rows=4096, steps=20, sketch_rows=64)
    short, tall = chain.ChainInputs.derive(SEED, SHAPE), chain.ChainInputs.derive(SEED, taller)
    assert np.array_equal(short.b, tall.b)
    assert np.array_equal(short.blocks[2], tall.blocks[2])
