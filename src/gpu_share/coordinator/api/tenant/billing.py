"""Tenant billing (SPEC §4.4): balance, usage (JSON or CSV) and quotes."""

from datetime import date
from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse, Response

from gpu_share.coordinator.api.auth import TenantPrincipal
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep, origins
from gpu_share.coordinator.services.money import tenant_billing
from gpu_share.coordinator.services.work import quotes
from gpu_share.protocol.billing import Balance, Quote, Usage, UsageGroup
from gpu_share.protocol.invokes import InvokeCreate

router = APIRouter(tags=["billing"])


class UsageFormat(StrEnum):
    JSON = "json"
    CSV = "csv"


@router.get("/v1/billing/balance", response_model=Balance, responses=errors(*AUTH))
async def get_balance(tenant: TenantPrincipal, replica: ReplicaDep) -> Balance:
    """What this tenant can spend now, and what is held for its running work."""
    async with replica.db.read() as session:
        return await tenant_billing.balance(session, tenant.tenant_id, replica.settings)


Start = Annotated[date | None, Query(alias="from", description="First UTC day (YYYY-MM-DD)")]
End = Annotated[date | None, Query(alias="to", description="Last UTC day, included")]


@router.get(
    "/v1/billing/usage",
    response_model=Usage,
    responses={
        200: {"content": {"text/csv": {}}, "description": "JSON, or CSV with format=csv"},
        **errors(*AUTH, 422),
    },
)
async def get_usage(
    tenant: TenantPrincipal,
    replica: ReplicaDep,
    start: Start = None,
    end: End = None,
    group: UsageGroup = UsageGroup.DAY,
    format: UsageFormat = UsageFormat.JSON,
) -> Response:
    """This tenant's charges summed per UTC day or per runtime; `format=csv`: every charge."""
    if format is UsageFormat.CSV:
        return await get_usage_csv(tenant, replica, start, end)
    day_one, last = tenant_billing.period(start, end, replica.clock.now().date())
    async with replica.db.read() as session:
        found = await tenant_billing.charges(session, tenant.tenant_id, day_one, last)
    usage = tenant_billing.summarize(tenant.tenant_id, found, group, day_one, last)
    return Response(usage.model_dump_json(), media_type="application/json")


@router.get(
    "/v1/billing/usage.csv",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/csv": {}}}, **errors(*AUTH, 422)},
)
async def get_usage_csv(
    tenant: TenantPrincipal, replica: ReplicaDep, start: Start = None, end: End = None
) -> Response:
    """Every charge of the period, one a line, for a spreadsheet."""
    day_one, last = tenant_billing.period(start, end, replica.clock.now().date())
    async with replica.db.read() as session:
        found = await tenant_billing.charges(session, tenant.tenant_id, day_one, last)
    name = f"usage-{day_one.isoformat()}-{last.isoformat()}.csv"
    return Response(
        tenant_billing.as_csv(found),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


@router.post("/v1/gpu/quote", response_model=Quote, responses=errors(*AUTH, 404, 410, 422, 503))
async def quote_invoke(
    body: InvokeCreate, request: Request, tenant: TenantPrincipal, replica: ReplicaDep
) -> Quote:
    """What this invoke would cost if submitted now: the node, its rate, the most it can
    cost and what it is expected to; nothing is reserved or queued."""
    async with replica.db.read() as session:
        return await quotes.quote(
            session,
            replica.settings,
            tenant.tenant_id,
            body,
            origins=origins(replica, request),
            now=replica.clock.now(),
        )
