"""Credits tenants' USDC top-ups once finalized (docs/billing.md, "Top up with USDC"):
off unless the RPC URL and the deposit wallet are configured. Safe on several replicas:
each transfer is credited once, by its signature (`services/money/deposits.py`)."""

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.money import deposit_watch, deposits
from gpu_share.coordinator.services.money.solana.rpc import SolanaRpc


async def run_once(replica: Replica) -> list[str]:
    """The signatures this run credited."""
    settings = replica.settings
    target = deposits.target_of(settings)
    if target is None or settings.solana_rpc_url is None:
        return []
    async with SolanaRpc(
        settings.solana_rpc_url.get_secret_value(),
        timeout_sec=settings.solana_rpc_timeout_sec,
        attempts=settings.solana_rpc_attempts,
        retry_first_sec=settings.solana_rpc_retry_first_sec,
    ) as rpc:
        return await deposit_watch.run(replica.db, replica.clock, rpc, target)
