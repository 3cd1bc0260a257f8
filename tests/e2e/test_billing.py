"""Billing with real agent processes: an agent killed mid-job, its invoke requeued and
finished on a second agent, is charged exactly once, for its final attempt; and a
coordinator that goes away while a priced job runs, and comes back while the agent is
retrying its result, charges it exactly once too."""

import asyncio
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import (
    InvokeRow,
    LedgerTransactionRow,
    NodeRow,
    ProviderPriceRow,
)
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.money import billing, ledger
from gpu_share.testing.clock import SystemClock
from gpu_share.testing.factories import ADMIN
from gpu_share.testing.live import AGENT_START_TIMEOUT_SEC, Live, fast_settings
from gpu_share.testing.models import slow_model
from gpu_share.testing.servers import free_port, serve
from gpu_share.testing.waiting import eventually

pytestmark = pytest.mark.slow

RATE = 36_000_000  # 36 USDC per CPU-hour


async def first_node(db: Database) -> NodeRow:
    async def node() -> NodeRow | None:
        async with db.read() as session:
            return await session.scalar(select(NodeRow))

    registered = await eventually(
        node, what="the agent registered", timeout=AGENT_START_TIMEOUT_SEC
    )
    assert registered is not None
    return registered


async def price_the_node(db: Database, rate: int) -> NodeRow:
    node = await first_node(db)
    async with db.write() as session:
        session.add(
            ProviderPriceRow(
                provider_id=node.provider_id,
                gpu_model="cpu",
                price_micro_per_hour=rate,
                spot_discount_bps=5000,
                updated_at=SystemClock().now(),
            )
        )
        row = await session.get(NodeRow, node.id)
        assert row is not None
        row.price_per_gpu_hour_micro = rate
    return node


async def test_a_coordinator_restart_mid_job_charges_the_invoke_once(
    settings: Settings, tmp_path: Path
) -> None:
    fast_settings(settings)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    db = Database(settings.database_url)
    try:
        async with (
            serve(create_app(settings, clock=SystemClock()), port=port),
            httpx.AsyncClient(base_url=base_url, headers=ADMIN, timeout=30) as http,
        ):
            live = Live(base_url, http, tmp_path)
            await live.setup()
            agent = live.agent()
            await price_the_node(db, RATE)
            tenant_id = (await http.get("/v1/billing/balance", headers=live.tenant_headers)).json()[
                "tenant_id"
            ]
            topped = await http.post(
                f"/v1/admin/tenants/{tenant_id}/top-ups", json={"amount": "5", "reference": "r"}
            )
            assert topped.status_code == 201, topped.text
            model_url = await live.upload(slow_model(3_000_000), "model")
            invoke_id = await live.invoke(model_url=model_url)
            await live.wait_for(invoke_id, lambda s: s["status"] == "running")
        # Gone while the job runs, and long enough that it finishes meanwhile: the agent
        # holds its result and retries until the coordinator is back.
        await asyncio.sleep(4.0)
        try:
            async with (
                serve(create_app(settings, clock=SystemClock()), port=port),
                httpx.AsyncClient(base_url=base_url, headers=ADMIN, timeout=30) as http,
            ):
                live.http = http
                state = await live.finished(invoke_id, timeout=90)
                assert (state["status"], state["attempts"]) == ("done", 1), state
                assert state["cost"] not in (None, "0")
        finally:
            await asyncio.to_thread(agent.stop)
        async with db.read() as session:
            causes = (
                await session.scalars(
                    select(LedgerTransactionRow.kind).where(
                        LedgerTransactionRow.cause.like(f"invoke:{invoke_id}:%")
                    )
                )
            ).all()
            invoke = await session.get(InvokeRow, invoke_id)
            available = await ledger.balance(session, ledger.tenant_balance(tenant_id))
            books = await ledger.books_total(session)
        assert sorted(causes) == ["charge", "reserve"]
        assert invoke is not None and invoke.cost_micro is not None and invoke.cost_micro > 0
        assert available == 5_000_000 - invoke.cost_micro
        assert books == (0, 0)
    finally:
        await db.dispose()


async def test_a_requeued_invoke_is_charged_once_after_its_agent_is_killed(
    live: Live, settings: Settings
) -> None:
    db = Database(settings.database_url)
    try:
        first = live.agent("first")
        await price_the_node(db, RATE)
        tenant_id = (
            await live.http.get("/v1/billing/balance", headers=live.tenant_headers)
        ).json()["tenant_id"]
        topped = await live.http.post(
            f"/v1/admin/tenants/{tenant_id}/top-ups",
            json={"amount": "5", "reference": "e2e"},
            headers=ADMIN,
        )
        assert topped.status_code == 201, topped.text

        model_url = await live.upload(slow_model(4_000_000), "model")
        invoke_id = await live.invoke(model_url=model_url)  # timeout_sec 120: 1.2 USDC held
        running = await live.wait_for(invoke_id, lambda s: s["status"] == "running")
        balance = (await live.http.get("/v1/billing/balance", headers=live.tenant_headers)).json()
        assert (balance["available"], balance["reserved"]) == ("3.8", "1.2")
        first.kill()
        live.agent("second")
        state = await live.finished(invoke_id, timeout=90)
        assert (state["status"], state["attempts"]) == ("done", 2), state
        assert state["node_id"] != running["node_id"]

        async with db.read() as session:
            invoke = await session.get(InvokeRow, invoke_id)
            assert invoke is not None and invoke.started_at and invoke.finished_at
            elapsed = invoke.finished_at - invoke.started_at
            expected = billing.metered(RATE, int(elapsed.total_seconds() * 1000))
            settled = (
                await session.scalars(
                    select(LedgerTransactionRow).where(
                        LedgerTransactionRow.cause.like(f"invoke:{invoke_id}:%")
                    )
                )
            ).all()
            charges = await session.scalar(
                select(func.count()).where(LedgerTransactionRow.kind == "charge")
            )
            available = await ledger.balance(session, ledger.tenant_balance(tenant_id))
            reserved = await ledger.balance(session, ledger.tenant_reserved(tenant_id))
            books = await ledger.books_total(session)
        assert sorted(t.kind for t in settled) == ["charge", "reserve"]
        assert charges == 1
        (charge,) = [t for t in settled if t.kind == "charge"]
        assert charge.details["node_id"] == state["node_id"]  # the final attempt's node
        assert charge.details["cost_micro"] == expected == invoke.cost_micro
        assert expected > 0
        assert (available, reserved) == (5_000_000 - expected, 0)
        assert books == (0, 0)
    finally:
        await db.dispose()
