"""A tenant's own spending limits (SPEC §4.5): a monthly cap on new work and a
low-balance threshold it is mailed at."""

from fastapi import APIRouter

from gpu_share.coordinator.api.auth import TenantPrincipal
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.money import spending_limits
from gpu_share.protocol.spending_limits import SpendingLimits, SpendingLimitsUpdate

router = APIRouter(prefix="/v1/billing/limits", tags=["billing"])


@router.get("", response_model=SpendingLimits, responses=errors(*AUTH))
async def get_limits(tenant: TenantPrincipal, replica: ReplicaDep) -> SpendingLimits:
    """The cap and threshold in force, and what this month has taken so far."""
    async with replica.db.read() as session:
        return await spending_limits.view(
            session, tenant.tenant_id, replica.settings, replica.clock.now()
        )


@router.put("", response_model=SpendingLimits, responses=errors(*AUTH, 422))
async def put_limits(
    body: SpendingLimitsUpdate, tenant: TenantPrincipal, replica: ReplicaDep
) -> SpendingLimits:
    """Set both limits (an omitted or null one is removed); new work is held to the cap
    from the next request on, work already running is not stopped."""
    async with replica.db.write() as session:
        return await spending_limits.update(
            session, tenant.tenant_id, body, replica.settings, replica.clock.now()
        )
