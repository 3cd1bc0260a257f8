"""Which queued invokes a node gets, and the leases it gets them on (SPEC §4.1).

`claim` is the one place that decides placement from the node's side: eligibility
(`placement`), its load (`node_load`), reservations (`reservation_holds`), memory
(`memory_fit`), whole GPUs (`gpu_assignment`), ranking against nodes waiting in a
long-poll (`ranking`), fair share across tenants, and the price fixed on the work
(`billing`). What happens to a lease afterwards is `leases`'.
"""

import functools
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import BindParameter, Select, bindparam, case, exists, select, true, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from gpu_share.coordinator.core.errors import NotFound
from gpu_share.coordinator.core.orm import ArtifactRow, InvokeRow, NodeRow, ProviderRow, TenantRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.signing import UrlSigner
from gpu_share.coordinator.services.artifacts.artifacts import artifact_url
from gpu_share.coordinator.services.money import billing
from gpu_share.coordinator.services.nodes import ranking
from gpu_share.coordinator.services.nodes.placement import (
    Requirements,
    in_window,
    node_listed,
    serves,
)
from gpu_share.coordinator.services.nodes.trusted import TrustRule, is_trusted
from gpu_share.coordinator.services.work import (
    gpu_assignment,
    invoke_state,
    memory_fit,
    node_load,
    preemption,
    reservation_holds,
)
from gpu_share.coordinator.services.work.invoke_state import Lease
from gpu_share.coordinator.services.work.invokes import outputs_artifact_id
from gpu_share.protocol import agent as wire
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import InvokeStatus, OutputsUpload, Priority
from gpu_share.protocol.runtimes import RuntimeName

CANDIDATES = 64  # queued rows examined per claim
RANKING_GRACE_SEC = 2.0  # after this, any eligible node may take a job a better one left


@dataclass(frozen=True)
class LeaseContext:
    settings: Settings
    signer: UrlSigner
    base_url: str


