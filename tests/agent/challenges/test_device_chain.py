"""The challenge's ONNX graphs compute the NumPy reference bit for bit. On the CPU
provider here; the same graph in FP16 on the CUDA provider where there is one
(`test_…_on_cuda`), which is what makes a GPU's answer checkable by the coordinator."""

import importlib

import numpy as np
import pytest

from gpu_share.agent.benchmarks.engine import Place
from gpu_share.agent.challenges import graphs
from gpu_share.agent.challenges.device_chain import DeviceChain
from gpu_share.challenge import chain, sizing, streams
from gpu_share.challenge.numpy_chain import NumpyChain

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

SEED = "c0ffee" * 5 + "00"


def random_state(rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    return rng.integers(-1, 2, size=(rows, width)).astype(np.int8)


def run_step(
    session: object, x: np.ndarray, b: np.ndarray, shift: int, sketch_rows: int, dtype: type
) -> tuple[np.ndarray, np.ndarray]:
    chunks = x.shape[0] // sketch_rows
    w_row = streams.row_weights(SEED, sketch_rows)
    w_col = streams.col_weights(SEED, x.shape[1])
    feeds = {
        "x": x.astype(dtype),
        "b": b.astype(dtype),
        "w_col": w_col.astype(dtype).reshape(-1, 1),
        "w_row": w_row.astype(np.float32),
        "source": chain.source_chunks(chunks, shift),
    }
    x_next, sketch = session.run(None, feeds)  # type: ignore[attr-defined]
    return x_next, sketch


@pytest.mark.parametrize(
    ("width", "sketch_rows", "rows"), [(16, 8, 64), (256, 32, 256), (1024, 8, 32)]
)
def test_the_onnx_step_graph_equals_the_numpy_reference_on_random_states(
    width: int, sketch_rows: int, rows: int
) -> None:
    rng = np.random.default_rng(width)
    model = graphs.step_model(graphs.element_type(on_gpu=False), width, sketch_rows)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    b = streams.matrix_b(SEED, width)
    w_row, w_col = streams.row_weights(SEED, sketch_rows), streams.col_weights(SEED, width)
    for _ in range(3):
        x = random_state(rng, rows, width)
        shift = int(rng.integers(1, rows // sketch_rows))
        x_next, sketch = run_step(session, x, b, shift, sketch_rows, np.float32)
        expected = chain.step(x, b, shift * sketch_rows)
        assert x_next.dtype == np.float32 and np.array_equal(x_next, expected)
        assert np.array_equal(sketch.astype(np.int64), chain.sketches(expected, w_row, w_col))


def test_the_fp16_step_graph_means_the_reference_step() -> None:
    """The GPU's graph, in FP16, run by onnx's own reference evaluator: the graph says the
    same as the reference (the CUDA provider's kernels are checked on a GPU)."""
    reference = importlib.import_module("onnx.reference")
    width, sketch_rows, rows = 64, 8, 32
    model = graphs.step_model(graphs.element_type(on_gpu=True), width, sketch_rows)
    evaluator = reference.ReferenceEvaluator(onnx.load_from_string(model))
    rng = np.random.default_rng(3)
    b = streams.matrix_b(SEED, width)
    x = random_state(rng, rows, width)
    x_next, sketch = run_step(evaluator, x, b, 3, sketch_rows, np.float16)
    expected = chain.step(x, b, 3 * sketch_rows)
    assert x_next.dtype == np.float16 and np.array_equal(x_next, expected)
    w_row, w_col = streams.row_weights(SEED, sketch_rows), streams.col_weights(SEED, width)
    assert np.array_equal(sketch.astype(np.int64), chain.sketches(expected, w_row, w_col))


def test_the_start_graph_builds_x0_as_the_reference_does() -> None:
    width, rows = 32, 3000
    session = ort.InferenceSession(
        graphs.start_model(graphs.element_type(on_gpu=False), width),
        providers=["CPUExecutionProvider"],
    )
    blocks = streams.blocks(SEED, width)
    indices = np.arange(rows, dtype=np.int64)
    feeds: dict[str, np.ndarray] = {
        f"a{k + 1}": block.astype(np.float32) for k, block in enumerate(blocks)
    }
    feeds |= {f"i{k + 1}": indices % p for k, p in enumerate(streams.PERIODS)}
    (x0,) = session.run(None, feeds)
    assert np.array_equal(x0, chain.initial_state(blocks, rows))


@pytest.mark.parametrize("keep_bytes", [0, 1 << 30], ids=["recomputed", "kept"])
def test_a_device_chain_answers_as_the_numpy_chain(keep_bytes: int) -> None:
    shape = sizing.Shape(sizing.Kind.CPU, width=32, rows=64, steps=12, sketch_rows=8)
    device = DeviceChain(shape, Place.cpu(1), keep_bytes=keep_bytes)
    device.load(SEED)
    reference = NumpyChain(SEED, shape)
    assert np.array_equal(device.run(), reference.run())
    asked = [(0, 1), (5, 3), (11, 7), (11, 0)]
    assert device.reveal(asked) == [reference.reveal(t, c) for t, c in asked]
    device.close()


def test_a_device_chain_equals_the_numpy_chain_on_cuda() -> None:
    """Full width FP16 on the CUDA provider, state resident on the GPU, against the
    float32 NumPy chain on the host: the same sketches and the same revealed rows."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime here has no CUDA provider (install onnxruntime-gpu on a GPU)")
    shape = sizing.Shape(sizing.Kind.GPU, width=2048, rows=4096, steps=8, sketch_rows=512)
    device = DeviceChain(shape, Place.gpu(0), keep_bytes=0)
    device.load(SEED)
    reference = NumpyChain(SEED, shape)
    assert np.array_equal(device.run(), reference.run())
    asked = [(0, 0), (3, 5), (7, 7)]
    assert device.reveal(asked) == [reference.reveal(t, c) for t, c in asked]
    device.close()
