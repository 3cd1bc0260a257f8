"""GPU topology from NVML: NVLink pairs (direct or through NVSwitches), PCIe paths, and
nothing at all where the driver lacks the calls.

NVML is played by stand-ins with pynvml's own function names, constants and return
shapes (as in test_gpu.py); the values are those of real machines' `nvidia-smi topo -m`.
"""

from types import SimpleNamespace
from typing import Any

import pynvml

from gpu_share.agent.gpu import Nvml
from gpu_share.protocol.nodes import GpuLink, GpuLinkKind
from tests.agent.test_gpu import FakeNvml, NVMLError

PCIE = {  # nvmlDeviceGetTopologyCommonAncestor levels of a two-socket, four-GPU host
    frozenset((0, 1)): pynvml.NVML_TOPOLOGY_SINGLE,
    frozenset((2, 3)): pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
}


class NvlinkNvml(FakeNvml):
    """A host whose GPUs have NVLink links to the given far ends (a GPU index or "switch")."""

    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_P2P_CAPS_INDEX_NVLINK = pynvml.NVML_P2P_CAPS_INDEX_NVLINK
    NVML_P2P_STATUS_OK = pynvml.NVML_P2P_STATUS_OK

    def __init__(self, count: int, links: dict[int, list[int | str]]) -> None:
        super().__init__(count=count)
        self.links = links

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes | str) -> int:
        return int(str(uuid).rsplit("-", 1)[1])

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        if link >= len(self.links.get(handle, [])):
            raise NVMLError("Invalid Argument")  # past the GPU's last link
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> Any:
        far = self.links[handle][link]
        bus = "0000:c5:00.0" if far == "switch" else f"0000:{int(far) + 1:02x}:00.0"
        return SimpleNamespace(busId=bus.encode())  # 4-digit domain: NVML's NVLink spelling

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:
        far = self.links[handle][link]
        return int(
            pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
            if far == "switch"
            else pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
        )

    def nvmlDeviceGetTopologyCommonAncestor(self, first: int, second: int) -> int:
        return int(PCIE.get(frozenset((first, second)), pynvml.NVML_TOPOLOGY_SYSTEM))


def topology_of(fake: FakeNvml) -> list[GpuLink] | None:
    nvml = Nvml(fake)  # type: ignore[arg-type]
    topology = nvml.topology(nvml.discover())
    return None if topology is None else topology.links


def test_direct_nvlink_pairs_are_counted_and_the_rest_named_by_their_pcie_path() -> None:
    # 0-1 and 2-3 are NVLink bridges of four links each, as on a pair of bridged cards.
    links = topology_of(NvlinkNvml(4, {0: [1] * 4, 1: [0] * 4, 2: [3] * 4, 3: [2] * 4}))
    assert links == [
        GpuLink(a=0, b=1, kind=GpuLinkKind.NVLINK, nvlinks=4),
        GpuLink(a=0, b=2, kind=GpuLinkKind.SYSTEM),
        GpuLink(a=0, b=3, kind=GpuLinkKind.SYSTEM),
        GpuLink(a=1, b=2, kind=GpuLinkKind.SYSTEM),
        GpuLink(a=1, b=3, kind=GpuLinkKind.SYSTEM),
        GpuLink(a=2, b=3, kind=GpuLinkKind.NVLINK, nvlinks=4),
    ]


def test_gpus_on_nvswitches_are_each_linked_to_every_other_on_all_their_links() -> None:
    links = topology_of(NvlinkNvml(4, {gpu: ["switch"] * 18 for gpu in range(4)}))
    assert links is not None and len(links) == 6
    assert {(link.kind, link.nvlinks) for link in links} == {(GpuLinkKind.NVLINK, 18)}


def test_without_nvlink_the_pcie_paths_are_reported() -> None:
    links = topology_of(NvlinkNvml(4, {}))
    assert links is not None
    kinds = {(link.a, link.b): link.kind for link in links}
    assert kinds[(0, 1)] is GpuLinkKind.PCIE_SWITCH
    assert kinds[(2, 3)] is GpuLinkKind.HOST_BRIDGE
    assert kinds[(0, 3)] is GpuLinkKind.SYSTEM
    assert not any(link.nvlinks for link in links)


def test_a_driver_that_only_answers_p2p_status_still_shows_nvlink() -> None:
    class P2pOnly(FakeNvml):
        def nvmlDeviceGetP2PStatus(self, first: int, second: int, index: int) -> int:
            assert index == pynvml.NVML_P2P_CAPS_INDEX_NVLINK
            return int(pynvml.NVML_P2P_STATUS_OK)

    links = topology_of(P2pOnly(count=2))
    assert links == [GpuLink(a=0, b=1, kind=GpuLinkKind.NVLINK, nvlinks=1)]


def test_an_nvml_without_the_topology_calls_gives_no_topology() -> None:
    class NotSupported(FakeNvml):
        def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
            raise NVMLError("Not Supported")

        def nvmlDeviceGetTopologyCommonAncestor(self, first: int, second: int) -> int:
            raise NVMLError("Function Not Found")

    assert topology_of(FakeNvml(count=4)) is None  # the calls do not even exist
    assert topology_of(NotSupported(count=4)) is None


def test_one_gpu_or_no_nvml_has_no_topology() -> None:
    assert topology_of(NvlinkNvml(1, {})) is None

    class Missing:
        def nvmlInit(self) -> None:
            raise NVMLError("NVML Shared Library Not Found")

    nvml = Nvml(Missing())  # type: ignore[arg-type]
    assert nvml.topology([]) is None
