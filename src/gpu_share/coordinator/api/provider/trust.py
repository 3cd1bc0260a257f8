"""A provider's trust incidents (docs/trust.md, "When a node is caught"): which of their
nodes a spot check caught, why, and what it cost."""

from typing import Annotated

from fastapi import APIRouter, Query

from gpu_share.coordinator.api.auth import ProviderPrincipal
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.trust import incidents
from gpu_share.protocol.incidents import TrustIncident

router = APIRouter(prefix="/v1/provider", tags=["provider"])


@router.get("/trust/incidents", response_model=list[TrustIncident], responses=errors(*AUTH, 422))
async def list_incidents(
    provider: ProviderPrincipal,
    replica: ReplicaDep,
    limit: Annotated[int, Query(ge=1, le=incidents.LIST_LIMIT)] = 50,
) -> list[TrustIncident]:
    """Your nodes caught by a spot check, latest first (the tenant's job is not shown)."""
    async with replica.db.read() as session:
        return await incidents.listed(session, provider_id=provider.provider_id, limit=limit)
