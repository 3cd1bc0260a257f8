"""Taking back what a cheat earned, while it is still held (SPEC §3.8; for the trust work).

A node caught cheating has its charges within the hold refunded to their tenants
(`refund_charge`, one per charge) and its provider's held earnings forfeited
(`forfeit_held`). Both only ever touch held earnings: what was released is payable,
maybe paid, and is not taken back here.

    refund:  provider held (+ platform forfeits) + platform commission ──▶ tenant balance
    forfeit: provider held ──▶ platform forfeits

A forfeit leaves each charge's hold row in place with what is left of it (often 0), so
a charge can still be refunded within its hold after its share was forfeited: the
forfeits pay back that part, the commission the platform's part. Each posting is
idempotent by its cause and balanced; a provider's holds are locked through their held
account first, as `earnings_hold` describes.
"""

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import Conflict, NotFound
from gpu_share.coordinator.core.orm import EarningsHoldRow, LedgerTransactionRow
from gpu_share.coordinator.services.money import earnings_hold, ledger
from gpu_share.coordinator.services.money.ledger import Entry, TransactionKind
from gpu_share.protocol.money import usdc_text


@dataclass(frozen=True)
class HeldCharge:
    """A charge whose hold has not passed: refundable."""

    charge_id: str  # the CHARGE transaction's id: what `refund_charge` takes
    cause: str  # e.g. ``invoke:inv_…:settle``
    provider_id: str
    node_id: str
    tenant_id: str
    work: str  # "invoke", "session" or "reservation"
    work_id: str
    earned_at: datetime
    cost_micro: int  # what the tenant paid: what a refund gives back
    held_micro: int  # of the provider's share, what is still held (less once forfeited)


async def held_charges(session: AsyncSession, node_id: str) -> list[HeldCharge]:
    """The node's charges still in their hold, oldest first."""
    rows = await session.execute(
        select(EarningsHoldRow, LedgerTransactionRow.cause, LedgerTransactionRow.details)
        .join(LedgerTransactionRow, LedgerTransactionRow.id == EarningsHoldRow.charge_id)
        .where(EarningsHoldRow.node_id == node_id)
        .order_by(EarningsHoldRow.earned_at, EarningsHoldRow.charge_id)
    )
    return [
        HeldCharge(
            charge_id=hold.charge_id,
            cause=cause,
            provider_id=hold.provider_id,
            node_id=hold.node_id,
            tenant_id=str(details.get("tenant_id", "")),
            work=str(details.get("work", "")),
            work_id=str(details.get("work_id", "")),
            earned_at=hold.earned_at,
            cost_micro=int(details.get("cost_micro", 0)),
            held_micro=hold.amount_micro,
        )
        for hold, cause, details in rows.all()
    ]


def refund_cause(charge_id: str) -> str:
    return f"refund:{charge_id}"


