"""The "Top up with USDC" form on the tenant's Usage page: the same rules and service as
`POST /v1/billing/deposits`."""

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import ValidationError

from gpu_share.coordinator.core.errors import ApiError
from gpu_share.coordinator.services.money import deposits
from gpu_share.coordinator.web.pages import SignedTenant, form_of, typed
from gpu_share.protocol.deposits import DepositCreate

router = APIRouter(include_in_schema=False)


@router.post("/console/usage/deposits")
async def ask_for_deposit(signed: SignedTenant) -> Response:
    browser, tenant = signed
    form = await form_of(browser)
    amount = typed(form, "amount")
    try:
        body = DepositCreate.model_validate({"amount": amount} if amount else {})
    except ValidationError as exc:
        why = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        return browser.redirect("/console/usage#deposits", flash=f"No deposit asked: {why}")
    try:
        async with browser.replica.db.write() as session:
            made = await deposits.request(
                session,
                tenant.tenant_id,
                body.amount,
                deposits.target_of(browser.replica.settings),
                browser.now(),
            )
    except ApiError as exc:
        return browser.redirect("/console/usage#deposits", flash=exc.message)
    return browser.redirect(
        f"/console/usage#{made.id}",
        flash=f"Send USDC to {made.address} naming the reference {made.reference}.",
    )
