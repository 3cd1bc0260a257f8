"""Sessions (SPEC §1.7): a model kept loaded on one node for a series of forward calls.

Tenant side: `POST /v1/gpu/sessions`, `GET`/`DELETE /v1/gpu/sessions/{id}`,
`POST /v1/gpu/sessions/{id}/forward` (NPZ body → NPZ, or JSON `{"inputs"}` → JSON
`{"outputs"}`).

Agent side: one WebSocket per agent, `GET /v1/agent/sessions/ws` (Bearer gpu_ak_…),
carrying control messages as JSON text frames and forwards as binary frames made
by `pack`: a 4-byte big-endian header length, the JSON header, then the payload.
"""

import json
import struct
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from gpu_share.protocol.agent import ArtifactRef
from gpu_share.protocol.common import Sha256Hex
from gpu_share.protocol.invokes import MAX_URL_LENGTH, REQUIRE_VERIFIED, http_url
from gpu_share.protocol.money import PriceCap
from gpu_share.protocol.nodes import Tier
from gpu_share.protocol.runtimes import RuntimeName

SESSION_RUNTIMES = (RuntimeName.ONNX_CUDA, RuntimeName.ONNX_CPU)
MAX_SESSION_GPUS = 16


class SessionStatus(StrEnum):
    STARTING = "starting"
    READY = "ready"
    CLOSED = "closed"
    FAILED = "failed"

    @property
    def open(self) -> bool:
        return self in OPEN_SESSION_STATUSES


OPEN_SESSION_STATUSES = frozenset({SessionStatus.STARTING, SessionStatus.READY})


class SessionCreate(BaseModel):
    model_config = {"extra": "forbid"}

    runtime: RuntimeName
    model_url: str = Field(max_length=MAX_URL_LENGTH)
    model_checksum_sha256: Sha256Hex | None = None
    idle_timeout_sec: int = Field(default=300, ge=1, le=24 * 3600)
    max_batch: int | None = Field(default=None, ge=1, le=1_000_000)
    max_concurrency: int = Field(default=4, ge=1, le=64, description="Forwards run at once")
    min_vram_gb: float | None = Field(default=None, gt=0, le=4096)
    gpu_model: str | None = Field(default=None, min_length=1, max_length=100)
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
    max_price_per_gpu_hour: PriceCap | None = None
    require_verified: bool = Field(default=False, description=REQUIRE_VERIFIED)
    webhook_url: str | None = Field(
        default=None,
        max_length=MAX_URL_LENGTH,
        description="Told (signed, docs/webhooks.md) when the session opens and when it closes",
    )
    reservation_id: str | None = Field(
        default=None,
        max_length=40,
        description="Hold the model in this active dedicated reservation of yours: on its "
        "node, in its GPUs' memory, billed by the reservation (its own cost is 0)",
    )
    gpus: int = Field(
        default=0,
        ge=0,
        le=MAX_SESSION_GPUS,
        description="Whole GPUs the session holds, on one node (the model runs on the first "
        "of them); 0: it shares the node's first GPU by memory. GPU runtimes only",
    )

    @field_validator("model_url")
    @classmethod
    def _model_url(cls, value: str) -> str:
        return http_url(value)

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        return http_url(value) if value else None

    @field_validator("runtime")
    @classmethod
    def _runtime(cls, value: RuntimeName) -> RuntimeName:
        if value not in SESSION_RUNTIMES:
            raise ValueError("sessions serve ONNX models: use onnx_cuda or onnx_cpu")
        return value

    @model_validator(mode="after")
    def _gpus(self) -> "SessionCreate":
        if self.gpus and not self.runtime.needs_gpu:
            raise ValueError(f"gpus: {self.runtime.value} runs on the CPU; leave gpus at 0")
        return self


class SessionError(BaseModel):
    code: str
    message: str


class Session(BaseModel):
    id: str
    status: SessionStatus
    runtime: RuntimeName
    model_url: str
    node_id: str | None
    idle_timeout_sec: int
    max_batch: int | None
    created_at: datetime
    ready_at: datetime | None
    last_used_at: datetime | None
    closed_at: datetime | None
    expires_at: datetime | None = Field(description="When it closes if no forward arrives")
    forward_count: int
    device: str | None = Field(default=None, description="What really runs the model")
    inputs: list[dict[str, Any]] | None = Field(default=None, description="Name, type, shape")
    error: SessionError | None = None
    gpus: int = Field(default=0, description="Whole GPUs held (0: shares the first by memory)")
    gpu_indices: list[int] | None = Field(
        default=None, description="Which of the node's GPUs (NVML indices) it holds"
    )
    rate_per_hour: str | None = Field(
        default=None, description="USDC per hour the node charges, fixed when it was placed"
    )
    cost: str | None = Field(
        default=None,
        description="USDC charged so far for the time it was held (final once closed); "
        '"0" when nothing is charged',
    )
    webhook_url: str | None = Field(
        default=None, description="Where its events are sent, signed (docs/webhooks.md)"
    )


# Agent channel messages


class OpenSession(BaseModel):
    type: Literal["open"] = "open"
    session_id: str
    runtime: RuntimeName
    model: ArtifactRef
    max_batch: int | None
    max_concurrency: int
    max_answer_bytes: int = Field(
        default=64 * 1024 * 1024,
        description="A forward's outputs over this fail that forward alone (PAYLOAD_TOO_LARGE); "
        "the channel carries frames up to this plus a small header",
    )
    gpu_indices: list[int] | None = Field(
        default=None,
        description="The node's GPUs (NVML indices) the session gets, the model on the first; "
        "null (an older coordinator, or a session sharing by memory): the node's first GPU",
    )


class CloseSession(BaseModel):
    type: Literal["close"] = "close"
    session_id: str
    reason: str


class SessionReady(BaseModel):
    type: Literal["ready"] = "ready"
    session_id: str
    device: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]


class SessionFailed(BaseModel):
    type: Literal["failed"] = "failed"
    session_id: str
    error: SessionError


class SessionClosed(BaseModel):
    type: Literal["closed"] = "closed"
    session_id: str


class ForwardHeader(BaseModel):
    """Header of a binary forward request (coordinator → agent) or result (agent → back)."""

    type: Literal["forward", "result"]
    request_id: int
    session_id: str
    format: Literal["npz", "json"]
    ok: bool = True
    error: SessionError | None = None


def pack(header: BaseModel, payload: bytes = b"") -> bytes:
    head = header.model_dump_json(exclude_none=True).encode()
    return struct.pack(">I", len(head)) + head + payload


def unpack(frame: bytes) -> tuple[dict[str, Any], bytes]:
    if len(frame) < 4:
        raise ValueError("frame too short")
    (length,) = struct.unpack(">I", frame[:4])
    if length > len(frame) - 4:
        raise ValueError("frame header longer than the frame")
    header = json.loads(frame[4 : 4 + length])
    if not isinstance(header, dict):
        raise ValueError("frame header is not an object")
    return header, frame[4 + length :]
