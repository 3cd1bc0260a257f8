"""Puts the pages on the app: their routes, their assets, and how a page says no
(to a visitor who must sign in first, or to a user of the wrong role; every other error
becomes a page in `app.py`'s handlers, through `error_pages`)."""

from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from gpu_share.coordinator.http.routes import add_routes
from gpu_share.coordinator.web import STATIC_DIR, error_pages
from gpu_share.coordinator.web.admin import accounts, applications, nodes, overview
from gpu_share.coordinator.web.admin import bank_payouts as admin_bank_payouts
from gpu_share.coordinator.web.admin import chain_payouts as admin_chain_payouts
from gpu_share.coordinator.web.admin import enrollment as admin_enrollment
from gpu_share.coordinator.web.admin import incidents as admin_incidents
from gpu_share.coordinator.web.admin import payouts as payout_batches
from gpu_share.coordinator.web.pages import PageForbidden, SignInRequired
from gpu_share.coordinator.web.provider import (
    benchmarks,
    earnings,
    machines,
    payouts,
    performance,
    pricing,
)
from gpu_share.coordinator.web.provider import enrollment as provider_enrollment
from gpu_share.coordinator.web.provider import incidents as provider_incidents
from gpu_share.coordinator.web.provider import statement as provider_statement
from gpu_share.coordinator.web.provider import webhooks as provider_webhooks
from gpu_share.coordinator.web.public import apply, confirm_email, signin
from gpu_share.coordinator.web.tenant import console, invokes, marketplace, reservations, usage
from gpu_share.coordinator.web.tenant import deposits as tenant_deposits
from gpu_share.coordinator.web.tenant import spending_limits as tenant_spending_limits
from gpu_share.coordinator.web.tenant import statement as tenant_statement
from gpu_share.coordinator.web.tenant import webhooks as tenant_webhooks

STATIC_PATH = "/static"


def install(app: FastAPI) -> None:
    app.mount(STATIC_PATH, StaticFiles(directory=STATIC_DIR), name="static")
    # Routes match in the order they are added: the provider's tabs come before their
    # machines page, whose /provider/{tab} answers any other tab.
    pages = (
        # public/
        signin,
        apply,
        confirm_email,
        # admin/
        overview,
        applications,
        accounts,
        nodes,
        admin_enrollment,
        payout_batches,
        admin_incidents,
        # provider/
        benchmarks,
        earnings,
        payouts,
        performance,
        pricing,
        provider_enrollment,
        provider_incidents,
        provider_webhooks,  # webhooks: before machines' /provider/{tab}
        machines,
        # tenant/
        marketplace,
        reservations,
        usage,
        invokes,
        console,
        tenant_spending_limits,
        tenant_webhooks,
        admin_bank_payouts,
        tenant_statement,
        provider_statement,
        admin_chain_payouts,
        tenant_deposits,
    )
    add_routes(app, (module.router for module in pages))

    @app.exception_handler(SignInRequired)
    async def _sign_in(_request: Request, exc: SignInRequired) -> Response:
        return RedirectResponse(f"/signin?next={quote(exc.next_url)}", status_code=303)

    @app.exception_handler(PageForbidden)
    async def _forbidden(request: Request, exc: PageForbidden) -> Response:
        return await error_pages.render(request, 403, detail=exc.message)
