"""The reference arithmetic is exact: NumPy's integers, float32 and FP16 give the same
bits as a plain computation with Python integers."""

import itertools

import numpy as np
import pytest

from gpu_share.challenge import chain, packing, sizing, streams
from gpu_share.challenge.numpy_chain import NumpyChain

SEED = "5eed" * 8
SHAPE = sizing.Shape(sizing.Kind.CPU, width=16, rows=48, steps=10, sketch_rows=8)


def naive_step(x: list[list[int]], b: list[list[int]], shift_rows: int) -> list[list[int]]:
    """The chain's definition, in Python integers and nothing else."""
    rows, width = len(x), len(b)
    y = [[sum(x[i][k] * b[k][j] for k in range(width)) for j in range(width)] for i in range(rows)]
    q = [[int(np.fmod(v, 4)) for v in row] for row in y]  # the remainder keeps y's sign
    for row in q:
        assert all(-3 <= v <= 3 for v in row)
    return [
        [(q[i][j] + q[(i - shift_rows) % rows][j]) % 3 - 1 for j in range(width)]
        for i in range(rows)
    ]


def naive_sketches(x: list[list[int]], w_row: list[int], w_col: list[int]) -> list[int]:
    chunk = len(w_row)
    per_row = [sum(v * w for v, w in zip(row, w_col, strict=True)) for row in x]
    return [
        sum(w_row[r] * per_row[c * chunk + r] for r in range(chunk)) for c in range(len(x) // chunk)
    ]


def test_the_reference_step_equals_a_naive_integer_computation() -> None:
    inputs = chain.ChainInputs.derive(SEED, SHAPE)
    x: chain.Array = chain.initial_state(inputs.blocks, SHAPE.rows)
    plain = x.tolist()
    for shift in inputs.shifts[:3]:
        x = chain.step(x, inputs.b, shift * SHAPE.sketch_rows)
        plain = naive_step(plain, inputs.b.tolist(), shift * SHAPE.sketch_rows)
        assert x.tolist() == plain
        assert chain.sketches(x, inputs.row_weights, inputs.col_weights).tolist() == (
            naive_sketches(plain, inputs.row_weights.tolist(), inputs.col_weights.tolist())
        )


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_floats_give_the_same_bits_as_integers(dtype: type[np.floating]) -> None:
    inputs = chain.ChainInputs.derive(SEED, SHAPE)
    exact: chain.Array = chain.initial_state(inputs.blocks, SHAPE.rows)
    floating: chain.Array = exact.astype(dtype)
    for shift in inputs.shifts:
        exact = chain.step(exact, inputs.b, shift * SHAPE.sketch_rows)
        floating = chain.step(floating, inputs.b.astype(dtype), shift * SHAPE.sketch_rows)
        assert floating.dtype == dtype
        assert np.array_equal(floating.astype(np.int8), exact)
        assert np.array_equal(
            chain.sketches(floating, inputs.row_weights, inputs.col_weights),
            chain.sketches(exact, inputs.row_weights, inputs.col_weights),
        )


def test_fp16_sums_a_full_width_row_exactly_in_any_order() -> None:
    """Every partial sum of a product of width entries is an integer of at most the width in
    magnitude: with the widest row allowed, FP16 accumulating in FP16 still loses nothing."""
    width = sizing.MAX_WIDTH
    rng = np.random.default_rng(1)
    worst = np.ones(width, dtype=np.float16)  # a row of ones times a column of ones
    mixed = rng.integers(-1, 2, size=width).astype(np.float16)
    for terms in (worst, mixed, mixed[::-1]):
        running = np.cumsum(terms, dtype=np.float16)
        assert np.array_equal(running, np.cumsum(terms.astype(np.int64)))
    assert float(np.float16(width + 1)) != width + 1  # one more and FP16 would round


def test_rows_and_chunks_checked_alone_agree_with_the_whole_state() -> None:
    inputs = chain.ChainInputs.derive(SEED, SHAPE)
    x = chain.initial_state(inputs.blocks, SHAPE.rows)
    picked = np.array([0, 5, 17, 47], dtype=np.int64)
    assert np.array_equal(chain.initial_rows(inputs.blocks, picked), x[picked])
    shift = inputs.shifts[0]
    after = chain.step(x, inputs.b, shift * SHAPE.sketch_rows)
    sources = chain.source_chunks(SHAPE.chunks, shift)
    for c in range(SHAPE.chunks):
        rows = slice(c * 8, c * 8 + 8)
        partner = slice(int(sources[c]) * 8, int(sources[c]) * 8 + 8)
        assert np.array_equal(chain.step_rows(x[rows], x[partner], inputs.b), after[rows])


def test_x0_does_not_repeat_with_any_one_block() -> None:
    """Rows 1024 apart share block 1's row but not the others': no period a node could
    compute once and copy."""
    blocks = streams.blocks(SEED, 16)
    rows = np.arange(4096, dtype=np.int64)
    x0 = chain.initial_rows(blocks, rows)
    for period in (*streams.PERIODS, 2048):
        assert not np.array_equal(x0[:period], x0[period : 2 * period])


def test_packing_round_trips_and_refuses_what_is_not_a_trit() -> None:
    rows = np.array(list(itertools.product([-1, 0, 1], repeat=4)) * 2, dtype=np.int8)
    rows = rows.reshape(-1, 8)
    data = packing.pack(rows)
    assert len(data) == packing.packed_size(*rows.shape)
    assert np.array_equal(packing.unpack(data, *rows.shape), rows)
    assert np.array_equal(packing.unpack(packing.pack(rows.astype(np.float16)), *rows.shape), rows)
    with pytest.raises(ValueError, match="not -1, 0 or 1"):
        packing.unpack(b"\xff" + data[1:], *rows.shape)
    with pytest.raises(ValueError, match="bytes are not"):
        packing.unpack(data[:-1], *rows.shape)


def test_the_numpy_chain_reveals_what_it_committed_to() -> None:
    node = NumpyChain(SEED, SHAPE)
    sketches = node.run()
    inputs = node.inputs
    for step, chunk in [(0, 0), (4, 5), (SHAPE.steps - 1, 2)]:
        revealed = node.reveal(step, chunk)
        before, partner, after = (
            packing.unpack(blob, SHAPE.sketch_rows, SHAPE.width)
            for blob in (revealed.before, revealed.source, revealed.after)
        )
        [after_sketch] = chain.sketches(after, inputs.row_weights, inputs.col_weights)
        assert after_sketch == sketches[step][chunk]
        assert np.array_equal(chain.step_rows(before, partner, inputs.b), after)
