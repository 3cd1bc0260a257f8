"""A tenant's money (SPEC §4.4): balance, usage read from its charges, admin top-ups.

Usage is read from the books, never from invokes or sessions: the CHARGE transactions
that took money out of this tenant's reserve, with the `ChargeDetails` each carries,
and the REFUND that gave one back, if any (cause ``refund:<charge id>``,
`clawbacks.refund_cause`). A refund counts against the charge it undoes, on that
charge's day whenever it was made, so what usage says was spent is what the books took
from the tenant for good.
"""

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import literal, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from gpu_share.coordinator.core.csv_export import csv_text
from gpu_share.coordinator.core.errors import Conflict, NotFound
from gpu_share.coordinator.core.orm import (
    LedgerAccountRow,
    LedgerEntryRow,
    LedgerTransactionRow,
    TenantRow,
)
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.money import ledger
from gpu_share.coordinator.services.money.clawbacks import refund_cause
from gpu_share.coordinator.services.money.ledger import TransactionKind
from gpu_share.coordinator.services.money.periods import days_asked
from gpu_share.coordinator.services.webhooks import events
from gpu_share.protocol.billing import (
    Balance,
    Charge,
    TopUp,
    TopUpCreate,
    Usage,
    UsageGroup,
    UsageLine,
)
from gpu_share.protocol.money import to_micro, usdc_text

MAX_CHARGES = 100_000  # one usage read; a CSV of more is asked for by narrower dates


async def balance(session: AsyncSession, tenant_id: str, settings: Settings) -> Balance:
    available = await ledger.balance(session, ledger.tenant_balance(tenant_id))
    reserved = await ledger.balance(session, ledger.tenant_reserved(tenant_id))
    return Balance(
        tenant_id=tenant_id,
        billing=settings.billing,
        available=usdc_text(available),
        reserved=usdc_text(reserved),
    )


async def available_by_tenant(session: AsyncSession) -> dict[str, int]:
    """Every tenant's spendable balance (those that never had one are absent)."""
    rows = await session.execute(
        select(LedgerAccountRow.owner_id, LedgerAccountRow.balance_micro).where(
            LedgerAccountRow.kind == ledger.AccountKind.TENANT_BALANCE.value
        )
    )
    return {str(owner): int(micro) for owner, micro in rows.all() if owner}


def period(start: date | None, end: date | None, today: date) -> tuple[date, date]:
    """The UTC days asked for (`periods.days_asked`)."""
    return days_asked(today, start, end, names=("from", "to"))


