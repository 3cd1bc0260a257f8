"""Dedicated reservations (SPEC §4.3; docs/placement.md, docs/billing.md): whole GPUs of
one node held for one tenant for a period of whole hours. This module books them.

- Which node: the one named, or the best ranked node that meets the filters, by the
  same eligibility as placement (`placement.unmet`, at the period's start; only verified
  GPUs count, and with `require_verified` only verified nodes), online now,
  inside its provider's windows for the whole period, with `gpus` listed GPUs that no
  other reservation holds at any moment of the period. The node's row is locked while
  that is checked and the reservation written, so two overlapping requests at once
  cannot both win.
- Money: the period's price (the node's on-demand rate × GPUs × hours, exact integer
  micro-USDC) is reserved from the balance at creation (`reservation:{id}:reserve`) and
  charged at the end, or at a cancel (`reservation_billing`).
- A reservation is *in force* from `starts_at` to `ends_at` unless canceled: placement
  (`reservation_holds`) goes by that, so it holds its GPUs on time whether or not the
  loop has flipped `status` yet.
"""

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.errors import (
    Conflict,
    InsufficientBalance,
    NotFound,
    Unavailable,
    ValidationFailed,
    field_error,
)
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import InvokeRow, NodeRow, ReservationRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.statuses import ACTIVE_VALUES, LIVE
from gpu_share.coordinator.services.money import billing, ledger, spending_limits
from gpu_share.coordinator.services.nodes import nodes, prices, ranking, schedules, shortfall
from gpu_share.coordinator.services.nodes.placement import (
    CONSTRAINTS,
    Requirements,
    gpu_matches,
    unmet,
)
from gpu_share.coordinator.services.rentals import reservation_downtime
from gpu_share.coordinator.services.webhooks import events
from gpu_share.coordinator.services.work.reservation_holds import owned
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import Priority
from gpu_share.protocol.money import MICRO, usdc_text
from gpu_share.protocol.reservations import (
    MAX_DAYS_AHEAD,
    MAX_HOURS,
    MIN_HOURS,
    Reservation,
    ReservationQuote,
    ReservationRequest,
    ReservationStatus,
)
from gpu_share.protocol.runtimes import RuntimeName

HOUR = reservation_downtime.HOUR  # one owner of the period's unit


def reserve_cause(reservation_id: str) -> str:
    return f"reservation:{reservation_id}:reserve"


def settle_cause(reservation_id: str) -> str:
    return f"reservation:{reservation_id}:settle"


async def tell(
    session: AsyncSession,
    reservation_id: str,
    tenant_id: str,
    url: str | None,
    event_type: str,
    now: datetime,
) -> None:
    """A reservation's webhook, when it has a webhook_url, in the transaction of its change."""
    if url:
        await events.emit(
            session,
            owner_id=tenant_id,
            event_type=event_type,
            data={"id": reservation_id, "status": event_type.removeprefix("reservation.")},
            cause=f"{reservation_id}:{event_type}",
            now=now,
            url=url,
        )


def hours_of(row: ReservationRow) -> int:
    return int((row.ends_at - row.starts_at) / HOUR)


def to_wire(row: ReservationRow) -> Reservation:
    credit = reservation_downtime.credited(row)
    return Reservation(
        id=row.id,
        status=ReservationStatus(row.status),
        node_id=row.node_id,
        gpus=row.gpus,
        gpu_indices=[int(i) for i in row.gpu_indices],
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        hours=hours_of(row),
        rate_per_hour=usdc_text(row.rate_micro_per_hour),
        cost=usdc_text(row.cost_micro),
        credited=usdc_text(credit) if credit is not None else None,
        created_at=row.created_at,
        canceled_at=row.canceled_at,
        ended_at=row.ended_at,
        webhook_url=row.webhook_url,
    )


# The period


def _utc(moment: datetime, field: str) -> datetime:
    """A naive time is taken as UTC."""
    try:
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except OverflowError:
        raise field_error(
            field, "is out of range; give a UTC time such as 2026-12-03T10:00:00Z"
        ) from None


