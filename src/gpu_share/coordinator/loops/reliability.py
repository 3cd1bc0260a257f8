"""Recomputes the published reliability scores of nodes and providers."""

from gpu_share.coordinator.replica.state import Replica


async def run_once(replica: Replica) -> None:
    """Filled by the reliability work."""
