"""The one owner of an invoke's status: every transition, each a guarded UPDATE.

    queued ──assign──▶ assigned ──start──▶ running
      │                   │                   │
      ├─cancel_queued     ├─ finish (agent: done, failed, timeout, canceled)
      └─fail_queued       ├─ end (coordinator: lease lost for good, overran, canceled)
        (failed,          ├─ requeue ──▶ queued (lease expired, attempts left, or its
         canceled)        │    node was quarantined)
                          └─ requeue_preempted ──▶ queued (spot work stopped for
                              on-demand work: preemptions + 1, not an attempt lost)

    done, failed, timeout ──replace_result──▶ done (a spot check caught its node: the
                                              trusted node's result, docs/trust.md)

Besides the statuses, the preemption marks (`preemption`): `request_preempt` and
`withdraw_preempt` on a leased spot invoke, `place_for_preemption` and `unplace` on the
queued on-demand invoke it is stopped for (its `node_id` and `gpu_indices` while it
waits: a queued invoke has a node only so).

A transition names the statuses it leaves from and, for a leased invoke, the
lease (node and token) it must still hold. The UPDATE must touch exactly one row;
zero rows means another actor got there first, and the caller learns it as `False`.
Nothing else in the coordinator writes `InvokeRow.status`. Every transition into a
final status settles the invoke's money (`billing.settle`) in the same transaction, so
a status is never final without its charge or release, nor charged twice (nor without
its webhook, when the tenant gave a webhook_url); likewise a
preempted attempt is charged for the progress it kept (`billing.charge_preempted`) in
the transaction that requeues it.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Update, null, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core import metrics
from gpu_share.coordinator.core.db import driver_of
from gpu_share.coordinator.core.driver_sql import DriverTx, Sql, sql_list
from gpu_share.coordinator.core.orm import InvokeRow
from gpu_share.coordinator.core.statuses import ACTIVE_VALUES
from gpu_share.coordinator.replica.notify import Channel, in_statement
from gpu_share.coordinator.services.money import billing
from gpu_share.coordinator.services.webhooks import events
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import InvokeError, InvokeResult, InvokeStatus, Priority


@dataclass(frozen=True)
class Lease:
    """Who holds an invoke: the node and the token it was leased with."""

    invoke_id: str
    node_id: str
    token: str


async def _transition(
    session: AsyncSession,
    invoke_id: str,
    leaving: list[str],
    values: dict[str, Any],
    *guards: Any,
) -> bool:
    done = await session.execute(_guarded(invoke_id, leaving, values, *guards))
    return bool(done.rowcount == 1)  # type: ignore[attr-defined]


def _guarded(invoke_id: str, leaving: list[str], values: dict[str, Any], *guards: Any) -> Update:
    """The UPDATE of one transition: this invoke, only from `leaving`, only if `guards`."""
    return (
        update(InvokeRow)
        .where(InvokeRow.id == invoke_id, InvokeRow.status.in_(leaving), *guards)
        .values(**values)
    )


async def _final(
    session: AsyncSession,
    invoke_id: str,
    leaving: list[str],
    values: dict[str, Any],
    *guards: Any,
) -> bool:
    """A transition into a final status, settled in the same transaction: the UPDATE
    returns what settling needs."""
    final = (
        await session.execute(
            _guarded(invoke_id, leaving, values, *guards).returning(
                *billing.SETTLED_COLUMNS, InvokeRow.webhook_url
            )
        )
    ).one_or_none()
    if final is None:
        return False
    await _settled(session, final, values)
    return True


async def _settled(session: AsyncSession, final: Any, values: dict[str, Any]) -> None:
    """What follows every transition into a final status, in its transaction: settled
    (`billing.settle`), counted once committed, and told to its webhook, if any."""
    metrics.after_commit(session, metrics.INVOKES_ENDED.labels(values["status"]).inc)
    await billing.settle(session, final, values["finished_at"])
    if final.webhook_url:  # told in the same transaction; no query for invokes without one
        await _emit_final(session, final, values)


async def _emit_final(session: AsyncSession, final: Any, values: dict[str, Any]) -> None:
    status = values["status"]
    code = values.get("error_code")
    await events.emit(
        session,
        owner_id=final.tenant_id,
        event_type=f"invoke.{status}",
        data={
            "id": final.id,
            "status": status,
            "error": {"code": code, "message": values.get("error_message")} if code else None,
            "finished_at": values["finished_at"].isoformat(),
        },
        cause=f"{final.id}:final",
        now=values["finished_at"],
        url=final.webhook_url,
    )


def _held(lease: Lease) -> list[Any]:
    return [InvokeRow.node_id == lease.node_id, InvokeRow.lease_token == lease.token]


_ASSIGN = Sql(
    "UPDATE invokes SET status = :status, node_id = :node, lease_token = :token,"
    " lease_expires_at = :expires_at, attempts = :attempt, assigned_at = :now,"
    " rate_micro_per_hour = :rate, gpu_indices = :gpu_indices,"
    " started_at = COALESCE(:started_at, started_at),"
    " deadline_at = COALESCE(:deadline_at, deadline_at)"
    " WHERE id = :invoke AND status = :queued AND attempts = :attempt - 1",
    jsons=("gpu_indices",),
)


async def assign(
    session: AsyncSession,
    invoke_id: str,
    lease: Lease,
    *,
    attempt: int,
    expires_at: datetime,
    now: datetime,
    rate_micro_per_hour: int = 0,
    gpu_indices: list[int] | None = None,
    start_timeout_sec: int | None = None,
) -> bool:
    """queued → assigned: the node holds it until `expires_at` unless heartbeats extend it;
    its rate is fixed now (`billing.placed_rate`), and the GPUs it gets are recorded.
    With `start_timeout_sec`, queued → running at once: the lease is the start (as
    `start`, its deadline counting from now). Every lease is made here: on the driver
    (`driver_sql`), in the claim's transaction."""
    deadline = None if start_timeout_sec is None else now + timedelta(seconds=start_timeout_sec)
    starting = deadline is not None
    tx = await driver_of(session)
    assigned = await tx.execute(
        _ASSIGN,
        status=(InvokeStatus.RUNNING if starting else InvokeStatus.ASSIGNED).value,
        node=lease.node_id,
        token=lease.token,
        expires_at=expires_at,
        attempt=attempt,
        now=now,
        rate=rate_micro_per_hour,
        gpu_indices=gpu_indices,
        started_at=now if starting else None,
        deadline_at=deadline,
        invoke=invoke_id,
        queued=InvokeStatus.QUEUED.value,
    )
    return assigned == 1


async def fail_queued(
    session: AsyncSession, invoke_id: str, code: ErrorCode, message: str, now: datetime
) -> bool:
    """queued → failed: it can never start (an artifact it needs expired)."""
    return await _final(
        session,
        invoke_id,
        [InvokeStatus.QUEUED.value],
        _ended(InvokeStatus.FAILED, code, message, now),
    )


async def cancel_queued(session: AsyncSession, invoke_id: str, now: datetime) -> bool:
    """queued → canceled, at the tenant's word."""
    values = _ended(
        InvokeStatus.CANCELED,
        ErrorCode.CANCELED,
        "canceled by the tenant before it started",
        now,
    )
    return await _final(
        session, invoke_id, [InvokeStatus.QUEUED.value], {**values, "cancel_requested_at": now}
    )


async def request_cancel(session: AsyncSession, invoke_id: str, now: datetime) -> bool:
    """Record the tenant's intent on a leased invoke; its node stops it and reports."""
    return await _transition(
        session,
        invoke_id,
        ACTIVE_VALUES,
        {"cancel_requested_at": now},
        InvokeRow.cancel_requested_at.is_(None),
    )


async def start(session: AsyncSession, lease: Lease, *, timeout_sec: int, now: datetime) -> bool:
    """assigned → running; the job's deadline counts from now."""
    return await _transition(
        session,
        lease.invoke_id,
        ACTIVE_VALUES,
        {
            "status": InvokeStatus.RUNNING.value,
            "started_at": now,
            "deadline_at": now + timedelta(seconds=timeout_sec),
        },
        *_held(lease),
    )


@dataclass(frozen=True)
class Kept:
    cancel_requested: bool


_KEEP = Sql(
    "UPDATE invokes SET lease_expires_at = :expires"  # noqa: S608 (the list: the code's constants)
    " WHERE id = :invoke AND node_id = :node AND lease_token = :token"
    f" AND status IN ({sql_list(ACTIVE_VALUES)})"
    " AND (preempt_requested_at IS NULL OR cancel_requested_at IS NOT NULL)"
    " RETURNING cancel_requested_at"
)


async def keep(tx: DriverTx, lease: Lease, expires_at: datetime) -> Kept | None:
    """Keep the lease (a heartbeat): the status stays, the deadline of the lease moves; not
    for a job being stopped for a preemption (one being canceled is kept: it reports
    `canceled`). None: not extended. On the driver (`driver_sql`): every running job's
    node asks every few seconds."""
    kept = await tx.fetchrow(
        _KEEP, expires=expires_at, invoke=lease.invoke_id, node=lease.node_id, token=lease.token
    )
    return None if kept is None else Kept(cancel_requested=kept["cancel_requested_at"] is not None)


_FINISH_SET = (
    "UPDATE invokes SET status = :status, finished_at = :finished_at,"  # noqa: S608 (constants)
    " started_at = :started_at, result = :result, error_code = :error_code,"
    " error_message = :error_message, log_bytes = COALESCE(:log_bytes, log_bytes),"
    " cost_micro = COALESCE(:cost_micro, cost_micro)"
    " WHERE id = :invoke AND node_id = :node AND lease_token = :token"
    f" AND status IN ({sql_list(ACTIVE_VALUES)})"
    f" RETURNING {', '.join(billing.SETTLED_NAMES)}, webhook_url"
)
_FINISH = {
    # The verdict, the log's last lines and the NOTIFY that wakes its waiters on other
    # replicas at the commit, in one statement: the INSERT runs only where the UPDATE
    # made the invoke final.
    "postgresql": Sql(
        f"WITH final AS ({_FINISH_SET}), logged AS ("  # noqa: S608 (constants)
        " INSERT INTO invoke_logs (invoke_id, attempt, created_at, text)"
        " SELECT id, attempts, CAST(:finished_at AS TIMESTAMPTZ), CAST(:log_text AS TEXT)"
        " FROM final WHERE CAST(:log_text AS TEXT) IS NOT NULL)"
        f" SELECT final.*, {in_statement(Channel.FINISHED, 'final.id')} AS notified FROM final",
        datetimes=("started_at", "finished_at"),
        jsons=("result",),
    ),
    # SQLite has no data-modifying WITH: the log line is its own statement (`_LOGGED`).
    "sqlite": Sql(_FINISH_SET, datetimes=("started_at", "finished_at"), jsons=("result",)),
}
"""`finish`: the agent's verdict on the lease it holds, with its cost where it is known
then (`billing.cost_at_finish`) and the log's last lines, returning what settling needs;
on PostgreSQL it publishes the invoke on FINISHED (`notify.in_statement`)."""

_LOGGED = Sql(
    "INSERT INTO invoke_logs (invoke_id, attempt, created_at, text)"
    " VALUES (:invoke, :attempt, :at, :text)"
)


async def finish(
    session: AsyncSession,
    lease: Lease,
    status: InvokeStatus,
    *,
    result: InvokeResult | None,
    error: InvokeError | None,
    started_at: datetime,
    now: datetime,
    log_bytes: int | None = None,
    log_text: str | None = None,
    cost_micro: int | None = None,
) -> bool:
    """assigned/running → the verdict its node reported (done, failed, timeout, canceled).
    `log_bytes`: the log's size with the text the report brought (`leases.clipped_log`),
    and `log_text` that text, written in the same statement on PostgreSQL. `cost_micro`:
    what settling will charge (`billing.cost_at_finish`), written with the verdict; None
    leaves it to settling. Every job ends here, so its statements run on the driver
    (`driver_sql`), in the session's transaction; settling follows as for every final
    status."""
    assert status.terminal, status
    values: dict[str, Any] = {
        "status": status.value,
        "finished_at": now,
        "started_at": started_at,
        "result": result.model_dump(mode="json") if result is not None else None,
        "error_code": error.code if error else None,
        "error_message": error.message if error else None,
    }
    tx = await driver_of(session)
    text = log_text or None
    final = await tx.fetchrow(
        _FINISH[tx.dialect],
        **values,
        log_bytes=log_bytes,
        cost_micro=cost_micro,
        invoke=lease.invoke_id,
        node=lease.node_id,
        token=lease.token,
        log_text=text,  # SQLite's statement names none: the driver passes what it names
    )
    if final is None:
        return False
    if text is not None and tx.dialect != "postgresql":
        await tx.execute(
            _LOGGED, invoke=lease.invoke_id, attempt=final["attempts"], at=now, text=text
        )
    await _settled(session, billing.Settled.of(final), values)
    return True


async def requeue(session: AsyncSession, lease: Lease) -> bool:
    """assigned/running → queued: its node went silent and attempts are left."""
    return await _transition(
        session,
        lease.invoke_id,
        ACTIVE_VALUES,
        {
            "status": InvokeStatus.QUEUED.value,
            "node_id": None,
            "lease_token": None,
            "lease_expires_at": None,
            "assigned_at": None,
            "started_at": None,
            "deadline_at": None,
        },
        *_held(lease),
    )


