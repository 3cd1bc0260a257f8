"""Invokes from the tenant's side: submit, read, list, cancel, logs (SPEC §1.5)."""

import asyncio
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core import driver_models
from gpu_share.coordinator.core.db import Database, driver_of
from gpu_share.coordinator.core.driver_sql import Sql
from gpu_share.coordinator.core.errors import (
    Conflict,
    InsufficientBalance,
    NotFound,
    Unavailable,
    ValidationFailed,
    field_error,
)
from gpu_share.coordinator.core.ids import checked_cursor, new_id
from gpu_share.coordinator.core.orm import InvokeLogRow, InvokeRow, NodeRow
from gpu_share.coordinator.core.settings import ChecksumMode, Settings
from gpu_share.coordinator.core.statuses import CHECK_CAME_BACK
from gpu_share.coordinator.replica.notify import Channel, Notifier, in_statement
from gpu_share.coordinator.services.money import billing, spending_limits
from gpu_share.coordinator.services.nodes import nodes, shortfall
from gpu_share.coordinator.services.nodes.placement import (
    Requirements,
    nothing_meets,
    requirements_of,
    serves,
)
from gpu_share.coordinator.services.webhooks import events
from gpu_share.coordinator.services.work import (
    artifact_refs,
    invoke_state,
    preemption,
    reservation_holds,
)
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import (
    Invoke,
    InvokeCreate,
    InvokeError,
    InvokeRefund,
    InvokeResult,
    InvokeStatus,
    Priority,
)
from gpu_share.protocol.money import usdc_text
from gpu_share.protocol.runtimes import RuntimeName

ARTIFACT_PATH = re.compile(r"^/v1/artifacts/(art_[0-9a-z]{26})/download/?$")
# Where a result's outputs went, when the agent stored them on the platform (`job_files`).
OUTPUTS_ARTIFACT = re.compile(r"/v1/artifacts/(art_[0-9a-z]{26})/download/?(?:\?.*)?$")


def outputs_artifact_id(result: dict[str, object]) -> str | None:
    """The artifact a stored result's `outputs_url` names, if it names one: as its node
    sent it, so whose it is remains to be checked by whoever reads it."""
    url = result.get("outputs_url")
    found = OUTPUTS_ARTIFACT.search(url) if isinstance(url, str) else None
    return found.group(1) if found else None


def spot_checked(row: InvokeRow) -> bool:
    """Its result was recomputed on a trusted node and compared, whatever it found."""
    return row.check_state in CHECK_CAME_BACK


def refund_of(row: InvokeRow) -> InvokeRefund | None:
    if row.refunded_at is None:
        return None
    return InvokeRefund(at=row.refunded_at, reason=row.refund_reason)


def to_wire(row: InvokeRow) -> Invoke:
    error = (
        InvokeError(code=row.error_code, message=row.error_message or "")
        if row.error_code
        else None
    )
    return Invoke(
        id=row.id,
        status=InvokeStatus(row.status),
        runtime=RuntimeName(row.runtime),
        model_url=row.model_url,
        inputs_url=row.inputs_url,
        timeout_sec=row.timeout_sec,
        priority=Priority(row.priority),
        node_id=row.node_id,
        attempts=row.attempts,
        preemptions=row.preemptions,
        created_at=row.created_at,
        assigned_at=row.assigned_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        cancel_requested_at=row.cancel_requested_at,
        result=InvokeResult.model_validate(row.result) if row.result else None,
        error=error,
        max_cost=billing.cost_text(row.max_cost_micro),
        rate_per_hour=billing.cost_text(row.rate_micro_per_hour),
        cost=billing.cost_text(row.cost_micro),
        warnings=list(row.warnings or []),
        reservation_id=row.reservation_id,
        spot_checked=spot_checked(row),
        refund=refund_of(row),
        webhook_url=row.webhook_url,
    )