async def claim(
    session: AsyncSession,
    node_id: str,
    request: wire.LeaseRequest,
    now: datetime,
    ctx: LeaseContext,
    *,
    polling_until: datetime | None = None,
) -> list[wire.LeasedJob]:
    """Lease up to `request.slots` jobs to this node, or none (SPEC §4.1).

    Which job: on-demand before spot, then fair share across tenants (the tenant served
    longest ago first, round robin within one claim), then oldest first. Whether this
    node gets it: only if no better ranked node that could take it is waiting in a
    long-poll right now, unless the job has waited `RANKING_GRACE_SEC` already (so a
    better node that went away never holds work up). `polling_until`: this node waits
    until then if nothing comes, and rivals see it as waiting.
    """
    found = (await session.execute(_node_and_provider(), {"node_id": node_id})).one_or_none()
    if found is None:
        raise NotFound(f"node {node_id} does not exist")
    node, provider_suspended_at = found
    node.last_seen_at = now
    # Quarantined (`node_listed`) or its provider suspended: no work (docs/trust.md).
    if provider_suspended_at is not None or not node_listed(node) or not in_window(node, now):
        return []
    load = await node_load.load_of(session, node_id, now)
    free = min(request.slots, node.max_concurrent_jobs - load.running)
    if free <= 0:
        return []
    queued = InvokeRow.status == InvokeStatus.QUEUED.value
    # Spot checks of other nodes' jobs (docs/trust.md) go to trusted nodes only, never to
    # the node that ran the job checked.
    checker = is_trusted(node, TrustRule.of(ctx.settings))
    # Look without locking, then lock only what this node can take: locking every
    # candidate would write a row lock on each and make other agents skip them.
    peek = await session.execute(
        _fair_candidates(session.get_bind().dialect.name, checker),
        {"runtimes": node.runtimes, "node_id": node_id} if checker else {"runtimes": node.runtimes},
    )
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
    placed = await preemption.placed_on(session, node_id)
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
    fitting: list[tuple[str, str, Requirements, datetime]] = []
    for (
        invoke_id,
        tenant_id,
        runtime,
        gpus,
        constraints,
        created_at,
        priority,
        timeout_sec,
    ) in peek.all():
        if invoke_id in placed_ids:
            continue  # placed here: `ahead` when it fits
        req = Requirements.from_parts(runtime, gpus, constraints)
        soon = reservation_holds.needed_soon(upcoming, priority, timeout_sec, now)
        taken = held | reserved | soon | saved
        if (
            gpus <= request.free_gpus
            and serves(node, req, now)
            and memory_fit.gpu_job_fits(req.runtime, req.min_vram_mb, free_vram_mb)
            and gpu_assignment.choose(node, req, taken, agent_free) is not None
        ):
            fitting.append((invoke_id, tenant_id, req, created_at))
    # Who else is waiting matters only when something fits: an empty queue is the common
    # answer to a long-poll, and this read loads every node waiting in one.
    rivals = await _better_pollers(session, node, now) if fitting else []
    grace = now - timedelta(seconds=RANKING_GRACE_SEC)
    eligible = [
        (invoke_id, tenant_id)
        for invoke_id, tenant_id, req, created_at in fitting
        # a better ranked node waiting for exactly this gets it, for a moment
        if created_at <= grace or not any(_can_take(rival, req, now) for rival in rivals)
    ]
    order = {invoke_id: n for n, invoke_id in enumerate([*first, *ahead, *_round_robin(eligible)])}
    if not order:
        node.polling_until = polling_until
        node.poll_free_slots, node.poll_free_gpus = free, request.free_gpus
        return []
    locked = (
        await session.scalars(
            select(InvokeRow)
            .where(queued, InvokeRow.id.in_(list(order)[: free * 4]))
            .with_for_update(skip_locked=True)
        )
    ).all()
    artifacts = await _load_artifacts(session, locked)
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
        job = await _lease(
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
    await _mark_served(session, served, now)
    node.polling_until = None if jobs else polling_until
    return jobs


async def _load_artifacts(
    session: AsyncSession, rows: Sequence[InvokeRow]
) -> dict[str, ArtifactRow]:
    """The artifacts these invokes use, read in one statement rather than one each."""
    ids = {
        artifact_id
        for row in rows
        for artifact_id in (
            row.model_artifact_id,
            row.inputs_artifact_id,
            row.checkpoint_artifact_id,
        )
        if artifact_id
    }
    if not ids:
        return {}
    query = select(ArtifactRow).where(ArtifactRow.id.in_(sorted(ids)))
    return {artifact.id: artifact for artifact in (await session.scalars(query)).all()}


async def _mark_served(session: AsyncSession, tenant_ids: set[str], now: datetime) -> None:
    """Move these tenants to the back of the fair-share line.

    Best effort: a tenant row another claim holds right now is skipped rather than waited
    for (claims never wait on each other, and cannot deadlock over tenants)."""
    if not tenant_ids:
        return
    free = (
        select(TenantRow.id)
        .where(TenantRow.id.in_(sorted(tenant_ids)))
        .with_for_update(skip_locked=True)
    )
    await session.execute(
        update(TenantRow)
        .where(TenantRow.id.in_(free.scalar_subquery()))
        .values(last_served_at=now)
        .execution_options(synchronize_session=False)
    )


@functools.cache
def _node_and_provider() -> Select[NodeRow, datetime | None]:
    """The claiming node and whether its provider is suspended, in one statement for
    `:node_id`; built once."""
    return (
        select(NodeRow, ProviderRow.suspended_at)
        .join(ProviderRow, ProviderRow.id == NodeRow.provider_id)
        .where(NodeRow.id == bindparam("node_id"))
    )


@functools.cache
def _fair_candidates(dialect: str, checker: bool) -> Select[Any]:
    """The queued invokes a node serving `:runtimes` could look at, in fair-share order
    (module doc). Built once per dialect: building it cost a claim more than running it.
    Spot checks are among them only for a `checker` (a trusted node), and never those
    of a job that node `:node_id` ran itself.

    On PostgreSQL each tenant's own first few come from an index scan (a LATERAL join),
    so the cost follows the number of tenants with queued work, not the queue's length;
    SQLite (one process, the embedded mode) sorts the queue."""
    runtimes: BindParameter[list[str]] = bindparam("runtimes", expanding=True)
    columns = (
        InvokeRow.id,
        InvokeRow.tenant_id,
        InvokeRow.runtime,
        InvokeRow.gpus,
        InvokeRow.constraints,
        InvokeRow.created_at,
        InvokeRow.priority,
        InvokeRow.timeout_sec,
    )
    # A reservation's work is read apart (`reservation_holds.queued_work`): it runs on its
    # node only.
    queued = (InvokeRow.status == InvokeStatus.QUEUED.value) & InvokeRow.reservation_id.is_(None)
    if checker:
        checked = aliased(InvokeRow, name="checked")
        queued &= InvokeRow.check_of.is_(None) | ~exists(
            select(checked.id).where(
                checked.id == InvokeRow.check_of, checked.node_id == bindparam("node_id")
            )
        )
    else:
        queued &= InvokeRow.check_of.is_(None)
    if dialect != "postgresql":
        return (
            select(*columns)
            .join(TenantRow, TenantRow.id == InvokeRow.tenant_id)
            .where(queued, InvokeRow.runtime.in_(runtimes))
            .order_by(
                case((InvokeRow.priority == Priority.ON_DEMAND.value, 0), else_=1),
                TenantRow.last_served_at.asc().nulls_first(),
                InvokeRow.created_at,
                InvokeRow.id,
            )
            .limit(CANDIDATES)
        )
    # PRIORITY_ORDER holds: "on_demand" sorts before "spot", so the index serves the order.
    own = (
        select(*columns)
        .where(InvokeRow.tenant_id == TenantRow.id, queued, InvokeRow.runtime.in_(runtimes))
        .order_by(InvokeRow.priority, InvokeRow.created_at)
        .limit(CANDIDATES)
        .lateral("own")
    )
    return (
        select(*(own.c[column.key] for column in columns))
        .select_from(TenantRow)
        .join(own, true())
        .order_by(
            own.c.priority,
            TenantRow.last_served_at.asc().nulls_first(),
            own.c.created_at,
            own.c.id,
        )
        .limit(CANDIDATES)
    )


def _round_robin(eligible: list[tuple[str, str]]) -> list[str]:
    """Interleave tenants, keeping each tenant's own order: one slot each, in turn."""
    queues: dict[str, list[str]] = {}
    for invoke_id, tenant_id in eligible:
        queues.setdefault(tenant_id, []).append(invoke_id)
    ordered: list[str] = []
    while queues:
        for tenant_id in list(queues):
            ordered.append(queues[tenant_id].pop(0))
            if not queues[tenant_id]:
                del queues[tenant_id]
    return ordered


async def _better_pollers(session: AsyncSession, node: NodeRow, now: datetime) -> list[NodeRow]:
    """Other nodes waiting in a long-poll right now with room, ranked above this one."""
    waiting = (
        await session.scalars(
            select(NodeRow).where(
                NodeRow.polling_until > now,
                NodeRow.id != node.id,
                NodeRow.poll_free_slots > 0,
            )
        )
    ).all()
    mine = ranking.rank(node)
    return [other for other in waiting if ranking.rank(other) > mine]


def _can_take(rival: NodeRow, req: Requirements, now: datetime) -> bool:
    return serves(rival, req, now) and (
        not req.runtime.needs_gpu or rival.poll_free_gpus >= req.gpus
    )


async def artifact_ref(
    session: AsyncSession,
    url: str,
    artifact_id: str | None,
    sha256: str | None,
    now: datetime,
    ctx: LeaseContext,
    loaded: Mapping[str, ArtifactRow] | None = None,
) -> wire.ArtifactRef | None:
    """A fetchable reference; None when the platform artifact has expired since submission.
    `loaded`: artifacts already read, by id."""
    if artifact_id is None:
        return wire.ArtifactRef(url=url, platform=False, sha256=sha256, size=None)
    artifact = (loaded or {}).get(artifact_id) or await session.get(ArtifactRow, artifact_id)
    if artifact is None or artifact.blob_id is None or artifact.expires_at <= now:
        return None
    expires = now + timedelta(seconds=ctx.settings.artifact_token_ttl_sec)
    token = ctx.signer.sign(artifact_id, expires)
    # platform=True vouches for this sha256 (the stored artifact's own, and the caller
    # resolved an artifact the tenant owns): agents serve it from their cache.
    return wire.ArtifactRef(
        url=f"{artifact_url(ctx.base_url, artifact_id)}?token={token}",
        platform=True,
        sha256=artifact.sha256,
        size=artifact.size,
    )


async def _lease(
    session: AsyncSession,
    row: InvokeRow,
    node: NodeRow,
    now: datetime,
    ctx: LeaseContext,
    gpu_indices: list[int],
    *,
    artifacts: Mapping[str, ArtifactRow],
    start: bool = False,
) -> wire.LeasedJob | None:
    """Lease one invoke to the node, on `gpu_indices` of its GPUs (none for a CPU job);
    with `start`, the lease is its start (`LeaseRequest.start`). `artifacts`: those the
    invoke uses, by id."""
    node_id = node.id
    model = await artifact_ref(
        session, row.model_url, row.model_artifact_id, row.model_sha256, now, ctx, artifacts
    )
    inputs = (
        await artifact_ref(
            session, row.inputs_url, row.inputs_artifact_id, row.inputs_sha256, now, ctx, artifacts
        )
        if row.inputs_url
        else None
    )
    checkpoint = (
        await artifact_ref(session, "", row.checkpoint_artifact_id, None, now, ctx, artifacts)
        if row.checkpoint_artifact_id
        else None
    )
    if model is None or (row.inputs_url and inputs is None):
        await invoke_state.fail_queued(
            session,
            row.id,
            ErrorCode.ARTIFACT_EXPIRED,
            "an artifact this invoke uses expired before a node could start it",
            now,
        )
        return None
    lease = Lease(row.id, node_id, secrets.token_hex(16))
    expires = now + timedelta(seconds=ctx.settings.lease_ttl_sec)
    attempt = row.attempts + 1
    rate = (
        await billing.placed_rate(
            session, node, gpus=row.gpus, spot=row.priority == Priority.SPOT.value
        )
        if billing.prepaid(ctx.settings) and row.reservation_id is None and row.check_of is None
        # free billing, a reservation's work (the reservation is billed), a spot check (the
        # platform's): nothing
        else 0
    )
    if not await invoke_state.assign(
        session,
        row.id,
        lease,
        attempt=attempt,
        expires_at=expires,
        now=now,
        rate_micro_per_hour=rate,
        gpu_indices=gpu_indices or None,
        start_timeout_sec=row.timeout_sec if start else None,
    ):
        return None
    return wire.LeasedJob(
        invoke_id=row.id,
        lease_token=lease.token,
        lease_expires_at=expires,
        attempt=attempt,
        runtime=RuntimeName(row.runtime),
        model=model,
        inputs=inputs,
        timeout_sec=row.timeout_sec,
        gpus=row.gpus,
        outputs_upload=OutputsUpload.model_validate(row.outputs_upload)
        if row.outputs_upload
        else None,
        inline_limit_bytes=ctx.settings.inline_output_limit_bytes,
        checkpoint=checkpoint,
        gpu_indices=gpu_indices or None,
        started=start,
        evaluate=await _evaluated(session, row, now, ctx) if row.check_of is not None else None,
    )


async def _evaluated(
    session: AsyncSession, row: InvokeRow, now: datetime, ctx: LeaseContext
) -> wire.EvaluatedOutputs | None:
    """For a spot check of a training that ended done: the outputs its node returned, for
    the trusted node to score (docs/trust.md). Inline, or the tenant's outputs artifact
    its URL names; None when there is nothing of the tenant's to score (the check then
    finds the outputs missing)."""
    if RuntimeName(row.runtime).kind != "train" or row.check_of is None:
        return None
    checked = await session.get(InvokeRow, row.check_of)
    if checked is None or checked.status != InvokeStatus.DONE.value or not checked.result:
        return None
    inline = checked.result.get("outputs_inline_base64")
    if isinstance(inline, str) and inline:
        return wire.EvaluatedOutputs(inline_base64=inline)
    artifact_id = outputs_artifact_id(checked.result)
    artifact = None if artifact_id is None else await session.get(ArtifactRow, artifact_id)
    if artifact is None or artifact.tenant_id != checked.tenant_id:
        return None
    ref = await artifact_ref(session, "", artifact.id, None, now, ctx)
    return None if ref is None else wire.EvaluatedOutputs(artifact=ref)
