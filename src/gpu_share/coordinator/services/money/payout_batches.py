"""Payout batches for admins (SPEC §3.6): their list, one batch with its payouts, and the
export for execution (CSV or JSON; the first export is recorded). Batches are made by
`payouts.make_batch`; their payouts are settled by `payouts.mark_paid`/`mark_failed`.

An export hands the batch to an admin to pay by hand, so USDC payouts the platform is
already sending on Solana (`chain_payouts`) are left out of it, and the platform sends
none of the batch's other payouts after it (both decided under the batch row's lock)."""

import json
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.csv_export import csv_text
from gpu_share.coordinator.core.errors import NotFound
from gpu_share.coordinator.core.orm import ChainPayoutRow, PayoutBatchRow, PayoutRow, ProviderRow
from gpu_share.coordinator.services.money.payout_calendar import schedule_of_period
from gpu_share.coordinator.services.money.payouts import payout_of
from gpu_share.protocol.money import to_micro, usdc_text
from gpu_share.protocol.payouts import (
    BatchPayout,
    PayoutBatch,
    PayoutBatchDetail,
    PayoutStatus,
)


def _batch(row: PayoutBatchRow, count: int, total_micro: int, in_transit: int) -> PayoutBatch:
    return PayoutBatch(
        id=row.id,
        period=row.period,
        schedule=schedule_of_period(row.period),
        created_at=row.created_at,
        exported_at=row.exported_at,
        payouts=count,
        total=usdc_text(total_micro),
        in_transit=in_transit,
    )


def _summary() -> Any:
    waiting = func.sum(case((PayoutRow.status == PayoutStatus.IN_TRANSIT.value, 1), else_=0))
    return (
        select(
            PayoutBatchRow,
            func.count(PayoutRow.id),
            func.coalesce(func.sum(PayoutRow.amount_micro), 0),
            func.coalesce(waiting, 0),
        )
        .outerjoin(PayoutRow, PayoutRow.batch_id == PayoutBatchRow.id)
        .group_by(PayoutBatchRow.id)
    )


async def batches(session: AsyncSession, limit: int = 100) -> list[PayoutBatch]:
    """Newest first."""
    rows = await session.execute(
        _summary().order_by(PayoutBatchRow.created_at.desc(), PayoutBatchRow.id.desc()).limit(limit)
    )
    return [_batch(b, int(n), int(t), int(w)) for b, n, t, w in rows.all()]


async def batch(session: AsyncSession, batch_id: str) -> PayoutBatchDetail:
    found = (await session.execute(_summary().where(PayoutBatchRow.id == batch_id))).first()
    if found is None:
        raise NotFound(f"no payout batch {batch_id}")
    head = _batch(found[0], int(found[1]), int(found[2]), int(found[3]))
    rows = await session.execute(
        select(PayoutRow, ProviderRow.name, ProviderRow.email)
        .join(ProviderRow, ProviderRow.id == PayoutRow.provider_id)
        .where(PayoutRow.batch_id == batch_id)
        .order_by(ProviderRow.name, PayoutRow.id)
    )
    items = [
        BatchPayout(
            **payout_of(row, head.period).model_dump(),
            provider_id=row.provider_id,
            provider_name=name,
            provider_email=email,
        )
        for row, name, email in rows.all()
    ]
    return PayoutBatchDetail(**head.model_dump(), items=items)


EXPORT_COLUMNS = [
    "payout_id",
    "provider_id",
    "provider_name",
    "provider_email",
    "amount_usdc",
    "amount_micro",
    "method",
    "solana_address",
    "account_holder",
    "iban",
    "bic",
    "status",
    "reference",
]


def _export_row(item: BatchPayout) -> dict[str, Any]:
    method = item.method.model_dump()
    return {
        "payout_id": item.id,
        "provider_id": item.provider_id,
        "provider_name": item.provider_name,
        "provider_email": item.provider_email,
        "amount_usdc": item.amount,
        "amount_micro": to_micro(item.amount),
        "method": method["kind"],
        "solana_address": method.get("address", ""),
        "account_holder": method.get("account_holder", ""),
        "iban": method.get("iban", ""),
        "bic": method.get("bic", ""),
        "status": item.status.value,
        "reference": item.reference or "",
    }


async def _sent_by_the_platform(session: AsyncSession, batch_id: str) -> set[str]:
    """The batch's payouts in transit that the platform is sending on Solana
    (`chain_payouts`): left out of an export, so no admin pays them a second time."""
    rows = await session.scalars(
        select(ChainPayoutRow.payout_id)
        .join(PayoutRow, PayoutRow.id == ChainPayoutRow.payout_id)
        .where(
            PayoutRow.batch_id == batch_id,
            PayoutRow.status == PayoutStatus.IN_TRANSIT.value,
        )
    )
    return set(rows.all())


async def export(
    session: AsyncSession, batch_id: str, fmt: str, now: datetime
) -> tuple[str, str, str]:
    """(file name, media type, content) of the batch for execution; the first export is
    recorded as the batch's `exported_at`."""
    await session.execute(
        update(PayoutBatchRow)
        .where(PayoutBatchRow.id == batch_id, PayoutBatchRow.exported_at.is_(None))
        .values(exported_at=now)
    )
    detail = await batch(session, batch_id)
    sending = await _sent_by_the_platform(session, batch_id)
    rows = [_export_row(item) for item in detail.items if item.id not in sending]
    name = f"payouts-{detail.period}-{detail.id}"
    if fmt == "json":
        body = {
            "batch_id": detail.id,
            "period": detail.period,
            "currency": "USDC",
            "total_usdc": detail.total,
            "payouts": rows,
        }
        return f"{name}.json", "application/json", json.dumps(body, indent=2) + "\n"
    table = ([row[column] for column in EXPORT_COLUMNS] for row in rows)
    return f"{name}.csv", "text/csv; charset=utf-8", csv_text(EXPORT_COLUMNS, table)
