"""The marketplace (SPEC §4.2): what can be rented now, with its scores and their parts."""

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

from gpu_share.protocol.money import PriceCap
from gpu_share.protocol.nodes import (
    SPOT_CHECK_RATE,
    VERIFIED,
    VERIFIED_AT,
    GpuTopology,
    NodeStatus,
    SandboxKind,
    Tier,
)
from gpu_share.protocol.reliability import Reliability
from gpu_share.protocol.runtimes import RuntimeName


class OfferSort(StrEnum):
    RANK = "rank"  # the placement order (docs/placement.md), best first
    PRICE = "price"  # cheapest first
    RELIABILITY = "reliability"  # most reliable first
    BENCHMARK = "benchmark"  # fastest first
    VRAM = "vram"  # most GPU memory per GPU first


class OfferGpus(BaseModel):
    """The node's listed GPUs of one model, verified or not (each kind its own group)."""

    model: str
    count: int
    vram_mb: int
    cuda_version: str | None
    benchmark_score: float | None = Field(description="Mean of these GPUs' latest scores")
    verified: bool = Field(
        default=False,
        description="A hardware challenge proved these GPUs are the model they claim "
        "(docs/trust.md); unverified ones are not rented as that model",
    )


class Offer(BaseModel):
    node_id: str
    label: str | None = Field(
        default=None,
        description="What its provider calls the machine (1–64 characters); null: not named",
    )
    status: NodeStatus = Field(description="online (a slot free) or busy")
    region: str | None
    tier: Tier
    sandbox: SandboxKind
    isolated: bool
    gpus: list[OfferGpus]
    gpu_count: int = Field(description="Listed GPUs")
    runtimes: list[RuntimeName]
    free_slots: int
    memory_limit_mb: int | None = Field(
        default=None,
        description="The memory each job may use on this node: the provider's limit, else "
        "the slot's share of its RAM (RAM × 0.75 ÷ slots); inputs that would expand past it "
        "(or past 2 GiB) fail with RESOURCE_LIMIT",
    )
    price_per_gpu_hour: str | None = Field(description="USDC; null: the provider set none")
    reliability_score: float | None
    reliability: Reliability | None = Field(description="The score's components")
    benchmark_score: float | None
    rank: float = Field(description="The placement rank; higher is placed first")
    rank_components: dict[str, float]
    nvlink: bool = Field(default=False, description="Some of its GPUs are linked by NVLink")
    reserved_gpus: int = Field(
        default=0, description="Listed GPUs a dedicated reservation holds now: not free to others"
    )
    gpu_topology: GpuTopology | None = Field(
        default=None, description="How its GPUs are linked (NVLink, PCIe); null: not reported"
    )
    verified: bool = Field(default=False, description=VERIFIED)
    verified_at: datetime | None = Field(default=None, description=VERIFIED_AT)
    spot_check_rate: float | None = Field(default=None, description=SPOT_CHECK_RATE)


class OfferQuery(BaseModel):
    gpu_model: str | None = Field(default=None, min_length=1, max_length=100)
    min_vram_gb: float | None = Field(default=None, gt=0, le=4096, allow_inf_nan=False)
    max_price: PriceCap | None = Field(default=None, description="USDC per GPU-hour")
    region: str | None = Field(default=None, min_length=1, max_length=64)
    tier: Tier | None = None
    min_reliability: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    runtime: RuntimeName | None = None
    gpus: int = Field(default=1, ge=1, le=16, description="Listed GPUs needed on one node")
    nvlink: bool | None = Field(
        default=None,
        description="true: only nodes with NVLink between `gpus` of their listed GPUs "
        "(each pair linked); false: only nodes without NVLink",
    )
    include_unverified: bool = Field(
        default=False,
        description="Also show nodes whose hardware is not proven yet (`verified` false): "
        "they cannot be reserved, nor get work that names a GPU model or VRAM",
    )
    sort: OfferSort = OfferSort.RANK
    limit: int = Field(default=50, ge=1, le=200)
