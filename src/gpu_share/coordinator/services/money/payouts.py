"""Payouts (SPEC §3.6): a provider's method and schedule, payout batches, paid and failed.

Money moves only through the ledger:

    pending ──PAYOUT──▶ in transit ──PAYOUT_PAID──▶ world
                            └──────PAYOUT_FAILED──▶ pending

A payout is the PAYOUT transaction for the cause ``payout:<provider>:<period>``, so a
period pays a provider at most once whatever runs it how often, and the payout row is
written in the same transaction only when that posting is new. A batch is one row per
period (a UNIQUE column), inserted or found already there: the replica that inserts it
makes its payouts in the same transaction, and any other finds it and does nothing. A
batch never grows after it is made, so an export stays the whole batch.

Marking a payout paid or failed is one guarded UPDATE from `in_transit`; a payout in
any other state answers 409 and nothing changes. Each event queues one mail per
payout (outbox cause ``<payout id>:<event>``).
"""

from datetime import date, datetime
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import upsert
from gpu_share.coordinator.core.errors import (
    Conflict,
    InsufficientBalance,
    NotFound,
    field_error,
)
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import (
    ChainPayoutRow,
    PayoutBatchRow,
    PayoutRow,
    ProviderRow,
)
from gpu_share.coordinator.services.mail import outbox
from gpu_share.coordinator.services.money import ledger, payout_mails
from gpu_share.coordinator.services.money.ledger import TransactionKind, transfer
from gpu_share.coordinator.services.money.payout_calendar import (
    due_period,
    next_payout_day,
)
from gpu_share.coordinator.services.webhooks import events
from gpu_share.protocol.bank_regions import iban_outside
from gpu_share.protocol.money import usdc_text
from gpu_share.protocol.payouts import (
    ChainState,
    Payout,
    PayoutMethod,
    PayoutSchedule,
    PayoutSettings,
    PayoutSettingsUpdate,
    PayoutStatus,
)

MANUAL = "manual"  # the period of a payout an admin made outside the schedule
_METHOD: TypeAdapter[PayoutMethod] = TypeAdapter(PayoutMethod)


async def _provider(session: AsyncSession, provider_id: str) -> ProviderRow:
    row = await session.get(ProviderRow, provider_id)
    if row is None:
        raise NotFound(f"no provider {provider_id}")
    return row


def _settings_of(row: ProviderRow, today: date, minimum_micro: int) -> PayoutSettings:
    schedule = PayoutSchedule(row.payout_schedule)
    return PayoutSettings(
        method=_METHOD.validate_python(row.payout_method) if row.payout_method else None,
        schedule=schedule,
        minimum=usdc_text(minimum_micro),
        next_payout_on=next_payout_day(schedule, today),
    )


async def get_settings(
    session: AsyncSession, provider_id: str, today: date, minimum_micro: int
) -> PayoutSettings:
    return _settings_of(await _provider(session, provider_id), today, minimum_micro)


async def set_settings(
    session: AsyncSession,
    provider_id: str,
    change: PayoutSettingsUpdate,
    today: date,
    minimum_micro: int,
    bank_regions: list[str] | None = None,
) -> PayoutSettings:
    """Applies to payouts made from now on; one already made keeps the method it was made to.
    A bank account must be in `bank_regions` (`protocol.bank_regions`; None: anywhere)."""
    if bank_regions is not None and change.method.kind == "bank_transfer":
        outside = iban_outside(change.method.iban, bank_regions)
        if outside is not None:
            raise field_error("method.iban", outside)
    row = await _provider(session, provider_id)
    row.payout_method = change.method.model_dump(mode="json")
    row.payout_schedule = change.schedule.value
    await session.flush()
    return _settings_of(row, today, minimum_micro)


# ---- making payouts -----------------------------------------------------------------


