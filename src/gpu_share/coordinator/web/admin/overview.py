"""The admin's overview (what waits for them, the platform's money from the ledger,
counts across the platform) and the mail outbox (every mail the platform sent, still has
to send, or gave up, with why)."""

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.services.mail import outbox
from gpu_share.coordinator.services.money import books
from gpu_share.coordinator.services.platform import overview
from gpu_share.coordinator.services.providers import provider_applications
from gpu_share.coordinator.services.trust import incidents, spot_checks
from gpu_share.coordinator.web.admin.forms import choice
from gpu_share.coordinator.web.pages import SignedAdmin
from gpu_share.protocol import provider_applications as wire
from gpu_share.protocol.outbox import OutboxState

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
        checks_waiting = await spot_checks.waiting(db)
        caught = len(await incidents.listed(db, limit=incidents.LIST_LIMIT))
        money = await books.platform_money(db, browser.now(), replica.settings.payout_minimum_micro)
    return browser.render(
        "admin/overview.html",
        counts=counts,
        money=money,
        billing=replica.settings.billing.value,
        waiting=waiting,
        checks_waiting=checks_waiting,
        caught=caught,
    )


@router.get("/outbox")
async def outbox_page(signed: SignedAdmin, show: str = "", waiting: bool = False) -> Response:
    """`show` is waiting or failed; `waiting=true` is what older links say for waiting."""
    browser, _ = signed
    state = OutboxState.WAITING if waiting else choice(OutboxState, show)
    async with browser.replica.db.read() as db:
        mails = await outbox.list_mails(db, state=state, limit=OUTBOX_LIMIT)
        unsent = await overview.mails_waiting(db)
        failed = await overview.mails_failed(db)
    return browser.render(
        "admin/outbox.html",
        mails=mails,
        show=state.value if state else "",
        counts={OutboxState.WAITING.value: unsent, OutboxState.FAILED.value: failed},
        limit=OUTBOX_LIMIT,
        smtp=bool(browser.replica.settings.smtp_host),
    )
