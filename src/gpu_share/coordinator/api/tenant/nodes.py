"""Discovery for tenants (SPEC §1.2): nodes, runtimes, and a node's latest benchmark run."""

from fastapi import APIRouter

from gpu_share.coordinator.api.auth import TenantOrAdmin
from gpu_share.coordinator.api.paths import NodeId
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.nodes import nodes
from gpu_share.coordinator.services.providers import benchmarks
from gpu_share.protocol import benchmarks as wire
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


@router.get(
    "/v1/nodes/{node_id}/benchmarks",
    response_model=wire.NodeBenchmark,
    responses=errors(*AUTH, 404, 422),
    tags=["benchmarks"],
)
async def latest(
    node_id: NodeId, _viewer: TenantOrAdmin, replica: ReplicaDep
) -> wire.NodeBenchmark:
    """The node's latest benchmark run: each GPU's score, its figures against its model's
    datasheet, and whether it passed; `latest` is null until the node has run one."""
    async with replica.db.read() as session:
        await benchmarks.node_exists(session, node_id)
        runs = await benchmarks.history(session, node_id, 1, with_errors=False)
    return wire.NodeBenchmark(node_id=node_id, latest=runs[0] if runs else None)
