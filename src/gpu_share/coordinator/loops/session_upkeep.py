"""Closes idle sessions, flushes their metering, fails sessions no replica holds."""

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.sessions.sessions import Sessions


async def run_once(replica: Replica) -> None:
    await Sessions.of(replica).maintain()
