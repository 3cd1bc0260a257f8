"""The provider's monthly statement page (SPEC §3.6), linked from Earnings: what
`GET /v1/provider/statements/{month}` answers the signed-in provider, laid out to print.
Its path has two parts, so the machines page's `/provider/{tab}` never takes it."""

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.services.money import statements
from gpu_share.coordinator.web.pages import SignedProvider
from gpu_share.coordinator.web.statements import asked_month

router = APIRouter(prefix="/provider", include_in_schema=False)


@router.get("/earnings/statement")
async def statement_page(signed: SignedProvider, month: str | None = None) -> Response:
    browser, provider = signed
    asked = asked_month(month, browser.now())
    async with browser.replica.db.read() as session:
        found = await statements.provider_statement(
            session, provider.provider_id, asked.month, browser.now()
        )
    return browser.render(
        "provider/statement.html",
        status=422 if asked.error else 200,
        s=found,
        asked=asked,
        csv_url=f"/provider/earnings/statement.csv?month={found.month}",
    )


@router.get("/earnings/statement.csv")
async def statement_csv(signed: SignedProvider, month: str = "") -> Response:
    """The month's statement as CSV; a bad month is the usual 422 page."""
    browser, provider = signed
    async with browser.replica.db.read() as session:
        found = await statements.provider_statement(
            session, provider.provider_id, month, browser.now()
        )
    name, content = statements.provider_csv(found)
    return Response(
        content,
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )
