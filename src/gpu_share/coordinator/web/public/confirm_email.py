"""Confirming an applicant's email: the page the mailed link opens, for providers' and
tenants' applications. Opening it changes nothing (mail scanners open links before people
do); its button confirms."""

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import Response

from gpu_share.coordinator.core.errors import ApiError
from gpu_share.coordinator.services.accounts import tenant_applications
from gpu_share.coordinator.services.providers import provider_applications
from gpu_share.coordinator.web.pages import Browser, BrowserDep, form_of

router = APIRouter(include_in_schema=False)

Token = Annotated[str, Path(min_length=20, max_length=120)]
PROVIDING = "to provide GPUs"
RENTING = "for tenant access"


def _confirm_page(browser: Browser, what: str, action: str) -> Response:
    return browser.render("public/confirm.html", what=what, action=action)


def _refused(browser: Browser, exc: ApiError) -> Response:
    title = "Link not found" if exc.status == 404 else "Already under review"
    return browser.render(
        "public/message.html", status=exc.status, title=title, message=exc.message
    )


@router.get("/apply/confirm/{token}")
async def provider_confirm_page(token: Token, browser: BrowserDep) -> Response:
    return _confirm_page(browser, PROVIDING, f"/apply/confirm/{token}")


@router.post("/apply/confirm/{token}")
async def confirm_provider_application(token: Token, browser: BrowserDep) -> Response:
    await form_of(browser)
    replica = browser.replica
    try:
        async with replica.db.write() as db:
            receipt = await provider_applications.confirm(
                db, replica.signer, token, browser.now(), replica.settings.mail_base_url
            )
    except ApiError as exc:
        return _refused(browser, exc)
    return browser.redirect(
        f"/apply/status/{receipt.status_token}",
        flash="Your email is confirmed and your application is in review. Keep this page's "
        "link: it is how you follow your application (we mailed it to you too).",
    )


@router.get("/apply/tenant/confirm/{token}")
async def tenant_confirm_page(token: Token, browser: BrowserDep) -> Response:
    return _confirm_page(browser, RENTING, f"/apply/tenant/confirm/{token}")


@router.post("/apply/tenant/confirm/{token}")
async def confirm_tenant_application(token: Token, browser: BrowserDep) -> Response:
    await form_of(browser)
    replica = browser.replica
    try:
        async with replica.db.write() as db:
            application = await tenant_applications.confirm(
                db, replica.signer, token, browser.now()
            )
    except ApiError as exc:
        return _refused(browser, exc)
    return browser.render(
        "public/message.html",
        title="Your application is in review",
        message=f"Thank you: your email is confirmed and your application {RENTING} is in "
        f"review. An admin will write to you at {application.email}.",
    )
