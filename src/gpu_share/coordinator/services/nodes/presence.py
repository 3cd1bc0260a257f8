"""When a node was there: heartbeats counted per 5-minute bucket, the raw material of
the uptime part of the reliability score."""

from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.driver_sql import DriverTx, Sql
from gpu_share.coordinator.core.orm import NodePresenceRow

BUCKET_SEC = 300
KEPT = timedelta(days=60)


def bucket_of(moment: datetime) -> datetime:
    epoch = int(moment.timestamp())
    return datetime.fromtimestamp(epoch - epoch % BUCKET_SEC, UTC)


_COUNT_BEAT = Sql(
    "INSERT INTO node_presence (node_id, bucket_start, beats) VALUES (:node, :bucket, 1)"
    " ON CONFLICT (node_id, bucket_start) DO UPDATE SET beats = node_presence.beats + 1"
)


async def record_beat(tx: DriverTx, node_id: str, now: datetime) -> None:
    """Count one beat of the node in its bucket (every heartbeat of every node: on the
    driver, `driver_sql`)."""
    await tx.execute(_COUNT_BEAT, node=node_id, bucket=bucket_of(now))


async def present_buckets(
    session: AsyncSession, node_id: str, start: datetime, end: datetime
) -> set[datetime]:
    """The buckets overlapping [start, end) in which the node beat at least once."""
    found = await session.scalars(
        select(NodePresenceRow.bucket_start).where(
            NodePresenceRow.node_id == node_id,
            NodePresenceRow.beats > 0,
            NodePresenceRow.bucket_start >= bucket_of(start),
            NodePresenceRow.bucket_start < end,
        )
    )
    return set(found.all())


async def prune(session: AsyncSession, now: datetime) -> None:
    await session.execute(delete(NodePresenceRow).where(NodePresenceRow.bucket_start < now - KEPT))
