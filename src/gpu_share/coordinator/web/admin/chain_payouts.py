"""Admin: approving a USDC payout above the operator's limits, from the Payouts page's
"Sent on Solana" section (the same service as the admin API)."""

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.core.errors import ApiError
from gpu_share.coordinator.core.ids import is_id
from gpu_share.coordinator.services.money import chain_payouts
from gpu_share.coordinator.web.pages import SignedAdmin, form_of

router = APIRouter(prefix="/admin/payouts", include_in_schema=False)


@router.post("/{payout_id}/approve")
async def approve(payout_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    await form_of(browser)  # checks the CSRF token
    if not is_id("pay", payout_id):
        return browser.redirect("/admin/payouts#on-solana", flash="No payout has that id.")
    try:
        async with browser.replica.db.write() as session:
            await chain_payouts.approve(session, payout_id, browser.now())
    except ApiError as exc:
        return browser.redirect("/admin/payouts#on-solana", flash=f"Not approved: {exc.message}")
    return browser.redirect(
        "/admin/payouts#on-solana",
        flash="Approved: the payout is sent on Solana on the next run of the payout sender.",
    )