async def create_payout(
    session: AsyncSession,
    provider: ProviderRow,
    amount_micro: int,
    *,
    period: str,
    batch_id: str | None,
    now: datetime,
    base_url: str,
) -> PayoutRow | None:
    """Move `amount_micro` of the provider's pending earnings into transit as one payout.

    None when this provider's `period` was paid before. 402 (changing nothing) when the
    amount is more than the pending balance; 409 without a payout method.
    """
    if provider.payout_method is None:
        raise Conflict(
            "this provider has no payout method: they set one under Payouts first",
        )
    payout_id = new_id("pay")
    cause = f"payout:{provider.id}:{payout_id if period == MANUAL else period}"
    try:
        posted = await ledger.post(
            session,
            cause=cause,
            kind=TransactionKind.PAYOUT,
            entries=transfer(
                ledger.provider_pending(provider.id),
                ledger.payouts_in_transit(provider.id),
                amount_micro,
            ),
            now=now,
            details={"payout_id": payout_id, "provider_id": provider.id, "period": period},
        )
    except InsufficientBalance:
        pending = await ledger.balance(session, ledger.provider_pending(provider.id))
        raise InsufficientBalance(
            f"a payout of {usdc_text(amount_micro)} USDC is more than the pending balance of "
            f"{usdc_text(pending)} USDC; pay out at most {usdc_text(pending)}",
            details={"available": usdc_text(pending), "required": usdc_text(amount_micro)},
        ) from None
    if not posted:
        return None
    row = PayoutRow(
        id=payout_id,
        provider_id=provider.id,
        batch_id=batch_id,
        amount_micro=amount_micro,
        method=dict(provider.payout_method),
        status=PayoutStatus.IN_TRANSIT.value,
        created_at=now,
    )
    session.add(row)
    await session.flush()
    mail = payout_mails.created(provider, row, base_url)
    await outbox.enqueue(session, f"{payout_id}:created", mail, now)
    return row


async def pay_out_now(
    session: AsyncSession, provider_id: str, amount_micro: int, now: datetime, base_url: str
) -> Payout:
    """An admin's payout outside the schedule (a provider leaving, a correction)."""
    provider = await _provider(session, provider_id)
    row = await create_payout(
        session, provider, amount_micro, period=MANUAL, batch_id=None, now=now, base_url=base_url
    )
    assert row is not None  # a manual payout's cause is its own new id
    return payout_of(row, MANUAL)


async def make_batch(
    session: AsyncSession,
    schedule: PayoutSchedule,
    period: str,
    now: datetime,
    minimum_micro: int,
    base_url: str,
) -> str | None:
    """The batch of `period` and its payouts, made once: None when it exists already.

    Pays every provider on `schedule` with a payout method whose pending balance is more
    than zero and, for weekly payouts, at least `minimum_micro`. An empty batch is kept:
    it records that the period ran and nobody was due.
    """
    batch_id = new_id("pbat")
    inserted = await session.execute(
        upsert(session)(PayoutBatchRow)
        .values(id=batch_id, period=period, created_at=now, exported_at=None)
        .on_conflict_do_nothing(index_elements=["period"])
        .returning(PayoutBatchRow.id)
    )
    if inserted.scalar_one_or_none() is None:
        return None
    threshold = max(1, minimum_micro if schedule is PayoutSchedule.WEEKLY else 1)
    providers = (
        await session.scalars(
            select(ProviderRow)
            .where(
                ProviderRow.payout_schedule == schedule.value,
                ProviderRow.payout_method.is_not(None),
            )
            .order_by(ProviderRow.id)
        )
    ).all()
    for provider in providers:
        if provider.payout_method is None:  # a JSON null
            continue
        pending = await ledger.balance(session, ledger.provider_pending(provider.id))
        if pending >= threshold:
            await create_payout(
                session,
                provider,
                pending,
                period=period,
                batch_id=batch_id,
                now=now,
                base_url=base_url,
            )
    return batch_id


def due_periods(today: date) -> list[tuple[PayoutSchedule, str]]:
    due = ((s, due_period(s, today)) for s in PayoutSchedule)
    return [(schedule, period) for schedule, period in due if period is not None]


# ---- settling payouts ---------------------------------------------------------------


async def _settle(
    session: AsyncSession, payout_id: str, values: dict[str, Any], action: str
) -> PayoutRow:
    moved = await session.execute(
        update(PayoutRow)
        .where(PayoutRow.id == payout_id, PayoutRow.status == PayoutStatus.IN_TRANSIT.value)
        .values(**values)
    )
    row = await session.get(PayoutRow, payout_id, populate_existing=True)
    if row is None:
        raise NotFound(f"no payout {payout_id}")
    if moved.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict(
            f"payout {payout_id} is {row.status.replace('_', ' ')}, so it cannot be marked "
            f"{action}: only a payout in transit can",
            details={"status": row.status},
        )
    # Checked after the UPDATE, which holds the payout's row: a replica sending it on
    # Solana records its transaction only while holding that row too.
    on_chain = await session.scalar(
        select(ChainPayoutRow.signature).where(
            ChainPayoutRow.payout_id == payout_id,
            ChainPayoutRow.state == ChainState.SENDING.value,
            ChainPayoutRow.signature.is_not(None),
        )
    )
    if on_chain is not None:
        raise Conflict(
            f"payout {payout_id} is being sent on Solana (transaction {on_chain}); it is "
            "marked paid or failed when the chain says which",
            details={"signature": on_chain},
        )
    return row


