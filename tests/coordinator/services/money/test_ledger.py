"""The double-entry books (SPEC §3.6) on SQLite and PostgreSQL: balanced, posted once per
cause, never overdrawn, also under concurrent postings."""

import asyncio
import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.errors import InsufficientBalance
from gpu_share.coordinator.core.orm import LedgerAccountRow, LedgerEntryRow, LedgerTransactionRow
from gpu_share.coordinator.services.money import ledger
from gpu_share.coordinator.services.money.ledger import (
    COMMISSION,
    WORLD,
    Entry,
    TransactionKind,
    provider_pending,
    split_commission,
    tenant_balance,
    tenant_reserved,
    transfer,
)

NOW = datetime(2026, 3, 2, 12, tzinfo=UTC)
ALICE, BOB, FARM = "ten_alice", "ten_bob", "prv_farm"


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = Database(db_url)
    yield database
    await database.dispose()


async def post(db: Database, cause: str, kind: TransactionKind, entries: list[Entry]) -> bool:
    async with db.write() as session:
        return await ledger.post(session, cause=cause, kind=kind, entries=entries, now=NOW)


async def balances(db: Database) -> dict[str, int]:
    """Every kept balance, and the shared accounts' summed balances where not zero."""
    async with db.read() as session:
        rows = await session.execute(select(LedgerAccountRow.id, LedgerAccountRow.balance_micro))
        kept = dict(rows.all())
        for shared in (WORLD, COMMISSION):
            if summed := await ledger.balance(session, shared):
                kept[shared.id] = summed
        return kept


async def test_a_charge_moves_money_once_and_the_books_sum_to_zero(db: Database) -> None:
    assert await post(
        db, "topup:1", TransactionKind.TOP_UP, transfer(WORLD, tenant_balance(ALICE), 10_000_000)
    )
    assert await post(
        db,
        "inv_1:reserve",
        TransactionKind.RESERVE,
        transfer(tenant_balance(ALICE), tenant_reserved(ALICE), 3_000_000),
    )
    provider, commission = split_commission(1_234_567, commission_bps=1_500)
    assert (provider, commission) == (1_049_382, 185_185)
    charge = [
        Entry(tenant_reserved(ALICE), -3_000_000),
        Entry(provider_pending(FARM), provider),
        Entry(COMMISSION, commission),
        Entry(tenant_balance(ALICE), 3_000_000 - 1_234_567),
    ]
    assert await post(db, "inv_1:settle", TransactionKind.CHARGE, charge)
    before = await balances(db)
    assert before == {
        "world": -10_000_000,
        f"tenant_balance:{ALICE}": 10_000_000 - 1_234_567,
        f"tenant_reserved:{ALICE}": 0,
        f"provider_pending:{FARM}": 1_049_382,
        "platform_commission": 185_185,
    }
    assert not await post(db, "inv_1:settle", TransactionKind.CHARGE, charge)  # a retry
    assert not await post(
        db, "topup:1", TransactionKind.TOP_UP, transfer(WORLD, tenant_balance(ALICE), 5)
    )
    assert await balances(db) == before
    async with db.read() as session:
        assert await ledger.books_total(session) == (0, 0)
        assert await ledger.posted(session, "inv_1:settle")
        assert not await ledger.posted(session, "inv_2:settle")


async def test_an_overdraft_fails_whole_and_changes_nothing(db: Database) -> None:
    await post(
        db, "topup", TransactionKind.TOP_UP, transfer(WORLD, tenant_balance(ALICE), 1_000_000)
    )
    before = await balances(db)
    async with db.write() as session:
        with pytest.raises(InsufficientBalance) as refused:
            await ledger.post(
                session,
                cause="inv_big:reserve",
                kind=TransactionKind.RESERVE,
                entries=transfer(tenant_balance(ALICE), tenant_reserved(ALICE), 1_000_001),
                now=NOW,
            )
        # the caller carries on in the same transaction: nothing of the posting is left
        assert not await ledger.posted(session, "inv_big:reserve")
    assert refused.value.details == {"available": "1", "required": "1.000001"}
    assert await balances(db) == before
    assert await post(  # the cause was never used up: it can be posted once there is money
        db,
        "inv_big:reserve",
        TransactionKind.RESERVE,
        transfer(tenant_balance(ALICE), tenant_reserved(ALICE), 1_000_000),
    )


async def test_unbalanced_or_fractional_entries_are_refused(db: Database) -> None:
    with pytest.raises(ValueError, match="unbalanced"):
        await post(
            db, "bad", TransactionKind.TOP_UP, [Entry(WORLD, -5), Entry(tenant_balance(ALICE), 4)]
        )
    with pytest.raises(ValueError, match="integer"):
        await post(
            db,
            "bad",
            TransactionKind.TOP_UP,
            [Entry(WORLD, -0.5), Entry(tenant_balance(ALICE), 0.5)],  # type: ignore[arg-type]
        )
    with pytest.raises(ValueError, match="owner"):
        ledger.Account(ledger.AccountKind.TENANT_BALANCE)
    assert await balances(db) == {}


