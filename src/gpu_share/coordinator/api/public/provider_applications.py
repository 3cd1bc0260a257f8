"""Becoming a provider (SPEC §3.1): the GPU models, applying, confirming the email by the
mailed link, following the application with its private status link, and claiming the
account once approved. No key needed."""

from typing import Annotated

from fastapi import APIRouter, Path, Request

from gpu_share.coordinator.api.responses import errors
from gpu_share.coordinator.http.replica import ReplicaDep, client_address, install_base
from gpu_share.coordinator.services.accounts import rate_limits
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.coordinator.services.providers import (
    enrollment_tokens,
    provider_applications,
)
from gpu_share.protocol import provider_applications as wire
from gpu_share.protocol.common import ApplicationSubmitted

router = APIRouter(prefix="/v1/provider", tags=["provider applications"])

StatusToken = Annotated[
    str, Path(min_length=20, max_length=120, description="The gpu_st_… token of the status link")
]
ConfirmToken = Annotated[
    str, Path(min_length=20, max_length=120, description="The gpu_cf_… token of the mailed link")
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
    response_model=ApplicationSubmitted,
    responses=errors(422, 429),
)
async def apply(
    body: wire.ProviderApplicationCreate, request: Request, replica: ReplicaDep
) -> ApplicationSubmitted:
    """Apply to provide GPUs. We mail a link to the email given: the application is
    reviewed once it is opened (`POST /v1/provider/applications/confirm/{token}`)."""
    now = replica.clock.now()
    limit = rate_limits.applications(replica.settings)
    await rate_limits.admit(replica.db, limit, client_address(request), now)
    async with replica.db.write() as session:
        return await provider_applications.submit(
            session, body, now, replica.settings.mail_base_url, replica.signer
        )


@router.post(
    "/applications/confirm/{token}",
    response_model=wire.ApplicationReceipt,
    responses=errors(404, 409, 422),
)
async def confirm_application(token: ConfirmToken, replica: ReplicaDep) -> wire.ApplicationReceipt:
    """Confirm your email with the token of the mailed link: the application is reviewed from
    now on. Keep the answer's `status_url` (also mailed): it is how you follow it. 409 when
    this email already has an application under review."""
    async with replica.db.write() as session:
        return await provider_applications.confirm(
            session, replica.signer, token, replica.clock.now(), replica.settings.mail_base_url
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
async def claim_account(token: ClaimToken, replica: ReplicaDep) -> wire.ProviderClaim:
    """Once: your provider key and agent enrollment token, from the link in your approval
    mail. The install command points at the coordinator's public URL, or, when none is set,
    at `https://COORDINATOR`, for you to replace (and to pass as the script's `--server`)."""
    # The token is 256 random bits: guessing it is hopeless, so it needs no rate limit.
    async with replica.db.write() as session:
        return await provider_applications.claim(
            session,
            token,
            replica.clock.now(),
            install_base(replica),
            token_lifetime=enrollment_tokens.lifetime(replica.settings.enrollment_token_days),
        )
