"""A payout batch's bank payouts as one SEPA credit-transfer file (pain.001.001.09,
ISO 20022), made once per batch at a rate the admin gives (SPEC §3.6, §4.5).

Payouts are owed in micro-USDC; a SEPA transfer is in euro cents. The admin gives the
rate (EUR for one USDC) when exporting; it is recorded on the batch. Each payout is
paid `floor(micro × rate / 10⁴)` cents; the micro-USDC those cents cover is
`ceil(cents × 10⁴ / rate)`, and what is left over (less than one cent's worth) goes back
to the provider's pending balance as a PAYOUT_REMAINDER (cause
``payout:<id>:remainder``), so nothing is lost: it is paid with a later payout. A
payout worth less than one cent at the rate is marked failed instead (all of it back to
pending). A bank payout to a country the operator has not enabled is marked failed too.

The file is checked against the pain.001.001.09 schema before it is kept; it is kept as
served, so exporting again gives the same file (another rate: 409). Each transfer's
end-to-end id is its payout id with `-` for `_` (SEPA's character set has no `_`): the
bank's statement reports it, and `bank_statements` matches it back.
"""

from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

from sepaxml import SepaTransfer  # type: ignore[import-untyped]
from sepaxml.validation import ValidationError as SchemaError  # type: ignore[import-untyped]
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import Conflict, NotFound, field_error
from gpu_share.coordinator.core.orm import (
    BankTransferRow,
    PayoutBatchRow,
    PayoutRow,
    SepaExportRow,
)
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.money import ledger, payouts
from gpu_share.coordinator.services.money.ledger import TransactionKind, transfer
from gpu_share.protocol.bank_payouts import SepaExportCreate
from gpu_share.protocol.bank_regions import describe, region_countries
from gpu_share.protocol.money import usdc_text
from gpu_share.protocol.payouts import PayoutStatus

SCHEMA = "pain.001.001.09"
MICRO_PER_CENT_AT_ONE = Decimal(10_000)  # micro-USDC in one cent at 1 EUR per USDC


@dataclass(frozen=True)
class Debtor:
    """The platform's account the transfers leave from (GPUSHARE_SEPA_DEBTOR_*)."""

    name: str
    iban: str
    bic: str
    countries: frozenset[str]  # where bank payouts may go
    regions: str  # the same, as the operator named them

    @classmethod
    def of(cls, settings: Settings) -> "Debtor":
        return cls(
            name=settings.sepa_debtor_name.strip(),
            iban=settings.sepa_debtor_iban,
            bic=settings.sepa_debtor_bic,
            countries=region_countries(settings.bank_payout_regions),
            regions=describe(settings.bank_payout_regions),
        )


def end_to_end_id(payout_id: str) -> str:
    return payout_id.replace("_", "-")


def cents_of(amount_micro: int, rate: Decimal) -> tuple[int, int]:
    """(cents paid, micro-USDC those cents do not cover) for a payout at `rate`."""
    cents = int((amount_micro * rate / MICRO_PER_CENT_AT_ONE).to_integral_value(ROUND_FLOOR))
    if cents == 0:
        return 0, amount_micro
    covered = int((cents * MICRO_PER_CENT_AT_ONE / rate).to_integral_value(ROUND_CEILING))
    return cents, amount_micro - covered


async def sepa_file(session: AsyncSession, batch_id: str) -> SepaExportRow:
    found = await session.get(SepaExportRow, batch_id)
    if found is None:
        if await session.get(PayoutBatchRow, batch_id) is None:
            raise NotFound(f"no payout batch {batch_id}")
        raise NotFound(f"batch {batch_id} has no bank file yet: export it with a rate first")
    return found


