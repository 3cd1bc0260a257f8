"""The double-entry books (SPEC §3.6): every movement of money is one balanced
transaction, posted exactly once for its cause.

Amounts are integer micro-USDC. Each transaction's entries sum to zero, so the whole
book does too. Accounts that hold someone's money (a tenant's balance and reserve, a
provider's held and pending earnings, payouts in transit) keep their balance in a row
that the posting changes in the same database transaction, by a guarded UPDATE: a
posting that would take one below zero fails whole with `InsufficientBalance`, under
any concurrency. The shared accounts (the platform's commission, the held earnings it
took from providers caught cheating, and the outside world, where top-ups come from
and paid payouts go) keep no row, so that charges do not all queue on one; their
balance is the sum of their entries (refunds draw on the commission and the forfeits,
which may go below zero).

`post` is idempotent by `cause` (for example ``invoke:inv_…:settle``): a second post
of the same cause, after a retry, a replayed request or a restart halfway through the
work that caused it, changes nothing and returns False.
"""

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import cache
from typing import Any, TypedDict

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core import metrics
from gpu_share.coordinator.core.db import driver_of
from gpu_share.coordinator.core.driver_sql import DriverTx, Sql
from gpu_share.coordinator.core.errors import InsufficientBalance
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import (
    LedgerAccountRow,
    LedgerEntryRow,
    LedgerTransactionRow,
)
from gpu_share.protocol.money import usdc_text


class AccountKind(StrEnum):
    TENANT_BALANCE = "tenant_balance"  # prepaid credit a tenant can spend
    TENANT_RESERVED = "tenant_reserved"  # held for running work's most it can cost
    PROVIDER_HELD = "provider_held"  # earned, in the hold: refundable, not yet payable
    PROVIDER_PENDING = "provider_pending"  # earned, payable, not yet paid out
    PAYOUTS_IN_TRANSIT = "payouts_in_transit"  # in a payout batch, not yet confirmed paid
    PLATFORM_COMMISSION = "platform_commission"
    PLATFORM_FORFEITS = "platform_forfeits"  # held earnings forfeited for cheating
    WORLD = "world"  # outside the platform: top-ups come from it, paid payouts go to it


# Accounts that hold someone's money: a posting never takes one below zero.
NEVER_NEGATIVE = frozenset(
    {
        AccountKind.TENANT_BALANCE,
        AccountKind.TENANT_RESERVED,
        AccountKind.PROVIDER_HELD,
        AccountKind.PROVIDER_PENDING,
        AccountKind.PAYOUTS_IN_TRANSIT,
    }
)
# Owned by nobody in particular: one account each.
SHARED = frozenset(
    {AccountKind.PLATFORM_COMMISSION, AccountKind.PLATFORM_FORFEITS, AccountKind.WORLD}
)


class TransactionKind(StrEnum):
    TOP_UP = "top_up"  # world → tenant balance
    RESERVE = "reserve"  # tenant balance → reserved, at submit
    RELEASE = "release"  # reserved → tenant balance, work that ended without charge
    CHARGE = "charge"  # reserved (and balance) → provider held + commission, the rest released
    HOLD_RELEASE = "hold_release"  # provider held → pending, once a charge's hold has passed
    REFUND = "refund"  # a held charge undone: held (+ forfeits) + commission → tenant balance
    FORFEIT = "forfeit"  # provider held → platform forfeits (a provider caught cheating)
    PAYOUT = "payout"  # provider pending → in transit
    PAYOUT_PAID = "payout_paid"  # in transit → world
    PAYOUT_FAILED = "payout_failed"  # in transit → provider pending
    PAYOUT_REMAINDER = "payout_remainder"  # in transit → pending: a bank payout's sub-cent rest


class ChargeDetails(TypedDict):
    """`details` of a CHARGE transaction: what the usage page and the earnings tracker read."""

    tenant_id: str
    provider_id: str
    node_id: str
    work: str  # "invoke" or "session"
    work_id: str  # the invoke's or session's id
    runtime: str
    gpu_model: str  # the node's GPU model, or "cpu" for a CPU node
    gpus: int  # GPUs billed (1 for CPU work)
    spot: bool
    seconds: float  # metered time of this charge
    rate_micro_per_hour: int  # for all billed GPUs together
    cost_micro: int  # what the tenant paid: provider_micro + commission_micro
    provider_micro: int
    commission_micro: int
    started_at: str  # ISO 8601 UTC: the metered interval
    ended_at: str


