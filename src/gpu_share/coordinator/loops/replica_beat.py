"""Says this coordinator process still runs, where its peers reach it, and removes the
processes that died (`services.sessions.channels`)."""

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.sessions import channels


async def run_once(replica: Replica) -> None:
    async with replica.db.write() as session:
        await channels.beat(session, replica.id, replica.relay_url, replica.clock.now())
