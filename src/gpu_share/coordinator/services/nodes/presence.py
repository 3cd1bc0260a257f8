"""When a node was there: heartbeats counted per 5-minute bucket, the raw material of
the uptime part of the reliability score."""

from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import upsert
from gpu_share.coordinator.core.orm import NodePresenceRow

BUCKET_SEC = 300
KEPT = timedelta(days=60)


def bucket_of(moment: datetime) -> datetime:
    epoch = int(moment.timestamp())
    return datetime.fromtimestamp(epoch - epoch % BUCKET_SEC, UTC)


async def record_beat(session: AsyncSession, node_id: str, now: datetime) -> None:
    await session.execute(
        upsert(session)(NodePresenceRow)
        .values(node_id=node_id, bucket_start=bucket_of(now), beats=1)
        .on_conflict_do_update(
            index_elements=[NodePresenceRow.node_id, NodePresenceRow.bucket_start],
            set_={"beats": NodePresenceRow.beats + 1},
        )
    )


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
