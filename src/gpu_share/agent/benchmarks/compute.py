"""Matrix-multiply throughput: each GPU through onnxruntime's CUDA provider, else PyTorch,
else CuPy; the CPU through onnxruntime's CPU provider, else numpy.

A `Device` makes operations (a matrix multiply of one precision, a memory copy) and
waits for the hardware to finish them; `rate` times any of them the same way: a
warm-up whose last call sizes the run, then as many calls as fit the time budget, with
the device synchronized before the clock stops (GPU work is asynchronous).

onnxruntime comes first because every agent install has it: ONNX jobs run on it. Its
device (`ort_device`) is built on `engine`, which hardware challenges use too; PyTorch
and CuPy are optional. Imports of onnxruntime, torch, cupy and numpy happen inside the
functions: this module is loaded by the agent, which must not hold a CUDA context or a
BLAS thread pool of its own.
"""

import importlib
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from gpu_share.protocol.benchmarks import CpuMeasurement, GpuMeasurement, Precision
from gpu_share.protocol.nodes import GpuInfo

Operation = Callable[[], object]

GPU_MATMUL_N = 8192  # 1.1 TFLOP per multiply: long enough to time, small enough for 16 GB
SMALL_GPU_MATMUL_N = 4096  # under 16 GB of memory
SMALL_GPU_MB = 16_000
CPU_MATMUL_N = 2048  # 17 GFLOP per multiply
BIG_CPU_MATMUL_N = 4096  # 16 cores and more: enough work for every core
MIN_CALLS = 3
MIN_WARM_UP_CALLS = 2
WARM_UP_SHARE = 0.25
MAX_CALLS = 100_000


class NoGpuBackend(Exception):
    """No way to run work on the GPU from this Python: a GPU figure would not be the GPU's."""


class Device(Protocol):
    name: str

    def matmul(self, precision: Precision, n: int) -> Operation | None:
        """An n×n multiply in `precision`; None where the device cannot do it."""

    def copy(self, nbytes: int) -> Operation:
        """Copy `nbytes` from one buffer to another on the device."""

    def synchronize(self) -> None: ...

    def close(self) -> None: ...


def rate(device: Device, operation: Operation, budget_sec: float) -> float:
    """Calls per second of `operation`, measured for about `budget_sec` after a warm-up of
    a quarter of that (clocks ramp up, caches and cuBLAS's choices settle)."""
    warm_until = time.perf_counter() + budget_sec * WARM_UP_SHARE
    one = 0.0
    warmed = 0
    while warmed < MIN_WARM_UP_CALLS or time.perf_counter() < warm_until:
        started = time.perf_counter()
        operation()
        device.synchronize()
        one = time.perf_counter() - started
        warmed += 1
    one = max(one, 1e-9)
    calls = max(MIN_CALLS, min(MAX_CALLS, int(budget_sec / one)))
    started = time.perf_counter()
    for _ in range(calls):
        operation()
    device.synchronize()
    return calls / max(time.perf_counter() - started, 1e-9)


def matmul_tflops(device: Device, precision: Precision, n: int, budget_sec: float) -> float | None:
    operation = device.matmul(precision, n)
    if operation is None:
        return None
    return rate(device, operation, budget_sec) * 2 * n**3 / 1e12


class TorchDevice:
    """One CUDA device through PyTorch; TF32 is switched on for the TF32 figure only."""

    def __init__(self, ordinal: int) -> None:
        torch = importlib.import_module("torch")
        if not torch.cuda.is_available() or ordinal >= torch.cuda.device_count():
            raise NoGpuBackend(f"PyTorch {torch.__version__} sees no CUDA device {ordinal}")
        self.torch: Any = torch
        self.device = torch.device("cuda", ordinal)
        torch.cuda.set_device(self.device)
        self.capability: tuple[int, int] = torch.cuda.get_device_capability(self.device)
        self.name = f"torch {torch.__version__}"

    def matmul(self, precision: Precision, n: int) -> Operation | None:
        torch = self.torch
        tensor_cores = self.capability >= (8, 0)  # Ampere: TF32 and BF16
        if precision in (Precision.BF16, Precision.TF32) and not tensor_cores:
            return None
        dtype = {
            Precision.FP32: torch.float32,
            Precision.TF32: torch.float32,
            Precision.FP16: torch.float16,
            Precision.BF16: torch.bfloat16,
        }[precision]
        a = torch.randn(n, n, device=self.device, dtype=dtype)
        b = torch.randn(n, n, device=self.device, dtype=dtype)
        out = torch.empty(n, n, device=self.device, dtype=dtype)
        mode = "high" if precision is Precision.TF32 else "highest"

        def multiply() -> object:
            torch.set_float32_matmul_precision(mode)
            return torch.matmul(a, b, out=out)

        return multiply

    def copy(self, nbytes: int) -> Operation:
        torch = self.torch
        source = torch.empty(nbytes, dtype=torch.uint8, device=self.device).fill_(1)
        target = torch.empty_like(source)
        return lambda: target.copy_(source)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self.torch.set_float32_matmul_precision("highest")
        self.torch.cuda.empty_cache()


