"""Which queued invokes a node gets (SPEC §4.1).

`claim` is the one place that decides placement from the node's side: eligibility
(`placement`), its load (`node_load`), reservations (`reservation_holds`), work placed
for a preemption (`preemption`), memory (`memory_fit`), whole GPUs (`gpu_assignment`),
spot checks for trusted nodes only (`check_offers`), fair share across tenants
(`fair_share`), and ranking against nodes waiting in a long-poll (`rivals`). Each invoke
it takes is leased by `leased_jobs`; what happens to a lease afterwards is `leases`'.
"""

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core import driver_models, metrics
from gpu_share.coordinator.core.db import Database, driver_of
from gpu_share.coordinator.core.driver_sql import Sql
from gpu_share.coordinator.core.errors import NotFound
from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.nodes.placement import (
    Requirements,
    in_window,
    node_listed,
    serves,
)
from gpu_share.coordinator.services.work import (
    artifact_refs,
    check_offers,
    fair_share,
    gpu_assignment,
    leased_jobs,
    memory_fit,
    node_load,
    preemption,
    reservation_holds,
    rivals,
)

# What a lease is made with and the links it hands out, for the callers of `claim` and
# for session placement (`sessions`): made in `artifact_refs`.
from gpu_share.coordinator.services.work.artifact_refs import LeaseContext
from gpu_share.protocol import agent as wire
from gpu_share.protocol.invokes import InvokeStatus

SEEN_RESOLUTION = timedelta(seconds=1)
"""A claim marks its node seen (as a heartbeat does) only when the mark is this old: a
busy agent claims many times a second, and presence is judged in tens of seconds
(`node_offline_after_sec`), so one write a second tells all the others would."""


_QUEUED_ROW = "SELECT 1 AS queued FROM invokes WHERE invokes.status = :queued LIMIT 1"
_ANY_QUEUED = Sql(_QUEUED_ROW)


async def anything_queued(db: Database) -> bool:
    """Whether any invoke waits at all: every lease takes a queued invoke (fair-share
    candidates, reservation work, work placed for a preemption, spot checks alike), so
    without one a claim can only find nothing. One indexed read on the driver
    (`driver_sql`), for the long-polls that re-check on their own (`notify.max_wait`)."""
    async with db.driver_read() as tx:
        return await tx.fetchrow(_ANY_QUEUED, queued=InvokeStatus.QUEUED.value) is not None


async def claim(
    session: AsyncSession,
    node_id: str,
    request: wire.LeaseRequest,
    now: datetime,
    ctx: LeaseContext,
    *,
    polling_until: datetime | None = None,
    nothing_queued: Callable[[], None] | None = None,
) -> list[wire.LeasedJob]:
    """Lease up to `request.slots` jobs to this node, or none (SPEC §4.1); timed and
    counted for /metrics (`_claim` decides). `nothing_queued` is called when the node's
    read found no invoke queued at all (`lease_polls` then spares the other polls woken
    with this one a claim each)."""
    started = time.perf_counter()
    try:
        tx = await driver_of(session)
        found = await tx.fetchrow(
            _NODE_AND_PROVIDER[tx.dialect], node_id=node_id, now=now, **preemption.placed_params()
        )
        if found is None:
            raise NotFound(f"node {node_id} does not exist")
        node = driver_models.transient(NodeRow, found)
        marks = _marks(node)
        backlog = Backlog(queued=bool(found["work_queued"]), placed=bool(found["work_placed"]))
        if not backlog.queued and nothing_queued is not None:
            nothing_queued()
        load = node_load.load_from_json(found["node_load"], node_id, now)
        jobs = await _claim(
            session,
            node,
            found["provider_suspended_at"],
            backlog,
            load,
            request,
            now,
            ctx,
            polling_until,
        )
        changed = {name: value for name, value in _marks(node).items() if value != marks[name]}
        if changed:
            await tx.execute(_marking(tuple(sorted(changed))), node_id=node_id, **changed)
    finally:
        metrics.CLAIM_SECONDS.observe(time.perf_counter() - started)
    if jobs:
        metrics.after_commit(session, lambda: metrics.CLAIMED_JOBS.inc(len(jobs)))
    return jobs


