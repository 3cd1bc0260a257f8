"""Applications anyone may submit, without a key."""

from fastapi import APIRouter, Request

from gpu_share.coordinator.api.responses import errors
from gpu_share.coordinator.http.replica import ReplicaDep, client_address
from gpu_share.coordinator.services.accounts import accounts, rate_limits
from gpu_share.protocol import accounts as wire

router = APIRouter(tags=["applications"])


@router.post(
    "/v1/tenant/applications",
    status_code=201,
    response_model=wire.TenantApplication,
    responses=errors(422, 429),
)
async def submit_tenant_application(
    body: wire.TenantApplicationCreate, request: Request, replica: ReplicaDep
) -> wire.TenantApplication:
    """Apply for tenant access; an admin reviews it and, on approval, issues your key."""
    now = replica.clock.now()
    limit = rate_limits.applications(replica.settings)
    await rate_limits.admit(replica.db, limit, client_address(request), now)
    async with replica.db.write() as session:
        return await accounts.submit_tenant_application(session, body, now)
