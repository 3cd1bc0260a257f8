"""Webhooks as the API shows them: an account's endpoints, its signing secret, the
delivery log (docs/webhooks.md)."""

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field, field_validator

from gpu_share.protocol.invokes import http_url

# What an endpoint may subscribe to, per account. Invoke, session and reservation events go
# to the webhook_url given with each (so the invoke path reads no endpoints).
TENANT_EVENTS = ("topup.credited",)
PROVIDER_EVENTS = ("payout.paid", "payout.failed")


class DeliveryStatus(StrEnum):
    PENDING = "pending"  # not answered 2xx yet; tried again at next_attempt_at
    DELIVERED = "delivered"  # answered 2xx
    FAILED = "failed"  # retried for the whole retry window without a 2xx


class WebhookEndpointCreate(BaseModel):
    model_config = {"extra": "forbid"}

    url: str = Field(description="http(s) URL on a public address that receives the events")
    event_types: list[str] = Field(
        min_length=1,
        max_length=16,
        description="Tenants: topup.credited; providers: payout.paid, payout.failed",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return http_url(value)


class WebhookEndpoint(BaseModel):
    id: str
    url: str
    event_types: list[str]
    created_at: datetime


class WebhookSecret(BaseModel):
    """Shown once: store it where your receiver reads it."""

    secret: str = Field(description="whsec_… (Standard Webhooks); verify each delivery with it")
    previous_valid_until: datetime | None = Field(
        description="After a rotation, deliveries are signed with the previous secret too "
        "until then, so your receiver can switch"
    )


class WebhookEndpointCreated(WebhookEndpoint):
    secret: str | None = Field(
        description="Your account's signing secret, when this endpoint created it (the "
        "first time); null otherwise: rotate it to see a new one"
    )


class WebhookAttempt(BaseModel):
    at: datetime
    status_code: int | None = Field(description="The receiver's answer; null when none came")
    error: str | None
    duration_ms: int


class WebhookDelivery(BaseModel):
    id: str = Field(description="The webhook-id header: the same on every attempt and replay")
    event_type: str
    url: str
    endpoint_id: str | None = Field(description="null: sent to the object's own webhook_url")
    status: DeliveryStatus
    attempts: int
    created_at: datetime
    next_attempt_at: datetime | None = Field(description="null once delivered or failed")
    delivered_at: datetime | None
    failed_at: datetime | None
    last_status_code: int | None
    last_error: str | None


class WebhookDeliveryDetail(WebhookDelivery):
    body: str = Field(description="The JSON sent, byte for byte as signed")
    attempt_log: list[WebhookAttempt]
