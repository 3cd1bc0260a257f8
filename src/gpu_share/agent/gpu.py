"""GPU discovery and telemetry through NVML (`nvidia-ml-py`).

No NVML library, no driver or no GPU all mean the same thing to the rest of the
agent: an empty GPU list, and the node registers as a CPU node.
"""

import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psutil

from gpu_share.protocol.nodes import (
    GpuInfo,
    GpuLink,
    GpuLinkKind,
    GpuTelemetry,
    GpuTopology,
    Telemetry,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gpu:
    info: GpuInfo
    minor_number: int | None  # /dev/nvidia<N>, for sandboxes that bind device nodes


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(raw: int) -> str:
    return f"{raw // 1000}.{raw % 1000 // 10}"


# nvmlDeviceGetTopologyCommonAncestor's levels (NVML_TOPOLOGY_*), named as in `nvidia-smi topo -m`.
_PCIE_LEVELS = {
    0: GpuLinkKind.BOARD,  # INTERNAL
    10: GpuLinkKind.PCIE_SWITCH,  # SINGLE (PIX)
    20: GpuLinkKind.PCIE_SWITCHES,  # MULTIPLE (PXB)
    30: GpuLinkKind.HOST_BRIDGE,  # HOSTBRIDGE (PHB)
    40: GpuLinkKind.NUMA_NODE,  # NODE (NODE)
    50: GpuLinkKind.SYSTEM,  # SYSTEM (SYS)
}
_NVLINK_DEVICE_TYPE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH


def _bus_id(value: Any) -> str:
    """A PCI bus id in one spelling: NVML pads the domain to 8 digits in some calls, 4 in others."""
    text = _text(value).strip().lower()
    try:
        domain, bus, slot = text.split(":")
        return f"{int(domain, 16):04x}:{bus}:{slot}"
    except ValueError:
        return text


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

    def topology(self, gpus: list[Gpu]) -> GpuTopology | None:
        """How each pair of GPUs is linked: NVLink (directly or through NVSwitches, with the
        number of links) or the PCIe path between them.

        Older drivers and GPUs without NVLink lack some of these calls; a pair NVML cannot
        describe is left out, and a node it can say nothing about has no topology (None).
        """
        if not self.available or len(gpus) < 2:
            return None
        nvml = self._nvml
        handles: dict[int, Any] = {}
        for gpu in gpus:
            try:
                handles[gpu.info.index] = nvml.nvmlDeviceGetHandleByUUID(gpu.info.uuid)
            except Exception as exc:
                log.debug("no topology for GPU %s: %s", gpu.info.uuid, exc)
        by_bus = {
            _bus_id(gpu.info.pci_bus_id): gpu.info.index
            for gpu in gpus
            if gpu.info.pci_bus_id and gpu.info.index in handles
        }
        direct: dict[tuple[int, int], int] = {}
        to_switches: dict[int, int] = {}
        for index, handle in handles.items():
            for peer, count in self._nvlink_peers(handle, by_bus).items():
                if peer is None:
                    to_switches[index] = to_switches.get(index, 0) + count
                elif peer != index:
                    pair = (min(index, peer), max(index, peer))
                    direct[pair] = max(direct.get(pair, 0), count)
        links = []
        indices = sorted(handles)
        for n, a in enumerate(indices):
            for b in indices[n + 1 :]:
                # Through NVSwitches every GPU reaches every other one on all its links.
                nvlinks = direct.get((a, b), 0) or min(to_switches.get(a, 0), to_switches.get(b, 0))
                if nvlinks == 0 and self._p2p_over_nvlink(handles[a], handles[b]):
                    nvlinks = 1  # NVML says NVLink connects them, not how many links
                kind = GpuLinkKind.NVLINK if nvlinks else self._pcie_path(handles[a], handles[b])
                if kind is not None:
                    links.append(GpuLink(a=a, b=b, kind=kind, nvlinks=nvlinks))
        return GpuTopology(links=links) if links else None

    def _nvlink_peers(self, handle: Any, by_bus: dict[str, int]) -> dict[int | None, int]:
        """Active NVLink links of one GPU by the GPU at their far end (None: an NVSwitch)."""
        nvml = self._nvml
        enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
        peers: dict[int | None, int] = {}
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != enabled:
                    continue
                remote = _bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except Exception as exc:  # no such link, no NVLink here, or a driver without the call
                log.debug("NVLink %d: %s", link, exc)
                continue
            peer = by_bus.get(remote)
            if peer is None and not self._to_switch(handle, link):
                continue  # another kind of device (a CPU's NPU): not a GPU-to-GPU path
            peers[peer] = peers.get(peer, 0) + 1
        return peers

    def _to_switch(self, handle: Any, link: int) -> bool:
        try:
            kind = self._nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except Exception:  # drivers before 460 lack the call: a non-GPU far end is a switch
            return True
        return bool(kind == _NVLINK_DEVICE_TYPE_SWITCH)

    def _p2p_over_nvlink(self, first: Any, second: Any) -> bool:
        nvml = self._nvml
        try:
            status = nvml.nvmlDeviceGetP2PStatus(
                first, second, getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2)
            )
        except Exception:
            return False
        return bool(status == getattr(nvml, "NVML_P2P_STATUS_OK", 0))

    def _pcie_path(self, first: Any, second: Any) -> GpuLinkKind | None:
        try:
            level = self._nvml.nvmlDeviceGetTopologyCommonAncestor(first, second)
        except Exception:
            return None
        return _PCIE_LEVELS.get(int(level))

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
