"""Invokes from the agent's side: claim, extend, log, report; and expiry of lost leases.

Every change to a leased invoke is an UPDATE guarded by `id` and `lease_token`
that must touch exactly one row; zero rows means the caller's lease is stale.
"""

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.errors import Conflict, NotFound
from gpu_share.coordinator.orm import ArtifactRow, InvokeLogRow, InvokeRow, NodeRow
from gpu_share.coordinator.services import nodes
from gpu_share.coordinator.services.artifacts import artifact_url
from gpu_share.coordinator.services.nodes import ACTIVE_VALUES
from gpu_share.coordinator.services.placement import Requirements, serves
from gpu_share.coordinator.services.signing import UrlSigner
from gpu_share.coordinator.settings import Settings
from gpu_share.protocol import agent as wire
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import InvokeStatus, OutputsUpload
from gpu_share.protocol.runtimes import RuntimeName

CANDIDATES = 64  # queued rows examined per claim


def _stale(invoke_id: str) -> Conflict:
    return Conflict(
        f"lease on invoke {invoke_id} is stale: it was requeued, canceled or finished; "
        "drop the job and report nothing",
        details={"verdict": wire.LeaseVerdict.DROP.value},
    )


@dataclass(frozen=True)
class LeaseContext:
    settings: Settings
    signer: UrlSigner
    base_url: str


def _guard(invoke_id: str, lease_token: str, node_id: str) -> list[Any]:
    return [
        InvokeRow.id == invoke_id,
        InvokeRow.lease_token == lease_token,
        InvokeRow.node_id == node_id,
        InvokeRow.status.in_(ACTIVE_VALUES),
    ]


async def claim(
    session: AsyncSession,
    node_id: str,
    request: wire.LeaseRequest,
    now: datetime,
    ctx: LeaseContext,
) -> list[wire.LeasedJob]:
    node = await session.get(NodeRow, node_id)
    if node is None:
        raise NotFound(f"node {node_id} does not exist")
    node.last_seen_at = now
    if node.delisted:
        return []
    free = min(request.slots, node.max_concurrent_jobs - await nodes.running_on(session, node_id))
    if free <= 0:
        return []
    queued = InvokeRow.status == InvokeStatus.QUEUED.value
    order = (
        case((InvokeRow.priority == "on_demand", 0), else_=1),
        InvokeRow.created_at,
        InvokeRow.id,
    )
    # Look without locking, then lock only what this node can take: locking every
    # candidate would write a row lock on each and make other agents skip them.
    peek = await session.execute(
        select(InvokeRow.id, InvokeRow.runtime, InvokeRow.gpus, InvokeRow.constraints)
        .where(queued, InvokeRow.runtime.in_(node.runtimes))
        .order_by(*order)
        .limit(CANDIDATES)
    )
    # GPU jobs share the node's memory with the sessions it holds (SPEC §4.1).
    free_vram_mb = nodes.gpu_memory_mb(node) - (
        (await nodes.session_reservations(session)).get(node_id, 0)
    )
    eligible = [
        invoke_id
        for invoke_id, runtime, gpus, constraints in peek.all()
        if gpus <= request.free_gpus
        and serves(node, Requirements.from_parts(runtime, gpus, constraints))
        and fits_beside_sessions(runtime, constraints, free_vram_mb)
    ]
    if not eligible:
        return []
    candidates = (
        await session.scalars(
            select(InvokeRow)
            .where(queued, InvokeRow.id.in_(eligible[: free * 4]))
            .order_by(*order)
            .limit(free)
            .with_for_update(skip_locked=True)
        )
    ).all()
    jobs: list[wire.LeasedJob] = []
    free_gpus = request.free_gpus
    for row in candidates:
        if len(jobs) >= free:
            break
        if not serves(node, Requirements.of(row)) or row.gpus > free_gpus:
            continue
        job = await _lease(session, row, node_id, now, ctx)
        if job is not None:
            jobs.append(job)
            free_gpus -= row.gpus
    return jobs


