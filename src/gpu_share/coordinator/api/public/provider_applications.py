"""Becoming a provider (SPEC §3.1): the GPU models, applying, following the application
with its private status link, and claiming the account once approved. No key needed."""

from typing import Annotated

from fastapi import APIRouter, Path, Request

from gpu_share.coordinator.api.responses import errors
from gpu_share.coordinator.http.replica import ReplicaDep, base_url, client_address
from gpu_share.coordinator.services.accounts import rate_limits
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.coordinator.services.providers import provider_applications
from gpu_share.protocol import provider_applications as wire

router = APIRouter(prefix="/v1/provider", tags=["provider applications"])

StatusToken = Annotated[
    str, Path(min_length=20, max_length=120, description="The gpu_st_… token of the status link")
]
ClaimToken = Annotated[
    str, Path(min_length=20, max_length=120, description="The gpu_ct_… token of the claim link")
]


@router.get("/gpu-models", response_model=list[wire.GpuModelInfo])
async def gpu_models() -> list[wire.GpuModelInfo]:
    """The supported GPU models with VRAM and datasheet figures; any other is 'other'."""
    return list(gpu_catalog.SUPPORTED)


@router.post(
    "/applications",
    status_code=201,
    response_model=wire.ApplicationReceipt,
    responses=errors(409, 422, 429),
)
async def apply(
    body: wire.ProviderApplicationCreate, request: Request, replica: ReplicaDep
) -> wire.ApplicationReceipt:
    """Apply to provide GPUs; keep the answer's `status_url`, it is how you follow it."""
    now = replica.clock.now()
    limit = rate_limits.applications(replica.settings)
    await rate_limits.admit(replica.db, limit, client_address(request), now)
    async with replica.db.write() as session:
        return await provider_applications.submit(
            session, body, now, base_url(replica, request), replica.signer
        )


@router.get(
    "/applications/status/{token}",
    response_model=wire.ProviderApplication,
    responses=errors(404, 422),
)
async def application_status(token: StatusToken, replica: ReplicaDep) -> wire.ProviderApplication:
    """Your application and its decision, by the private token of your status link."""
    async with replica.db.read() as session:
        row = await provider_applications.by_status_token(session, replica.signer, token)
        return provider_applications.to_wire(row)


@router.put(
    "/applications/status/{token}",
    response_model=wire.ProviderApplication,
    responses=errors(404, 409, 422),
)
async def amend_application(
    token: StatusToken, body: wire.ProviderApplicationCreate, replica: ReplicaDep
) -> wire.ProviderApplication:
    """Answer a request for more information; the application goes back to review."""
    async with replica.db.write() as session:
        return await provider_applications.amend(
            session, replica.signer, token, body, replica.clock.now()
        )


@router.post("/claim/{token}", response_model=wire.ProviderClaim, responses=errors(404, 409, 422))
async def claim_account(
    token: ClaimToken, request: Request, replica: ReplicaDep
) -> wire.ProviderClaim:
    """Once: your provider key and agent enrollment token, from the link in your approval mail."""
    # The token is 256 random bits: guessing it is hopeless, so it needs no rate limit.
    async with replica.db.write() as session:
        return await provider_applications.claim(
            session, token, replica.clock.now(), base_url(replica, request)
        )