async def export(
    session: AsyncSession,
    batch_id: str,
    ask: SepaExportCreate,
    debtor: Debtor,
    now: datetime,
    base_url: str,
) -> SepaExportRow:
    """The batch's pain.001 file, made on the first call and the same on every later one
    (409 if a later one names another rate). Nothing is written when it fails."""
    batch = (
        await session.execute(
            select(PayoutBatchRow).where(PayoutBatchRow.id == batch_id).with_for_update()
        )
    ).scalar_one_or_none()
    if batch is None:
        raise NotFound(f"no payout batch {batch_id}")
    rate = Decimal(ask.eur_per_usdc)
    made = await session.get(SepaExportRow, batch_id)
    if made is not None:
        if Decimal(made.eur_per_usdc) != rate:
            raise Conflict(
                f"batch {batch_id} was exported at {made.eur_per_usdc} EUR per USDC; its file "
                "is made once, so export it again at that rate or without changing it",
                details={"eur_per_usdc": made.eur_per_usdc},
            )
        return made
    if not (debtor.name and debtor.iban and debtor.bic):
        raise Conflict(
            "the platform's bank account is not configured: set GPUSHARE_SEPA_DEBTOR_NAME, "
            "GPUSHARE_SEPA_DEBTOR_IBAN and GPUSHARE_SEPA_DEBTOR_BIC"
        )
    today = now.astimezone(UTC).date()
    day = ask.execution_date or today
    if day < today:
        raise field_error("execution_date", f"must be today ({today.isoformat()}) or later")
    rows = (
        await session.scalars(
            select(PayoutRow)
            .where(
                PayoutRow.batch_id == batch_id,
                PayoutRow.status == PayoutStatus.IN_TRANSIT.value,
            )
            .order_by(PayoutRow.id)
        )
    ).all()
    transfers: list[tuple[PayoutRow, int, int]] = []
    for row in rows:
        if row.method.get("kind") != "bank_transfer":
            continue
        why = _not_payable(row, rate, debtor)
        if why is not None:
            await payouts.mark_failed(session, row.id, why, now, base_url)
            continue
        cents, remainder = cents_of(row.amount_micro, rate)
        transfers.append((row, cents, remainder))
    if not transfers:
        raise Conflict(
            f"batch {batch_id} has no bank payout in transit that a SEPA file can pay",
        )
    document = _document(batch, transfers, debtor, day, now)
    made = SepaExportRow(
        batch_id=batch_id,
        message_id=message_id(batch_id),
        eur_per_usdc=ask.eur_per_usdc,
        execution_date=day.isoformat(),
        total_cents=sum(cents for _, cents, _ in transfers),
        document=document,
        created_at=now,
    )
    session.add(made)
    await session.flush()  # before the transfers that refer to it
    for row, cents, remainder in transfers:
        await _return_remainder(session, row, remainder, now)
        session.add(
            BankTransferRow(
                payout_id=row.id,
                batch_id=batch_id,
                end_to_end_id=end_to_end_id(row.id),
                amount_cents=cents,
                remainder_micro=remainder,
            )
        )
    # The batch's `exported_at` stays as it was: it says an admin took the whole batch
    # to pay by hand, and this file pays its bank payouts only (its USDC payouts are
    # still the platform's to send on Solana, `chain_payouts`).
    await session.flush()
    return made


def message_id(batch_id: str) -> str:
    return batch_id.replace("_", "-")  # 31 characters: the schema allows 35


def _not_payable(row: PayoutRow, rate: Decimal, debtor: Debtor) -> str | None:
    country = str(row.method.get("iban", ""))[:2]
    if country not in debtor.countries:
        return (
            f"bank payouts go only to accounts in {debtor.regions}, and this IBAN is in "
            f"{country}: choose another payout method; the amount is back in your balance"
        )
    if cents_of(row.amount_micro, rate)[0] == 0:
        return (
            f"{usdc_text(row.amount_micro)} USDC is less than one euro cent at {rate} EUR per "
            "USDC: the amount is back in your balance and is paid with a later payout"
        )
    return None


async def _return_remainder(
    session: AsyncSession, row: PayoutRow, remainder: int, now: datetime
) -> None:
    if remainder == 0:
        return
    await ledger.post(
        session,
        cause=f"payout:{row.id}:remainder",
        kind=TransactionKind.PAYOUT_REMAINDER,
        entries=transfer(
            ledger.payouts_in_transit(row.provider_id),
            ledger.provider_pending(row.provider_id),
            remainder,
        ),
        now=now,
        details={"payout_id": row.id, "provider_id": row.provider_id},
    )
    row.amount_micro -= remainder  # what stays in transit: what the bank pays


def _document(
    batch: PayoutBatchRow,
    transfers: list[tuple[PayoutRow, int, int]],
    debtor: Debtor,
    day: date,
    now: datetime,
) -> str:
    sepa = SepaTransfer(
        {
            "name": debtor.name,
            "IBAN": debtor.iban,
            "BIC": debtor.bic,
            "batch": True,
            "currency": "EUR",
        },
        schema=SCHEMA,
        clean=True,
    )
    for row, cents, _ in transfers:
        payment: dict[str, Any] = {
            "name": str(row.method.get("account_holder", "")),
            "IBAN": str(row.method.get("iban", "")),
            "BIC": str(row.method.get("bic", "")),
            "amount": cents,
            "execution_date": day,
            "description": f"GPU Share payout {batch.period} {row.id}",
            "endtoend_id": end_to_end_id(row.id),
        }
        sepa.add_payment(payment)
    header = sepa._xml.find("CstmrCdtTrfInitn/GrpHdr")  # the library picks both at random
    header.find("MsgId").text = message_id(batch.id)
    header.find("CreDtTm").text = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    try:
        return bytes(sepa.export(validate=True, pretty_print=True)).decode()
    except SchemaError as exc:
        why = f"the bank file for batch {batch.id} does not pass its schema: {exc.__cause__}"
        raise Conflict(why) from exc
