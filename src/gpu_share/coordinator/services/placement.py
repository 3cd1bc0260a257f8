"""Which nodes may run which job (SPEC §4.1): a pure function of node and requirements."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol

from gpu_share.coordinator.core.orm import InvokeRow, NodeRow
from gpu_share.protocol.nodes import NodeStatus, SandboxKind, Tier
from gpu_share.protocol.runtimes import RuntimeName

MICRO = 1_000_000


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
            parts.append(f"max_price_per_gpu_hour {self.max_price_micro / MICRO:g}")
        if self.isolated_only:
            parts.append("isolated_only")
        return ", ".join(parts)

    def constraints(self) -> dict[str, Any]:
        return {
            "min_vram_mb": self.min_vram_mb,
            "gpu_model": self.gpu_model,
            "region": self.region,
            "tier": self.tier,
            "max_price_micro": self.max_price_micro,
            "isolated_only": self.isolated_only,
        }

    @classmethod
    def of(cls, invoke: InvokeRow) -> "Requirements":
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
    )


def matching_gpus(node: NodeRow, req: Requirements) -> int:
    count = 0
    for gpu in node.gpus:
        if req.gpu_model and req.gpu_model.lower() not in str(gpu.get("model", "")).lower():
            continue
        if req.min_vram_mb and int(gpu.get("vram_mb", 0)) < req.min_vram_mb:
            continue
        count += 1
    return count


def serves(node: NodeRow, req: Requirements) -> bool:
    """Whether the node could ever run the job, busy or not."""
    if req.runtime.value not in node.runtimes:
        return False
    if req.runtime.needs_gpu and matching_gpus(node, req) < req.gpus:
        return False
    if req.region and (node.region or "").lower() != req.region.lower():
        return False
    if req.tier and node.tier != req.tier:
        return False
    if req.isolated_only and not SandboxKind(node.sandbox).isolates:
        return False
    price = node.price_per_gpu_hour_micro or 0
    return req.max_price_micro is None or price <= req.max_price_micro


def node_status(node: NodeRow, now: datetime, running: int, offline_after_sec: float) -> NodeStatus:
    if node.delisted:
        return NodeStatus.DELISTED
    if node.last_seen_at is None or node.last_seen_at < now - timedelta(seconds=offline_after_sec):
        return NodeStatus.OFFLINE
    if running >= node.max_concurrent_jobs:
        return NodeStatus.BUSY
    return NodeStatus.ONLINE
