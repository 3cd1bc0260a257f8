"""The agent ↔ coordinator contract (Bearer `gpu_ak_…` unless noted).

    POST /v1/agent/register          (Bearer gpu_et_… enrollment token) → node id + node key
    PUT  /v1/agent/inventory         GPUs, runtimes, capacity after a restart
    POST /v1/agent/heartbeat         telemetry + running leases → lease verdicts
    POST /v1/agent/lease             long-poll for work
    POST /v1/agent/invokes/{id}/start
    POST /v1/agent/invokes/{id}/logs
    POST /v1/agent/invokes/{id}/outputs  (octet-stream) → platform-stored outputs
    POST /v1/agent/invokes/{id}/checkpoint  (octet-stream) → the snapshot to resume from
    POST /v1/agent/invokes/{id}/result
    POST /v1/agent/invokes/{id}/preempted   the job stopped at a PREEMPT verdict: requeue it
    POST /v1/agent/challenges/{id}/…        a hardware challenge (`protocol.trust`)

Every call about a leased invoke carries its `lease_token`; a stale token gets 409.
"""

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Self

from pydantic import BaseModel, Field, model_validator

from gpu_share.protocol.invokes import InvokeError, InvokeResult, InvokeStatus, OutputsUpload
from gpu_share.protocol.nodes import (
    MAX_GPUS,
    MAX_MB,
    GpuInfo,
    GpuTopology,
    SandboxKind,
    Telemetry,
)
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.protocol.trust import ChallengeOrder

LEASE_TOKEN_HEADER = "X-Lease-Token"  # noqa: S105 (a header name)
GpuIndex = Annotated[int, Field(ge=0, le=MAX_GPUS)]  # a GPU's NVML index on its node
FINGERPRINT_PATTERN = "^[0-9a-f]{64}$"
LEASE_ANSWER_SLACK_SEC = 15.0
"""An agent waits for a lease's answer `wait_sec` plus this, then gives up on it."""


class NodeInventory(BaseModel):
    hostname: str = Field(max_length=255)
    agent_version: str = Field(max_length=50)
    os: str | None = Field(default=None, max_length=200)
    cpu_model: str | None = Field(default=None, max_length=200)
    cpu_count: int = Field(ge=1, le=4096)
    ram_mb: int = Field(ge=0, le=MAX_MB)
    gpus: list[GpuInfo] = Field(default_factory=list, max_length=MAX_GPUS)
    runtimes: list[RuntimeName] = Field(default_factory=list)
    max_concurrent_jobs: int = Field(ge=1, le=256)
    job_memory_mb: int | None = Field(
        default=None,
        ge=0,
        le=MAX_MB,
        description="The memory each job (and each session's model process) may use: the "
        "provider's limit, else the slot's share of the RAM (agent/jobcontext.job_limits); "
        "null: an older agent",
    )
    sandbox: SandboxKind
    region: str | None = Field(default=None, max_length=64)
    gpu_topology: GpuTopology | None = Field(
        default=None, description="NVLink/PCIe links between the GPUs; null: NVML could not say"
    )
    fingerprint: str | None = Field(
        default=None,
        pattern=FINGERPRINT_PATTERN,
        description="SHA-256 (hex) of stable facts of the machine (`agent/fingerprint.py`): "
        "the same machine registering again is its node again; null: an older agent",
    )


class Registration(BaseModel):
    inventory: NodeInventory


class RegistrationResult(BaseModel):
    node_id: str
    node_key: str = Field(description="gpu_ak_…; shown once, kept by the agent")
    heartbeat_interval_sec: float
    lease_ttl_sec: float
    returning: bool = Field(
        default=False,
        description="The machine was known (its fingerprint or a GPU UUID): this is its node "
        "again, with its record; the node's earlier keys are revoked",
    )


class InventoryAck(BaseModel):
    node_id: str
    heartbeat_interval_sec: float
    lease_ttl_sec: float


class RunningLease(BaseModel):
    invoke_id: str = Field(max_length=64)
    lease_token: str = Field(max_length=64)


class Heartbeat(BaseModel):
    telemetry: Telemetry = Field(default_factory=Telemetry)
    running: list[RunningLease] = Field(default_factory=list, max_length=256)


class LeaseVerdict(StrEnum):
    KEEP = "keep"  # lease extended; carry on
    CANCEL = "cancel"  # the tenant canceled: stop the job, report `canceled`
    DROP = "drop"  # the lease is no longer yours (requeued or finished): stop, report nothing
    # On-demand work needs this spot job's slot: stop it, let its last checkpoint upload,
    # then report `POST …/preempted`; the coordinator requeues it (not a failure).
    PREEMPT = "preempt"


class LeaseStatus(BaseModel):
    invoke_id: str
    verdict: LeaseVerdict
    lease_expires_at: datetime | None = None


class HeartbeatAck(BaseModel):
    leases: list[LeaseStatus]
    heartbeat_interval_sec: float
    run_benchmark: bool = Field(
        default=False,
        description="Run the benchmark suite when no job or session holds a GPU, and report it",
    )
    challenge: ChallengeOrder | None = Field(
        default=None,
        description="A hardware challenge waits for this node (docs/trust.md): start it when "
        "no job or session holds its GPU (or, for a CPU challenge, the node)",
    )