def platform_artifact_id(url: str, origins: set[str]) -> str | None:
    """The artifact id when `url` is one of this platform's download URLs."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    host, slash, path = rest.partition("/")
    if f"{scheme.lower()}://{host.lower()}" not in origins:
        return None
    match = ARTIFACT_PATH.match(slash + path.split("?", 1)[0])
    return match.group(1) if match else None


def origins_of(*base_urls: str) -> set[str]:
    return {u.rstrip("/").lower() for u in base_urls if u}


@dataclass(frozen=True)
class ResolvedUrl:
    artifact_id: str | None
    sha256: str | None


async def resolve_url(
    session: AsyncSession,
    tenant_id: str,
    field: str,
    url: str,
    checksum: str | None,
    origins: set[str],
    now: datetime,
) -> ResolvedUrl:
    artifact_id = platform_artifact_id(url, origins)
    if artifact_id is None:
        return ResolvedUrl(None, checksum)
    row = await artifact_refs.stored_artifact(session, artifact_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound(f"{field}: artifact {artifact_id} does not exist")
    if row.expires_at <= now or row.storage_key is None:
        raise ValidationFailed(
            f"{field}: artifact {artifact_id} expired at {row.expires_at.isoformat()}; "
            "upload it again",
            code=ErrorCode.ARTIFACT_EXPIRED,
        )
    if checksum is not None and checksum != row.sha256:
        raise ValidationFailed(
            f"{field}: the artifact's SHA-256 is {row.sha256}, not {checksum}",
            code=ErrorCode.CHECKSUM_MISMATCH,
            details={"field": field, "expected": checksum, "actual": row.sha256},
        )
    return ResolvedUrl(artifact_id, row.sha256)


def _checksum_rules(body: InvokeCreate, settings: Settings) -> list[str]:
    missing = []
    if body.model_checksum_sha256 is None:
        missing.append("model_checksum_sha256")
    if body.inputs_url and body.inputs_checksum_sha256 is None:
        missing.append("inputs_checksum_sha256")
    if not missing:
        return []
    if settings.checksum_mode is ChecksumMode.ENFORCE:
        raise field_error(
            missing[0],
            "required while the server enforces checksums (CHECKSUM_MODE=enforce); "
            "give the SHA-256 of the file at the URL",
        )
    if settings.checksum_mode is ChecksumMode.WARN:
        return [f"{name} not given: the download is not verified" for name in missing]
    return []


def no_capacity(req: Requirements, online: Sequence[NodeRow], now: datetime) -> Unavailable:
    """503 NO_CAPACITY (SPEC §1.5, §4.1): `details.constraint` names the constraint no
    online node met, for programs; the message says it in words, with what the closest
    machine has and what would work (`shortfall`)."""
    missed = nothing_meets(list(online), req, now)
    return Unavailable(
        shortfall.explain(req, missed, online, now),
        code=ErrorCode.NO_CAPACITY,
        details={"constraint": missed},
        headers={"Retry-After": "30"},
    )


def over_budget(req: Requirements, capped: Requirements, body: InvokeCreate) -> Unavailable:
    """503 NO_CAPACITY: machines serve `req`, but none at a rate `max_cost` covers for
    `timeout_sec` (`capped.max_price_micro`, `billing.plan_reserve`)."""
    cost = usdc_text(body.max_cost or 0)
    rate = usdc_text(capped.max_price_micro or 0)
    return Unavailable(
        f"No machine online right now can {shortfall.asked(req)} within max_cost {cost} "
        f"USDC: over timeout_sec {body.timeout_sec} that pays at most {rate} USDC per "
        "GPU-hour, and every machine that could asks more. Raise max_cost, lower "
        "timeout_sec, or try again later.",
        code=ErrorCode.NO_CAPACITY,
        details={"constraint": "max_cost"},
        headers={"Retry-After": "30"},
    )


def request_hash(body: InvokeCreate) -> str:
    # Without an unset max_cost or reservation_id, nor require_verified at its default, so
    # keys used before they existed still match their invoke.
    unset = {name for name in ("max_cost", "reservation_id") if getattr(body, name) is None}
    if not body.require_verified:
        unset.add("require_verified")
    dumped = body.model_dump(mode="json", exclude=unset or None)
    canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_request(body: InvokeCreate, settings: Settings) -> list[str]:
    """The checks of a body beyond its schema (the invoke's and the quote's); its warnings."""
    if body.timeout_sec > settings.max_timeout_sec:
        raise field_error("timeout_sec", f"must be at most {settings.max_timeout_sec} seconds")
    if body.webhook_url:
        events.check_url("webhook_url", body.webhook_url, settings)
    return _checksum_rules(body, settings)


async def reserve_plan(
    session: AsyncSession,
    settings: Settings,
    body: InvokeCreate,
    req: Requirements,
    now: datetime,
) -> tuple[int, Requirements]:
    """What to reserve and the requirements placement must then meet (`billing`);
    503 NO_CAPACITY when no online node serves `req`, or none whose rate fits `max_cost`.
    The online nodes are read once for both."""
    live = await nodes.live_for_placement(session, now, settings)
    serving = [node for node in live if serves(node, req, now)]
    if not serving:
        raise no_capacity(req, live, now)
    if not billing.prepaid(settings):
        return 0, req
    reserve, placed = await billing.plan_reserve(
        session,
        req,
        timeout_sec=body.timeout_sec,
        max_cost_micro=body.max_cost,
        serving=serving,
        now=now,
    )
    if reserve < 0:
        raise over_budget(req, placed, body)
    return reserve, placed


_INSERT = driver_models.insert_of(InvokeRow)
_QUEUE = {
    "postgresql": Sql(
        f"WITH queued AS ({_INSERT.text} RETURNING id)"  # noqa: S608 (the model's names)
        f" SELECT {in_statement(Channel.WORK)} FROM queued",
        jsons=_INSERT.jsons,
    ),
    "sqlite": _INSERT,
}
"""`create`'s INSERT; on PostgreSQL it also publishes on WORK at the commit
(`notify.in_statement`): its caller wakes this replica's pollers (`told_by_commit`)."""


