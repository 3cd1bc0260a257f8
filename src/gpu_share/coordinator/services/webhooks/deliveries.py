"""The delivery log and its state: claiming what is due (a guarded UPDATE, so several
replicas never send one attempt twice), recording each attempt, replaying one.

    pending ──2xx──▶ delivered
       │  └─other answer, no answer: attempt recorded, next_attempt_at with backoff
       └─still no 2xx `webhook_retry_hours` after retry_from──▶ failed
    delivered, failed ──replay──▶ pending (the same webhook-id; retried anew)
"""

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.backoff import Backoff
from gpu_share.coordinator.core.errors import NotFound
from gpu_share.coordinator.core.orm import WebhookAttemptRow, WebhookDeliveryRow
from gpu_share.coordinator.services.webhooks.events import OWN_URL
from gpu_share.protocol.webhooks import (
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookDeliveryDetail,
)

FIRST_RETRY_SEC = 10.0
MAX_RETRY_SEC = 3600.0
CLAIM_MARGIN_SEC = 30
ERROR_MAX = 500
PENDING = DeliveryStatus.PENDING.value


@dataclass(frozen=True)
class Claimed:
    id: str
    token: str
    owner_id: str
    url: str
    body: str
    attempts: int
    retry_from: datetime


@dataclass(frozen=True)
class Outcome:
    """One attempt: the receiver's status code, or why none came."""

    status_code: int | None
    error: str | None
    duration_ms: int

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def retry_delay(attempts: int) -> float:
    """The pause after the `attempts`-th failed try: doubling from 10 s to an hour, with the
    one backoff's jitter."""
    first = min(MAX_RETRY_SEC, FIRST_RETRY_SEC * 2 ** min(max(attempts - 1, 0), 20))
    return Backoff(first=first, cap=MAX_RETRY_SEC).next_delay()


BATCH = 50  # deliveries one replica sends at once


