"""Invokes: one job on one node (SPEC §1.5)."""

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AnyHttpUrl, BaseModel, Field, field_validator

from gpu_share.protocol.common import Sha256Hex
from gpu_share.protocol.money import PositiveUsdc, PriceCap
from gpu_share.protocol.nodes import Tier
from gpu_share.protocol.runtimes import RuntimeName

MAX_URL_LENGTH = 4096

# The invoke seed 000 shows (SPEC §1): the API document's example and the console's default.
HELLO_WORLD: dict[str, Any] = {
    "runtime": "onnx_cuda",
    "model_url": "https://github.com/onnx/models/raw/main/validated/vision/classification/mnist/model/mnist-12.onnx",
    "inputs_url": "",
    "timeout_sec": 600,
}


class InvokeStatus(StrEnum):
    QUEUED = "queued"
    ASSIGNED = "assigned"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELED = "canceled"
    TIMEOUT = "timeout"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset(
    {InvokeStatus.DONE, InvokeStatus.FAILED, InvokeStatus.CANCELED, InvokeStatus.TIMEOUT}
)
ACTIVE = frozenset({InvokeStatus.ASSIGNED, InvokeStatus.RUNNING})


class Priority(StrEnum):
    """Listed in the order queued work is taken, which is also their sorted order."""

    ON_DEMAND = "on_demand"
    SPOT = "spot"


def http_url(value: str) -> str:
    if len(value) > MAX_URL_LENGTH:
        raise ValueError(f"must be at most {MAX_URL_LENGTH} characters")
    url = AnyHttpUrl(value)  # raises on anything but a well-formed http(s) URL
    if url.username or url.password:
        raise ValueError("must not carry credentials; use a presigned URL instead")
    return value


class OutputsUpload(BaseModel):
    """Where the agent PUTs the outputs: a presigned URL of the tenant's own storage."""

    url: str
    method: Literal["PUT"] = "PUT"
    headers: dict[str, str] = Field(default_factory=dict, max_length=32)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return http_url(value)

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, header in value.items():
            if not name or any(c in name for c in ":\r\n ") or any(c in header for c in "\r\n"):
                raise ValueError(f"header {name!r} is not a valid HTTP header")
            if name.lower() in {"host", "content-length", "transfer-encoding", "connection"}:
                raise ValueError(f"header {name!r} is set by the agent")
        return value


REQUIRE_VERIFIED = (
    "Run only on nodes whose hardware is proven by hardware challenges (docs/trust.md). "
    "Work naming gpu_model or min_vram_gb gets only verified GPUs either way"
)


class InvokeCreate(BaseModel):
    """The body of `POST /v1/gpu/invoke`; the seed's Hello World body is valid as is."""

    model_config = {"extra": "forbid"}

    runtime: RuntimeName
    model_url: str = Field(
        description="http(s) URL of the .onnx model or the CatBoost train config"
    )
    inputs_url: str | None = Field(
        default="", description='http(s) URL of the inputs NPZ; "" for one zero-filled batch'
    )
    timeout_sec: int = Field(default=600, ge=1, description="Kill the job after this long")
    model_checksum_sha256: Sha256Hex | None = None
    inputs_checksum_sha256: Sha256Hex | None = None
    outputs_upload: OutputsUpload | None = None
    priority: Priority = Priority.ON_DEMAND
    max_price_per_gpu_hour: PriceCap | None = None
    min_vram_gb: float | None = Field(default=None, gt=0, le=4096)
    gpu_model: str | None = Field(default=None, min_length=1, max_length=100)
    gpus: int = Field(default=1, ge=1, le=16)
    region: str | None = Field(default=None, min_length=1, max_length=64)
    tier: Tier | None = None
    min_reliability: float | None = Field(
        default=None,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="Only nodes whose published reliability score is at least this",
    )
    isolated_only: bool = Field(
        default=False,
        description="Run only on nodes that isolate jobs (docker or bwrap), never on a node "
        "whose provider runs jobs as plain processes",
    )
    require_verified: bool = Field(default=False, description=REQUIRE_VERIFIED)
    webhook_url: str | None = None
    max_cost: PositiveUsdc | None = Field(
        default=None,
        description="The most this invoke may cost, in USDC: caps what is reserved from the "
        "balance at submission and limits placement to nodes whose rate fits it",
    )
    reservation_id: str | None = Field(
        default=None,
        max_length=40,
        description="Run in this active dedicated reservation of yours: on its node and GPUs "
        "only, ahead of other tenants' work, billed by the reservation (its own cost is 0)",
    )

    @field_validator("model_url")
    @classmethod
    def _model_url(cls, value: str) -> str:
        return http_url(value)

    @field_validator("inputs_url")
    @classmethod
    def _inputs_url(cls, value: str | None) -> str | None:
        return http_url(value) if value else ""

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        return http_url(value) if value else None


