"""Applying for tenant access, without a key: the application, and confirming its email
by the mailed link."""

from typing import Annotated

from fastapi import APIRouter, Path, Request

from gpu_share.coordinator.api.responses import errors
from gpu_share.coordinator.http.replica import ReplicaDep, client_address
from gpu_share.coordinator.services.accounts import rate_limits, tenant_applications
from gpu_share.protocol import accounts as wire
from gpu_share.protocol.common import ApplicationSubmitted

router = APIRouter(tags=["applications"])

ConfirmToken = Annotated[
    str, Path(min_length=20, max_length=120, description="The gpu_cf_… token of the mailed link")
]


@router.post(
    "/v1/tenant/applications",
    status_code=201,
    response_model=ApplicationSubmitted,
    responses=errors(422, 429),
)
async def submit_tenant_application(
    body: wire.TenantApplicationCreate, request: Request, replica: ReplicaDep
) -> ApplicationSubmitted:
    """Apply for tenant access. We mail a link to the email given; once it is opened an
    admin reviews the application and, on approval, issues your key."""
    now = replica.clock.now()
    limit = rate_limits.applications(replica.settings)
    await rate_limits.admit(replica.db, limit, client_address(request), now)
    async with replica.db.write() as session:
        return await tenant_applications.submit(
            session, body, now, replica.settings.mail_base_url, replica.signer
        )


@router.post(
    "/v1/tenant/applications/confirm/{token}",
    response_model=wire.TenantApplication,
    responses=errors(404, 409, 422),
)
async def confirm_tenant_application(
    token: ConfirmToken, replica: ReplicaDep
) -> wire.TenantApplication:
    """Confirm your email with the token of the mailed link: the application is reviewed from
    now on. 409 when this email already has an application under review."""
    async with replica.db.write() as session:
        return await tenant_applications.confirm(
            session, replica.signer, token, replica.clock.now()
        )
