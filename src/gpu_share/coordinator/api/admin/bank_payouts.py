"""Admin: a payout batch's bank payouts as a SEPA pain.001 file, and settling them from
the bank's camt.053/054 statement (SPEC §4.5, docs/payouts.md "Bank payouts")."""

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from gpu_share.coordinator.api.auth import AdminPrincipal
from gpu_share.coordinator.api.provider.payouts import csv_response
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.core.errors import PayloadTooLarge
from gpu_share.coordinator.core.ids import id_pattern
from gpu_share.coordinator.core.orm import SepaExportRow
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.money import bank_statements, sepa_export
from gpu_share.protocol.bank_payouts import BankStatementResult, SepaExportCreate

router = APIRouter(prefix="/v1/admin", tags=["admin"])

BatchId = Annotated[str, Path(pattern=id_pattern("pbat"))]
MAX_STATEMENT_BYTES = 16 * 1024 * 1024
XML = "application/xml"
FILE: dict[int | str, dict[str, Any]] = {
    200: {"content": {XML: {}}, "description": "The pain.001.001.09 file"}
}


def _file(made: SepaExportRow) -> Response:
    return csv_response(f"payouts-{made.batch_id}.pain.001.xml", made.document, XML)


@router.post(
    "/payout-batches/{batch_id}/sepa",
    response_class=Response,
    responses={**FILE, **errors(*AUTH, 404, 409, 422)},
)
async def export_sepa(
    batch_id: BatchId, body: SepaExportCreate, _admin: AdminPrincipal, replica: ReplicaDep
) -> Response:
    """The batch's bank payouts as one SEPA credit-transfer file at the rate given (EUR
    per USDC), checked against its schema. Made once: the same file again after that (409
    for another rate). A payout worth less than a cent, or to a region not enabled, is
    marked failed instead; each one's sub-cent remainder goes back to pending."""
    async with replica.db.write() as session:
        made = await sepa_export.export(
            session,
            batch_id,
            body,
            sepa_export.Debtor.of(replica.settings),
            replica.clock.now(),
            replica.settings.mail_base_url,
        )
    return _file(made)


@router.get(
    "/payout-batches/{batch_id}/sepa",
    response_class=Response,
    responses={**FILE, **errors(*AUTH, 404, 422)},
)
async def get_sepa(batch_id: BatchId, _admin: AdminPrincipal, replica: ReplicaDep) -> Response:
    """The file made for the batch, as it was first served (404 before it is made)."""
    async with replica.db.read() as session:
        return _file(await sepa_export.sepa_file(session, batch_id))


@router.post(
    "/bank-statements",
    response_model=BankStatementResult,
    responses=errors(*AUTH, 413, 422),
    openapi_extra={"requestBody": {"content": {XML: {"schema": {"type": "string"}}}}},
)
async def import_bank_statement(
    request: Request, _admin: AdminPrincipal, replica: ReplicaDep
) -> BankStatementResult:
    """The bank's camt.053 (or camt.054) XML as the body: each booked transfer we made is
    marked paid, each returned one failed; the rest is listed and changes nothing."""
    content = bytearray()
    async for chunk in request.stream():
        content += chunk
        if len(content) > MAX_STATEMENT_BYTES:
            raise PayloadTooLarge(f"a statement may be at most {MAX_STATEMENT_BYTES} bytes")
    async with replica.db.write() as session:
        return await bank_statements.import_statement(
            session, bytes(content), replica.clock.now(), replica.settings.mail_base_url
        )
