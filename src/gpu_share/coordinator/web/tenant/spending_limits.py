"""The limits form on the tenant's Usage page: the same rules as `PUT /v1/billing/limits`
(the one parser of money, the same service), so the page refuses what the API refuses."""

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from gpu_share.coordinator.services.money import spending_limits
from gpu_share.coordinator.web.pages import SignedTenant, form_of, typed
from gpu_share.coordinator.web.tenant import usage
from gpu_share.protocol.spending_limits import SpendingLimitsUpdate

router = APIRouter(include_in_schema=False)

FIELDS = ("monthly_cap", "low_balance")


@router.post("/console/usage/limits")
async def set_limits(request: Request, signed: SignedTenant) -> Response:
    browser, tenant = signed
    form = await form_of(browser)
    values = {name: typed(form, name) for name in FIELDS}
    try:
        body = SpendingLimitsUpdate.model_validate({k: v for k, v in values.items() if v})
    except ValidationError as exc:
        errors: dict[str, str] = {}
        for problem in exc.errors():
            name = str(problem["loc"][0]) if problem["loc"] else "monthly_cap"
            errors.setdefault(name, str(problem["msg"]).removeprefix("Value error, "))
        return await usage.render(
            request, browser, tenant, status=422, limit_values=values, limit_errors=errors
        )
    async with browser.replica.db.write() as session:
        now = await spending_limits.update(
            session, tenant.tenant_id, body, browser.replica.settings, browser.now()
        )
    cap = f"a monthly cap of {now.monthly_cap} USDC" if now.monthly_cap else "no monthly cap"
    low = (
        f"a mail when the balance falls below {now.low_balance} USDC"
        if now.low_balance
        else "no low-balance mail"
    )
    return browser.redirect("/console/usage#limits", flash=f"Limits saved: {cap}, {low}.")
