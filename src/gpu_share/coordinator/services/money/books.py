"""The platform's money at a glance, for the admin overview (SPEC §3.6, §4.4): what
tenants hold, what they spent lately, what providers are owed, and when the next payout
batch is made. Read from the ledger alone, in integer micro-USDC.

Spending is what left tenants' accounts for work: the CHARGE transactions' tenant
entries, less what REFUND transactions gave back, each on the day it was posted (the
tenant's Usage page counts a refund on its charge's day instead; over a window the two
differ only by refunds of charges older than it).
"""

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import (
    LedgerAccountRow,
    LedgerEntryRow,
    LedgerTransactionRow,
    PayoutBatchRow,
    ProviderRow,
)
from gpu_share.coordinator.services.money.ledger import AccountKind, TransactionKind
from gpu_share.coordinator.services.money.payout_calendar import due_period, next_payout_day
from gpu_share.protocol.payouts import PayoutSchedule

TENANT_ACCOUNTS = (AccountKind.TENANT_BALANCE.value, AccountKind.TENANT_RESERVED.value)
SPENDING = (TransactionKind.CHARGE.value, TransactionKind.REFUND.value)


@dataclass(frozen=True)
class NextPayout:
    """The next batch of one schedule: its day, and who it would pay were it made now."""

    day: date
    schedule: PayoutSchedule
    providers: int  # on this schedule, with a payout method, owed at least the threshold
    payable_micro: int  # what those providers are owed now (more may be payable by then)


@dataclass(frozen=True)
class PlatformMoney:
    tenant_balances_micro: int  # what tenants can spend
    tenant_reserved_micro: int  # held for running work
    spent_day_micro: int  # the last 24 hours
    spent_month_micro: int  # the last 30 days
    held_micro: int  # providers' earnings still in their hold
    payable_micro: int  # providers' earnings past it, not paid out yet
    in_transit_micro: int  # in a payout batch, not confirmed paid yet
    next_payouts: list[NextPayout]  # soonest first

    @property
    def earnings_due_micro(self) -> int:
        return self.held_micro + self.payable_micro


async def _balances_by_kind(session: AsyncSession) -> dict[str, int]:
    rows = await session.execute(
        select(
            LedgerAccountRow.kind, func.coalesce(func.sum(LedgerAccountRow.balance_micro), 0)
        ).group_by(LedgerAccountRow.kind)
    )
    return {str(kind): int(total) for kind, total in rows.all()}


async def spent_since(session: AsyncSession, since: datetime) -> int:
    """What tenants paid for work since `since`, net of refunds posted since then."""
    total = await session.scalar(
        select(func.coalesce(func.sum(LedgerEntryRow.amount_micro), 0))
        .join(LedgerTransactionRow, LedgerTransactionRow.id == LedgerEntryRow.transaction_id)
        .join(LedgerAccountRow, LedgerAccountRow.id == LedgerEntryRow.account_id)
        .where(
            LedgerTransactionRow.kind.in_(SPENDING),
            LedgerAccountRow.kind.in_(TENANT_ACCOUNTS),
            LedgerEntryRow.created_at >= since,
        )
    )
    return -int(total or 0)


async def _batch_made(session: AsyncSession, period: str) -> bool:
    found = await session.scalar(select(PayoutBatchRow.id).where(PayoutBatchRow.period == period))
    return found is not None


async def next_payout(
    session: AsyncSession, schedule: PayoutSchedule, today: date, minimum_micro: int
) -> NextPayout:
    day = next_payout_day(schedule, today)
    period = due_period(schedule, day)
    if day == today and period is not None and await _batch_made(session, period):
        day = next_payout_day(schedule, today + timedelta(days=1))  # today's is made
    threshold = max(1, minimum_micro if schedule is PayoutSchedule.WEEKLY else 1)
    owed = (
        await session.execute(
            select(LedgerAccountRow.balance_micro)
            .join(ProviderRow, ProviderRow.id == LedgerAccountRow.owner_id)
            .where(
                LedgerAccountRow.kind == AccountKind.PROVIDER_PENDING.value,
                LedgerAccountRow.balance_micro >= threshold,
                ProviderRow.payout_schedule == schedule.value,
                ProviderRow.payout_method.is_not(None),
            )
        )
    ).all()
    return NextPayout(
        day=day,
        schedule=schedule,
        providers=len(owed),
        payable_micro=sum(int(micro) for (micro,) in owed),
    )


async def platform_money(session: AsyncSession, now: datetime, minimum_micro: int) -> PlatformMoney:
    kept = await _balances_by_kind(session)
    today = now.astimezone(UTC).date()
    upcoming = [await next_payout(session, s, today, minimum_micro) for s in PayoutSchedule]
    return PlatformMoney(
        tenant_balances_micro=kept.get(AccountKind.TENANT_BALANCE.value, 0),
        tenant_reserved_micro=kept.get(AccountKind.TENANT_RESERVED.value, 0),
        spent_day_micro=await spent_since(session, now - timedelta(days=1)),
        spent_month_micro=await spent_since(session, now - timedelta(days=30)),
        held_micro=kept.get(AccountKind.PROVIDER_HELD.value, 0),
        payable_micro=kept.get(AccountKind.PROVIDER_PENDING.value, 0),
        in_transit_micro=kept.get(AccountKind.PAYOUTS_IN_TRANSIT.value, 0),
        next_payouts=sorted(upcoming, key=lambda p: (p.day, p.schedule != PayoutSchedule.WEEKLY)),
    )
