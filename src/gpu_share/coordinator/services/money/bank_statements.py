"""Settling bank payouts from the bank's own statement (a camt.053 account statement or
camt.054 debit notification, ISO 20022, any version): each entry's transactions are
matched to our transfers by their end-to-end id (`sepa_export.end_to_end_id`).

- A debit booked on the account (`CdtDbtInd` DBIT, status BOOK) pays the payout: it is
  marked paid with the bank's reference (`AcctSvcrRef`, else the end-to-end id).
- A transfer the bank returned (`RtrInf` on the transaction, or a booked credit that
  carries our end-to-end id) fails the payout with the bank's reason code: its amount
  goes back to the provider's pending balance.
- Entries still pending, payouts already settled and ids that are not ours change nothing
  and are listed as such; importing the same statement twice changes nothing more.

The file is parsed with xmlschema's defused parser: no entities (so no "billion laughs"),
no external references; it is read whole, so the router caps its size.
"""

import io
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from xmlschema import XMLResource, XMLResourceError

from gpu_share.coordinator.core.errors import ValidationFailed
from gpu_share.coordinator.core.orm import BankTransferRow, PayoutRow
from gpu_share.coordinator.services.money import payouts
from gpu_share.protocol.bank_payouts import BankStatementResult
from gpu_share.protocol.payouts import PayoutStatus


@dataclass(frozen=True)
class Booking:
    end_to_end_id: str
    returned: bool
    reason: str  # the bank's return reason code, when returned
    reference: str  # the bank's reference for the booking


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child(node: ET.Element, *path: str) -> ET.Element | None:
    for name in path:
        found = next((c for c in node if _local(c.tag) == name), None)
        if found is None:
            return None
        node = found
    return node


def _text(node: ET.Element | None, *path: str) -> str:
    found = None if node is None else _child(node, *path)
    return (found.text or "").strip() if found is not None else ""


def _booked(entry: ET.Element) -> bool:
    status = _child(entry, "Sts")
    if status is None:
        return False
    code = _text(status, "Cd") or (status.text or "").strip()  # .08+ nest it in Cd
    return code == "BOOK"


def bookings(content: bytes) -> list[Booking]:
    """The booked transactions of a camt.053/054 file that carry an end-to-end id."""
    try:  # a file-like source: never taken for a path; no entities, nothing fetched
        root = XMLResource(io.BytesIO(content), defuse="always", allow="none").root
    except XMLResourceError as exc:
        raise ValidationFailed(f"the statement is not XML ({exc}): upload the camt file") from None
    if not _local(root.tag) == "Document" or not root.tag.startswith("{urn:iso:std:iso:20022"):
        raise ValidationFailed("the statement is not an ISO 20022 camt.053 or camt.054 file")
    found: list[Booking] = []
    for entry in root.iter():
        if _local(entry.tag) != "Ntry" or not _booked(entry):
            continue
        credit = _text(entry, "CdtDbtInd") == "CRDT"
        for details in (n for n in entry.iter() if _local(n.tag) == "TxDtls"):
            e2e = _text(details, "Refs", "EndToEndId")
            if not e2e or e2e == "NOTPROVIDED":
                continue
            returned_info = _child(details, "RtrInf")
            reason = _text(returned_info, "Rsn", "Cd") if returned_info is not None else ""
            reference = _text(details, "Refs", "AcctSvcrRef") or _text(entry, "AcctSvcrRef") or e2e
            found.append(
                Booking(e2e, credit or returned_info is not None, reason or "returned", reference)
            )
    return found


async def import_statement(
    session: AsyncSession, content: bytes, now: datetime, base_url: str
) -> BankStatementResult:
    result = BankStatementResult(booked=[], returned=[], already_settled=[], unknown=[])
    for booking in bookings(content):
        payout_id = await session.scalar(
            select(BankTransferRow.payout_id).where(
                BankTransferRow.end_to_end_id == booking.end_to_end_id
            )
        )
        if payout_id is None:
            result.unknown.append(booking.end_to_end_id)
            continue
        status = await session.scalar(select(PayoutRow.status).where(PayoutRow.id == payout_id))
        if status != PayoutStatus.IN_TRANSIT.value:
            result.already_settled.append(payout_id)
        elif booking.returned:
            why = f"the bank returned the transfer (reason {booking.reason}): check your IBAN"
            await payouts.mark_failed(session, payout_id, why, now, base_url)
            result.returned.append(payout_id)
        else:
            await payouts.mark_paid(session, payout_id, booking.reference[:200], now, base_url)
            result.booked.append(payout_id)
    return result
