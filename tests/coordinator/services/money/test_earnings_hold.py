"""Earnings held until they can be trusted (SPEC §3.8; docs/payouts.md, "The hold") on
SQLite and PostgreSQL: a charge lands in held, payouts never take it before its hold,
the release moves it to payable exactly once however often and however concurrently
it runs, verified Enterprise hardware gets the shorter hold, and the provider's
earnings say what is held until when and what is payable."""

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import ColumnElement, func, select

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import (
    EarningsHoldRow,
    LedgerTransactionRow,
    NodeRow,
    PayoutRow,
    ProviderRow,
)
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.loops import earnings_hold as release_loop
from gpu_share.coordinator.loops import payouts as payout_loop
from gpu_share.coordinator.services.money import clawbacks, earnings_hold, ledger
from gpu_share.coordinator.services.money.earnings_hold import Hold, HoldPolicy
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.earnings import move_to, post_charge
from gpu_share.testing.factories import ProviderHandle, TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory, SimulatedAgent
from tests.coordinator.services.money.test_billing import (
    RATE,
    run_for,
    set_price,
    submit,
    top_up,
)

WEEK = HoldPolicy(standard=timedelta(days=7), verified_enterprise=timedelta(days=2))
SOLANA = {"kind": "solana_usdc", "address": "So11111111111111111111111111111111111111112"}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Any payable amount is paid on a Monday: these charges are cents."""
    settings.payout_minimum_micro = 0
    return settings


async def money(app: FastAPI, provider_id: str) -> dict[str, int]:
    async with app.state.replica.db.read() as session:
        entries, kept = await ledger.books_total(session)
        assert (entries, kept) == (0, 0)  # the books balance throughout
        return {
            "held": await ledger.balance(session, ledger.provider_held(provider_id)),
            "payable": await ledger.balance(session, ledger.provider_pending(provider_id)),
            "in_transit": await ledger.balance(session, ledger.payouts_in_transit(provider_id)),
        }


async def count(db: Database, where: ColumnElement[bool]) -> int:
    async with db.read() as session:
        found = await session.scalar(
            select(func.count()).select_from(LedgerTransactionRow).where(where)
        )
        return int(found or 0)


def next_wednesday_noon(moment: datetime) -> datetime:
    days = (2 - moment.weekday()) % 7 or 7
    return (moment + timedelta(days=days)).replace(hour=12, minute=0, second=0, microsecond=0)


async def priced_node(
    app: FastAPI, sim_agent: AgentFactory, provider: ProviderHandle
) -> SimulatedAgent:
    agent = await sim_agent()
    await set_price(app, agent, provider, RATE)
    return agent


async def charge_one_invoke(
    client: httpx.AsyncClient, tenant: TenantHandle, agent: SimulatedAgent, clock: FrozenClock
) -> tuple[str, int]:
    """(invoke id, the provider's share) of one invoke run for 100 s."""
    assert (await top_up(client, tenant, "10")).status_code == 201
    answer = await submit(client, tenant)
    assert answer.status_code == 202, answer.text
    await run_for(agent, clock, 100.0)
    cost = RATE * 100_000 // 3_600_000
    return answer.json()["id"], cost - cost * 1500 // 10_000


async def test_a_charge_is_held_not_paid_before_its_hold_released_once_then_paid_out(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    replica = app.state.replica
    priced = await priced_node(app, sim_agent, provider)
    headers = {"Authorization": f"Bearer {provider.key}"}
    put = await client.put(
        "/v1/provider/payout-settings",
        json={"method": SOLANA, "schedule": "weekly"},
        headers=headers,
    )
    assert put.status_code == 200
    wednesday = next_wednesday_noon(clock.now())
    move_to(clock, wednesday)
    await priced.heartbeat()
    invoke_id, share = await charge_one_invoke(client, tenant, priced, clock)
    charged_at = clock.now()
    assert await money(app, provider.id) == {"held": share, "payable": 0, "in_transit": 0}
    async with replica.db.read() as session:
        [hold] = (await session.scalars(select(EarningsHoldRow))).all()
    assert (hold.provider_id, hold.node_id, hold.hold) == (provider.id, priced.node_id, "standard")
    assert (hold.earned_at, hold.amount_micro) == (charged_at, share)

    earned = (await client.get("/v1/provider/earnings", headers=headers)).json()
    payable_at = charged_at + timedelta(days=7)
    assert earned["held"] == earned["pending"] == earned["history"][0]["amount"] != "0"
    assert earned["payable"] == "0"
    assert earned["releases"] == [{"on": payable_at.date().isoformat(), "amount": earned["held"]}]
    assert datetime.fromisoformat(earned["history"][0]["payable_at"]) == payable_at

    move_to(clock, wednesday + timedelta(days=5, hours=-11, minutes=-30))  # Monday 00:30
    assert await payout_loop.run_once(replica)  # the week's batch: nobody in it
    assert await release_loop.run_once(replica) == 0
    assert await money(app, provider.id) == {"held": share, "payable": 0, "in_transit": 0}
    async with replica.db.read() as session:
        assert await session.scalar(select(func.count()).select_from(PayoutRow)) == 0

    move_to(clock, payable_at - timedelta(seconds=1))
    assert await release_loop.run_once(replica) == 0  # a second early
    move_to(clock, payable_at)
    assert [await release_loop.run_once(replica) for _ in range(3)] == [1, 0, 0]
    assert await money(app, provider.id) == {"held": 0, "payable": share, "in_transit": 0}
    release = LedgerTransactionRow.kind == "hold_release"
    assert await count(replica.db, release) == 1
    earned = (await client.get("/v1/provider/earnings", headers=headers)).json()
    assert (earned["held"], earned["releases"], earned["history"][0]["payable_at"]) == (
        "0",
        [],
        None,
    )
    assert earned["payable"] == earned["pending"] == earned["history"][0]["amount"]

    move_to(clock, wednesday + timedelta(days=12, hours=-11, minutes=-30))  # the next Monday
    assert await payout_loop.run_once(replica)
    assert await money(app, provider.id) == {"held": 0, "payable": 0, "in_transit": share}
    async with replica.db.read() as session:
        [payout] = (await session.scalars(select(PayoutRow))).all()
    assert (payout.provider_id, payout.amount_micro) == (provider.id, share)
    assert await count(replica.db, release) == 1
    assert await count(replica.db, LedgerTransactionRow.cause == f"invoke:{invoke_id}:settle") == 1


async def test_an_enterprise_provider_on_verified_hardware_gets_the_shorter_hold(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    replica = app.state.replica
    priced = await priced_node(app, sim_agent, provider)
    async with replica.db.write() as session:
        row = await session.get(ProviderRow, provider.id)
        node = await session.get(NodeRow, priced.node_id)
        assert row is not None and node is not None and not node.gpus  # a CPU node
        row.tier = "enterprise"
        node.verification = {
            "cpu": {"cores": node.cpu_count, "verified_at": clock.now().isoformat()}
        }
    _, share = await charge_one_invoke(client, tenant, priced, clock)
    async with replica.db.read() as session:
        [hold] = (await session.scalars(select(EarningsHoldRow))).all()
    assert hold.hold == Hold.VERIFIED_ENTERPRISE

    clock.advance(2 * 86_400 - 1)
    assert await release_loop.run_once(replica) == 0
    clock.advance(1)
    assert await release_loop.run_once(replica) == 1  # two days, not seven
    assert await money(app, provider.id) == {"held": 0, "payable": share, "in_transit": 0}


def node(tier_gpus: list[str], verified: dict[str, object] | None, **extra: object) -> NodeRow:
    gpus = [
        {"uuid": uuid, "model": "NVIDIA H100 80GB HBM3", "vram_mb": 81559} for uuid in tier_gpus
    ]
    return NodeRow(
        id="node_x", provider_id="prv_x", gpus=gpus, cpu_count=8, verification=verified, **extra
    )


H100 = {"model": "NVIDIA H100 80GB", "verified_at": "2026-01-01T00:00:00+00:00"}


@pytest.mark.parametrize(
    ("tier", "row", "shorter"),
    [
        ("enterprise", node(["GPU-a", "GPU-b"], {"GPU-a": H100, "GPU-b": H100}), True),
        ("enterprise", node(["GPU-a", "GPU-b"], {"GPU-a": H100}), False),  # one unproved
        ("enterprise", node(["GPU-a"], {"GPU-a": {}}), False),  # an empty entry proves nothing
        # proved as another model than it claims now: not proven as what it is rented as
        ("enterprise", node(["GPU-a"], {"GPU-a": {**H100, "model": "NVIDIA A100 80GB"}}), False),
        ("enterprise", node(["GPU-a"], None), False),
        ("enterprise", node([], {"cpu": {"cores": 8}}), True),  # a CPU node's cores
        ("enterprise", node([], {"cpu": {"cores": 4}}), False),  # fewer cores than it claims
        ("community", node(["GPU-a"], {"GPU-a": H100}), False),
        (
            "enterprise",
            node(["GPU-a"], {"GPU-a": H100}, quarantined_at=datetime(2026, 1, 1, tzinfo=UTC)),
            False,
        ),
    ],
)
def test_only_an_enterprise_providers_fully_verified_node_earns_the_shorter_hold(
    tier: str, row: NodeRow, shorter: bool
) -> None:
    assert earnings_hold.shorter_hold_earned(tier, row) is shorter


# ---- the release, straight on the books -------------------------------------------------

T0 = datetime(2026, 12, 1, 9, tzinfo=UTC)


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = Database(db_url)
    yield database
    await database.dispose()


async def release(db: Database, now: datetime, policy: HoldPolicy = WEEK, batch: int = 500) -> int:
    async with db.write() as session:
        return await earnings_hold.release_due(session, now, policy, batch)


async def balances(db: Database, provider_id: str) -> tuple[int, int]:
    async with db.read() as session:
        assert await ledger.books_total(session) == (0, 0)
        return (
            await ledger.balance(session, ledger.provider_held(provider_id)),
            await ledger.balance(session, ledger.provider_pending(provider_id)),
        )


async def test_concurrent_release_runs_release_each_charge_exactly_once(db: Database) -> None:
    providers = [f"prv_{n}" for n in range(4)]
    for n in range(40):
        await post_charge(
            db, providers[n % 4], at=T0 + timedelta(minutes=n), provider_micro=1_000 + n, held=True
        )
    later = await post_charge(db, "prv_0", at=T0 + timedelta(days=3), provider_micro=7, held=True)

    async def run() -> int:
        total = 0
        while done := await release(db, T0 + timedelta(days=7, hours=1), batch=3):
            total += done
        return total

    runs = await asyncio.gather(run(), run(), run())
    leftover = await release(db, T0 + timedelta(days=7, hours=1))  # what skipped providers left
    assert sum(runs) + leftover == 40
    assert await count(db, LedgerTransactionRow.kind == "hold_release") == 40
    per_charge = await count(db, LedgerTransactionRow.cause.startswith("hold_release:"))
    assert per_charge == 40
    for n, provider_id in enumerate(providers):
        earned = sum(1_000 + k for k in range(n, 40, 4))
        assert await balances(db, provider_id) == ((7, earned) if n == 0 else (0, earned))
    async with db.read() as session:
        [kept] = (await session.scalars(select(EarningsHoldRow.charge_id))).all()
        charge = await session.scalar(
            select(LedgerTransactionRow.id).where(LedgerTransactionRow.cause == later)
        )
    assert kept == charge  # not due yet


async def test_changing_the_hold_moves_when_a_charge_is_released_never_how_often(
    db: Database,
) -> None:
    await post_charge(db, "prv_a", at=T0, provider_micro=5_000, held=True)
    longer = HoldPolicy(standard=timedelta(days=10), verified_enterprise=timedelta(days=2))
    assert await release(db, T0 + timedelta(days=8), longer) == 0  # lengthened: still held
    shorter = HoldPolicy(standard=timedelta(days=1), verified_enterprise=timedelta(days=1))
    assert await release(db, T0 + timedelta(days=8), shorter) == 1
    assert await release(db, T0 + timedelta(days=8), WEEK) == 0
    assert await release(db, T0 + timedelta(days=30), HoldPolicy(timedelta(0), timedelta(0))) == 0
    assert await balances(db, "prv_a") == (0, 5_000)
    assert await count(db, LedgerTransactionRow.kind == "hold_release") == 1


async def test_charges_posted_before_holds_stay_payable_and_are_never_released(
    db: Database,
) -> None:
    await post_charge(db, "prv_a", at=T0, provider_micro=9_000)  # as before this change
    assert await release(db, T0 + timedelta(days=30)) == 0
    assert await balances(db, "prv_a") == (0, 9_000)
    assert await count(db, LedgerTransactionRow.kind == "hold_release") == 0


async def test_earnings_say_what_is_held_until_which_day_what_is_payable_and_taken_back(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    db = app.state.replica.db
    move_to(clock, datetime(2026, 12, 9, 15, tzinfo=UTC))
    await post_charge(db, provider.id, at=datetime(2026, 12, 1, tzinfo=UTC), provider_micro=5)
    for at, share in [((8, 10), 1_000_000), ((8, 23), 250_000), ((9, 9), 30_000), ((9, 10), 7)]:
        await post_charge(
            db,
            provider.id,
            at=datetime(2026, 12, at[0], at[1], tzinfo=UTC),
            provider_micro=share,
            commission_micro=1,
            node_id="node_c",
            held=True,
        )
    async with db.write() as session:
        held = await clawbacks.held_charges(session, "node_c")
        assert await clawbacks.refund_charge(session, held[-1].charge_id, "mismatch", clock.now())
        assert await clawbacks.forfeit_held(
            session, provider.id, 30_000, "test:forfeit", clock.now()
        )
    earned = (
        await client.get(
            "/v1/provider/earnings", headers={"Authorization": f"Bearer {provider.key}"}
        )
    ).json()
    assert (earned["payable"], earned["held"]) == ("0.000005", "1.25")
    assert earned["pending"] == "1.250005"
    assert earned["releases"] == [  # the forfeit took 0.03 of the oldest, earned Dec 8 10:00
        {"on": "2026-12-15", "amount": "1.22"},
        {"on": "2026-12-16", "amount": "0.03"},
    ]
    assert (earned["refunded"], earned["forfeited"]) == ("0.000007", "0.03")
    by_amount = {h["amount"]: h["payable_at"] for h in earned["history"]}
    assert by_amount["0.000005"] is None  # earned before holds: payable
    assert datetime.fromisoformat(by_amount["0.25"]) == datetime(2026, 12, 15, 23, tzinfo=UTC)
    assert by_amount["0.000007"] is None  # refunded: never payable
