"""Requeues invokes whose node stopped heartbeating; ends those that overran their timeout."""

import logging

from gpu_share.coordinator.replica.notify import Channel
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.work import leases

log = logging.getLogger(__name__)


async def run_once(replica: Replica) -> leases.ExpiryReport:
    async with replica.db.write() as session:
        report = await leases.expire_leases(session, replica.clock.now(), replica.settings)
    if report.requeued:
        await replica.notifier.publish(Channel.WORK)
    if report.failed or report.timed_out or report.canceled:
        await replica.notifier.publish(Channel.FINISHED)
    if report.requeued or report.failed or report.timed_out or report.canceled:
        log.info("lease expiry: %s", report)
    return report
