"""What the API's routers depend on besides the replica (`http/replica.py`): the services
built from it."""

from typing import Annotated

from fastapi import Depends, Request

from gpu_share.coordinator.http.replica import ReplicaDep, base_url
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.sessions.sessions import Sessions
from gpu_share.coordinator.services.work.artifact_refs import LeaseContext


async def get_sessions(replica: ReplicaDep) -> Sessions:
    return Sessions.of(replica)


SessionsDep = Annotated[Sessions, Depends(get_sessions)]


def lease_context(replica: Replica, request: Request) -> LeaseContext:
    return LeaseContext(
        settings=replica.settings,
        store=replica.store,
        signer=replica.signer,
        base_url=base_url(replica, request),
    )