def _moment(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


async def charges(session: AsyncSession, tenant_id: str, start: date, end: date) -> list[Charge]:
    """The tenant's charges made on UTC days `start`..`end`, oldest first, each with
    the refund that gave it back, if one did."""
    reserve_account = ledger.tenant_reserved(tenant_id).id
    charge, refund = LedgerTransactionRow, aliased(LedgerTransactionRow)
    rows = await session.execute(
        select(charge.created_at, charge.details, refund.created_at, refund.details)
        .join(LedgerEntryRow, LedgerEntryRow.transaction_id == charge.id)
        .outerjoin(
            refund,
            (refund.cause == literal(refund_cause("")).concat(charge.id))
            & (refund.kind == TransactionKind.REFUND.value),
        )
        .where(
            LedgerEntryRow.account_id == reserve_account,
            LedgerEntryRow.created_at >= _moment(start),
            LedgerEntryRow.created_at < _moment(end + timedelta(days=1)),
            charge.kind == TransactionKind.CHARGE.value,
        )
        .order_by(LedgerEntryRow.created_at, LedgerEntryRow.id)
        .limit(MAX_CHARGES)
    )
    return [_charge(*row) for row in rows.all()]


def _charge(
    at: datetime,
    d: dict[str, Any],
    refunded_at: datetime | None = None,
    refund: dict[str, Any] | None = None,
) -> Charge:
    undone = refund if refunded_at is not None and refund is not None else {}
    return Charge(
        at=at,
        work=str(d.get("work", "")),
        work_id=str(d.get("work_id", "")),
        runtime=str(d.get("runtime", "")),
        node_id=str(d.get("node_id", "")),
        gpu_model=str(d.get("gpu_model", "")),
        gpus=int(d.get("gpus", 1)),
        spot=bool(d.get("spot")),
        seconds=float(d.get("seconds", 0)),
        rate_per_hour=usdc_text(int(d.get("rate_micro_per_hour", 0))),
        cost=usdc_text(int(d.get("cost_micro", 0))),
        refunded=usdc_text(int(undone.get("cost_micro", 0))),
        refunded_at=refunded_at,
        refund_reason=str(undone.get("reason") or "") or None,
    )


def spent_micro(charge: Charge) -> int:
    """What the charge took from the tenant for good: its cost less what was refunded."""
    return to_micro(charge.cost) - to_micro(charge.refunded)


def summarize(
    tenant_id: str, found: Iterable[Charge], group: UsageGroup, start: date, end: date
) -> Usage:
    """Usage per UTC day (every day of the period, zeros included) or per runtime: what
    was spent, net of refunds (a refunded charge costs nothing), and what was refunded."""
    cost: dict[str, int] = defaultdict(int)
    refunded: dict[str, int] = defaultdict(int)
    seconds: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    if group is UsageGroup.DAY:
        for n in range((end - start).days + 1):
            cost[(start + timedelta(days=n)).isoformat()] = 0
    for charge in found:
        key = charge.at.date().isoformat() if group is UsageGroup.DAY else charge.runtime
        cost[key] += spent_micro(charge)
        refunded[key] += to_micro(charge.refunded)
        seconds[key] += charge.seconds
        count[key] += 1
    lines = [
        UsageLine(
            key=key,
            charges=count[key],
            seconds=round(seconds[key], 3),
            cost=usdc_text(c),
            refunded=usdc_text(refunded[key]),
        )
        for key, c in sorted(cost.items())
    ]
    return Usage(
        tenant_id=tenant_id,
        group=group,
        start=start,
        end=end,
        lines=lines,
        total=usdc_text(sum(cost.values())),
        refunded=usdc_text(sum(refunded.values())),
    )


CSV_COLUMNS = list(Charge.model_fields)


def as_csv(found: Iterable[Charge]) -> str:
    rows = (charge.model_dump(mode="json") for charge in found)
    return csv_text(CSV_COLUMNS, ([row[column] for column in CSV_COLUMNS] for row in rows))


def top_up_cause(tenant_id: str, reference: str) -> str:
    """One payment is one reference: a resent request, or the same wire posted again
    under another Idempotency-Key (or none), finds the top-up made before."""
    return f"top_up:{tenant_id}:ref:{reference}"


def _keyed_causes(tenant_id: str) -> str:
    """The start of the causes top-ups sent with an Idempotency-Key were recorded under
    (``top_up:<tenant>:key:<key>``) before a top-up's cause was its reference alone."""
    return f"top_up:{tenant_id}:key:"


async def _details(session: AsyncSession, cause: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = await session.scalar(
        select(LedgerTransactionRow.details).where(LedgerTransactionRow.cause == cause)
    )
    return found


async def _keyed_before(
    session: AsyncSession, tenant_id: str, reference: str
) -> dict[str, Any] | None:
    """The top-up of this tenant recorded under some Idempotency-Key for `reference`, if
    one was: the payment it credited is that reference's, whatever key comes now (or
    none), so finding it by the key it came with would credit it again under another."""
    found: dict[str, Any] | None = await session.scalar(
        select(LedgerTransactionRow.details)
        .where(
            LedgerTransactionRow.kind == TransactionKind.TOP_UP.value,
            LedgerTransactionRow.cause.startswith(_keyed_causes(tenant_id), autoescape=True),
            LedgerTransactionRow.details["reference"].as_string() == reference,
        )
        .order_by(LedgerTransactionRow.created_at, LedgerTransactionRow.id)
        .limit(1)
    )
    return found


async def top_up(
    session: AsyncSession,
    tenant_id: str,
    body: TopUpCreate,
    *,
    idempotency_key: str | None,
    admin: str,
    now: datetime,
) -> TopUp:
    """Credit a tenant's balance from outside (a payment received), once per reference:
    the same reference again credits nothing, and with another amount is a Conflict.

    `idempotency_key` changes nothing: a top-up is found by its reference, under the
    cause it is posted with now or under any key it was once recorded with."""
    del idempotency_key  # accepted from clients that send one with every POST
    if await session.get(TenantRow, tenant_id) is None:
        raise NotFound(f"tenant {tenant_id} does not exist")
    cause = top_up_cause(tenant_id, body.reference)
    before = await _keyed_before(session, tenant_id, body.reference)
    made = before is None and await ledger.post(
        session,
        cause=cause,
        kind=TransactionKind.TOP_UP,
        entries=ledger.transfer(ledger.WORLD, ledger.tenant_balance(tenant_id), body.amount),
        now=now,
        details={
            "tenant_id": tenant_id,
            "amount_micro": body.amount,
            "reference": body.reference,
            "by": admin,
        },
    )
    if not made:
        before = before or await _details(session, cause) or {}
        credited = int(before.get("amount_micro", 0))
        if credited != body.amount:
            raise Conflict(
                f"reference {body.reference!r} was credited before with {usdc_text(credited)} "
                f"USDC; this top-up says {usdc_text(body.amount)} USDC. A payment is credited "
                "once: a new payment needs its own reference",
                details={
                    "reference": body.reference,
                    "credited": usdc_text(credited),
                    "amount": usdc_text(body.amount),
                },
            )
    available = await ledger.balance(session, ledger.tenant_balance(tenant_id))
    if made:
        await events.emit(
            session,
            owner_id=tenant_id,
            event_type="topup.credited",
            data={"amount": usdc_text(body.amount), "reference": body.reference, "via": "admin"},
            cause=cause,
            now=now,
        )
    return TopUp(
        tenant_id=tenant_id,
        amount=usdc_text(body.amount),
        reference=body.reference,
        replayed=not made,
        available=usdc_text(available),
    )
