"""Payouts (SPEC §3.6) on SQLite and PostgreSQL: settings and their validation, the payout
loop on the days it pays (once per period, also run twice or concurrently), paid and
failed, and a payout above the pending balance."""

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from gpu_share.coordinator.core.orm import OutboxMailRow, PayoutBatchRow, PayoutRow
from gpu_share.coordinator.loops import payouts as payout_loop
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.money import ledger
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.earnings import move_to, post_charge
from gpu_share.testing.factories import ADMIN, ProviderHandle, create_provider

MONDAY = datetime(2026, 12, 7, 0, 30, tzinfo=UTC)  # ISO week 2026-W50
SOLANA = {"kind": "solana_usdc", "address": "So11111111111111111111111111111111111111112"}
BANK = {
    "kind": "bank_transfer",
    "account_holder": "GPU Farm GmbH",
    "iban": "DE89 3704 0044 0532 0130 00",
    "bic": "COBADEFFXXX",
}


def auth(handle: ProviderHandle) -> dict[str, str]:
    return {"Authorization": f"Bearer {handle.key}"}


def replica_of(app: FastAPI) -> Replica:
    replica: Replica = app.state.replica
    return replica


async def set_method(
    client: httpx.AsyncClient, handle: ProviderHandle, method: dict[str, Any], schedule: str
) -> httpx.Response:
    return await client.put(
        "/v1/provider/payout-settings",
        json={"method": method, "schedule": schedule},
        headers=auth(handle),
    )


async def pending(app: FastAPI, provider_id: str) -> int:
    async with replica_of(app).db.read() as session:
        return await ledger.balance(session, ledger.provider_pending(provider_id))


async def in_transit(app: FastAPI, provider_id: str) -> int:
    async with replica_of(app).db.read() as session:
        return await ledger.balance(session, ledger.payouts_in_transit(provider_id))


async def count(app: FastAPI, table: Any, *where: Any) -> int:
    async with replica_of(app).db.read() as session:
        return int(await session.scalar(select(func.count()).select_from(table).where(*where)) or 0)


async def books_balance(app: FastAPI) -> None:
    async with replica_of(app).db.read() as session:
        assert await ledger.books_total(session) == (0, 0)


async def mails_about(app: FastAPI, payout_id: str) -> list[str]:
    async with replica_of(app).db.read() as session:
        rows = await session.scalars(
            select(OutboxMailRow.cause).where(OutboxMailRow.cause.startswith(payout_id))
        )
        return sorted(rows.all())


# ---- settings ---------------------------------------------------------------------------


