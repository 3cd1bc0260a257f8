"""Dedicated reservations on the wire (SPEC §4.3): whole GPUs of one node for a period.

    POST /v1/reservations/quote        ReservationRequest → ReservationQuote
    POST /v1/reservations              ReservationRequest → Reservation (201)
    GET  /v1/reservations              → Page[Reservation]
    GET  /v1/reservations/{id}         → Reservation
    POST /v1/reservations/{id}/cancel  → Reservation

A period is whole hours, from 1 hour to 30 days, starting now (no `starts_at`) or at
a whole minute at most 90 days ahead; give `hours` or `ends_at`. Times are UTC.
"""

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field, field_validator

from gpu_share.protocol.invokes import MAX_URL_LENGTH, http_url
from gpu_share.protocol.money import PriceCap
from gpu_share.protocol.nodes import Tier

MIN_HOURS = 1
MAX_HOURS = 30 * 24
MAX_DAYS_AHEAD = 90


class ReservationStatus(StrEnum):
    PENDING = "pending"  # paid for (reserved), not started yet
    ACTIVE = "active"  # its GPUs are held for its tenant
    ENDED = "ended"  # its period is over; charged
    CANCELED = "canceled"  # canceled by its tenant; see docs/billing.md for what it cost

    @property
    def final(self) -> bool:
        return self in (ReservationStatus.ENDED, ReservationStatus.CANCELED)


class ReservationRequest(BaseModel):
    """What to reserve: `node_id`, or the best ranked node meeting the filters."""

    model_config = {"extra": "forbid"}

    gpus: int = Field(default=1, ge=1, le=64, description="Whole GPUs of one node")
    node_id: str | None = Field(default=None, min_length=1, max_length=40)
    starts_at: datetime | None = Field(
        default=None, description="UTC, a whole minute; none: now (it starts at once)"
    )
    ends_at: datetime | None = Field(default=None, description="UTC; or give `hours`")
    hours: int | None = Field(default=None, ge=MIN_HOURS, le=MAX_HOURS)
    gpu_model: str | None = Field(default=None, min_length=1, max_length=100)
    min_vram_gb: float | None = Field(default=None, gt=0, le=4096, allow_inf_nan=False)
    region: str | None = Field(default=None, min_length=1, max_length=64)
    tier: Tier | None = None
    max_price: PriceCap | None = Field(default=None, description="USDC per GPU-hour")
    min_reliability: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    require_verified: bool = Field(
        default=True,
        description="Only a node whose hardware is all proven by hardware challenges "
        "(docs/trust.md). Reserved GPUs are always verified ones; false also allows a node "
        "some of whose other GPUs are not proven yet",
    )
    webhook_url: str | None = Field(
        default=None,
        max_length=MAX_URL_LENGTH,
        description="Told (signed, docs/webhooks.md) when it becomes active, ends or is canceled",
    )

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        return http_url(value) if value else None


class ReservationQuote(BaseModel):
    node_id: str
    gpus: int
    gpu_model: str
    starts_at: datetime
    ends_at: datetime
    hours: int
    rate_per_gpu_hour: str = Field(description="USDC: the node's on-demand rate")
    rate_per_hour: str = Field(description="USDC: all the reserved GPUs together")
    cost: str = Field(description="USDC: the whole period, reserved from the balance at once")
    available: str | None = Field(description="USDC the balance has now (none in free billing)")
    covered: bool = Field(description="Whether the balance covers the cost")
    within_cap: bool = Field(
        default=True,
        description="Whether the cost fits under your monthly spending cap (true without one)",
    )


class Reservation(BaseModel):
    id: str
    status: ReservationStatus
    node_id: str
    gpus: int
    gpu_indices: list[int] = Field(description="Which of the node's GPUs (NVML indices)")
    starts_at: datetime
    ends_at: datetime
    hours: int
    rate_per_hour: str = Field(description="USDC: all its GPUs together")
    cost: str = Field(
        description="USDC: the period's price; once ended or canceled, what was charged (0 "
        "if canceled before it started)"
    )
    credited: str | None = Field(
        default=None,
        description="USDC taken off the charge for time its node was offline (docs/billing.md); "
        "none until it ended or was canceled",
    )
    created_at: datetime
    canceled_at: datetime | None = None
    ended_at: datetime | None = None
    webhook_url: str | None = Field(
        default=None, description="Where its events are sent, signed (docs/webhooks.md)"
    )
