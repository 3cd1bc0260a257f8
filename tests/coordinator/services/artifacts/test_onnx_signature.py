"""Reading an ONNX model's inputs and outputs from its file: what onnxruntime reads, from
any model, for memory that does not grow with the weights; anything else is `NotOnnx`."""

import contextlib
import io
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from skl2onnx import to_onnx
from sklearn.linear_model import LogisticRegression

from gpu_share.coordinator.services.artifacts import onnx_signature
from gpu_share.coordinator.services.artifacts.onnx_signature import (
    MAX_LISTED,
    NotOnnx,
    read_signature,
)
from gpu_share.examples import DIGITS_MODEL
from gpu_share.protocol.artifacts import ModelSignature
from gpu_share.testing.models import busy_model, identity_model, slow_model


def signature(data: bytes) -> ModelSignature:
    return read_signature(io.BytesIO(data), len(data))


def classifier_with_zipmap() -> bytes:
    """skl2onnx's default classifier: its probabilities are a sequence of maps."""
    rng = np.random.default_rng(0)
    x = rng.random((20, 3)).astype(np.float32)
    model = to_onnx(LogisticRegression().fit(x, x[:, 0] > 0.5), x[:1])
    return bytes(model.SerializeToString())


def ort_view(data: bytes) -> tuple[list[tuple[str, object]], list[tuple[str, object]]]:
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])

    def shape(value: ort.NodeArg) -> object:
        return value.shape if value.type.startswith("tensor") else None

    return (
        [(v.name, shape(v)) for v in session.get_inputs()],
        [(v.name, shape(v)) for v in session.get_outputs()],
    )


@pytest.mark.parametrize(
    "data",
    [
        DIGITS_MODEL.read_bytes(),
        identity_model("pixels", ("batch", 3, None)),
        slow_model(10),
        busy_model(2, 8, 4),
        classifier_with_zipmap(),
    ],
    ids=["digits", "symbolic", "loop", "matmul", "zipmap"],
)
def test_the_signature_is_what_onnxruntime_reads(data: bytes) -> None:
    read = signature(data)
    inputs, outputs = ort_view(data)
    assert [(v.name, v.shape) for v in read.inputs] == inputs
    assert [(v.name, v.shape) for v in read.outputs] == outputs


def test_types_are_named_as_numpy_names_them_and_others_as_onnx_spells_them() -> None:
    read = signature(classifier_with_zipmap())
    assert [(v.name, v.type) for v in read.outputs] == [
        ("output_label", "int64"),
        ("output_probability", "sequence(map(int64,float32))"),
    ]
    assert read.outputs[0].describe() == "output_label: int64[?]"
    assert read.outputs[1].describe() == "output_probability: sequence(map(int64,float32))"


def test_an_input_an_initializer_backs_is_a_weight_not_an_input() -> None:
    """Models of IR version 3 list every initializer among the graph's inputs."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"])],
        "old",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, dtype=np.float32), "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert [v.name for v in signature(model.SerializeToString()).inputs] == ["x"]


def test_a_model_with_more_values_than_are_listed_says_so() -> None:
    count = MAX_LISTED + 1
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], [f"y{i}"]) for i in range(count)],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1]) for i in range(count)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    read = signature(model.SerializeToString())
    assert read.truncated and len(read.outputs) == MAX_LISTED


def test_a_file_of_countless_tiny_fields_is_refused_after_a_bounded_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Valid protobuf, nothing but field 1 again and again: read up to the bound."""
    monkeypatch.setattr(onnx_signature, "MAX_FIELDS", 1000)
    with pytest.raises(NotOnnx, match="more than 1000 nodes, weights and values"):
        signature(b"\x08\x01" * 1001)
    assert signature(identity_model()).outputs[0].name == "y"


def test_every_model_cut_short_is_refused() -> None:
    data = identity_model()
    for end in range(len(data)):
        with pytest.raises(NotOnnx):
            signature(data[:end])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_read_or_refused_never_a_crash(data: bytes) -> None:
    with contextlib.suppress(NotOnnx):
        signature(data)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=len(DIGITS_MODEL.read_bytes()) - 1), st.integers(1, 255))
def test_a_flipped_byte_is_read_or_refused_never_a_crash(position: int, flip: int) -> None:
    data = bytearray(DIGITS_MODEL.read_bytes())
    data[position] ^= flip
    with contextlib.suppress(NotOnnx):
        signature(bytes(data))


def test_a_large_model_is_read_from_its_file_without_loading_its_weights(
    tmp_path: Path,
) -> None:
    weights = np.ones((4096, 2048), dtype=np.float32)  # 32 MiB
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "large",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4096])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2048])],
        [numpy_helper.from_array(weights, "w")],
    )
    path = tmp_path / "large.onnx"
    onnx.save_model(helper.make_model(graph), path)
    del graph, weights
    assert path.stat().st_size > 32 * 1024 * 1024
    tracemalloc.start()
    try:
        with path.open("rb") as file:
            read = read_signature(file, path.stat().st_size)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert read.inputs[0].describe() == "x: float32[batch,4096]"
    assert peak < 256 * 1024, f"reading the model allocated {peak} bytes at its peak"
