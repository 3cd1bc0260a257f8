"""Makes the payout batch of each period that is due today, once (SPEC §3.6).

Each due period (weekly on Mondays, monthly on the first business day, UTC) is one
write transaction: the replica whose insert of the batch row wins makes its payouts;
every other run, on this replica later or on another at the same moment, finds the
batch there and does nothing (see `services/money/payouts.py`). Held earnings whose
hold has passed are released first, so that a payout pays all that is payable by then.
"""

from datetime import UTC

from gpu_share.coordinator.loops import earnings_hold
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.money import payouts


async def run_once(replica: Replica) -> list[str]:
    """The ids of the batches this run made (usually none)."""
    now = replica.clock.now()
    settings = replica.settings
    made = []
    due = payouts.due_periods(now.astimezone(UTC).date())
    if due:
        await earnings_hold.run_once(replica)
    for schedule, period in due:
        async with replica.db.write() as session:
            batch_id = await payouts.make_batch(
                session,
                schedule,
                period,
                now,
                settings.payout_minimum_micro,
                settings.public_base_url,
            )
        if batch_id is not None:
            made.append(batch_id)
    return made
