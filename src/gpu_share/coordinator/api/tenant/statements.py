"""A tenant's monthly statement (SPEC §4.4): spend by runtime and GPU model, JSON or CSV."""

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.api.auth import TenantPrincipal
from gpu_share.coordinator.api.provider.payouts import csv_response
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.money import statements
from gpu_share.protocol.statements import TenantStatement

router = APIRouter(prefix="/v1/billing", tags=["billing"])


@router.get(
    "/statements/{month}.csv",
    response_class=Response,
    responses={**errors(*AUTH, 409, 422), 200: {"content": {"text/csv": {}}}},
)
async def get_statement_csv(month: str, tenant: TenantPrincipal, replica: ReplicaDep) -> Response:
    """The statement as CSV: a line per runtime, per GPU model, and the total."""
    async with replica.db.read() as session:
        found = await statements.tenant_statement(
            session, tenant.tenant_id, month, replica.clock.now()
        )
    return csv_response(*statements.tenant_csv(found))


@router.get(
    "/statements/{month}", response_model=TenantStatement, responses=errors(*AUTH, 409, 422)
)
async def get_statement(
    month: str, tenant: TenantPrincipal, replica: ReplicaDep
) -> TenantStatement:
    """What the UTC month `month` (YYYY-MM) cost, by runtime and by GPU model, refunds
    netted. 422 for a month that is not YYYY-MM or has not started."""
    async with replica.db.read() as session:
        return await statements.tenant_statement(
            session, tenant.tenant_id, month, replica.clock.now()
        )