class CupyDevice:
    """One CUDA device through CuPy (no bfloat16 there; TF32 through cuBLAS's compute type)."""

    COMPUTE_TYPE_DEFAULT = 1  # cupy._core._routines_linalg's values
    COMPUTE_TYPE_TF32 = 7

    def __init__(self, ordinal: int) -> None:
        cupy = importlib.import_module("cupy")
        if ordinal >= cupy.cuda.runtime.getDeviceCount():
            raise NoGpuBackend(f"CuPy {cupy.__version__} sees no CUDA device {ordinal}")
        self.cupy: Any = cupy
        self.device = cupy.cuda.Device(ordinal)
        self.device.use()
        self.capability = int(self.device.compute_capability)
        self.name = f"cupy {cupy.__version__}"

    def matmul(self, precision: Precision, n: int) -> Operation | None:
        cupy = self.cupy
        if precision is Precision.BF16 or (precision is Precision.TF32 and self.capability < 80):
            return None
        dtype = cupy.float16 if precision is Precision.FP16 else cupy.float32
        a = cupy.random.standard_normal((n, n), dtype=cupy.float32).astype(dtype)
        b = cupy.random.standard_normal((n, n), dtype=cupy.float32).astype(dtype)
        out = cupy.empty((n, n), dtype=dtype)
        compute = (
            self.COMPUTE_TYPE_TF32 if precision is Precision.TF32 else self.COMPUTE_TYPE_DEFAULT
        )
        linalg = importlib.import_module("cupy._core._routines_linalg")

        def multiply() -> object:
            linalg.set_compute_type(cupy.float32, compute)
            return cupy.matmul(a, b, out=out)

        return multiply

    def copy(self, nbytes: int) -> Operation:
        cupy = self.cupy
        source = cupy.ones(nbytes, dtype=cupy.uint8)
        target = cupy.empty_like(source)
        return lambda: cupy.copyto(target, source)

    def synchronize(self) -> None:
        self.device.synchronize()

    def close(self) -> None:
        linalg = importlib.import_module("cupy._core._routines_linalg")
        linalg.set_compute_type(self.cupy.float32, self.COMPUTE_TYPE_DEFAULT)
        self.cupy.get_default_memory_pool().free_all_blocks()


class NumpyDevice:
    """The CPU: float32 matrix multiply through numpy's BLAS, a copy through numpy."""

    def __init__(self) -> None:
        import numpy

        self.numpy: Any = numpy
        self.name = f"numpy {numpy.__version__}"

    def matmul(self, precision: Precision, n: int) -> Operation | None:
        if precision is not Precision.FP32:
            return None
        numpy = self.numpy
        generator = numpy.random.default_rng(0)
        a = generator.standard_normal((n, n), dtype=numpy.float32)
        b = generator.standard_normal((n, n), dtype=numpy.float32)
        out = numpy.empty((n, n), dtype=numpy.float32)
        return lambda: numpy.matmul(a, b, out=out)

    def copy(self, nbytes: int) -> Operation:
        numpy = self.numpy
        source = numpy.ones(nbytes, dtype=numpy.uint8)
        target = numpy.empty_like(source)
        return lambda: numpy.copyto(target, source)

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        pass


def gpu_backends(
    ordinal: int, compute_capability: str | None = None
) -> tuple[tuple[str, Callable[[], Device]], ...]:
    """The ways to the GPU at CUDA `ordinal`, in the order they are tried."""

    def onnxruntime() -> Device:
        from gpu_share.agent.benchmarks.ort_device import OrtDevice

        return OrtDevice.gpu(ordinal, compute_capability)

    return (
        ("onnxruntime", onnxruntime),
        ("PyTorch", lambda: TorchDevice(ordinal)),
        ("CuPy", lambda: CupyDevice(ordinal)),
    )


