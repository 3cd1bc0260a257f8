"""Signed-in browsers, one row each, so a session ends on the server: signing out, or
revoking the key it signed in with, ends it on every replica from its next page on,
whoever holds a copy of its cookie.

The cookie carries a random id, sealed by the coordinator; the row is keyed by the id's
hash, so the table holds nothing a browser could present.
"""

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import ApiKeyRow, BrowserSessionRow

SESSION_HOURS = 12
KEEP_FOR = timedelta(days=1)  # after a session ended or expired: then its row goes


@dataclass(frozen=True)
class OpenSession:
    row_id: str  # names the session (forms' CSRF tokens are sealed for it); opens nothing
    key: ApiKeyRow  # the key it signed in with, unrevoked


class Closed(StrEnum):
    """Why a genuine session cookie opens nothing any more."""

    EXPIRED = "expired"  # its hours ran out (or it is so long over that its row is gone)
    ENDED = "ended"  # signed out, or the key it signed in with was revoked


def row_id(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


async def begin(session: AsyncSession, key_id: str, now: datetime) -> str:
    """A new session for the key; returns the id its cookie carries."""
    session_id = secrets.token_urlsafe(32)
    session.add(
        BrowserSessionRow(
            id=row_id(session_id),
            key_id=key_id,
            created_at=now,
            expires_at=now + timedelta(hours=SESSION_HOURS),
            ended_at=None,
        )
    )
    return session_id


async def find_open(session: AsyncSession, session_id: str, now: datetime) -> OpenSession | None:
    """The session while it is neither ended nor expired and its key is not revoked: one
    read by primary key, on every page, so no replica trusts a session longer than that."""
    found = (
        await session.execute(
            select(BrowserSessionRow.id, ApiKeyRow)
            .join(ApiKeyRow, ApiKeyRow.id == BrowserSessionRow.key_id)
            .where(
                BrowserSessionRow.id == row_id(session_id),
                BrowserSessionRow.ended_at.is_(None),
                BrowserSessionRow.expires_at > now,
                ApiKeyRow.revoked_at.is_(None),
            )
        )
    ).first()
    return OpenSession(row_id=found[0], key=found[1]) if found is not None else None


async def why_closed(session: AsyncSession, session_id: str, now: datetime) -> Closed:
    """Why a session that `find_open` did not find is over, for the sign-in page to say."""
    found = (
        await session.execute(
            select(BrowserSessionRow.ended_at, BrowserSessionRow.expires_at, ApiKeyRow.revoked_at)
            .join(ApiKeyRow, ApiKeyRow.id == BrowserSessionRow.key_id)
            .where(BrowserSessionRow.id == row_id(session_id))
        )
    ).first()
    if found is None:
        return Closed.EXPIRED
    ended_at, expires_at, revoked_at = found
    # Whichever came first: a sign-out or a revocation after the hours ran out changes
    # nothing for this browser, whose session had expired already.
    others = [moment for moment in (ended_at, revoked_at) if moment is not None]
    if expires_at <= now and all(expires_at <= moment for moment in others):
        return Closed.EXPIRED
    return Closed.ENDED


async def end(session: AsyncSession, session_id: str, now: datetime) -> None:
    await session.execute(
        update(BrowserSessionRow)
        .where(BrowserSessionRow.id == row_id(session_id), BrowserSessionRow.ended_at.is_(None))
        .values(ended_at=now)
    )


async def end_for_key(session: AsyncSession, key_id: str, now: datetime) -> int:
    """End every open session of a key (it is being revoked); how many there were."""
    done = await session.execute(
        update(BrowserSessionRow)
        .where(BrowserSessionRow.key_id == key_id, BrowserSessionRow.ended_at.is_(None))
        .values(ended_at=now)
    )
    return int(done.rowcount or 0)  # type: ignore[attr-defined]


async def sweep(session: AsyncSession, now: datetime) -> int:
    """Forget sessions that ended or expired more than `KEEP_FOR` ago."""
    done = await session.execute(
        delete(BrowserSessionRow).where(
            or_(
                BrowserSessionRow.expires_at < now - KEEP_FOR,
                BrowserSessionRow.ended_at < now - KEEP_FOR,
            )
        )
    )
    return int(done.rowcount or 0)  # type: ignore[attr-defined]
