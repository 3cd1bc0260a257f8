"""Admin: payout batches (SPEC §3.6): each batch, its export for execution (CSV or JSON,
which records the first export), and marking each payout paid with its transaction
reference or failed with a reason (the amount returns to the provider's pending
balance). The same services as the admin API; a refused action shows the batch again
with the service's words next to the payout."""

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import ValidationError

from gpu_share.coordinator.core.errors import ApiError, NotFound
from gpu_share.coordinator.core.ids import is_id
from gpu_share.coordinator.services.money import chain_payouts, payout_batches, payouts
from gpu_share.coordinator.web.pages import Browser, SignedAdmin, form_of, text
from gpu_share.protocol.payouts import MarkFailed, MarkPaid

router = APIRouter(prefix="/admin/payouts", include_in_schema=False)


def _no_such_batch(browser: Browser) -> Response:
    return browser.render(
        "public/message.html",
        status=404,
        title="No such batch",
        message="No payout batch has that id.",
    )


@router.get("")
async def batches_page(signed: SignedAdmin) -> Response:
    browser, _ = signed
    async with browser.replica.db.read() as session:
        found = await payout_batches.batches(session)
        on_chain = await chain_payouts.open_payouts(
            session, browser.replica.settings.solana_explorer_url
        )
    return browser.render(
        "admin/payouts.html",
        batches=found,
        on_chain=on_chain,
        sends_usdc=browser.replica.settings.sends_usdc_payouts,
        minimum=browser.replica.settings.payout_minimum_micro,
        interval_min=round(browser.replica.settings.payout_interval_sec / 60),
    )


async def _batch_page(
    browser: Browser, batch_id: str, errors: dict[str, str] | None = None, status: int = 200
) -> Response:
    if not is_id("pbat", batch_id):
        return _no_such_batch(browser)
    async with browser.replica.db.read() as session:
        try:
            detail = await payout_batches.batch(session, batch_id)
        except NotFound:
            return _no_such_batch(browser)
    return browser.render(
        "admin/payout_batch.html", status=status, batch=detail, errors=errors or {}
    )


@router.get("/{batch_id}")
async def batch_page(batch_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    return await _batch_page(browser, batch_id)


@router.get("/{batch_id}/export.{fmt}")
async def export_batch(batch_id: str, fmt: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    if fmt not in ("csv", "json") or not is_id("pbat", batch_id):
        return _no_such_batch(browser)
    async with browser.replica.db.write() as session:
        try:
            name, media_type, content = await payout_batches.export(
                session, batch_id, fmt, browser.now()
            )
        except NotFound:
            return _no_such_batch(browser)
    return browser.finish(
        Response(
            content,
            media_type=media_type,
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    )


@router.post("/{batch_id}/{payout_id}/{action}")
async def settle(batch_id: str, payout_id: str, action: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    form = await form_of(browser)
    if action not in ("paid", "failed") or not is_id("pay", payout_id):
        return _no_such_batch(browser)
    field = "reference" if action == "paid" else "reason"
    key = f"{payout_id}-{field}"
    try:
        body = (
            MarkPaid(reference=text(form, field))
            if action == "paid"
            else MarkFailed(reason=text(form, field))
        )
    except ValidationError as exc:
        message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        if message.startswith("String should have at least"):
            message = (
                "enter the transaction's reference" if action == "paid" else "say why it failed"
            )
        return await _batch_page(browser, batch_id, {key: message}, status=422)
    link = browser.replica.settings.mail_base_url
    try:
        async with browser.replica.db.write() as session:
            if isinstance(body, MarkPaid):
                done = await payouts.mark_paid(
                    session, payout_id, body.reference, browser.now(), link
                )
            else:
                done = await payouts.mark_failed(
                    session, payout_id, body.reason, browser.now(), link
                )
    except ApiError as exc:
        return await _batch_page(browser, batch_id, {key: exc.message}, status=exc.status)
    said = (
        f"marked paid with reference {done.reference}"
        if action == "paid"
        else "marked failed; the amount is back in the provider's pending balance"
    )
    return browser.redirect(
        f"/admin/payouts/{batch_id}#{payout_id}", flash=f"Payout of {done.amount} USDC {said}."
    )
