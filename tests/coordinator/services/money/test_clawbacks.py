"""Taking back what a cheat earned while it is held (SPEC §3.8), on SQLite and
PostgreSQL: a refund gives the tenant all one charge took, once; a forfeit takes the
provider's held earnings for the platform, once per cause; neither touches what is
payable; and any sequence of charges, releases, refunds and forfeits keeps the books
at zero with no account that holds someone's money below it."""

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.errors import Conflict, NotFound
from gpu_share.coordinator.core.orm import EarningsHoldRow, LedgerAccountRow, LedgerTransactionRow
from gpu_share.coordinator.services.money import clawbacks, earnings_hold, ledger
from gpu_share.coordinator.services.money.earnings_hold import HoldPolicy
from gpu_share.testing.earnings import post_charge

T0 = datetime(2026, 12, 1, 9, tzinfo=UTC)
WEEK = HoldPolicy(standard=timedelta(days=7), verified_enterprise=timedelta(days=2))
TENANT = "ten_test"  # who `post_charge` says paid


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = Database(db_url)
    yield database
    await database.dispose()


async def charge(
    db: Database,
    provider_id: str,
    at: datetime,
    share: int,
    commission: int = 0,
    node_id: str = "node_test",
) -> str:
    """A held charge: its transaction id."""
    cause = await post_charge(
        db,
        provider_id,
        at=at,
        provider_micro=share,
        commission_micro=commission,
        node_id=node_id,
        held=True,
    )
    async with db.read() as session:
        found = await session.scalar(
            select(LedgerTransactionRow.id).where(LedgerTransactionRow.cause == cause)
        )
    assert found is not None
    return found


async def money(db: Database, provider_id: str) -> dict[str, int]:
    async with db.read() as session:
        assert await ledger.books_total(session) == (0, 0)
        return {
            "held": await ledger.balance(session, ledger.provider_held(provider_id)),
            "payable": await ledger.balance(session, ledger.provider_pending(provider_id)),
            "tenant": await ledger.balance(session, ledger.tenant_balance(TENANT)),
            "commission": await ledger.balance(session, ledger.COMMISSION),
            "forfeits": await ledger.balance(session, ledger.FORFEITS),
        }


async def refund(db: Database, charge_id: str, now: datetime = T0) -> int:
    async with db.write() as session:
        return await clawbacks.refund_charge(session, charge_id, "result mismatch", now)


async def forfeit(db: Database, provider_id: str, amount: int | None, cause: str) -> int:
    async with db.write() as session:
        return await clawbacks.forfeit_held(session, provider_id, amount, cause, T0, reason="test")


async def release(db: Database, now: datetime) -> int:
    async with db.write() as session:
        return await earnings_hold.release_due(session, now, WEEK)


async def test_a_refund_gives_the_tenant_all_the_charge_took_once_and_it_is_never_released(
    db: Database,
) -> None:
    first = await charge(db, "prv_a", T0, 850_000, 150_000, node_id="node_bad")
    await charge(db, "prv_a", T0, 400, node_id="node_good")
    async with db.read() as session:
        held = await clawbacks.held_charges(session, "node_bad")
    assert [(h.charge_id, h.cost_micro, h.held_micro, h.tenant_id) for h in held] == [
        (first, 1_000_000, 850_000, TENANT)
    ]

    assert await refund(db, first) == 1_000_000
    assert await refund(db, first) == 0  # once
    after = await money(db, "prv_a")
    assert (after["held"], after["tenant"], after["commission"]) == (400, 1_000_000, 0)
    async with db.read() as session:
        assert await clawbacks.held_charges(session, "node_bad") == []
    assert await release(db, T0 + timedelta(days=8)) == 1  # only the other charge
    assert (await money(db, "prv_a"))["payable"] == 400


async def test_what_is_no_longer_held_is_not_refunded(db: Database) -> None:
    released = await charge(db, "prv_a", T0, 1_000)
    assert await release(db, T0 + timedelta(days=7)) == 1
    with pytest.raises(Conflict, match="no longer held"):
        await refund(db, released)
    before_holds = await post_charge(db, "prv_a", at=T0, provider_micro=2_000)  # payable at once
    async with db.read() as session:
        legacy = await session.scalar(
            select(LedgerTransactionRow.id).where(LedgerTransactionRow.cause == before_holds)
        )
    assert legacy is not None
    with pytest.raises(Conflict):
        await refund(db, legacy)
    with pytest.raises(NotFound):
        await refund(db, "txn_none")
    assert await money(db, "prv_a") == {
        "held": 0,
        "payable": 3_000,
        "tenant": 0,
        "commission": 0,
        "forfeits": 0,
    }


