"""GPU discovery and telemetry through NVML (`nvidia-ml-py`).

No NVML library, no driver or no GPU all mean the same thing to the rest of the
agent: an empty GPU list, and the node registers as a CPU node.
"""

import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psutil

from gpu_share.protocol.nodes import GpuInfo, GpuTelemetry, Telemetry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gpu:
    info: GpuInfo
    minor_number: int | None  # /dev/nvidia<N>, for sandboxes that bind device nodes


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(raw: int) -> str:
    return f"{raw // 1000}.{raw % 1000 // 10}"


class Nvml:
    """A handle on NVML; `available` is False wherever NVML cannot be used."""

    def __init__(self, module: ModuleType | None = None) -> None:
        self.available = False
        self._nvml: Any = module
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
            self.available = True
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver errors
            log.info("NVML unavailable (%s): this is a CPU node", exc)

    def discover(self) -> list[Gpu]:
        if not self.available:
            return []
        nvml = self._nvml
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            cuda = _cuda_version(nvml.nvmlSystemGetCudaDriverVersion_v2())
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:
            log.warning("NVML could not list GPUs (%s): registering as a CPU node", exc)
            return []
        gpus = []
        for index in range(count):
            try:
                gpus.append(self._describe(index, driver, cuda))
            except Exception as exc:
                log.warning("GPU %d is not usable (%s); leaving it out", index, exc)
        return gpus

    def _describe(self, index: int, driver: str, cuda: str) -> Gpu:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            capability: str | None = f"{major}.{minor}"
        except Exception:
            capability = None
        try:
            minor_number: int | None = int(nvml.nvmlDeviceGetMinorNumber(handle))
        except Exception:
            minor_number = None
        info = GpuInfo(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            model=_text(nvml.nvmlDeviceGetName(handle)),
            vram_mb=int(memory.total // (1024 * 1024)),
            driver_version=driver,
            cuda_version=cuda,
            pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
            compute_capability=capability,
        )
        return Gpu(info=info, minor_number=minor_number)

    def gpu_telemetry(self, gpus: list[Gpu]) -> list[GpuTelemetry]:
        if not self.available:
            return []
        nvml = self._nvml
        readings = []
        for gpu in gpus:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(gpu.info.uuid)
            except Exception as exc:
                log.debug("no telemetry for GPU %s: %s", gpu.info.uuid, exc)
                continue
            readings.append(
                GpuTelemetry(
                    index=gpu.info.index,
                    utilization_pct=_try(
                        lambda h=handle: nvml.nvmlDeviceGetUtilizationRates(h).gpu
                    ),
                    memory_used_mb=_try(
                        lambda h=handle: nvml.nvmlDeviceGetMemoryInfo(h).used // (1024 * 1024)
                    ),
                    temperature_c=_try(
                        lambda h=handle: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
                    ),
                    power_w=_try(lambda h=handle: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
                    sm_clock_mhz=_try(
                        lambda h=handle: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)
                    ),
                    mem_clock_mhz=_try(
                        lambda h=handle: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)
                    ),
                )
            )
        return readings

    def process_gpu_memory(self, gpus: list[Gpu], pids: set[int]) -> int | None:
        """Bytes of GPU memory the given processes hold now, summed over `gpus`."""
        if not self.available or not gpus or not pids:
            return None
        nvml = self._nvml
        total = 0
        for gpu in gpus:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(gpu.info.uuid)
                for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if proc.pid in pids and proc.usedGpuMemory:
                        total += int(proc.usedGpuMemory)
            except Exception as exc:
                log.debug("no process memory for GPU %s: %s", gpu.info.uuid, exc)
        return total

    def shutdown(self) -> None:
        if self.available:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                log.debug("nvmlShutdown failed", exc_info=True)
            self.available = False


def _try(read: Any) -> Any:
    try:
        return read()
    except Exception:
        return None


def telemetry(nvml: Nvml, gpus: list[Gpu]) -> Telemetry:
    memory = psutil.virtual_memory()
    return Telemetry(
        cpu_pct=psutil.cpu_percent(interval=None),
        ram_used_mb=int((memory.total - memory.available) // (1024 * 1024)),
        gpus=nvml.gpu_telemetry(gpus),
    )
