"""Forgets what is only kept for a while: old rate-limit windows, old telemetry samples."""

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.accounts import rate_limits
from gpu_share.coordinator.services.nodes import nodes, presence


async def run_once(replica: Replica) -> None:
    now = replica.clock.now()
    async with replica.db.write() as session:
        await rate_limits.sweep(session, now)
        await nodes.prune_telemetry(session, now)
        await presence.prune(session, now)
