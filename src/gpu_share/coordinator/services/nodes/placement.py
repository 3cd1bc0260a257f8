"""Which nodes may run which job (SPEC §4.1, §3.8): pure functions of node, requirements
and time.

A node serves a job when it has the runtime, is listed (not delisted by an admin or a
failed benchmark, not quarantined), is inside its availability window, has enough listed
GPUs of the model, memory and CUDA version asked for, and meets the region, tier,
isolation, price and reliability asked for. Busy or not: whether it is free is the
lease's business.

Proven hardware (docs/trust.md) is one rule, here: a GPU is *verified* when a hardware
challenge proved it is the catalog model it claims to be now (`gpu_verified`), a node
when all of its hardware is (`node_verified`). Work that names a GPU model or a minimum
VRAM, and every reservation, counts only verified GPUs: nobody rents a GPU as an H100
until it has shown it is one. `require_verified` keeps work off nodes that are not
verified; unnamed work may still run on unverified GPUs.
"""

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol

from pydantic import ValidationError

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.coordinator.services.nodes.schedules import availability_of
from gpu_share.protocol.money import MICRO, usdc_text
from gpu_share.protocol.nodes import NodeStatus, SandboxKind, Tier
from gpu_share.protocol.reliability import Reliability
from gpu_share.protocol.runtimes import RuntimeName


class Placeable(Protocol):
    """An invoke as placement reads it: an `InvokeRow`, or the claim's driver row."""

    @property
    def runtime(self) -> str: ...
    @property
    def gpus(self) -> int: ...
    @property
    def constraints(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Requirements:
    runtime: RuntimeName
    gpus: int = 1
    min_vram_mb: int | None = None
    gpu_model: str | None = None
    region: str | None = None
    tier: str | None = None
    max_price_micro: int | None = None
    isolated_only: bool = False
    min_reliability: float | None = None
    require_verified: bool = False  # the node's hardware proven, all of it
    # Count only verified GPUs: None decides by the request (`verified_gpus_only`); True
    # for a reservation, which rents GPUs as what they are; False for offers shown with
    # their unverified hardware (marked so).
    verified_gpus: bool | None = None

    @property
    def verified_gpus_only(self) -> bool:
        """Whether a GPU counts only once verified: work naming a model or a memory size
        rents the GPU as that, so it must be proven (module doc)."""
        if self.verified_gpus is not None:
            return self.verified_gpus
        return bool(self.gpu_model or self.min_vram_mb or self.require_verified)

    def describe(self) -> str:
        parts = [f"runtime {self.runtime.value}"]
        if self.runtime.needs_gpu and self.gpus > 1:
            parts.append(f"{self.gpus} GPUs")
        if self.gpu_model:
            parts.append(f"gpu_model {self.gpu_model!r}")
        if self.min_vram_mb:
            parts.append(f"min_vram_gb {self.min_vram_mb * 1024**2 / 1000**3:.3g}")
        if self.region:
            parts.append(f"region {self.region!r}")
        if self.tier:
            parts.append(f"tier {self.tier}")
        if self.max_price_micro is not None:
            parts.append(f"max_price_per_gpu_hour {usdc_text(self.max_price_micro)}")
        if self.isolated_only:
            parts.append("isolated_only")
        if self.min_reliability is not None:
            parts.append(f"min_reliability {self.min_reliability:g}")
        if self.require_verified:
            parts.append("require_verified")
        return ", ".join(parts)

    def constraints(self) -> dict[str, Any]:
        return {
            "min_vram_mb": self.min_vram_mb,
            "gpu_model": self.gpu_model,
            "region": self.region,
            "tier": self.tier,
            "max_price_micro": self.max_price_micro,
            "isolated_only": self.isolated_only,
            "min_reliability": self.min_reliability,
            "require_verified": self.require_verified,
        }

    @classmethod
    def of(cls, invoke: "Placeable") -> "Requirements":
        return cls.from_parts(invoke.runtime, invoke.gpus, invoke.constraints)

    @classmethod
    def from_parts(cls, runtime: str, gpus: int, c: dict[str, Any]) -> "Requirements":
        return cls(
            runtime=RuntimeName(runtime),
            gpus=gpus,
            min_vram_mb=c.get("min_vram_mb"),
            gpu_model=c.get("gpu_model"),
            region=c.get("region"),
            tier=c.get("tier"),
            max_price_micro=c.get("max_price_micro"),
            isolated_only=bool(c.get("isolated_only")),
            min_reliability=c.get("min_reliability"),
            require_verified=bool(c.get("require_verified")),
        )


class PlacementRequest(Protocol):
    """The placement options an invoke and a session share (SPEC §1.5 extensions)."""

    runtime: RuntimeName
    min_vram_gb: float | None
    gpu_model: str | None
    region: str | None
    tier: Tier | None
    max_price_per_gpu_hour: Decimal | None
    isolated_only: bool
    min_reliability: float | None
    require_verified: bool


def requirements_of(body: PlacementRequest, gpus: int = 1) -> Requirements:
    price = body.max_price_per_gpu_hour
    return Requirements(
        runtime=body.runtime,
        gpus=gpus,
        # Decimal GB, as cards are sold: an "80GB" H100 reports 81559 MiB.
        min_vram_mb=int(body.min_vram_gb * 1000**3 / 1024**2) if body.min_vram_gb else None,
        gpu_model=body.gpu_model,
        region=body.region,
        tier=body.tier.value if body.tier else None,
        isolated_only=body.isolated_only,
        max_price_micro=int(price * MICRO) if price is not None else None,
        min_reliability=body.min_reliability,
        require_verified=body.require_verified,
    )


def in_window(node: NodeRow, now: datetime) -> bool:
    """Inside the provider's declared weekly windows (24/7 when none are declared)."""
    return availability_of(node).open_at(now)


class Hardware(Protocol):
    """What listing and proofs read of a node: a `NodeRow`, or only those columns (a
    scrape weighing every online node, `platform.metrics`)."""

    @property
    def delisted(self) -> bool: ...
    @property
    def quarantined_at(self) -> datetime | None: ...
    @property
    def benchmark_state(self) -> dict[str, Any] | None: ...
    @property
    def verification(self) -> dict[str, Any] | None: ...
    @property
    def gpus(self) -> list[Any]: ...
    @property
    def cpu_count(self) -> int: ...


def listed_gpu(node: Hardware, gpu: dict[str, Any]) -> bool:
    """A GPU is listed unless its latest benchmark failed (it is delisted until one passes)."""
    verdict = ((node.benchmark_state or {}).get("gpus") or {}).get(str(gpu.get("uuid")))
    return not (isinstance(verdict, dict) and verdict.get("passed") is False)


def node_listed(node: Hardware) -> bool:
    """The node as a whole: not delisted by an admin, not quarantined (caught cheating),
    and its own benchmark not failed."""
    if node.delisted or node.quarantined_at is not None:
        return False
    verdict = (node.benchmark_state or {}).get("node")
    return not (isinstance(verdict, dict) and verdict.get("passed") is False)


READS = (
    *("id", "provider_id", "cpu_count", "gpus", "runtimes", "sandbox"),
    *("max_concurrent_jobs", "region", "tier", "price_per_gpu_hour_micro", "delisted"),
    *("last_seen_at", "availability", "benchmark_state", "reliability", "verification"),
    "quarantined_at",
)
"""The columns of a node's row that placement's rules read (here, `ranking`, `shortfall`,
`prices.on_demand_rates`): a read of many nodes for them alone needs no more
(`driver_models.some_columns`; a column left out raises where read, `partial`)."""

# Where `NodeRow.verification` keeps a CPU node's proof (the GPUs' are under their UUIDs).
CPU_PROOF = "cpu"


def claimed_model(gpu: dict[str, Any]) -> str | None:
    """The catalog model a GPU of a node row claims to be, named as its challenge names it;
    None for a GPU the catalog does not know (no challenge can prove it)."""
    return _catalog_name(str(gpu.get("model", "")), int(gpu.get("vram_mb", 0) or 0))


@functools.lru_cache(maxsize=1024)
def _catalog_name(nvml_name: str, vram_mb: int) -> str | None:
    # Cached: the claim asks it for every GPU of every node it weighs.
    model = gpu_catalog.match(nvml_name, vram_mb)
    return model.name if model is not None else None


def gpu_proof(node: Hardware, gpu: dict[str, Any]) -> dict[str, Any] | None:
    """The passed challenge that proves this GPU is what it now claims to be, if any: its
    UUID's entry in `NodeRow.verification`, naming the catalog model the GPU matches now
    (another name, or a GPU the catalog does not know, is not proven)."""
    proof = (node.verification or {}).get(str(gpu.get("uuid")))
    if not isinstance(proof, dict):
        return None
    claimed = claimed_model(gpu)
    return proof if claimed is not None and proof.get("model") == claimed else None


def gpu_verified(node: Hardware, gpu: dict[str, Any]) -> bool:
    return gpu_proof(node, gpu) is not None


def cpu_proof(node: Hardware) -> dict[str, Any] | None:
    """The passed challenge of a CPU node's cores: at least as many as it advertises."""
    proof = (node.verification or {}).get(CPU_PROOF)
    if not isinstance(proof, dict):
        return None
    cores = proof.get("cores")
    ok = isinstance(cores, int) and not isinstance(cores, bool) and cores >= node.cpu_count
    return proof if ok else None


def node_verified(node: Hardware) -> bool:
    """All of the node's hardware is proven: every GPU as its model, or a CPU node's cores."""
    if node.gpus:
        return all(gpu_verified(node, gpu) for gpu in node.gpus)
    return cpu_proof(node) is not None


def proven_at(proof: dict[str, Any] | None) -> datetime | None:
    """When a proof's challenge passed (None: no proof, or not a time we wrote)."""
    try:
        return datetime.fromisoformat(str((proof or {})["verified_at"]))
    except (KeyError, ValueError):
        return None


def verified_at(node: NodeRow) -> datetime | None:
    """For a verified node, since when all of its hardware has stood proven: the oldest of
    its proofs (a re-challenge renews one); None for a node that is not verified."""
    if not node_verified(node):
        return None
    proofs = [gpu_proof(node, gpu) for gpu in node.gpus] if node.gpus else [cpu_proof(node)]
    times = [t for proof in proofs if (t := proven_at(proof)) is not None]
    return min(times) if times else None


def cuda_of(version: object) -> tuple[int, int] | None:
    try:
        major, _, minor = str(version).partition(".")
        return int(major), int(minor or 0)
    except ValueError:
        return None


def gpu_matches(node: NodeRow, gpu: dict[str, Any], req: Requirements) -> bool:
    """One GPU of the node is of the model, memory and CUDA version asked for, listed, and
    verified when the request counts only verified GPUs (module doc)."""
    if not _gpu_fits(node, gpu, req):
        return False
    return not req.verified_gpus_only or gpu_verified(node, gpu)


def _gpu_fits(node: NodeRow, gpu: dict[str, Any], req: Requirements) -> bool:
    """What the GPU claims meets the request, and it is listed: proven or not."""
    if req.gpu_model and req.gpu_model.lower() not in str(gpu.get("model", "")).lower():
        return False
    if req.min_vram_mb and int(gpu.get("vram_mb", 0)) < req.min_vram_mb:
        return False
    wanted = req.runtime.min_cuda
    cuda = cuda_of(gpu.get("cuda_version"))
    if wanted is not None and (cuda is None or cuda < wanted):
        return False
    return listed_gpu(node, gpu)


def matching_gpus(node: NodeRow, req: Requirements) -> int:
    return sum(1 for gpu in node.gpus if gpu_matches(node, gpu, req))


def _gpus_missed(node: NodeRow, req: Requirements) -> str | None:
    """What the node misses of the GPUs asked for: "gpus" when it lacks them, "verified"
    when it has them but too few are proven; None when it has enough."""
    if matching_gpus(node, req) >= req.gpus:
        return None
    claimed = sum(1 for gpu in node.gpus if _gpu_fits(node, gpu, req))
    return "verified" if req.verified_gpus_only and claimed >= req.gpus else "gpus"


def reliability_of(node: NodeRow) -> float | None:
    score = (node.reliability or {}).get("score")
    return float(score) if isinstance(score, int | float) else None


def stored_reliability(value: dict[str, Any] | None) -> Reliability | None:
    """A published score (`providers/reliability.py` writes it) as stored on a node's or a
    provider's row; None if there is none or it is not one of ours."""
    if value is None:
        return None
    try:
        return Reliability.model_validate(value)
    except ValidationError:
        return None


# The constraints in the order a request meets them; `unmet` names the first one missed.
CONSTRAINTS = (
    "runtime",
    "listed",
    "availability window",
    "gpus",
    "verified",
    "region",
    "tier",
    "isolated_only",
    "max_price_per_gpu_hour",
    "min_reliability",
)


def unmet(node: NodeRow, req: Requirements, now: datetime) -> str | None:
    """The first constraint of `req` this node does not meet (busy or not); None: it serves."""
    if req.runtime.value not in node.runtimes:
        return "runtime"
    if not node_listed(node):
        return "listed"
    if not in_window(node, now):
        return "availability window"
    if req.runtime.needs_gpu and (missed := _gpus_missed(node, req)) is not None:
        return missed
    if req.require_verified and not node_verified(node):
        return "verified"
    if req.region and (node.region or "").lower() != req.region.lower():
        return "region"
    if req.tier and node.tier != req.tier:
        return "tier"
    if req.isolated_only and not SandboxKind(node.sandbox).isolates:
        return "isolated_only"
    price = node.price_per_gpu_hour_micro or 0
    if req.max_price_micro is not None and price > req.max_price_micro:
        return "max_price_per_gpu_hour"
    if req.min_reliability is not None:
        score = reliability_of(node)
        if score is None or score < req.min_reliability:
            return "min_reliability"
    return None


def serves(node: NodeRow, req: Requirements, now: datetime) -> bool:
    """Whether the node could run the job now, busy or not."""
    return unmet(node, req, now) is None


def nothing_meets(nodes: list[NodeRow], req: Requirements, now: datetime) -> str:
    """Which constraint no online node met: the furthest any node got before failing."""
    furthest = -1
    for node in nodes:
        missed = unmet(node, req, now)
        if missed is not None:
            furthest = max(furthest, CONSTRAINTS.index(missed))
    if furthest < 0:
        return "online"
    return CONSTRAINTS[furthest]


def node_status(node: NodeRow, now: datetime, running: int, offline_after_sec: float) -> NodeStatus:
    if not node_listed(node):
        return NodeStatus.DELISTED
    if node.last_seen_at is None or node.last_seen_at < now - timedelta(seconds=offline_after_sec):
        return NodeStatus.OFFLINE
    if running >= node.max_concurrent_jobs:
        return NodeStatus.BUSY
    return NodeStatus.ONLINE
