"""What dedicated reservations in force mean for placement (SPEC §4.3; docs/placement.md):
the one place that says which GPUs of a node work may have, for the claim (`claims`),
session placement (`sessions`), offers and the provider's machines.

- Work outside reservations never gets a GPU a reservation in force holds.
- A reservation's own work (an invoke or a session naming it) runs only on its node and
  GPUs, and is leased before anything else there.
- Its GPUs are free when it starts: on-demand work that could still be running then is
  not given them (`needed_soon`), and spot work on them is preempted at the start
  (`services/work/preemption.py`, `on_reserved_gpus`).
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import Conflict, NotFound, Unavailable, ValidationFailed
from gpu_share.coordinator.core.orm import InvokeRow, NodeRow, ReservationRow
from gpu_share.coordinator.core.statuses import ACTIVE_VALUES, LIVE
from gpu_share.coordinator.services.nodes.placement import Requirements, unmet
from gpu_share.coordinator.services.work import memory_fit
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import InvokeStatus, Priority


@dataclass(frozen=True)
class Held:
    """A reservation in force on a node: its GPUs, and how many its own work uses."""

    reservation_id: str
    tenant_id: str
    node_id: str
    gpus: int
    gpu_indices: list[int]
    used: int

    @property
    def idle(self) -> int:
        return max(0, self.gpus - self.used)


async def held_on(session: AsyncSession, now: datetime, node_id: str | None = None) -> list[Held]:
    """The reservations in force now (on one node, or all), with the GPUs their own
    running invokes use. Placement's one source for reserved GPUs."""
    query = select(ReservationRow).where(
        ReservationRow.status.in_(LIVE),
        ReservationRow.starts_at <= now,
        ReservationRow.ends_at > now,
    )
    if node_id is not None:
        query = query.where(ReservationRow.node_id == node_id)
    rows = (await session.scalars(query)).all()
    if not rows:
        return []
    used: dict[str, int] = {}
    running = await session.execute(
        select(InvokeRow.reservation_id, InvokeRow.gpus).where(
            InvokeRow.reservation_id.in_([r.id for r in rows]),
            InvokeRow.status.in_(ACTIVE_VALUES),
        )
    )
    for reservation_id, gpus in running.all():
        used[str(reservation_id)] = used.get(str(reservation_id), 0) + int(gpus)
    return [
        Held(
            r.id, r.tenant_id, r.node_id, r.gpus, [int(i) for i in r.gpu_indices], used.get(r.id, 0)
        )
        for r in rows
    ]


async def reserved_gpus_by_node(session: AsyncSession, now: datetime) -> dict[str, int]:
    """GPUs held by reservations in force now, per node (offers and the provider's page)."""
    rows = await session.execute(
        select(ReservationRow.node_id, ReservationRow.gpus).where(
            ReservationRow.status.in_(LIVE),
            ReservationRow.starts_at <= now,
            ReservationRow.ends_at > now,
        )
    )
    found: dict[str, int] = {}
    for node_id, gpus in rows.all():
        found[node_id] = found.get(node_id, 0) + int(gpus)
    return found


def off_limits(node: NodeRow, holds: list[Held], reservation_id: str | None) -> set[int]:
    """GPU indices of the node a job may not have because of reservations in force: for
    work outside reservations, every GPU one holds; for a reservation's own work, every
    GPU but the reservation's."""
    if reservation_id is None:
        return {i for held in holds for i in held.gpu_indices}
    own = next((held for held in holds if held.reservation_id == reservation_id), None)
    mine = set(own.gpu_indices) if own is not None else set()
    return {int(gpu.get("index", n)) for n, gpu in enumerate(node.gpus)} - mine


async def queued_work(session: AsyncSession, holds: list[Held]) -> list[Any]:
    """The queued invokes of these reservations, oldest first: a reservation's work is
    leased before anyone else's on its node (columns as `claims` reads candidates)."""
    if not holds:
        return []
    rows = await session.execute(
        select(
            InvokeRow.id,
            InvokeRow.tenant_id,
            InvokeRow.runtime,
            InvokeRow.gpus,
            InvokeRow.constraints,
            InvokeRow.created_at,
        )
        .where(
            InvokeRow.status == InvokeStatus.QUEUED.value,
            InvokeRow.reservation_id.in_([held.reservation_id for held in holds]),
        )
        .order_by(InvokeRow.created_at, InvokeRow.id)
        .limit(64)
    )
    return list(rows.all())


async def owned(
    session: AsyncSession, tenant_id: str, reservation_id: str, *, lock: bool = False
) -> ReservationRow:
    row = await session.get(ReservationRow, reservation_id, with_for_update=lock or None)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound(f"reservation {reservation_id} does not exist")
    return row


