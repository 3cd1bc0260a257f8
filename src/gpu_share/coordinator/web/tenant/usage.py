"""The tenant's Usage page (SPEC §4.4, §5): balance, charges per day and per runtime, CSV.

It reads the same services as `GET /v1/billing/balance` and `/v1/billing/usage`, with
the signed-in tenant's id, so it shows exactly what the API answers that tenant.
"""

from datetime import date

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gpu_share.coordinator.core.errors import ValidationFailed
from gpu_share.coordinator.core.principals import TenantCaller
from gpu_share.coordinator.services.money import deposits, spending_limits, tenant_billing
from gpu_share.coordinator.web import charts
from gpu_share.coordinator.web.pages import Browser, SignedTenant
from gpu_share.protocol.billing import UsageGroup
from gpu_share.protocol.money import to_micro

router = APIRouter(include_in_schema=False)

DATES = (("from", "From"), ("to", "To (inclusive)"))


def _dates(request: Request, today: date) -> tuple[date, date, dict[str, str], dict[str, str]]:
    """The period asked for, what was typed, and what is wrong with it (then the default)."""
    entered = {name: request.query_params.get(name, "").strip() for name, _ in DATES}
    errors: dict[str, str] = {}
    parsed: dict[str, date | None] = {}
    for name, _ in DATES:
        try:
            parsed[name] = date.fromisoformat(entered[name]) if entered[name] else None
        except ValueError:
            errors[name] = "Give a date as YYYY-MM-DD"
            parsed[name] = None
    if not errors:  # a date that could not be read is not compared with the other one
        try:
            start, end = tenant_billing.period(parsed["from"], parsed["to"], today)
        except ValidationFailed as exc:
            for wrong in exc.details or [{"loc": ["from"], "msg": exc.message}]:
                errors[wrong["loc"][0]] = wrong["msg"]  # `field_error`'s: the field, the fix
    if errors:  # the page shows the default period beside what to fix
        start, end = tenant_billing.period(None, None, today)
    return start, end, entered, errors


@router.get("/console/usage")
async def usage_page(request: Request, signed: SignedTenant) -> Response:
    browser, tenant = signed
    return await render(request, browser, tenant)


async def render(
    request: Request,
    browser: Browser,
    tenant: TenantCaller,
    *,
    status: int = 200,
    limit_values: dict[str, str] | None = None,
    limit_errors: dict[str, str] | None = None,
) -> Response:
    """The page; the limits form (`spending_limits`) shows what was sent, with its errors."""
    replica = browser.replica
    start, end, entered, errors = _dates(request, browser.now().date())
    async with replica.db.read() as session:
        balance = await tenant_billing.balance(session, tenant.tenant_id, replica.settings)
        found = await tenant_billing.charges(session, tenant.tenant_id, start, end)
        limits = await spending_limits.view(
            session, tenant.tenant_id, replica.settings, browser.now()
        )
        deposit_target = deposits.target_of(replica.settings)
        deposit_list = await deposits.of_tenant(session, tenant.tenant_id, deposit_target)
    by_day = tenant_billing.summarize(tenant.tenant_id, found, UsageGroup.DAY, start, end)
    by_runtime = tenant_billing.summarize(tenant.tenant_id, found, UsageGroup.RUNTIME, start, end)
    chart = charts.daily_bars(
        "Spent per day",
        [(date.fromisoformat(line.key), to_micro(line.cost)) for line in by_day.lines],
    )
    query = f"from={start.isoformat()}&to={end.isoformat()}"
    return browser.render(
        "tenant/usage.html",
        status=422 if errors else status,
        balance=balance,
        limits=limits,
        limit_values=limit_values
        or {"monthly_cap": limits.monthly_cap or "", "low_balance": limits.low_balance or ""},
        limit_errors=limit_errors or {},
        deposits_on=deposit_target is not None,
        deposits=deposit_list,
        by_day=by_day,
        by_runtime=by_runtime,
        charges=list(reversed(found))[:50],
        count=len(found),
        refunds=sum(1 for charge in found if charge.refunded_at is not None),
        chart=chart,
        entered=entered,
        errors=errors,
        dates=DATES,
        csv_url=f"/console/usage.csv?{query}",
    )


@router.get("/console/usage.csv")
async def usage_csv(request: Request, signed: SignedTenant) -> Response:
    browser, tenant = signed
    start, end, _entered, _errors = _dates(request, browser.now().date())
    async with browser.replica.db.read() as session:
        found = await tenant_billing.charges(session, tenant.tenant_id, start, end)
    name = f"usage-{start.isoformat()}-{end.isoformat()}.csv"
    return Response(
        tenant_billing.as_csv(found),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )
