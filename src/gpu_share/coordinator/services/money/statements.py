"""Monthly statements (SPEC §3.6, §4.4): one UTC calendar month of a tenant's spend or a
provider's earnings and payouts, as JSON and CSV.

The figures are the books' own, read the way the Usage and Earnings pages read them
(`tenant_billing.charges`, `earnings.charges`): every CHARGE posted in the month, with
the REFUND that gave it back, if any, netted against it whenever it was made. A
statement of a past month therefore changes only if a charge of that month is refunded
later. Payouts are those made in the month, with the reference that settled them (a
Solana signature or bank reference) or, for a bank payout in a bank file, the
end-to-end id the bank reports it under.
"""

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.csv_export import Cell, csv_text
from gpu_share.coordinator.core.errors import Conflict, field_error
from gpu_share.coordinator.core.orm import BankTransferRow, PayoutBatchRow, PayoutRow
from gpu_share.coordinator.services.money import earnings, tenant_billing
from gpu_share.coordinator.services.money.payout_calendar import midnight
from gpu_share.coordinator.services.money.payouts import MANUAL
from gpu_share.protocol.money import to_micro, usdc_text
from gpu_share.protocol.payouts import PayoutStatus
from gpu_share.protocol.statements import (
    EarningsLine,
    ProviderStatement,
    SpendLine,
    StatementPayout,
    TenantStatement,
)

MONTH = re.compile(r"^(\d{4})-(\d{2})$", re.ASCII)
FIRST_YEAR = 2000


@dataclass(frozen=True)
class Month:
    name: str  # YYYY-MM
    start: date
    end: date  # the last day, or today while the month runs
    complete: bool


def month_of(text: str, now: datetime) -> Month:
    """The UTC month `text` names (YYYY-MM); 422 for anything else or a month to come."""
    found = MONTH.match(text)
    if found is None or not 1 <= int(found[2]) <= 12 or int(found[1]) < FIRST_YEAR:
        raise field_error("month", f"{text!r} is not a month: write it as YYYY-MM, e.g. 2026-11")
    today = now.astimezone(UTC).date()
    start = date(int(found[1]), int(found[2]), 1)
    if start > today:
        raise field_error(
            "month", f"{text} has not started yet: the latest statement is {today:%Y-%m}"
        )
    following = (start + timedelta(days=32)).replace(day=1)
    last = following - timedelta(days=1)
    return Month(text, start, min(last, today), complete=last < today)


# ---- tenants ------------------------------------------------------------------------


@dataclass
class _Spend:
    charges: int = 0
    gpu_seconds: float = 0.0
    cost: int = 0
    refunded: int = 0

    def line(self, key: str) -> SpendLine:
        return SpendLine(
            key=key,
            charges=self.charges,
            gpu_hours=round(self.gpu_seconds / 3600, 4),
            cost=usdc_text(self.cost),
            refunded=usdc_text(self.refunded),
            net=usdc_text(self.cost - self.refunded),
        )


async def tenant_statement(
    session: AsyncSession, tenant_id: str, month: str, now: datetime
) -> TenantStatement:
    span = month_of(month, now)
    found = await tenant_billing.charges(session, tenant_id, span.start, span.end)
    if len(found) >= tenant_billing.MAX_CHARGES:  # read in part: its sums would be wrong
        raise Conflict(
            f"{span.name} has more than {tenant_billing.MAX_CHARGES:,} charges, more than a "
            "statement reads at once: take the usage CSV (GET /v1/billing/usage.csv) a few "
            "days at a time"
        )
    runtimes: dict[str, _Spend] = defaultdict(_Spend)
    models: dict[str, _Spend] = defaultdict(_Spend)
    total = _Spend()
    for charge in found:
        for spend in (runtimes[charge.runtime], models[charge.gpu_model], total):
            spend.charges += 1
            spend.gpu_seconds += charge.seconds * max(charge.gpus, 1)
            spend.cost += to_micro(charge.cost)
            spend.refunded += to_micro(charge.refunded)
    return TenantStatement(
        tenant_id=tenant_id,
        month=span.name,
        start=span.start,
        end=span.end,
        complete=span.complete,
        by_runtime=[s.line(k) for k, s in sorted(runtimes.items())],
        by_gpu_model=[s.line(k) for k, s in sorted(models.items())],
        total=total.line("total"),
    )


TENANT_COLUMNS = [
    "section",
    "key",
    "charges",
    "gpu_hours",
    "cost_usdc",
    "refunded_usdc",
    "net_usdc",
]


def tenant_csv(statement: TenantStatement) -> tuple[str, str]:
    """(file name, CSV): a line per runtime, then per GPU model, then the total."""
    sections = [("runtime", statement.by_runtime), ("gpu_model", statement.by_gpu_model)]
    lines = [(name, line) for name, group in sections for line in group]
    lines.append(("total", statement.total))
    rows: list[list[Cell]] = [
        [section, line.key, line.charges, line.gpu_hours, line.cost, line.refunded, line.net]
        for section, line in lines
    ]
    return f"statement-{statement.month}.csv", csv_text(TENANT_COLUMNS, rows)


# ---- providers ----------------------------------------------------------------------


@dataclass
class _Earned:
    charges: int = 0
    gpu_seconds: float = 0.0
    gross: int = 0
    commission: int = 0
    net: int = 0
    refunded: int = 0

    def add(self, charge: earnings.Charge) -> None:
        self.charges += 1
        self.gpu_seconds += charge.gpu_seconds
        if charge.refunded:
            self.refunded += charge.amount_micro
            return
        self.net += charge.amount_micro
        self.commission += int(charge.details.get("commission_micro", 0))
        self.gross = self.net + self.commission

    def line(self, key: str) -> EarningsLine:
        return EarningsLine(
            key=key,
            charges=self.charges,
            gpu_hours=round(self.gpu_seconds / 3600, 4),
            gross=usdc_text(self.gross),
            commission=usdc_text(self.commission),
            net=usdc_text(self.net),
            refunded=usdc_text(self.refunded),
        )


@dataclass
class _Payouts:
    items: list[StatementPayout] = field(default_factory=list)
    total: int = 0
    paid: int = 0


async def _payouts(session: AsyncSession, provider_id: str, span: Month) -> _Payouts:
    rows = await session.execute(
        select(PayoutRow, PayoutBatchRow.period, BankTransferRow.end_to_end_id)
        .outerjoin(PayoutBatchRow, PayoutBatchRow.id == PayoutRow.batch_id)
        .outerjoin(BankTransferRow, BankTransferRow.payout_id == PayoutRow.id)
        .where(
            PayoutRow.provider_id == provider_id,
            PayoutRow.created_at >= midnight(span.start),
            PayoutRow.created_at < midnight(span.end + timedelta(days=1)),
        )
        .order_by(PayoutRow.created_at, PayoutRow.id)
    )
    made = _Payouts()
    for row, period, e2e in rows.all():
        made.items.append(
            StatementPayout(
                id=row.id,
                created_at=row.created_at,
                period=period or MANUAL,
                method=str(row.method.get("kind", "")),
                amount=usdc_text(row.amount_micro),
                status=row.status,
                reference=row.reference or e2e,
                settled_at=row.settled_at,
            )
        )
        if row.status != PayoutStatus.FAILED.value:
            made.total += row.amount_micro
        if row.status == PayoutStatus.PAID.value:
            made.paid += row.amount_micro
    return made


async def provider_statement(
    session: AsyncSession, provider_id: str, month: str, now: datetime
) -> ProviderStatement:
    span = month_of(month, now)
    found = await earnings.charges(
        session, provider_id, midnight(span.start), midnight(span.end + timedelta(days=1))
    )
    models: dict[str, _Earned] = defaultdict(_Earned)
    total = _Earned()
    for charge in found:
        models[str(charge.details.get("gpu_model", ""))].add(charge)
        total.add(charge)
    made = await _payouts(session, provider_id, span)
    return ProviderStatement(
        provider_id=provider_id,
        month=span.name,
        start=span.start,
        end=span.end,
        complete=span.complete,
        by_gpu_model=[e.line(k) for k, e in sorted(models.items())],
        total=total.line("total"),
        payouts=made.items,
        payouts_total=usdc_text(made.total),
        paid_total=usdc_text(made.paid),
    )


PROVIDER_COLUMNS = [
    "section",
    "key",
    "charges",
    "gpu_hours",
    "gross_usdc",
    "commission_usdc",
    "net_usdc",
    "refunded_usdc",
    "time_utc",
    "method",
    "status",
    "reference",
]


def provider_csv(statement: ProviderStatement) -> tuple[str, str]:
    """(file name, CSV): a line per GPU model, the total, then a line per payout (its
    amount in net_usdc)."""
    rows = [_earned_row("gpu_model", line) for line in statement.by_gpu_model]
    rows.append(_earned_row("total", statement.total))
    rows.extend(_payout_rows(statement.payouts))
    return f"statement-{statement.month}.csv", csv_text(PROVIDER_COLUMNS, rows)


def _earned_row(section: str, line: EarningsLine) -> list[Cell]:
    return [
        section, line.key, line.charges, line.gpu_hours, line.gross, line.commission, line.net,
        line.refunded, "", "", "", "",
    ]  # fmt: skip


def _payout_rows(items: Iterable[StatementPayout]) -> list[list[Cell]]:
    return [
        ["payout", p.id, "", "", "", "", p.amount, "", p.created_at.isoformat(), p.method,
         p.status, p.reference or ""]
        for p in items
    ]  # fmt: skip
