"""Spot work gives way to on-demand work (SPEC §4.3; docs/placement.md, "Spot").

The one owner of the decision. A pass (`preempt_for_waiting_work`, run by the
preemption loop) looks at the queued on-demand invokes, oldest first. One that some
online node could take now, or once the preemptions already asked for finish, needs
nothing. One that no node serving it has room for takes the best ranked node where
stopping running spot work would make room, and asks that work to stop: one spot job
whose slot (and GPUs) alone suffice when there is one, the most recently started
first (it has the least to lose), else the most recently started ones until it fits.
On-demand work that no node could run even empty preempts nothing.

A dedicated reservation's GPUs are its own from its start: a second pass
(`on_reserved_gpus`) asks the spot work of anyone else still running on them to stop
(on-demand work is never given GPUs a reservation needs before its timeout could run
out: `reservation_holds.needed_soon`).

The ask is a guarded UPDATE of `preempt_requested_at` (`invoke_state.request_preempt`);
the node hears PREEMPT on its next heartbeat, stops the job, lets its last checkpoint
upload and confirms (`confirm`): the invoke is requeued with `preemptions + 1`, never
as a failure, never against `max_attempts` or the node's reliability. A node that
never confirms lets the lease run out (a PREEMPT lease is not extended) and expiry
requeues it the same way, once. A job that finished first keeps its result: every
step is guarded by the lease, so whichever lands first wins and the other is stale.

Safe with several replicas: the waiting invokes a pass considers are locked (`SKIP
LOCKED`), so two passes never preempt for the same work.
"""

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import Conflict, NotFound
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
from gpu_share.coordinator.services.work import invoke_state, memory_fit, reservation_holds
from gpu_share.coordinator.services.work.invoke_state import Lease
from gpu_share.coordinator.services.work.leases import add_log
from gpu_share.protocol import agent as wire
from gpu_share.protocol.invokes import InvokeStatus, Priority

WAITING_BATCH = 50  # queued on-demand invokes looked at per pass


@dataclass
class _Running:
    invoke_id: str
    lease_token: str
    gpus: int
    since: datetime


@dataclass
class _Room:
    """A node's capacity, counting what the preemptions already asked will free."""

    node: NodeRow
    slots: int
    gpus: int
    vram_mb: int
    spot: list[_Running] = field(default_factory=list)  # preemptible, most recent first

    def fits(self, gpus: int, slots: int = 0, more_gpus: int = 0) -> bool:
        return self.slots + slots >= 1 and self.gpus + more_gpus >= gpus


async def preempt_for_waiting_work(
    session: AsyncSession, now: datetime, settings: Settings
) -> list[str]:
    """Ask the spot invokes that on-demand work needs to stop; returns their ids."""
    preemptible = await session.scalar(
        select(InvokeRow.id)
        .where(
            InvokeRow.status.in_(ACTIVE_VALUES),
            InvokeRow.priority == Priority.SPOT.value,
            InvokeRow.preempt_requested_at.is_(None),
        )
        .limit(1)
    )
    if preemptible is None:
        return []  # no spot work runs: lock nothing the claims could want
    waiting = (
        await session.scalars(
            select(InvokeRow)
            .where(
                InvokeRow.status == InvokeStatus.QUEUED.value,
                InvokeRow.priority == Priority.ON_DEMAND.value,
                # A reservation's work runs on its own GPUs only: `on_reserved_gpus` frees them.
                InvokeRow.reservation_id.is_(None),
            )
            .order_by(InvokeRow.created_at, InvokeRow.id)
            .limit(WAITING_BATCH)
            .with_for_update(skip_locked=True)
        )
    ).all()
    if not waiting:
        return []
    rooms = await _rooms(session, now, settings)
    if not rooms:
        return []
    asked: list[str] = []
    for row in waiting:
        req = Requirements.of(row)
        serving = [
            room
            for room in rooms
            if serves(room.node, req, now)
            and memory_fit.gpu_job_fits(req.runtime, req.min_vram_mb, room.vram_mb)
        ]
        need = row.gpus if req.runtime.needs_gpu else 0
        roomy = next((room for room in serving if room.fits(need)), None)
        if roomy is not None:  # it runs as soon as a node claims it (or a stop finishes)
            roomy.slots -= 1
            roomy.gpus -= need
            continue
        for room in serving:  # best ranked first (`_rooms` sorts them)
            victims = _victims(room, need)
            if not victims:
                continue
            for victim in victims:
                lease = Lease(victim.invoke_id, room.node.id, victim.lease_token)
                if await invoke_state.request_preempt(session, lease, now):
                    asked.append(victim.invoke_id)
                    await _log(
                        session,
                        victim.invoke_id,
                        f"[coordinator] preempting this spot job on node {room.node.id}: "
                        f"on-demand invoke {row.id} needs its slot; it stops and is requeued "
                        "(a training keeps its last checkpoint)\n",
                        now,
                        settings,
                    )
                room.spot.remove(victim)
                room.slots += 1
                room.gpus += victim.gpus
            room.slots -= 1
            room.gpus -= need
            break
    return asked


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


def _victims(room: _Room, need: int) -> list[_Running]:
    """The fewest spot jobs to stop on this node so that `need` GPUs and a slot are free:
    one alone when one suffices (the most recently started such), else the most recently
    started ones in turn; none when stopping all of them would not do."""
    for one in room.spot:
        if room.fits(need, 1, one.gpus):
            return [one]
    chosen: list[_Running] = []
    for one in room.spot:
        chosen.append(one)
        if room.fits(need, len(chosen), sum(c.gpus for c in chosen)):
            return chosen
    return []


async def _rooms(session: AsyncSession, now: datetime, settings: Settings) -> list[_Room]:
    """Online, listed nodes inside their window, best ranked first, with their room."""
    live = [
        node
        for node in await nodes.live_nodes(session, now, settings)
        if node_listed(node) and in_window(node, now)
    ]
    if not live:
        return []
    reserved = await memory_fit.session_reservations(session)
    rooms = {
        node.id: _Room(
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
            InvokeRow.priority,
            InvokeRow.preempt_requested_at,
            InvokeRow.started_at,
            InvokeRow.assigned_at,
            InvokeRow.reservation_id,
        ).where(InvokeRow.status.in_(ACTIVE_VALUES), InvokeRow.node_id.in_(list(rooms)))
    )
    for row in active.all():
        invoke_id, node_id, token, gpus, priority, stopping, started, assigned, reserved_for = row
        room = rooms[str(node_id)]
        if stopping is not None:
            continue  # already asked to stop: its slot and GPUs count as free
        room.slots -= 1
        room.gpus -= gpus
        # A reservation's own work keeps its GPUs: nobody else's work could use them.
        if priority == Priority.SPOT.value and token is not None and reserved_for is None:
            room.spot.append(_Running(invoke_id, token, gpus, started or assigned or now))
    for room in rooms.values():
        room.spot.sort(key=lambda r: (r.since, r.invoke_id), reverse=True)
    return sorted(rooms.values(), key=lambda r: (-ranking.rank(r.node), r.node.id))


async def confirm(session: AsyncSession, lease: Lease, now: datetime, settings: Settings) -> None:
    """The node stopped the job at a PREEMPT verdict: requeue it (409 when the lease is
    stale: the job finished, was requeued or was never asked to stop)."""
    row = await session.get(InvokeRow, lease.invoke_id, with_for_update=True)
    if row is None:
        raise NotFound(f"invoke {lease.invoke_id} does not exist")
    ran = (now - row.started_at).total_seconds() if row.started_at is not None else 0.0
    if not await invoke_state.requeue_preempted(session, lease, now):
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
