"""Sends the USDC payouts on Solana and follows them to finalized (docs/payouts.md,
"Payouts on Solana"): off unless the RPC URL and the payout keypair are configured.

Safe on several replicas: each payout is sent only by the replica that holds its claim
(`services/money/chain_payouts.py`).
"""

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.money import chain_sending
from gpu_share.coordinator.services.money.chain_sending import Outcome


async def run_once(replica: Replica) -> dict[str, Outcome]:
    """What this run did to each payout it moved (nothing when chain payouts are off)."""
    setup = chain_sending.setup_from(replica.settings)
    if setup is None:
        return {}
    async with setup.rpc:
        return await chain_sending.run(replica.db, replica.clock, setup)
