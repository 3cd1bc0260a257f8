"""Releases held earnings whose hold has passed, so that payouts can take them (SPEC §3.8).

Every replica runs it: each charge's release is posted once by its cause in the
transaction that deletes its hold, and a provider another run is busy with is skipped
(`SKIP LOCKED`) until the next (see `services/money/earnings_hold.py`).
"""

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.money import earnings_hold
from gpu_share.coordinator.services.money.earnings_hold import HoldPolicy


async def run_once(replica: Replica) -> int:
    """How many charges this run released: batch after batch until one comes up short
    (nothing more due, or the rest busy elsewhere)."""
    now = replica.clock.now()
    policy = HoldPolicy.of(replica.settings)
    released = 0
    while True:
        async with replica.db.write() as session:
            done = await earnings_hold.release_due(session, now, policy)
        released += done
        if done < earnings_hold.RELEASE_BATCH:
            return released
