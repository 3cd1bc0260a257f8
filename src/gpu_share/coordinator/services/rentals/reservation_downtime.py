"""What a dedicated reservation is charged once its node's downtime is taken off
(docs/billing.md#dedicated-reservations).

The node counts as there by the 5-minute presence buckets the uptime score reads
(`presence`). Over the held stretch [starts_at, min(until, ends_at)) a bucket is
*present* when the node beat in it or was last seen in it (registration, lease polls
and inventory updates also see a node). The bucket still open at `now` cannot be judged
by its beats yet: it is present unless the node has been silent for a whole bucket by
then. Every other bucket is *absent*, and its overlap with the stretch is downtime.

The charge keeps the begun-hours rule and takes the downtime off, pro rata to the
microsecond, rounded down (in the tenant's favour):

    cost = ⌊rate × (⌈held hours⌉ × 1 h − downtime) / 1 h⌋, at most the period's price

so a node there throughout costs exactly what it did before, and one that never came
costs nothing. Nothing here posts or writes: `reservation_billing` does.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import NodeRow, ReservationRow
from gpu_share.coordinator.services.nodes import presence
from gpu_share.protocol.reservations import ReservationStatus

HOUR = timedelta(hours=1)
BUCKET = timedelta(seconds=presence.BUCKET_SEC)
_TICK = timedelta(microseconds=1)
NONE = timedelta(0)


@dataclass(frozen=True)
class Charge:
    cost_micro: int
    held: timedelta  # [starts_at, min(until, ends_at))
    downtime: timedelta  # the part of `held` the node was absent: not charged

    @property
    def present(self) -> timedelta:
        return self.held - self.downtime


def period_price(row: ReservationRow) -> int:
    return row.rate_micro_per_hour * ((row.ends_at - row.starts_at) // HOUR)


def hours_begun(row: ReservationRow, until: datetime) -> int:
    """Hours of the period begun by `until` (0 before it starts, at most the period)."""
    if until <= row.starts_at:
        return 0
    stop = min(until, row.ends_at)
    return -(-(stop - row.starts_at) // HOUR)


def price_of_hours_begun(row: ReservationRow, until: datetime) -> int:
    """What stopping at `until` costs with the node there throughout."""
    return min(period_price(row), row.rate_micro_per_hour * hours_begun(row, until))


async def downtime(
    session: AsyncSession, node: NodeRow, start: datetime, stop: datetime, now: datetime
) -> timedelta:
    """How much of [start, stop) fell in buckets the node was absent from."""
    if stop <= start:
        return NONE
    present = await presence.present_buckets(session, node.id, start, stop)
    if node.last_seen_at is not None:
        present.add(presence.bucket_of(node.last_seen_at))
        if node.last_seen_at > now - BUCKET:  # not yet silent for a whole bucket
            present.add(presence.bucket_of(now))
    absent = NONE
    bucket = presence.bucket_of(start)
    while bucket < stop:
        if bucket not in present:
            absent += min(bucket + BUCKET, stop) - max(bucket, start)
        bucket += BUCKET
    return absent


async def charge_for(
    session: AsyncSession, row: ReservationRow, until: datetime, now: datetime
) -> Charge:
    """What the reservation costs when it stops at `until` (its end, or a cancel at `now`)."""
    stop = min(until, row.ends_at)
    if stop <= row.starts_at:
        return Charge(0, NONE, NONE)
    node = await session.get(NodeRow, row.node_id)
    assert node is not None
    absent = await downtime(session, node, row.starts_at, stop, now)
    billed = hours_begun(row, stop) * HOUR - absent
    cost = row.rate_micro_per_hour * (billed // _TICK) // (HOUR // _TICK)
    return Charge(min(cost, price_of_hours_begun(row, stop)), stop - row.starts_at, absent)


def credited(row: ReservationRow) -> int | None:
    """Micro-USDC taken off a settled reservation's charge for its node's downtime (and
    the rounding); None until it ended or was canceled. Read from the row alone: what the
    begun hours would have cost less what `cost_micro` says was charged."""
    if row.status == ReservationStatus.ENDED.value:
        until = row.ends_at
    elif row.status == ReservationStatus.CANCELED.value and row.canceled_at is not None:
        until = row.canceled_at
    else:
        return None
    return max(0, price_of_hours_begun(row, until) - row.cost_micro)