def period_of(body: ReservationRequest, now: datetime) -> tuple[datetime, datetime]:
    """[starts_at, ends_at), checked: whole hours, 1 h to 30 days, not in the past."""
    if body.starts_at is None:
        start = now
    else:
        start = _utc(body.starts_at, "starts_at")
        if start.second or start.microsecond:
            raise field_error("starts_at", "give a whole minute, such as 2026-12-03T10:00:00Z")
        if start < now.replace(second=0, microsecond=0):
            raise field_error(
                "starts_at", f"{start.isoformat()} is in the past; leave it out to start now"
            )
        if start > now + timedelta(days=MAX_DAYS_AHEAD):
            raise field_error("starts_at", f"may be at most {MAX_DAYS_AHEAD} days ahead")
    if (body.hours is None) == (body.ends_at is None):
        raise field_error("hours", "give the period's length as `hours` or its `ends_at`, one")
    if body.hours is not None:
        return start, start + body.hours * HOUR
    assert body.ends_at is not None
    end = _utc(body.ends_at, "ends_at")
    if end <= start:
        raise field_error("ends_at", f"must be after starts_at ({start.isoformat()})")
    if (end - start) % HOUR:
        raise field_error(
            "ends_at", "the period is whole hours: give an ends_at whole hours after starts_at"
        )
    hours = int((end - start) / HOUR)
    if not MIN_HOURS <= hours <= MAX_HOURS:
        raise field_error("ends_at", f"a period is {MIN_HOURS} to {MAX_HOURS} hours, not {hours}")
    return start, end


# Which node, which GPUs


def _asked(body: ReservationRequest) -> Requirements:
    """The request's placement requirements; the runtime is each GPU runtime a node
    serves (`_requirements`), this one only holds its place."""
    return Requirements(
        runtime=RuntimeName.ONNX_CUDA,
        gpus=body.gpus,
        min_vram_mb=int(body.min_vram_gb * 1000**3 / 1024**2) if body.min_vram_gb else None,
        gpu_model=body.gpu_model,
        region=body.region,
        tier=body.tier.value if body.tier else None,
        max_price_micro=int(body.max_price * MICRO) if body.max_price is not None else None,
        min_reliability=body.min_reliability,
        require_verified=body.require_verified,
        verified_gpus=True,  # a reservation rents GPUs as their model: proven ones only
    )


def _requirements(body: ReservationRequest, node: NodeRow) -> list[Requirements]:
    """The placement requirements of the request, once per GPU runtime the node serves."""
    asked = _asked(body)
    return [replace(asked, runtime=r) for r in nodes.known(node) if r.needs_gpu]


def _missed(node: NodeRow, body: ReservationRequest, start: datetime, end: datetime) -> str | None:
    """The first constraint the node misses for this period (placement's order); None: it
    may be reserved. The window must be open over the whole period."""
    reqs = _requirements(body, node)
    if not reqs:
        return "runtime"
    misses = [unmet(node, req, start) for req in reqs]
    if None not in misses:
        return max((m for m in misses if m), key=CONSTRAINTS.index)
    if schedules.open_intervals(schedules.availability_of(node), start, end) != [(start, end)]:
        return "availability window"
    return None


def _candidate_gpus(node: NodeRow, body: ReservationRequest) -> list[int]:
    """GPUs that meet the request, the node's first one last (it holds the sessions)."""
    first = min((int(gpu.get("index", n)) for n, gpu in enumerate(node.gpus)), default=0)
    for req in _requirements(body, node):
        found = [
            int(gpu.get("index", n))
            for n, gpu in enumerate(node.gpus)
            if gpu_matches(node, gpu, req)
        ]
        if len(found) >= body.gpus:
            return sorted(found, key=lambda i: (i == first, i))
    return []


async def _overlapping(
    session: AsyncSession, node_id: str, start: datetime, end: datetime
) -> list[ReservationRow]:
    return list(
        (
            await session.scalars(
                select(ReservationRow).where(
                    ReservationRow.node_id == node_id,
                    ReservationRow.status.in_(LIVE),
                    ReservationRow.starts_at < end,
                    ReservationRow.ends_at > start,
                )
            )
        ).all()
    )


async def _free_gpus(
    session: AsyncSession, node: NodeRow, body: ReservationRequest, start: datetime, end: datetime
) -> list[int]:
    """The GPUs meeting the request that no other reservation holds during the period,
    those on-demand work may still be using at the start last (spot work is preempted)."""
    taken = {
        int(i) for r in await _overlapping(session, node.id, start, end) for i in r.gpu_indices
    }
    busy = await _busy_at(session, node.id, start)
    free = [i for i in _candidate_gpus(node, body) if i not in taken]
    return sorted(free, key=lambda i: i in busy)


