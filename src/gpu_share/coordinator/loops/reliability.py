"""Recomputes the published reliability scores of nodes and providers.

The evidence is read in a read transaction and the scores written in a short write
transaction, so heartbeats are not kept waiting on SQLite while the scores are
computed. Replicas may run it at the same time: each writes the same values.
"""

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.providers import reliability


async def run_once(replica: Replica) -> None:
    now = replica.clock.now()
    async with replica.db.read() as session:
        published = await reliability.compute_all(session, now)
    async with replica.db.write() as session:
        await reliability.publish(session, published)
