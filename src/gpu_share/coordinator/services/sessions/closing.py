"""How a session ends (SPEC §1.7): its row closed once (only an open session closes),
what it cost settled (`session_billing.settle`) and its webhook told, all in one
transaction; and the webhook of any change of a session (`tell`), written in the
transaction of that change."""

from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import SessionRow
from gpu_share.coordinator.core.statuses import OPEN_SESSION_VALUES
from gpu_share.coordinator.replica.session_hub import SessionHub
from gpu_share.coordinator.services.money import session_billing
from gpu_share.coordinator.services.webhooks import events
from gpu_share.protocol.sessions import SessionError, SessionStatus


async def finish(
    db: Database,
    hub: SessionHub,
    session_id: str,
    status: SessionStatus,
    now: datetime,
    error: SessionError | None = None,
) -> None:
    """End the session as `status` (with `error`), counting the forwards the hub holding
    it has not flushed yet. The live session itself is the caller's to close."""
    live = hub.get(session_id)
    values: dict[str, object] = {"status": status.value, "closed_at": now, "touched_at": now}
    if live is not None and live.unflushed_forwards:
        values["forward_count"] = SessionRow.forward_count + live.unflushed_forwards
        live.unflushed_forwards = 0
    if error is not None:
        values.update(error_code=error.code, error_message=error.message)
    async with db.write() as session:
        await close_row(session, session_id, values)


async def close_row(session: AsyncSession, session_id: str, values: dict[str, object]) -> None:
    """Close an open session's row with `values` and settle what it cost, in `session`'s
    transaction; a session closed already is left as it is."""
    closed = (
        await session.execute(
            update(SessionRow)
            .where(SessionRow.id == session_id, SessionRow.status.in_(OPEN_SESSION_VALUES))
            .values(**values)
            .returning(SessionRow.tenant_id, SessionRow.webhook_url)
        )
    ).one_or_none()
    if closed is None:
        return
    await session_billing.settle(session, session_id)
    if closed.webhook_url:
        code = values.get("error_code")
        data = {
            "status": values["status"],
            "error": {"code": code, "message": values.get("error_message")} if code else None,
        }
        now = values["closed_at"]
        assert isinstance(now, datetime)
        await tell(session, session_id, closed, "session.closed", data, now)


async def tell(
    session: AsyncSession,
    session_id: str,
    row: Any,
    event_type: str,
    data: dict[str, object],
    now: datetime,
) -> None:
    """The session's webhook (`row`: its tenant_id and webhook_url), in the transaction of
    its change (`webhooks.events`)."""
    await events.emit(
        session,
        owner_id=row.tenant_id,
        event_type=event_type,
        data={"id": session_id, **data},
        cause=f"{session_id}:{event_type}",
        now=now,
        url=row.webhook_url,
    )