async def _busy_at(session: AsyncSession, node_id: str, moment: datetime) -> set[int]:
    """GPUs of the node that running on-demand work may still hold at `moment`."""
    rows = await session.execute(
        select(InvokeRow.gpu_indices).where(
            InvokeRow.node_id == node_id,
            InvokeRow.status.in_(ACTIVE_VALUES),
            InvokeRow.priority != Priority.SPOT.value,
            InvokeRow.gpu_indices.is_not(None),
            or_(InvokeRow.deadline_at.is_(None), InvokeRow.deadline_at > moment),
        )
    )
    return {int(i) for (indices,) in rows.all() for i in indices or []}


@dataclass(frozen=True)
class Plan:
    node: NodeRow
    gpu_indices: list[int]
    starts_at: datetime
    ends_at: datetime
    rate_per_gpu_micro: int

    @property
    def hours(self) -> int:
        return int((self.ends_at - self.starts_at) / HOUR)

    @property
    def rate_micro(self) -> int:
        return self.rate_per_gpu_micro * len(self.gpu_indices)

    @property
    def cost_micro(self) -> int:
        return self.rate_micro * self.hours


def _node_refused(node_id: str, missed: str, body: ReservationRequest) -> ValidationFailed:
    if missed == "gpus":
        why = (
            f"node {node_id} has fewer than {body.gpus} listed GPUs that meet the request; "
            "ask for fewer GPUs or another node"
        )
    elif missed == "availability window":
        why = (
            f"node {node_id} is outside its provider's availability windows during part of the "
            "period; pick a period inside them (GET /v1/nodes shows available_now)"
        )
    elif missed == "runtime":
        why = f"node {node_id} serves no GPU runtime; reserve a GPU node"
    elif missed == "verified":
        why = (
            f"node {node_id}'s hardware is not proven by a hardware challenge yet "
            f"(docs/trust.md): it has fewer than {body.gpus} verified GPUs that meet the "
            "request, or, with require_verified, GPUs not verified; reserve it once "
            "GET /v1/nodes shows it verified, or pick another node"
        )
    else:
        why = f"node {node_id} does not meet {missed}; relax it or pick another node"
    return ValidationFailed(why, details={"constraint": missed, "node_id": node_id})


async def plan(
    session: AsyncSession,
    body: ReservationRequest,
    now: datetime,
    settings: Settings,
    *,
    lock: bool = False,
) -> Plan:
    """The node, GPUs, period and price a request gets now; raises what is wrong with it."""
    start, end = period_of(body, now)
    live = await nodes.live_nodes(session, now, settings)
    if body.node_id is not None:
        node = await session.get(NodeRow, body.node_id)
        if node is None:
            raise NotFound(f"node {body.node_id} does not exist")
        if node.id not in {n.id for n in live}:
            raise Unavailable(
                f"node {node.id} is offline; reserve it when it is online, or reserve by "
                "filters to get any node that is",
                code=ErrorCode.NO_CAPACITY,
                details={"constraint": "online", "node_id": node.id},
                headers={"Retry-After": "30"},
            )
        missed = _missed(node, body, start, end)
        if missed is not None:
            raise _node_refused(node.id, missed, body)
        candidates = [node]
    else:
        misses = {n.id: _missed(n, body, start, end) for n in live}
        candidates = [n for n in live if misses[n.id] is None]
        if not candidates:
            furthest = max(
                (m for m in misses.values() if m), key=CONSTRAINTS.index, default="online"
            )
            near = [
                (n, req)
                for n in live
                if misses[n.id] == furthest
                for req in _requirements(body, n)
                if unmet(n, req, start) == furthest
            ]
            raise Unavailable(
                shortfall.sentence(_asked(body), furthest, near, live, reservation=True),
                code=ErrorCode.NO_CAPACITY,
                details={"constraint": furthest},
                headers={"Retry-After": "30"},
            )
    candidates.sort(key=ranking.rank, reverse=True)
    for node in candidates:
        if lock:
            await session.refresh(node, with_for_update=True)
        free = await _free_gpus(session, node, body, start, end)
        if len(free) >= body.gpus:
            rate = await prices.hourly_rate(session, node, spot=False)
            if not billing.prepaid(settings):
                rate = 0
            return Plan(node, free[: body.gpus], start, end, rate)
    where = f"node {body.node_id}" if body.node_id else "every online node that meets the request"
    raise Conflict(
        f"{where} has its GPUs reserved for part of {start.isoformat()} to {end.isoformat()}; "
        "pick another period, fewer GPUs or another node",
        details={"constraint": "reserved"},
    )


