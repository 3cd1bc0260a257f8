"""Earnings held until they can be trusted (SPEC §3.8; docs/payouts.md, "The hold").

A charge pays the provider's share into their held account, not their pending one, and
records its hold (`EarningsHoldRow`): which hold applies and when it was earned. A
result found later to be a cheat's can then still be paid back from it (`clawbacks`).
Once the hold has passed, the share moves to pending, where payouts take it: one
HOLD_RELEASE per charge, cause ``hold_release:<charge id>``, posted in the transaction
that deletes the row, so a charge is released once whatever runs the release how often.

Which hold applies is decided when the charge is posted (`shorter_hold_earned`, the one
rule) and kept on the row; how long each hold lasts is read from the settings when
releasing. Changing the settings moves when held charges become payable, never
whether, nor how often.

Releasing is safe on several replicas. Every writer of a provider's holds (a refund, a
forfeit, a release) first locks that provider's held account row; a release run takes
it with `SKIP LOCKED` and leaves a provider someone else has to its next run, so no
writer waits on another in a cycle. A charge that adds a hold only inserts its row.
"""

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum

from sqlalchemy import ColumnElement, and_, delete, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import driver_of
from gpu_share.coordinator.core.driver_sql import Sql
from gpu_share.coordinator.core.orm import (
    EarningsHoldRow,
    LedgerAccountRow,
    NodeRow,
    ProviderRow,
)
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.money import ledger
from gpu_share.coordinator.services.money.ledger import TransactionKind
from gpu_share.coordinator.services.nodes.placement import node_verified
from gpu_share.protocol.nodes import Tier

RELEASE_BATCH = 500  # charges one release transaction moves at most


class Hold(StrEnum):
    STANDARD = "standard"  # GPUSHARE_EARNINGS_HOLD_DAYS
    VERIFIED_ENTERPRISE = "verified_enterprise"  # GPUSHARE_EARNINGS_HOLD_DAYS_ENTERPRISE


@dataclass(frozen=True)
class HoldPolicy:
    """How long each hold lasts, from the settings in force."""

    standard: timedelta
    verified_enterprise: timedelta

    @classmethod
    def of(cls, settings: Settings) -> "HoldPolicy":
        return cls(
            standard=timedelta(days=settings.earnings_hold_days),
            verified_enterprise=timedelta(days=settings.earnings_hold_days_enterprise),
        )

    def length(self, hold: str) -> timedelta:
        return self.verified_enterprise if hold == Hold.VERIFIED_ENTERPRISE else self.standard

    def payable_at(self, hold: str, earned_at: datetime) -> datetime:
        return earned_at + self.length(hold)

    def due(self, now: datetime) -> ColumnElement[bool]:
        """Rows whose hold has passed at `now` (each hold's range of the (hold, earned_at)
        index)."""
        return or_(
            *(
                and_(EarningsHoldRow.hold == hold.value, EarningsHoldRow.earned_at <= now - length)
                for hold, length in (
                    (Hold.STANDARD, self.standard),
                    (Hold.VERIFIED_ENTERPRISE, self.verified_enterprise),
                )
            )
        )


def shorter_hold_earned(provider_tier: str, node: NodeRow) -> bool:
    """Whether a charge earned on `node` gets the shorter Enterprise hold: the one rule.

    The provider is Enterprise, the node is not quarantined, and its hardware is proven
    (`placement.node_verified`: every GPU as the model it claims now, a CPU node's cores):
    the tier's advantages count only for proven hardware (docs/trust.md)."""
    if provider_tier != Tier.ENTERPRISE.value or node.quarantined_at is not None:
        return False
    return node_verified(node)


async def hold_of(session: AsyncSession, node: NodeRow) -> Hold:
    """The hold a charge earned on `node` now gets. The provider's tier is read only for
    a node with some verification, so unverified work costs the charge no query."""
    if not node.verification:
        return Hold.STANDARD
    tier = await session.scalar(select(ProviderRow.tier).where(ProviderRow.id == node.provider_id))
    return Hold.VERIFIED_ENTERPRISE if shorter_hold_earned(tier or "", node) else Hold.STANDARD


async def hold_charge(
    session: AsyncSession, charge_cause: str, node: NodeRow, amount_micro: int
) -> None:
    """Record the hold of the CHARGE just posted for `charge_cause`, whose `amount_micro`
    went into the provider's held account; in the charge's transaction. The hold counts
    from the charge's posting time."""
    if amount_micro <= 0:
        return
    hold = await hold_of(session, node)
    tx = await driver_of(session)  # every paid job's charge: on the driver (`driver_sql`)
    await tx.execute(
        _HOLD_CHARGE,
        provider=node.provider_id,
        node=node.id,
        hold=hold.value,
        amount=amount_micro,
        cause=charge_cause,
    )