MIN_JOB_VRAM_MB = 256


def fits_beside_sessions(runtime: str, constraints: dict[str, Any], free_vram_mb: int) -> bool:
    if not RuntimeName(runtime).needs_gpu:
        return True
    return free_vram_mb >= (constraints.get("min_vram_mb") or MIN_JOB_VRAM_MB)


async def artifact_ref(
    session: AsyncSession,
    url: str,
    artifact_id: str | None,
    sha256: str | None,
    now: datetime,
    ctx: LeaseContext,
) -> wire.ArtifactRef | None:
    """A fetchable reference; None when the platform artifact has expired since submission."""
    if artifact_id is None:
        return wire.ArtifactRef(url=url, platform=False, sha256=sha256, size=None)
    artifact = await session.get(ArtifactRow, artifact_id)
    if artifact is None or artifact.blob_id is None or artifact.expires_at <= now:
        return None
    expires = now + timedelta(seconds=ctx.settings.artifact_token_ttl_sec)
    token = ctx.signer.sign(artifact_id, expires)
    return wire.ArtifactRef(
        url=f"{artifact_url(ctx.base_url, artifact_id)}?token={token}",
        platform=True,
        sha256=artifact.sha256,
        size=artifact.size,
    )


async def _lease(
    session: AsyncSession, row: InvokeRow, node_id: str, now: datetime, ctx: LeaseContext
) -> wire.LeasedJob | None:
    model = await artifact_ref(
        session, row.model_url, row.model_artifact_id, row.model_sha256, now, ctx
    )
    inputs = (
        await artifact_ref(
            session, row.inputs_url, row.inputs_artifact_id, row.inputs_sha256, now, ctx
        )
        if row.inputs_url
        else None
    )
    checkpoint = (
        await artifact_ref(session, "", row.checkpoint_artifact_id, None, now, ctx)
        if row.checkpoint_artifact_id
        else None
    )
    if model is None or (row.inputs_url and inputs is None):
        row.status = InvokeStatus.FAILED.value
        row.finished_at = now
        row.error_code = ErrorCode.ARTIFACT_EXPIRED.value
        row.error_message = "an artifact this invoke uses expired before a node could start it"
        return None
    row.status = InvokeStatus.ASSIGNED.value
    row.node_id = node_id
    row.lease_token = secrets.token_hex(16)
    row.lease_expires_at = now + timedelta(seconds=ctx.settings.lease_ttl_sec)
    row.attempts += 1
    row.assigned_at = now
    return wire.LeasedJob(
        invoke_id=row.id,
        lease_token=row.lease_token,
        lease_expires_at=row.lease_expires_at,
        attempt=row.attempts,
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
    )


async def mark_started(
    session: AsyncSession, node_id: str, invoke_id: str, lease_token: str, now: datetime
) -> None:
    row = await session.get(InvokeRow, invoke_id)
    timeout = row.timeout_sec if row is not None else 0
    done = await session.execute(
        update(InvokeRow)
        .where(*_guard(invoke_id, lease_token, node_id))
        .values(
            status=InvokeStatus.RUNNING.value,
            started_at=now,
            deadline_at=now + timedelta(seconds=timeout),
        )
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        raise _stale(invoke_id)


async def _verdict(row: InvokeRow | None, node_id: str, lease_token: str) -> wire.LeaseVerdict:
    if (
        row is None
        or row.node_id != node_id
        or row.lease_token != lease_token
        or row.status not in ACTIVE_VALUES
    ):
        return wire.LeaseVerdict.DROP
    if row.cancel_requested_at is not None:
        return wire.LeaseVerdict.CANCEL
    return wire.LeaseVerdict.KEEP


async def heartbeat(
    session: AsyncSession,
    node_id: str,
    beat: wire.Heartbeat,
    now: datetime,
    settings: Settings,
) -> wire.HeartbeatAck:
    node = await session.get(NodeRow, node_id)
    if node is None:
        raise NotFound(f"node {node_id} does not exist")
    node.last_seen_at = now
    node.telemetry = beat.telemetry.model_dump()
    expires = now + timedelta(seconds=settings.lease_ttl_sec)
    statuses: list[wire.LeaseStatus] = []
    ids = [lease.invoke_id for lease in beat.running]
    rows = (
        {
            row.id: row
            for row in (
                await session.scalars(
                    select(InvokeRow).where(InvokeRow.id.in_(ids)).with_for_update()
                )
            ).all()
        }
        if ids
        else {}
    )
    for lease in beat.running:
        row = rows.get(lease.invoke_id)
        verdict = await _verdict(row, node_id, lease.lease_token)
        if verdict is wire.LeaseVerdict.DROP:
            statuses.append(wire.LeaseStatus(invoke_id=lease.invoke_id, verdict=verdict))
            continue
        assert row is not None
        row.lease_expires_at = expires
        statuses.append(
            wire.LeaseStatus(invoke_id=lease.invoke_id, verdict=verdict, lease_expires_at=expires)
        )
    return wire.HeartbeatAck(
        leases=statuses, heartbeat_interval_sec=settings.heartbeat_interval_sec
    )


async def append_log(
    session: AsyncSession,
    node_id: str,
    invoke_id: str,
    body: wire.LogAppend,
    now: datetime,
    settings: Settings,
) -> wire.LeaseVerdict:
    row = await session.get(InvokeRow, invoke_id, with_for_update=True)
    verdict = await _verdict(row, node_id, body.lease_token)
    if verdict is wire.LeaseVerdict.DROP:
        raise _stale(invoke_id)
    assert row is not None
    add_log(session, row, body.text, now, settings)
    return verdict


def add_log(
    session: AsyncSession, row: InvokeRow, text: str, now: datetime, settings: Settings
) -> None:
    """Append to the invoke's log, truncating once it reaches the per-invoke cap."""
    room = settings.max_log_bytes_per_invoke - row.log_bytes
    if room <= 0 or not text:
        return
    data = text.encode()
    if len(data) > room:
        text = data[:room].decode(errors="ignore") + "\n[log truncated: size limit reached]\n"
        row.log_bytes = settings.max_log_bytes_per_invoke
    else:
        row.log_bytes += len(data)
    session.add(InvokeLogRow(invoke_id=row.id, attempt=row.attempts, created_at=now, text=text))


async def leased_invoke(
    session: AsyncSession, node_id: str, invoke_id: str, lease_token: str
) -> InvokeRow:
    row = await session.get(InvokeRow, invoke_id)
    if await _verdict(row, node_id, lease_token) is wire.LeaseVerdict.DROP:
        raise _stale(invoke_id)
    assert row is not None
    return row


async def record_checkpoint(
    session: AsyncSession, node_id: str, invoke_id: str, lease_token: str, artifact_id: str
) -> str | None:
    """Point the invoke at its newest snapshot; returns the one it replaces (to delete)."""
    row = await session.get(InvokeRow, invoke_id, with_for_update=True)
    previous = row.checkpoint_artifact_id if row is not None else None
    done = await session.execute(
        update(InvokeRow)
        .where(*_guard(invoke_id, lease_token, node_id))
        .values(checkpoint_artifact_id=artifact_id)
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        raise _stale(invoke_id)
    return previous


def _ms(later: datetime | None, earlier: datetime | None) -> int | None:
    if later is None or earlier is None:
        return None
    return max(0, int((later - earlier).total_seconds() * 1000))


async def report_result(
    session: AsyncSession,
    node_id: str,
    invoke_id: str,
    report: wire.ResultReport,
    now: datetime,
) -> InvokeStatus:
    """Record the outcome exactly once; a retry of the same report is answered the same."""
    row = await session.get(InvokeRow, invoke_id, with_for_update=True)
    if row is None:
        raise NotFound(f"invoke {invoke_id} does not exist")
    status = InvokeStatus(row.status)
    if status.terminal and row.lease_token == report.lease_token and row.node_id == node_id:
        return status  # the agent retried a report that was already recorded
    result: dict[str, Any] | None = None
    if report.metrics is not None:
        metrics = report.metrics.model_copy(
            update={"queue_ms": _ms(row.started_at or row.assigned_at, row.created_at)}
        )
        result = {"metrics": metrics.model_dump(mode="json")}
        if report.outputs is not None:
            result.update(
                outputs_inline_base64=report.outputs.inline_base64,
                outputs_url=report.outputs.url,
                outputs_format=report.outputs.format,
                outputs_size=report.outputs.size,
                outputs_sha256=report.outputs.sha256,
            )
    error_code: str | None = report.error.code if report.error else None
    error_message: str | None = report.error.message if report.error else None
    if report.status != "done" and report.error is None:
        fallback = {"timeout": ErrorCode.TIMEOUT, "canceled": ErrorCode.CANCELED}
        error_code = fallback.get(report.status, ErrorCode.RUNTIME_ERROR).value
        error_message = f"job {report.status}"
    done = await session.execute(
        update(InvokeRow)
        .where(*_guard(invoke_id, report.lease_token, node_id))
        .values(
            status=report.status,
            finished_at=now,
            started_at=row.started_at or now,
            result=result,
            error_code=error_code,
            error_message=error_message,
        )
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        raise _stale(invoke_id)
    return InvokeStatus(report.status)


@dataclass
class ExpiryReport:
    requeued: int = 0
    failed: int = 0
    canceled: int = 0
    timed_out: int = 0


async def expire_leases(
    session: AsyncSession, now: datetime, settings: Settings, batch: int = 200
) -> ExpiryReport:
    """Requeue invokes whose node went silent; fail them after `max_attempts` leases.

    Also ends jobs that overran their timeout by more than a lease (their agent kept
    heartbeating but never reported).
    """
    report = ExpiryReport()
    grace = timedelta(seconds=settings.lease_ttl_sec)
    rows = (
        await session.scalars(
            select(InvokeRow)
            .where(InvokeRow.status.in_(ACTIVE_VALUES), InvokeRow.lease_expires_at < now)
            .order_by(InvokeRow.lease_expires_at)
            .limit(batch)
            .with_for_update(skip_locked=True)
        )
    ).all()
    for row in rows:
        node = row.node_id
        if row.cancel_requested_at is not None:
            _finish(row, InvokeStatus.CANCELED, ErrorCode.CANCELED, "canceled by the tenant", now)
            report.canceled += 1
        elif row.attempts >= row.max_attempts:
            _finish(
                row,
                InvokeStatus.FAILED,
                ErrorCode.LEASE_EXPIRED,
                f"the node running it stopped responding, {row.attempts} times; giving up",
                now,
            )
            report.failed += 1
        else:
            add_log(
                session,
                row,
                f"[coordinator] node {node} stopped responding; requeued "
                f"(attempt {row.attempts} of {row.max_attempts})\n",
                now,
                settings,
            )
            row.status = InvokeStatus.QUEUED.value
            row.node_id = None
            row.lease_token = None
            row.lease_expires_at = None
            row.assigned_at = None
            row.started_at = None
            row.deadline_at = None
            report.requeued += 1
    overdue = (
        await session.scalars(
            select(InvokeRow)
            .where(
                InvokeRow.status == InvokeStatus.RUNNING.value,
                InvokeRow.deadline_at < now - grace,
            )
            .with_for_update(skip_locked=True)
            .limit(batch)
        )
    ).all()
    for row in overdue:
        _finish(
            row,
            InvokeStatus.TIMEOUT,
            ErrorCode.TIMEOUT,
            f"the job ran past its timeout_sec={row.timeout_sec} and its node did not stop it",
            now,
        )
        report.timed_out += 1
    return report


def _finish(
    row: InvokeRow, status: InvokeStatus, code: ErrorCode, message: str, now: datetime
) -> None:
    row.status = status.value
    row.finished_at = now
    row.error_code = code.value
    row.error_message = message
