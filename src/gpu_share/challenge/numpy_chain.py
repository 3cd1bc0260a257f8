"""A whole chain in NumPy: the agent's fallback without onnxruntime, and the honest
node of the tests. It keeps every state packed (two bits an entry), so answering the
samples recomputes nothing: a chunk's packed rows are a slice of its state's bytes."""

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpu_share.challenge import chain, packing
from gpu_share.challenge.sizing import Shape


@dataclass(frozen=True)
class RevealedChunks:
    """A sample's three chunks, packed: X_t's chunk, its partner chunk, X_{t+1}'s chunk."""

    before: bytes
    source: bytes
    after: bytes


def packed_chunk(state: bytes, shape: Shape, chunk: int) -> bytes:
    size = shape.chunk_bytes
    return state[chunk * size : (chunk + 1) * size]


def reveal_from(
    shape: Shape, shifts: list[int], states: list[bytes], step: int, chunk: int
) -> RevealedChunks:
    """Sample (step, chunk) from the packed X_step and X_{step+1}."""
    source = int(chain.source_chunks(shape.chunks, shifts[step])[chunk])
    return RevealedChunks(
        before=packed_chunk(states[step], shape, chunk),
        source=packed_chunk(states[step], shape, source),
        after=packed_chunk(states[step + 1], shape, chunk),
    )


class NumpyChain:
    def __init__(self, seed: str, shape: Shape, *, dtype: type[np.generic] = np.float32) -> None:
        self.shape = shape
        self.inputs = chain.ChainInputs.derive(seed, shape)
        self.dtype = dtype
        self.states: list[bytes] = []  # X_0 … X_K, packed

    def run(self) -> npt.NDArray[np.int64]:
        """The sketches of X_1 … X_K, one row a step."""
        shape, inputs = self.shape, self.inputs
        x = chain.initial_state(inputs.blocks, shape.rows).astype(self.dtype)
        b = inputs.b.astype(self.dtype)
        self.states = [packing.pack(x)]
        found = np.empty((shape.steps, shape.chunks), dtype=np.int64)
        for t, shift in enumerate(inputs.shifts):
            x = chain.step(x, b, shift * shape.sketch_rows)
            self.states.append(packing.pack(x))
            found[t] = chain.sketches(x, inputs.row_weights, inputs.col_weights)
        return found

    def reveal(self, step: int, chunk: int) -> RevealedChunks:
        return reveal_from(self.shape, self.inputs.shifts, self.states, step, chunk)
