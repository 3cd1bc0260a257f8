"""NVML discovery and honest runtime advertising.

There is no GPU here, so NVML is played by a stand-in module with pynvml's own
function names and return shapes; the CUDA probes run for real and must fail.
"""

from types import SimpleNamespace
from typing import Any

import pytest

from gpu_share.agent.capabilities import detect_runtimes
from gpu_share.agent.gpu import Nvml, telemetry
from gpu_share.protocol.runtimes import RuntimeName


class NVMLError(Exception):
    pass


class FakeNvml:
    """pynvml's calls as the agent uses them, answering like a 2 × H100 host."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2

    def __init__(self, count: int = 2, broken: set[int] | None = None) -> None:
        self.count = count
        self.broken = broken or set()
        self.shut = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index in self.broken:
            raise NVMLError("GPU is lost")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes | str) -> int:
        return int(str(uuid)[-1])

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(total=85520809984, used=1024 * 1024 * 512 * (handle + 1), free=0)

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-1111-2222-3333-00000000000{handle}"

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        return SimpleNamespace(busId=f"00000000:{handle + 1:02x}:00.0".encode())

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=37, memory=12)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 54

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return 312_500  # milliwatts

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        raise NVMLError("not supported on this GPU")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [SimpleNamespace(pid=4242, usedGpuMemory=2 * 1024**3)]


def test_discovery_reads_model_memory_driver_cuda_and_uuid() -> None:
    gpus = Nvml(FakeNvml()).discover()  # type: ignore[arg-type]
    assert [g.info.index for g in gpus] == [0, 1]
    first = gpus[0].info
    assert first.model == "NVIDIA H100 80GB HBM3"
    assert first.vram_mb == 81559
    assert (first.driver_version, first.cuda_version) == ("550.54.15", "12.4")
    assert first.uuid == "GPU-1111-2222-3333-000000000000"
    assert first.pci_bus_id == "00000000:01:00.0"
    assert first.compute_capability == "9.0"
    assert gpus[1].minor_number == 1


def test_a_broken_gpu_is_left_out_and_the_rest_still_register() -> None:
    gpus = Nvml(FakeNvml(broken={0})).discover()  # type: ignore[arg-type]
    assert [g.info.index for g in gpus] == [1]


def test_telemetry_reports_what_nvml_answers_and_skips_what_it_cannot() -> None:
    nvml = Nvml(FakeNvml())  # type: ignore[arg-type]
    gpus = nvml.discover()
    reading = telemetry(nvml, gpus)
    assert reading.ram_used_mb is not None and reading.cpu_pct is not None
    first = reading.gpus[0]
    assert (first.utilization_pct, first.temperature_c, first.power_w) == (37, 54, 312.5)
    assert first.memory_used_mb == 512
    assert first.sm_clock_mhz is None  # this GPU refused the clock query
    assert nvml.process_gpu_memory(gpus, {4242}) == 2 * 2 * 1024**3
    assert nvml.process_gpu_memory(gpus, {1}) == 0


def test_without_nvml_the_node_is_a_cpu_node() -> None:
    class Missing:
        def nvmlInit(self) -> None:
            raise NVMLError("NVML Shared Library Not Found")

    nvml = Nvml(Missing())  # type: ignore[arg-type]
    assert not nvml.available
    assert nvml.discover() == []
    assert telemetry(nvml, []).gpus == []


def test_cuda_runtimes_are_not_advertised_without_a_working_cuda_device() -> None:
    """The probes really run: this machine's onnxruntime has no CUDA provider and
    CatBoost sees no CUDA device, so even a node whose NVML lists a GPU must not
    claim `*_cuda`."""
    fake = Nvml(FakeNvml(count=1)).discover()  # type: ignore[arg-type]
    runtimes = detect_runtimes(fake)
    assert RuntimeName.ONNX_CPU in runtimes and RuntimeName.CATBOOST_CPU in runtimes
    assert RuntimeName.ONNX_CUDA not in runtimes
    assert RuntimeName.CATBOOST_CUDA not in runtimes


def test_a_cpu_node_does_not_even_probe_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_share.agent import capabilities

    probed: list[str] = []

    def record(code: str, name: str, timeout: float = 120.0) -> bool:
        probed.append(name)
        return True

    monkeypatch.setattr(capabilities, "probe", record)
    assert RuntimeName.ONNX_CUDA not in detect_runtimes([])
    assert probed == []
