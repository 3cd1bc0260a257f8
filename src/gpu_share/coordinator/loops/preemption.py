"""Asks running spot work to stop when on-demand work needs its slot or a reservation starting
holds its GPUs (services/preemption)."""

import logging

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.work import preemption

log = logging.getLogger(__name__)


async def run_once(replica: Replica) -> list[str]:
    async with replica.db.write() as session:
        now = replica.clock.now()
        asked = await preemption.on_reserved_gpus(session, now, replica.settings)
        asked += await preemption.preempt_for_waiting_work(session, now, replica.settings)
    if asked:
        log.info("preemption: asked %d spot invoke(s) to stop: %s", len(asked), ", ".join(asked))
    return asked