async def test_a_provider_sets_a_solana_method_and_reads_it_back(
    client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    move_to(clock, datetime(2026, 12, 9, 12, tzinfo=UTC))  # a Wednesday
    before = (await client.get("/v1/provider/payout-settings", headers=auth(provider))).json()
    assert before["method"] is None and before["schedule"] == "weekly"
    assert before["minimum"] == "10" and before["next_payout_on"] == "2026-12-14"

    saved = await set_method(client, provider, SOLANA, "monthly")
    assert saved.status_code == 200, saved.text
    assert saved.json()["method"] == SOLANA
    assert saved.json()["next_payout_on"] == "2027-01-01"  # a Friday
    again = (await client.get("/v1/provider/payout-settings", headers=auth(provider))).json()
    assert again == saved.json()


async def test_a_bank_method_is_kept_in_compact_form(
    client: httpx.AsyncClient, provider: ProviderHandle
) -> None:
    saved = await set_method(client, provider, BANK, "weekly")
    assert saved.status_code == 200, saved.text
    assert saved.json()["method"] == {
        "kind": "bank_transfer",
        "account_holder": "GPU Farm GmbH",
        "iban": "DE89370400440532013000",
        "bic": "COBADEFFXXX",
    }


@pytest.mark.parametrize(
    ("method", "fix"),
    [
        ({**SOLANA, "address": "So1111111111111111111111111111111111111111"}, "31 bytes"),
        ({**SOLANA, "address": "So111111111111111111111111111111111111111122"}, "33 bytes"),
        ({**SOLANA, "address": "0OIl1111111111111111111111111111111111111112"}, "cannot contain"),
        ({**SOLANA, "address": "So11111111111111111111111111111111 1111111112"}, "cannot contain"),
        ({**SOLANA, "address": "abc"}, "bytes"),
        ({**SOLANA, "address": ""}, "enter your Solana wallet address"),
        ({**BANK, "iban": "DE89370400440532013001"}, "not a valid IBAN (invalid checksum digits"),
        ({**BANK, "iban": "XX89370400440532013000"}, "not a valid IBAN"),
        ({**BANK, "bic": "DEUTDEFF5"}, "not a valid BIC"),
        ({**BANK, "bic": "ZZZZZZFF"}, "not a valid BIC (invalid country code"),
        ({**BANK, "account_holder": "   "}, "name on the bank account"),
        ({"kind": "paypal", "address": "me@example.com"}, "solana_usdc"),
    ],
)
async def test_an_invalid_method_is_refused_with_what_to_fix_and_nothing_changes(
    client: httpx.AsyncClient, provider: ProviderHandle, method: dict[str, Any], fix: str
) -> None:
    assert (await set_method(client, provider, SOLANA, "weekly")).status_code == 200
    refused = await set_method(client, provider, method, "monthly")
    assert refused.status_code == 422, refused.text
    body = refused.json()["error"]
    assert body["code"] == "VALIDATION_ERROR"
    assert fix in body["message"], body["message"]
    kept = (await client.get("/v1/provider/payout-settings", headers=auth(provider))).json()
    assert kept["method"] == SOLANA and kept["schedule"] == "weekly"


# ---- the loop ---------------------------------------------------------------------------


async def test_on_a_monday_the_loop_pays_weekly_providers_at_or_above_the_minimum_once(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    small = await create_provider(client, "Small Farm")
    no_method = await create_provider(client, "Lazy Farm")
    monthly = await create_provider(client, "Monthly Farm")
    await set_method(client, provider, SOLANA, "weekly")
    await set_method(client, small, BANK, "weekly")
    await set_method(client, monthly, SOLANA, "monthly")
    db = replica_of(app).db
    friday = datetime(2026, 12, 4, 15, tzinfo=UTC)
    await post_charge(
        db, provider.id, at=friday, provider_micro=8_500_000, commission_micro=1_500_000
    )
    await post_charge(db, provider.id, at=friday, provider_micro=1_500_000)  # exactly 10 USDC
    await post_charge(db, small.id, at=friday, provider_micro=9_999_999)
    await post_charge(db, no_method.id, at=friday, provider_micro=50_000_000)
    await post_charge(db, monthly.id, at=friday, provider_micro=50_000_000)

    move_to(clock, datetime(2026, 12, 6, 23, 59, tzinfo=UTC))  # Sunday: nothing is due
    assert await payout_loop.run_once(replica_of(app)) == []

    move_to(clock, MONDAY)
    made = await payout_loop.run_once(replica_of(app))
    assert len(made) == 1
    assert await payout_loop.run_once(replica_of(app)) == []  # the same period, once

    assert await pending(app, provider.id) == 0
    assert await in_transit(app, provider.id) == 10_000_000
    assert await pending(app, small.id) == 9_999_999  # below the minimum: waits
    assert await pending(app, no_method.id) == 50_000_000  # no method: waits
    assert await pending(app, monthly.id) == 50_000_000  # not its day
    assert await count(app, PayoutRow) == 1
    batch = (await client.get(f"/v1/admin/payout-batches/{made[0]}", headers=ADMIN)).json()
    assert batch["period"] == "2026-W50" and batch["schedule"] == "weekly"
    assert batch["total"] == "10" and batch["payouts"] == 1 and batch["in_transit"] == 1
    [item] = batch["items"]
    assert item["provider_id"] == provider.id and item["method"] == SOLANA
    assert item["status"] == "in_transit" and item["amount"] == "10"
    assert await mails_about(app, item["id"]) == [f"{item['id']}:created"]
    await books_balance(app)


async def test_monthly_payouts_wait_for_the_first_business_day(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    await set_method(client, provider, BANK, "monthly")
    db = replica_of(app).db
    await post_charge(db, provider.id, at=datetime(2026, 7, 20, tzinfo=UTC), provider_micro=1)

    for day in (1, 2):  # August 2026 starts on a Saturday
        move_to(clock, datetime(2026, 8, day, 9, tzinfo=UTC))
        assert await payout_loop.run_once(replica_of(app)) == []
    move_to(clock, datetime(2026, 8, 3, 9, tzinfo=UTC))
    made = await payout_loop.run_once(replica_of(app))  # the weekly batch and the monthly one
    periods = {
        (await client.get(f"/v1/admin/payout-batches/{b}", headers=ADMIN)).json()["period"]
        for b in made
    }
    assert periods == {"2026-08", "2026-W32"}
    payouts = (await client.get("/v1/provider/payouts", headers=auth(provider))).json()
    assert [(p["period"], p["amount"]) for p in payouts] == [("2026-08", "0.000001")]  # no minimum

    await post_charge(db, provider.id, at=datetime(2026, 8, 20, tzinfo=UTC), provider_micro=5)
    move_to(clock, datetime(2026, 9, 1, 9, tzinfo=UTC))  # a Tuesday
    [september] = await payout_loop.run_once(replica_of(app))
    assert (await client.get(f"/v1/admin/payout-batches/{september}", headers=ADMIN)).json()[
        "total"
    ] == "0.000005"
    await books_balance(app)


async def test_concurrent_loop_runs_make_one_batch_and_one_payout_per_provider(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    others = [await create_provider(client, f"Farm {i}") for i in range(3)]
    db = replica_of(app).db
    for i, handle in enumerate([provider, *others]):
        await set_method(client, handle, SOLANA, "weekly")
        await post_charge(
            db, handle.id, at=datetime(2026, 12, 1, tzinfo=UTC), provider_micro=20_000_000 + i
        )
    move_to(clock, MONDAY)

    results = await asyncio.gather(*(payout_loop.run_once(replica_of(app)) for _ in range(4)))
    assert sorted(len(r) for r in results) == [0, 0, 0, 1]
    assert await count(app, PayoutBatchRow) == 1
    assert await count(app, PayoutRow) == 4
    for i, handle in enumerate([provider, *others]):
        assert await pending(app, handle.id) == 0
        assert await in_transit(app, handle.id) == 20_000_000 + i
    assert await count(app, OutboxMailRow, OutboxMailRow.cause.endswith(":created")) == 4
    await books_balance(app)


# ---- paid and failed --------------------------------------------------------------------


async def _one_payout(
    app: FastAPI, client: httpx.AsyncClient, handle: ProviderHandle, clock: FrozenClock
) -> str:
    await set_method(client, handle, SOLANA, "weekly")
    await post_charge(
        replica_of(app).db,
        handle.id,
        at=datetime(2026, 12, 2, tzinfo=UTC),
        provider_micro=12_345_678,
    )
    move_to(clock, MONDAY)
    await payout_loop.run_once(replica_of(app))
    [payout] = (await client.get("/v1/provider/payouts", headers=auth(handle))).json()
    return str(payout["id"])


async def test_a_payout_marked_paid_keeps_its_reference_and_mails_once(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    payout_id = await _one_payout(app, client, provider, clock)
    signature = (
        "5VERv8NMvzbJMEkV8xnrLkEaWRtSz9CosKDYjCJjBRnbJLgp8uirBgmQpjKhoR4tjF3ZpRzrFmBV6UjKdiSZkQUW"
    )
    paid = await client.post(
        f"/v1/admin/payouts/{payout_id}/paid", json={"reference": signature}, headers=ADMIN
    )
    assert paid.status_code == 200, paid.text
    assert paid.json()["status"] == "paid" and paid.json()["reference"] == signature
    assert paid.json()["settled_at"] is not None
    assert await in_transit(app, provider.id) == 0 and await pending(app, provider.id) == 0

    for path, body in (("paid", {"reference": "again"}), ("failed", {"reason": "too late"})):
        again = await client.post(f"/v1/admin/payouts/{payout_id}/{path}", json=body, headers=ADMIN)
        assert again.status_code == 409, again.text
        assert "is paid, so it cannot be marked" in again.json()["error"]["message"]
    [mine] = (await client.get("/v1/provider/payouts", headers=auth(provider))).json()
    assert mine["status"] == "paid" and mine["reference"] == signature
    assert await mails_about(app, payout_id) == [f"{payout_id}:created", f"{payout_id}:paid"]
    earnings = (await client.get("/v1/provider/earnings", headers=auth(provider))).json()
    assert earnings["paid"] == "12.345678" and earnings["in_transit"] == "0"
    await books_balance(app)


async def test_a_failed_payout_returns_the_amount_to_pending_and_is_paid_next_time(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    payout_id = await _one_payout(app, client, provider, clock)
    failed = await client.post(
        f"/v1/admin/payouts/{payout_id}/failed",
        json={"reason": "the wallet refused USDC"},
        headers=ADMIN,
    )
    assert failed.status_code == 200, failed.text
    assert failed.json()["status"] == "failed"
    assert failed.json()["failure_reason"] == "the wallet refused USDC"
    assert await pending(app, provider.id) == 12_345_678 and await in_transit(app, provider.id) == 0
    for path, body in (("failed", {"reason": "again"}), ("paid", {"reference": "tx"})):
        again = await client.post(f"/v1/admin/payouts/{payout_id}/{path}", json=body, headers=ADMIN)
        assert again.status_code == 409 and "is failed" in again.json()["error"]["message"]
    assert await pending(app, provider.id) == 12_345_678
    assert await mails_about(app, payout_id) == [f"{payout_id}:created", f"{payout_id}:failed"]

    move_to(clock, datetime(2026, 12, 14, 1, tzinfo=UTC))  # the next Monday
    await payout_loop.run_once(replica_of(app))
    payouts = (await client.get("/v1/provider/payouts", headers=auth(provider))).json()
    assert [(p["period"], p["status"], p["amount"]) for p in payouts] == [
        ("2026-W51", "in_transit", "12.345678"),
        ("2026-W50", "failed", "12.345678"),
    ]
    await books_balance(app)


@pytest.mark.parametrize(
    ("path", "body", "fix"),
    [
        ("paid", {"reference": "  "}, "enter the transaction's reference"),
        ("paid", {}, "reference"),
        ("failed", {"reason": ""}, "reason"),
    ],
)
async def test_marking_without_a_reference_or_reason_is_refused(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    clock: FrozenClock,
    path: str,
    body: dict[str, str],
    fix: str,
) -> None:
    payout_id = await _one_payout(app, client, provider, clock)
    refused = await client.post(f"/v1/admin/payouts/{payout_id}/{path}", json=body, headers=ADMIN)
    assert refused.status_code == 422 and fix in refused.json()["error"]["message"]
    assert await in_transit(app, provider.id) == 12_345_678


async def test_unknown_payouts_and_batches_are_404_and_providers_cannot_mark(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    payout_id = await _one_payout(app, client, provider, clock)
    missing = "pay_" + "0" * 26
    answer = await client.post(
        f"/v1/admin/payouts/{missing}/paid", json={"reference": "x"}, headers=ADMIN
    )
    assert answer.status_code == 404
    assert (
        await client.get("/v1/admin/payout-batches/pbat_" + "0" * 26, headers=ADMIN)
    ).status_code == 404
    forbidden = await client.post(
        f"/v1/admin/payouts/{payout_id}/paid", json={"reference": "x"}, headers=auth(provider)
    )
    assert forbidden.status_code == 403
    assert await in_transit(app, provider.id) == 12_345_678


# ---- a payout above the pending balance -------------------------------------------------


async def test_a_manual_payout_above_the_pending_balance_is_refused_and_changes_nothing(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    await set_method(client, provider, BANK, "monthly")
    await post_charge(replica_of(app).db, provider.id, at=clock.now(), provider_micro=7_000_000)
    url = f"/v1/admin/providers/{provider.id}/payouts"

    refused = await client.post(url, json={"amount": "7.000001"}, headers=ADMIN)
    assert refused.status_code == 402, refused.text
    error = refused.json()["error"]
    assert error["code"] == "INSUFFICIENT_BALANCE"
    assert error["message"] == (
        "a payout of 7.000001 USDC is more than the pending balance of 7 USDC; pay out at most 7"
    )
    assert await pending(app, provider.id) == 7_000_000
    assert await count(app, PayoutRow) == 0
    assert await count(app, OutboxMailRow, OutboxMailRow.cause.like("pay_%")) == 0

    for amount, status in (("0", 422), ("-1", 422), ("1.0000001", 422)):
        answer = await client.post(url, json={"amount": amount}, headers=ADMIN)
        assert answer.status_code == status, answer.text

    made = await client.post(url, json={"amount": "7"}, headers=ADMIN)
    assert made.status_code == 201, made.text
    assert made.json()["period"] == "manual" and made.json()["batch_id"] is None
    assert await pending(app, provider.id) == 0 and await in_transit(app, provider.id) == 7_000_000
    await books_balance(app)


async def test_a_manual_payout_needs_a_payout_method(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    await post_charge(replica_of(app).db, provider.id, at=clock.now(), provider_micro=7_000_000)
    answer = await client.post(
        f"/v1/admin/providers/{provider.id}/payouts", json={"amount": "1"}, headers=ADMIN
    )
    assert answer.status_code == 409 and "no payout method" in answer.json()["error"]["message"]
    assert await pending(app, provider.id) == 7_000_000


# ---- export -----------------------------------------------------------------------------


async def test_a_batch_exports_as_csv_and_json_and_records_the_first_export(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    bank = await create_provider(client, "=HYPERLINK Farm")
    await set_method(client, bank, {**BANK, "account_holder": "=cmd|' /C calc'!A0"}, "weekly")
    await post_charge(
        replica_of(app).db, bank.id, at=datetime(2026, 12, 2, tzinfo=UTC), provider_micro=30_000_000
    )
    payout_id = await _one_payout(app, client, provider, clock)
    [batch] = (await client.get("/v1/admin/payout-batches", headers=ADMIN)).json()
    assert batch["exported_at"] is None and batch["payouts"] == 2 and batch["total"] == "42.345678"

    csv_answer = await client.get(f"/v1/admin/payout-batches/{batch['id']}/export", headers=ADMIN)
    assert csv_answer.status_code == 200
    assert csv_answer.headers["content-type"].startswith("text/csv")
    assert f"payouts-2026-W50-{batch['id']}.csv" in csv_answer.headers["content-disposition"]
    lines = csv_answer.text.splitlines()
    assert lines[0] == (
        "payout_id,provider_id,provider_name,provider_email,amount_usdc,amount_micro,method,"
        "solana_address,account_holder,iban,bic,status,reference"
    )
    expected = (
        f"{payout_id},{provider.id},GPU Farm,gpu.farm@example.com,12.345678,12345678,"
        f"solana_usdc,{SOLANA['address']},,,,in_transit,"
    )
    assert expected in lines
    bank_line = next(line for line in lines if bank.id in line)
    assert "'=HYPERLINK Farm" in bank_line and ",'=cmd|' /C calc'!A0," in bank_line
    assert "DE89370400440532013000,COBADEFFXXX" in bank_line

    json_answer = await client.get(
        f"/v1/admin/payout-batches/{batch['id']}/export?format=json", headers=ADMIN
    )
    exported = json_answer.json()
    assert exported["period"] == "2026-W50" and exported["total_usdc"] == "42.345678"
    assert {p["amount_micro"] for p in exported["payouts"]} == {12_345_678, 30_000_000}
    first = (await client.get("/v1/admin/payout-batches", headers=ADMIN)).json()[0]["exported_at"]
    assert first is not None
    clock.advance(3600)
    await client.get(f"/v1/admin/payout-batches/{batch['id']}/export", headers=ADMIN)
    assert (await client.get("/v1/admin/payout-batches", headers=ADMIN)).json()[0][
        "exported_at"
    ] == first


async def test_the_provider_is_mailed_the_reference_and_the_reason(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    payout_id = await _one_payout(app, client, provider, clock)
    await client.post(
        f"/v1/admin/payouts/{payout_id}/failed", json={"reason": "wallet frozen"}, headers=ADMIN
    )
    async with replica_of(app).db.read() as session:
        mails = {
            row.cause: row
            for row in (
                await session.scalars(
                    select(OutboxMailRow).where(OutboxMailRow.cause.startswith(payout_id))
                )
            ).all()
        }
    made, failed = mails[f"{payout_id}:created"], mails[f"{payout_id}:failed"]
    assert made.to_address == "gpu.farm@example.com"
    assert made.subject == "Payout of 12.345678 USDC on its way"
    assert SOLANA["address"] in made.body
    assert "The reason: wallet frozen" in failed.body and "back in your pending" in failed.body


async def test_a_payout_keeps_the_method_it_was_made_to(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    payout_id = await _one_payout(app, client, provider, clock)
    assert (await set_method(client, provider, BANK, "weekly")).status_code == 200
    [payout] = (await client.get("/v1/provider/payouts", headers=auth(provider))).json()
    assert payout["id"] == payout_id and payout["method"] == SOLANA