async def claim_due(
    session: AsyncSession, now: datetime, hold_sec: float, limit: int = BATCH
) -> list[Claimed]:
    due = (
        await session.scalars(
            select(WebhookDeliveryRow)
            .where(
                WebhookDeliveryRow.status == PENDING,
                WebhookDeliveryRow.next_attempt_at <= now,
                or_(
                    WebhookDeliveryRow.claimed_until.is_(None),
                    WebhookDeliveryRow.claimed_until < now,
                ),
            )
            .order_by(WebhookDeliveryRow.next_attempt_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    ).all()
    claimed = []
    for row in due:
        token = secrets.token_hex(8)
        done = await session.execute(
            update(WebhookDeliveryRow)
            .where(
                WebhookDeliveryRow.id == row.id,
                WebhookDeliveryRow.status == PENDING,
                or_(
                    WebhookDeliveryRow.claimed_until.is_(None),
                    WebhookDeliveryRow.claimed_until < now,
                ),
            )
            .values(
                claimed_until=now + timedelta(seconds=hold_sec + CLAIM_MARGIN_SEC),
                claim_token=token,
            )
        )
        if done.rowcount == 1:  # type: ignore[attr-defined]
            claimed.append(
                Claimed(
                    row.id, token, row.owner_id, row.url, row.body, row.attempts, row.retry_from
                )
            )
    return claimed


async def record(
    session: AsyncSession,
    claimed: Claimed,
    outcome: Outcome,
    now: datetime,
    retry_for: timedelta,
) -> DeliveryStatus | None:
    """Log the attempt and move the delivery on; None when the claim was lost meanwhile (a
    replay took it back): the attempt is logged, the state is the replay's."""
    error = outcome.error[:ERROR_MAX] if outcome.error else None
    session.add(
        WebhookAttemptRow(
            delivery_id=claimed.id,
            at=now,
            status_code=outcome.status_code,
            error=error,
            duration_ms=outcome.duration_ms,
        )
    )
    attempts = claimed.attempts + 1
    values: dict[str, object] = {
        "attempts": attempts,
        "claimed_until": None,
        "claim_token": None,
        "last_status_code": outcome.status_code,
        "last_error": error,
    }
    if outcome.delivered:
        status = DeliveryStatus.DELIVERED
        values |= {"status": status.value, "delivered_at": now}
    elif now - claimed.retry_from >= retry_for:
        status = DeliveryStatus.FAILED
        values |= {"status": status.value, "failed_at": now}
    else:
        status = DeliveryStatus.PENDING
        values["next_attempt_at"] = now + timedelta(seconds=retry_delay(attempts))
    done = await session.execute(
        update(WebhookDeliveryRow)
        .where(WebhookDeliveryRow.id == claimed.id, WebhookDeliveryRow.claim_token == claimed.token)
        .values(**values)
    )
    return status if done.rowcount == 1 else None  # type: ignore[attr-defined]


def to_wire(row: WebhookDeliveryRow) -> WebhookDelivery:
    status = DeliveryStatus(row.status)
    return WebhookDelivery(
        id=row.id,
        event_type=row.event_type,
        url=row.url,
        endpoint_id=None if row.target == OWN_URL else row.target,
        status=status,
        attempts=row.attempts,
        created_at=row.created_at,
        next_attempt_at=row.next_attempt_at if status is DeliveryStatus.PENDING else None,
        delivered_at=row.delivered_at,
        failed_at=row.failed_at,
        last_status_code=row.last_status_code,
        last_error=row.last_error,
    )


async def list_for(
    session: AsyncSession,
    owner_id: str,
    *,
    status: DeliveryStatus | None = None,
    limit: int = 100,
) -> list[WebhookDelivery]:
    """Newest first."""
    query = (
        select(WebhookDeliveryRow)
        .where(WebhookDeliveryRow.owner_id == owner_id)
        .order_by(WebhookDeliveryRow.id.desc())
        .limit(limit)
    )
    if status is not None:
        query = query.where(WebhookDeliveryRow.status == status.value)
    return [to_wire(row) for row in await session.scalars(query)]


async def _owned(session: AsyncSession, owner_id: str, delivery_id: str) -> WebhookDeliveryRow:
    row = await session.get(WebhookDeliveryRow, delivery_id)
    if row is None or row.owner_id != owner_id:
        raise NotFound(f"webhook delivery {delivery_id} not found")
    return row


async def attempts_of(
    session: AsyncSession, delivery_ids: list[str]
) -> dict[str, list[WebhookAttempt]]:
    """Each delivery's attempts, oldest first, read at once."""
    found: dict[str, list[WebhookAttempt]] = {delivery_id: [] for delivery_id in delivery_ids}
    if not delivery_ids:
        return found
    rows = await session.scalars(
        select(WebhookAttemptRow)
        .where(WebhookAttemptRow.delivery_id.in_(delivery_ids))
        .order_by(WebhookAttemptRow.at, WebhookAttemptRow.id)
    )
    for a in rows:
        found[a.delivery_id].append(
            WebhookAttempt(
                at=a.at, status_code=a.status_code, error=a.error, duration_ms=a.duration_ms
            )
        )
    return found


async def detail(session: AsyncSession, owner_id: str, delivery_id: str) -> WebhookDeliveryDetail:
    row = await _owned(session, owner_id, delivery_id)
    log = (await attempts_of(session, [row.id]))[row.id]
    return WebhookDeliveryDetail(**to_wire(row).model_dump(), body=row.body, attempt_log=log)


async def replay(
    session: AsyncSession, owner_id: str, delivery_id: str, now: datetime
) -> WebhookDelivery:
    """Send it again now, with the same webhook-id, retried anew if it fails."""
    row = await _owned(session, owner_id, delivery_id)
    await session.execute(
        update(WebhookDeliveryRow)
        .where(WebhookDeliveryRow.id == row.id)
        .values(
            status=PENDING,
            next_attempt_at=now,
            retry_from=now,
            claimed_until=None,
            claim_token=None,
            delivered_at=None,
            failed_at=None,
        )
    )
    await session.refresh(row)
    return to_wire(row)