async def test_concurrent_spending_never_overdraws(db: Database) -> None:
    """Twenty reservations of 1 USDC race for a balance of 7 USDC, alongside two top-ups of
    1 USDC: exactly nine get through, none is lost, and the balance ends at zero."""
    await post(
        db, "topup:0", TransactionKind.TOP_UP, transfer(WORLD, tenant_balance(BOB), 7_000_000)
    )

    async def reserve(n: int) -> bool:
        try:
            return await post(
                db,
                f"inv_{n}:reserve",
                TransactionKind.RESERVE,
                transfer(tenant_balance(BOB), tenant_reserved(BOB), 1_000_000),
            )
        except InsufficientBalance:
            return False

    async def top_up(n: int) -> bool:
        await asyncio.sleep(0)
        return await post(
            db,
            f"topup:{n}",
            TransactionKind.TOP_UP,
            transfer(WORLD, tenant_balance(BOB), 1_000_000),
        )

    outcomes = await asyncio.gather(*[reserve(n) for n in range(20)], top_up(1), top_up(2))
    reserved = sum(outcomes[:20])
    assert all(outcomes[20:])
    money = await balances(db)
    assert money[f"tenant_reserved:{BOB}"] == reserved * 1_000_000
    assert money[f"tenant_balance:{BOB}"] == 9_000_000 - reserved * 1_000_000 >= 0
    async with db.read() as session:
        assert await ledger.books_total(session) == (0, 0)


async def test_reserving_and_settling_at_once_for_one_tenant_neither_deadlocks_nor_loses(
    db: Database,
) -> None:
    """Reservations (balance → reserve) and settlements (reserve → provider, commission and
    balance) move money in opposite directions between the same two accounts; run at
    once they must all complete (no deadlock on PostgreSQL) and add up."""
    await post(db, "topup", TransactionKind.TOP_UP, transfer(WORLD, tenant_balance(ALICE), 10**9))
    for n in range(15):
        await post(
            db,
            f"old_{n}:reserve",
            TransactionKind.RESERVE,
            transfer(tenant_balance(ALICE), tenant_reserved(ALICE), 2_000_000),
        )

    async def reserve(n: int) -> bool:
        return await post(
            db,
            f"new_{n}:reserve",
            TransactionKind.RESERVE,
            transfer(tenant_balance(ALICE), tenant_reserved(ALICE), 2_000_000),
        )

    async def settle(n: int) -> bool:
        provider, commission = split_commission(1_500_000, 1_500)
        return await post(
            db,
            f"old_{n}:settle",
            TransactionKind.CHARGE,
            [
                Entry(tenant_reserved(ALICE), -2_000_000),
                Entry(provider_pending(FARM), provider),
                Entry(COMMISSION, commission),
                Entry(tenant_balance(ALICE), 500_000),
            ],
        )

    outcomes = await asyncio.gather(*[f(n) for n in range(15) for f in (reserve, settle)])
    assert all(outcomes)
    money = await balances(db)
    assert money[f"tenant_reserved:{ALICE}"] == 15 * 2_000_000
    assert money[f"tenant_balance:{ALICE}"] == 10**9 - 15 * 2_000_000 - 15 * 1_500_000
    assert money[f"provider_pending:{FARM}"] + money["platform_commission"] == 15 * 1_500_000
    async with db.read() as session:
        assert await ledger.books_total(session) == (0, 0)


# Property: any sequence of postings, some refused and some replayed, keeps every
# transaction balanced, the books at zero, each balance the sum of its entries, and no
# account that holds someone's money below zero.

ACCOUNTS = [
    tenant_balance(ALICE),
    tenant_reserved(ALICE),
    tenant_balance(BOB),
    provider_pending(FARM),
    ledger.payouts_in_transit(FARM),
    COMMISSION,
    WORLD,
]
postings = st.lists(
    st.tuples(
        st.sampled_from(ACCOUNTS),
        st.sampled_from(ACCOUNTS),
        st.integers(1, 5_000_000),
        st.booleans(),  # replay an earlier posting's cause instead of a new one
    ),
    min_size=1,
    max_size=25,
)
_run = itertools.count()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=postings)
def test_any_sequence_of_postings_keeps_the_books_sound(
    db_url: str, steps: list[tuple[ledger.Account, ledger.Account, int, bool]]
) -> None:
    asyncio.run(_check_sequence(db_url, steps, next(_run)))


async def _check_sequence(
    url: str, steps: list[tuple[ledger.Account, ledger.Account, int, bool]], run: int
) -> None:
    db = Database(url)
    try:
        done: list[str] = []
        for n, (source, target, amount, replay) in enumerate(steps):
            cause = done[amount % len(done)] if replay and done else f"run{run}:step{n}"
            before = await balances(db)
            try:
                first = await post(
                    db, cause, TransactionKind.CHARGE, transfer(source, target, amount)
                )
            except InsufficientBalance:
                assert await balances(db) == before
                continue
            if first:
                done.append(cause)
            else:
                assert await balances(db) == before  # a replay changes nothing
        async with db.read() as session:
            assert await ledger.books_total(session) == (0, 0)
            per_transaction = await session.execute(
                select(func.sum(LedgerEntryRow.amount_micro)).group_by(
                    LedgerEntryRow.transaction_id
                )
            )
            assert all(total == 0 for total in per_transaction.scalars())
            per_account = await session.execute(
                select(LedgerEntryRow.account_id, func.sum(LedgerEntryRow.amount_micro)).group_by(
                    LedgerEntryRow.account_id
                )
            )
            sums = dict(per_account.all())
            causes = await session.scalar(select(func.count()).select_from(LedgerTransactionRow))
        money = await balances(db)
        assert {a: b for a, b in money.items() if b} == {a: s for a, s in sums.items() if s}
        assert all(
            money[a.id] >= 0 for a in ACCOUNTS if a.kind in ledger.NEVER_NEGATIVE and a.id in money
        )
        assert causes is not None and causes >= len(done)
    finally:
        await db.dispose()
