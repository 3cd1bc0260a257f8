"""Admin: a batch's bank payouts as a SEPA file, and the bank's statement uploaded to
settle them (docs/payouts.md, "Bank payouts"). The same services as
`api/admin/bank_payouts.py`; a refused action is a page saying why, changing nothing."""

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from gpu_share.coordinator.core.errors import ApiError
from gpu_share.coordinator.core.ids import is_id
from gpu_share.coordinator.core.orm import SepaExportRow
from gpu_share.coordinator.services.money import bank_statements, sepa_export
from gpu_share.coordinator.web.pages import Browser, SignedAdmin, form_of, text
from gpu_share.protocol.bank_payouts import SepaExportCreate

router = APIRouter(prefix="/admin", include_in_schema=False)

MAX_STATEMENT_BYTES = 16 * 1024 * 1024


def _refused(browser: Browser, status: int, title: str, message: str) -> Response:
    return browser.render("public/message.html", status=status, title=title, message=message)


def _download(browser: Browser, made: SepaExportRow) -> Response:
    name = f"payouts-{made.batch_id}.pain.001.xml"
    return browser.finish(
        Response(
            made.document,
            media_type="application/xml",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    )


@router.post("/payouts/{batch_id}/sepa")
async def export_sepa(batch_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    form = await form_of(browser)
    if not is_id("pbat", batch_id):
        return _refused(browser, 404, "No such batch", "No payout batch has that id.")
    try:
        ask = SepaExportCreate(
            eur_per_usdc=text(form, "eur_per_usdc"),
            execution_date=text(form, "execution_date") or None,
        )
    except ValidationError as exc:
        message = "; ".join(
            f"{e['loc'][-1]}: {str(e['msg']).removeprefix('Value error, ')}" for e in exc.errors()
        )
        return _refused(browser, 422, "The bank file was not made", message)
    replica = browser.replica
    try:
        async with replica.db.write() as session:
            made = await sepa_export.export(
                session,
                batch_id,
                ask,
                sepa_export.Debtor.of(replica.settings),
                browser.now(),
                replica.settings.mail_base_url,
            )
    except ApiError as exc:
        return _refused(browser, exc.status, "The bank file was not made", exc.message)
    return _download(browser, made)


@router.post("/bank-statements")
async def import_statement(signed: SignedAdmin) -> Response:
    browser, _ = signed
    form = await form_of(browser)
    upload = form.get("statement")
    if not isinstance(upload, UploadFile):
        return _refused(browser, 422, "No statement", "Choose the bank's camt.053 file to upload.")
    content = await upload.read(MAX_STATEMENT_BYTES + 1)
    if len(content) > MAX_STATEMENT_BYTES:
        return _refused(browser, 413, "Too large", "A statement may be at most 16 MiB.")
    replica = browser.replica
    try:
        async with replica.db.write() as session:
            result = await bank_statements.import_statement(
                session, content, browser.now(), replica.settings.mail_base_url
            )
    except ApiError as exc:
        return _refused(browser, exc.status, "The statement was not read", exc.message)
    return browser.redirect(
        "/admin/payouts",
        flash=f"Bank statement read: {len(result.booked)} paid, {len(result.returned)} returned "
        f"(failed), {len(result.already_settled)} settled before, {len(result.unknown)} not ours.",
    )
