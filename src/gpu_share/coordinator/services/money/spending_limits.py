"""A tenant's own limits (SPEC §4.5; docs/billing.md): a monthly cap on new work and a
low-balance threshold, and the one path every RESERVE takes (`reserve`).

- **The month's spend** (a calendar month, UTC) is what the books charged the tenant this
  month, net of refunds made this month, plus what is held now for work in flight (its
  reserve). Money only leaves the available balance by a RESERVE, so that is where both
  limits are decided, in the transaction that reserves.
- **The cap** refuses new work (an invoke, a session, a reservation) whose most possible
  cost would take the month's spend past it: 402 SPENDING_LIMIT, nothing created. The
  tenant's limits row is locked (`FOR UPDATE`; SQLite serializes writes) before the
  spend is read, so concurrent submits cannot pass the cap together. Running work is
  never stopped by it: a session reserving its next hour is not new work.
- **Mails**, through the outbox (once per cause): when a RESERVE takes the available
  balance from at or above the threshold to below it (so again only after it rose back:
  a top-up, a release, what a charge gives back), cause ``low_balance:<reserve cause>``;
  and the first time in a month the spend reaches the cap or work is refused for it,
  cause ``spending_cap:<tenant>:<YYYY-MM>``. A refusal rolls its transaction back, so its
  mail is written after, in a transaction of its own (`mailing_refusals`).

A tenant without limits has no row: one primary-key read per RESERVE finds that, and
nothing else runs. Charges never look at limits.
"""

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core import driver_models
from gpu_share.coordinator.core.db import Database, driver_of, upsert
from gpu_share.coordinator.core.errors import SpendingLimitReached
from gpu_share.coordinator.core.orm import (
    LedgerEntryRow,
    LedgerTransactionRow,
    SpendingLimitRow,
    TenantRow,
)
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.mail import outbox
from gpu_share.coordinator.services.money import ledger, spending_mails
from gpu_share.coordinator.services.money.ledger import TransactionKind
from gpu_share.protocol.money import usdc_text
from gpu_share.protocol.spending_limits import SpendingLimits, SpendingLimitsUpdate

SPENT_KINDS = (TransactionKind.CHARGE.value, TransactionKind.REFUND.value)


def month_of(now: datetime) -> tuple[datetime, datetime, str]:
    """The calendar month (UTC) holding `now`: its first moment, the next month's, its name."""
    at = now.astimezone(UTC)
    start = datetime(at.year, at.month, 1, tzinfo=UTC)
    end = datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=UTC)
    return start, end, f"{at.year:04d}-{at.month:02d}"


async def spent_this_month(session: AsyncSession, tenant_id: str, now: datetime) -> int:
    """Charged this month net of this month's refunds, plus what is reserved now."""
    start, end, _ = month_of(now)
    accounts = [ledger.tenant_balance(tenant_id).id, ledger.tenant_reserved(tenant_id).id]
    moved = await session.scalar(
        select(func.coalesce(func.sum(LedgerEntryRow.amount_micro), 0))
        .join(LedgerTransactionRow, LedgerTransactionRow.id == LedgerEntryRow.transaction_id)
        .where(
            LedgerEntryRow.account_id.in_(accounts),
            LedgerEntryRow.created_at >= start,
            LedgerEntryRow.created_at < end,
            LedgerTransactionRow.kind.in_(SPENT_KINDS),
        )
    )
    # A CHARGE's entries on the tenant's two accounts sum to minus its cost; a REFUND's
    # to plus what it gave back.
    charged = max(0, -int(moved or 0))
    return charged + await ledger.balance(session, ledger.tenant_reserved(tenant_id))


async def view(
    session: AsyncSession, tenant_id: str, settings: Settings, now: datetime
) -> SpendingLimits:
    row = await session.get(SpendingLimitRow, tenant_id)
    cap = row.monthly_cap_micro if row else None
    low = row.low_balance_micro if row else None
    spent = await spent_this_month(session, tenant_id, now)
    return SpendingLimits(
        tenant_id=tenant_id,
        billing=settings.billing,
        monthly_cap=None if cap is None else usdc_text(cap),
        low_balance=None if low is None else usdc_text(low),
        month=month_of(now)[2],
        spent=usdc_text(spent),
        left=None if cap is None else usdc_text(max(0, cap - spent)),
    )


async def update(
    session: AsyncSession,
    tenant_id: str,
    body: SpendingLimitsUpdate,
    settings: Settings,
    now: datetime,
) -> SpendingLimits:
    """Set both limits (null removes one); with neither, the tenant has no row."""
    if body.monthly_cap is None and body.low_balance is None:
        await session.execute(
            delete(SpendingLimitRow).where(SpendingLimitRow.tenant_id == tenant_id)
        )
    else:
        values = {
            "monthly_cap_micro": body.monthly_cap,
            "low_balance_micro": body.low_balance,
            "updated_at": now,
        }
        insert = upsert(session)(SpendingLimitRow).values(tenant_id=tenant_id, **values)
        await session.execute(
            insert.on_conflict_do_update(index_elements=["tenant_id"], set_=values)
        )
    return await view(session, tenant_id, settings, now)


