"""Hardware challenges from the node's side (`gpu_share.protocol.trust`): a node sees
only its own; another node's challenge is a 404 like one that never existed."""

from fastapi import APIRouter

from gpu_share.coordinator.api.auth import NodePrincipal
from gpu_share.coordinator.api.paths import ChallengeId
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.trust import challenges, verdicts
from gpu_share.protocol import trust as wire

router = APIRouter(prefix="/v1/agent/challenges", tags=["agent"])


@router.post(
    "/{challenge_id}/start", response_model=wire.ChallengeStart, responses=errors(*AUTH, 404, 409)
)
async def start(
    challenge_id: ChallengeId, caller: NodePrincipal, replica: ReplicaDep
) -> wire.ChallengeStart:
    """The seed and the sizes; the commit deadline counts from the first start."""
    async with replica.db.write() as session:
        return await challenges.start(session, caller.node_id, challenge_id, replica.clock.now())


@router.post(
    "/{challenge_id}/commit",
    response_model=wire.ChallengeCommitted,
    responses=errors(*AUTH, 404, 409, 413, 422),
)
async def commit(
    challenge_id: ChallengeId,
    body: wire.ChallengeCommit,
    caller: NodePrincipal,
    replica: ReplicaDep,
) -> wire.ChallengeCommitted:
    """Every step's sketches; the answer names the chunks to reveal (or, when they came too
    late, the failed verdict)."""
    now = replica.clock.now()
    async with replica.db.write() as session:
        return await challenges.commit(
            session, caller.node_id, challenge_id, body, now, replica.settings
        )


@router.post(
    "/{challenge_id}/reveal",
    response_model=wire.ChallengeVerdict,
    responses=errors(*AUTH, 404, 409, 413, 422),
)
async def reveal(
    challenge_id: ChallengeId,
    body: wire.ChallengeReveal,
    caller: NodePrincipal,
    replica: ReplicaDep,
) -> wire.ChallengeVerdict:
    """The asked chunks; the verdict, checked exactly against the commitment and the seed."""
    now = replica.clock.now()
    return await verdicts.reveal(
        replica.db, caller.node_id, challenge_id, body, now, replica.settings
    )
