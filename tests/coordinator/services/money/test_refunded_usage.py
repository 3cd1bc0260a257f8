"""A tenant's usage after a refund (docs/billing.md, "Usage"), on SQLite and PostgreSQL:
a charge a refund gave back is listed as refunded, with what was given back, when and
why, and it costs nothing in what usage says was spent, per day, per runtime and in
total, in the JSON and the CSV alike; so usage agrees with the books, where the top-up
less what was spent is what the tenant holds."""

import csv
import io
from datetime import UTC, datetime, time, timedelta

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.core.orm import NodeRow, ProviderPriceRow
from gpu_share.coordinator.services.money import clawbacks, ledger
from gpu_share.protocol.money import to_micro
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, HELLO_WORLD, ProviderHandle, TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory, SimulatedAgent, done_report

RATE = 2_500_000  # 2.5 USDC per CPU-hour: 36 s cost 0.025, 72 s 0.05
REASON = "its node was caught returning wrong results (docs/trust.md)"


def to_noon(clock: FrozenClock) -> None:
    """Move the clock to the next 12:00 UTC, so that the test's charges share a UTC day."""
    now = clock.now()
    noon = datetime.combine(now.date(), time(12), tzinfo=UTC)
    clock.advance(((noon if noon >= now else noon + timedelta(days=1)) - now).total_seconds())


async def priced_agent(
    app: FastAPI, sim_agent: AgentFactory, provider: ProviderHandle, clock: FrozenClock
) -> SimulatedAgent:
    """An agent of `provider` at RATE, at noon UTC (the page tests use it too)."""
    to_noon(clock)
    agent = await sim_agent()
    replica = app.state.replica
    async with replica.db.write() as session:
        session.add(
            ProviderPriceRow(
                provider_id=provider.id,
                gpu_model="cpu",
                price_micro_per_hour=RATE,
                spot_discount_bps=5000,
                updated_at=replica.clock.now(),
            )
        )
        node = await session.get(NodeRow, agent.node_id)
        assert node is not None
        node.price_per_gpu_hour_micro = RATE
    return agent


@pytest.fixture
async def priced(
    app: FastAPI, sim_agent: AgentFactory, provider: ProviderHandle, clock: FrozenClock
) -> SimulatedAgent:
    return await priced_agent(app, sim_agent, provider, clock)


async def run_invoke(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    agent: SimulatedAgent,
    clock: FrozenClock,
    seconds: float,
) -> str:
    submitted = await client.post(
        "/v1/gpu/invoke", json={**HELLO_WORLD, "runtime": "onnx_cpu"}, headers=tenant.headers
    )
    assert submitted.status_code == 202, submitted.text
    (job,) = await agent.lease()
    await agent.client.start(job.invoke_id, job.lease_token)
    clock.advance(seconds)
    await agent.client.report(job.invoke_id, done_report(job), retry_for=0)
    await agent.heartbeat()
    return job.invoke_id


async def refund(app: FastAPI, node_id: str, invoke_id: str) -> int:
    """Refund the invoke's charge, as the trust rules do when its node is caught."""
    replica = app.state.replica
    async with replica.db.write() as session:
        (held,) = [
            c for c in await clawbacks.held_charges(session, node_id) if c.work_id == invoke_id
        ]
        return await clawbacks.refund_charge(session, held.charge_id, REASON, replica.clock.now())


async def available(app: FastAPI, tenant: TenantHandle) -> int:
    async with app.state.replica.db.read() as session:
        assert await ledger.books_total(session) == (0, 0)
        return await ledger.balance(session, ledger.tenant_balance(tenant.id))


async def test_a_refunded_charge_is_shown_refunded_and_not_counted_as_spent(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    credited = await client.post(
        f"/v1/admin/tenants/{tenant.id}/top-ups",
        json={"amount": "1", "reference": "wire-1"},
        headers=ADMIN,
    )
    assert credited.status_code == 201, credited.text
    kept = await run_invoke(client, tenant, priced, clock, 36)
    undone = await run_invoke(client, tenant, priced, clock, 72)
    refunded_at = clock.now()
    assert await refund(app, priced.node_id or "", undone) == 50_000

    today = clock.now().date().isoformat()
    by_day = (await client.get("/v1/billing/usage", headers=tenant.headers)).json()
    assert (by_day["total"], by_day["refunded"]) == ("0.025", "0.05")
    assert by_day["lines"][-1] == {
        "key": today,
        "charges": 2,
        "seconds": 108.0,
        "cost": "0.025",
        "refunded": "0.05",
    }
    assert all(line["refunded"] == "0" for line in by_day["lines"][:-1])
    by_runtime = (
        await client.get("/v1/billing/usage", params={"group": "runtime"}, headers=tenant.headers)
    ).json()
    assert by_runtime["lines"] == [
        {"key": "onnx_cpu", "charges": 2, "seconds": 108.0, "cost": "0.025", "refunded": "0.05"}
    ]
    assert (by_runtime["total"], by_runtime["refunded"]) == ("0.025", "0.05")
    # The books agree: what the top-up left is the top-up less what usage says was spent.
    assert await available(app, tenant) == 1_000_000 - to_micro(by_day["total"])

    for path, params in (("/v1/billing/usage.csv", {}), ("/v1/billing/usage", {"format": "csv"})):
        answer = await client.get(path, params=params, headers=tenant.headers)
        assert answer.status_code == 200, answer.text
        rows = {row["work_id"]: row for row in csv.DictReader(io.StringIO(answer.text))}
        assert set(rows) == {kept, undone}
        assert (rows[kept]["cost"], rows[kept]["refunded"], rows[kept]["refund_reason"]) == (
            "0.025",
            "0",
            "",
        )
        assert rows[kept]["refunded_at"] == ""
        assert (rows[undone]["cost"], rows[undone]["refunded"]) == ("0.05", "0.05")
        assert rows[undone]["refund_reason"] == REASON
        assert datetime.fromisoformat(rows[undone]["refunded_at"]) == refunded_at


async def test_a_charge_refunded_twice_is_given_back_once_and_listed_once(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    await client.post(
        f"/v1/admin/tenants/{tenant.id}/top-ups",
        json={"amount": "1", "reference": "wire-1"},
        headers=ADMIN,
    )
    undone = await run_invoke(client, tenant, priced, clock, 36)
    replica = app.state.replica
    async with replica.db.write() as session:
        (held,) = await clawbacks.held_charges(session, priced.node_id or "")
    for _ in range(2):
        async with replica.db.write() as session:
            await clawbacks.refund_charge(session, held.charge_id, REASON, replica.clock.now())
    usage = (await client.get("/v1/billing/usage", headers=tenant.headers)).json()
    assert (usage["total"], usage["refunded"], usage["lines"][-1]["charges"]) == ("0", "0.025", 1)
    rows = list(
        csv.DictReader(
            io.StringIO((await client.get("/v1/billing/usage.csv", headers=tenant.headers)).text)
        )
    )
    assert [(row["work_id"], row["refunded"]) for row in rows] == [(undone, "0.025")]
    assert await available(app, tenant) == 1_000_000
