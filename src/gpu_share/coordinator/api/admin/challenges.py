"""The admin's view of any node's hardware challenges (docs/trust.md)."""

from typing import Annotated

from fastapi import APIRouter, Query

from gpu_share.coordinator.api.auth import AdminPrincipal
from gpu_share.coordinator.api.paths import NodeId
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.trust import challenges
from gpu_share.protocol.trust import Challenge

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.get(
    "/nodes/{node_id}/challenges",
    response_model=list[Challenge],
    responses=errors(*AUTH, 404, 422),
)
async def node_challenges(
    node_id: NodeId,
    _admin: AdminPrincipal,
    replica: ReplicaDep,
    limit: Annotated[int, Query(ge=1, le=challenges.HISTORY_LIMIT)] = 20,
) -> list[Challenge]:
    """A node's challenges, latest first, with their verdicts."""
    async with replica.db.read() as session:
        return await challenges.history(session, node_id, limit)