Amount = Annotated[int, Field(ge=0, le=2**62)]  # milliseconds, bytes: finite and stored whole


class Metrics(BaseModel):
    device: Literal["cuda", "cpu"] = Field(description="What really ran the job")
    execution_provider: str | None = Field(default=None, max_length=100)
    gpu_model: str | None = Field(default=None, max_length=200)
    duration_ms: Amount = Field(description="From start on the node to result")
    compute_ms: Amount | None = Field(
        default=None, description="Inside the runtime, without loading"
    )
    queue_ms: Amount | None = Field(default=None, description="From submission to start on a node")
    download_ms: Amount | None = None
    peak_rss_bytes: Amount | None = None
    peak_gpu_memory_bytes: Amount | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class InvokeResult(BaseModel):
    outputs_inline_base64: str | None = None
    outputs_url: str | None = Field(default=None, max_length=MAX_URL_LENGTH)
    outputs_format: str | None = Field(default=None, max_length=20, description="npz, json, …")
    outputs_size: Amount | None = None
    outputs_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    metrics: Metrics


class InvokeError(BaseModel):
    code: str = Field(max_length=40)
    message: str = Field(max_length=16_000)


class InvokeRefund(BaseModel):
    at: datetime
    reason: str | None = Field(description="Why, e.g. its node was caught returning wrong results")


class Invoke(BaseModel):
    id: str
    status: InvokeStatus
    runtime: RuntimeName
    model_url: str
    inputs_url: str
    timeout_sec: int
    priority: Priority
    node_id: str | None
    attempts: int
    preemptions: int = Field(
        default=0,
        description="Times this spot invoke was stopped for on-demand work and requeued",
    )
    created_at: datetime
    assigned_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested_at: datetime | None = None
    result: InvokeResult | None
    error: InvokeError | None
    max_cost: str | None = Field(default=None, description="The cap given at submission, USDC")
    rate_per_hour: str | None = Field(
        default=None,
        description="USDC per hour for all its GPUs, fixed when a node took it (0 while free)",
    )
    cost: str | None = Field(
        default=None,
        description='What it cost, in USDC, once final ("0" when nothing was charged); null before',
    )
    warnings: list[str] = Field(default_factory=list)
    reservation_id: str | None = Field(
        default=None, description="The dedicated reservation it runs in (billed by it)"
    )
    spot_checked: bool = Field(
        default=False,
        description="Its result was re-computed on a trusted node and compared (docs/trust.md)",
    )
    refund: InvokeRefund | None = Field(
        default=None, description="Its cost was paid back, and why; null: not refunded"
    )
    webhook_url: str | None = Field(
        default=None, description="Where its events are sent, signed (docs/webhooks.md)"
    )


class ProbeUrlRequest(BaseModel):
    url: str = Field(max_length=MAX_URL_LENGTH)


class ProbeUrlResult(BaseModel):
    reachable: bool
    status_code: int | None = None
    content_length: int | None = None
    content_type: str | None = None
    error: str | None = None