def in_force(row: ReservationRow, now: datetime) -> bool:
    return row.status in LIVE and row.starts_at <= now < row.ends_at


async def for_work(
    session: AsyncSession, tenant_id: str, reservation_id: str, now: datetime
) -> ReservationRow:
    """The tenant's own reservation that work names: 404 if not theirs, 409 unless in force."""
    row = await owned(session, tenant_id, reservation_id)
    if not in_force(row, now):
        when = (
            f"it starts at {row.starts_at.isoformat()}"
            if row.status in LIVE and now < row.starts_at
            else f"it is {row.status if row.status not in LIVE else 'over'}"
        )
        raise Conflict(
            f"reservation {row.id} is not active ({when}); submit without reservation_id, "
            "or when it is",
            details={"status": row.status, "reservation_id": row.id},
        )
    return row


async def check_work(
    session: AsyncSession, tenant_id: str, reservation_id: str, req: Requirements, now: datetime
) -> ReservationRow:
    """Work (an invoke or a session) that names a reservation: the tenant's own (404),
    in force now (409), and one its node and GPUs can run (422 naming what misses)."""
    row = await for_work(session, tenant_id, reservation_id, now)
    node = await session.get(NodeRow, row.node_id)
    assert node is not None
    missed = unmet(node, req, now)
    if missed is None and req.runtime.needs_gpu and req.gpus > row.gpus:
        missed = "gpus"
    if missed is not None:
        why = (
            f"it holds {row.gpus} GPU(s)"
            if missed == "gpus"
            else f"its node {node.id} does not meet {missed}"
        )
        raise ValidationFailed(
            f"reservation {row.id} cannot run this: {why}; change the request or submit it "
            "without reservation_id",
            details={"constraint": missed, "reservation_id": row.id},
        )
    return row


def sessions_barred(node: NodeRow, holds: list[Held], reservation_id: str | None = None) -> bool:
    """Sessions are loaded on a node's first GPU: a node whose first GPU a reservation in
    force holds takes no session but that reservation's."""
    first = min((int(gpu.get("index", n)) for n, gpu in enumerate(node.gpus)), default=None)
    return first is not None and first in off_limits(
        node, [h for h in holds if h.reservation_id != reservation_id], None
    )


async def session_node(
    session: AsyncSession,
    tenant_id: str,
    reservation_id: str,
    req: Requirements,
    reserve_mb: int,
    connected: set[str],
    now: datetime,
) -> NodeRow:
    """The node a session in a reservation goes to: the reservation's, when its channel
    is connected and its memory has room (503 NO_CAPACITY otherwise)."""
    row = await check_work(session, tenant_id, reservation_id, req, now)
    node = await session.get(NodeRow, row.node_id)
    assert node is not None
    if node.id not in connected:
        raise Unavailable(
            f"reservation {row.id}'s node {node.id} is not connected for sessions now; retry "
            "shortly",
            code=ErrorCode.NO_CAPACITY,
            details={"constraint": "online", "reservation_id": row.id},
            headers={"Retry-After": "5"},
        )
    taken = (await memory_fit.session_reservations(session)).get(node.id, 0)
    free = memory_fit.capacity_mb(node, req.runtime.needs_gpu) - taken
    if free < reserve_mb:
        raise Unavailable(
            f"reservation {row.id}'s node has {max(free, 0)} MB free and this model needs about "
            f"{reserve_mb} MB; close sessions you hold there",
            code=ErrorCode.NO_CAPACITY,
            details={"constraint": "memory", "reservation_id": row.id},
            headers={"Retry-After": "30"},
        )
    return node


async def reserved_indices_by_node(session: AsyncSession, now: datetime) -> dict[str, list[int]]:
    """Which GPUs of each node reservations in force hold now (the provider's machines)."""
    found: dict[str, list[int]] = {}
    for held in await held_on(session, now):
        found.setdefault(held.node_id, []).extend(held.gpu_indices)
    return {node_id: sorted(indices) for node_id, indices in found.items()}


@dataclass(frozen=True)
class Upcoming:
    """A reservation on a node that has not started yet: when, and which GPUs."""

    starts_at: datetime
    gpu_indices: frozenset[int]


def needed_soon(
    upcoming: list[Upcoming], priority: str, timeout_sec: int, now: datetime
) -> set[int]:
    """The GPUs a job leased now must leave alone for the reservations ahead: those of
    every reservation that starts before the job's timeout could run out. Spot work may
    have them: it is preempted when the reservation starts."""
    if priority == Priority.SPOT.value or not upcoming:
        return set()
    runs_until = now + timedelta(seconds=timeout_sec)
    return {i for ahead in upcoming if ahead.starts_at < runs_until for i in ahead.gpu_indices}
