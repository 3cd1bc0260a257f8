"""Proven hardware for tests: the `NodeRow.verification` a node's passed hardware challenges
leave (docs/trust.md), written straight to its row, for tests about something else than
the challenges themselves (`tests/coordinator/services/trust` runs those for real)."""

from datetime import datetime
from typing import Any

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.nodes.placement import CPU_PROOF, claimed_model


def proofs_for(node: NodeRow, at: datetime) -> dict[str, Any]:
    """What passing a challenge for each of the node's claims would write: every GPU the
    catalog knows, as the model it claims; a CPU node's cores."""
    if not node.gpus:
        return {
            CPU_PROOF: {
                "cores": node.cpu_count,
                "verified_at": at.isoformat(),
                "challenge_id": "chl_test",
                "rate_gflops": 64.0 * node.cpu_count,
            }
        }
    found: dict[str, Any] = {}
    for gpu in node.gpus:
        model = claimed_model(gpu)
        if model is not None:
            found[str(gpu["uuid"])] = {
                "model": model,
                "verified_at": at.isoformat(),
                "challenge_id": "chl_test",
                "rate_tflops": 500.0,
            }
    return found


async def mark_verified(replica: Replica, node_id: str) -> None:
    """The node's hardware passed its challenges now."""
    async with replica.db.write() as session:
        node = await session.get(NodeRow, node_id)
        assert node is not None, f"node {node_id} does not exist"
        node.verification = proofs_for(node, replica.clock.now())


async def mark_unverified(replica: Replica, node_id: str) -> None:
    """No challenge of the node's hardware has passed (or its proofs were withdrawn)."""
    async with replica.db.write() as session:
        node = await session.get(NodeRow, node_id)
        assert node is not None, f"node {node_id} does not exist"
        node.verification = None
