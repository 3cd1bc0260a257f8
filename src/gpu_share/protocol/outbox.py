"""Mails the platform sends, as admins see them in the outbox."""

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field


class OutboxState(StrEnum):
    WAITING = "waiting"  # not sent yet, still tried
    FAILED = "failed"  # given up: see last_error


class OutboxMail(BaseModel):
    id: str
    cause: str = Field(description="What decision queued it, e.g. papp_…:approved")
    to: str
    subject: str
    body: str
    created_at: datetime
    attempts: int
    next_attempt_at: datetime | None = Field(
        description="When it is tried next; null once sent or failed"
    )
    sent_at: datetime | None
    failed_at: datetime | None = Field(
        default=None,
        description="When it was given up: it could not be built, was refused for good, or "
        "kept failing for two days; last_error says why",
    )
    last_error: str | None