def open_gpu(ordinal: int, compute_capability: str | None = None) -> Device:
    """The GPU at CUDA `ordinal` through the first backend that reaches it; `NoGpuBackend`,
    saying why each did not, otherwise."""
    problems = []
    for name, open_backend in gpu_backends(ordinal, compute_capability):
        try:
            return open_backend()
        except Exception as exc:  # ImportError: not installed; the rest: cannot reach it
            problems.append(f"{name}: {exc}")
    raise NoGpuBackend("no backend could measure this GPU: " + "; ".join(problems))


def measure_gpu(gpu: GpuInfo, ordinal: int, budget_sec: float) -> GpuMeasurement:
    """Every precision the GPU has, then its memory bandwidth; what fails is said, not raised."""
    try:
        device = open_gpu(ordinal, gpu.compute_capability)
    except NoGpuBackend as exc:
        return GpuMeasurement(
            index=gpu.index, uuid=gpu.uuid, model=gpu.model, error=str(exc)[:1000]
        )
    return measure_gpu_on(device, gpu, budget_sec)


def measure_gpu_on(device: Device, gpu: GpuInfo, budget_sec: float) -> GpuMeasurement:
    """Each precision through `device`, then the memory copy; the device is closed after."""
    from gpu_share.agent.benchmarks import memory

    measurement = GpuMeasurement(
        index=gpu.index, uuid=gpu.uuid, model=gpu.model, backend=device.name
    )
    n = SMALL_GPU_MATMUL_N if gpu.vram_mb < SMALL_GPU_MB else GPU_MATMUL_N
    problems = []
    try:
        for precision in Precision:
            try:
                figure = matmul_tflops(device, precision, n, budget_sec)
                setattr(measurement, f"{precision.value}_tflops", figure)
            except Exception as exc:
                problems.append(f"{precision.value} matmul: {exc}")
            finally:
                device.close()  # the matrices go before the next ones are made
        try:
            measurement.memory_bandwidth_gbs = memory.copy_bandwidth_gbs(
                device, memory.gpu_copy_bytes(gpu.vram_mb), budget_sec
            )
        except Exception as exc:
            problems.append(f"memory copy: {exc}")
    finally:
        device.close()
    if problems:
        measurement.error = "; ".join(problems)[:1000]
    return measurement


def _cgroup_cpus() -> float | None:
    """The CPU quota of this process's cgroup in cores, where one is set (v2, then v1)."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def available_cores() -> int:
    """Physical cores this process may run on: its CPU affinity, the machine's physical
    cores and its cgroup's quota, whichever is least (hyperthreads do not double BLAS)."""
    import psutil

    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    count = count or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False)
    if physical:
        count = min(count, physical)
    quota = _cgroup_cpus()
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def open_cpu(cores: int) -> Device:
    """onnxruntime's CPU provider on `cores` threads where onnxruntime is installed (the
    agent's ONNX runtime), else numpy."""
    try:
        from gpu_share.agent.benchmarks.ort_device import OrtDevice

        return OrtDevice.cpu(cores)
    except ImportError:
        return NumpyDevice()


def measure_cpu(budget_sec: float, cores: int | None = None) -> CpuMeasurement:
    """A float32 multiply over the cores, and one core's memory copy."""
    cores = cores or available_cores()
    return measure_cpu_on(open_cpu(cores), cores, budget_sec)


def measure_cpu_on(device: Device, cores: int, budget_sec: float) -> CpuMeasurement:
    """The CPU through `device`, which is closed after."""
    from gpu_share.agent.benchmarks import memory

    n = BIG_CPU_MATMUL_N if cores >= 16 else CPU_MATMUL_N
    try:
        tflops = matmul_tflops(device, Precision.FP32, n, budget_sec)
        device.close()  # the matrices and the multiply's threads go before the copy
        bandwidth = memory.copy_bandwidth_gbs(device, memory.cpu_copy_bytes(), budget_sec)
    finally:
        device.close()
    return CpuMeasurement(
        cores=cores,
        backend=device.name,
        matmul_gflops=None if tflops is None else tflops * 1000,
        memory_bandwidth_gbs=bandwidth,
    )
