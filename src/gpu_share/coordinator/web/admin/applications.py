"""Provider applications (SPEC §3.1): the list by status, one application, and its
review: approve into a tier (the claim link shown this once), reject with a reason, or ask
the applicant for more information."""

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.core.errors import ApiError, NotFound
from gpu_share.coordinator.core.ids import is_id
from gpu_share.coordinator.services.platform import overview
from gpu_share.coordinator.services.providers import provider_applications
from gpu_share.coordinator.web.admin.forms import choice, not_found, validated
from gpu_share.coordinator.web.pages import Browser, SignedAdmin, form_of, text
from gpu_share.protocol import accounts as accounts_wire
from gpu_share.protocol import provider_applications as wire
from gpu_share.protocol.nodes import Tier

router = APIRouter(prefix="/admin", include_in_schema=False)

APPLICATION_TABS = [
    ("", "All"),
    *((s.value, s.value.replace("_", " ").capitalize()) for s in wire.ApplicationStatus),
]


def _field_message(exc: ApiError, field: str) -> str | None:
    """The service's message about one field (a `field_error`), if it is about that field."""
    for detail in exc.details if isinstance(exc.details, list) else []:
        if isinstance(detail, dict) and list(detail.get("loc", []))[-1:] == [field]:
            return str(detail.get("msg", exc.message))
    return None


@router.get("/applications")
async def applications_page(signed: SignedAdmin, status: str = "") -> Response:
    browser, _ = signed
    chosen = choice(wire.ApplicationStatus, status)
    async with browser.replica.db.read() as db:
        listed = await provider_applications.list_applications(db, chosen)
        by_status = await overview.applications_by_status(db)
    if chosen is None:  # the open ones first, newest first within each group
        listed.sort(key=lambda a: not a.status.open)
    return browser.render(
        "admin/applications.html",
        applications=listed,
        filters=APPLICATION_TABS,
        current=chosen.value if chosen else "",
        counts={"": sum(by_status.values()), **by_status},
    )


async def _application(browser: Browser, application_id: str) -> wire.ProviderApplication:
    if not is_id("papp", application_id):
        raise NotFound(f"provider application {application_id} does not exist")
    async with browser.replica.db.read() as db:
        return await provider_applications.get(db, application_id)


def _application_view(
    browser: Browser,
    application: wire.ProviderApplication,
    *,
    values: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
    approved: wire.Approved | None = None,
    status: int = 200,
) -> Response:
    return browser.render(
        "admin/application.html",
        status=status,
        application=application,
        # Without a UPS only Community is accepted; with one, the admin picks deliberately.
        values={"tier": "" if application.ups else Tier.COMMUNITY.value, **(values or {})},
        errors=errors or {},
        approved=approved,
        tiers=list(Tier),
    )


@router.get("/applications/{application_id}")
async def application_page(application_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    try:
        application = await _application(browser, application_id)
    except NotFound as exc:
        return not_found(browser, exc.message)
    return _application_view(browser, application)


@router.post("/applications/{application_id}/approve")
async def approve_application(application_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    form = await form_of(browser)
    values = {"tier": text(form, "tier")}
    try:
        application = await _application(browser, application_id)
    except NotFound as exc:
        return not_found(browser, exc.message)
    errors: dict[str, str] = {}
    tier = choice(Tier, values["tier"])
    if tier is None:
        errors["tier"] = "Choose Enterprise or Community"
        return _application_view(browser, application, values=values, errors=errors, status=422)
    replica = browser.replica
    try:
        async with replica.db.write() as db:
            approved = await provider_applications.approve(
                db,
                application.id,
                tier,
                browser.now(),
                replica.settings.mail_base_url,
            )
    except ApiError as exc:  # Enterprise without a UPS is about the tier; the rest is not
        about_tier = _field_message(exc, "tier")
        errors = {"tier": about_tier} if about_tier else {"form": exc.message}
        application = await _application(browser, application_id)
        return _application_view(
            browser, application, values=values, errors=errors, status=exc.status
        )
    return _application_view(browser, approved.application, approved=approved)


@router.post("/applications/{application_id}/reject")
async def reject_application(application_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    form = await form_of(browser)
    values = {"reason": text(form, "reason")}
    errors: dict[str, str] = {}
    try:
        application = await _application(browser, application_id)
    except NotFound as exc:
        return not_found(browser, exc.message)
    body = validated(accounts_wire.Rejection, values, errors, {"reason": "reason"})
    if body is not None:
        try:
            async with browser.replica.db.write() as db:
                await provider_applications.reject(db, application.id, body.reason, browser.now())
        except ApiError as exc:
            errors["form"] = exc.message
        else:
            return browser.redirect(
                f"/admin/applications/{application.id}",
                flash=f"Application rejected; {application.email} is mailed the reason.",
            )
    application = await _application(browser, application_id)
    return _application_view(browser, application, values=values, errors=errors, status=422)


@router.post("/applications/{application_id}/request-info")
async def request_information(application_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    form = await form_of(browser)
    values = {"message": text(form, "message")}
    errors: dict[str, str] = {}
    try:
        application = await _application(browser, application_id)
    except NotFound as exc:
        return not_found(browser, exc.message)
    body = validated(wire.InfoRequest, values, errors, {"message": "message"})
    if body is not None:
        replica = browser.replica
        try:
            async with replica.db.write() as db:
                await provider_applications.request_info(
                    db,
                    application.id,
                    body.message,
                    browser.now(),
                    replica.settings.mail_base_url,
                    replica.signer,
                )
        except ApiError as exc:
            errors["form"] = exc.message
        else:
            return browser.redirect(
                f"/admin/applications/{application.id}",
                flash=f"Information requested; {application.email} is mailed your message "
                "and a link to update the application.",
            )
    application = await _application(browser, application_id)
    return _application_view(browser, application, values=values, errors=errors, status=422)
