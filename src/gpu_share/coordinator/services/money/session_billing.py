"""What sessions cost (SPEC §4.3; docs/billing.md): held time, charged as it goes.

A session is metered from `ready_at` (its model loaded) to `closed_at`, at the rate
fixed when it was placed (the node's on-demand hourly rate; one GPU). Money moves as
it goes, so a long session never runs up a debt:

- at open, an hour at that rate is reserved (402, nothing created, when the balance
  cannot cover it);
- each upkeep pass at least `CHARGE_EVERY_SEC` after the last charge posts what the
  time held since then cost (cause ``session:{id}:{interval end}``), guarded by
  `billed_until` so two replicas never bill one interval twice; when less than half an
  hour is left in reserve it reserves up to an hour again, and a session whose next
  period cannot be reserved is closed (`INSUFFICIENT_BALANCE`);
- at close, the last interval is charged and the rest of the reserve released in one
  transaction (``session:{id}:settle``). A session lost on the provider's side pays
  nothing for its last interval.

Cost is computed on the whole time held (`metered(rate, closed − ready)` minus what
was charged before), so rounding down never loses more than one micro-USDC in total.
"""

from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import InsufficientBalance
from gpu_share.coordinator.core.orm import NodeRow, SessionRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.money import billing, ledger, spending_limits
from gpu_share.coordinator.services.money.ledger import ChargeDetails, TransactionKind
from gpu_share.coordinator.services.providers.reliability_formula import PROVIDER_SIDE

PERIOD_SEC = 3600  # reserved ahead
CHARGE_EVERY_SEC = 60.0  # upkeep charges a held session at most this often
TOP_UP_BELOW_SEC = 1800  # reserve again when less than this is left


def reserve_cause(session_id: str, at: datetime | None) -> str:
    return f"session:{session_id}:reserve:{'open' if at is None else at.isoformat()}"


def charge_cause(session_id: str, end: datetime) -> str:
    return f"session:{session_id}:{end.isoformat()}"


def settle_cause(session_id: str) -> str:
    return f"session:{session_id}:settle"


async def open_billing(
    session: AsyncSession, row: SessionRow, node: NodeRow, settings: Settings, now: datetime
) -> None:
    """Fix the rate and reserve the first period, before the session exists for anyone
    (402 then, in the transaction that would have created it)."""
    row.cost_micro = 0
    row.reserved_micro = 0
    if not billing.prepaid(settings) or row.reservation_id is not None:
        row.rate_micro_per_hour = 0  # free billing, or billed by its reservation
        return
    # Per GPU-hour × max(gpus, 1), as for invokes: a whole-GPU session pays for each.
    row.rate_micro_per_hour = await billing.placed_rate(
        session, node, gpus=row.gpus or 0, spot=False
    )
    first = billing.most_for(row.rate_micro_per_hour, PERIOD_SEC)
    if first == 0:
        return
    try:
        await _reserve(
            session,
            row.tenant_id,
            row.id,
            first,
            None,
            settings,
            now,
            new_work="a session on this node reserves an hour ahead:",
        )
    except InsufficientBalance as exc:
        details = exc.details if isinstance(exc.details, dict) else {}
        raise InsufficientBalance(
            f"the balance is {details.get('available')} USDC and a session on this node "
            f"reserves an hour ahead: {details.get('required')} USDC; top up first",
            details=details,
        ) from None
    row.reserved_micro = first


async def _reserve(
    session: AsyncSession,
    tenant_id: str,
    session_id: str,
    amount: int,
    at: datetime | None,
    settings: Settings,
    now: datetime,
    *,
    new_work: str | None = None,
) -> None:
    """`new_work`: at open only; the next periods of a held session are running work,
    which the monthly cap never stops."""
    await spending_limits.reserve(
        session,
        tenant_id=tenant_id,
        amount_micro=amount,
        cause=reserve_cause(session_id, at),
        details={
            "tenant_id": tenant_id,
            "work": "session",
            "work_id": session_id,
            "commission_bps": settings.commission_bps,
        },
        settings=settings,
        now=now,
        new_work=new_work,
    )


async def bill_held(
    session: AsyncSession, session_id: str, now: datetime, settings: Settings
) -> bool:
    """Charge a held session up to now and reserve its next period; False when that
    period cannot be reserved (the caller closes it)."""
    row = await session.get(SessionRow, session_id, populate_existing=True)
    if row is None or row.closed_at is not None or row.ready_at is None:
        return True
    if not row.rate_micro_per_hour or (row.reserved_micro == 0 and not row.cost_micro):
        return True  # free, or nothing was ever reserved: nothing to charge
    since = row.billed_until or row.ready_at
    due = (now - since).total_seconds() >= CHARGE_EVERY_SEC
    if due and not await _charge(session, row, since, now, final=False):
        return True  # another replica billed it meanwhile
    left = row.reserved_micro
    if left >= billing.most_for(row.rate_micro_per_hour, TOP_UP_BELOW_SEC):
        return True
    more = billing.most_for(row.rate_micro_per_hour, PERIOD_SEC) - left
    try:
        await _reserve(session, row.tenant_id, row.id, more, now, settings, now)
    except InsufficientBalance:
        return False
    await session.execute(
        update(SessionRow)
        .where(SessionRow.id == row.id)
        .values(reserved_micro=SessionRow.reserved_micro + more)
    )
    return True


