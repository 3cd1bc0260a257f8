"""When a node was there: heartbeats counted per 5-minute bucket, the raw material of
the uptime part of the reliability score."""

import functools
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import upsert_for
from gpu_share.coordinator.core.orm import NodePresenceRow

BUCKET_SEC = 300
KEPT = timedelta(days=60)


def bucket_of(moment: datetime) -> datetime:
    epoch = int(moment.timestamp())
    return datetime.fromtimestamp(epoch - epoch % BUCKET_SEC, UTC)


async def record_beat(session: AsyncSession, node_id: str, now: datetime) -> None:
    dialect = session.get_bind().dialect.name
    await session.execute(
        _count_beat(dialect), {"beat_node": node_id, "beat_bucket": bucket_of(now)}
    )


@functools.cache
def _count_beat(dialect: str) -> Any:
    """The upsert counting one beat of `:beat_node` in bucket `:beat_bucket`; built once per
    dialect (every heartbeat of every node runs it)."""
    return (
        upsert_for(dialect)(NodePresenceRow)
        .values(
            node_id=bindparam("beat_node", type_=NodePresenceRow.node_id.type),
            bucket_start=bindparam("beat_bucket", type_=NodePresenceRow.bucket_start.type),
            beats=1,
        )
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
