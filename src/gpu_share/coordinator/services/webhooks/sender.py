"""Sends the due deliveries through the one SSRF-safe fetcher, outside any transaction.

Each attempt is signed when it is sent (a fresh webhook-timestamp, the secrets in force
then), so a retry a day later still verifies within a receiver's tolerance. A replica that
dies mid-send leaves its claim to expire and the attempt is made again: at least once,
and the unchanged webhook-id lets a receiver drop the duplicate.
"""

import asyncio
import json
import logging
import time
from datetime import timedelta

from gpu_share.coordinator.core import metrics
from gpu_share.coordinator.core.clock import Clock
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.webhooks import deliveries, signing, signing_keys
from gpu_share.netguard import FetchError, SafeFetcher
from gpu_share.protocol.webhooks import DeliveryStatus

log = logging.getLogger(__name__)

_OUTCOME = {  # an attempt as /metrics counts it
    DeliveryStatus.DELIVERED: "delivered",
    DeliveryStatus.PENDING: "retrying",
    DeliveryStatus.FAILED: "failed",
}


async def _attempt(
    fetcher: SafeFetcher,
    claimed: deliveries.Claimed,
    signing_with: list[str],
    timeout: float,
    now: int,
) -> deliveries.Outcome:
    if not signing_with:
        return deliveries.Outcome(None, "the account has no signing secret", 0)
    payload = json.loads(claimed.body)
    # What the fetcher sends is `payload` serialized as the body was: the same bytes signed.
    body = json.dumps(payload, separators=(",", ":"))
    headers = signing.headers(signing_with, claimed.id, now, body)
    started = time.monotonic()
    status: int | None = None
    try:
        status = await fetcher.post_json(claimed.url, payload, timeout=timeout, headers=headers)
    except FetchError as exc:
        error: str | None = exc.message
    except Exception as exc:  # one receiver's oddity must not stop the others' attempts
        log.warning("webhook %s: unexpected %s", claimed.id, type(exc).__name__, exc_info=exc)
        error = f"could not be sent: {type(exc).__name__}"
    else:
        error = None if 200 <= status < 300 else f"answered HTTP {status}"
    took = int((time.monotonic() - started) * 1000)
    return deliveries.Outcome(status, error, took)


async def deliver_due(
    db: Database, clock: Clock, settings: Settings, fetcher: SafeFetcher
) -> dict[DeliveryStatus, int]:
    """Attempt what is due, together; how many ended delivered, pending (retried) or failed."""
    now = clock.now()
    async with db.write() as session:
        batch = await deliveries.claim_due(session, now, settings.webhook_timeout_sec)
        signing_with = {
            owner: await signing_keys.in_force(session, owner, now)
            for owner in {claimed.owner_id for claimed in batch}
        }
    if not batch:
        return {}
    stamp = int(now.timestamp())
    outcomes = await asyncio.gather(
        *(
            _attempt(fetcher, c, signing_with[c.owner_id], settings.webhook_timeout_sec, stamp)
            for c in batch
        )
    )
    counts: dict[DeliveryStatus, int] = {}
    retry_for = timedelta(hours=settings.webhook_retry_hours)
    async with db.write() as session:
        for claimed, outcome in zip(batch, outcomes, strict=True):
            status = await deliveries.record(session, claimed, outcome, clock.now(), retry_for)
            if status is not None:
                counts[status] = counts.get(status, 0) + 1
                metrics.after_commit(session, metrics.WEBHOOK_ATTEMPTS.labels(_OUTCOME[status]).inc)
            if status is DeliveryStatus.FAILED:
                log.warning("webhook %s given up: %s", claimed.id, outcome.error)
    return counts