async def create(
    db: Database,
    settings: Settings,
    tenant_id: str,
    body: InvokeCreate,
    *,
    idempotency_key: str | None,
    origins: set[str],
    now: datetime,
) -> tuple[Invoke, bool]:
    """Queue an invoke; returns it and whether it is new (False: an idempotent replay)."""
    digest = request_hash(body)
    if idempotency_key is not None:
        async with db.read() as session:
            replay = await _replay(session, tenant_id, idempotency_key, digest)
        if replay is not None:
            return replay, False
    warnings = check_request(body, settings)
    req = requirements_of(body, body.gpus)
    try:
        async with (
            spending_limits.mailing_refusals(db, tenant_id, settings, now),
            db.write() as session,
        ):
            model = await resolve_url(
                session,
                tenant_id,
                "model_url",
                body.model_url,
                body.model_checksum_sha256,
                origins,
                now,
            )
            inputs = (
                await resolve_url(
                    session,
                    tenant_id,
                    "inputs_url",
                    body.inputs_url,
                    body.inputs_checksum_sha256,
                    origins,
                    now,
                )
                if body.inputs_url
                else ResolvedUrl(None, None)
            )
            if body.webhook_url:
                await events.require_secret(session, tenant_id, "webhook_url")
            if body.reservation_id is not None:  # billed by the reservation: reserve nothing
                await reservation_holds.check_work(
                    session, tenant_id, body.reservation_id, req, now
                )
                reserve, placed = 0, req
            else:
                reserve, placed = await reserve_plan(session, settings, body, req, now)
            row = InvokeRow(
                id=new_id("inv"),
                tenant_id=tenant_id,
                status=InvokeStatus.QUEUED.value,
                runtime=body.runtime.value,
                priority=body.priority.value,
                model_url=body.model_url,
                inputs_url=body.inputs_url or "",
                model_artifact_id=model.artifact_id,
                inputs_artifact_id=inputs.artifact_id,
                model_sha256=model.sha256,
                inputs_sha256=inputs.sha256,
                timeout_sec=body.timeout_sec,
                gpus=body.gpus if body.runtime.needs_gpu else 0,
                constraints=placed.constraints(),
                outputs_upload=body.outputs_upload.model_dump() if body.outputs_upload else None,
                warnings=warnings,
                idempotency_key=idempotency_key,
                request_hash=digest,
                attempts=0,
                max_attempts=settings.max_attempts,
                created_at=now,
                log_bytes=0,
                max_cost_micro=body.max_cost,
                reserved_micro=0,
                # Free billing, or a reservation's work: "0" throughout.
                cost_micro=0 if not billing.prepaid(settings) or body.reservation_id else None,
                reservation_id=body.reservation_id,
                webhook_url=body.webhook_url,
            )
            await _reserve(session, settings, row, reserve, now)
            # Every submit writes one: on the driver (`driver_models`), in this transaction.
            tx = await driver_of(session)
            await tx.execute(_QUEUE[tx.dialect], **driver_models.flushed_values(row))
            invoke = to_wire(row)
    except IntegrityError:
        if idempotency_key is None:
            raise
        async with db.read() as session:  # a concurrent request with the same key won
            replay = await _replay(session, tenant_id, idempotency_key, digest)
        if replay is None:
            raise
        return replay, False
    return invoke, True


async def _reserve(
    session: AsyncSession, settings: Settings, row: InvokeRow, amount: int, now: datetime
) -> None:
    try:
        await billing.reserve_invoke(session, row, amount, settings, now)
    except InsufficientBalance as exc:
        details = exc.details if isinstance(exc.details, dict) else {}
        raise InsufficientBalance(
            f"the balance is {details.get('available')} USDC and this invoke may cost up to "
            f"{details.get('required')} USDC (its max_cost, or timeout_sec={row.timeout_sec} at "
            "the highest rate of the nodes that could run it); top up, or lower timeout_sec "
            "or max_cost",
            details=details,
        ) from None


