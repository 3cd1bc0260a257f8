"""Bank payouts as SEPA files (docs/payouts.md, "Bank payouts"), on SQLite and
PostgreSQL: a batch's bank payouts exported once as a pain.001.001.09 file that passes
its schema (checked here again with xmlschema against the XSD), at a rate recorded on
the batch, each payout rounded down to cents with the remainder back in pending; then
settled from the bank's camt.053 statement, matched by end-to-end id."""

import asyncio
from datetime import UTC, datetime
from fractions import Fraction
from math import ceil
from pathlib import Path
from xml.etree import ElementTree as ET

import httpx
import pytest
import sepaxml  # type: ignore[import-untyped]
import xmlschema
from fastapi import FastAPI
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select

from gpu_share.coordinator.core.orm import PayoutRow, SepaExportRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.loops import payouts as payout_loop
from gpu_share.coordinator.services.money.sepa_export import cents_of
from gpu_share.protocol.money import usdc_text
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.earnings import move_to, post_charge
from gpu_share.testing.factories import ADMIN, ProviderHandle, create_provider
from tests.coordinator.services.money.test_payouts import (
    BANK,
    MONDAY,
    SOLANA,
    books_balance,
    count,
    in_transit,
    mails_about,
    pending,
    replica_of,
    set_method,
)

PAIN_001 = Path(sepaxml.__file__).parent / "schemas" / "pain.001.001.09.xsd"
NS = {"p": "urn:iso:std:iso:20022:tech:xsd:pain.001.001.09"}
FRENCH = {
    "kind": "bank_transfer",
    "account_holder": "Ferme à GPU SARL",
    "iban": "FR14 2004 1010 0505 0001 3M02 606",
    "bic": "BNPAFRPPXXX",
}
RATE = "0.9213"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "sepa_debtor_name": "GPU Share Ltd",
            "sepa_debtor_iban": "GB33BUKB20201555555555",
            "sepa_debtor_bic": "BUKBGB22",
        }
    )


