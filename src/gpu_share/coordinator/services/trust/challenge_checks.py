"""Checking a reveal against the commitment and the seed, exactly (docs/trust.md, step 5).

For each sample (t, c) the node sent three chunks: X_t's chunk c, X_t's chunk the roll
pairs it with, and X_{t+1}'s chunk c. Each must be what the node committed to (its
sketch; X₀'s chunks are recomputed from the seed instead), and for `ROWS_CHECKED`
random rows of the sample the step is recomputed and must give X_{t+1}'s rows.

CPU work in NumPy: callers run `check` in a thread (`asyncio.to_thread`), and NumPy is
imported only here, only when a reveal arrives.
"""

import secrets
from dataclasses import dataclass
from typing import Any

from gpu_share.challenge.sizing import ROWS_CHECKED, Kind, Shape
from gpu_share.protocol.trust import ChallengeParams, ChallengeReveal, decode


@dataclass(frozen=True)
class Asked:
    """A sample as the commit chose it, and the sketches the node committed for it (None
    for X₀'s chunks, which follow from the seed)."""

    step: int
    chunk: int
    source: int
    before: int | None
    partner: int | None
    after: int


def shape_of(params: ChallengeParams) -> Shape:
    return Shape(
        Kind(params.kind.value), params.width, params.rows, params.steps, params.sketch_rows
    )


def asked_from(stored: dict[str, Any]) -> list[Asked]:
    return [Asked(**sample) for sample in stored.get("asked", [])]


def check(
    seed: str, params: ChallengeParams, asked: list[Asked], reveal: ChallengeReveal
) -> str | None:
    """None when every sample holds; else why not, in words for the provider."""
    import numpy as np

    from gpu_share.challenge import chain, packing

    shape = shape_of(params)
    if [(s.step, s.chunk) for s in reveal.samples] != [(a.step, a.chunk) for a in asked]:
        return "the reveal does not answer the samples asked for, in their order"
    needs_start = any(a.step == 0 for a in asked)
    inputs = chain.ChainInputs.derive(seed, shape, with_blocks=needs_start)
    b = inputs.b.astype(np.float64)
    for sample, answer in zip(asked, reveal.samples, strict=True):
        where = f"step {sample.step}, chunk {sample.chunk}"
        try:
            before, partner, after = (
                packing.unpack(decode(blob), shape.sketch_rows, shape.width)
                for blob in (answer.before, answer.source, answer.after)
            )
        except ValueError as exc:
            return f"{where}: the rows are malformed ({exc})"
        for rows, chunk, committed, what in (
            (before, sample.chunk, sample.before, "X_t's chunk"),
            (partner, sample.source, sample.partner, "its partner chunk"),
        ):
            if committed is None:
                first = chunk * shape.sketch_rows
                indices = np.arange(first, first + shape.sketch_rows, dtype=np.int64)
                if not np.array_equal(rows, chain.initial_rows(inputs.blocks, indices)):
                    return f"{where}: {what} is not X₀'s, which the seed gives"
            elif _sketch(rows, inputs) != committed:
                return f"{where}: {what} does not match the sketch committed for it"
        if _sketch(after, inputs) != sample.after:
            return f"{where}: X_(t+1)'s chunk does not match the sketch committed for it"
        count = min(shape.sketch_rows, ROWS_CHECKED)
        picked = sorted(secrets.SystemRandom().sample(range(shape.sketch_rows), count))
        computed = chain.step_rows(
            before[picked].astype(np.float64), partner[picked].astype(np.float64), b
        )
        wrong = np.flatnonzero((computed != after[picked]).any(axis=1))
        if wrong.size:
            row = sample.chunk * shape.sketch_rows + picked[int(wrong[0])]
            return f"{where}: row {row} of X_(t+1) is not what the step gives"
    return None


def _sketch(rows: Any, inputs: Any) -> int:
    from gpu_share.challenge import chain

    return int(chain.sketches(rows, inputs.row_weights, inputs.col_weights)[0])
