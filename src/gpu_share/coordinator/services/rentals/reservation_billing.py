"""What dedicated reservations cost and how they end (SPEC §4.3; docs/billing.md).

The period's price was reserved at creation (`reservations.create`). At the end of the
period it is charged (CHARGE, `reservation:{id}:settle`, with a full `ChargeDetails`,
work "reservation"); a cancel before the start releases it all, a cancel while active
charges every hour begun and releases the rest. Time the node was not there is taken
off either charge, pro rata by presence bucket (`reservation_downtime`); a reservation
whose node never came releases the whole reserve. What was charged is written to
`cost_micro`. Each status change is a guarded UPDATE committed with its posting, so a
cancel racing the loop's end charges once.
"""

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import (
    Conflict,
)
from gpu_share.coordinator.core.orm import InvokeRow, NodeRow, ReservationRow
from gpu_share.coordinator.core.statuses import LIVE
from gpu_share.coordinator.services.money import billing, ledger
from gpu_share.coordinator.services.money.ledger import ChargeDetails, TransactionKind
from gpu_share.coordinator.services.rentals import reservation_downtime
from gpu_share.coordinator.services.rentals.reservation_downtime import Charge
from gpu_share.coordinator.services.rentals.reservations import (
    reserve_cause,
    settle_cause,
    tell,
    to_wire,
)
from gpu_share.coordinator.services.work import invoke_state
from gpu_share.coordinator.services.work.reservation_holds import owned
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import InvokeStatus
from gpu_share.protocol.reservations import (
    Reservation,
    ReservationStatus,
)


class ReservationChargeDetails(ChargeDetails):
    downtime_seconds: float  # of the held stretch, not charged: the node was absent


async def _settle(
    session: AsyncSession,
    row: ReservationRow,
    reserved: int,
    charge: Charge,
    now: datetime,
) -> None:
    """Charge `charge` of the `reserved` amount (the rest back to the balance), once."""
    if reserved <= 0:
        return
    tenant = row.tenant_id
    cost = charge.cost_micro
    downtime_seconds = charge.downtime.total_seconds()
    if cost <= 0:
        await ledger.post(
            session,
            cause=settle_cause(row.id),
            kind=TransactionKind.RELEASE,
            entries=ledger.transfer(
                ledger.tenant_reserved(tenant), ledger.tenant_balance(tenant), reserved
            ),
            now=now,
            details={
                "tenant_id": tenant,
                "work": "reservation",
                "work_id": row.id,
                "downtime_seconds": downtime_seconds,
            },
        )
        return
    node = await session.get(NodeRow, row.node_id)
    assert node is not None
    bps = await billing.commission_of(session, reserve_cause(row.id))
    provider_share, commission = ledger.split_commission(cost, bps)
    held_until = row.starts_at + charge.held
    details: ReservationChargeDetails = {
        "tenant_id": tenant,
        "provider_id": node.provider_id,
        "node_id": node.id,
        "work": "reservation",
        "work_id": row.id,
        "runtime": "reservation",
        "gpu_model": billing.gpu_model_of(node, row.gpus),
        "gpus": row.gpus,
        "spot": False,
        "seconds": charge.present.total_seconds(),
        "rate_micro_per_hour": row.rate_micro_per_hour,
        "cost_micro": cost,
        "provider_micro": provider_share,
        "commission_micro": commission,
        "started_at": row.starts_at.isoformat(),
        "ended_at": held_until.isoformat(),
        "downtime_seconds": downtime_seconds,
    }
    await billing.post_charge(
        session,
        cause=settle_cause(row.id),
        node=node,
        from_reserve=reserved,
        details=details,
        now=now,
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
    """Before it starts: free. While active: every hour begun is charged, less the node's
    downtime, the rest comes back, and its GPUs are free at once. Twice, or once it
    ended: 409."""
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
    charge = await reservation_downtime.charge_for(session, row, now, now)
    done = await session.execute(
        update(ReservationRow)
        .where(ReservationRow.id == row.id, ReservationRow.status.in_(LIVE))
        .values(
            status=ReservationStatus.CANCELED.value,
            canceled_at=now,
            ended_at=now if now >= row.starts_at else None,
            cost_micro=charge.cost_micro,
        )
        .execution_options(synchronize_session=False)
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict(f"reservation {row.id} changed meanwhile; read it again")
    await _settle(session, row, reserved, charge, now)
    await _stop_queued_work(session, row.id, now)
    await tell(session, row.id, row.tenant_id, row.webhook_url, "reservation.canceled", now)
    await session.refresh(row)
    return to_wire(row)


async def _end(session: AsyncSession, row: ReservationRow, now: datetime) -> bool:
    """pending/active → ended, charging the period less the node's downtime; False if
    another got there first."""
    reserved = row.cost_micro
    charge = await reservation_downtime.charge_for(session, row, row.ends_at, now)
    done = await session.execute(
        update(ReservationRow)
        .where(ReservationRow.id == row.id, ReservationRow.status.in_(LIVE))
        .values(
            status=ReservationStatus.ENDED.value,
            ended_at=row.ends_at,
            cost_micro=charge.cost_micro,
        )
        .execution_options(synchronize_session=False)
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        return False
    await _settle(session, row, reserved, charge, now)
    await _stop_queued_work(session, row.id, now)
    await tell(session, row.id, row.tenant_id, row.webhook_url, "reservation.ended", now)
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
        .returning(ReservationRow.id, ReservationRow.tenant_id, ReservationRow.webhook_url)
        .execution_options(synchronize_session=False)
    )
    activated = started.all()
    report.activated = len(activated)
    for rid, tenant_id, url in activated:
        await tell(session, rid, tenant_id, url, "reservation.active", now)
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
