"""A node's lease long-poll (SPEC §4.1, `POST /v1/agent/lease`): a claim at once, then
again whenever work may have come for it, until the poll's wait is over.

The first claim always runs: it marks the node as waiting (`claims`' `polling_until`),
which is how rivals and placement see it. After that a claim runs when the WORK channel
was bumped (here or on another replica), or, back from the notifier's `max_wait` with no
wake-up, only if anything is queued at all (`claims.anything_queued`, one indexed read):
an idle fleet's polls then cost one read each `max_wait`, not a claim, while queued work
a node could not take before is looked at again, so time-based eligibility (a rival's
grace, a reservation's window) still lets it in.

One submit wakes every poll waiting here, and one of them gets the job. Once a claim has
found nothing queued at all since the wake-up (`Notifier.settle`), the polls it woke with
it go back to waiting without a claim: a job costs a few claims, not one per idle node
(an idle fleet of a thousand paid a thousand claims a submit). Work queued later is
published, which wakes them again; a poll's first claim always runs.

Claims take turns through `gate` (`Settings.claims_at_once`). Under load a claim may get
its turn long after its poll began; one whose turn comes `LATE_CLAIM_SEC` past the
poll's wait answers empty, since the agent may have stopped listening for this answer
(it waits `wait_sec` + `protocol.agent.LEASE_ANSWER_SLACK_SEC`), and work leased to it
would sit until its lease ran out. The agent asks again.
"""

import asyncio
import functools
from datetime import timedelta

from gpu_share.coordinator.core.clock import Clock
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.replica.notify import Channel, Notifier
from gpu_share.coordinator.services.work import claims
from gpu_share.coordinator.services.work.artifact_refs import LeaseContext
from gpu_share.protocol import agent as wire

LATE_CLAIM_SEC = wire.LEASE_ANSWER_SLACK_SEC / 3
"""A claim whose turn comes this long past its poll's wait leases nothing: well before
the agent stops waiting for the answer (`LEASE_ANSWER_SLACK_SEC`)."""


async def poll(
    db: Database,
    notifier: Notifier,
    gate: asyncio.Semaphore,
    clock: Clock,
    node_id: str,
    request: wire.LeaseRequest,
    ctx: LeaseContext,
    *,
    wait_sec: float,
) -> list[wire.LeasedJob]:
    """The jobs leased to `node_id` as soon as it gets any, or none after `wait_sec`
    (module doc)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_sec
    woken = True  # the first claim always runs: it marks the node as waiting
    first = True
    while True:
        version = notifier.version(Channel.WORK)
        now = clock.now()
        remaining = deadline - loop.time()
        jobs: list[wire.LeasedJob] = []
        if woken or await claims.anything_queued(db):
            async with gate:
                if loop.time() > deadline + LATE_CLAIM_SEC:
                    return []
                # Skipped only after a wake-up: back from `max_wait` with something queued,
                # the poll claims whatever others saw (a lost NOTIFY must not strand work).
                if first or not woken or not notifier.settled(Channel.WORK, version):
                    until = now + timedelta(seconds=remaining) if remaining > 0 else None
                    async with db.write() as session:
                        jobs = await claims.claim(
                            session,
                            node_id,
                            request,
                            now,
                            ctx,
                            polling_until=until,
                            nothing_queued=functools.partial(
                                notifier.settle, Channel.WORK, version
                            ),
                        )
                first = False
        remaining = deadline - loop.time()
        if jobs or remaining <= 0 or notifier.closed:
            return jobs
        await notifier.wait(Channel.WORK, version, remaining)
        woken = notifier.version(Channel.WORK) != version
