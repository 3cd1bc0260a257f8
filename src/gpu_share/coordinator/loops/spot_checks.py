"""Spot checks (docs/trust.md): pick ended jobs for a re-run on a trusted node, drop checks
no trusted node took in time, conclude the checks that ended (and act on a confirmed
mismatch), and refund whatever a quarantined node was still charged.

It runs over invokes that ended, never inside the lease or the result: the node that ran
a job sees nothing of its check, and the agents' hot path carries none of this. Every
step is guarded (a decision once per invoke, a conclusion once per check, each posting
once by its cause), so replicas may run it at once.
"""

import logging
from dataclasses import dataclass, field

from gpu_share.coordinator.replica.notify import Channel
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.trust import check_verdicts, consequences, spot_checks
from gpu_share.coordinator.services.trust.check_verdicts import Concluded

log = logging.getLogger(__name__)


@dataclass
class SpotCheckPass:
    picked: int = 0  # check invokes made for jobs that ended
    dropped: int = 0  # checks no trusted node took in time
    concluded: list[Concluded] = field(default_factory=list)
    refunded_micro: int = 0  # charged to quarantined nodes since, and refunded


async def run_once(replica: Replica) -> SpotCheckPass:
    settings, db = replica.settings, replica.db
    now = replica.clock.now()
    done = SpotCheckPass()
    async with db.read() as session:
        undecided = await spot_checks.undecided(session, now, settings)
    if undecided:
        async with db.write() as session:
            done.picked = len(await spot_checks.decide_all(session, undecided, now, settings))
    async with db.write() as session:
        stale = await spot_checks.stale_checks(session, now, settings)
        done.dropped = await spot_checks.drop(session, stale, now)
    async with db.read() as session:
        finished = await check_verdicts.finished(session)
    for check_id in finished:
        concluded = await check_verdicts.conclude(db, replica.store, settings, check_id, now)
        if concluded is not None:
            done.concluded.append(concluded)
    async with db.write() as session:
        done.refunded_micro = await consequences.refund_quarantined(session, now)
    confirming = sum(1 for c in done.concluded if c.caught is None and c.state == "confirming")
    if done.picked or confirming:
        await replica.notifier.publish(Channel.WORK)
    if done.picked or done.dropped or done.concluded or done.refunded_micro:
        log.info(
            "spot checks: %d picked, %d dropped, %d concluded (%d caught), %d refunded",
            done.picked,
            done.dropped,
            len(done.concluded),
            sum(1 for c in done.concluded if c.caught is not None),
            done.refunded_micro,
        )
    return done
