"""Requeues invokes whose node stopped heartbeating; ends those that overran their timeout."""

import logging

from gpu_share.coordinator.runtime import Runtime
from gpu_share.coordinator.services import leases

log = logging.getLogger(__name__)


async def run_once(runtime: Runtime) -> leases.ExpiryReport:
    async with runtime.db.write() as session:
        report = await leases.expire_leases(session, runtime.clock.now(), runtime.settings)
    if report.requeued:
        await runtime.notifier.publish()
    if report.requeued or report.failed or report.timed_out or report.canceled:
        log.info("lease expiry: %s", report)
    return report