_HOLD_CHARGE = Sql(
    "INSERT INTO earnings_holds (charge_id, provider_id, node_id, hold, earned_at, amount_micro)"
    " SELECT id, CAST(:provider AS TEXT), CAST(:node AS TEXT), CAST(:hold AS TEXT), created_at,"
    " CAST(:amount AS BIGINT)"
    " FROM ledger_transactions WHERE cause = :cause"
)


def release_cause(charge_id: str) -> str:
    return f"hold_release:{charge_id}"


async def lock_held(session: AsyncSession, provider_id: str, *, skip_locked: bool = False) -> bool:
    """Lock the provider's held account row, taken first by every writer of their holds
    (see above). False when it has none, or, with `skip_locked`, when another has it."""
    locked = await session.scalar(
        select(LedgerAccountRow.id)
        .where(LedgerAccountRow.id == ledger.provider_held(provider_id).id)
        .with_for_update(skip_locked=skip_locked)
    )
    return locked is not None


async def release_due(
    session: AsyncSession, now: datetime, policy: HoldPolicy, batch: int = RELEASE_BATCH
) -> int:
    """Release up to `batch` charges whose hold has passed; returns how many. Providers
    are taken in id order, so that their pending accounts lock in the order payouts
    take them. A quarantined node's earnings are never released: they are refunded to
    its tenants (`trust/consequences`, docs/trust.md)."""
    barred = EarningsHoldRow.node_id.not_in(
        select(NodeRow.id).where(NodeRow.quarantined_at.is_not(None))
    )
    providers = (
        await session.scalars(
            select(EarningsHoldRow.provider_id)
            .where(policy.due(now), barred)
            .distinct()
            .order_by(EarningsHoldRow.provider_id)
            .limit(batch)
        )
    ).all()
    released = 0
    for provider_id in providers:
        if released >= batch:
            break
        if not await lock_held(session, provider_id, skip_locked=True):
            continue  # being refunded, forfeited, released or charged: the next run
        rows = (
            await session.scalars(
                select(EarningsHoldRow)
                .where(EarningsHoldRow.provider_id == provider_id, policy.due(now), barred)
                .order_by(EarningsHoldRow.earned_at, EarningsHoldRow.charge_id)
                .limit(batch - released)
                .with_for_update()
            )
        ).all()
        for row in rows:
            await _release(session, row, now)
        released += len(rows)
    return released


async def _release(session: AsyncSession, row: EarningsHoldRow, now: datetime) -> None:
    """Held → pending for one charge, and its row gone. A share a forfeit took whole
    has nothing to move: its row just goes."""
    if row.amount_micro > 0:
        await ledger.post(
            session,
            cause=release_cause(row.charge_id),
            kind=TransactionKind.HOLD_RELEASE,
            entries=ledger.transfer(
                ledger.provider_held(row.provider_id),
                ledger.provider_pending(row.provider_id),
                row.amount_micro,
            ),
            now=now,
            details={
                "provider_id": row.provider_id,
                "node_id": row.node_id,
                "charge_id": row.charge_id,
                "hold": row.hold,
                "earned_at": row.earned_at.isoformat(),
            },
        )
    await session.execute(delete(EarningsHoldRow).where(EarningsHoldRow.charge_id == row.charge_id))


# ---- what the provider sees --------------------------------------------------------


@dataclass(frozen=True)
class HeldPart:
    day: date  # UTC: the day it becomes payable (today, if its hold passed already)
    amount_micro: int


async def held_by_day(
    session: AsyncSession, provider_id: str, now: datetime, policy: HoldPolicy
) -> list[HeldPart]:
    """The provider's held earnings by the day they become payable, soonest first."""
    rows = await session.execute(
        select(EarningsHoldRow.hold, EarningsHoldRow.earned_at, EarningsHoldRow.amount_micro).where(
            EarningsHoldRow.provider_id == provider_id, EarningsHoldRow.amount_micro > 0
        )
    )
    today = now.astimezone(UTC).date()
    by_day: dict[date, int] = defaultdict(int)
    for hold, earned_at, amount in rows.all():
        day = policy.payable_at(hold, earned_at).astimezone(UTC).date()
        by_day[max(day, today)] += int(amount)
    return [HeldPart(day, amount) for day, amount in sorted(by_day.items())]
