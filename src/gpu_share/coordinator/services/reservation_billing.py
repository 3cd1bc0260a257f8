"""What dedicated reservations cost and how they end (SPEC §4.3; docs/billing.md).

The period's price was reserved at creation (`reservations.create`). At the end of the
period the whole of it is charged (CHARGE, `reservation:{id}:settle`, with a full
`ChargeDetails`, work "reservation"); a cancel before the start releases it all, a
cancel while active charges every hour begun and releases the rest. Each status change
is a guarded UPDATE committed with its posting, so a cancel racing the loop's end
charges once.
"""

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import (
    Conflict,
)
from gpu_share.coordinator.core.orm import InvokeRow, NodeRow, ReservationRow
from gpu_share.coordinator.services import (
    billing,
    invoke_state,
    ledger,
)
from gpu_share.coordinator.services.ledger import ChargeDetails, TransactionKind
from gpu_share.coordinator.services.reservations import (
    HOUR,
    LIVE,
    owned,
    reserve_cause,
    settle_cause,
    to_wire,
)
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import InvokeStatus
from gpu_share.protocol.reservations import (
    Reservation,
    ReservationStatus,
)


def _charged_for(row: ReservationRow, until: datetime) -> int:
    """What a reservation costs when it stops at `until`: every hour begun, at most the
    period (before it starts: nothing)."""
    if until <= row.starts_at:
        return 0
    begun = -(-(until - row.starts_at) // HOUR)
    return min(row.cost_micro, row.rate_micro_per_hour * begun)


async def _settle(
    session: AsyncSession,
    row: ReservationRow,
    reserved: int,
    cost: int,
    until: datetime,
    now: datetime,
) -> None:
    """Charge `cost` of the `reserved` amount (the rest back to the balance), once."""
    if reserved <= 0:
        return
    tenant = row.tenant_id
    if cost <= 0:
        await ledger.post(
            session,
            cause=settle_cause(row.id),
            kind=TransactionKind.RELEASE,
            entries=ledger.transfer(
                ledger.tenant_reserved(tenant), ledger.tenant_balance(tenant), reserved
            ),
            now=now,
            details={"tenant_id": tenant, "work": "reservation", "work_id": row.id},
        )
        return
    node = await session.get(NodeRow, row.node_id)
    assert node is not None
    bps = await billing.commission_of(session, reserve_cause(row.id))
    provider_share, commission = ledger.split_commission(cost, bps)
    held_until = min(until, row.ends_at)
    details: ChargeDetails = {
        "tenant_id": tenant,
        "provider_id": node.provider_id,
        "node_id": node.id,
        "work": "reservation",
        "work_id": row.id,
        "runtime": "reservation",
        "gpu_model": billing.gpu_model_of(node, row.gpus),
        "gpus": row.gpus,
        "spot": False,
        "seconds": max(0.0, (held_until - row.starts_at).total_seconds()),
        "rate_micro_per_hour": row.rate_micro_per_hour,
        "cost_micro": cost,
        "provider_micro": provider_share,
        "commission_micro": commission,
        "started_at": row.starts_at.isoformat(),
        "ended_at": held_until.isoformat(),
    }
    await ledger.post(
        session,
        cause=settle_cause(row.id),
        kind=TransactionKind.CHARGE,
        entries=billing.charge_entries(tenant, node.provider_id, reserved, cost, commission),
        now=now,
        details=details,
    )


async def _stop_queued_work(session: AsyncSession, reservation_id: str, now: datetime) -> None:
    """Queued invokes of a reservation that is over can never start: fail them (free)."""
    queued = (
        await session.scalars(
            select(InvokeRow.id).where(
                InvokeRow.reservation_id == reservation_id,
                InvokeRow.status == InvokeStatus.QUEUED.value,
            )
        )
    ).all()
    for invoke_id in queued:
        await invoke_state.fail_queued(
            session,
            invoke_id,
            ErrorCode.CANCELED,
            f"reservation {reservation_id} ended before a GPU of it was free",
            now,
        )


async def cancel(
    session: AsyncSession, tenant_id: str, reservation_id: str, now: datetime
) -> Reservation:
    """Before it starts: free. While active: every hour begun is charged, the rest comes
    back, and its GPUs are free at once. Twice, or once it ended: 409."""
    row = await owned(session, tenant_id, reservation_id, lock=True)
    if row.status not in LIVE:
        raise Conflict(
            f"reservation {row.id} is already {row.status}; there is nothing to cancel",
            details={"status": row.status},
        )
    if now >= row.ends_at:  # the loop ends and charges it
        raise Conflict(
            f"reservation {row.id} ended at {row.ends_at.isoformat()}; there is nothing to cancel",
            details={"status": ReservationStatus.ENDED.value},
        )
    reserved = row.cost_micro
    cost = _charged_for(row, now)
    done = await session.execute(
        update(ReservationRow)
        .where(ReservationRow.id == row.id, ReservationRow.status.in_(LIVE))
        .values(
            status=ReservationStatus.CANCELED.value,
            canceled_at=now,
            ended_at=now if now >= row.starts_at else None,
            cost_micro=cost,
        )
        .execution_options(synchronize_session=False)
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict(f"reservation {row.id} changed meanwhile; read it again")
    await _settle(session, row, reserved, cost, now, now)
    await _stop_queued_work(session, row.id, now)
    await session.refresh(row)
    return to_wire(row)


async def _end(session: AsyncSession, row: ReservationRow, now: datetime) -> bool:
    """pending/active → ended, charging the whole period; False if another got there first."""
    done = await session.execute(
        update(ReservationRow)
        .where(ReservationRow.id == row.id, ReservationRow.status.in_(LIVE))
        .values(status=ReservationStatus.ENDED.value, ended_at=row.ends_at)
        .execution_options(synchronize_session=False)
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        return False
    await _settle(session, row, row.cost_micro, row.cost_micro, row.ends_at, now)
    await _stop_queued_work(session, row.id, now)
    return True


@dataclass
class LoopReport:
    activated: int = 0
    ended: int = 0


async def activate_and_end(session: AsyncSession, now: datetime, batch: int = 100) -> LoopReport:
    """Start the reservations whose time came and end those whose period is over.

    Safe on several replicas: activation is one guarded UPDATE; each end is locked
    (`SKIP LOCKED`) and guarded by its status, and its charge is posted once by cause."""
    report = LoopReport()
    started = await session.execute(
        update(ReservationRow)
        .where(
            ReservationRow.status == ReservationStatus.PENDING.value,
            ReservationRow.starts_at <= now,
            ReservationRow.ends_at > now,
        )
        .values(status=ReservationStatus.ACTIVE.value)
        .execution_options(synchronize_session=False)
    )
    report.activated = int(started.rowcount or 0)  # type: ignore[attr-defined]
    over = (
        await session.scalars(
            select(ReservationRow)
            .where(ReservationRow.status.in_(LIVE), ReservationRow.ends_at <= now)
            .order_by(ReservationRow.ends_at)
            .limit(batch)
            .with_for_update(skip_locked=True)
        )
    ).all()
    for row in over:
        if await _end(session, row, now):
            report.ended += 1
    return report
