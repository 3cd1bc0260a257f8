"""What one node is busy with now, read in one statement for the claim (`claims`).

A claim needs the node's whole load: how many invokes it runs, which GPUs those and its
whole-GPU sessions hold, the memory its sessions reserve, and the reservations in force
or booked on it. Read one query at a time that cost a claim six round trips and most of
its time (bench/README.md, dispatch); here they are one `UNION ALL` of three plain
selects, each branch using its table's node index, built once and run with the node and
the time as parameters; the rules stay with their owners (`reservation_holds` for
reservations, `memory_fit` for memory).
"""

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BindParameter, bindparam, literal_column, null, select, union_all
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import InvokeRow, ReservationRow, SessionRow
from gpu_share.coordinator.core.statuses import ACTIVE_VALUES, LIVE, OPEN_SESSION_VALUES
from gpu_share.coordinator.services.work.reservation_holds import Held, Upcoming


@dataclass(frozen=True)
class NodeLoad:
    running: int  # active invokes
    held: set[int]  # GPU indices active invokes and whole-GPU sessions hold
    session_mb: int  # memory open sessions reserve
    holds: list[Held]  # reservations in force, with the GPUs their own work uses
    upcoming: list[Upcoming]  # reservations booked that start later, soonest first


@functools.cache
def _rows() -> Any:
    """The node's load as rows, for `:node_id` at `:now`; built once (module doc)."""
    node_id: BindParameter[str] = bindparam("node_id")
    now: BindParameter[datetime] = bindparam("now")
    # The reservations branch comes first: its column types (the timestamp above all)
    # decide how the union's values are read back.
    reservations = select(
        literal_column("'r'").label("kind"),
        ReservationRow.id.label("ref"),
        ReservationRow.tenant_id.label("tenant_id"),
        ReservationRow.gpus.label("gpus"),
        ReservationRow.gpu_indices.label("gpu_indices"),
        ReservationRow.starts_at.label("starts_at"),
        literal_column("0").label("reserved_mb"),
    ).where(
        ReservationRow.node_id == node_id,
        ReservationRow.status.in_(LIVE),
        ReservationRow.ends_at > now,
    )
    invokes = select(
        literal_column("'i'"),
        InvokeRow.reservation_id,
        null(),
        InvokeRow.gpus,
        InvokeRow.gpu_indices,
        null(),
        literal_column("0"),
    ).where(InvokeRow.node_id == node_id, InvokeRow.status.in_(ACTIVE_VALUES))
    sessions = select(
        literal_column("'s'"),
        null(),
        null(),
        SessionRow.gpus,
        SessionRow.gpu_indices,
        null(),
        SessionRow.reserved_mb,
    ).where(SessionRow.node_id == node_id, SessionRow.status.in_(OPEN_SESSION_VALUES))
    return union_all(reservations, invokes, sessions)


def _indices(row: Any) -> set[int]:
    return {int(i) for i in row.gpu_indices or []}


async def load_of(session: AsyncSession, node_id: str, now: datetime) -> NodeLoad:
    running = 0
    held: set[int] = set()
    session_mb = 0
    used: dict[str, int] = {}  # GPUs each reservation's own running work uses
    reservations: list[Any] = []
    for row in (await session.execute(_rows(), {"node_id": node_id, "now": now})).all():
        indices = _indices(row)
        if row.kind == "r":
            reservations.append(row)
        elif row.kind == "i":
            running += 1
            held |= indices
            if row.ref is not None:
                used[row.ref] = used.get(row.ref, 0) + int(row.gpus)
        else:
            session_mb += int(row.reserved_mb or 0)
            if row.gpus > 0:
                held |= indices
    holds = [
        Held(
            r.ref, r.tenant_id, node_id, r.gpus, [int(i) for i in r.gpu_indices], used.get(r.ref, 0)
        )
        for r in reservations
        if r.starts_at <= now
    ]
    upcoming = sorted(
        (Upcoming(r.starts_at, frozenset(_indices(r))) for r in reservations if r.starts_at > now),
        key=lambda ahead: ahead.starts_at,
    )
    return NodeLoad(running, held, session_mb, holds, upcoming)
