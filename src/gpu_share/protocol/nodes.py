"""Nodes and their GPUs as tenants see them, and what agents report about them."""

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

from gpu_share.protocol.reliability import Reliability
from gpu_share.protocol.runtimes import RuntimeName

MAX_GPUS = 64  # per node
MAX_MB = 1 << 30  # a petabyte, in MB: more memory than any machine has


class NodeStatus(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"
    BUSY = "busy"
    DELISTED = "delisted"


class SandboxKind(StrEnum):
    """How a node isolates jobs: a container, a bubblewrap sandbox, or not at all."""

    DOCKER = "docker"
    BWRAP = "bwrap"
    PROCESS = "process"  # plain processes: only for a provider's own trusted work

    @property
    def isolates(self) -> bool:
        return self is not SandboxKind.PROCESS


class Tier(StrEnum):
    ENTERPRISE = "enterprise"
    COMMUNITY = "community"


class GpuInfo(BaseModel):
    """One GPU as NVML describes it."""

    index: int = Field(ge=0, le=MAX_GPUS)
    uuid: str = Field(max_length=100)
    model: str = Field(max_length=200)
    vram_mb: int = Field(ge=0, le=MAX_MB)
    driver_version: str | None = Field(default=None, max_length=50)
    cuda_version: str | None = Field(default=None, max_length=20)
    pci_bus_id: str | None = Field(default=None, max_length=50)
    compute_capability: str | None = Field(default=None, max_length=10)


class GpuLinkKind(StrEnum):
    """How two GPUs of a node reach each other, fastest first (`nvidia-smi topo -m`)."""

    NVLINK = "nvlink"  # NV#: NVLink, directly or through NVSwitches
    BOARD = "board"  # on one multi-GPU board
    PCIE_SWITCH = "pcie_switch"  # PIX: through one PCIe switch
    PCIE_SWITCHES = "pcie_switches"  # PXB: through several PCIe switches
    HOST_BRIDGE = "host_bridge"  # PHB: through the CPU's PCIe host bridge
    NUMA_NODE = "numa_node"  # NODE: between host bridges of one NUMA node
    SYSTEM = "system"  # SYS: across CPU sockets


class GpuLink(BaseModel):
    """The link between two GPUs of one node, by their NVML `index`."""

    a: int = Field(ge=0, le=MAX_GPUS)
    b: int = Field(ge=0, le=MAX_GPUS)
    kind: GpuLinkKind
    nvlinks: int = Field(default=0, ge=0, le=64, description="Active NVLink links between them")


class GpuTopology(BaseModel):
    """How a node's GPUs are linked, as NVML says; a pair NVML cannot describe is left out."""

    links: list[GpuLink] = Field(default_factory=list, max_length=MAX_GPUS * (MAX_GPUS - 1) // 2)

    @property
    def nvlink(self) -> bool:
        return any(link.kind is GpuLinkKind.NVLINK for link in self.links)


class GpuTelemetry(BaseModel):
    index: int = Field(ge=0, le=MAX_GPUS)
    utilization_pct: float | None = Field(default=None, ge=0, le=100, allow_inf_nan=False)
    memory_used_mb: int | None = Field(default=None, ge=0, le=MAX_MB)
    temperature_c: float | None = Field(default=None, ge=-100, le=300, allow_inf_nan=False)
    power_w: float | None = Field(default=None, ge=0, le=100_000, allow_inf_nan=False)
    sm_clock_mhz: int | None = Field(default=None, ge=0, le=100_000)
    mem_clock_mhz: int | None = Field(default=None, ge=0, le=100_000)


class Telemetry(BaseModel):
    cpu_pct: float | None = Field(default=None, ge=0, le=100 * 4096, allow_inf_nan=False)
    ram_used_mb: int | None = Field(default=None, ge=0, le=MAX_MB)
    gpus: list[GpuTelemetry] = Field(default_factory=list, max_length=MAX_GPUS)


class TelemetrySample(Telemetry):
    at: datetime


class NodeGpu(BaseModel):
    model: str
    vram_mb: int
    driver_version: str | None
    cuda_version: str | None
    benchmark_score: float | None = Field(
        default=None, description="Fraction of the model's reference figures; set by benchmarks"
    )
    listed: bool = Field(default=True, description="False while its latest benchmark failed")
    verified: bool = Field(
        default=False,
        description="A hardware challenge proved it is the model it claims (docs/trust.md); "
        "until then work naming a model or VRAM, and reservations, do not get it",
    )
    verified_at: datetime | None = Field(
        default=None, description="When its latest challenge passed; null: not verified"
    )


# What tenants see of a node's proven hardware and its spot checks (docs/trust.md).
VERIFIED = (
    "All of its hardware is proven by hardware challenges (every GPU as its model, a CPU "
    "node's cores); `require_verified` keeps work on such nodes"
)
VERIFIED_AT = "Since when all of it has stood proven (its oldest proof); null: not verified"
SPOT_CHECK_RATE = (
    "The share of its jobs re-run on a trusted node and compared, 0..1; null: none set yet"
)


class Node(BaseModel):
    """A node as tenants see it (`GET /v1/nodes`)."""

    id: str
    label: str | None = Field(
        default=None,
        description="What its provider calls the machine (1–64 characters); null: not named",
    )
    status: NodeStatus
    gpus: list[NodeGpu]
    runtimes: list[RuntimeName]
    region: str | None
    tier: Tier
    cpu_count: int | None
    ram_mb: int | None
    price_per_gpu_hour: str | None = Field(
        description="USDC per GPU-hour as a decimal string; null while the provider has set none"
    )
    reliability_score: float | None = Field(
        description="0..1; null until the node has a history to score"
    )
    reliability: Reliability | None = Field(
        default=None,
        description="The score's components and their evidence (docs/reliability.md)",
    )
    available_now: bool = Field(
        default=True, description="Inside the provider's declared availability windows now"
    )
    running_jobs: int
    max_concurrent_jobs: int
    sandbox: SandboxKind = Field(description="How the node isolates jobs")
    isolated: bool = Field(
        description="False for a node that runs jobs as plain processes (its provider opted "
        "in); `isolated_only` keeps work off such nodes"
    )
    last_seen_at: datetime | None
    verified: bool = Field(default=False, description=VERIFIED)
    verified_at: datetime | None = Field(default=None, description=VERIFIED_AT)
    spot_check_rate: float | None = Field(default=None, description=SPOT_CHECK_RATE)


class RuntimeAvailability(BaseModel):
    name: RuntimeName
    kind: str = Field(description="inference or train")
    device: str = Field(description="cuda or cpu")
    nodes_online: int
