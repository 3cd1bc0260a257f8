"""A provider's own view (Bearer gpu_pk_…): their account, their machines (and what they
call them), the machines' benchmark runs, and their hardware declared against proven."""

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query

from gpu_share.coordinator.api.auth import ProviderPrincipal
from gpu_share.coordinator.api.paths import NodeId
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.nodes import nodes
from gpu_share.coordinator.services.providers import benchmarks, declared_hardware, providers
from gpu_share.protocol import benchmarks as wire
from gpu_share.protocol.hardware import ProviderHardware
from gpu_share.protocol.providers import Provider, ProviderNode, ProviderNodeUpdate

router = APIRouter(prefix="/v1/provider", tags=["provider"])


@router.get("/me", response_model=Provider, responses=errors(*AUTH))
async def me(provider: ProviderPrincipal, replica: ReplicaDep) -> Provider:
    async with replica.db.read() as session:
        return await providers.get(session, provider.provider_id)


@router.get("/hardware", response_model=ProviderHardware, responses=errors(*AUTH))
async def my_hardware(provider: ProviderPrincipal, replica: ReplicaDep) -> ProviderHardware:
    """What your approved application declared (GPUs per model) against what your machines
    proved in hardware challenges, and each difference in a line (docs/trust.md)."""
    async with replica.db.read() as session:
        return await declared_hardware.of_provider(session, provider.provider_id)


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


@router.patch("/nodes/{node_id}", response_model=ProviderNode, responses=errors(*AUTH, 404, 422))
async def update_node(
    node_id: NodeId, body: ProviderNodeUpdate, provider: ProviderPrincipal, replica: ReplicaDep
) -> ProviderNode:
    """Name your machine: the `label` shows in the marketplace, node lists and your pages
    instead of its hostname (`null` clears it). Another provider's node is a 404."""
    async with replica.db.write() as session:
        return await nodes.set_label(
            session,
            provider.provider_id,
            node_id,
            body.label,
            replica.clock.now(),
            replica.settings,
        )


@router.get(
    "/nodes/{node_id}/benchmarks",
    response_model=list[wire.BenchmarkRun],
    responses=errors(*AUTH, 404, 422),
    tags=["benchmarks"],
)
async def provider_history(
    node_id: NodeId,
    provider: ProviderPrincipal,
    replica: ReplicaDep,
    limit: Annotated[int, Query(ge=1, le=benchmarks.HISTORY_LIMIT)] = 20,
) -> list[wire.BenchmarkRun]:
    """Your node's runs, newest first, with every figure, its reference and the verdicts."""
    async with replica.db.read() as session:
        await benchmarks.node_of_provider(session, node_id, provider.provider_id)
        return await benchmarks.history(session, node_id, limit)
