"""Small ONNX models built in code for tests (nothing is downloaded)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def identity_model(name: str = "x", shape: tuple[int | str | None, ...] = ("batch", 4)) -> bytes:
    """y = x, float32: the smallest model an upload accepts, about 100 bytes."""
    graph = helper.make_graph(
        [helper.make_node("Identity", [name], ["y"])],
        "identity",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def unloadable_model() -> bytes:
    """A model an upload accepts (it parses, names its inputs and outputs) that onnxruntime
    refuses to load: its node reads a value nothing in the graph defines."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "undefined"], ["y"])],
        "unloadable",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def padded_model(size: int) -> bytes:
    """The identity model grown to exactly `size` bytes by a weight it never uses: a valid
    model as large as a test needs its upload to be."""
    model = onnx.load_from_string(identity_model())
    model.graph.initializer.append(helper.make_tensor("pad", TensorProto.UINT8, [0], b"", raw=True))
    pad = model.graph.initializer[-1]
    while (missing := size - model.ByteSize()) != 0:  # a longer length may take a byte more
        if missing < 0 and not pad.raw_data:
            raise ValueError(f"the smallest padded model is {model.ByteSize()} bytes")
        length = max(0, len(pad.raw_data) + missing)
        pad.raw_data = bytes(length)
        pad.dims[:] = [length]
    return bytes(model.SerializeToString())


def slow_model(iterations: int) -> bytes:
    """y = x + iterations, computed one step at a time in an ONNX Loop: a job that takes time."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["acc_in", "one"], ["acc_out"]),
        ],
        "step",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1]),
        ],
        [numpy_helper.from_array(np.array([1.0], dtype=np.float32), "one")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body)],
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [
            numpy_helper.from_array(np.array(iterations, dtype=np.int64), "trips"),
            numpy_helper.from_array(np.array(True), "cond"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def busy_model(layers: int, width: int, fan_out: int, *, seed: int = 0) -> bytes:
    """x: float32[1, width] → y: float32[1, width], with `fan_out` rows of work inside.

    Small to send, heavy to compute: the input is tiled to `fan_out` rows, pushed
    through `layers` MatMul+Relu layers and averaged back to one row.
    """
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Tile", ["x", "repeats"], ["t"])]
    initializers = [numpy_helper.from_array(np.array([fan_out, 1], dtype=np.int64), "repeats")]
    current = "t"
    for i in range(layers):
        weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        initializers.append(numpy_helper.from_array(weight, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"h{i}"]))
        current = f"h{i}"
    nodes.append(helper.make_node("ReduceMean", [current], ["y"], axes=[0], keepdims=1))
    graph = helper.make_graph(
        nodes,
        "busy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())