_NODE_AND_PROVIDER = {
    dialect: driver_models.whole_row(
        NodeRow,
        "JOIN providers ON providers.id = nodes.provider_id WHERE nodes.id = :node_id",
        extra=", providers.suspended_at AS provider_suspended_at"  # noqa: S608 (constants)
        f", EXISTS ({_QUEUED_ROW}) AS work_queued"
        ", EXISTS (SELECT 1 FROM invokes"
        f" WHERE {preemption.placed_on_node('nodes.id')}) AS work_placed"
        f", {node_load.in_node_read(dialect)}",
        extra_datetimes=("provider_suspended_at",),
        extra_jsons=("node_load",),
    )
    for dialect in ("postgresql", "sqlite")
}
"""The claiming node, whether its provider is suspended, whether any invoke is queued at
all, whether work is placed on this node (`Backlog`), and its load at `:now`
(`node_load`): one round trip."""


@dataclass(frozen=True, slots=True)
class Backlog:
    """What the node's read said of the queue, so that a claim skips the reads that could
    only come back empty: every lease takes a queued invoke (fair-share candidates,
    reservation work, placed work, spot checks alike), so with none queued the claim
    reads only the node's load (its long-poll marks need the free slots); and work placed
    for a preemption is read only where some is placed. Read in the node's statement, so
    an idle agent's claim is two statements (its node with its load, then its marks), not six."""

    queued: bool
    placed: bool


_MARKS = ("last_seen_at", "polling_until", "poll_free_slots", "poll_free_gpus")
"""What a claim writes on its node: seen (as a heartbeat does), and whether it waits in a
long-poll for work, and for how much (`rivals`)."""


def _marks(node: NodeRow) -> dict[str, Any]:
    return {name: getattr(node, name) for name in _MARKS}


@functools.cache
def _marking(names: tuple[str, ...]) -> Sql:
    """The UPDATE of the marks a claim changed (`_MARKS`), and only those: a heartbeat's
    later `last_seen_at` is never written over with an older one."""
    assert set(names) <= set(_MARKS), names
    settings = ", ".join(f"{name} = :{name}" for name in names)
    return Sql(f"UPDATE nodes SET {settings} WHERE id = :node_id")  # noqa: S608 (_MARKS)


