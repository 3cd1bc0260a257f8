"""What tenants, providers and admins see of a node's proven hardware and its checks
(docs/trust.md): each GPU's proof (or a CPU node's), the node's spot-check rate, and what
the admin's pages show. Whether hardware counts as proven is `placement`'s one rule; this
only says it."""

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.nodes.placement import (
    CPU_PROOF,
    claimed_model,
    cpu_proof,
    gpu_proof,
    node_verified,
    proven_at,
)
from gpu_share.protocol.hardware import HardwareProof


def spot_check_rate(row: NodeRow) -> float | None:
    """The share of the node's jobs spot-checked now, as the spot checks keep it
    (`NodeRow.spot_checks["rate"]`); None before they set one."""
    rate = (row.spot_checks or {}).get("rate")
    if isinstance(rate, bool) or not isinstance(rate, int | float):
        return None
    return min(1.0, max(0.0, float(rate)))


def hardware_proofs(row: NodeRow) -> list[HardwareProof]:
    """What challenges proved of each GPU of the node (a CPU node: of its cores)."""
    if not row.gpus:
        proof = cpu_proof(row)
        return [
            HardwareProof(
                target=CPU_PROOF,
                claimed=f"{row.cpu_count} cores",
                verified=proof is not None,
                verified_at=proven_at(proof),
            )
        ]
    found = []
    for gpu in row.gpus:
        proof = gpu_proof(row, gpu)
        found.append(
            HardwareProof(
                target=str(gpu.get("uuid", "")),
                claimed=claimed_model(gpu),
                verified=proof is not None,
                verified_at=proven_at(proof),
            )
        )
    return found


@dataclass(frozen=True)
class NodeTrust:
    """What the admin sees of a node's trust: its proofs, and whether it is quarantined."""

    verified: bool
    proofs: list[HardwareProof]
    quarantined_at: datetime | None
    quarantine_reason: str | None


async def trust_by_node(session: AsyncSession) -> dict[str, NodeTrust]:
    rows = (await session.scalars(select(NodeRow))).all()
    return {
        row.id: NodeTrust(
            node_verified(row), hardware_proofs(row), row.quarantined_at, row.quarantine_reason
        )
        for row in rows
    }