async def refund_charge(session: AsyncSession, charge_id: str, reason: str, now: datetime) -> int:
    """Give the tenant back all that one CHARGE took, while its hold lasts; returns what
    they got back, 0 when it was refunded before (cause ``refund:<charge id>``).

    The provider's share comes out of their held earnings (what a forfeit took of it, out
    of the platform's forfeits), the commission out of the platform's commission, and
    the charge will never be released. NotFound when `charge_id` is no CHARGE; Conflict
    when its hold is over (released to payable) or it was posted before holds existed:
    only held earnings are taken back. Within the caller's transaction."""
    charge = await session.get(LedgerTransactionRow, charge_id)
    if charge is None or charge.kind != TransactionKind.CHARGE.value:
        raise NotFound(f"no charge {charge_id}")
    details = charge.details or {}
    provider_id = str(details["provider_id"])
    await earnings_hold.lock_held(session, provider_id)
    hold = await session.scalar(
        select(EarningsHoldRow).where(EarningsHoldRow.charge_id == charge_id).with_for_update(),
        execution_options={"populate_existing": True},
    )
    if hold is None:
        if await ledger.posted(session, refund_cause(charge_id)):
            return 0
        raise Conflict(
            f"charge {charge_id} is no longer held (its hold passed, or it was posted "
            "before earnings were held): only held earnings are refunded",
        )
    cost = int(details["cost_micro"])
    commission = int(details["commission_micro"])
    forfeited = int(details["provider_micro"]) - hold.amount_micro
    tenant_id = str(details["tenant_id"])
    await ledger.post(
        session,
        cause=refund_cause(charge_id),
        kind=TransactionKind.REFUND,
        entries=[
            Entry(ledger.provider_held(provider_id), -hold.amount_micro),
            Entry(ledger.FORFEITS, -forfeited),
            Entry(ledger.COMMISSION, -commission),
            Entry(ledger.tenant_balance(tenant_id), cost),
        ],
        now=now,
        details={
            "charge_id": charge_id,
            "tenant_id": tenant_id,
            "provider_id": provider_id,
            "node_id": hold.node_id,
            "work": details.get("work"),
            "work_id": details.get("work_id"),
            "cost_micro": cost,
            "from_held_micro": hold.amount_micro,
            "from_forfeits_micro": forfeited,
            "commission_micro": commission,
            "reason": reason,
        },
    )
    await session.execute(delete(EarningsHoldRow).where(EarningsHoldRow.charge_id == charge_id))
    return cost


async def forfeit_held(
    session: AsyncSession,
    provider_id: str,
    amount_micro: int | None,
    cause: str,
    now: datetime,
    *,
    reason: str = "",
) -> int:
    """Take up to `amount_micro` (None: all) of the provider's held earnings for the
    platform, the oldest charges' shares first; returns what was taken. Once per
    `cause`: a second call, or one when nothing is held, takes nothing (the first is
    recorded even when it took 0). Within the caller's transaction."""
    if amount_micro is not None and amount_micro < 0:
        raise ValueError(f"a forfeit takes 0 or more, not {usdc_text(amount_micro)} USDC")
    await earnings_hold.lock_held(session, provider_id)
    if await ledger.posted(session, cause):
        return 0
    holds = (
        await session.scalars(
            select(EarningsHoldRow)
            .where(EarningsHoldRow.provider_id == provider_id, EarningsHoldRow.amount_micro > 0)
            .order_by(EarningsHoldRow.earned_at, EarningsHoldRow.charge_id)
            .with_for_update(),
            execution_options={"populate_existing": True},
        )
    ).all()
    left = sum(h.amount_micro for h in holds) if amount_micro is None else amount_micro
    taken: list[tuple[str, int]] = []
    for hold in holds:
        if left <= 0:
            break
        take = min(hold.amount_micro, left)
        taken.append((hold.charge_id, take))
        left -= take
    total = sum(take for _, take in taken)
    await ledger.post(
        session,
        cause=cause,
        kind=TransactionKind.FORFEIT,
        entries=ledger.transfer(ledger.provider_held(provider_id), ledger.FORFEITS, total),
        now=now,
        details={"provider_id": provider_id, "charges": len(taken), "reason": reason},
    )
    # Every share taken is taken whole but perhaps the last: few statements for many.
    whole = [
        h.charge_id for h, (_, take) in zip(holds, taken, strict=False) if take == h.amount_micro
    ]
    for start in range(0, len(whole), _CHUNK):
        await session.execute(
            update(EarningsHoldRow)
            .where(EarningsHoldRow.charge_id.in_(whole[start : start + _CHUNK]))
            .values(amount_micro=0)
        )
    if len(whole) < len(taken):
        charge_id, take = taken[-1]
        await session.execute(
            update(EarningsHoldRow)
            .where(EarningsHoldRow.charge_id == charge_id)
            .values(amount_micro=EarningsHoldRow.amount_micro - take)
        )
    return total


_CHUNK = 500  # ids in one IN (…)
