"""Sessions are charged for the time they are held, as they go (docs/billing.md)."""

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.core.errors import InsufficientBalance
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import NodeRow, SessionRow
from gpu_share.coordinator.services.money import ledger, session_billing
from gpu_share.coordinator.services.sessions import closing
from gpu_share.coordinator.services.sessions.sessions import to_wire
from gpu_share.protocol.sessions import SessionError, SessionStatus
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ProviderHandle, TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory, SimulatedAgent
from tests.coordinator.services.money.test_billing import RATE, balances, set_price, top_up

HOUR = RATE  # what an hour at 2.5 USDC/h reserves


@pytest.fixture
async def priced(app: FastAPI, sim_agent: AgentFactory, provider: ProviderHandle) -> SimulatedAgent:
    agent = await sim_agent()
    await set_price(app, agent, provider, RATE)
    return agent


async def open_session(app: FastAPI, tenant: TenantHandle, node_id: str) -> str:
    replica = app.state.replica
    now = replica.clock.now()
    async with replica.db.write() as session:
        node = await session.get(NodeRow, node_id)
        assert node is not None
        row = SessionRow(
            id=new_id("ses"),
            tenant_id=tenant.id,
            node_id=node_id,
            status=SessionStatus.READY.value,
            runtime="onnx_cpu",
            model_url="https://example.com/model.onnx",
            idle_timeout_sec=300,
            max_concurrency=1,
            reserved_mb=100,
            created_at=now,
            ready_at=now,
            touched_at=now,
            forward_count=0,
        )
        await session_billing.open_billing(session, row, node, replica.settings, now)
        session.add(row)
    return row.id


async def test_a_session_is_charged_as_it_goes_and_settled_at_close(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    replica = app.state.replica
    await top_up(client, tenant, "10")
    assert priced.node_id is not None
    session_id = await open_session(app, tenant, priced.node_id)
    assert (await balances(app, tenant, provider))["reserved"] == HOUR
    clock.advance(90)
    async with replica.db.write() as session:
        assert await session_billing.bill_held(session, session_id, clock.now(), replica.settings)
        again = await session_billing.bill_held(session, session_id, clock.now(), replica.settings)
        assert again  # the same interval is not billed twice
    assert (await balances(app, tenant, provider))["reserved"] == HOUR - 62_500
    clock.advance(30)
    await closing.finish(replica.db, replica.hub, session_id, SessionStatus.CLOSED, clock.now())
    cost = RATE * 120 // 3600  # 83_333 over the whole 120 s held
    assert await balances(app, tenant, provider) == {
        "available": 10_000_000 - cost,
        "reserved": 0,
        "provider": cost - 62_500 * 1500 // 10_000 - (cost - 62_500) * 1500 // 10_000,
        "commission": 62_500 * 1500 // 10_000 + (cost - 62_500) * 1500 // 10_000,
    }
    async with replica.db.read() as session:
        row = await session.get(SessionRow, session_id)
        assert row is not None
        assert (to_wire(row).cost, to_wire(row).rate_per_hour) == ("0.083333", "2.5")
        assert await ledger.books_total(session) == (0, 0)


async def test_a_session_the_balance_cannot_cover_is_refused_or_stopped(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    replica = app.state.replica
    assert priced.node_id is not None
    await top_up(client, tenant, "2.4")
    with pytest.raises(InsufficientBalance, match=r"2\.4 USDC"):
        await open_session(app, tenant, priced.node_id)
    await top_up(client, tenant, "0.1", "second")
    session_id = await open_session(app, tenant, priced.node_id)  # the whole balance
    clock.advance(1801)  # less than half an hour left in reserve, none to add
    async with replica.db.write() as session:
        covered = await session_billing.bill_held(
            session, session_id, clock.now(), replica.settings
        )
    assert not covered
    error = SessionError(code="INSUFFICIENT_BALANCE", message="no balance")
    await closing.finish(
        replica.db, replica.hub, session_id, SessionStatus.CLOSED, clock.now(), error
    )
    held = await balances(app, tenant, provider)
    assert held["reserved"] == 0
    assert held["available"] == 2_500_000 - RATE * 1801 // 3600


async def test_a_session_lost_on_the_provider_side_pays_nothing_for_its_last_interval(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    replica = app.state.replica
    assert priced.node_id is not None
    await top_up(client, tenant, "10")
    session_id = await open_session(app, tenant, priced.node_id)
    clock.advance(600)
    lost = SessionError(code="NODE_LOST", message="gone")
    await closing.finish(
        replica.db, replica.hub, session_id, SessionStatus.FAILED, clock.now(), lost
    )
    assert await balances(app, tenant, provider) == {
        "available": 10_000_000,
        "reserved": 0,
        "provider": 0,
        "commission": 0,
    }
