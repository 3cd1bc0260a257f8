"""The challenge's ONNX graphs (docs/trust.md): one step of the chain, the first state,
and a slice of rows to read back. Each runs as one graph on the device with its tensors
there (`benchmarks.engine`): FP16 on a GPU through the CUDA provider, FP32 on a CPU.

A step, for X of `rows × width` and chunks of `sketch_rows` rows:

    q      = Mod(X · B, 4, fmod=1) + 3            the remainder, shifted to 0 … 6
    q_c    = reshape(q, chunks × sketch_rows × width)
    X'     = reshape(Mod(q_c + Gather(q_c, source), 3, fmod=1) − 1, rows × width)
    sketch = ReduceSum(reshape(Cast(X' · w_col, float32), chunks × sketch_rows) ⊙ w_row)

Adding 3 keeps every operand of the second Mod non-negative, so fmod is the
mathematical remainder there; the first Mod keeps the dividend's sign, as `np.fmod`
(`gpu_share.challenge.chain.step`). The roll moves whole chunks, so it is a Gather of
`chunks` indices (`source`, per step). Sketches are summed in float32: they reach
sketch_rows × width ≤ 2²³, beyond FP16's integers.

onnx is imported inside the functions: the agent imports this package and must not
load it.
"""

import functools
import importlib
from typing import Any

from gpu_share.agent.benchmarks.engine import onnx_model
from gpu_share.challenge.streams import PERIODS


def _onnx() -> tuple[Any, Any]:
    onnx = importlib.import_module("onnx")
    return onnx, importlib.import_module("onnx.helper")


def element_type(on_gpu: bool) -> int:
    tensor_proto = importlib.import_module("onnx").TensorProto
    return int(tensor_proto.FLOAT16 if on_gpu else tensor_proto.FLOAT)


def _constant(name: str, data_type: int, values: list[int] | list[float], dims: list[int]) -> Any:
    helper = importlib.import_module("onnx.helper")
    return helper.make_node(
        "Constant", [], [name], value=helper.make_tensor(name, data_type, dims, values)
    )


@functools.cache
def step_model(elem: int, width: int, sketch_rows: int) -> bytes:
    onnx, helper = _onnx()
    int64, float32 = onnx.TensorProto.INT64, onnx.TensorProto.FLOAT
    nodes = [
        _constant("four", elem, [4], []),
        _constant("three", elem, [3], []),
        _constant("one", elem, [1], []),
        _constant("chunked", int64, [-1, sketch_rows, width], [3]),
        _constant("flat", int64, [-1, width], [2]),
        _constant("per_chunk", int64, [-1, sketch_rows], [2]),
        _constant("across", int64, [1], [1]),
        helper.make_node("MatMul", ["x", "b"], ["y"]),
        helper.make_node("Mod", ["y", "four"], ["remainder"], fmod=1),
        helper.make_node("Add", ["remainder", "three"], ["q"]),
        helper.make_node("Reshape", ["q", "chunked"], ["q_chunks"]),
        helper.make_node("Gather", ["q_chunks", "source"], ["partners"], axis=0),
        helper.make_node("Add", ["q_chunks", "partners"], ["pairs"]),
        helper.make_node("Mod", ["pairs", "three"], ["digits"], fmod=1),
        helper.make_node("Sub", ["digits", "one"], ["next_chunks"]),
        helper.make_node("Reshape", ["next_chunks", "flat"], ["x_next"]),
        helper.make_node("MatMul", ["x_next", "w_col"], ["per_row"]),
    ]
    if elem != float32:
        nodes.append(helper.make_node("Cast", ["per_row"], ["per_row_32"], to=float32))
    nodes += [
        helper.make_node(
            "Reshape", ["per_row_32" if elem != float32 else "per_row", "per_chunk"], ["rows_32"]
        ),
        helper.make_node("Mul", ["rows_32", "w_row"], ["weighted"]),
        helper.make_node("ReduceSum", ["weighted", "across"], ["sketch"], keepdims=0),
    ]
    value = helper.make_tensor_value_info
    return onnx_model(
        nodes,
        [
            value("x", elem, ["rows", width]),
            value("b", elem, [width, width]),
            value("w_col", elem, [width, 1]),
            value("w_row", float32, [sketch_rows]),
            value("source", int64, ["chunks"]),
        ],
        [value("x_next", elem, ["rows", width]), value("sketch", float32, ["chunks"])],
    )


@functools.cache
def start_model(elem: int, width: int) -> bytes:
    """X₀ = Mod(A₁[i₁] + A₂[i₂] + A₃[i₃], 3) − 1, the blocks' entries in {0, 1, 2}."""
    onnx, helper = _onnx()
    int64 = onnx.TensorProto.INT64
    value = helper.make_tensor_value_info
    nodes = [
        _constant("three", elem, [3], []),
        _constant("one", elem, [1], []),
        helper.make_node("Gather", ["a1", "i1"], ["g1"], axis=0),
        helper.make_node("Gather", ["a2", "i2"], ["g2"], axis=0),
        helper.make_node("Gather", ["a3", "i3"], ["g3"], axis=0),
        helper.make_node("Add", ["g1", "g2"], ["g12"]),
        helper.make_node("Add", ["g12", "g3"], ["total"]),
        helper.make_node("Mod", ["total", "three"], ["digits"], fmod=1),
        helper.make_node("Sub", ["digits", "one"], ["x0"]),
    ]
    blocks = [value(f"a{k + 1}", elem, [period, width]) for k, period in enumerate(PERIODS)]
    indices = [value(f"i{k + 1}", int64, ["rows"]) for k in range(3)]
    return onnx_model(nodes, blocks + indices, [value("x0", elem, ["rows", width])])


@functools.cache
def rows_model(elem: int, width: int) -> bytes:
    """Rows `first` … `stop` − 1 of a state, to read back to the host."""
    onnx, helper = _onnx()
    int64 = onnx.TensorProto.INT64
    value = helper.make_tensor_value_info
    return onnx_model(
        [
            _constant("axis", int64, [0], [1]),
            helper.make_node("Slice", ["x", "first", "stop", "axis"], ["rows_out"]),
        ],
        [value("x", elem, ["rows", width]), value("first", int64, [1]), value("stop", int64, [1])],
        [value("rows_out", elem, ["picked", width])],
    )
