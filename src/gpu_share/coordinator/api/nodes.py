"""Discovery for tenants (SPEC §1.2): nodes and runtimes."""

from typing import Annotated

from fastapi import APIRouter, Depends

from gpu_share.coordinator.api.deps import RuntimeDep
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.auth import require
from gpu_share.coordinator.services import nodes
from gpu_share.coordinator.services.accounts import Principal
from gpu_share.protocol.accounts import Role
from gpu_share.protocol.nodes import Node, RuntimeAvailability

router = APIRouter(tags=["discovery"])
Viewer = Annotated[Principal, Depends(require(Role.TENANT, Role.ADMIN))]


@router.get("/v1/nodes", response_model=list[Node], responses=errors(*AUTH))
async def list_nodes(_viewer: Viewer, runtime: RuntimeDep) -> list[Node]:
    """Nodes with their GPUs, runtimes, status, price and reliability."""
    async with runtime.db.read() as session:
        return await nodes.list_nodes(session, runtime.clock.now(), runtime.settings)


@router.get("/v1/gpu/runtimes", response_model=list[RuntimeAvailability], responses=errors(*AUTH))
async def list_runtimes(_viewer: Viewer, runtime: RuntimeDep) -> list[RuntimeAvailability]:
    """Every runtime with its kind, device and how many online nodes serve it now."""
    async with runtime.db.read() as session:
        return await nodes.runtime_availability(session, runtime.clock.now(), runtime.settings)
