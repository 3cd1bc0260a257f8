"""A provider's earnings (SPEC §3.6), read from the books: every CHARGE transaction that
paid into the provider's held account (or, before earnings were held, straight into
their pending one), with the `ChargeDetails` it carries; and what of it is still held
(`earnings_hold`), payable, taken back, in transit and paid.

The amount of a line is the entry that landed in the provider's account (the books
are the truth); the tenant's cost and the platform's commission come from the
charge's details. Where each charge stands (`ChargeStatus`) is read with it: held while
its hold row lasts (`earnings_hold`), refunded once a REFUND gave it back
(`clawbacks`), else payable. Which tenant paid is never shown to the provider. Days and
weeks are UTC: a week starts on Monday 00:00, a month on the 1st.
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import func, literal, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from gpu_share.coordinator.core.csv_export import csv_text
from gpu_share.coordinator.core.orm import (
    EarningsHoldRow,
    LedgerEntryRow,
    LedgerTransactionRow,
    NodeRow,
)
from gpu_share.coordinator.services.money import ledger
from gpu_share.coordinator.services.money.clawbacks import refund_cause
from gpu_share.coordinator.services.money.earnings_hold import HoldPolicy, held_by_day
from gpu_share.coordinator.services.money.ledger import TransactionKind
from gpu_share.coordinator.services.money.payout_calendar import midnight, month_start, week_start
from gpu_share.coordinator.services.money.periods import days_asked
from gpu_share.protocol.money import to_micro, usdc_text
from gpu_share.protocol.payouts import (
    DayEarnings,
    Earnings,
    EarningsEntry,
    EarningsTotal,
    GpuEarnings,
    HeldRelease,
    ModelEarnings,
)

HISTORY_LIMIT = 200


class ChargeStatus(StrEnum):
    """Where a charge's earnings stand, as the books hold them."""

    HELD = "held"  # in the hold: payable once it passes (`payable_at`), refundable until then
    PAYABLE = "payable"  # past its hold (or posted before holds): payouts take it
    REFUNDED = "refunded"  # given back to the tenant while held: never payable


@dataclass(frozen=True)
class Charge:
    at: datetime
    amount_micro: int  # into the provider's held (before holds: pending) account
    details: dict[str, Any]
    charge_id: str = ""  # the CHARGE transaction
    hold: str | None = None  # which hold applies, while the charge is held (`earnings_hold`)
    held_since: datetime | None = None  # while held: when its hold started counting
    refunded: bool = False

    @property
    def gpu_seconds(self) -> float:
        return float(self.details.get("seconds", 0)) * int(self.details.get("gpus", 1))

    @property
    def status(self) -> ChargeStatus:
        if self.hold is not None:
            return ChargeStatus.HELD
        return ChargeStatus.REFUNDED if self.refunded else ChargeStatus.PAYABLE

    def payable_at(self, policy: HoldPolicy) -> datetime | None:
        """When a held charge becomes payable; None once it is (or once refunded)."""
        if self.hold is None:
            return None
        return policy.payable_at(self.hold, self.held_since or self.at)


def date_range(now: datetime, since: date | None, until: date | None) -> tuple[date, date]:
    """The inclusive UTC days asked for (`periods.days_asked`)."""
    return days_asked(now.astimezone(UTC).date(), since, until, names=("since", "until"))


async def charges(
    session: AsyncSession, provider_id: str, start: datetime, end: datetime
) -> list[Charge]:
    """The provider's charges posted in [start, end), newest first, each with where it
    stands: its hold while held, and whether a refund gave it back."""
    charge, refund = LedgerTransactionRow, aliased(LedgerTransactionRow)
    rows = await session.execute(
        select(
            charge.created_at,
            LedgerEntryRow.amount_micro,
            charge.details,
            charge.id,
            EarningsHoldRow.hold,
            EarningsHoldRow.earned_at,
            refund.id,
        )
        .join(charge, charge.id == LedgerEntryRow.transaction_id)
        .outerjoin(EarningsHoldRow, EarningsHoldRow.charge_id == charge.id)
        .outerjoin(
            refund,
            (refund.cause == literal(refund_cause("")).concat(charge.id))
            & (refund.kind == TransactionKind.REFUND.value),
        )
        .where(
            LedgerEntryRow.account_id.in_(
                [ledger.provider_held(provider_id).id, ledger.provider_pending(provider_id).id]
            ),
            charge.kind == TransactionKind.CHARGE.value,
            LedgerEntryRow.created_at >= start,
            LedgerEntryRow.created_at < end,
        )
        .order_by(LedgerEntryRow.created_at.desc(), LedgerEntryRow.id.desc())
    )
    return [
        Charge(at, int(amount), dict(details or {}), charge_id, hold, since, refund_id is not None)
        for at, amount, details, charge_id, hold, since, refund_id in rows.all()
    ]


def total(items: Iterable[Charge]) -> EarningsTotal:
    amount, seconds, count = 0, 0.0, 0
    for charge in items:
        amount += charge.amount_micro
        seconds += charge.gpu_seconds
        count += 1
    return EarningsTotal(
        amount=usdc_text(amount), gpu_hours=round(seconds / 3600, 4), charges=count
    )


NodeNames = dict[str, tuple[str, str | None]]  # node id: (hostname, provider's label)


async def _node_names(session: AsyncSession, node_ids: set[str]) -> NodeNames:
    if not node_ids:
        return {}
    rows = await session.execute(
        select(NodeRow.id, NodeRow.hostname, NodeRow.label).where(NodeRow.id.in_(node_ids))
    )
    return {node_id: (hostname, label) for node_id, hostname, label in rows.all()}


def entry(charge: Charge, names: NodeNames, payable_at: datetime | None = None) -> EarningsEntry:
    d = charge.details
    node_id = str(d.get("node_id", ""))
    hostname, label = names.get(node_id, (None, None))
    return EarningsEntry(
        at=charge.at,
        node_id=node_id,
        hostname=hostname,
        label=label,
        gpu_model=str(d.get("gpu_model", "")),
        gpus=int(d.get("gpus", 1)),
        seconds=float(d.get("seconds", 0)),
        work=str(d.get("work", "")),
        runtime=str(d.get("runtime", "")),
        amount=usdc_text(charge.amount_micro),
        tenant_paid=usdc_text(int(d.get("cost_micro", charge.amount_micro))),
        commission=usdc_text(int(d.get("commission_micro", 0))),
        payable_at=payable_at,
    )


async def earnings(
    session: AsyncSession,
    provider_id: str,
    now: datetime,
    since: date | None = None,
    until: date | None = None,
    history_limit: int = HISTORY_LIMIT,
    *,
    hold: HoldPolicy,
) -> Earnings:
    """`hold`: the hold lengths in force, which say when held earnings become payable."""
    first, last = date_range(now, since, until)
    start, end = midnight(first), midnight(last + timedelta(days=1))
    in_range = await charges(session, provider_id, start, end)
    week, month = week_start(now), month_start(now)
    recent = await charges(session, provider_id, min(week, month), now + timedelta(seconds=1))

    by_gpu: dict[tuple[str, str], list[Charge]] = defaultdict(list)
    by_model: dict[str, list[Charge]] = defaultdict(list)
    by_day: dict[date, int] = defaultdict(int)
    for charge in in_range:
        node_id, model = (
            str(charge.details.get("node_id", "")),
            str(charge.details.get("gpu_model", "")),
        )
        by_gpu[(node_id, model)].append(charge)
        by_model[model].append(charge)
        by_day[charge.at.date()] += charge.amount_micro
    names = await _node_names(
        session,
        {n for n, _ in by_gpu}
        | {str(c.details.get("node_id", "")) for c in in_range[:history_limit]},
    )
    per_gpu = [
        GpuEarnings(
            node_id=n,
            hostname=names.get(n, (None, None))[0],
            label=names.get(n, (None, None))[1],
            gpu_model=m,
            **total(items).model_dump(),
        )
        for (n, m), items in by_gpu.items()
    ]
    per_model = [
        ModelEarnings(gpu_model=m, **total(items).model_dump()) for m, items in by_model.items()
    ]
    per_gpu.sort(
        key=lambda g: (-to_micro(g.amount), g.label or g.hostname or g.node_id, g.gpu_model)
    )
    per_model.sort(key=lambda g: (-to_micro(g.amount), g.gpu_model))
    shown = in_range[:history_limit]
    held = await ledger.balance(session, ledger.provider_held(provider_id))
    payable = await ledger.balance(session, ledger.provider_pending(provider_id))
    taken = await taken_back(session, provider_id)
    return Earnings(
        pending=usdc_text(held + payable),
        held=usdc_text(held),
        payable=usdc_text(payable),
        releases=[
            HeldRelease(on=part.day, amount=usdc_text(part.amount_micro))
            for part in await held_by_day(session, provider_id, now, hold)
        ],
        refunded=usdc_text(taken[TransactionKind.REFUND]),
        forfeited=usdc_text(taken[TransactionKind.FORFEIT]),
        in_transit=usdc_text(await ledger.balance(session, ledger.payouts_in_transit(provider_id))),
        paid=usdc_text(await paid_total(session, provider_id)),
        this_week=total(c for c in recent if c.at >= week),
        this_month=total(c for c in recent if c.at >= month),
        since=first,
        until=last,
        total=total(in_range),
        per_gpu=per_gpu,
        per_model=per_model,
        daily=[
            DayEarnings(
                day=first + timedelta(days=i), amount=usdc_text(by_day[first + timedelta(days=i)])
            )
            for i in range((last - first).days + 1)
        ],
        history=[entry(c, names, c.payable_at(hold)) for c in shown],
        history_limit=history_limit,
    )


