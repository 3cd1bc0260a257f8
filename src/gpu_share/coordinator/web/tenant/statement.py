"""The tenant's monthly statement page (SPEC §4.4), linked from Usage: what
`GET /v1/billing/statements/{month}` answers the signed-in tenant, laid out to print."""

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.services.money import statements
from gpu_share.coordinator.web.pages import SignedTenant
from gpu_share.coordinator.web.statements import asked_month

router = APIRouter(include_in_schema=False)


@router.get("/console/usage/statement")
async def statement_page(signed: SignedTenant, month: str | None = None) -> Response:
    browser, tenant = signed
    asked = asked_month(month, browser.now())
    async with browser.replica.db.read() as session:
        found = await statements.tenant_statement(
            session, tenant.tenant_id, asked.month, browser.now()
        )
    return browser.render(
        "tenant/statement.html",
        status=422 if asked.error else 200,
        s=found,
        asked=asked,
        csv_url=f"/console/usage/statement.csv?month={found.month}",
    )


@router.get("/console/usage/statement.csv")
async def statement_csv(signed: SignedTenant, month: str = "") -> Response:
    """The month's statement as CSV; a bad month is the usual 422 page."""
    browser, tenant = signed
    async with browser.replica.db.read() as session:
        found = await statements.tenant_statement(session, tenant.tenant_id, month, browser.now())
    name, content = statements.tenant_csv(found)
    return Response(
        content,
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )
