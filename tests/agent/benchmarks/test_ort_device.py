"""The onnxruntime device, measured for real on this machine's CPU provider at small
sizes; which backend measures a GPU, with PyTorch stood in for where it would be."""

import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy
import onnxruntime
import pytest

from gpu_share.agent.benchmarks import compute, memory
from gpu_share.agent.benchmarks.ort_device import OrtDevice
from gpu_share.protocol.benchmarks import Precision
from tests.agent.benchmarks.test_measurements import NO_SUCH_GPU

MiB = 1024 * 1024


def test_each_precision_the_cpu_provider_has_gives_a_rate_and_the_others_none() -> None:
    device = OrtDevice.cpu(threads=1)
    figures: dict[Precision, float | None] = {}
    for precision in Precision:
        figures[precision] = compute.matmul_tflops(device, precision, 128, 0.02)
        device.close()
    fp32, fp16 = figures[Precision.FP32], figures[Precision.FP16]
    assert fp32 is not None and fp32 > 0
    assert fp16 is not None and fp16 > 0
    assert figures[Precision.BF16] is None  # no bfloat16 MatMul kernel on the CPU provider
    assert figures[Precision.TF32] is None  # a CPU has no TF32
    assert device.name.startswith("onnxruntime ") and device.name.endswith(" CPU")


def test_the_copy_moves_the_whole_buffer_and_gives_a_bandwidth() -> None:
    device = OrtDevice.cpu(threads=1)
    assert memory.copy_bandwidth_gbs(device, 4 * MiB, 0.02) > 0
    (copying,) = device.sessions
    assert numpy.array_equal(copying.output("target"), numpy.ones(4 * MiB, dtype=numpy.uint8))
    device.close()
    assert device.sessions == []


def test_a_gpu_is_never_measured_on_the_cpu_when_onnxruntime_has_no_cuda() -> None:
    with pytest.raises(compute.NoGpuBackend, match="CUDAExecutionProvider"):
        OrtDevice.gpu(0, "9.0")
    measured = compute.measure_gpu(NO_SUCH_GPU, 0, 0.01)  # no PyTorch or CuPy here either
    assert measured.backend is None
    assert measured.fp32_tflops is None and measured.memory_bandwidth_gbs is None
    assert measured.error and "onnxruntime: onnxruntime" in measured.error


def stand_in_torch() -> ModuleType:
    """Enough of PyTorch's CUDA API for `TorchDevice` to open GPU 0."""
    torch: Any = ModuleType("torch")
    torch.__version__ = "2.9.0 (stand-in)"
    torch.device = lambda kind, index: (kind, index)
    torch.cuda = SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 1,
        set_device=lambda device: None,
        get_device_capability=lambda device: (9, 0),
    )
    return torch  # type: ignore[no-any-return]


def test_onnxruntime_measures_a_gpu_before_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", stand_in_torch())
    opened: list[tuple[int, str | None]] = []

    def cuda_device(ordinal: int, compute_capability: str | None = None) -> Any:
        opened.append((ordinal, compute_capability))
        return SimpleNamespace(name="onnxruntime (stand-in) CUDA")

    monkeypatch.setattr(OrtDevice, "gpu", cuda_device)
    assert [name for name, _ in compute.gpu_backends(0)] == ["onnxruntime", "PyTorch", "CuPy"]
    device = compute.open_gpu(0, "9.0")
    assert device.name == "onnxruntime (stand-in) CUDA"
    assert opened == [(0, "9.0")]


def test_pytorch_measures_a_gpu_that_onnxruntime_cannot_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", stand_in_torch())
    device = compute.open_gpu(0, "9.0")  # this onnxruntime is a CPU build: it refuses
    assert isinstance(device, compute.TorchDevice)
    assert device.name == "torch 2.9.0 (stand-in)"


def test_an_onnxruntime_that_cannot_turn_tf32_off_does_not_measure_a_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(onnxruntime, "__version__", "1.17.3")
    with pytest.raises(compute.NoGpuBackend, match=r"1\.17\.3 cannot turn TF32 off"):
        OrtDevice.gpu(0, "9.0")