def expected_cents(micro: int, rate: str) -> tuple[int, int]:
    """(cents, covered micro-USDC), worked out with exact fractions."""
    exact = Fraction(rate)
    cents = int(Fraction(micro) * exact // 10_000)
    return cents, ceil(Fraction(cents * 10_000) / exact)


async def bank_batch(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> tuple[str, dict[str, ProviderHandle], dict[str, int]]:
    """A weekly batch paying two bank accounts and one Solana wallet."""
    french = await create_provider(client, "Ferme GPU")
    wallet = await create_provider(client, "Wallet Farm")
    await set_method(client, provider, BANK, "weekly")
    await set_method(client, french, FRENCH, "weekly")
    await set_method(client, wallet, SOLANA, "weekly")
    owed = {provider.id: 12_345_678, french.id: 10_000_001, wallet.id: 20_000_000}
    friday = datetime(2026, 12, 4, 15, tzinfo=UTC)
    for provider_id, micro in owed.items():
        await post_charge(replica_of(app).db, provider_id, at=friday, provider_micro=micro)
    move_to(clock, MONDAY)
    [batch_id] = await payout_loop.run_once(replica_of(app))
    return batch_id, {"de": provider, "fr": french, "sol": wallet}, owed


async def payout_of(app: FastAPI, provider_id: str) -> PayoutRow:
    async with replica_of(app).db.read() as session:
        found = await session.scalar(select(PayoutRow).where(PayoutRow.provider_id == provider_id))
        assert found is not None
        return found


async def test_a_batch_exports_its_bank_payouts_as_a_valid_pain_001_once(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    batch_id, who, owed = await bank_batch(app, client, provider, clock)
    url = f"/v1/admin/payout-batches/{batch_id}/sepa"
    assert (await client.get(url, headers=ADMIN)).status_code == 404  # not made yet

    made = await client.post(url, json={"eur_per_usdc": RATE}, headers=ADMIN)
    assert made.status_code == 200, made.text
    assert made.headers["content-type"].startswith("application/xml")
    assert "pain.001.xml" in made.headers["content-disposition"]
    xmlschema.XMLSchema(str(PAIN_001)).validate(made.text)  # raises if it does not pass

    root = ET.fromstring(made.text)
    message_id = root.findtext("p:CstmrCdtTrfInitn/p:GrpHdr/p:MsgId", namespaces=NS)
    assert message_id == batch_id.replace("_", "-")
    debtor = root.find("p:CstmrCdtTrfInitn/p:PmtInf", NS)
    assert debtor is not None
    assert debtor.findtext("p:DbtrAcct/p:Id/p:IBAN", namespaces=NS) == "GB33BUKB20201555555555"
    assert debtor.findtext("p:ReqdExctnDt/p:Dt", namespaces=NS) == "2026-12-07"
    transfers = {
        tx.findtext("p:CdtrAcct/p:Id/p:IBAN", namespaces=NS): tx
        for tx in debtor.findall("p:CdtTrfTxInf", NS)
    }
    assert set(transfers) == {"DE89370400440532013000", "FR1420041010050500013M02606"}
    total_cents = 0
    for country, iban in (("de", "DE89370400440532013000"), ("fr", "FR1420041010050500013M02606")):
        handle = who[country]
        row = await payout_of(app, handle.id)
        cents, covered = expected_cents(owed[handle.id], RATE)
        tx = transfers[iban]
        amount = tx.find("p:Amt/p:InstdAmt", NS)
        assert amount is not None and amount.get("Ccy") == "EUR"
        assert amount.text == f"{cents // 100}.{cents % 100:02d}"
        assert tx.findtext("p:PmtId/p:EndToEndId", namespaces=NS) == row.id.replace("_", "-")
        # the bank pays the cents; what they do not cover is payable again, nothing lost
        assert row.amount_micro == covered == await in_transit(app, handle.id)
        assert await pending(app, handle.id) == owed[handle.id] - covered > 0
        total_cents += cents
    assert debtor.findtext("p:CtrlSum", namespaces=NS) == f"{total_cents / 100:.2f}"
    assert "Ferme a GPU SARL" in made.text  # SEPA's character set: no accents
    # the Solana payout is not a bank payout: untouched
    assert await in_transit(app, who["sol"].id) == owed[who["sol"].id]

    again = await client.post(url, json={"eur_per_usdc": "0.92130"}, headers=ADMIN)
    assert (again.status_code, again.text) == (200, made.text)  # the same rate, the same file
    assert (await client.get(url, headers=ADMIN)).text == made.text
    other = await client.post(url, json={"eur_per_usdc": "0.95"}, headers=ADMIN)
    assert other.status_code == 409 and "0.9213" in other.json()["error"]["message"]
    assert (
        await pending(app, provider.id)
        == owed[provider.id] - expected_cents(owed[provider.id], RATE)[1]
    )  # the refused export moved nothing
    batch = (await client.get(f"/v1/admin/payout-batches/{batch_id}", headers=ADMIN)).json()
    # the bank file pays the bank payouts only: the batch is not taken by hand, so its
    # USDC payouts stay the platform's to send on Solana
    assert batch["exported_at"] is None
    await books_balance(app)

    # the provider's statement names the transfer as the bank will report it
    row = await payout_of(app, provider.id)
    statement = await client.get(
        "/v1/provider/statements/2026-12", headers={"Authorization": f"Bearer {provider.key}"}
    )
    [listed] = statement.json()["payouts"]
    assert (listed["id"], listed["method"], listed["status"]) == (
        row.id,
        "bank_transfer",
        "in_transit",
    )
    assert listed["reference"] == row.id.replace("_", "-")
    assert listed["amount"] == usdc_text(row.amount_micro)

    # marked paid: exactly what the bank paid leaves the books
    paid = await client.post(
        f"/v1/admin/payouts/{row.id}/paid", json={"reference": "bank"}, headers=ADMIN
    )
    covered = expected_cents(owed[provider.id], RATE)[1]
    assert paid.status_code == 200 and paid.json()["amount"] == usdc_text(covered)
    assert await in_transit(app, provider.id) == 0
    await books_balance(app)


@pytest.mark.parametrize(
    ("body", "fix"),
    [
        ({"eur_per_usdc": "0"}, "above 0"),
        ({"eur_per_usdc": "-1"}, "above 0"),
        ({"eur_per_usdc": "1e3"}, "decimal text"),
        ({"eur_per_usdc": "0.123456789"}, "8 decimals"),
        ({}, "eur_per_usdc"),
        ({"eur_per_usdc": "0.92", "execution_date": "2026-12-06"}, "today (2026-12-07) or later"),
    ],
)
async def test_a_bad_export_request_says_what_to_fix_and_writes_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    clock: FrozenClock,
    body: dict[str, str],
    fix: str,
) -> None:
    batch_id, _, owed = await bank_batch(app, client, provider, clock)
    refused = await client.post(
        f"/v1/admin/payout-batches/{batch_id}/sepa", json=body, headers=ADMIN
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "VALIDATION_ERROR"
    assert fix in refused.text
    assert await count(app, SepaExportRow) == 0
    assert await in_transit(app, provider.id) == owed[provider.id]


async def test_without_the_platforms_bank_account_the_export_is_refused(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    batch_id, _, _ = await bank_batch(app, client, provider, clock)
    replica_of(app).settings.sepa_debtor_iban = ""
    refused = await client.post(
        f"/v1/admin/payout-batches/{batch_id}/sepa", json={"eur_per_usdc": "1"}, headers=ADMIN
    )
    assert refused.status_code == 409
    assert "GPUSHARE_SEPA_DEBTOR_IBAN" in refused.json()["error"]["message"]
    assert await count(app, SepaExportRow) == 0
    missing = await client.post(
        "/v1/admin/payout-batches/pbat_00000000000000000000000000/sepa",
        json={"eur_per_usdc": "1"},
        headers=ADMIN,
    )
    assert missing.status_code == 404


async def test_payouts_a_file_cannot_pay_are_failed_back_to_pending(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    """Worth less than a cent at the rate, or to a region no longer enabled: failed, with
    the reason mailed, the amount payable again; the rest is in the file."""
    tiny = await create_provider(client, "Tiny Farm")
    french = await create_provider(client, "Ferme GPU")
    await set_method(client, provider, BANK, "monthly")
    await set_method(client, tiny, BANK, "monthly")
    await set_method(client, french, FRENCH, "monthly")
    db = replica_of(app).db
    july = datetime(2026, 7, 20, tzinfo=UTC)
    await post_charge(db, provider.id, at=july, provider_micro=5_000_000)
    await post_charge(db, tiny.id, at=july, provider_micro=9_999)  # 0.009999 EUR at 1:1
    await post_charge(db, french.id, at=july, provider_micro=7_000_000)
    move_to(clock, datetime(2026, 8, 3, 9, tzinfo=UTC))
    made = await payout_loop.run_once(replica_of(app))
    async with db.read() as session:
        batch_id = await session.scalar(
            select(PayoutRow.batch_id).where(PayoutRow.provider_id == tiny.id)
        )
    assert batch_id in made
    replica_of(app).settings.bank_payout_regions = ["DE"]
    exported = await client.post(
        f"/v1/admin/payout-batches/{batch_id}/sepa", json={"eur_per_usdc": "1"}, headers=ADMIN
    )
    assert exported.status_code == 200, exported.text
    assert "DE89370400440532013000" in exported.text
    assert "FR14" not in exported.text and tiny.id.replace("_", "-") not in exported.text
    small, foreign = await payout_of(app, tiny.id), await payout_of(app, french.id)
    assert small.status == foreign.status == "failed"
    assert "less than one euro cent" in (small.failure_reason or "")
    assert "only to accounts in DE" in (foreign.failure_reason or "")
    assert await pending(app, tiny.id) == 9_999 and await pending(app, french.id) == 7_000_000
    assert await mails_about(app, small.id) == [f"{small.id}:created", f"{small.id}:failed"]
    assert await in_transit(app, provider.id) == 5_000_000  # at 1:1, cents cover it all
    await books_balance(app)


def camt_053(entries: list[str]) -> bytes:
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<Document xmlns="urn:iso:std:iso:20022:tech:xsd:camt.053.001.02">
 <BkToCstmrStmt>
  <GrpHdr><MsgId>STMT-2026-12-08</MsgId><CreDtTm>2026-12-08T06:00:00</CreDtTm></GrpHdr>
  <Stmt>
   <Id>STMT-1</Id><CreDtTm>2026-12-08T06:00:00</CreDtTm>
   <Acct><Id><IBAN>GB33BUKB20201555555555</IBAN></Id></Acct>
   {"".join(entries)}
  </Stmt>
 </BkToCstmrStmt>
</Document>""".encode()


def entry(e2e: str, *, sign: str = "DBIT", status: str = "BOOK", extra: str = "") -> str:
    return f"""<Ntry><Amt Ccy="EUR">11.37</Amt><CdtDbtInd>{sign}</CdtDbtInd><Sts>{status}</Sts>
    <BookgDt><Dt>2026-12-08</Dt></BookgDt><ValDt><Dt>2026-12-08</Dt></ValDt>
    <AcctSvcrRef>BANK-{e2e[-6:]}</AcctSvcrRef>
    <BkTxCd><Domn><Cd>PMNT</Cd><Fmly><Cd>ICDT</Cd><SubFmlyCd>ESCT</SubFmlyCd></Fmly></Domn></BkTxCd>
    <NtryDtls><TxDtls><Refs><EndToEndId>{e2e}</EndToEndId></Refs>{extra}</TxDtls></NtryDtls></Ntry>"""


async def test_the_banks_statement_settles_booked_and_returned_transfers_once(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    batch_id, who, owed = await bank_batch(app, client, provider, clock)
    url = f"/v1/admin/payout-batches/{batch_id}/sepa"
    assert (await client.post(url, json={"eur_per_usdc": RATE}, headers=ADMIN)).status_code == 200
    de, fr = await payout_of(app, who["de"].id), await payout_of(app, who["fr"].id)
    e2e_de, e2e_fr = de.id.replace("_", "-"), fr.id.replace("_", "-")
    returned = "<RtrInf><Rsn><Cd>AC04</Cd></Rsn></RtrInf>"
    statement = camt_053(
        [
            entry(e2e_fr, status="PDNG"),  # not booked yet: nothing happens
            entry(e2e_de),
            entry(e2e_fr, sign="CRDT", extra=returned),
            entry("SOMEONE-ELSES-PAYMENT"),
        ]
    )
    xml = {**ADMIN, "Content-Type": "application/xml"}
    result = await client.post("/v1/admin/bank-statements", content=statement, headers=xml)
    assert result.status_code == 200, result.text
    assert result.json() == {
        "booked": [de.id],
        "returned": [fr.id],
        "already_settled": [],
        "unknown": ["SOMEONE-ELSES-PAYMENT"],
    }
    de, fr = await payout_of(app, who["de"].id), await payout_of(app, who["fr"].id)
    assert (de.status, de.reference) == ("paid", f"BANK-{e2e_de[-6:]}")
    assert fr.status == "failed" and "AC04" in (fr.failure_reason or "")
    assert await pending(app, who["fr"].id) == owed[who["fr"].id]  # all of it payable again
    assert await in_transit(app, who["de"].id) == await in_transit(app, who["fr"].id) == 0

    again = await client.post("/v1/admin/bank-statements", content=statement, headers=xml)
    assert again.json()["already_settled"] == [de.id, fr.id]
    assert await mails_about(app, de.id) == [f"{de.id}:created", f"{de.id}:paid"]
    await books_balance(app)


@pytest.mark.parametrize(
    "content",
    [
        b"not xml",
        b'<!DOCTYPE d [<!ENTITY a "aaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]><Document>&b;</Document>',
        b'<?xml version="1.0"?><!DOCTYPE d SYSTEM "file:///etc/passwd"><Document/>',
        b"<Document><Stmt/></Document>",
    ],
)
async def test_a_file_that_is_not_a_camt_statement_is_refused(
    client: httpx.AsyncClient, content: bytes
) -> None:
    refused = await client.post(
        "/v1/admin/bank-statements",
        content=content,
        headers={**ADMIN, "Content-Type": "application/xml"},
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "VALIDATION_ERROR"


@given(
    micro=st.integers(min_value=1, max_value=10**15),
    rate=st.decimals(min_value="0.00000001", max_value="999999", places=8),
)
def test_cents_never_pay_more_than_owed_and_the_remainder_is_under_a_cent(
    micro: int, rate: object
) -> None:
    from decimal import Decimal

    assert isinstance(rate, Decimal)
    cents, remainder = cents_of(micro, rate)
    exact = Fraction(rate)
    assert 0 <= remainder <= micro
    covered = micro - remainder
    if cents == 0:
        assert remainder == micro and Fraction(micro) * exact < 10_000
        return
    # the cents are worth no more than what stays in transit, and the rest is < 1 cent
    assert Fraction(cents * 10_000) <= Fraction(covered) * exact
    assert Fraction(micro) * exact < Fraction((cents + 1) * 10_000)
    assert Fraction(covered - 1) * exact < Fraction(cents * 10_000)


async def test_exports_at_the_same_moment_make_one_file_and_move_each_remainder_once(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    batch_id, _who, owed = await bank_batch(app, client, provider, clock)
    url = f"/v1/admin/payout-batches/{batch_id}/sepa"
    answers = await asyncio.gather(
        *(client.post(url, json={"eur_per_usdc": RATE}, headers=ADMIN) for _ in range(4))
    )
    assert [a.status_code for a in answers] == [200] * 4
    assert len({a.text for a in answers}) == 1  # one file, served to every caller
    assert await count(app, SepaExportRow) == 1
    covered = expected_cents(owed[provider.id], RATE)[1]
    assert await pending(app, provider.id) == owed[provider.id] - covered
    assert await in_transit(app, provider.id) == covered
    await books_balance(app)