async def _claim(
    session: AsyncSession,
    node: NodeRow,
    provider_suspended_at: datetime | None,
    backlog: Backlog,
    load: node_load.NodeLoad,
    request: wire.LeaseRequest,
    now: datetime,
    ctx: LeaseContext,
    polling_until: datetime | None,
) -> list[wire.LeasedJob]:
    """Lease up to `request.slots` jobs to this node, or none; marks on `node` (a row
    read on the driver, in no session) what the caller writes (`_MARKS`).

    Which job: on-demand before spot, then fair share across tenants (the tenant served
    longest ago first, round robin within one claim), then oldest first. Whether this
    node gets it: only if no better ranked node that could take it is waiting in a
    long-poll right now, unless the job has waited `rivals.RANKING_GRACE_SEC` already
    (so a better node that went away never holds work up). `polling_until`: this node
    waits until then if nothing comes, and rivals see it as waiting.
    """
    node_id = node.id
    if node.last_seen_at is None or now - node.last_seen_at >= SEEN_RESOLUTION:
        node.last_seen_at = now
    # Quarantined (`node_listed`) or its provider suspended: no work (docs/trust.md).
    if provider_suspended_at is not None or not node_listed(node) or not in_window(node, now):
        return []
    free = min(request.slots, node.max_concurrent_jobs - load.running)
    if free <= 0:
        return []
    if not backlog.queued:
        _waits(node, polling_until, free, request)
        return []
    # Spot checks of other nodes' jobs (docs/trust.md) go to trusted nodes only, never to
    # the node that ran the job checked.
    checker = check_offers.takes_checks(node, ctx.settings)
    # Look without locking, then lock only what this node can take: locking every
    # candidate would write a row lock on each and make other agents skip them.
    peek = await fair_share.candidates(session, node, checker)
    # GPU jobs share the node's memory with the sessions it holds (SPEC §4.1).
    free_vram_mb = memory_fit.gpu_memory_mb(node) - load.session_mb
    # Whole GPUs: those the node's active jobs hold are taken; the agent may know more.
    held = load.held
    agent_free = None if request.free_gpu_indices is None else set(request.free_gpu_indices)
    # Dedicated reservations in force here: their work first, on their GPUs only; nobody
    # else's work on those GPUs (`reservation_holds.off_limits`).
    holds = load.holds
    first: list[str] = []
    for invoke_id, _, runtime, gpus, constraints, _ in await reservation_holds.queued_work(
        session, holds
    ):
        req = Requirements.from_parts(runtime, gpus, constraints)
        if serves(node, req, now) and memory_fit.gpu_job_fits(
            req.runtime, req.min_vram_mb, free_vram_mb
        ):
            first.append(invoke_id)
    reserved = reservation_holds.off_limits(node, holds, None)
    # Reservations booked here that start later: their GPUs must be free at the start.
    upcoming = load.upcoming
    # On-demand work placed here for a preemption (`preemption`): leased next, on the room
    # the spot work stopped for it leaves; its GPUs and slots go to nobody else meanwhile.
    placed = await preemption.placed_on(session, node_id) if backlog.placed else []
    saved = {int(i) for p in placed for i in p.gpu_indices or []}
    ahead: list[str] = []
    for p in placed:
        req = Requirements.from_parts(p.runtime, p.gpus, p.constraints)
        soon = reservation_holds.needed_soon(upcoming, p.priority, p.timeout_sec, now)
        others = saved - {int(i) for i in p.gpu_indices or []}
        if (
            p.gpus <= request.free_gpus
            and serves(node, req, now)
            and memory_fit.gpu_job_fits(req.runtime, req.min_vram_mb, free_vram_mb)
            and gpu_assignment.choose(node, req, held | reserved | soon | others, agent_free)
            is not None
        ):
            ahead.append(p.id)
    placed_ids = {p.id for p in placed}

    # In a deep queue most candidates share a few shapes, and a shape's verdict depends on
    # nothing else in this claim: each is weighed once (the constraints parsed, then
    # eligibility, memory and GPUs against the node), which cost a deep queue's claim about
    # as much CPU as all its statements when done for each (bench/README.md, `dispatch.py`).
    # Asked only here, before this claim leases anything (`held` grows as it does).
    @functools.cache
    def fits(shape: _Shape) -> Requirements | None:
        """The requirements of a job of this shape if it fits this node now, else None."""
        runtime, gpus, constraints, priority, timeout_sec = shape
        req = Requirements.from_parts(runtime, gpus, json.loads(constraints))
        soon = reservation_holds.needed_soon(upcoming, priority, timeout_sec, now)
        taken = held | reserved | soon | saved
        if (
            gpus <= request.free_gpus
            and serves(node, req, now)
            and memory_fit.gpu_job_fits(req.runtime, req.min_vram_mb, free_vram_mb)
            and gpu_assignment.choose(node, req, taken, agent_free) is not None
        ):
            return req
        return None

    fitting: list[tuple[str, str, Requirements, datetime]] = []
    for invoke_id, tenant_id, runtime, gpus, constraints, created_at, priority, timeout in peek:
        if invoke_id in placed_ids:
            continue  # placed here: `ahead` when it fits
        needs = fits((runtime, gpus, constraints, priority, timeout))
        if needs is not None:
            fitting.append((invoke_id, tenant_id, needs, created_at))
    # Who else is waiting matters only when something fits and is young enough to be left
    # to a better node: an empty queue is the common answer to a long-poll, a deep queue's
    # jobs are past the grace, and this read loads every node waiting in a long-poll.
    young = any(rivals.in_grace(created_at, now) for *_, created_at in fitting)
    better = await rivals.better_pollers(session, node, now) if young else []
    eligible = [
        (invoke_id, tenant_id)
        for invoke_id, tenant_id, req, created_at in fitting
        # a better ranked node waiting for exactly this gets it, for a moment
        if not rivals.left_to_rival(better, req, created_at, now)
    ]
    order = {
        invoke_id: n
        for n, invoke_id in enumerate([*first, *ahead, *fair_share.round_robin(eligible)])
    }
    if not order:
        _waits(node, polling_until, free, request)
        return []
    locked = await _first_unheld(session, list(order), free * 4)
    artifacts = await artifact_refs.load_artifacts(session, locked)
    jobs: list[wire.LeasedJob] = []
    served: set[str] = set()
    free_gpus = request.free_gpus
    waiting_placed = len(placed)  # slots held for placed work not leased yet
    for row in sorted(locked, key=lambda row: order[row.id]):
        if len(jobs) >= free:
            break
        if row.id not in placed_ids and len(jobs) + waiting_placed >= free:
            continue  # what is left is the placed work's
        req = Requirements.of(row)
        if not serves(node, req, now) or row.gpus > free_gpus:
            continue
        if row.check_of is not None and not checker:
            continue  # the candidates hold none for it: never for lack of that read
        off_limits = reservation_holds.off_limits(node, holds, row.reservation_id)
        if row.reservation_id is None:
            off_limits |= reservation_holds.needed_soon(
                upcoming, row.priority, row.timeout_sec, now
            )
        own = set(row.gpu_indices or []) if row.id in placed_ids else set()
        off_limits |= saved - {int(i) for i in own}
        indices = gpu_assignment.choose(node, req, held | off_limits, agent_free)
        if indices is None:
            continue  # an earlier job of this claim took the GPUs it could have had
        job = await leased_jobs.lease_invoke(
            session, row, node, now, ctx, indices, artifacts=artifacts, start=request.start
        )
        if job is not None:
            jobs.append(job)
            if row.check_of is None:  # a check is the platform's: the tenant keeps its turn
                served.add(row.tenant_id)
            free_gpus -= row.gpus
            held.update(indices)
            if row.id in placed_ids:
                waiting_placed -= 1
    await fair_share.mark_served(session, served, now)
    node.polling_until = None if jobs else polling_until
    return jobs


