"""Delivers outbox mail when SMTP is configured (with none, mail waits for an admin's eyes)."""

import logging

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.mail import delivery

log = logging.getLogger(__name__)


async def run_once(replica: Replica) -> tuple[int, int]:
    if not replica.settings.smtp_host:
        return 0, 0
    sent, failed = await delivery.deliver_due(replica.db, replica.clock, replica.settings)
    if sent or failed:
        log.info("mail: %d sent, %d not sent (retried later or given up)", sent, failed)
    return sent, failed
