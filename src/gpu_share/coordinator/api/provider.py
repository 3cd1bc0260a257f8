"""A provider's own view (Bearer gpu_pk_…): their account and their machines."""

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query

from gpu_share.coordinator.api.auth import ProviderPrincipal
from gpu_share.coordinator.api.deps import ReplicaDep
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.services import nodes, providers
from gpu_share.protocol.providers import Provider, ProviderNode

router = APIRouter(prefix="/v1/provider", tags=["provider"])


@router.get("/me", response_model=Provider, responses=errors(*AUTH))
async def me(provider: ProviderPrincipal, replica: ReplicaDep) -> Provider:
    async with replica.db.read() as session:
        return await providers.get(session, provider.provider_id)


@router.get("/nodes", response_model=list[ProviderNode], responses=errors(*AUTH, 422))
async def my_nodes(
    provider: ProviderPrincipal,
    replica: ReplicaDep,
    history_minutes: Annotated[
        int, Query(ge=0, le=60, description="Include this many minutes of telemetry")
    ] = 0,
) -> list[ProviderNode]:
    """Your machines: status, GPUs, the last telemetry and, if asked, its recent history."""
    async with replica.db.read() as session:
        return await nodes.of_provider(
            session,
            provider.provider_id,
            replica.clock.now(),
            replica.settings,
            history=timedelta(minutes=history_minutes),
        )
