"""A challenge's chain on a device through onnxruntime (`benchmarks.engine`): the state
lives on the device from the first step to the last, in two buffers that the step graph
reads from and writes to in turn, so no state crosses to the host; only each step's
sketches come back (a few kilobytes).

The samples are answered from packed copies of every state when they fit in
`keep_bytes` (copying them out costs a pass over the state a step, which counts against
the commit's deadline: worth it for small chains only); otherwise the chain is run again
from X₀ up to the last step asked for, which fits the reveal's deadline as the first run
fit the commit's, and only the asked chunks are read back, through a Slice graph.

onnxruntime and numpy are imported inside: the agent imports this package.
"""

import gc
import importlib
from typing import Any

from gpu_share.agent.benchmarks.engine import DeviceSession, Place
from gpu_share.agent.challenges import graphs
from gpu_share.challenge import chain, packing
from gpu_share.challenge.numpy_chain import RevealedChunks, reveal_from
from gpu_share.challenge.sizing import Shape
from gpu_share.challenge.streams import PERIODS


class DeviceChain:
    """Made before the seed is known (sessions, graphs, the state's memory: none of it
    counts against the deadline), then `load`ed with it."""

    def __init__(self, shape: Shape, place: Place, *, keep_bytes: int) -> None:
        self.np: Any = importlib.import_module("numpy")
        self.ort: Any = importlib.import_module("onnxruntime")
        self.shape, self.place = shape, place
        self.elem = graphs.element_type(place.on_gpu)
        self.dtype = self.np.float16 if place.on_gpu else self.np.float32
        self.keep = (shape.steps + 1) * shape.rows * shape.width // 4 <= keep_bytes
        self.states: list[bytes] = []  # packed X_0 … X_K, when kept
        self.buffers = [self._empty(), self._empty()]
        self.step_graph = DeviceSession(
            graphs.step_model(self.elem, shape.width, shape.sketch_rows), place
        )
        self.step_graph.bind_output_value("x_next", self.buffers[1])
        self.step_graph.bind_output("sketch", on_host=True)
        self.rows_graph = DeviceSession(graphs.rows_model(self.elem, shape.width), place)
        self.rows_graph.bind_output("rows_out")
        self.inputs: chain.ChainInputs | None = None

    def load(self, seed: str) -> None:
        self.inputs = inputs = chain.ChainInputs.derive(seed, self.shape)
        self.step_graph.bind_input("b", inputs.b)
        self.step_graph.bind_input("w_col", inputs.col_weights.reshape(-1, 1))
        self.step_graph.bind_input("w_row", inputs.row_weights)

    @property
    def _inputs(self) -> chain.ChainInputs:
        assert self.inputs is not None, "load the seed first"
        return self.inputs

    def _empty(self) -> Any:
        return self.ort.OrtValue.ortvalue_from_shape_and_type(
            (self.shape.rows, self.shape.width),
            self.dtype,
            self.place.device_type,
            self.place.device_id,
        )

    def _start(self) -> None:
        """X₀ into the first buffer; the start graph and its memory go before the steps."""
        start = DeviceSession(graphs.start_model(self.elem, self.shape.width), self.place)
        rows = self.np.arange(self.shape.rows, dtype=self.np.int64)
        for k, (block, period) in enumerate(zip(self._inputs.blocks, PERIODS, strict=True)):
            start.bind_input(f"a{k + 1}", block)
            start.bind_input(f"i{k + 1}", rows % period)
        start.bind_output_value("x0", self.buffers[0])
        start.run()
        start.close()
        del start
        gc.collect()

    def _step(self, t: int) -> Any:
        """X_{t+1} from X_t, in the other buffer; its sketches."""
        graph = self.step_graph
        graph.bind_value("x", self.buffers[t % 2])
        graph.bind_input("source", chain.source_chunks(self.shape.chunks, self._inputs.shifts[t]))
        graph.bind_output_value("x_next", self.buffers[(t + 1) % 2])
        graph.run()
        sketch = graph.output("sketch")
        return self.np.rint(sketch).astype(self.np.int64)

    def _rows(self, state: int, first: int, stop: int) -> Any:
        graph = self.rows_graph
        graph.bind_value("x", self.buffers[state % 2])
        graph.bind_input("first", [first])
        graph.bind_input("stop", [stop])
        graph.run()
        return graph.output("rows_out")

    def _packed_state(self, state: int) -> bytes:
        return packing.pack(self._rows(state, 0, self.shape.rows))

    def run(self) -> Any:
        """The sketches of X_1 … X_K, one row a step."""
        shape = self.shape
        found = self.np.empty((shape.steps, shape.chunks), dtype=self.np.int64)
        self._start()
        self.states = [self._packed_state(0)] if self.keep else []
        for t in range(shape.steps):
            found[t] = self._step(t)
            if self.keep:
                self.states.append(self._packed_state(t + 1))
        return found

    def reveal(self, asked: list[tuple[int, int]]) -> list[RevealedChunks]:
        shape, shifts = self.shape, self._inputs.shifts
        if self.keep:
            return [reveal_from(shape, shifts, self.states, t, c) for t, c in asked]
        wanted: dict[int, set[int]] = {}
        for t, c in asked:
            source = int(chain.source_chunks(shape.chunks, shifts[t])[c])
            wanted.setdefault(t, set()).update((c, source))
            wanted.setdefault(t + 1, set()).add(c)
        taken: dict[tuple[int, int], bytes] = {}

        def take(state: int) -> None:
            for c in wanted.get(state, ()):
                first = c * shape.sketch_rows
                rows = self._rows(state, first, first + shape.sketch_rows)
                taken[state, c] = packing.pack(rows)

        self._start()
        take(0)
        for t in range(max(wanted)):
            self._step(t)
            take(t + 1)
        return [
            RevealedChunks(
                before=taken[t, c],
                source=taken[t, int(chain.source_chunks(shape.chunks, shifts[t])[c])],
                after=taken[t + 1, c],
            )
            for t, c in asked
        ]

    def close(self) -> None:
        self.step_graph.close()
        self.rows_graph.close()
        self.buffers.clear()