async def quote(
    session: AsyncSession,
    tenant_id: str,
    body: ReservationRequest,
    now: datetime,
    settings: Settings,
) -> ReservationQuote:
    chosen = await plan(session, body, now, settings)
    available = (
        await ledger.balance(session, ledger.tenant_balance(tenant_id))
        if billing.prepaid(settings)
        else None
    )
    gpu = next(
        (g for g in chosen.node.gpus if int(g.get("index", -1)) in chosen.gpu_indices),
        chosen.node.gpus[0],
    )
    return ReservationQuote(
        node_id=chosen.node.id,
        gpus=len(chosen.gpu_indices),
        gpu_model=str(gpu.get("model", "")),
        starts_at=chosen.starts_at,
        ends_at=chosen.ends_at,
        hours=chosen.hours,
        rate_per_gpu_hour=usdc_text(chosen.rate_per_gpu_micro),
        rate_per_hour=usdc_text(chosen.rate_micro),
        cost=usdc_text(chosen.cost_micro),
        available=usdc_text(available) if available is not None else None,
        covered=available is None or available >= chosen.cost_micro,
        within_cap=available is None
        or await spending_limits.fits(session, tenant_id, chosen.cost_micro, now),
    )


async def book(
    db: Database, tenant_id: str, body: ReservationRequest, now: datetime, settings: Settings
) -> Reservation:
    """`create` in a write transaction of its own, a refusal for the tenant's monthly cap
    mailed after it (`spending_limits.mailing_refusals`)."""
    async with (
        spending_limits.mailing_refusals(db, tenant_id, settings, now),
        db.write() as session,
    ):
        return await create(session, tenant_id, body, now, settings)


async def create(
    session: AsyncSession,
    tenant_id: str,
    body: ReservationRequest,
    now: datetime,
    settings: Settings,
) -> Reservation:
    """Reserve; in the caller's write transaction, which the node's lock serializes."""
    if body.webhook_url:
        events.check_url("webhook_url", body.webhook_url, settings)
        await events.require_secret(session, tenant_id, "webhook_url")
    chosen = await plan(session, body, now, settings, lock=True)
    row = ReservationRow(
        id=new_id("rsv"),
        tenant_id=tenant_id,
        node_id=chosen.node.id,
        gpus=len(chosen.gpu_indices),
        gpu_indices=chosen.gpu_indices,
        status=(
            ReservationStatus.ACTIVE if chosen.starts_at <= now else ReservationStatus.PENDING
        ).value,
        starts_at=chosen.starts_at,
        ends_at=chosen.ends_at,
        rate_micro_per_hour=chosen.rate_micro,
        cost_micro=chosen.cost_micro,
        created_at=now,
        webhook_url=body.webhook_url,
    )
    session.add(row)
    await session.flush()
    if row.status == ReservationStatus.ACTIVE.value:
        await tell(session, row.id, row.tenant_id, row.webhook_url, "reservation.active", now)
    if row.cost_micro > 0:
        try:
            await spending_limits.reserve(
                session,
                tenant_id=tenant_id,
                amount_micro=row.cost_micro,
                cause=reserve_cause(row.id),
                details={
                    "tenant_id": tenant_id,
                    "work": "reservation",
                    "work_id": row.id,
                    "commission_bps": settings.commission_bps,
                },
                settings=settings,
                now=now,
                new_work="this reservation costs",
            )
        except InsufficientBalance as exc:
            details = exc.details if isinstance(exc.details, dict) else {}
            raise InsufficientBalance(
                f"the balance is {details.get('available')} USDC and this reservation costs "
                f"{usdc_text(row.cost_micro)} USDC ({chosen.hours} h × {len(chosen.gpu_indices)} "
                f"GPU(s) at {usdc_text(chosen.rate_per_gpu_micro)} USDC per GPU-hour); top up, "
                "or reserve fewer hours or GPUs",
                details=details,
            ) from None
    return to_wire(row)


# Reading


async def get(session: AsyncSession, tenant_id: str, reservation_id: str) -> Reservation:
    """The tenant's reservation; 404 if it is not theirs."""
    return to_wire(await owned(session, tenant_id, reservation_id))


async def list_for_tenant(
    session: AsyncSession, tenant_id: str, *, limit: int = 100
) -> list[Reservation]:
    rows = await session.scalars(
        select(ReservationRow)
        .where(ReservationRow.tenant_id == tenant_id)
        .order_by(ReservationRow.id.desc())
        .limit(limit)
    )
    return [to_wire(row) for row in rows.all()]
