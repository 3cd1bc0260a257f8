"""Discovery for tenants (SPEC §1.2): nodes and runtimes."""

from fastapi import APIRouter

from gpu_share.coordinator.api.auth import TenantOrAdmin
from gpu_share.coordinator.api.deps import ReplicaDep
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.services import nodes
from gpu_share.protocol.nodes import Node, RuntimeAvailability

router = APIRouter(tags=["discovery"])


@router.get("/v1/nodes", response_model=list[Node], responses=errors(*AUTH))
async def list_nodes(_viewer: TenantOrAdmin, replica: ReplicaDep) -> list[Node]:
    """Nodes with their GPUs, runtimes, status, price and reliability."""
    async with replica.db.read() as session:
        return await nodes.list_nodes(session, replica.clock.now(), replica.settings)


@router.get("/v1/gpu/runtimes", response_model=list[RuntimeAvailability], responses=errors(*AUTH))
async def list_runtimes(_viewer: TenantOrAdmin, replica: ReplicaDep) -> list[RuntimeAvailability]:
    """Every replica with its kind, device and how many online nodes serve it now."""
    async with replica.db.read() as session:
        return await nodes.runtime_availability(session, replica.clock.now(), replica.settings)
