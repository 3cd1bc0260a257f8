"""Sends due webhooks (`services/webhooks/sender.py`); safe on several replicas, since each
delivery is claimed by a guarded UPDATE before it is sent."""

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.webhooks import sender
from gpu_share.protocol.webhooks import DeliveryStatus


async def run_once(replica: Replica) -> dict[DeliveryStatus, int]:
    return await sender.deliver_due(replica.db, replica.clock, replica.settings, replica.fetcher)
