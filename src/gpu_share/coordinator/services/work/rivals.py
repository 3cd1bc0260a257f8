"""Better ranked nodes waiting for work (SPEC §4.1, docs/placement.md): a job one of them
could take is left to it for a moment, so work goes to the best node that wants it.

A node waiting in a long-poll says until when and with how much room
(`NodeRow.polling_until`, `poll_free_*`); the rank is `nodes.ranking`'s. After
`RANKING_GRACE_SEC` any eligible node may take the job, so a better node that went away
never holds work up.
"""

from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core import driver_models
from gpu_share.coordinator.core.db import driver_of
from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.nodes import placement, ranking
from gpu_share.coordinator.services.nodes.placement import Requirements, serves

RANKING_GRACE_SEC = 2.0  # after this, any eligible node may take a job a better one left
_GRACE = timedelta(seconds=RANKING_GRACE_SEC)


RANKED = (*placement.READS, "polling_until", "poll_free_slots", "poll_free_gpus")
"""What ranking a rival and judging whether it could take a job read of its row, and its
room: not its telemetry, GPU topology, spot checks and the rest, which a read of every
waiting node would decode for nothing."""

_WAITING = driver_models.some_columns(
    NodeRow,
    RANKED,
    "WHERE nodes.polling_until > :poll_now AND nodes.id != :poll_node"
    " AND nodes.poll_free_slots > 0",
)
"""Nodes other than `:poll_node` waiting at `:poll_now` with room."""


async def better_pollers(session: AsyncSession, node: NodeRow, now: datetime) -> list[NodeRow]:
    """Other nodes waiting in a long-poll right now with room, ranked above this one. On
    the driver (`driver_models`): a claim of a young job reads every node waiting."""
    tx = await driver_of(session)
    rows = await tx.fetch(_WAITING, poll_now=now, poll_node=node.id)
    mine = ranking.rank(node)
    waiting = (driver_models.partial(NodeRow, row, RANKED) for row in rows)
    return [other for other in waiting if ranking.rank(other) > mine]


def in_grace(created_at: datetime, now: datetime) -> bool:
    """Whether a job queued at `created_at` is young enough to be left to a better node:
    a claim whose jobs are all older need not read the rivals (`better_pollers` loads
    every node waiting in a long-poll, a thousand in an idle fleet)."""
    return created_at > now - _GRACE


def left_to_rival(
    rivals: list[NodeRow], req: Requirements, created_at: datetime, now: datetime
) -> bool:
    """The job is younger than the grace and one of `rivals` could take it."""
    return in_grace(created_at, now) and any(_can_take(rival, req, now) for rival in rivals)


def _can_take(rival: NodeRow, req: Requirements, now: datetime) -> bool:
    return serves(rival, req, now) and (
        not req.runtime.needs_gpu or rival.poll_free_gpus >= req.gpus
    )
