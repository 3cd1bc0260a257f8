"""Providers as admins create them (the full application flow is SPEC §3.1)."""

from datetime import datetime

from pydantic import BaseModel, Field

from gpu_share.protocol.common import Email
from gpu_share.protocol.nodes import (
    GpuInfo,
    NodeStatus,
    SandboxKind,
    Telemetry,
    TelemetrySample,
    Tier,
)
from gpu_share.protocol.runtimes import RuntimeName


class ProviderCreate(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    email: Email
    tier: Tier = Tier.COMMUNITY


class Provider(BaseModel):
    id: str
    name: str
    email: str
    tier: Tier
    created_at: datetime


class ProviderWithCredentials(Provider):
    api_key: str = Field(description="gpu_pk_…; shown once")
    enrollment_token: str = Field(description="gpu_et_…; give it to `gpu-share agent --token`")


class ProviderNode(BaseModel):
    """One of the provider's machines, as their dashboard shows it."""

    id: str
    hostname: str
    status: NodeStatus
    gpus: list[GpuInfo]
    runtimes: list[RuntimeName]
    sandbox: SandboxKind
    region: str | None
    tier: Tier
    cpu_count: int
    ram_mb: int
    agent_version: str
    running_jobs: int
    max_concurrent_jobs: int
    registered_at: datetime
    last_seen_at: datetime | None
    telemetry: Telemetry | None = Field(description="As of the last heartbeat")
    reserved_gpus: list[int] = Field(
        default_factory=list,
        description="Its GPUs (NVML index) a tenant's dedicated reservation holds now",
    )
    recent: list[TelemetrySample] = Field(
        default_factory=list, description="Heartbeats of the last minutes, oldest first"
    )