async def fits(session: AsyncSession, tenant_id: str, amount_micro: int, now: datetime) -> bool:
    """Whether new work reserving `amount_micro` now would pass the tenant's cap (for
    quotes: nothing is locked, so it is what a submit would be told now, not a promise)."""
    if amount_micro <= 0:
        return True  # nothing is reserved, so nothing is held back
    limits = await _limits(session, tenant_id, lock=False)
    if limits is None or limits.monthly_cap_micro is None:
        return True
    return (
        await spent_this_month(session, tenant_id, now) + amount_micro <= limits.monthly_cap_micro
    )


async def reserve(
    session: AsyncSession,
    *,
    tenant_id: str,
    amount_micro: int,
    cause: str,
    details: Mapping[str, Any],
    settings: Settings,
    now: datetime,
    new_work: str | None,
) -> None:
    """Hold `amount_micro` of the tenant's balance for work (RESERVE, once per `cause`).

    `new_work` words what asks ("this invoke may cost up to") for the cap's 402; None
    for running work, which the cap never stops. Raises `SpendingLimitReached` or the
    ledger's `InsufficientBalance`, having changed nothing."""
    limits = await _limits(session, tenant_id, lock=new_work is not None)
    cap = limits.monthly_cap_micro if limits is not None and new_work is not None else None
    spent = 0
    if cap is not None:
        spent = await spent_this_month(session, tenant_id, now)
        if spent + amount_micro > cap:
            raise _refusal(new_work or "", cap, spent, amount_micro, now)
    posted = await ledger.post(
        session,
        cause=cause,
        kind=TransactionKind.RESERVE,
        entries=ledger.transfer(
            ledger.tenant_balance(tenant_id), ledger.tenant_reserved(tenant_id), amount_micro
        ),
        now=now,
        details=details,
    )
    if not posted or limits is None:
        return
    if limits.low_balance_micro is not None:
        after = await ledger.balance(session, ledger.tenant_balance(tenant_id))
        if after < limits.low_balance_micro <= after + amount_micro:
            tenant = await session.get(TenantRow, tenant_id)
            assert tenant is not None
            mail = spending_mails.low_balance(
                tenant, after, limits.low_balance_micro, settings.mail_base_url
            )
            await outbox.enqueue(session, f"low_balance:{cause}", mail, now)
    if cap is not None and spent + amount_micro >= cap:
        await _mail_cap_reached(session, tenant_id, cap, spent + amount_micro, settings, now)


async def _limits(session: AsyncSession, tenant_id: str, *, lock: bool) -> SpendingLimitRow | None:
    """The tenant's limits, as a row in no session; `lock`: held until the transaction
    ends (`FOR UPDATE` on PostgreSQL; SQLite serializes write transactions), so what is
    read next of the month's spend stays true until this transaction has reserved. On
    the driver (`driver_sql`): every paid submit reads them."""
    tx = await driver_of(session)
    found = await tx.fetchrow(_LIMITS[(tx.dialect, lock)], tenant_id=tenant_id)
    return None if found is None else driver_models.transient(SpendingLimitRow, found)


_LIMITS = {
    (dialect, lock): driver_models.whole_row(
        SpendingLimitRow,
        "WHERE spending_limits.tenant_id = :tenant_id"
        + (" FOR UPDATE" if lock and dialect == "postgresql" else ""),
    )
    for dialect in ("postgresql", "sqlite")
    for lock in (False, True)
}


def _refusal(
    new_work: str, cap: int, spent: int, amount: int, now: datetime
) -> SpendingLimitReached:
    month = month_of(now)[2]
    return SpendingLimitReached(
        f"{new_work} {usdc_text(amount)} USDC, which would take this month's spend past "
        f"your monthly cap of {usdc_text(cap)} USDC: {usdc_text(spent)} USDC is spent or "
        f"held for running work in {month} (UTC). Raise or remove the cap (PUT "
        "/v1/billing/limits, or Limits on the Usage page), ask for less, or wait for "
        "next month",
        details={
            "monthly_cap": usdc_text(cap),
            "spent": usdc_text(spent),
            "required": usdc_text(amount),
            "month": month,
        },
    )


async def _mail_cap_reached(
    session: AsyncSession, tenant_id: str, cap: int, spent: int, settings: Settings, now: datetime
) -> None:
    month = month_of(now)[2]
    tenant = await session.get(TenantRow, tenant_id)
    assert tenant is not None
    mail = spending_mails.cap_reached(tenant, cap, spent, month, settings.mail_base_url)
    await outbox.enqueue(session, f"spending_cap:{tenant_id}:{month}", mail, now)


@asynccontextmanager
async def mailing_refusals(
    db: Database, tenant_id: str, settings: Settings, now: datetime
) -> AsyncIterator[None]:
    """Around the write transaction that submits new work: a refusal for the cap rolled
    that transaction back, so the month's cap mail is written here, in its own."""
    try:
        yield
    except SpendingLimitReached:
        async with db.write() as session:
            # Locked as a reserve locks it, so the month's one mail is written once
            # whichever refusals and reserves reach it at once.
            limits = await _limits(session, tenant_id, lock=True)
            if limits is not None and limits.monthly_cap_micro is not None:
                spent = await spent_this_month(session, tenant_id, now)
                await _mail_cap_reached(
                    session, tenant_id, limits.monthly_cap_micro, spent, settings, now
                )
        raise
