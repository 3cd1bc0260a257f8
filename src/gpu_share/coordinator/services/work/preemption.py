"""Spot work gives way to on-demand work (SPEC §4.3; docs/placement.md, "Spot").

The one owner of the decision, made afresh on every pass (`preempt_for_waiting_work`,
run by the preemption loop), so that what is asked is what the queue needs now:

- A queued on-demand invoke that some online node could take now needs nothing.
- One that no node has room for is *placed* on the best ranked node where stopping
  running spot work makes room, by the claim's own rules (`preemption_rooms`): it stays
  queued with that node and the GPUs it will have (`invoke_state.place_for_preemption`),
  and the spot work holding them is asked to stop: one spot job whose slot (and GPUs)
  alone suffice when there is one, the most recently started first (it has the least to
  lose), else the most recently started ones until it fits. The node's claims give that
  room to it first, and to nobody else (`claims`).
- Only an invoke that has waited `preemption_grace_sec` in the queue asks, and only if
  its tenant has not, in the last `preemption_cooldown_sec`, canceled an invoke placed
  for a preemption (both settings): an on-demand invoke submitted and canceled at once
  stops nothing, and canceling the work a preemption was asked for cannot be repeated
  at will.
- What is no longer needed is withdrawn: a spot job asked to stop for work that was
  canceled (at once, `withdraw_for_canceled`), placed elsewhere, or fits no more is told
  to run on (`invoke_state.withdraw_preempt`: its node hears KEEP again, not PREEMPT),
  and an invoke placed for a preemption that no longer needs one is unplaced.

On-demand work that no node could run even empty preempts nothing.

A dedicated reservation's GPUs are its own from its start: a second pass
(`on_reserved_gpus`) asks the spot work of anyone else still running on them to stop
(on-demand work is never given GPUs a reservation needs before its timeout could run
out: `reservation_holds.needed_soon`); those stops are never withdrawn.

The ask is a guarded UPDATE of `preempt_requested_at` (`invoke_state.request_preempt`);
the node hears PREEMPT on its next heartbeat (or log append), stops the job, lets its
last checkpoint upload and confirms (`confirm`): the invoke is requeued with
`preemptions + 1`, never as a failure, never against `max_attempts` or the node's
reliability. A node that never confirms lets the lease run out (a PREEMPT lease is not
extended) and expiry requeues it the same way, once. A job that finished first keeps its
result: every step is guarded by the lease, so whichever lands first wins and the other
is stale.

Safe with several replicas: the waiting invokes a pass considers are locked (`SKIP
LOCKED`), so two passes never decide for the same work, and a pass never withdraws a
stop on a node where work it did not consider is placed.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import driver_of
from gpu_share.coordinator.core.driver_sql import Sql
from gpu_share.coordinator.core.errors import Conflict
from gpu_share.coordinator.core.orm import InvokeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.statuses import ACTIVE_VALUES
from gpu_share.coordinator.services.nodes.placement import Requirements
from gpu_share.coordinator.services.work import invoke_state, reservation_holds
from gpu_share.coordinator.services.work.invoke_state import Lease
from gpu_share.coordinator.services.work.leases import add_log
from gpu_share.coordinator.services.work.preemption_rooms import Plan, Room, plan, rooms, serving
from gpu_share.protocol import agent as wire
from gpu_share.protocol.invokes import InvokeStatus, Priority

WAITING_BATCH = 50  # queued on-demand invokes looked at per pass

_QUEUED_ON_DEMAND = and_(
    InvokeRow.status == InvokeStatus.QUEUED.value,
    InvokeRow.priority == Priority.ON_DEMAND.value,
    # A reservation's work runs on its own GPUs only: `on_reserved_gpus` frees them.
    InvokeRow.reservation_id.is_(None),
)
_RUNNING_SPOT = and_(
    InvokeRow.status.in_(ACTIVE_VALUES),
    InvokeRow.priority == Priority.SPOT.value,
    InvokeRow.reservation_id.is_(None),
)


async def preempt_for_waiting_work(
    session: AsyncSession, now: datetime, settings: Settings
) -> list[str]:
    """Ask the spot invokes that on-demand work needs to stop, and withdraw the asks no
    longer needed; returns the ids asked now."""
    anything = await session.scalar(
        select(InvokeRow.id)
        .where(or_(_RUNNING_SPOT, and_(_QUEUED_ON_DEMAND, InvokeRow.node_id.is_not(None))))
        .limit(1)
    )
    if anything is None:
        return []  # no spot work runs and nothing waits on one: lock nothing claims want
    waiting = (
        await session.scalars(
            select(InvokeRow)
            .where(_QUEUED_ON_DEMAND)
            # Invokes already placed for a preemption first: they keep their place.
            .order_by(InvokeRow.node_id.is_(None), InvokeRow.created_at, InvokeRow.id)
            .limit(WAITING_BATCH)
            .with_for_update(skip_locked=True)
        )
    ).all()
    ranked = await rooms(session, now, settings) if waiting else []
    tenants = {row.tenant_id for row in waiting}
    cooling = await _cooling_tenants(session, tenants, now, settings.preemption_cooldown_sec)
    grace = timedelta(seconds=settings.preemption_grace_sec)
    asked: list[str] = []
    needed: set[str] = set()  # spot invokes still to stop for the work placed
    for row in waiting:
        chosen = _place(row, ranked, now, may_stop=_may_ask(row, cooling, now - grace))
        if chosen is None or not chosen.stops:  # it runs without stopping anything, or waits
            if row.node_id is None:
                continue
            if chosen is not None and chosen.room.node.id == row.node_id:  # its room is free
                await _place_on(session, row, chosen)
            else:
                await invoke_state.unplace(session, row.id)
            continue
        node_id = chosen.room.node.id
        await _place_on(session, row, chosen)
        for victim in chosen.stops:
            needed.add(victim.invoke_id)
            if victim.stopping:
                continue
            lease = Lease(victim.invoke_id, node_id, victim.lease_token)
            if await invoke_state.request_preempt(session, lease, now):
                asked.append(victim.invoke_id)
                await _log(
                    session,
                    victim.invoke_id,
                    f"[coordinator] preempting this spot job on node {node_id}: on-demand "
                    f"invoke {row.id} needs its slot; it stops and is requeued (a training "
                    "keeps its last checkpoint)\n",
                    now,
                    settings,
                )
    considered = {row.id for row in waiting}
    await _withdraw(session, now, settings, keep=needed, considered=considered)
    return asked


@dataclass(frozen=True, slots=True)
class Placed:
    """A queued on-demand invoke placed on a node for a preemption, as the claim reads it."""

    id: str
    runtime: str
    gpus: int
    constraints: dict[str, Any]
    priority: str
    timeout_sec: int
    gpu_indices: list[int] | None


def placed_on_node(node: str) -> str:
    """The condition on `invokes` of work placed on the node `node` names (a parameter or
    a column), its parameters `:queued` and `:on_demand` (`placed_params`): the rows
    `_QUEUED_ON_DEMAND` and placed there."""
    return (
        "invokes.status = :queued AND invokes.priority = :on_demand"
        f" AND invokes.reservation_id IS NULL AND invokes.node_id = {node}"
    )


def placed_params() -> dict[str, str]:
    return {"queued": InvokeStatus.QUEUED.value, "on_demand": Priority.ON_DEMAND.value}


_PLACED_ON = Sql(
    "SELECT id, runtime, gpus, constraints, priority, timeout_sec, gpu_indices FROM invokes"  # noqa: S608 (constants)
    f" WHERE {placed_on_node(':node')} ORDER BY created_at, id",
    jsons=("constraints", "gpu_indices"),
)
"""`placed_on`'s statement, on the driver (`driver_sql`): a claim reads it when its node
has work placed on it (`claims`)."""


async def placed_on(session: AsyncSession, node_id: str) -> list[Placed]:
    """The queued on-demand invokes placed on this node for a preemption, oldest first,
    as the claim reads them (`claims`: they are leased there first)."""
    tx = await driver_of(session)
    rows = await tx.fetch(_PLACED_ON, node=node_id, **placed_params())
    return [
        Placed(
            row["id"],
            row["runtime"],
            row["gpus"],
            row["constraints"],
            row["priority"],
            row["timeout_sec"],
            row["gpu_indices"],
        )
        for row in rows
    ]


async def _place_on(session: AsyncSession, row: InvokeRow, chosen: Plan) -> None:
    """Record where the invoke is placed, when that changed (a node with no spot work left
    is counted, not exact: the GPUs it was placed on stay its own)."""
    node_id = chosen.room.node.id
    if row.node_id == node_id and (
        not chosen.room.exact or sorted(row.gpu_indices or []) == chosen.indices
    ):
        return
    await invoke_state.place_for_preemption(session, row.id, node_id, chosen.indices)


def _may_ask(row: InvokeRow, cooling: set[str], waited_since: datetime) -> bool:
    """Placed already, or queued since `waited_since` with a tenant not cooling down."""
    if row.node_id is not None:
        return True
    return row.created_at <= waited_since and row.tenant_id not in cooling


def _place(row: InvokeRow, ranked: list[Room], now: datetime, *, may_stop: bool) -> Plan | None:
    """Where the invoke goes: a node with room now (its own first, then by rank), else,
    when it may ask, the best ranked one where stopping spot work makes room; the room
    it takes is taken from that node for the invokes after it."""
    req = Requirements.of(row)
    candidates = serving(ranked, req, now)
    own = [room for room in candidates if room.node.id == row.node_id]
    order = own + [room for room in candidates if room.node.id != row.node_id]
    for stop in (False, True) if may_stop else (False,):
        for room in order:
            soon = reservation_holds.needed_soon(room.upcoming, row.priority, row.timeout_sec, now)
            found = plan(room, req, soon, stop=stop)
            if found is not None:
                room.take(found)
                return found
    return None


async def _cooling_tenants(
    session: AsyncSession, tenants: set[str], now: datetime, cooldown_sec: float
) -> set[str]:
    """Those of `tenants` that canceled, within `cooldown_sec`, an invoke placed for a
    preemption (canceled while queued with a node: `invoke_state.place_for_preemption`)."""
    if not tenants:
        return set()
    found = await session.scalars(
        select(InvokeRow.tenant_id)
        .where(
            InvokeRow.tenant_id.in_(sorted(tenants)),
            InvokeRow.status == InvokeStatus.CANCELED.value,
            InvokeRow.node_id.is_not(None),
            InvokeRow.assigned_at.is_(None),
            InvokeRow.finished_at >= now - timedelta(seconds=cooldown_sec),
        )
        .distinct()
    )
    return set(found.all())


async def withdraw_for_canceled(
    session: AsyncSession, row: InvokeRow, now: datetime, settings: Settings
) -> list[str]:
    """The tenant canceled an invoke placed for a preemption: the spot work stopping for it
    runs on, unless other work waits on that node too (the next pass decides then).
    Returns the ids withdrawn."""
    if row.node_id is None or row.priority != Priority.ON_DEMAND.value:
        return []
    return await _withdraw(
        session, now, settings, keep=set(), considered={row.id}, node_id=row.node_id
    )


async def _withdraw(
    session: AsyncSession,
    now: datetime,
    settings: Settings,
    *,
    keep: set[str],
    considered: set[str],
    node_id: str | None = None,
) -> list[str]:
    """Tell the spot work asked to stop that no longer needs to (module doc), except on
    nodes where work this pass did not consider is placed, and except on GPUs a
    reservation in force holds (`on_reserved_gpus`' stops stand)."""
    query = select(
        InvokeRow.id, InvokeRow.node_id, InvokeRow.lease_token, InvokeRow.gpu_indices
    ).where(_RUNNING_SPOT, InvokeRow.preempt_requested_at.is_not(None))
    if node_id is not None:
        query = query.where(InvokeRow.node_id == node_id)
    stopping = [r for r in (await session.execute(query)).all() if r.id not in keep]
    if not stopping:
        return []
    placed = select(InvokeRow.node_id).where(
        _QUEUED_ON_DEMAND, InvokeRow.node_id.is_not(None), InvokeRow.id.not_in(sorted(considered))
    )
    waited_on = {str(n) for n in (await session.scalars(placed.distinct())).all()}
    reserved = {
        (held.node_id, index)
        for held in await reservation_holds.held_on(session, now)
        for index in held.gpu_indices
    }
    withdrawn: list[str] = []
    for invoke_id, node, token, indices in stopping:
        node = str(node)
        if node in waited_on or token is None:
            continue
        if any((node, int(i)) in reserved for i in indices or []):
            continue
        if await invoke_state.withdraw_preempt(session, Lease(invoke_id, node, token)):
            withdrawn.append(invoke_id)
            await _log(
                session,
                invoke_id,
                f"[coordinator] preemption withdrawn: the on-demand work it was to stop for on "
                f"node {node} no longer needs its slot (canceled, placed elsewhere or not "
                "fitting any more); it runs on\n",
                now,
                settings,
            )
    return withdrawn


async def on_reserved_gpus(session: AsyncSession, now: datetime, settings: Settings) -> list[str]:
    """Ask the spot work still running on GPUs that a reservation in force holds (other
    than that reservation's own) to stop; returns their ids."""
    holds = await reservation_holds.held_on(session, now)
    if not holds:
        return []
    reserved: dict[str, dict[int, str]] = {}  # node → GPU index → reservation
    for held in holds:
        for index in held.gpu_indices:
            reserved.setdefault(held.node_id, {})[index] = held.reservation_id
    running = await session.execute(
        select(
            InvokeRow.id,
            InvokeRow.node_id,
            InvokeRow.lease_token,
            InvokeRow.gpu_indices,
            InvokeRow.reservation_id,
        ).where(
            InvokeRow.status.in_(ACTIVE_VALUES),
            InvokeRow.priority == Priority.SPOT.value,
            InvokeRow.preempt_requested_at.is_(None),
            InvokeRow.node_id.in_(list(reserved)),
        )
    )
    asked: list[str] = []
    for invoke_id, node_id, token, indices, own in running.all():
        holders = reserved[str(node_id)]
        taken = sorted({holders[i] for i in map(int, indices or []) if holders.get(i, own) != own})
        if not taken or token is None:
            continue
        if await invoke_state.request_preempt(session, Lease(invoke_id, node_id, token), now):
            asked.append(invoke_id)
            await _log(
                session,
                invoke_id,
                f"[coordinator] preempting this spot job on node {node_id}: reservation "
                f"{', '.join(taken)} holds its GPUs from now; it stops and is requeued "
                "(a training keeps its last checkpoint)\n",
                now,
                settings,
            )
    return asked


async def confirm(session: AsyncSession, lease: Lease, now: datetime, settings: Settings) -> None:
    """The node stopped the job at a PREEMPT verdict: requeue it (409 when the lease is
    stale: the job finished, was requeued or was never asked to stop)."""
    row = await session.get(InvokeRow, lease.invoke_id, with_for_update=True)
    started = row.started_at if row is not None else None
    ran = (now - started).total_seconds() if started is not None else 0.0
    # No invoke is as stale as another node's: a node learns no invoke exists.
    if row is None or not await invoke_state.requeue_preempted(session, lease, now):
        raise Conflict(
            f"lease on invoke {lease.invoke_id} is stale or was not asked to stop: it "
            "finished, was requeued or canceled; report nothing more",
            details={"verdict": wire.LeaseVerdict.DROP.value},
        )
    await session.refresh(row)
    resume = (
        "the next attempt resumes from its last checkpoint"
        if row.checkpoint_artifact_id
        else "the next attempt starts over (no checkpoint was saved)"
    )
    add_log(
        session,
        row,
        f"[coordinator] preempted on node {lease.node_id} after {ran:.0f} s; requeued "
        f"(preemption {row.preemptions}); {resume}\n",
        now,
        settings,
    )


async def _log(
    session: AsyncSession, invoke_id: str, text: str, now: datetime, settings: Settings
) -> None:
    row = await session.get(InvokeRow, invoke_id)
    if row is not None:
        add_log(session, row, text, now, settings)
