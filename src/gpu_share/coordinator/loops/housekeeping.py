"""Forgets what is only kept for a while: old rate-limit windows, browser sessions over for
a day, old telemetry samples, applications whose email was never confirmed."""

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.accounts import (
    browser_sessions,
    rate_limits,
    tenant_applications,
)
from gpu_share.coordinator.services.nodes import nodes, presence
from gpu_share.coordinator.services.providers import provider_applications


async def run_once(replica: Replica) -> None:
    now = replica.clock.now()
    async with replica.db.write() as session:
        await rate_limits.sweep(session, now)
        await browser_sessions.sweep(session, now)
        await nodes.prune_telemetry(session, now)
        await presence.prune(session, now)
        await provider_applications.forget_unconfirmed(session, now)
        await tenant_applications.forget_unconfirmed(session, now)
