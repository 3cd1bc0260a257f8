"""Deletes the bytes of expired artifacts (SPEC §1.3) and abandoned uploads."""

import logging

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.artifacts import artifacts

log = logging.getLogger(__name__)


async def run_once(replica: Replica) -> artifacts.SweepReport:
    report = await artifacts.sweep(replica.db, replica.store, replica.clock.now())
    if report.expired or report.blobs_deleted or report.temporary_deleted:
        log.info("artifact sweep: %s", report)
    return report
