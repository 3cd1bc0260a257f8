"""USDC payouts the platform sends on Solana: their states and each guarded move.

    in-transit USDC payout ──enroll──▶ sending ─────────────▶ finalized (payout paid)
                               └──▶ awaiting_approval ─┘  └──▶ failed (payout failed)

A chain row is made once per payout (its id is the key) for each in-transit payout to a
`solana_usdc` method that no admin has taken by hand (its batch not exported). One above
the operator's limit per payout, or past the day's limit, waits for an admin's approval.

Every move is one guarded UPDATE that must touch one row. A replica sends a payout only
while it holds its claim (`claimed_until`); the signed transaction, its signature and
the last block height its blockhash is valid for are committed before it is sent
(`record`), so whoever sends next resends that same transaction until it can no longer
land, and only then signs a new one. A payout is paid only with a finalized signature
(`settle`, through the payouts module's transitions and so the ledger).
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import one_at_a_time, upsert
from gpu_share.coordinator.core.errors import Conflict, NotFound
from gpu_share.coordinator.core.orm import ChainPayoutRow, PayoutBatchRow, PayoutRow, ProviderRow
from gpu_share.coordinator.services.money import payouts
from gpu_share.protocol.money import usdc_text
from gpu_share.protocol.payouts import ChainPayout, ChainState, Payout, PayoutStatus


@dataclass(frozen=True)
class Limits:
    per_payout_micro: int
    per_day_micro: int


@dataclass(frozen=True)
class Recorded:
    """What a claimed payout holds: its transaction, if one was signed."""

    payout_id: str
    destination: str
    amount_micro: int
    transaction: str | None
    signature: str | None
    last_valid_block_height: int | None
    rejected: str | None


def _day_start(now: datetime) -> datetime:
    day = now.astimezone(UTC)
    return day.replace(hour=0, minute=0, second=0, microsecond=0)


async def enroll(session: AsyncSession, now: datetime, limits: Limits) -> list[str]:
    """Make the chain row of each in-transit USDC payout that has none: the ids made.
    Enrollments run one at a time across replicas, so what the day's limit counts is what
    every replica has enrolled."""
    await one_at_a_time(session, "chain-payouts:enroll")
    found = await session.execute(
        select(PayoutRow)
        .outerjoin(ChainPayoutRow, ChainPayoutRow.payout_id == PayoutRow.id)
        .outerjoin(PayoutBatchRow, PayoutBatchRow.id == PayoutRow.batch_id)
        .where(
            PayoutRow.status == PayoutStatus.IN_TRANSIT.value,
            ChainPayoutRow.payout_id.is_(None),
            PayoutBatchRow.exported_at.is_(None),  # exported: an admin pays it by hand
        )
        .order_by(PayoutRow.created_at, PayoutRow.id)
    )
    made = []
    for row in found.scalars().all():
        if row.method.get("kind") != "solana_usdc" or await _taken_by_hand(session, row):
            continue
        sent_today = await session.scalar(
            select(func.coalesce(func.sum(ChainPayoutRow.amount_micro), 0)).where(
                ChainPayoutRow.created_at >= _day_start(now),
                ChainPayoutRow.state != ChainState.AWAITING_APPROVAL.value,
            )
        )
        over = row.amount_micro > limits.per_payout_micro or (
            int(sent_today or 0) + row.amount_micro > limits.per_day_micro
        )
        state = ChainState.AWAITING_APPROVAL if over else ChainState.SENDING
        inserted = await session.execute(
            upsert(session)(ChainPayoutRow)
            .values(
                payout_id=row.id,
                state=state.value,
                destination=str(row.method["address"]),
                amount_micro=row.amount_micro,
                created_at=now,
                builds=0,
            )
            .on_conflict_do_nothing(index_elements=["payout_id"])
            .returning(ChainPayoutRow.payout_id)
        )
        if inserted.scalar_one_or_none() is not None:
            made.append(row.id)
    return made


async def _taken_by_hand(session: AsyncSession, row: PayoutRow) -> bool:
    """Whether an admin exported the payout's batch to pay it by hand, read again under
    the batch row's lock: an export (`payout_batches.export`) marks the batch under the
    same lock, so either it sees the chain row made here and leaves the payout out of its
    file, or this sees the export and leaves the payout to the admin."""
    if row.batch_id is None:
        return False
    exported = await session.scalar(
        select(PayoutBatchRow.exported_at)
        .where(PayoutBatchRow.id == row.batch_id)
        .with_for_update()
    )
    return exported is not None


async def approve(session: AsyncSession, payout_id: str, now: datetime) -> None:
    """An admin lets a payout above the limits be sent."""
    moved = await session.execute(
        update(ChainPayoutRow)
        .where(
            ChainPayoutRow.payout_id == payout_id,
            ChainPayoutRow.state == ChainState.AWAITING_APPROVAL.value,
        )
        .values(state=ChainState.SENDING.value, approved_at=now)
    )
    if moved.rowcount == 1:  # type: ignore[attr-defined]
        return
    row = await session.get(ChainPayoutRow, payout_id)
    if row is None:
        if await session.get(PayoutRow, payout_id) is None:
            raise NotFound(f"no payout {payout_id}")
        raise Conflict(f"payout {payout_id} is not sent on Solana, so there is nothing to approve")
    raise Conflict(
        f"payout {payout_id} is {row.state.replace('_', ' ')}, so it cannot be approved: "
        "only a payout awaiting approval can",
        details={"state": row.state},
    )


async def sendable(session: AsyncSession, now: datetime, limit: int = 50) -> list[str]:
    """Payouts being sent that no replica holds now, oldest first."""
    rows = await session.scalars(
        select(ChainPayoutRow.payout_id)
        .where(
            ChainPayoutRow.state == ChainState.SENDING.value,
            or_(ChainPayoutRow.claimed_until.is_(None), ChainPayoutRow.claimed_until < now),
        )
        .order_by(ChainPayoutRow.created_at, ChainPayoutRow.payout_id)
        .limit(limit)
    )
    return list(rows.all())


async def claim(
    session: AsyncSession, payout_id: str, now: datetime, hold_sec: float
) -> Recorded | None:
    """Hold the payout for sending until `now + hold_sec`: None when another holds it,
    or it is no longer being sent."""
    moved = await session.execute(
        update(ChainPayoutRow)
        .where(
            ChainPayoutRow.payout_id == payout_id,
            ChainPayoutRow.state == ChainState.SENDING.value,
            or_(ChainPayoutRow.claimed_until.is_(None), ChainPayoutRow.claimed_until < now),
        )
        .values(claimed_until=now + timedelta(seconds=hold_sec))
    )
    if moved.rowcount != 1:  # type: ignore[attr-defined]
        return None
    row = await session.get(ChainPayoutRow, payout_id, populate_existing=True)
    assert row is not None
    payout = await session.get(PayoutRow, payout_id)
    if payout is None or payout.status != PayoutStatus.IN_TRANSIT.value:
        # Settled by hand before anything was sent (see `payouts._settle`): nothing is.
        row.state = ChainState.FAILED.value
        row.claimed_until = None
        return None
    return Recorded(
        payout_id=row.payout_id,
        destination=row.destination,
        amount_micro=row.amount_micro,
        transaction=row.transaction,
        signature=row.signature,
        last_valid_block_height=row.last_valid_block_height,
        rejected=row.rejected,
    )


def _held(payout_id: str, now: datetime) -> object:
    return and_(
        ChainPayoutRow.payout_id == payout_id,
        ChainPayoutRow.state == ChainState.SENDING.value,
        ChainPayoutRow.claimed_until >= now,
    )


async def record(
    session: AsyncSession,
    payout_id: str,
    *,
    replaces: str | None,
    transaction: str,
    signature: str,
    last_valid_block_height: int,
    now: datetime,
) -> bool:
    """Keep a newly signed transaction (in place of `replaces`, the signature before):
    False, and nothing kept, when the claim was lost, another replaced it first, or the
    payout was settled by hand. Holds the payout's row (as marking it by hand does), so
    a transaction is never kept for a payout marked paid or failed meanwhile."""
    status = await session.scalar(
        select(PayoutRow.status).where(PayoutRow.id == payout_id).with_for_update()
    )
    if status != PayoutStatus.IN_TRANSIT.value:
        return False
    moved = await session.execute(
        update(ChainPayoutRow)
        .where(
            _held(payout_id, now),  # type: ignore[arg-type]
            ChainPayoutRow.signature.is_(None)
            if replaces is None
            else ChainPayoutRow.signature == replaces,
        )
        .values(
            transaction=transaction,
            signature=signature,
            last_valid_block_height=last_valid_block_height,
            builds=ChainPayoutRow.builds + 1,
            rejected=None,
        )
    )
    return bool(moved.rowcount == 1)  # type: ignore[attr-defined]


async def note_rejected(session: AsyncSession, payout_id: str, signature: str, why: str) -> None:
    await session.execute(
        update(ChainPayoutRow)
        .where(ChainPayoutRow.payout_id == payout_id, ChainPayoutRow.signature == signature)
        .values(rejected=why[:1000])
    )


async def release(session: AsyncSession, payout_id: str) -> None:
    await session.execute(
        update(ChainPayoutRow)
        .where(ChainPayoutRow.payout_id == payout_id)
        .values(claimed_until=None)
    )


async def settle(
    session: AsyncSession,
    payout_id: str,
    signature: str,
    *,
    failure: str | None,
    now: datetime,
    base_url: str,
) -> bool:
    """The recorded `signature` is finalized (failure None) or failed on chain, or the
    transaction can no longer land (failure says why): the payout is paid with the
    signature as its reference, or failed (its amount back to pending). False when the
    signature is no longer the one recorded."""
    moved = await session.execute(
        update(ChainPayoutRow)
        .where(
            ChainPayoutRow.payout_id == payout_id,
            ChainPayoutRow.state == ChainState.SENDING.value,
            ChainPayoutRow.signature == signature,
        )
        .values(
            state=(ChainState.FINALIZED if failure is None else ChainState.FAILED).value,
            claimed_until=None,
            settled_at=now,
        )
    )
    if moved.rowcount != 1:  # type: ignore[attr-defined]
        return False
    if failure is None:
        await payouts.mark_paid(session, payout_id, signature, now, base_url)
    else:
        await payouts.mark_failed(session, payout_id, failure, now, base_url)
    return True


# ---- reading ------------------------------------------------------------------------


async def with_chain(session: AsyncSession, items: list[Payout], explorer_url: str) -> list[Payout]:
    """The payouts with what the chain says of those sent on Solana: their state, their
    signature (the latest sent, before it is final) and its explorer link."""
    ids = [item.id for item in items]
    if not ids:
        return items
    rows = await session.scalars(select(ChainPayoutRow).where(ChainPayoutRow.payout_id.in_(ids)))
    chain = {row.payout_id: row for row in rows.all()}
    shown = []
    for item in items:
        row = chain.get(item.id)
        if row is None:
            shown.append(item)
            continue
        shown.append(
            item.model_copy(
                update={
                    "chain_state": ChainState(row.state),
                    "signature": row.signature,
                    "explorer_url": _link(explorer_url, row.signature),
                }
            )
        )
    return shown


def _link(explorer_url: str, signature: str | None) -> str | None:
    return explorer_url.replace("{signature}", signature) if signature else None


async def open_payouts(session: AsyncSession, explorer_url: str) -> list[ChainPayout]:
    """Those awaiting approval or being sent, oldest first: what the admin follows."""
    rows = await session.execute(
        select(ChainPayoutRow, PayoutRow.provider_id, ProviderRow.name)
        .join(PayoutRow, PayoutRow.id == ChainPayoutRow.payout_id)
        .join(ProviderRow, ProviderRow.id == PayoutRow.provider_id)
        .where(
            ChainPayoutRow.state.in_(
                [ChainState.AWAITING_APPROVAL.value, ChainState.SENDING.value]
            ),
            PayoutRow.status == PayoutStatus.IN_TRANSIT.value,  # not settled by hand
        )
        .order_by(ChainPayoutRow.created_at, ChainPayoutRow.payout_id)
    )
    return [
        ChainPayout(
            payout_id=row.payout_id,
            provider_id=provider_id,
            provider_name=name,
            amount=usdc_text(row.amount_micro),
            destination=row.destination,
            state=ChainState(row.state),
            created_at=row.created_at,
            signature=row.signature,
            explorer_url=_link(explorer_url, row.signature),
            rejected=row.rejected,
        )
        for row, provider_id, name in rows.all()
    ]
