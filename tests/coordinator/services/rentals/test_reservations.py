"""Dedicated reservations (SPEC §4.3; docs/placement.md, docs/billing.md): quote, reserve,
the loop's start and end, cancel, and every refusal changing nothing."""

import asyncio
from datetime import timedelta
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import func, select

from gpu_share.coordinator.core.orm import LedgerTransactionRow, NodeRow
from gpu_share.coordinator.loops import reservations as reservation_loop
from gpu_share.coordinator.services.money import ledger
from gpu_share.coordinator.services.nodes.presence import BUCKET_SEC
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ProviderHandle, TenantHandle
from gpu_share.testing.rentals import Rentals
from gpu_share.testing.simulated_agent import SimulatedAgent


async def books_sum_to_zero(app: FastAPI) -> None:
    async with app.state.replica.db.read() as session:
        assert await ledger.books_total(session) == (0, 0)


async def stay_online(agent: SimulatedAgent, clock: FrozenClock, seconds: int) -> None:
    """Move the clock on by `seconds`, the agent beating now and after every 5 minutes of
    it, so each presence bucket passed has a beat (a reservation's node was there)."""
    await agent.heartbeat()
    while seconds > 0:
        step = min(BUCKET_SEC, seconds)
        clock.advance(step)
        await agent.heartbeat()
        seconds -= step