class LeaseRequest(BaseModel):
    slots: int = Field(ge=1, le=256, description="How many jobs the agent can start now")
    free_gpus: int = Field(ge=0, le=64)
    free_gpu_indices: list[GpuIndex] | None = Field(
        default=None,
        max_length=MAX_GPUS,
        description="Which GPUs (NVML index) are free; null from agents that do not say",
    )
    wait_sec: float = Field(default=25.0, ge=0, le=60, description="Long-poll for this long")
    start: bool = Field(
        default=False,
        description="Start the jobs as they are leased: the answer is their start, and the "
        "agent makes no `/start` call (`LeasedJob.started`)",
    )


class ArtifactRef(BaseModel):
    """Where the agent fetches one input of a job.

    With `platform`, the coordinator vouches for `sha256`: it is the stored artifact's
    own, and the artifact is the job's tenant's, so the agent may serve those bytes
    from its cache. Otherwise `sha256` is the tenant's word, only ever checked against
    what the URL's origin sends: knowing a hash never grants the content.
    """

    url: str = Field(description="The URL to fetch")
    platform: bool = Field(
        description="A platform artifact: fetch from the coordinator, which vouches for sha256"
    )
    sha256: str | None = Field(description="Checksum to verify after download, when known")
    size: int | None = None


class EvaluatedOutputs(BaseModel):
    """What another node returned for this job, for the runtime to score as well as run it:
    a spot check (docs/trust.md). Only the coordinator sets it, only for CatBoost training,
    where it is the other node's `outputs.npz` (the model it trained and its report). One
    of the two is set."""

    artifact: ArtifactRef | None = None
    inline_base64: str | None = None


class LeasedJob(BaseModel):
    invoke_id: str
    lease_token: str
    lease_expires_at: datetime
    attempt: int
    runtime: RuntimeName
    model: ArtifactRef
    inputs: ArtifactRef | None
    timeout_sec: int
    gpus: int
    outputs_upload: OutputsUpload | None
    inline_limit_bytes: int
    checkpoint: ArtifactRef | None = Field(
        default=None, description="A snapshot to resume from (training runtimes)"
    )
    gpu_indices: list[GpuIndex] | None = Field(
        default=None,
        description="The node's GPUs (NVML index) to run on, `gpus` of them; null from "
        "coordinators that do not choose (the agent picks free ones)",
    )
    started: bool = Field(
        default=False,
        description="Already running (the lease asked `start`): its timeout counts from the "
        "lease, and the agent makes no `/start` call",
    )
    evaluate: EvaluatedOutputs | None = Field(
        default=None,
        description="A spot check of a training: also score the model another node "
        "returned for the same job (docs/trust.md); null for every tenant's job",
    )


class LeaseResponse(BaseModel):
    jobs: list[LeasedJob]


class StartReport(BaseModel):
    lease_token: str = Field(max_length=64)


MAX_LOG_APPEND = 256 * 1024  # characters of log text in one request


class LogAppend(BaseModel):
    lease_token: str = Field(max_length=64)
    text: str = Field(max_length=MAX_LOG_APPEND)


class LogAck(BaseModel):
    verdict: LeaseVerdict


class ResultReport(BaseModel):
    """The node's verdict on a leased invoke; the tenant reads `result` and `error` as sent."""

    lease_token: str = Field(max_length=64)
    status: InvokeStatus = Field(description="A final status: done, failed, timeout or canceled")
    result: InvokeResult | None = Field(
        default=None, description="Outputs and metrics; required when done"
    )
    error: InvokeError | None = Field(default=None, description="Required unless done")
    log: str = Field(
        default="",
        max_length=MAX_LOG_APPEND,
        description="The job's last log text, appended to its log with the result (one "
        "request instead of a final log POST and the result)",
    )
    next: LeaseRequest | None = Field(
        default=None,
        description="Lease the node's next work in the same request, once the result is "
        "recorded (its `wait_sec` is not waited: the answer comes at once). The answer's "
        "`jobs` are leased as by `POST /v1/agent/lease`",
    )

    @model_validator(mode="after")
    def _one_verdict(self) -> Self:
        if not self.status.terminal:
            raise ValueError("status must be final: done, failed, timeout or canceled")
        if self.status is InvokeStatus.DONE and (self.result is None or self.error is not None):
            raise ValueError("a done result carries outputs and metrics and no error")
        if self.status is not InvokeStatus.DONE and self.error is None:
            raise ValueError(f"a {self.status.value} result carries the error that ended it")
        return self


class PreemptedReport(BaseModel):
    """The job stopped at a PREEMPT verdict (its last checkpoint, if any, uploaded first)."""

    lease_token: str = Field(max_length=64)


class OutputsStored(BaseModel):
    artifact_id: str
    url: str


class CheckpointStored(BaseModel):
    artifact_id: str
    size: int
