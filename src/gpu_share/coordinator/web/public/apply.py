"""Applying to provide GPUs (the email is confirmed in `confirm_email`), following an
application by its private link (and amending it when the admin asks for more), and
claiming an approved account."""

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import Response

from gpu_share.coordinator.core.errors import ApiError
from gpu_share.coordinator.http.replica import client_address, install_base, public_url
from gpu_share.coordinator.services.accounts import rate_limits
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.coordinator.services.providers import (
    enrollment_tokens,
    provider_applications,
)
from gpu_share.coordinator.services.providers.provider_applications import ClaimState
from gpu_share.coordinator.web.application_form import (
    application_from_form,
    blank_form,
    form_values_of,
)
from gpu_share.coordinator.web.pages import Browser, BrowserDep, form_of
from gpu_share.protocol import provider_applications as wire
from gpu_share.protocol.schedules import Weekday

router = APIRouter(include_in_schema=False)

Token = Annotated[str, Path(min_length=20, max_length=120)]


@router.get("/apply")
async def apply_page(browser: BrowserDep) -> Response:
    return _apply_form(browser, blank_form(), {})


def _apply_form(
    browser: BrowserDep,
    values: dict[str, str],
    errors: dict[str, str],
    *,
    status: int = 200,
    action: str = "/apply",
    application: wire.ProviderApplication | None = None,
) -> Response:
    return browser.render(
        "public/apply.html",
        status=status,
        values=values,
        errors=errors,
        models=gpu_catalog.SUPPORTED,
        weekdays=list(Weekday),
        action=action,
        application=application,
    )


@router.post("/apply")
async def apply(browser: BrowserDep) -> Response:
    form = await form_of(browser)
    values = form_values_of(form)
    body, errors = application_from_form(values)
    if body is None:
        return _apply_form(browser, values, errors, status=422)
    replica = browser.replica
    now = browser.now()
    try:
        limit = rate_limits.applications(replica.settings)
        await rate_limits.admit(replica.db, limit, client_address(browser.request), now)
        async with replica.db.write() as db:
            submitted = await provider_applications.submit(
                db, body, now, replica.settings.mail_base_url, replica.signer
            )
    except ApiError as exc:
        return _apply_form(browser, values, {"form": exc.message}, status=exc.status)
    # The same words whatever this email applied for before: they tell no one who has.
    return browser.redirect("/apply/sent", flash=f"Application received. {submitted.message}")


@router.get("/apply/sent")
async def application_sent(browser: BrowserDep) -> Response:
    return browser.render(
        "public/message.html",
        title="Check your mail",
        message="We mailed a link to the email you gave. Open it to confirm your email: your "
        "application is reviewed from then on, and the mail that follows has the link where "
        "you follow it. No mail? Look in the spam folder, or apply again.",
    )


@router.get("/apply/status/{token}")
async def application_status(token: Token, browser: BrowserDep) -> Response:
    async with browser.replica.db.read() as db:
        try:
            row = await provider_applications.by_status_token(db, browser.replica.signer, token)
        except ApiError as exc:
            return browser.render(
                "public/message.html", status=404, title="Link not found", message=exc.message
            )
        application = provider_applications.to_wire(row)
    values = (
        form_values_of(None, application)
        if application.status is (wire.ApplicationStatus.INFO_REQUESTED)
        else {}
    )
    return browser.render(
        "public/status.html",
        application=application,
        values=values,
        errors={},
        models=gpu_catalog.SUPPORTED,
        weekdays=list(Weekday),
        action=f"/apply/status/{token}",
    )


@router.post("/apply/status/{token}")
async def amend_application(token: Token, browser: BrowserDep) -> Response:
    form = await form_of(browser)
    values = form_values_of(form)
    body, errors = application_from_form(values)
    replica = browser.replica
    if body is not None:
        try:
            async with replica.db.write() as db:
                await provider_applications.amend(db, replica.signer, token, body, browser.now())
        except ApiError as exc:
            errors = {"form": exc.message}
        else:
            return browser.redirect(
                f"/apply/status/{token}", flash="Thank you: your application is back in review."
            )
    async with replica.db.read() as db:
        row = await provider_applications.by_status_token(db, replica.signer, token)
    return browser.render(
        "public/status.html",
        status=422,
        application=provider_applications.to_wire(row),
        values=values,
        errors=errors,
        models=gpu_catalog.SUPPORTED,
        weekdays=list(Weekday),
        action=f"/apply/status/{token}",
    )


# A link that shows nothing (any more) says so with the status a client can act on.
CLAIM_STATUS = {ClaimState.OPEN: 200, ClaimState.UNKNOWN: 404}


@router.get("/provider/claim/{token}")
async def claim_page(token: Token, browser: BrowserDep) -> Response:
    # A GET must not use the link up: mail scanners open links before people do.
    return await _claim_link_page(browser, token)


async def _claim_link_page(browser: Browser, token: str, error: str | None = None) -> Response:
    """The link before it shows anything: its button while it is open, else what became of
    it (used when, expired, unknown) and what to do, with no button."""
    async with browser.replica.db.read() as db:
        link = await provider_applications.claim_link(db, token, browser.now())
    return browser.render(
        "public/claim.html",
        status=CLAIM_STATUS.get(link.state, 410),
        token=token,
        claim=None,
        link=link,
        error=error if link.state == ClaimState.OPEN else None,
    )


@router.post("/provider/claim/{token}")
async def claim(token: Token, browser: BrowserDep) -> Response:
    await form_of(browser)
    replica = browser.replica
    try:
        async with replica.db.write() as db:
            claimed = await provider_applications.claim(
                db,
                token,
                browser.now(),
                install_base(replica),
                token_lifetime=enrollment_tokens.lifetime(replica.settings.enrollment_token_days),
            )
    except ApiError as exc:  # used meanwhile (another tab, a second click): the page says so
        return await _claim_link_page(browser, token, exc.message)
    return browser.render(
        "public/claim.html",
        token=token,
        claim=claimed,
        link=None,
        error=None,
        public_url=public_url(replica),
    )
