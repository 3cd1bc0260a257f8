"""The upkeep of the sessions one process holds (`loops.session_upkeep`, every few
seconds): idle ones closed, forward counters and last use flushed, those on quarantined
nodes ended, those the balance no longer covers closed, and open sessions that no
process has touched for `STALE_AFTER_SEC` failed (their process or node went away)."""

from datetime import datetime, timedelta

from sqlalchemy import select, update

from gpu_share.coordinator.core.clock import Clock
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import NodeRow, SessionRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.statuses import OPEN_SESSION_VALUES
from gpu_share.coordinator.replica.session_hub import SessionHub
from gpu_share.coordinator.services.money import billing, session_billing
from gpu_share.coordinator.services.sessions import closing
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.sessions import SessionError, SessionStatus

STALE_AFTER_SEC = 30.0  # no replica touched an open session this long: it was lost
_QUARANTINED = SessionError(
    code=ErrorCode.NODE_QUARANTINED,
    message="ended: its node was quarantined after returning wrong results; open a new session",
)
_UNPAID = SessionError(
    code=ErrorCode.INSUFFICIENT_BALANCE,
    message="closed: the balance cannot cover the session's next hour; "
    "top up and open a new session",
)


async def maintain(db: Database, hub: SessionHub, clock: Clock, settings: Settings) -> None:
    """One round of upkeep (module doc)."""
    now = clock.now()
    await _end_quarantined(db, hub, now)
    for live in list(hub.idle()):
        idle = SessionError(
            code=ErrorCode.IDLE_TIMEOUT,
            message=f"closed after {live.idle_timeout_sec} s without a forward",
        )
        await _end(db, hub, live.id, SessionStatus.CLOSED, now, idle, "idle timeout")
    async with db.write() as session:
        for live in hub.held():
            values: dict[str, object] = {"touched_at": now}
            if live.used_since_flush:
                values["last_used_at"] = now
                live.used_since_flush = False
            if live.unflushed_forwards:
                values["forward_count"] = SessionRow.forward_count + live.unflushed_forwards
                live.unflushed_forwards = 0
            await session.execute(
                update(SessionRow).where(SessionRow.id == live.id).values(**values)
            )
        stale = (
            await session.scalars(
                select(SessionRow.id).where(
                    SessionRow.status.in_(OPEN_SESSION_VALUES),
                    SessionRow.touched_at < now - timedelta(seconds=STALE_AFTER_SEC),
                )
            )
        ).all()
        for session_id in stale:
            await closing.close_row(
                session,
                session_id,
                {
                    "status": SessionStatus.FAILED.value,
                    "closed_at": now,
                    "error_code": ErrorCode.NODE_LOST.value,
                    "error_message": "the session's coordinator or node went away",
                },
            )
    await _bill_held(db, hub, settings, now)


async def _end_quarantined(db: Database, hub: SessionHub, now: datetime) -> None:
    """Sessions held here on a node caught returning wrong results end at once, with
    NODE_QUARANTINED (docs/trust.md); the tenant pays nothing for their last interval."""
    held = {live.id: live.node_id for live in hub.held()}
    if not held:
        return
    async with db.read() as session:
        barred = set(
            (
                await session.scalars(
                    select(NodeRow.id).where(
                        NodeRow.id.in_(sorted(set(held.values()))),
                        NodeRow.quarantined_at.is_not(None),
                    )
                )
            ).all()
        )
    for session_id, node_id in held.items():
        if node_id not in barred:
            continue
        await _end(db, hub, session_id, SessionStatus.FAILED, now, _QUARANTINED, "node quarantined")


async def _bill_held(db: Database, hub: SessionHub, settings: Settings, now: datetime) -> None:
    """Charge the sessions held here as they go; close those the balance no longer
    covers (`session_billing`)."""
    if not billing.prepaid(settings):
        return
    async with db.read() as session:
        held = await session_billing.due(session, [live.id for live in hub.held()], now)
    for session_id in held:
        async with db.write() as session:
            covered = await session_billing.bill_held(session, session_id, now, settings)
        if covered:
            continue
        await _end(db, hub, session_id, SessionStatus.CLOSED, now, _UNPAID, "insufficient balance")


async def _end(
    db: Database,
    hub: SessionHub,
    session_id: str,
    status: SessionStatus,
    now: datetime,
    error: SessionError,
    reason: str,
) -> None:
    """End a session held here: its row (`closing.finish`), then its live connection."""
    await closing.finish(db, hub, session_id, status, now, error)
    await hub.close(session_id, reason, status=status)
