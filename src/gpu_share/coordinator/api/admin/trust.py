"""The admin's view of the spot checks (docs/trust.md): the incidents with their evidence,
and marking the platform's own nodes trusted."""

from typing import Annotated

from fastapi import APIRouter, Query

from gpu_share.coordinator.api.auth import AdminPrincipal
from gpu_share.coordinator.api.paths import IncidentId, NodeId
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.core.ids import id_pattern
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.trust import incidents
from gpu_share.protocol.incidents import NodeTrust, TrustedMark, TrustIncident

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.get("/trust/incidents", response_model=list[TrustIncident], responses=errors(*AUTH, 422))
async def list_incidents(
    _admin: AdminPrincipal,
    replica: ReplicaDep,
    node_id: Annotated[str | None, Query(pattern=id_pattern("nod"))] = None,
    limit: Annotated[int, Query(ge=1, le=incidents.LIST_LIMIT)] = 50,
) -> list[TrustIncident]:
    """Nodes caught by a spot check, latest first, with the evidence."""
    async with replica.db.read() as session:
        return await incidents.listed(session, node_id=node_id, limit=limit)


@router.get(
    "/trust/incidents/{incident_id}",
    response_model=TrustIncident,
    responses=errors(*AUTH, 404, 422),
)
async def get_incident(
    incident_id: IncidentId, _admin: AdminPrincipal, replica: ReplicaDep
) -> TrustIncident:
    async with replica.db.read() as session:
        return await incidents.get(session, incident_id)


@router.post(
    "/nodes/{node_id}/trusted", response_model=NodeTrust, responses=errors(*AUTH, 404, 422)
)
async def mark_trusted(
    node_id: NodeId, body: TrustedMark, _admin: AdminPrincipal, replica: ReplicaDep
) -> NodeTrust:
    """Mark a node trusted (it runs other nodes' spot checks and is not checked itself;
    its hardware is still challenged), or unmark it."""
    async with replica.db.write() as session:
        return await incidents.mark_trusted(session, node_id, body.trusted, replica.settings)
