"""Sends due webhooks (`services/webhooks/sender.py`); safe on several replicas, since each
delivery is claimed by a guarded UPDATE before it is sent.

A run sends batch after batch while they come full, up to `MAX_ROUNDS`, so a burst of
events (many invokes ending at once) drains in one run rather than one batch a period.
"""

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.webhooks import deliveries, sender
from gpu_share.protocol.webhooks import DeliveryStatus

MAX_ROUNDS = 20


async def run_once(replica: Replica) -> dict[DeliveryStatus, int]:
    totals: dict[DeliveryStatus, int] = {}
    for _ in range(MAX_ROUNDS):
        counts = await sender.deliver_due(
            replica.db, replica.clock, replica.settings, replica.fetcher
        )
        for status, count in counts.items():
            totals[status] = totals.get(status, 0) + count
        if sum(counts.values()) < deliveries.BATCH:
            break
    return totals