async def test_quote_is_the_price_reserve_holds_it_and_the_end_charges_it(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await rentals.node(count=2)
    await rentals.top_up(tenant, "20")
    body = {"node_id": agent.node_id, "gpus": 2, "hours": 3}
    quoted = await client.post("/v1/reservations/quote", json=body, headers=tenant.headers)
    assert quoted.status_code == 200, quoted.text
    assert quoted.json()["cost"] == "12"  # 2 USDC × 2 GPUs × 3 h
    assert quoted.json()["covered"] is True
    assert await rentals.balances(tenant) == (20_000_000, 0)  # a quote holds nothing

    created = await rentals.reserve(tenant, **body)
    assert created.status_code == 201, created.text
    made = created.json()
    assert made["cost"] == quoted.json()["cost"] and made["status"] == "active"
    assert sorted(made["gpu_indices"]) == [0, 1]
    assert await rentals.balances(tenant) == (8_000_000, 12_000_000)

    await stay_online(agent, clock, 3 * 3600)
    report = await reservation_loop.run_once(app.state.replica)
    assert report.ended == 1
    again = await reservation_loop.run_once(app.state.replica)
    assert again.ended == 0  # idempotent
    got = await client.get(f"/v1/reservations/{made['id']}", headers=tenant.headers)
    assert got.json()["status"] == "ended"
    assert (got.json()["cost"], got.json()["credited"]) == ("12", "0")  # there throughout
    assert await rentals.balances(tenant) == (8_000_000, 0)
    async with app.state.replica.db.read() as session:
        held = await ledger.balance(session, ledger.provider_held(provider.id))
        commission = await ledger.balance(session, ledger.COMMISSION)
        charges = await session.scalar(
            select(func.count()).where(
                LedgerTransactionRow.cause == f"reservation:{made['id']}:settle"
            )
        )
    assert held + commission == 12_000_000 and commission == 1_800_000
    assert charges == 1
    usage = await client.get("/v1/billing/usage.csv", headers=tenant.headers)
    assert "reservation" in usage.text
    earned = await client.get(
        "/v1/provider/earnings", headers={"Authorization": f"Bearer {provider.key}"}
    )
    assert earned.status_code == 200, earned.text
    history = earned.json()["history"]
    assert [(h["work"], h["amount"], h["gpus"]) for h in history] == [("reservation", "10.2", 2)]
    await books_sum_to_zero(app)


async def test_a_later_reservation_is_pending_until_the_loop_starts_it(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await rentals.node(count=1)
    await rentals.top_up(tenant, "10")
    start = (clock.now() + timedelta(hours=2)).replace(second=0, microsecond=0)
    created = await rentals.reserve(
        tenant,
        node_id=agent.node_id,
        starts_at=start.isoformat(),
        ends_at=(start + timedelta(hours=1)).isoformat(),
    )
    assert created.status_code == 201, created.text
    assert created.json()["status"] == "pending" and created.json()["cost"] == "2"
    clock.advance(2 * 3600 + 60)
    report = await reservation_loop.run_once(app.state.replica)
    assert report.activated == 1
    listed = await client.get("/v1/reservations", headers=tenant.headers)
    assert [r["status"] for r in listed.json()["items"]] == ["active"]


async def test_cancel_before_the_start_is_free_after_it_charges_hours_begun(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await rentals.node(count=2)
    await rentals.top_up(tenant, "50")
    later = (clock.now() + timedelta(hours=2)).replace(second=0, microsecond=0)
    first = await rentals.reserve(
        tenant, node_id=agent.node_id, starts_at=later.isoformat(), hours=5, gpus=2
    )
    now = await rentals.reserve(tenant, node_id=agent.node_id, hours=10, gpus=1)
    assert first.status_code == 201 and now.status_code == 409, now.text  # both GPUs, from later on
    now = await client.post(
        "/v1/reservations",
        json={"node_id": agent.node_id, "hours": 1, "gpus": 2},
        headers=tenant.headers,
    )
    assert now.status_code == 201, now.text  # 1 h from now ends before the other starts
    assert await rentals.balances(tenant) == (50_000_000 - 20_000_000 - 4_000_000, 24_000_000)

    canceled = await client.post(
        f"/v1/reservations/{first.json()['id']}/cancel", headers=tenant.headers
    )
    assert canceled.status_code == 200 and canceled.json()["cost"] == "0"
    assert await rentals.balances(tenant) == (46_000_000, 4_000_000)

    await stay_online(agent, clock, 600)
    canceled = await client.post(
        f"/v1/reservations/{now.json()['id']}/cancel", headers=tenant.headers
    )
    assert canceled.status_code == 200
    assert canceled.json()["status"] == "canceled" and canceled.json()["cost"] == "4"
    twice = await client.post(f"/v1/reservations/{now.json()['id']}/cancel", headers=tenant.headers)
    assert twice.status_code == 409 and "already canceled" in twice.json()["error"]["message"]
    assert await rentals.balances(tenant) == (46_000_000, 0)
    await books_sum_to_zero(app)


async def test_bad_requests_are_refused_and_change_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await rentals.node(count=2)
    await rentals.top_up(tenant, "5")
    node = agent.node_id
    now = clock.now().replace(second=0, microsecond=0)

    async def refused(status: int, code: str, words: str, **body: Any) -> None:
        answer = await rentals.reserve(tenant, **body)
        assert answer.status_code == status, answer.text
        assert answer.json()["error"]["code"] == code
        assert words in answer.json()["error"]["message"]

    await refused(
        422,
        "VALIDATION_ERROR",
        "must be after",
        node_id=node,
        starts_at=(now + timedelta(hours=2)).isoformat(),
        ends_at=(now + timedelta(hours=1)).isoformat(),
    )
    await refused(
        422,
        "VALIDATION_ERROR",
        "in the past",
        node_id=node,
        starts_at=(now - timedelta(hours=2)).isoformat(),
        hours=1,
    )
    await refused(422, "VALIDATION_ERROR", "less than or equal to 720", node_id=node, hours=721)
    await refused(
        422,
        "VALIDATION_ERROR",
        "whole hours",
        node_id=node,
        starts_at=(now + timedelta(hours=1)).isoformat(),
        ends_at=(now + timedelta(hours=2, minutes=30)).isoformat(),
    )
    await refused(
        422, "VALIDATION_ERROR", "fewer than 3 listed GPUs", node_id=node, gpus=3, hours=1
    )
    await refused(503, "NO_CAPACITY", "the closest has 2 GPUs. Ask for 2 GPUs", gpus=3, hours=1)
    await refused(402, "INSUFFICIENT_BALANCE", "top up", node_id=node, gpus=2, hours=2)
    await refused(
        404, "NOT_FOUND", "does not exist", node_id="nod_00000000000000000000000000", hours=1
    )
    assert await rentals.balances(tenant) == (5_000_000, 0)

    mine = await rentals.reserve(tenant, node_id=node, hours=1)
    assert mine.status_code == 201
    theirs = await client.get(f"/v1/reservations/{mine.json()['id']}", headers=other_tenant.headers)
    assert theirs.status_code == 404
    cancel = await client.post(
        f"/v1/reservations/{mine.json()['id']}/cancel", headers=other_tenant.headers
    )
    assert cancel.status_code == 404

    clock.advance(600)  # the node falls silent
    await refused(503, "NO_CAPACITY", "offline", node_id=node, hours=1)
    await books_sum_to_zero(app)


async def test_outside_the_providers_windows_is_refused(
    app: FastAPI,
    tenant: TenantHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await rentals.node(count=1)
    now = clock.now()
    hour = now.hour
    window = {
        "always": False,
        "timezone": "UTC",
        "windows": [
            {
                "days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
                "start": f"{hour:02d}:00",
                "end": f"{min(hour + 2, 24):02d}:00",
            }
        ],
    }
    async with app.state.replica.db.write() as session:
        node = await session.get(NodeRow, agent.node_id)
        assert node is not None
        node.availability = window
    answer = await rentals.reserve(tenant, node_id=agent.node_id, hours=5)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["details"]["constraint"] == "availability window"


async def test_two_overlapping_reservations_at_once_one_wins(
    app: FastAPI,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    rentals: Rentals,
) -> None:
    agent = await rentals.node(count=1)
    await rentals.top_up(tenant, "10")
    await rentals.top_up(other_tenant, "10")
    answers = await asyncio.gather(
        rentals.reserve(tenant, node_id=agent.node_id, hours=2),
        rentals.reserve(other_tenant, node_id=agent.node_id, hours=2),
    )
    assert sorted(a.status_code for a in answers) == [201, 409], [a.text for a in answers]
    held = [(await rentals.balances(someone))[1] for someone in (tenant, other_tenant)]
    assert sum(held) == 4_000_000
    await books_sum_to_zero(app)
