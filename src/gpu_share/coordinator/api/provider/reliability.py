"""Availability schedules and the published reliability score, for providers.

    GET /v1/provider/nodes/{node_id}/availability   (provider) the node's weekly windows
    PUT /v1/provider/nodes/{node_id}/availability   (provider) replace them
    GET /v1/provider/reliability                    (provider) their score and their nodes'

Another provider's node is a 404, as a node that does not exist.
"""

from fastapi import APIRouter

from gpu_share.coordinator.api.auth import ProviderPrincipal
from gpu_share.coordinator.api.paths import NodeId
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.nodes import schedules
from gpu_share.coordinator.services.providers import reliability
from gpu_share.protocol.reliability import ProviderReliability
from gpu_share.protocol.schedules import Availability

router = APIRouter(prefix="/v1/provider", tags=["reliability"])


@router.get(
    "/nodes/{node_id}/availability",
    response_model=Availability,
    responses=errors(*AUTH, 404, 422),
)
async def get_availability(
    node_id: NodeId, provider: ProviderPrincipal, replica: ReplicaDep
) -> Availability:
    """The node's weekly windows in your time zone; `always: true` when it is open 24/7."""
    async with replica.db.read() as session:
        return await schedules.get_availability(session, provider.provider_id, node_id)


@router.put(
    "/nodes/{node_id}/availability",
    response_model=Availability,
    responses=errors(*AUTH, 404, 422),
)
async def put_availability(
    node_id: NodeId, body: Availability, provider: ProviderPrincipal, replica: ReplicaDep
) -> Availability:
    """Replace the node's schedule. Outside its windows the node is not listed and gets no
    new jobs or sessions; work already running finishes. Uptime, in the reliability
    score, counts only time inside the windows."""
    async with replica.db.write() as session:
        return await schedules.set_availability(session, provider.provider_id, node_id, body)


@router.get("/reliability", response_model=ProviderReliability, responses=errors(*AUTH))
async def my_reliability(provider: ProviderPrincipal, replica: ReplicaDep) -> ProviderReliability:
    """Your reliability score and each node's, with their components and evidence, as
    last published (recomputed every minute or so; docs/reliability.md)."""
    async with replica.db.read() as session:
        return await reliability.published_for_provider(session, provider.provider_id)
