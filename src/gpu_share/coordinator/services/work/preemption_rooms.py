"""What each online node has room for, and what stopping its spot work would free: the
preemption pass's view of the nodes (`preemption`), by the claim's own rules.

A node's room counts every active invoke as holding its slot and GPUs, those already
asked to stop too: a stop may yet be withdrawn, so each pass decides afresh which are
still needed. On a node running preemptible spot work the room is exact, as the claim
sees it (`node_load`): the GPUs held by its invokes and whole-GPU sessions, those
reservations in force keep from others (`reservation_holds.off_limits`) and those a
reservation starting soon needs (`needed_soon`), with `gpu_assignment.choose` picking
the GPUs; elsewhere it is counted (free slots and GPUs), which is all "some node could
take it now" needs.
"""

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import InvokeRow, NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.statuses import ACTIVE_VALUES
from gpu_share.coordinator.services.nodes import nodes, ranking
from gpu_share.coordinator.services.nodes.placement import (
    Requirements,
    in_window,
    node_listed,
    serves,
)
from gpu_share.coordinator.services.work import gpu_assignment, memory_fit, node_load
from gpu_share.coordinator.services.work import reservation_holds as holds
from gpu_share.protocol.invokes import Priority


@dataclass(frozen=True)
class Spot:
    """A running spot invoke that on-demand work may stop."""

    invoke_id: str
    lease_token: str
    gpus: int
    indices: frozenset[int]
    since: datetime
    stopping: bool  # already asked to stop


@dataclass
class Room:
    node: NodeRow
    slots: int  # free now
    gpus: int  # free now
    vram_mb: int  # GPU memory the sessions leave
    spot: list[Spot] = field(default_factory=list)  # asked first, then most recent first
    taken: set[int] = field(default_factory=set)  # GPUs no job may have now (exact rooms)
    upcoming: list[holds.Upcoming] = field(default_factory=list)
    exact: bool = False  # `taken` and `upcoming` read: GPUs are chosen, not counted

    def take(self, plan: "Plan") -> None:
        """What `plan` leaves of the room once its work runs there."""
        for one in plan.stops:
            self.spot.remove(one)
            self.slots += 1
            self.gpus += one.gpus
            self.taken -= one.indices
        self.slots -= 1
        self.gpus -= plan.gpus
        self.taken |= set(plan.indices)


@dataclass(frozen=True)
class Plan:
    """Where an invoke would run: the node, its GPUs, and the spot work to stop first."""

    room: Room
    indices: list[int]
    gpus: int
    stops: list[Spot]


def plan(room: Room, req: Requirements, soon: set[int], *, stop: bool) -> Plan | None:
    """Where on this node the work of `req` would run, stopping nothing (`stop` false) or
    the fewest spot jobs: one alone when one suffices (the first such: those already
    asked, then the most recently started), else the first ones in turn. None when
    even stopping all of them would not do."""
    need = req.gpus if req.runtime.needs_gpu else 0
    if not room.exact:
        if stop or room.slots < 1 or room.gpus < need:
            return None
        return Plan(room, [], need, [])
    spot = room.spot
    trials = [[one] for one in spot] + [spot[:n] for n in range(2, len(spot) + 1)] if stop else [[]]
    for chosen in trials:
        if room.slots + len(chosen) < 1:
            continue
        freed = {i for one in chosen for i in one.indices}
        indices = gpu_assignment.choose(room.node, req, (room.taken | soon) - freed)
        if indices is None:
            continue
        stops = [one for one in chosen if one.indices & set(indices)]
        for one in chosen:  # and, when no slot is free, a slot
            if room.slots + len(stops) >= 1:
                break
            if one not in stops:
                stops.append(one)
        return Plan(room, indices, need, stops)
    return None


def serving(rooms: list[Room], req: Requirements, now: datetime) -> list[Room]:
    """The rooms whose nodes could run this work at all (eligibility, GPU memory)."""
    return [
        room
        for room in rooms
        if serves(room.node, req, now)
        and memory_fit.gpu_job_fits(req.runtime, req.min_vram_mb, room.vram_mb)
    ]


async def rooms(session: AsyncSession, now: datetime, settings: Settings) -> list[Room]:
    """Online, listed nodes inside their window, best ranked first, with their room."""
    live = [
        node
        for node in await nodes.live_nodes(session, now, settings)
        if node_listed(node) and in_window(node, now)
    ]
    if not live:
        return []
    reserved = await memory_fit.session_reservations(session)
    found = {
        node.id: Room(
            node=node,
            slots=node.max_concurrent_jobs,
            gpus=len(node.gpus),
            vram_mb=memory_fit.gpu_memory_mb(node) - reserved.get(node.id, 0),
        )
        for node in live
    }
    active = await session.execute(
        select(
            InvokeRow.id,
            InvokeRow.node_id,
            InvokeRow.lease_token,
            InvokeRow.gpus,
            InvokeRow.gpu_indices,
            InvokeRow.priority,
            InvokeRow.preempt_requested_at,
            InvokeRow.started_at,
            InvokeRow.assigned_at,
            InvokeRow.reservation_id,
        ).where(InvokeRow.status.in_(ACTIVE_VALUES), InvokeRow.node_id.in_(list(found)))
    )
    for row in active.all():
        room = found[str(row.node_id)]
        room.slots -= 1
        room.gpus -= row.gpus
        # A reservation's own work keeps its GPUs: nobody else's work could use them.
        if row.priority == Priority.SPOT.value and row.lease_token and row.reservation_id is None:
            room.spot.append(
                Spot(
                    row.id,
                    row.lease_token,
                    row.gpus,
                    frozenset(int(i) for i in row.gpu_indices or []),
                    row.started_at or row.assigned_at or now,
                    stopping=row.preempt_requested_at is not None,
                )
            )
    for room in found.values():
        if not room.spot:
            continue
        room.exact = True
        load = await node_load.load_of(session, room.node.id, now)
        room.taken = load.held | holds.off_limits(room.node, load.holds, None)
        room.upcoming = load.upcoming
        room.spot.sort(key=lambda s: (s.stopping, s.since, s.invoke_id), reverse=True)
    return sorted(found.values(), key=lambda r: (-ranking.rank(r.node), r.node.id))
