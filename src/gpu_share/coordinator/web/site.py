"""Puts the pages on the app: their routes, their assets, and how a page says no
(to a visitor who must sign in first, or to a user of the wrong role)."""

from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from gpu_share.coordinator.web import (
    STATIC_DIR,
    admin,
    admin_payouts,
    provider,
    provider_benchmarks,
    provider_earnings,
    provider_payouts,
    provider_performance,
    provider_pricing,
    public,
    tenant,
    tenant_billing,
    tenant_marketplace,
    tenant_reservations,
)
from gpu_share.coordinator.web.pages import PageForbidden, SignInRequired, browser_of

STATIC_PATH = "/static"


def install(app: FastAPI) -> None:
    app.mount(STATIC_PATH, StaticFiles(directory=STATIC_DIR), name="static")
    for module in (
        public,
        admin,
        admin_payouts,
        provider_benchmarks,
        provider_earnings,
        provider_payouts,
        provider_performance,
        provider_pricing,
        provider,
        tenant_marketplace,
        tenant_reservations,
        tenant_billing,
        tenant,
    ):
        app.include_router(module.router)

    @app.exception_handler(SignInRequired)
    async def _sign_in(_request: Request, exc: SignInRequired) -> Response:
        return RedirectResponse(f"/signin?next={quote(exc.next_url)}", status_code=303)

    @app.exception_handler(PageForbidden)
    async def _forbidden(request: Request, exc: PageForbidden) -> Response:
        browser = await browser_of(request, request.app.state.replica)
        return browser.render(
            "public/message.html", status=403, title="Not allowed", message=exc.message
        )
