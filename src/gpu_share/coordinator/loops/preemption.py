"""Asks running spot work to stop when on-demand work needs its slot (services/preemption)."""

import logging

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services import preemption

log = logging.getLogger(__name__)


async def run_once(replica: Replica) -> list[str]:
    async with replica.db.write() as session:
        asked = await preemption.preempt_for_waiting_work(
            session, replica.clock.now(), replica.settings
        )
    if asked:
        log.info("preemption: asked %d spot invoke(s) to stop: %s", len(asked), ", ".join(asked))
    return asked