_Shape = tuple[str, int, str, str, int]
"""What a claim weighs of a queued job (`fair_share.Candidate`'s runtime, GPUs,
constraints as JSON text, priority and timeout): jobs of one shape fit a node, or not,
alike."""


def _waits(
    node: NodeRow, polling_until: datetime | None, free: int, request: wire.LeaseRequest
) -> None:
    """Nothing for this node now: it waits in its long-poll until `polling_until` (if it
    polls) with this much room, as rivals see it."""
    node.polling_until = polling_until
    node.poll_free_slots, node.poll_free_gpus = free, request.free_gpus


_FIRST_UNHELD = {
    "postgresql": Sql(
        f"SELECT {', '.join(leased_jobs.QUEUED_COLUMNS)} FROM invokes"  # noqa: S608
        f" WHERE status = '{InvokeStatus.QUEUED.value}' AND id = ANY(:ranked)"
        " ORDER BY array_position(:ranked, id) LIMIT :count FOR UPDATE SKIP LOCKED"
    ),
    "sqlite": Sql(
        f"SELECT {', '.join(leased_jobs.QUEUED_COLUMNS)} FROM invokes"  # noqa: S608
        f" WHERE status = '{InvokeStatus.QUEUED.value}'"
        " AND id IN (SELECT value FROM json_each(:ranked))",
        jsons=("ranked", "constraints", "gpu_indices", "outputs_upload"),
    ),
}


async def _first_unheld(
    session: AsyncSession, ranked: list[str], count: int
) -> list[leased_jobs.Queued]:
    """The first `count` of `ranked` still queued, locked, passing over those other claims
    hold: on PostgreSQL in one statement (`SKIP LOCKED` walks the order until it has
    `count`), so agents claiming at once spread over the queue. Locking the first `count`
    alone, every agent but one lost the race for the head of a deep queue and slept until
    a wake-up or its poll's `max_wait` (bench/README.md, `scale.py`). SQLite runs one
    write transaction at a time: the head is never held. On the driver (`driver_sql`):
    every claim that finds work runs it."""
    tx = await driver_of(session)
    if tx.dialect == "postgresql":
        rows = await tx.fetch(_FIRST_UNHELD[tx.dialect], ranked=ranked, count=count)
    else:
        rows = await tx.fetch(_FIRST_UNHELD[tx.dialect], ranked=ranked[:count])
    return [leased_jobs.Queued.of(row) for row in rows]
