"""A provider's view of the hardware challenges of their machines (docs/trust.md)."""

from typing import Annotated

from fastapi import APIRouter, Query

from gpu_share.coordinator.api.auth import ProviderPrincipal
from gpu_share.coordinator.api.paths import NodeId
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.trust import challenges
from gpu_share.protocol.trust import Challenge

router = APIRouter(prefix="/v1/provider", tags=["provider"])


@router.get(
    "/nodes/{node_id}/challenges",
    response_model=list[Challenge],
    responses=errors(*AUTH, 404, 422),
)
async def node_challenges(
    node_id: NodeId,
    provider: ProviderPrincipal,
    replica: ReplicaDep,
    limit: Annotated[int, Query(ge=1, le=challenges.HISTORY_LIMIT)] = 20,
) -> list[Challenge]:
    """Your node's challenges, latest first: what each asked, when, and its verdict."""
    async with replica.db.read() as session:
        return await challenges.history(session, node_id, limit, provider_id=provider.provider_id)