async def test_a_forfeit_takes_held_earnings_oldest_first_once_and_a_refund_still_works(
    db: Database,
) -> None:
    old = await charge(db, "prv_a", T0, 600, 100)
    new = await charge(db, "prv_a", T0 + timedelta(hours=1), 900, 100)
    await post_charge(db, "prv_a", at=T0, provider_micro=5_000)  # payable: never forfeited
    assert await forfeit(db, "prv_a", 1_000, "incident:1:forfeit") == 1_000
    assert await forfeit(db, "prv_a", 1_000, "incident:1:forfeit") == 0  # once per cause
    async with db.read() as session:
        rows = await session.execute(
            select(EarningsHoldRow.charge_id, EarningsHoldRow.amount_micro)
        )
        left = dict(rows.all())
    assert left == {old: 0, new: 500}
    assert await forfeit(db, "prv_a", None, "incident:2:forfeit") == 500  # all that is left
    assert await forfeit(db, "prv_a", None, "incident:3:forfeit") == 0  # nothing held
    assert await money(db, "prv_a") == {
        "held": 0,
        "payable": 5_000,
        "tenant": 0,
        "commission": 200,
        "forfeits": 1_500,
    }

    assert await refund(db, new) == 1_000  # its share out of the forfeits
    assert await money(db, "prv_a") == {
        "held": 0,
        "payable": 5_000,
        "tenant": 1_000,
        "commission": 100,
        "forfeits": 600,
    }
    assert await release(db, T0 + timedelta(days=8)) == 1  # the forfeited row goes, moving 0
    assert (await money(db, "prv_a"))["payable"] == 5_000
    with pytest.raises(Conflict):
        await refund(db, old)  # its hold is over
    with pytest.raises(ValueError, match="0 or more"):
        await forfeit(db, "prv_a", -1, "incident:4:forfeit")


async def test_concurrent_refunds_forfeits_and_releases_keep_the_books(db: Database) -> None:
    ids = [await charge(db, "prv_a", T0 + timedelta(minutes=n), 1_000, 100) for n in range(12)]
    later = T0 + timedelta(days=7, minutes=5)  # the first six are due

    async def refunds() -> list[int]:
        return [await refund(db, i) for i in ids[6:9]]

    first, taken, released, second = await asyncio.gather(
        refunds(), forfeit(db, "prv_a", 2_500, "incident:x"), release(db, later), refunds()
    )
    assert sorted(first + second) == [0, 0, 0, 1_100, 1_100, 1_100]  # each refunded once
    assert taken == 2_500
    # A release finding the provider busy (on PostgreSQL) leaves them to its next run.
    assert released + await release(db, later) == 6
    after = await money(db, "prv_a")
    assert (after["tenant"], after["commission"]) == (3_300, 1_200 - 300)
    # Whatever the order: the nine charges not refunded earned 9000, held, payable or
    # forfeited (less what refunds drew back from the forfeits).
    assert after["held"] + after["payable"] + after["forfeits"] == 9_000
    await _assert_sound(db, ["prv_a"])


# ---- property: any sequence keeps the books sound ---------------------------------------

PROVIDERS = ["prv_p", "prv_q"]
steps = st.lists(
    st.one_of(
        st.tuples(st.just("charge"), st.integers(0, 1), st.integers(1, 50_000), st.integers(0, 2)),
        st.tuples(st.just("wait"), st.integers(1, 2 * 86_400)),
        st.tuples(st.just("release"), st.integers(1, 5)),
        st.tuples(st.just("refund"), st.integers(0, 30)),
        st.tuples(st.just("forfeit"), st.integers(0, 1), st.none() | st.integers(0, 80_000)),
    ),
    min_size=1,
    max_size=14,
)
_run = itertools.count()


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=steps)
def test_any_sequence_of_charges_releases_refunds_and_forfeits_keeps_the_books_sound(
    db_url: str, sequence: list[tuple[object, ...]]
) -> None:
    asyncio.run(_check(db_url, sequence, next(_run)))


async def _check(url: str, sequence: list[tuple[object, ...]], run: int) -> None:
    db = Database(url)
    now = T0 + timedelta(days=400 * run)  # each example apart from the others' holds
    providers = [f"{p}{run}" for p in PROVIDERS]
    charged: list[str] = []
    try:
        for n, step in enumerate(sequence):
            match step:
                case ("charge", int(p), int(share), int(commission_tenths)):
                    commission = share * commission_tenths // 10
                    charged.append(await charge(db, providers[p], now, share, commission))
                case ("wait", int(seconds)):
                    now += timedelta(seconds=seconds)
                case ("release", int(times)):
                    for _ in range(times):
                        await release(db, now)
                case ("refund", int(k)) if charged:
                    with contextlib.suppress(Conflict):  # its hold is over
                        await refund(db, charged[k % len(charged)], now)
                case ("forfeit", int(p), None):
                    await forfeit(db, providers[p], None, f"run{run}:forfeit{n}")
                case ("forfeit", int(p), int(amount)):
                    await forfeit(db, providers[p], amount, f"run{run}:forfeit{n}")
            await _assert_sound(db, providers)
    finally:
        await db.dispose()


async def _assert_sound(db: Database, providers: list[str]) -> None:
    async with db.read() as session:
        assert await ledger.books_total(session) == (0, 0)
        lowest = await session.scalar(select(func.min(LedgerAccountRow.balance_micro)))
        assert lowest is None or lowest >= 0
        for provider_id in providers:
            held = await ledger.balance(session, ledger.provider_held(provider_id))
            in_holds = await session.scalar(
                select(func.coalesce(func.sum(EarningsHoldRow.amount_micro), 0)).where(
                    EarningsHoldRow.provider_id == provider_id
                )
            )
            assert held == in_holds  # every held micro-USDC belongs to one charge's hold
        settled = await session.execute(
            select(LedgerTransactionRow.cause).where(
                LedgerTransactionRow.kind.in_(["hold_release", "refund"])
            )
        )
        charge_ids = [cause.partition(":")[2] for cause in settled.scalars()]
        assert len(charge_ids) == len(set(charge_ids))  # released or refunded, once, never both