async def taken_back(session: AsyncSession, provider_id: str) -> dict[TransactionKind, int]:
    """What left the provider's held account for refunds and forfeits, all time."""
    kinds = [TransactionKind.REFUND, TransactionKind.FORFEIT]
    rows = await session.execute(
        select(LedgerTransactionRow.kind, func.coalesce(func.sum(LedgerEntryRow.amount_micro), 0))
        .join(LedgerTransactionRow, LedgerTransactionRow.id == LedgerEntryRow.transaction_id)
        .where(
            LedgerEntryRow.account_id == ledger.provider_held(provider_id).id,
            LedgerTransactionRow.kind.in_([k.value for k in kinds]),
        )
        .group_by(LedgerTransactionRow.kind)
    )
    found = {TransactionKind(kind): -int(total) for kind, total in rows.all()}
    return {kind: found.get(kind, 0) for kind in kinds}


async def paid_total(session: AsyncSession, provider_id: str) -> int:
    """All payouts of this provider marked paid: what left the in-transit account for good."""
    paid = await session.scalar(
        select(func.coalesce(func.sum(LedgerEntryRow.amount_micro), 0))
        .join(LedgerTransactionRow, LedgerTransactionRow.id == LedgerEntryRow.transaction_id)
        .where(
            LedgerEntryRow.account_id == ledger.payouts_in_transit(provider_id).id,
            LedgerTransactionRow.kind == TransactionKind.PAYOUT_PAID.value,
        )
    )
    return -int(paid or 0)


CSV_COLUMNS = [
    "time_utc",
    "node_id",
    "hostname",
    "gpu_model",
    "gpus",
    "seconds",
    "work",
    "runtime",
    "earned_usdc",
    "tenant_paid_usdc",
    "commission_usdc",
    "status",
    "payable_at",
]


async def earnings_csv(
    session: AsyncSession,
    provider_id: str,
    now: datetime,
    since: date | None,
    until: date | None,
    *,
    hold: HoldPolicy | None = None,
) -> tuple[str, str]:
    """(file name, CSV text) of every charge in the range, oldest first, with where each
    stands (`ChargeStatus`) and, while held, when it becomes payable under `hold` (the
    hold lengths in force; without them that cell is left empty)."""
    first, last = date_range(now, since, until)
    found = await charges(session, provider_id, midnight(first), midnight(last + timedelta(days=1)))
    names = await _node_names(session, {str(c.details.get("node_id", "")) for c in found})
    rows = [
        [
            e.at.isoformat(),
            e.node_id,
            e.hostname,
            e.gpu_model,
            e.gpus,
            f"{e.seconds:.3f}",
            e.work,
            e.runtime,
            e.amount,
            e.tenant_paid,
            e.commission,
            charge.status.value,
            e.payable_at.isoformat() if e.payable_at else "",
        ]
        for charge, e in (
            (charge, entry(charge, names, charge.payable_at(hold) if hold else None))
            for charge in reversed(found)
        )
    ]
    return f"earnings-{first.isoformat()}-{last.isoformat()}.csv", csv_text(CSV_COLUMNS, rows)
