"""Forgets rate-limit windows older than a day."""

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services import rate_limits


async def run_once(replica: Replica) -> int:
    async with replica.db.write() as session:
        return await rate_limits.sweep(session, replica.clock.now())