@dataclass(frozen=True)
class Account:
    kind: AccountKind
    owner_id: str | None = None

    def __post_init__(self) -> None:
        if (self.owner_id is None) != (self.kind in SHARED):
            raise ValueError(
                f"{self.kind} accounts {'have no' if self.kind in SHARED else 'need an'} owner"
            )

    @property
    def id(self) -> str:
        return self.kind.value if self.owner_id is None else f"{self.kind.value}:{self.owner_id}"


WORLD = Account(AccountKind.WORLD)
COMMISSION = Account(AccountKind.PLATFORM_COMMISSION)
FORFEITS = Account(AccountKind.PLATFORM_FORFEITS)


def tenant_balance(tenant_id: str) -> Account:
    return Account(AccountKind.TENANT_BALANCE, tenant_id)


def tenant_reserved(tenant_id: str) -> Account:
    return Account(AccountKind.TENANT_RESERVED, tenant_id)


def provider_held(provider_id: str) -> Account:
    return Account(AccountKind.PROVIDER_HELD, provider_id)


def provider_pending(provider_id: str) -> Account:
    return Account(AccountKind.PROVIDER_PENDING, provider_id)


def payouts_in_transit(provider_id: str) -> Account:
    return Account(AccountKind.PAYOUTS_IN_TRANSIT, provider_id)


@dataclass(frozen=True)
class Entry:
    account: Account
    amount_micro: int  # positive: into the account


def transfer(source: Account, target: Account, amount_micro: int) -> list[Entry]:
    """`amount_micro` out of `source` into `target`: the simplest balanced pair."""
    return [Entry(source, -amount_micro), Entry(target, amount_micro)]


def split_commission(cost_micro: int, commission_bps: int) -> tuple[int, int]:
    """(provider's share, platform's commission) of a charge; the commission is rounded
    down to the micro-USDC, so the two always add up to the charge exactly."""
    commission = cost_micro * commission_bps // 10_000
    return cost_micro - commission, commission


async def post(
    session: AsyncSession,
    *,
    cause: str,
    kind: TransactionKind,
    entries: Iterable[Entry],
    now: datetime,
    details: Mapping[str, Any] | None = None,
) -> bool:
    """Post one balanced transaction for `cause`, inside the caller's transaction.

    Returns False, changing nothing, when `cause` was posted before. Raises
    `InsufficientBalance`, changing nothing (the caller may carry on), when it would
    take an account that holds someone's money below zero; ValueError when the entries
    do not balance or are not integers.
    """
    net: dict[Account, int] = defaultdict(int)
    for entry in entries:
        if not isinstance(entry.amount_micro, int) or isinstance(entry.amount_micro, bool):
            raise ValueError("ledger amounts are integer micro-USDC")
        net[entry.account] += entry.amount_micro
    if sum(net.values()) != 0:
        raise ValueError(f"unbalanced transaction for {cause}: {dict(net)}")
    moves = sorted(((a, m) for a, m in net.items() if m), key=lambda pair: pair[0].id)

    transaction_id = new_id("txn")
    tx = await driver_of(session)
    inserted = await tx.fetchrow(
        _INSERT_TRANSACTION,
        id=transaction_id,
        cause=cause,
        kind=kind.value,
        created_at=now,
        details=dict(details or {}),
    )
    if inserted is None:
        return False
    # Kept balances change in account id order, so that concurrent postings lock alike;
    # a run of credits is one statement. Shared accounts keep no balance (see above).
    kept = [(a, m) for a, m in moves if a.kind not in SHARED]
    credits: list[tuple[Account, int]] = []
    for at, (account, amount) in enumerate(kept):
        if amount > 0:
            credits.append((account, amount))
            continue
        await _credit(tx, credits, now)
        credits = []
        if not await tx.execute(_TAKE, id=account.id, amount=-amount):
            await _credit(tx, [(a, -m) for a, m in kept[:at]], now)  # undo, in order
            await tx.execute(_DELETE_TRANSACTION, id=transaction_id)
            have = await balance(session, account)
            raise InsufficientBalance(
                f"{_WHOSE[account.kind]} holds {usdc_text(have)} USDC; "
                f"this needs {usdc_text(-amount)}",
                details={"available": usdc_text(have), "required": usdc_text(-amount)},
            )
    await _credit(tx, credits, now)
    moved = sum(m for _, m in moves if m > 0)
    metrics.after_commit(session, lambda: _count_posting(kind, moved))
    if moves:
        await tx.execute(
            _insert_entries(len(moves)),
            transaction_id=transaction_id,
            created_at=now,
            **{f"account_{i}": a.id for i, (a, _) in enumerate(moves)},
            **{f"amount_{i}": m for i, (_, m) in enumerate(moves)},
        )
    return True


