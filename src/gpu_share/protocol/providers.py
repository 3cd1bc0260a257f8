"""Providers as admins create them (the full application flow is SPEC §3.1)."""

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

from gpu_share.protocol.common import Email
from gpu_share.protocol.hardware import HardwareProof
from gpu_share.protocol.names import NodeLabel
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
    label: str | None = Field(
        default=None,
        description="Your name for the machine (PATCH /v1/provider/nodes/{node_id}); pages "
        "show it, else its hostname",
    )
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
    verified: bool = Field(
        default=False,
        description="All of its hardware proven by hardware challenges (docs/trust.md)",
    )
    verification: list[HardwareProof] = Field(
        default_factory=list,
        description="Each GPU's proof, in the order of `gpus` (a CPU node: its cores')",
    )


class ProviderNodeUpdate(BaseModel):
    """`PATCH /v1/provider/nodes/{node_id}`: what a provider may change of their machine."""

    label: NodeLabel | None = Field(
        description="What to call the machine: 1–64 printable characters once trimmed, "
        "shown in the marketplace and on every page that lists it; null clears it (pages "
        "then show its hostname)",
    )


class EnrollmentTokenState(StrEnum):
    ACTIVE = "active"
    EXPIRED = "expired"
    REVOKED = "revoked"


class EnrollmentToken(BaseModel):
    """An enrollment token as its provider and the admin see it; the token itself is shown
    once, when issued."""

    id: str
    prefix: str = Field(description="Its first characters, to tell tokens apart")
    created_at: datetime
    expires_at: datetime | None = Field(description="Registrations are refused from then on")
    revoked_at: datetime | None
    state: EnrollmentTokenState
    machines: int = Field(ge=0, description="Machines whose latest registration used it")


class IssuedEnrollmentToken(EnrollmentToken):
    token: str = Field(description="gpu_et_…; shown once: give it to `gpu-share agent --token`")
    install_command: str = Field(description="Installs and starts the agent with this token")
    replaces: str | None = Field(
        default=None, description="Rotating: the token revoked in the same step"
    )


class EnrollmentTokenRequest(BaseModel):
    """How long the new token works (the admin's choice; providers get the platform's)."""

    lifetime_days: int | None = Field(
        default=None,
        ge=1,
        le=365,
        description="Days until it expires; null: GPUSHARE_ENROLLMENT_TOKEN_DAYS (7)",
    )
