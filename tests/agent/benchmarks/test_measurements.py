"""The node's own measurements, for real on this machine's CPU and disk; there is no GPU
here, so a GPU is measured through the same probe interface by a stand-in."""

import asyncio
import sys
from pathlib import Path

import psutil
import pytest

from gpu_share.agent.benchmarks import compute, storage
from gpu_share.agent.benchmarks.local import InChildProcess, LocalJob, measure_local
from gpu_share.protocol.benchmarks import GpuMeasurement, Precision, StorageMeasurement
from gpu_share.protocol.nodes import GpuInfo

MiB = 1024 * 1024
NO_SUCH_GPU = GpuInfo(
    index=0,
    uuid="GPU-00000000-dead-beef-0000-000000000000",
    model="NVIDIA H100 80GB HBM3",
    vram_mb=81559,
)


def test_storage_is_written_synced_read_back_and_removed(tmp_path: Path) -> None:
    measured = storage.measure_storage(tmp_path / "scratch", 4 * MiB)
    assert measured.write_mbps is not None and measured.write_mbps > 0
    assert measured.read_mbps is not None and measured.read_mbps > 0
    assert list((tmp_path / "scratch").iterdir()) == []


def test_the_cpu_is_measured_with_onnxruntime_over_its_cores() -> None:
    measured = compute.measure_cpu(0.05)
    assert 1 <= measured.cores <= (psutil.cpu_count() or 1)
    assert measured.backend is not None and measured.backend.startswith("onnxruntime ")
    assert measured.matmul_gflops is not None and measured.matmul_gflops > 0
    assert measured.memory_bandwidth_gbs is not None and measured.memory_bandwidth_gbs > 0


def test_the_cpu_is_measured_with_numpy_where_onnxruntime_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime: ImportError
    measured = compute.measure_cpu(0.05, cores=1)
    assert measured.backend is not None and measured.backend.startswith("numpy ")
    assert measured.matmul_gflops is not None and measured.matmul_gflops > 0
    assert measured.memory_bandwidth_gbs is not None and measured.memory_bandwidth_gbs > 0


class RecordingDevice:
    """A device whose work is queued until `synchronize`, as a GPU's is."""

    name = "recording"

    def __init__(self) -> None:
        self.queued = 0
        self.done = 0
        self.events: list[str] = []

    def matmul(self, precision: Precision, n: int) -> compute.Operation | None:
        return self.enqueue if precision is Precision.FP32 else None

    def copy(self, nbytes: int) -> compute.Operation:
        return self.enqueue

    def enqueue(self) -> None:
        self.queued += 1
        self.events.append("call")

    def synchronize(self) -> None:
        self.done = self.queued
        self.events.append("sync")

    def close(self) -> None:
        pass


def test_timing_waits_for_the_device_before_the_clock_stops() -> None:
    device = RecordingDevice()
    assert compute.matmul_tflops(device, Precision.FP32, 64, 0.01) is not None
    assert device.events[:4] == ["call", "sync", "call", "sync"]  # each warm-up call is timed
    assert device.events[-1] == "sync" and device.done == device.queued
    assert compute.matmul_tflops(device, Precision.BF16, 64, 0.01) is None


def test_a_part_that_fails_is_an_error_line_and_the_rest_is_measured(tmp_path: Path) -> None:
    def broken_gpu(gpu: GpuInfo, ordinal: int, budget: float) -> GpuMeasurement:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def broken_disk(directory: Path, size: int) -> StorageMeasurement:
        raise OSError(28, "No space left on device")

    results = measure_local(
        LocalJob(gpus=[NO_SUCH_GPU], scratch_dir=tmp_path, budget_sec=0.05),
        gpu_probe=broken_gpu,
        storage_probe=broken_disk,
    )
    assert results.gpus[0].uuid == NO_SUCH_GPU.uuid and results.gpus[0].fp16_tflops is None
    assert "illegal memory access" in (results.gpus[0].error or "")
    assert results.cpu is not None and results.cpu.matmul_gflops
    assert results.errors == ["storage: OSError: [Errno 28] No space left on device"]


async def test_the_child_process_measures_the_machine_and_says_why_a_gpu_was_not(
    tmp_path: Path,
) -> None:
    job = LocalJob(gpus=[NO_SUCH_GPU], scratch_dir=tmp_path, budget_sec=0.05, storage_bytes=4 * MiB)
    results = await InChildProcess().measure(job)
    gpu = results.gpus[0]
    assert gpu.uuid == NO_SUCH_GPU.uuid and gpu.fp32_tflops is None
    # Here onnxruntime is a CPU build and neither PyTorch nor CuPy is installed; on a GPU
    # machine the UUID matches no device, so onnxruntime falls back to the CPU and says so.
    assert gpu.backend is None and gpu.error and "no backend could measure" in gpu.error
    assert "onnxruntime: onnxruntime" in gpu.error and "PyTorch: " in gpu.error
    assert results.cpu is not None and results.cpu.matmul_gflops
    assert results.storage is not None and results.storage.write_mbps
    assert list(tmp_path.iterdir()) == []


async def test_cancelling_a_measurement_kills_its_child_process(tmp_path: Path) -> None:
    me = psutil.Process()
    job = LocalJob(scratch_dir=tmp_path, budget_sec=60.0, storage_bytes=4 * MiB)
    measuring = asyncio.create_task(InChildProcess().measure(job))
    while not me.children():
        await asyncio.sleep(0.05)
    child = me.children()[0]
    measuring.cancel()
    with pytest.raises(asyncio.CancelledError):
        await measuring
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert me.children() == []