async def _charge(
    session: AsyncSession,
    row: SessionRow,
    since: datetime,
    end: datetime,
    *,
    final: bool,
) -> bool:
    """Charge `since`..`end` (final: and release the rest), guarded by `billed_until`."""
    assert row.ready_at is not None
    rate = row.rate_micro_per_hour or 0
    charged = row.cost_micro or 0
    owed = billing.metered(rate, _ms(end - row.ready_at)) - charged
    if final and row.error_code in {code.value for code in PROVIDER_SIDE}:
        owed = 0  # lost on the provider's side: the last interval is not the tenant's
    owed = max(0, min(owed, row.reserved_micro))
    released = row.reserved_micro - owed if final else 0
    guard = (
        SessionRow.billed_until.is_(None)
        if row.billed_until is None
        else SessionRow.billed_until == row.billed_until
    )
    moved = await session.execute(
        update(SessionRow)
        .where(SessionRow.id == row.id, guard)
        .values(
            billed_until=end,
            cost_micro=charged + owed,
            reserved_micro=SessionRow.reserved_micro - owed - released,
        )
    )
    if moved.rowcount != 1:  # type: ignore[attr-defined]
        return False
    tenant = row.tenant_id
    cause = settle_cause(row.id) if final else charge_cause(row.id, end)
    if owed == 0:
        if released:
            await ledger.post(
                session,
                cause=cause,
                kind=TransactionKind.RELEASE,
                entries=ledger.transfer(
                    ledger.tenant_reserved(tenant), ledger.tenant_balance(tenant), released
                ),
                now=end,
                details={"tenant_id": tenant, "work": "session", "work_id": row.id},
            )
        await session.refresh(row)
        return True
    node = await session.get(NodeRow, row.node_id)
    assert node is not None
    bps = await billing.commission_of(session, reserve_cause(row.id, None))
    provider_share, commission = ledger.split_commission(owed, bps)
    details: ChargeDetails = {
        "tenant_id": tenant,
        "provider_id": node.provider_id,
        "node_id": node.id,
        "work": "session",
        "work_id": row.id,
        "runtime": row.runtime,
        "gpu_model": billing.gpu_model_of(node, 1 if node.gpus else 0),
        "gpus": billing.units(row.gpus or 0),
        "spot": False,
        "seconds": _ms(end - since) / 1000,
        "rate_micro_per_hour": rate,
        "cost_micro": owed,
        "provider_micro": provider_share,
        "commission_micro": commission,
        "started_at": since.isoformat(),
        "ended_at": end.isoformat(),
    }
    await billing.post_charge(
        session, cause=cause, node=node, from_reserve=owed + released, details=details, now=end
    )
    await session.refresh(row)
    return True


async def settle(session: AsyncSession, session_id: str) -> None:
    """At close, in the transaction that closed it: the last interval, the rest released."""
    row = await session.get(SessionRow, session_id, populate_existing=True)
    if row is None or row.closed_at is None:
        return
    if row.ready_at is None:  # never held: nothing used
        if row.reserved_micro:
            await ledger.post(
                session,
                cause=settle_cause(row.id),
                kind=TransactionKind.RELEASE,
                entries=ledger.transfer(
                    ledger.tenant_reserved(row.tenant_id),
                    ledger.tenant_balance(row.tenant_id),
                    row.reserved_micro,
                ),
                now=row.closed_at,
                details={"tenant_id": row.tenant_id, "work": "session", "work_id": row.id},
            )
            await session.execute(
                update(SessionRow).where(SessionRow.id == row.id).values(reserved_micro=0)
            )
        return
    since = row.billed_until or row.ready_at
    end = max(row.closed_at, since)
    await _charge(session, row, since, end, final=True)


def _ms(elapsed: timedelta) -> int:
    return max(0, int(elapsed.total_seconds() * 1000))


async def due(session: AsyncSession, ids: list[str], now: datetime) -> list[str]:
    """Of these sessions, the priced ones held long enough since their last charge to be
    charged now (`bill_held`); the others need no write this pass."""
    if not ids:
        return []
    since = func.coalesce(SessionRow.billed_until, SessionRow.ready_at)
    found = await session.scalars(
        select(SessionRow.id).where(
            SessionRow.id.in_(ids),
            SessionRow.closed_at.is_(None),
            SessionRow.ready_at.is_not(None),
            SessionRow.rate_micro_per_hour > 0,
            since <= now - timedelta(seconds=CHARGE_EVERY_SEC),
        )
    )
    return list(found.all())
