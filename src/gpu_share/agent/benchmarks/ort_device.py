"""A benchmarks `Device` on the measurement engine: a GPU through onnxruntime's CUDA
provider, or the CPU through its CPU provider.

Each precision is a graph of one MatMul of two n×n inputs: float16 and bfloat16 as the
inputs' type, FP32 and TF32 the same float32 graph in sessions that turn the CUDA
provider's `use_tf32` off and on. The copy is an Identity of a uint8 buffer, read and
written on the device. Inputs and outputs stay on the device (`engine`), so each timed
call is the multiply or the copy and nothing else.
"""

import dataclasses
import importlib
from typing import Any

from gpu_share.agent.benchmarks.compute import NoGpuBackend, Operation
from gpu_share.agent.benchmarks.engine import (
    DeviceSession,
    EngineError,
    Place,
    UnsupportedGraph,
    onnx_model,
)
from gpu_share.protocol.benchmarks import Precision

PROBE_BYTES = 4096
TENSOR_CORES = (8, 0)  # Ampere: TF32 and bfloat16
USE_TF32_SINCE = (1, 18)  # the CUDA provider's `use_tf32`: before it, FP32 could be TF32


def _element_type(precision: Precision) -> int:
    tensor_proto = importlib.import_module("onnx").TensorProto
    element_types: dict[Precision, int] = {
        Precision.FP32: tensor_proto.FLOAT,
        Precision.TF32: tensor_proto.FLOAT,
        Precision.FP16: tensor_proto.FLOAT16,
        Precision.BF16: tensor_proto.BFLOAT16,
    }
    return element_types[precision]


def matmul_model(element_type: int, n: int) -> bytes:
    helper = importlib.import_module("onnx.helper")
    return onnx_model(
        [helper.make_node("MatMul", ["a", "b"], ["c"])],
        [helper.make_tensor_value_info(name, element_type, [n, n]) for name in ("a", "b")],
        [helper.make_tensor_value_info("c", element_type, [n, n])],
    )


def copy_model(nbytes: int) -> bytes:
    helper = importlib.import_module("onnx.helper")
    uint8 = importlib.import_module("onnx").TensorProto.UINT8
    return onnx_model(
        [helper.make_node("Identity", ["source"], ["target"])],
        [helper.make_tensor_value_info("source", uint8, [nbytes])],
        [helper.make_tensor_value_info("target", uint8, [nbytes])],
    )


def _major_minor(text: str | None) -> tuple[int, int] | None:
    """NVML's "8.0" or a version "1.22.0" as (8, 0) or (1, 22); None where it is not so."""
    try:
        major, minor = (text or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


class OrtDevice:
    """The device `place` names, measured through onnxruntime; each operation is a
    `DeviceSession` that stays open until `close`."""

    def __init__(self, place: Place, *, capability: tuple[int, int] | None = None) -> None:
        ort = importlib.import_module("onnxruntime")
        self.place = place
        self.capability = capability
        self.name = f"onnxruntime {ort.__version__} {'CUDA' if place.on_gpu else 'CPU'}"
        self.sessions: list[DeviceSession] = []
        self.operands: tuple[int, Any, Any] | None = None  # on the host, kept across close
        self._probe()

    @classmethod
    def gpu(cls, ordinal: int, compute_capability: str | None = None) -> "OrtDevice":
        """CUDA device `ordinal`; `NoGpuBackend` unless onnxruntime really runs on it."""
        version = importlib.import_module("onnxruntime").__version__
        release = _major_minor(version)
        if release is not None and release < USE_TF32_SINCE:
            raise NoGpuBackend(f"onnxruntime {version} cannot turn TF32 off: 1.18 or later can")
        try:
            return cls(Place.gpu(ordinal), capability=_major_minor(compute_capability))
        except EngineError as exc:
            raise NoGpuBackend(str(exc)) from exc

    @classmethod
    def cpu(cls, threads: int) -> "OrtDevice":
        return cls(Place.cpu(threads))

    def _probe(self) -> None:
        """A small copy, run and read back: the provider works here, or this raises."""
        numpy = importlib.import_module("numpy")
        source = numpy.arange(PROBE_BYTES, dtype=numpy.uint8)
        probe = DeviceSession(copy_model(PROBE_BYTES), self.place)
        probe.bind_input("source", source)
        probe.bind_output("target")
        probe.run()
        if not numpy.array_equal(probe.output("target"), source):
            raise EngineError(f"{self.name} copied {PROBE_BYTES} bytes wrongly")
        probe.close()

    def _tensor_cores(self) -> bool:
        return self.capability is None or self.capability >= TENSOR_CORES

    def _host_operands(self, n: int) -> tuple[Any, Any]:
        if self.operands is None or self.operands[0] != n:
            numpy = importlib.import_module("numpy")
            generator = numpy.random.default_rng(0)
            a = generator.standard_normal((n, n), dtype=numpy.float32)
            b = generator.standard_normal((n, n), dtype=numpy.float32)
            self.operands = (n, a, b)
        return self.operands[1], self.operands[2]

    def matmul(self, precision: Precision, n: int) -> Operation | None:
        if precision is Precision.TF32 and not self.place.on_gpu:
            return None  # a CPU has no TF32: its float32 multiply is the FP32 figure
        if precision in (Precision.BF16, Precision.TF32) and not self._tensor_cores():
            return None
        place = dataclasses.replace(self.place, tf32=precision is Precision.TF32)
        try:
            session = DeviceSession(matmul_model(_element_type(precision), n), place)
        except UnsupportedGraph:
            return None
        a, b = self._host_operands(n)
        session.bind_input("a", a)
        session.bind_input("b", b)
        session.bind_output("c")
        session.run()  # allocates the product on the device, which later runs overwrite
        self.sessions.append(session)
        return session.run

    def copy(self, nbytes: int) -> Operation:
        numpy = importlib.import_module("numpy")
        # One thread on a CPU: the figure is one core's copy, as numpy's is.
        session = DeviceSession(copy_model(nbytes), dataclasses.replace(self.place, threads=1))
        session.bind_input("source", numpy.ones(nbytes, dtype=numpy.uint8))
        session.bind_output("target")
        session.run()
        self.sessions.append(session)
        return session.run

    def synchronize(self) -> None:
        for session in self.sessions:
            session.synchronize()

    def close(self) -> None:
        for session in self.sessions:
            session.close()
        self.sessions.clear()
