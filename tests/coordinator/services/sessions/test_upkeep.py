"""The upkeep of sessions (`services/sessions/upkeep.py`): an open session that no
process has touched for `STALE_AFTER_SEC` fails with NODE_LOST (its process or node went
away) and tells its webhook; one touched lately, or closed already, is left alone."""

from fastapi import FastAPI
from sqlalchemy import select, update

from gpu_share.coordinator.core.orm import SessionRow, WebhookDeliveryRow
from gpu_share.coordinator.services.sessions import closing, upkeep
from gpu_share.protocol.sessions import SessionStatus
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory
from tests.coordinator.services.money.test_session_billing import open_session


async def _row(app: FastAPI, session_id: str) -> SessionRow:
    async with app.state.replica.db.read() as session:
        row: SessionRow | None = await session.get(SessionRow, session_id)
    assert row is not None
    return row


async def test_an_open_session_nobody_touches_fails_and_the_others_stay(
    app: FastAPI, tenant: TenantHandle, sim_agent: AgentFactory, clock: FrozenClock
) -> None:
    replica = app.state.replica
    node_id = (await sim_agent()).node_id
    assert node_id is not None
    lost, closed = (
        await open_session(app, tenant, node_id),
        await open_session(app, tenant, node_id),
    )
    await closing.finish(replica.db, replica.hub, closed, SessionStatus.CLOSED, clock.now())
    async with replica.db.write() as session:
        await session.execute(
            update(SessionRow)
            .where(SessionRow.id == lost)
            .values(webhook_url="https://hooks.example.com/sessions")
        )
    clock.advance(upkeep.STALE_AFTER_SEC - 1)
    fresh = await open_session(app, tenant, node_id)
    clock.advance(2)  # `lost` is past the limit, `fresh` is not

    await upkeep.maintain(replica.db, replica.hub, replica.clock, replica.settings)

    failed = await _row(app, lost)
    assert (failed.status, failed.error_code) == (SessionStatus.FAILED.value, "NODE_LOST")
    assert (await _row(app, fresh)).status == SessionStatus.READY.value
    assert (await _row(app, closed)).status == SessionStatus.CLOSED.value
    async with replica.db.read() as session:
        told = (await session.scalars(select(WebhookDeliveryRow.event_type))).all()
    assert told == ["session.closed"]  # once, for the session that had a webhook
