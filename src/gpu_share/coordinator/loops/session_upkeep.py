"""Closes idle sessions, flushes their metering, fails sessions no replica holds."""

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.sessions import upkeep


async def run_once(replica: Replica) -> None:
    await upkeep.maintain(replica.db, replica.hub, replica.clock, replica.settings)
