"""Mails the platform sends, as admins see them in the outbox."""

from datetime import datetime

from pydantic import BaseModel, Field


class OutboxMail(BaseModel):
    id: str
    cause: str = Field(description="What decision queued it, e.g. papp_…:approved")
    to: str
    subject: str
    body: str
    created_at: datetime
    attempts: int
    next_attempt_at: datetime | None = Field(description="When it is tried next; null once sent")
    sent_at: datetime | None
    last_error: str | None
