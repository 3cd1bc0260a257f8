"""A provider's monthly statement (SPEC §3.6): earnings, commission and payouts."""

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.api.auth import ProviderPrincipal
from gpu_share.coordinator.api.provider.payouts import csv_response
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.money import statements
from gpu_share.protocol.statements import ProviderStatement

router = APIRouter(prefix="/v1/provider", tags=["provider"])


@router.get(
    "/statements/{month}.csv",
    response_class=Response,
    responses={**errors(*AUTH, 422), 200: {"content": {"text/csv": {}}}},
)
async def get_statement_csv(
    month: str, provider: ProviderPrincipal, replica: ReplicaDep
) -> Response:
    """The statement as CSV: a line per GPU model, the total, then one per payout."""
    async with replica.db.read() as session:
        found = await statements.provider_statement(
            session, provider.provider_id, month, replica.clock.now()
        )
    return csv_response(*statements.provider_csv(found))


@router.get("/statements/{month}", response_model=ProviderStatement, responses=errors(*AUTH, 422))
async def get_statement(
    month: str, provider: ProviderPrincipal, replica: ReplicaDep
) -> ProviderStatement:
    """The UTC month `month` (YYYY-MM): earnings by GPU model (gross, commission, net,
    refunded) and the payouts made in it with their references. 422 for a month that is
    not YYYY-MM or has not started."""
    async with replica.db.read() as session:
        return await statements.provider_statement(
            session, provider.provider_id, month, replica.clock.now()
        )
