"""Applications anyone may submit, without a key."""

from typing import Annotated

from fastapi import APIRouter, Depends

from gpu_share.coordinator.api.deps import get_runtime
from gpu_share.coordinator.api.responses import errors
from gpu_share.coordinator.runtime import Runtime
from gpu_share.coordinator.services import accounts
from gpu_share.protocol import accounts as wire

router = APIRouter(tags=["applications"])


@router.post(
    "/v1/tenant/applications",
    status_code=201,
    response_model=wire.TenantApplication,
    responses=errors(422),
)
async def submit_tenant_application(
    body: wire.TenantApplicationCreate, runtime: Annotated[Runtime, Depends(get_runtime)]
) -> wire.TenantApplication:
    """Apply for tenant access; an admin reviews it and, on approval, issues your key."""
    async with runtime.db.write() as session:
        return await accounts.submit_tenant_application(session, body, runtime.clock.now())
