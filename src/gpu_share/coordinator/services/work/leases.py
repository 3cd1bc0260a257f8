"""Leased invokes from the agent's side: start, extend, log, report; and expiry of
lost leases. Leases are made by `claims`.

Status changes go through `invoke_state`, each guarded by the lease the caller
holds; a transition that touches no row means the caller's lease is stale.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import Database, driver_of
from gpu_share.coordinator.core.driver_sql import DriverTx, Sql, sql_list
from gpu_share.coordinator.core.errors import Conflict, NotFound
from gpu_share.coordinator.core.orm import InvokeLogRow, InvokeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.statuses import ACTIVE_VALUES
from gpu_share.coordinator.services.money import billing
from gpu_share.coordinator.services.nodes import nodes, presence
from gpu_share.coordinator.services.work import invoke_state
from gpu_share.coordinator.services.work.invoke_state import Lease
from gpu_share.protocol import agent as wire
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import InvokeStatus
from gpu_share.protocol.trust import ChallengeStatus


def _stale(invoke_id: str) -> Conflict:
    return Conflict(
        f"lease on invoke {invoke_id} is stale: it was requeued, canceled or finished; "
        "drop the job and report nothing",
        details={"verdict": wire.LeaseVerdict.DROP.value},
    )


async def mark_started(session: AsyncSession, lease: Lease, now: datetime) -> None:
    row = await session.get(InvokeRow, lease.invoke_id)
    if row is None or _verdict(row, lease) is wire.LeaseVerdict.DROP:
        raise _stale(lease.invoke_id)
    if row.status == InvokeStatus.RUNNING.value:
        return  # a retried start
    if not await invoke_state.start(session, lease, timeout_sec=row.timeout_sec, now=now):
        raise _stale(lease.invoke_id)


def _verdict(row: InvokeRow | None, lease: Lease) -> wire.LeaseVerdict:
    if (
        row is None
        or row.node_id != lease.node_id
        or row.lease_token != lease.token
        or row.status not in ACTIVE_VALUES
    ):
        return wire.LeaseVerdict.DROP
    if row.cancel_requested_at is not None:
        return wire.LeaseVerdict.CANCEL
    if row.preempt_requested_at is not None:
        return wire.LeaseVerdict.PREEMPT
    return wire.LeaseVerdict.KEEP


_PREEMPTED = Sql(
    "SELECT lease_expires_at FROM invokes"  # noqa: S608 (the list: the code's constants)
    " WHERE id = :invoke AND node_id = :node AND lease_token = :token"
    f" AND status IN ({sql_list(ACTIVE_VALUES)})"
    " AND cancel_requested_at IS NULL AND preempt_requested_at IS NOT NULL",
    datetimes=("lease_expires_at",),
)
"""A held lease whose job is told to stop for a preemption, with its unmoved deadline."""


@dataclass(frozen=True)
class Beat:
    """A heartbeat's answer, and whether a hardware challenge waits for the node (the
    caller reads it from `trust.challenges`: work does not import trust)."""

    ack: wire.HeartbeatAck
    challenge_waiting: bool


_SEEN_POSTGRES = Sql(
    "WITH seen AS ("
    "UPDATE nodes SET last_seen_at = :at, telemetry = :telemetry::json WHERE id = :node"
    " RETURNING id, benchmark_requested_at"
    "), sample AS ("
    "INSERT INTO telemetry_samples (node_id, at, telemetry)"
    " SELECT id, :at::timestamptz, :telemetry::json FROM seen"
    "), presence AS ("
    "INSERT INTO node_presence (node_id, bucket_start, beats)"
    " SELECT id, :bucket::timestamptz, 1 FROM seen"
    " ON CONFLICT (node_id, bucket_start) DO UPDATE SET beats = node_presence.beats + 1"
    ") SELECT benchmark_requested_at, EXISTS ("
    "SELECT 1 FROM challenges WHERE node_id = :node AND status = :issued"
    ") AS challenged FROM seen",
    jsons=("telemetry",),
)
"""On PostgreSQL, what `nodes.record_beat`, `presence.record_beat` and `_CHALLENGED` do,
in one statement (atomic by itself: one round trip, no BEGIN or COMMIT). An unknown
node touches nothing and returns no row."""

_CHALLENGED = Sql(
    "SELECT 1 AS challenged FROM challenges WHERE node_id = :node AND status = :issued LIMIT 1"
)


async def _mark_seen(
    tx: DriverTx, node_id: str, beat: wire.Heartbeat, now: datetime
) -> tuple[bool, bool]:
    """Whether the node is asked to benchmark itself, and whether a challenge waits."""
    issued = ChallengeStatus.ISSUED.value
    if tx.dialect == "postgresql":
        row = await tx.fetchrow(
            _SEEN_POSTGRES,
            node=node_id,
            at=now,
            telemetry=beat.telemetry.model_dump(),
            bucket=presence.bucket_of(now),
            issued=issued,
        )
        if row is None:
            raise NotFound(f"node {node_id} does not exist")
        return row["benchmark_requested_at"] is not None, row["challenged"]
    run_benchmark = await nodes.record_beat(tx, node_id, beat.telemetry, now)
    await presence.record_beat(tx, node_id, now)
    challenged = await tx.fetchrow(_CHALLENGED, node=node_id, issued=issued) is not None
    return run_benchmark, challenged


async def heartbeat(
    db: Database,
    node_id: str,
    beat: wire.Heartbeat,
    now: datetime,
    settings: Settings,
) -> Beat:
    """The node is seen, and each lease it holds is kept or told to stop. Every node sends
    this every few seconds, so it runs on the driver (`driver_sql`): on PostgreSQL an idle
    node's beat is one statement, and each running job adds one (two when it is not kept)
    in one transaction."""
    expires = now + timedelta(seconds=settings.lease_ttl_sec)
    async with db.driver_write(one_statement=not beat.running) as tx:
        run_benchmark, challenged = await _mark_seen(tx, node_id, beat, now)
        statuses = [await _keep(tx, running, node_id, expires) for running in beat.running]
    ack = wire.HeartbeatAck(
        leases=statuses,
        heartbeat_interval_sec=settings.heartbeat_interval_sec,
        run_benchmark=run_benchmark,
    )
    return Beat(ack, challenge_waiting=challenged)


async def _keep(
    tx: DriverTx, running: wire.RunningLease, node_id: str, expires: datetime
) -> wire.LeaseStatus:
    """A lease still held is extended (KEEP, or CANCEL when its tenant canceled). A job told
    to stop for a preemption is not: if its node never confirms, the lease runs out and
    expiry requeues it all the same. Anything else is no longer the node's (DROP)."""
    lease = Lease(running.invoke_id, node_id, running.lease_token)
    kept = await invoke_state.keep(tx, lease, expires)
    if kept is not None:
        verdict = wire.LeaseVerdict.CANCEL if kept.cancel_requested else wire.LeaseVerdict.KEEP
        return wire.LeaseStatus(
            invoke_id=lease.invoke_id, verdict=verdict, lease_expires_at=expires
        )
    preempted = await tx.fetchrow(
        _PREEMPTED, invoke=lease.invoke_id, node=node_id, token=lease.token
    )
    if preempted is not None:
        return wire.LeaseStatus(
            invoke_id=lease.invoke_id,
            verdict=wire.LeaseVerdict.PREEMPT,
            lease_expires_at=preempted["lease_expires_at"],
        )
    return wire.LeaseStatus(invoke_id=lease.invoke_id, verdict=wire.LeaseVerdict.DROP)


async def append_log(
    session: AsyncSession,
    lease: Lease,
    text: str,
    now: datetime,
    settings: Settings,
) -> wire.LeaseVerdict:
    row = await session.get(InvokeRow, lease.invoke_id, with_for_update=True)
    verdict = _verdict(row, lease)
    if verdict is wire.LeaseVerdict.DROP:
        raise _stale(lease.invoke_id)
    assert row is not None
    add_log(session, row, text, now, settings)
    return verdict


def add_log(
    session: AsyncSession, row: InvokeRow, text: str, now: datetime, settings: Settings
) -> None:
    """Append to the invoke's log, truncating once it reaches the per-invoke cap."""
    kept, row.log_bytes = clipped_log(row.log_bytes, text, settings)
    _append(session, row, kept, now)


def clipped_log(log_bytes: int, text: str, settings: Settings) -> tuple[str, int]:
    """What of `text` an invoke whose log holds `log_bytes` keeps, and its size after."""
    room = settings.max_log_bytes_per_invoke - log_bytes
    if room <= 0 or not text:
        return "", log_bytes
    data = text.encode()
    if len(data) > room:
        kept = data[:room].decode(errors="ignore") + "\n[log truncated: size limit reached]\n"
        return kept, settings.max_log_bytes_per_invoke
    return text, log_bytes + len(data)


def _append(session: AsyncSession, row: InvokeRow, text: str, now: datetime) -> None:
    if text:
        session.add(InvokeLogRow(invoke_id=row.id, attempt=row.attempts, created_at=now, text=text))


async def leased_invoke(session: AsyncSession, lease: Lease) -> InvokeRow:
    row = await session.get(InvokeRow, lease.invoke_id)
    if _verdict(row, lease) is wire.LeaseVerdict.DROP:
        raise _stale(lease.invoke_id)
    assert row is not None
    return row


async def record_checkpoint(session: AsyncSession, lease: Lease, artifact_id: str) -> str | None:
    """Point the invoke at its newest snapshot; returns the one it replaces (to delete)."""
    row = await session.get(InvokeRow, lease.invoke_id, with_for_update=True)
    if row is None or _verdict(row, lease) is wire.LeaseVerdict.DROP:
        raise _stale(lease.invoke_id)
    previous = row.checkpoint_artifact_id
    row.checkpoint_artifact_id = artifact_id
    return previous


def _ms(later: datetime | None, earlier: datetime | None) -> int | None:
    if later is None or earlier is None:
        return None
    return max(0, int((later - earlier).total_seconds() * 1000))


_REPORTED = {
    dialect: Sql(
        "SELECT status, node_id, lease_token, log_bytes, attempts, created_at, assigned_at,"  # noqa: S608
        " started_at, timeout_sec, reserved_micro, rate_micro_per_hour, preemptions"
        f" FROM invokes WHERE id = :invoke{lock}",
        datetimes=("created_at", "assigned_at", "started_at"),
    )
    for dialect, lock in (("postgresql", " FOR UPDATE"), ("sqlite", ""))
}
"""What a result report reads of its invoke, locked (SQLite's write transaction holds
the whole database): whether the lease is still this node's, the times its metrics
need, and what its cost needs (`billing.cost_at_finish`)."""


async def report_result(
    session: AsyncSession,
    lease: Lease,
    report: wire.ResultReport,
    now: datetime,
    settings: Settings,
) -> InvokeStatus:
    """Record the node's verdict exactly once, after the last log text it carries; a retry
    of the same report is answered the same. Every job ends here: its statements run on
    the driver (`driver_sql`) in the session's transaction, which settling (`billing`)
    joins."""
    tx = await driver_of(session)
    row = await tx.fetchrow(_REPORTED[tx.dialect], invoke=lease.invoke_id)
    if row is None:  # as stale as another node's lease: a node learns no invoke exists
        raise _stale(lease.invoke_id)
    status = InvokeStatus(row["status"])
    if (
        status.terminal
        and status == report.status
        and row["lease_token"] == lease.token
        and row["node_id"] == lease.node_id
    ):
        return status  # the agent retried a report that was already recorded
    # Else a verdict the coordinator reached without this report (its lease expired on
    # the last attempt, a timeout): the report is stale, and told so, not acknowledged.
    result = report.result
    started_at = row["started_at"]
    if result is not None:
        queue_ms = _ms(started_at or row["assigned_at"], row["created_at"])
        result = result.model_copy(
            update={"metrics": result.metrics.model_copy(update={"queue_ms": queue_ms})}
        )
    # The last log text rides on the report: it is written with the verdict, and so is
    # the cost where no ledger read is needed for it.
    log_text, log_bytes = clipped_log(row["log_bytes"], report.log, settings)
    cost = billing.cost_at_finish(
        reserved_micro=row["reserved_micro"],
        rate_micro_per_hour=row["rate_micro_per_hour"],
        preemptions=row["preemptions"],
        timeout_sec=row["timeout_sec"],
        started_at=started_at or now,
        finished_at=now,
        error_code=report.error.code if report.error else None,
        node_id=lease.node_id,
    )
    if not await invoke_state.finish(
        session,
        lease,
        report.status,
        result=result,
        error=report.error,
        started_at=started_at or now,
        now=now,
        log_bytes=log_bytes,
        log_text=log_text,
        cost_micro=cost,
    ):
        raise _stale(lease.invoke_id)
    return report.status


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
        lease = _lease_of(row)
        if row.cancel_requested_at is not None:
            if await invoke_state.end(
                session,
                lease,
                InvokeStatus.CANCELED,
                ErrorCode.CANCELED,
                "canceled by the tenant",
                now,
            ):
                report.canceled += 1
        elif row.preempt_requested_at is not None:
            # Stopped for on-demand work but never confirmed (its node went away during
            # the preemption): still a preemption, requeued once, never a lost attempt.
            if await invoke_state.requeue_preempted(session, lease, now):
                add_log(
                    session,
                    row,
                    f"[coordinator] preempted for on-demand work; node {lease.node_id} did "
                    "not confirm before its lease ran out; requeued\n",
                    now,
                    settings,
                )
                report.requeued += 1
        elif row.attempts - row.preemptions >= row.max_attempts:
            if await invoke_state.end(
                session,
                lease,
                InvokeStatus.FAILED,
                ErrorCode.LEASE_EXPIRED,
                f"the node running it stopped responding, {row.attempts - row.preemptions} "
                "times; giving up",
                now,
            ):
                report.failed += 1
        elif await invoke_state.requeue(session, lease):
            add_log(
                session,
                row,
                f"[coordinator] node {lease.node_id} stopped responding; requeued "
                f"(attempt {row.attempts - row.preemptions} of {row.max_attempts})\n",
                now,
                settings,
            )
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
        if await invoke_state.end(
            session,
            _lease_of(row),
            InvokeStatus.TIMEOUT,
            ErrorCode.TIMEOUT,
            f"the job ran past its timeout_sec={row.timeout_sec} and its node did not stop it",
            now,
        ):
            report.timed_out += 1
    return report


def _lease_of(row: InvokeRow) -> Lease:
    assert row.node_id is not None and row.lease_token is not None  # an active invoke
    return Lease(row.id, row.node_id, row.lease_token)
