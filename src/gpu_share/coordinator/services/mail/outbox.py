"""Mail that is never lost: written to the outbox in the transaction of the decision that
causes it, delivered later by a loop (`loops/mail_delivery.py`) with retries.

Each mail has a cause ("papp_…:approved"); the same cause never queues a second mail.
Delivery claims a mail for a while (a guarded UPDATE), sends it outside any
transaction, then marks it sent with the claim's token; a replica that dies mid-send
leaves the claim to expire and the mail is sent again (at least once; the
Message-ID lets a receiver drop the duplicate). A mail that fails for now is tried
again with backoff; one that cannot be built, is refused for good, or still fails
`GIVE_UP_AFTER` after it was queued is marked failed with its reason, for an admin.
"""

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import OutboxMailRow
from gpu_share.coordinator.services.mail.headers import header_text
from gpu_share.protocol.outbox import OutboxMail, OutboxState

CLAIM_SEC = 120
FIRST_RETRY_SEC = 30
MAX_RETRY_SEC = 3600
GIVE_UP_AFTER = timedelta(days=2)  # of failing for now: the mail is failed, not lost
ERROR_MAX = 2000


@dataclass(frozen=True)
class Mail:
    to: str
    subject: str
    body: str


async def enqueue(session: AsyncSession, cause: str, mail: Mail, now: datetime) -> None:
    """Queue `mail` unless `cause` already queued one (a retried decision mails once).

    The subject is cleaned here whoever wrote it; the recipient is kept as given (a
    changed address is a different person) and checked when the mail is built."""
    known = await session.scalar(select(OutboxMailRow.id).where(OutboxMailRow.cause == cause))
    if known is not None:
        return
    session.add(
        OutboxMailRow(
            id=new_id("mail"),
            cause=cause,
            # too long to be an address; kept unusable rather than cut into another one
            to_address=mail.to if len(mail.to) <= 254 else mail.to[:250] + " …",
            subject=header_text(mail.subject),
            body=mail.body,
            created_at=now,
            attempts=0,
            next_attempt_at=now,
        )
    )
    await session.flush()


@dataclass(frozen=True)
class Claimed:
    id: str
    token: str
    to: str
    subject: str
    body: str
    attempts: int
    created_at: datetime


async def claim_due(session: AsyncSession, now: datetime, limit: int = 20) -> list[Claimed]:
    """Take up to `limit` mails that are due and not held by another sender."""
    due = (
        await session.scalars(
            select(OutboxMailRow)
            .where(
                OutboxMailRow.sent_at.is_(None),
                OutboxMailRow.failed_at.is_(None),
                OutboxMailRow.next_attempt_at <= now,
                or_(OutboxMailRow.claimed_until.is_(None), OutboxMailRow.claimed_until < now),
            )
            .order_by(OutboxMailRow.next_attempt_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    ).all()
    claimed = []
    for row in due:
        token = secrets.token_hex(8)
        done = await session.execute(
            update(OutboxMailRow)
            .where(OutboxMailRow.id == row.id, OutboxMailRow.sent_at.is_(None))
            .values(claimed_until=now + timedelta(seconds=CLAIM_SEC), claim_token=token)
        )
        if done.rowcount == 1:  # type: ignore[attr-defined]
            claimed.append(
                Claimed(
                    row.id,
                    token,
                    row.to_address,
                    row.subject,
                    row.body,
                    row.attempts,
                    row.created_at,
                )
            )
    return claimed


async def mark_sent(session: AsyncSession, mail: Claimed, now: datetime) -> None:
    await session.execute(
        update(OutboxMailRow)
        .where(OutboxMailRow.id == mail.id, OutboxMailRow.claim_token == mail.token)
        .values(sent_at=now, attempts=mail.attempts + 1, claimed_until=None, last_error=None)
    )


async def mark_failed(
    session: AsyncSession, mail: Claimed, error: str, now: datetime, *, for_good: bool
) -> bool:
    """Record an attempt that failed; True when the mail is given up (failed, with `error`),
    False when it is tried again later (with backoff)."""
    given_up = for_good or now - mail.created_at >= GIVE_UP_AFTER
    if given_up and not for_good:
        error = f"gave up after {mail.attempts + 1} attempts in {now - mail.created_at}: {error}"
    delay = min(MAX_RETRY_SEC, FIRST_RETRY_SEC * 2**mail.attempts)
    await session.execute(
        update(OutboxMailRow)
        .where(OutboxMailRow.id == mail.id, OutboxMailRow.claim_token == mail.token)
        .values(
            attempts=mail.attempts + 1,
            next_attempt_at=now + timedelta(seconds=delay),
            claimed_until=None,
            last_error=error[:ERROR_MAX],
            failed_at=now if given_up else None,
        )
    )
    return given_up


def to_wire(row: OutboxMailRow) -> OutboxMail:
    return OutboxMail(
        id=row.id,
        cause=row.cause,
        to=row.to_address,
        subject=row.subject,
        body=row.body,
        created_at=row.created_at,
        attempts=row.attempts,
        next_attempt_at=None if row.sent_at or row.failed_at else row.next_attempt_at,
        sent_at=row.sent_at,
        failed_at=row.failed_at,
        last_error=row.last_error,
    )


async def list_mails(
    session: AsyncSession, *, state: OutboxState | None = None, limit: int = 100
) -> list[OutboxMail]:
    """Newest first; `state` keeps the mails waiting to go, or those given up."""
    query = select(OutboxMailRow).order_by(OutboxMailRow.id.desc()).limit(limit)
    if state is OutboxState.WAITING:
        query = query.where(OutboxMailRow.sent_at.is_(None), OutboxMailRow.failed_at.is_(None))
    elif state is OutboxState.FAILED:
        query = query.where(OutboxMailRow.failed_at.is_not(None))
    return [to_wire(row) for row in (await session.scalars(query)).all()]