def _count_posting(kind: TransactionKind, moved: int) -> None:
    metrics.LEDGER_POSTINGS.labels(kind.value).inc()
    metrics.LEDGER_MOVED.labels(kind.value).inc(moved)


async def _credit(tx: DriverTx, moves: list[tuple[Account, int]], now: datetime) -> None:
    """Add to kept balances (which may be negative adjustments when undoing), creating
    the accounts on first use; one statement."""
    if not moves:
        return
    params: dict[str, Any] = {"created_at": now}
    for i, (account, amount) in enumerate(moves):
        params |= {
            f"id_{i}": account.id,
            f"kind_{i}": account.kind.value,
            f"owner_{i}": account.owner_id,
            f"amount_{i}": amount,
        }
    await tx.execute(_credit_statement(len(moves)), **params)


# Postings are the hottest writes there are (a paid job posts two): plain SQL, the same
# on SQLite and PostgreSQL, on the driver (`driver_sql`) in the caller's transaction.
_INSERT_TRANSACTION = Sql(
    "INSERT INTO ledger_transactions (id, cause, kind, created_at, details) "
    "VALUES (:id, :cause, :kind, :created_at, :details) "
    "ON CONFLICT (cause) DO NOTHING RETURNING id",
    jsons=("details",),
)
_DELETE_TRANSACTION = Sql("DELETE FROM ledger_transactions WHERE id = :id")
_TAKE = Sql(
    "UPDATE ledger_accounts SET balance_micro = balance_micro - :amount "
    "WHERE id = :id AND balance_micro >= :amount"
)
"""Take `:amount` from a kept balance; writes no row, changing nothing, if it has less."""


@cache
def _credit_statement(rows: int) -> Sql:
    """Credit `rows` kept balances, creating missing accounts (placeholders, never data)."""
    values = ", ".join(
        f"(:id_{i}, :kind_{i}, :owner_{i}, :amount_{i}, :created_at)" for i in range(rows)
    )
    return Sql(
        " ".join(
            (
                "INSERT INTO ledger_accounts (id, kind, owner_id, balance_micro, created_at)",
                "VALUES",
                values,
                "ON CONFLICT (id) DO UPDATE",
                "SET balance_micro = ledger_accounts.balance_micro + excluded.balance_micro",
            )
        )
    )


@cache
def _insert_entries(rows: int) -> Sql:
    """Insert `rows` entries of one transaction (placeholders, never data)."""
    values = ", ".join(
        f"(:transaction_id, :account_{i}, :amount_{i}, :created_at)" for i in range(rows)
    )
    return Sql(
        " ".join(
            (
                "INSERT INTO ledger_entries (transaction_id, account_id, amount_micro, created_at)",
                "VALUES",
                values,
            )
        )
    )


_WHOSE = {
    AccountKind.TENANT_BALANCE: "the balance",
    AccountKind.TENANT_RESERVED: "the reserve",
    AccountKind.PROVIDER_HELD: "the held earnings",
    AccountKind.PROVIDER_PENDING: "the pending earnings",
    AccountKind.PAYOUTS_IN_TRANSIT: "the payouts in transit",
}


async def balance(session: AsyncSession, account: Account) -> int:
    if account.kind in SHARED:
        summed = await session.scalar(
            select(func.coalesce(func.sum(LedgerEntryRow.amount_micro), 0)).where(
                LedgerEntryRow.account_id == account.id
            )
        )
        return int(summed or 0)
    kept = await session.scalar(
        select(LedgerAccountRow.balance_micro).where(LedgerAccountRow.id == account.id)
    )
    return int(kept or 0)


async def posted(session: AsyncSession, cause: str) -> bool:
    found = await session.scalar(
        select(LedgerTransactionRow.id).where(LedgerTransactionRow.cause == cause)
    )
    return found is not None


async def books_total(session: AsyncSession) -> tuple[int, int]:
    """(sum of every entry, sum of every account's balance): both 0 in sound books."""
    entries = await session.scalar(select(func.coalesce(func.sum(LedgerEntryRow.amount_micro), 0)))
    kept = await session.scalar(select(func.coalesce(func.sum(LedgerAccountRow.balance_micro), 0)))
    shared = [await balance(session, Account(kind)) for kind in sorted(SHARED)]
    return int(entries or 0), int(kept or 0) + sum(shared)
