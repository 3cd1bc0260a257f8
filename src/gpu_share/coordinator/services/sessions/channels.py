"""Which coordinator process holds each node's session channel, and how to reach it.

Every process is a row in `replicas`, beaten every `BEAT_SEC` while it runs, with the
address its peers relay session traffic to (none when it takes no relayed traffic). A
node's WebSocket is recorded in `node_channels` against the process it reached. A
process unseen for `DEAD_AFTER_SEC` is dead: its channels count for nothing (its
agents reconnect to a live one, which records them anew) and the next beat of any
process removes it.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import upsert
from gpu_share.coordinator.core.orm import NodeChannelRow, ReplicaRow

BEAT_SEC = 5.0
DEAD_AFTER_SEC = 20.0


@dataclass(frozen=True)
class Holder:
    """The process holding a node's channel: its id, and where peers reach it."""

    replica_id: str
    relay_url: str | None


async def beat(
    session: AsyncSession, replica_id: str, relay_url: str | None, now: datetime
) -> None:
    """Say this process runs (first at its start); then remove the processes that died."""
    insert = upsert(session)(ReplicaRow).values(
        id=replica_id, relay_url=relay_url, started_at=now, seen_at=now
    )
    await session.execute(
        insert.on_conflict_do_update(
            index_elements=[ReplicaRow.id],
            set_={"seen_at": now, "relay_url": relay_url},
        )
    )
    dead = (
        await session.scalars(select(ReplicaRow.id).where(ReplicaRow.seen_at < now - _dead_after()))
    ).all()
    if dead:
        await session.execute(delete(NodeChannelRow).where(NodeChannelRow.replica_id.in_(dead)))
        await session.execute(delete(ReplicaRow).where(ReplicaRow.id.in_(dead)))


async def leave(session: AsyncSession, replica_id: str) -> None:
    """This process stops: its channels and its row go."""
    await session.execute(delete(NodeChannelRow).where(NodeChannelRow.replica_id == replica_id))
    await session.execute(delete(ReplicaRow).where(ReplicaRow.id == replica_id))


async def attach(session: AsyncSession, node_id: str, replica_id: str, now: datetime) -> None:
    insert = upsert(session)(NodeChannelRow).values(
        node_id=node_id, replica_id=replica_id, connected_at=now
    )
    await session.execute(
        insert.on_conflict_do_update(
            index_elements=[NodeChannelRow.node_id],
            set_={"replica_id": replica_id, "connected_at": now},
        )
    )


async def detach(session: AsyncSession, node_id: str, replica_id: str) -> None:
    """Forget the node's channel unless another process holds it since."""
    await session.execute(
        delete(NodeChannelRow).where(
            NodeChannelRow.node_id == node_id, NodeChannelRow.replica_id == replica_id
        )
    )


async def holders(
    session: AsyncSession, now: datetime, node_ids: list[str] | None = None
) -> dict[str, Holder]:
    """The nodes whose channel a live process holds (of `node_ids`, or all), and which."""
    query = (
        select(NodeChannelRow.node_id, ReplicaRow.id, ReplicaRow.relay_url)
        .join(ReplicaRow, ReplicaRow.id == NodeChannelRow.replica_id)
        .where(ReplicaRow.seen_at >= now - _dead_after())
    )
    if node_ids is not None:
        query = query.where(NodeChannelRow.node_id.in_(sorted(set(node_ids))))
    rows = (await session.execute(query)).all()
    return {node_id: Holder(replica_id, relay_url) for node_id, replica_id, relay_url in rows}


def _dead_after() -> timedelta:
    return timedelta(seconds=DEAD_AFTER_SEC)