async def _replay(session: AsyncSession, tenant_id: str, key: str, digest: str) -> Invoke | None:
    row = await session.scalar(
        select(InvokeRow).where(InvokeRow.tenant_id == tenant_id, InvokeRow.idempotency_key == key)
    )
    if row is None:
        return None
    if row.request_hash != digest:
        raise Conflict(
            f"Idempotency-Key {key!r} was used for invoke {row.id} with a different body; "
            "use a new key for a new request"
        )
    return to_wire(row)


async def owned(session: AsyncSession, tenant_id: str, invoke_id: str) -> InvokeRow:
    row = await session.get(InvokeRow, invoke_id)
    # A spot check (docs/trust.md) is the platform's, never the tenant's to see (the
    # driver's read, `_OWNED`, says the same in SQL).
    if row is None or row.tenant_id != tenant_id or row.check_of is not None:
        raise NotFound(f"invoke {invoke_id} does not exist")
    return row


MAX_WAIT_SEC = 60.0


_OWNED = driver_models.whole_row(
    InvokeRow, "WHERE id = :invoke_id AND tenant_id = :tenant_id AND check_of IS NULL"
)
"""`owned`'s read on the driver: what a poll and each wake of a long-poll read."""


async def read_owned(db: Database, tenant_id: str, invoke_id: str) -> Invoke:
    """The tenant's invoke as `owned` finds it, read on the driver (no ORM: the object is
    `transient`), as the tenant sees it."""
    async with db.driver_read() as tx:
        found = await tx.fetchrow(_OWNED, invoke_id=invoke_id, tenant_id=tenant_id)
    if found is None:
        raise NotFound(f"invoke {invoke_id} does not exist")
    return to_wire(driver_models.transient(InvokeRow, found))


async def wait_until_final(
    db: Database, notifier: Notifier, tenant_id: str, invoke_id: str, wait_sec: float
) -> Invoke:
    """The invoke once it is final, or as it is after `wait_sec` (0: at once)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(wait_sec, MAX_WAIT_SEC)
    with notifier.watch(Channel.FINISHED, invoke_id) as finished:
        while True:
            finished.clear()
            invoke = await read_owned(db, tenant_id, invoke_id)
            remaining = deadline - loop.time()
            if invoke.status.terminal or remaining <= 0 or notifier.closed:
                return invoke
            await notifier.wait_watched(finished, remaining)


async def list_for_tenant(
    session: AsyncSession,
    tenant_id: str,
    *,
    status: InvokeStatus | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[Invoke], str | None]:
    query = select(InvokeRow).where(InvokeRow.tenant_id == tenant_id, InvokeRow.check_of.is_(None))
    if status is not None:
        query = query.where(InvokeRow.status == status.value)
    if checked_cursor("inv", cursor):
        query = query.where(InvokeRow.id < cursor)
    rows = (await session.scalars(query.order_by(InvokeRow.id.desc()).limit(limit + 1))).all()
    next_cursor = rows[limit - 1].id if len(rows) > limit else None
    return [to_wire(row) for row in rows[:limit]], next_cursor


async def cancel(
    session: AsyncSession, tenant_id: str, invoke_id: str, now: datetime, settings: Settings
) -> Invoke:
    """Queued → canceled at once; leased → ask the agent (it stops the job and reports).
    Spot work stopping for a queued invoke placed on its node runs on (`preemption`)."""
    row = await owned(session, tenant_id, invoke_id)
    status = InvokeStatus(row.status)
    if status is InvokeStatus.CANCELED:
        return to_wire(row)
    if status.terminal:
        raise Conflict(f"invoke {invoke_id} already finished with status {status.value}")
    if await invoke_state.cancel_queued(session, invoke_id, now):
        await session.refresh(row)
        await preemption.withdraw_for_canceled(session, row, now, settings)
    else:
        # leased meanwhile (or already): the node learns of it from its next heartbeat
        await invoke_state.request_cancel(session, invoke_id, now)
    await session.refresh(row)
    return to_wire(row)


async def read_logs(
    session: AsyncSession, tenant_id: str, invoke_id: str, after: int, limit: int = 1000
) -> tuple[str, int, InvokeStatus]:
    """Log text after cursor `after`; returns text, the new cursor and the invoke's status."""
    row = await owned(session, tenant_id, invoke_id)
    pieces = (
        await session.execute(
            select(InvokeLogRow.id, InvokeLogRow.text)
            .where(InvokeLogRow.invoke_id == invoke_id, InvokeLogRow.id > after)
            .order_by(InvokeLogRow.id)
            .limit(limit)
        )
    ).all()
    cursor = pieces[-1][0] if pieces else after
    return "".join(text for _, text in pieces), cursor, InvokeStatus(row.status)
