"""The admin's overview (what waits for them, counts across the platform) and the mail
outbox (every mail the platform sent or still has to send)."""

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.services.mail import outbox
from gpu_share.coordinator.services.platform import overview
from gpu_share.coordinator.services.providers import provider_applications
from gpu_share.coordinator.web.pages import SignedAdmin
from gpu_share.protocol import provider_applications as wire

router = APIRouter(prefix="/admin", include_in_schema=False)

OUTBOX_LIMIT = 200


@router.get("")
async def overview_page(signed: SignedAdmin) -> Response:
    browser, _ = signed
    replica = browser.replica
    async with replica.db.read() as db:
        counts = await overview.counts(db, browser.now(), replica.settings)
        waiting = await provider_applications.list_applications(
            db, wire.ApplicationStatus.PENDING, limit=5
        )
    return browser.render("admin/overview.html", counts=counts, waiting=waiting)


@router.get("/outbox")
async def outbox_page(signed: SignedAdmin, waiting: bool = False) -> Response:
    browser, _ = signed
    async with browser.replica.db.read() as db:
        mails = await outbox.list_mails(db, unsent_only=waiting, limit=OUTBOX_LIMIT)
        unsent = await overview.mails_waiting(db)
    return browser.render(
        "admin/outbox.html",
        mails=mails,
        waiting=waiting,
        mails_waiting=unsent,
        limit=OUTBOX_LIMIT,
        smtp=bool(browser.replica.settings.smtp_host),
    )