async def request_preempt(session: AsyncSession, lease: Lease, now: datetime) -> bool:
    """Record that on-demand work needs this spot invoke's slot; its node hears PREEMPT.

    Only a running (or assigned) spot invoke the tenant has not canceled, once."""
    return await _transition(
        session,
        lease.invoke_id,
        ACTIVE_VALUES,
        {"preempt_requested_at": now},
        *_held(lease),
        InvokeRow.priority == Priority.SPOT.value,
        InvokeRow.preempt_requested_at.is_(None),
        InvokeRow.cancel_requested_at.is_(None),
    )


async def withdraw_preempt(session: AsyncSession, lease: Lease) -> bool:
    """The on-demand work it was to stop for no longer needs it (canceled, placed elsewhere,
    no longer fitting): the spot invoke runs on as if never asked (PREEMPT → KEEP)."""
    return await _transition(
        session,
        lease.invoke_id,
        ACTIVE_VALUES,
        {"preempt_requested_at": None},
        *_held(lease),
        InvokeRow.preempt_requested_at.is_not(None),
    )


async def place_for_preemption(
    session: AsyncSession, invoke_id: str, node_id: str, gpu_indices: list[int]
) -> bool:
    """A queued on-demand invoke is placed on this node's GPUs (none for a CPU job) while
    the spot work stopped for it makes room: it stays queued, and the node's claims give
    it that room first and nobody else (`claims`; docs/placement.md, "Spot")."""
    return await _transition(
        session,
        invoke_id,
        [InvokeStatus.QUEUED.value],
        {"node_id": node_id, "gpu_indices": gpu_indices or null()},
        InvokeRow.priority == Priority.ON_DEMAND.value,
        InvokeRow.reservation_id.is_(None),
    )


async def unplace(session: AsyncSession, invoke_id: str) -> bool:
    """A queued invoke placed for a preemption is not any more (it runs elsewhere, or no
    stop would make room now)."""
    return await _transition(
        session,
        invoke_id,
        [InvokeStatus.QUEUED.value],
        {"node_id": None, "gpu_indices": null()},
        InvokeRow.node_id.is_not(None),
    )


async def requeue_preempted(session: AsyncSession, lease: Lease, now: datetime) -> bool:
    """assigned/running → queued after a preemption: counted in `preemptions`, never
    against `max_attempts`. The progress the attempt kept (up to its last checkpoint,
    which stays for the next attempt) is charged in the same transaction
    (`billing.charge_preempted`); the rest of the reserve stays held."""
    attempt, started_at = (
        await session.execute(
            select(InvokeRow.attempts, InvokeRow.started_at).where(InvokeRow.id == lease.invoke_id)
        )
    ).one()
    if not await _transition(
        session,
        lease.invoke_id,
        ACTIVE_VALUES,
        {
            "status": InvokeStatus.QUEUED.value,
            "node_id": None,
            "lease_token": None,
            "lease_expires_at": None,
            "assigned_at": None,
            "started_at": None,
            "deadline_at": None,
            "preempt_requested_at": None,
            "preemptions": InvokeRow.preemptions + 1,
        },
        *_held(lease),
        InvokeRow.preempt_requested_at.is_not(None),
    ):
        return False
    await billing.charge_preempted(
        session,
        lease.invoke_id,
        attempt=attempt,
        node_id=lease.node_id,
        started_at=started_at,
        now=now,
    )
    return True


async def end(
    session: AsyncSession,
    lease: Lease,
    status: InvokeStatus,
    code: ErrorCode,
    message: str,
    now: datetime,
) -> bool:
    """assigned/running → a verdict the coordinator reaches without its node."""
    return await _final(
        session, lease.invoke_id, ACTIVE_VALUES, _ended(status, code, message, now), *_held(lease)
    )


async def replace_result(session: AsyncSession, invoke_id: str, result: dict[str, Any]) -> bool:
    """done/failed/timeout → done with another node's result: its own node was caught
    returning wrong results or failures that were not (a spot check, docs/trust.md), and
    the tenant gets what the trusted node computed. Nothing is settled again: what it
    cost is refunded apart (`money.clawbacks`)."""
    return await _transition(
        session,
        invoke_id,
        [s.value for s in (InvokeStatus.DONE, InvokeStatus.FAILED, InvokeStatus.TIMEOUT)],
        {
            "status": InvokeStatus.DONE.value,
            "result": result,
            "error_code": None,
            "error_message": None,
        },
    )


def _ended(status: InvokeStatus, code: ErrorCode, message: str, now: datetime) -> dict[str, Any]:
    assert status.terminal, status
    return {
        "status": status.value,
        "finished_at": now,
        "error_code": code.value,
        "error_message": message,
    }
