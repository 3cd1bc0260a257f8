"""A dedicated reservation is not charged for the time its node was offline
(docs/billing.md#dedicated-reservations): pro rata by 5-minute presence bucket, rounded
down, with the provider's share split from what is charged and the books balanced."""

from datetime import timedelta
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import select

from gpu_share.coordinator.core.orm import LedgerTransactionRow
from gpu_share.coordinator.loops import reservations as reservation_loop
from gpu_share.coordinator.services.money import ledger
from gpu_share.coordinator.services.nodes.presence import BUCKET_SEC
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ProviderHandle, TenantHandle
from gpu_share.testing.rentals import Rentals
from gpu_share.testing.simulated_agent import SimulatedAgent
from tests.coordinator.services.rentals.test_reservations import books_sum_to_zero, stay_online

COMMISSION = 0.15  # the default commission: 15 %


def to_bucket_start(clock: FrozenClock) -> None:
    """Move the clock to the next presence bucket's start, so shares are whole buckets."""
    clock.advance(-int(clock.now().timestamp()) % BUCKET_SEC)


async def node_at_a_bucket_start(rentals: Rentals, clock: FrozenClock) -> SimulatedAgent:
    to_bucket_start(clock)
    return await rentals.node(count=1)


async def settlement(app: FastAPI, reservation_id: str) -> list[tuple[str, dict[str, Any]]]:
    async with app.state.replica.db.read() as session:
        rows = await session.execute(
            select(LedgerTransactionRow.kind, LedgerTransactionRow.details).where(
                LedgerTransactionRow.cause == f"reservation:{reservation_id}:settle"
            )
        )
        return [(kind, details) for kind, details in rows]


async def provider_and_commission(app: FastAPI, provider: ProviderHandle) -> tuple[int, int]:
    async with app.state.replica.db.read() as session:
        return (
            await ledger.balance(session, ledger.provider_held(provider.id)),
            await ledger.balance(session, ledger.COMMISSION),
        )


async def end(app: FastAPI) -> None:
    assert (await reservation_loop.run_once(app.state.replica)).ended == 1
    assert (await reservation_loop.run_once(app.state.replica)).ended == 0  # once


async def test_a_node_there_throughout_is_charged_the_whole_period(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await rentals.node(count=1)  # not at a bucket's start
    await rentals.top_up(tenant, "10")
    made = await rentals.book(tenant, agent, hours=2)
    await stay_online(agent, clock, 2 * 3600)
    await end(app)

    got = (await client.get(f"/v1/reservations/{made['id']}", headers=tenant.headers)).json()
    assert (got["status"], got["cost"], got["credited"]) == ("ended", "4", "0")
    assert await rentals.balances(tenant) == (6_000_000, 0)
    [(kind, details)] = await settlement(app, made["id"])
    assert kind == "charge"
    assert (details["cost_micro"], details["downtime_seconds"]) == (4_000_000, 0)
    assert details["seconds"] == 2 * 3600
    assert await provider_and_commission(app, provider) == (3_400_000, 600_000)
    await books_sum_to_zero(app)


async def test_a_node_absent_for_half_an_hour_is_charged_that_share_less(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await node_at_a_bucket_start(rentals, clock)
    await rentals.top_up(tenant, "10")
    made = await rentals.book(tenant, agent, hours=2)
    assert made["cost"] == "4" and made["credited"] is None  # not settled yet
    await stay_online(agent, clock, 25 * 60)  # beats up to minute 25: buckets 0–5 present
    clock.advance(35 * 60)  # silent: buckets 6–11 (minutes 30 to 60) stay empty
    await stay_online(agent, clock, 60 * 60)  # beats again from minute 60 on
    await end(app)

    got = (await client.get(f"/v1/reservations/{made['id']}", headers=tenant.headers)).json()
    assert (got["status"], got["cost"], got["credited"]) == ("ended", "3", "1")  # 1.5 h of 2
    assert await rentals.balances(tenant) == (7_000_000, 0)
    [(kind, details)] = await settlement(app, made["id"])
    assert kind == "charge"
    assert (details["cost_micro"], details["downtime_seconds"]) == (3_000_000, 1800)
    assert details["seconds"] == 90 * 60  # the time the node was there
    assert details["provider_micro"] + details["commission_micro"] == 3_000_000
    assert await provider_and_commission(app, provider) == (2_550_000, 450_000)
    await books_sum_to_zero(app)


async def test_a_node_that_never_came_costs_nothing_and_the_reserve_returns(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await rentals.node(count=1)
    await rentals.top_up(tenant, "10")
    start = (clock.now() + timedelta(hours=1)).replace(second=0, microsecond=0)
    made = await rentals.book(tenant, agent, starts_at=start.isoformat(), hours=2)
    assert await rentals.balances(tenant) == (6_000_000, 4_000_000)
    clock.advance(3 * 3600 + 60)  # the node goes quiet before the start and stays away
    await end(app)

    got = (await client.get(f"/v1/reservations/{made['id']}", headers=tenant.headers)).json()
    assert (got["status"], got["cost"], got["credited"]) == ("ended", "0", "4")
    assert await rentals.balances(tenant) == (10_000_000, 0)  # all of it back
    [(kind, details)] = await settlement(app, made["id"])
    assert kind == "release" and details["downtime_seconds"] == 2 * 3600
    assert await provider_and_commission(app, provider) == (0, 0)
    await books_sum_to_zero(app)


async def test_a_cancel_after_the_node_fell_silent_is_charged_less_rounded_down(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await node_at_a_bucket_start(rentals, clock)
    await rentals.top_up(tenant, "10")
    made = await rentals.book(tenant, agent, hours=2)
    await stay_online(agent, clock, 10 * 60)  # last beat at minute 10: buckets 0–2 present
    clock.advance(22 * 60)  # minute 32: silent over 5 minutes, so the open bucket is absent
    canceled = await client.post(f"/v1/reservations/{made['id']}/cancel", headers=tenant.headers)
    assert canceled.status_code == 200, canceled.text

    # The hour begun, less 15 min of empty buckets and the 2 min of the open one:
    # 2 USDC × (3600 − 1020) s / 3600 s = 1.4333333… → 1.433333 USDC.
    assert (canceled.json()["cost"], canceled.json()["credited"]) == ("1.433333", "0.566667")
    assert await rentals.balances(tenant) == (10_000_000 - 1_433_333, 0)
    [(kind, details)] = await settlement(app, made["id"])
    assert kind == "charge"
    assert (details["cost_micro"], details["downtime_seconds"]) == (1_433_333, 1020)
    assert details["provider_micro"] + details["commission_micro"] == 1_433_333
    await books_sum_to_zero(app)


async def test_the_bucket_still_open_at_a_cancel_counts_while_the_node_is_online(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await node_at_a_bucket_start(rentals, clock)
    await rentals.top_up(tenant, "10")
    made = await rentals.book(tenant, agent, hours=2)
    await stay_online(agent, clock, 25 * 60)
    clock.advance(280)
    await agent.heartbeat()  # minute 29:40, the last beat of bucket 5
    clock.advance(40)  # minute 30:20: bucket 6 is open and has no beat yet
    canceled = await client.post(f"/v1/reservations/{made['id']}/cancel", headers=tenant.headers)
    assert canceled.status_code == 200, canceled.text
    assert (canceled.json()["cost"], canceled.json()["credited"]) == ("2", "0")
    [(_, details)] = await settlement(app, made["id"])
    assert details["downtime_seconds"] == 0
    await books_sum_to_zero(app)