async def mark_paid(
    session: AsyncSession, payout_id: str, reference: str, now: datetime, base_url: str
) -> Payout:
    row = await _settle(
        session,
        payout_id,
        {"status": PayoutStatus.PAID.value, "reference": reference, "settled_at": now},
        "paid",
    )
    await ledger.post(
        session,
        cause=f"payout:{payout_id}:paid",
        kind=TransactionKind.PAYOUT_PAID,
        entries=transfer(
            ledger.payouts_in_transit(row.provider_id), ledger.WORLD, row.amount_micro
        ),
        now=now,
        details={"payout_id": payout_id, "provider_id": row.provider_id, "reference": reference},
    )
    provider = await _provider(session, row.provider_id)
    await outbox.enqueue(
        session, f"{payout_id}:paid", payout_mails.paid(provider, row, base_url), now
    )
    return await _told(session, row.provider_id, payout_id, "payout.paid", now)


async def mark_failed(
    session: AsyncSession, payout_id: str, reason: str, now: datetime, base_url: str
) -> Payout:
    row = await _settle(
        session,
        payout_id,
        {"status": PayoutStatus.FAILED.value, "failure_reason": reason, "settled_at": now},
        "failed",
    )
    await ledger.post(
        session,
        cause=f"payout:{payout_id}:failed",
        kind=TransactionKind.PAYOUT_FAILED,
        entries=transfer(
            ledger.payouts_in_transit(row.provider_id),
            ledger.provider_pending(row.provider_id),
            row.amount_micro,
        ),
        now=now,
        details={"payout_id": payout_id, "provider_id": row.provider_id, "reason": reason},
    )
    provider = await _provider(session, row.provider_id)
    mail = payout_mails.failed(provider, row, base_url)
    await outbox.enqueue(session, f"{payout_id}:failed", mail, now)
    return await _told(session, row.provider_id, payout_id, "payout.failed", now)


async def _told(
    session: AsyncSession, provider_id: str, payout_id: str, event_type: str, now: datetime
) -> Payout:
    """The settled payout, sent to the provider's endpoints that take `event_type`."""
    settled = await payout(session, payout_id)
    await events.emit(
        session,
        owner_id=provider_id,
        event_type=event_type,
        data=settled.model_dump(mode="json"),
        cause=f"{payout_id}:{event_type}",
        now=now,
    )
    return settled


# ---- reading ------------------------------------------------------------------------


def payout_of(row: PayoutRow, period: str | None) -> Payout:
    return Payout(
        id=row.id,
        batch_id=row.batch_id,
        period=period or MANUAL,
        amount=usdc_text(row.amount_micro),
        method=_METHOD.validate_python(row.method),
        status=PayoutStatus(row.status),
        created_at=row.created_at,
        settled_at=row.settled_at,
        reference=row.reference,
        failure_reason=row.failure_reason,
    )


async def payout(session: AsyncSession, payout_id: str) -> Payout:
    found = (
        await session.execute(
            select(PayoutRow, PayoutBatchRow.period)
            .outerjoin(PayoutBatchRow, PayoutBatchRow.id == PayoutRow.batch_id)
            .where(PayoutRow.id == payout_id)
            .execution_options(populate_existing=True)
        )
    ).first()
    if found is None:
        raise NotFound(f"no payout {payout_id}")
    return payout_of(found[0], found[1])


async def of_provider(session: AsyncSession, provider_id: str, limit: int = 200) -> list[Payout]:
    """The provider's payouts, newest first."""
    rows = await session.execute(
        select(PayoutRow, PayoutBatchRow.period)
        .outerjoin(PayoutBatchRow, PayoutBatchRow.id == PayoutRow.batch_id)
        .where(PayoutRow.provider_id == provider_id)
        .order_by(PayoutRow.created_at.desc(), PayoutRow.id.desc())
        .limit(limit)
    )
    return [payout_of(row, period) for row, period in rows.all()]
