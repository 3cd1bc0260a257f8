"""The measurement engine on onnxruntime's CPU provider, the one this machine has: the
same code binds, runs and reads back on a GPU through the CUDA provider."""

import numpy
import onnxruntime
import pytest
from onnx import TensorProto, helper

from gpu_share.agent.benchmarks.engine import (
    DeviceSession,
    EngineError,
    Place,
    ProviderNotUsed,
    UnsupportedGraph,
    onnx_model,
)
from gpu_share.agent.benchmarks.ort_device import copy_model, matmul_model

rng = numpy.random.default_rng(7)


def one_node(op: str, element_type: int, outputs: tuple[str, ...] = ("y",)) -> bytes:
    return onnx_model(
        [helper.make_node(op, ["x"], [name]) for name in outputs],
        [helper.make_tensor_value_info("x", element_type, None)],
        [helper.make_tensor_value_info(name, element_type, None) for name in outputs],
    )


def test_a_matmul_multiplies_its_bound_inputs_and_the_product_is_read_back() -> None:
    a = rng.standard_normal((64, 64), dtype=numpy.float32)
    b = rng.standard_normal((64, 64), dtype=numpy.float32)
    session = DeviceSession(matmul_model(TensorProto.FLOAT, 64), Place.cpu(1))
    session.bind_input("a", a)
    session.bind_input("b", b)
    session.bind_output("c")
    session.run()
    assert numpy.allclose(session.output("c"), a @ b, rtol=1e-4, atol=1e-4)


def test_a_bound_input_is_a_copy_and_every_run_writes_the_same_output_memory() -> None:
    source = numpy.arange(256, dtype=numpy.uint8)
    session = DeviceSession(copy_model(256), Place.cpu(1))
    session.bind_input("source", source)
    session.bind_output("target")
    session.run()
    first = session.value("target").data_ptr()
    source[:] = 0  # the caller's array is not what the device reads
    session.run()
    assert session.value("target").data_ptr() == first
    assert numpy.array_equal(session.output("target"), numpy.arange(256, dtype=numpy.uint8))


def test_bfloat16_goes_in_as_float32_rounded_on_the_device_and_comes_back_as_float32() -> None:
    session = DeviceSession(one_node("Identity", TensorProto.BFLOAT16), Place.cpu(1))
    session.bind_input("x", [1.5, -2.0, 1 / 3])
    session.bind_output("y")
    session.run()
    read = session.output("y")
    assert read.dtype == numpy.float32
    assert read.tolist() == [1.5, -2.0, 0.333984375]  # 1/3 to bfloat16's 8 bits
    session.bind_input("x", [256.0, 257.0])  # bound again: the new values, a new shape
    session.run()
    assert session.output("y").tolist() == [256.0, 256.0]  # 257 needs 9 bits


def test_outputs_are_read_by_name_whatever_order_they_were_bound_in() -> None:
    model = onnx_model(
        [helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Neg", ["x"], ["neg"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [
            helper.make_tensor_value_info("same", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("neg", TensorProto.FLOAT, [3]),
        ],
    )
    session = DeviceSession(model, Place.cpu(1))
    session.bind_output("neg")
    session.bind_output("same")
    session.bind_input("x", [1.0, 2.0, 3.0])
    session.run()
    assert session.output("same").tolist() == [1.0, 2.0, 3.0]
    assert session.output("neg").tolist() == [-1.0, -2.0, -3.0]


def test_a_session_chains_into_another_on_the_device() -> None:
    first = DeviceSession(one_node("Neg", TensorProto.FLOAT), Place.cpu(1))
    first.bind_input("x", [1.0, -4.0])
    first.bind_output("y")
    first.run()
    second = DeviceSession(one_node("Abs", TensorProto.FLOAT), Place.cpu(1))
    second.bind_value("x", first.value("y"))
    second.bind_output("y")
    second.run()
    assert second.output("y").tolist() == [1.0, 4.0]


def test_a_name_the_graph_does_not_have_or_an_output_not_yet_computed_is_an_engine_error() -> None:
    session = DeviceSession(copy_model(8), Place.cpu(1))
    with pytest.raises(EngineError, match="no input 'a'"):
        session.bind_input("a", numpy.zeros(8, dtype=numpy.uint8))
    with pytest.raises(EngineError, match="no output 'c'"):
        session.bind_output("c")
    session.bind_output("target")
    with pytest.raises(EngineError, match="has not run"):
        session.output("target")


def test_a_graph_the_provider_has_no_kernel_for_is_unsupported() -> None:
    with pytest.raises(UnsupportedGraph, match="MatMul"):
        DeviceSession(matmul_model(TensorProto.BFLOAT16, 8), Place.cpu(1))


def test_a_gpu_session_is_refused_by_a_cpu_only_onnxruntime() -> None:
    assert "CUDAExecutionProvider" not in onnxruntime.get_available_providers()
    with pytest.raises(ProviderNotUsed, match="CPU-only build"):
        DeviceSession(copy_model(8), Place.gpu(0))


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_a_gpu_session_onnxruntime_would_run_on_the_cpu_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An onnxruntime-gpu whose CUDA libraries are missing lists the CUDA provider and
    # then quietly places every node on the CPU, as this CPU build does when asked.
    monkeypatch.setattr(
        onnxruntime,
        "get_available_providers",
        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    with pytest.raises(ProviderNotUsed, match="would run this graph on CPUExecutionProvider"):
        DeviceSession(copy_model(8), Place.gpu(0))
