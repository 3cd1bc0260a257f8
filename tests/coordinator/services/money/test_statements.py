"""Monthly statements (docs/billing.md "Statements", docs/payouts.md "Statements"), on
SQLite and PostgreSQL: a tenant's spend by runtime and GPU model and a provider's
earnings, commission and payouts for one UTC month, from the books, refunds netted, as
JSON and CSV; a bad or future month is refused; nobody reads another's statement."""

import csv
import io
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import LedgerTransactionRow
from gpu_share.coordinator.services.money import ledger, tenant_billing
from gpu_share.coordinator.services.money.clawbacks import refund_cause
from gpu_share.coordinator.services.money.ledger import Entry, TransactionKind, transfer
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.earnings import move_to
from gpu_share.testing.factories import ADMIN, ProviderHandle, TenantHandle
from tests.coordinator.services.money.test_payouts import auth, books_balance, replica_of

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
NOW = datetime(2026, 12, 9, 12, tzinfo=UTC)


async def charge(
    db: Database,
    tenant_id: str,
    provider_id: str,
    *,
    at: datetime,
    provider_micro: int,
    commission_micro: int,
    runtime: str = "onnx_cuda",
    gpu_model: str = H100,
    gpus: int = 1,
    seconds: float = 3600.0,
) -> str:
    """A tenant's charge as billing posts it (reserve, then charge): its transaction id."""
    cost, work_id = provider_micro + commission_micro, new_id("inv")
    details = {
        "tenant_id": tenant_id,
        "provider_id": provider_id,
        "node_id": "node_test",
        "work": "invoke",
        "work_id": work_id,
        "runtime": runtime,
        "gpu_model": gpu_model,
        "gpus": gpus,
        "spot": False,
        "seconds": seconds,
        "rate_micro_per_hour": round(cost * 3600 / seconds),
        "cost_micro": cost,
        "provider_micro": provider_micro,
        "commission_micro": commission_micro,
        "started_at": at.isoformat(),
        "ended_at": at.isoformat(),
    }
    async with db.write() as session:
        await ledger.post(
            session,
            cause=f"invoke:{work_id}:reserve",
            kind=TransactionKind.RESERVE,
            entries=transfer(
                ledger.tenant_balance(tenant_id), ledger.tenant_reserved(tenant_id), cost
            ),
            now=at,
            details={},
        )
        await ledger.post(
            session,
            cause=f"invoke:{work_id}:charge",
            kind=TransactionKind.CHARGE,
            entries=[
                Entry(ledger.tenant_reserved(tenant_id), -cost),
                Entry(ledger.provider_pending(provider_id), provider_micro),
                Entry(ledger.COMMISSION, commission_micro),
            ],
            now=at,
            details=details,
        )
        found = await session.scalar(
            select(LedgerTransactionRow.id).where(
                LedgerTransactionRow.cause == f"invoke:{work_id}:charge"
            )
        )
        assert found is not None
        return found


async def refund(
    db: Database, charge_id: str, tenant_id: str, provider_id: str, at: datetime
) -> None:
    async with db.write() as session:
        posted = await session.get(LedgerTransactionRow, charge_id)
        assert posted is not None
        d = posted.details
        await ledger.post(
            session,
            cause=refund_cause(charge_id),
            kind=TransactionKind.REFUND,
            entries=[
                Entry(ledger.provider_pending(provider_id), -d["provider_micro"]),
                Entry(ledger.COMMISSION, -d["commission_micro"]),
                Entry(ledger.tenant_balance(tenant_id), d["cost_micro"]),
            ],
            now=at,
            details={"cost_micro": d["cost_micro"], "reason": "wrong results"},
        )


@pytest.fixture
async def november(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    clock: FrozenClock,
) -> None:
    """Three charges in November (one refunded in December), one on 1 December."""
    move_to(clock, NOW)
    topped = await client.post(
        f"/v1/admin/tenants/{tenant.id}/top-ups",
        json={"amount": "100", "reference": "wire-1"},
        headers=ADMIN,
    )
    assert topped.status_code in (200, 201), topped.text
    db = replica_of(app).db
    first = datetime(2026, 11, 1, 0, 0, tzinfo=UTC)
    last = datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC)
    undone = ""
    for at, earned, commission, runtime, model, gpus, seconds in [
        (first, 8_500_000, 1_500_000, "onnx_cuda", H100, 2, 1800.0),
        (last, 850_000, 150_000, "onnx_cuda", H100, 1, 3600.0),  # refunded in December
        (last, 425_000, 75_000, "catboost", A100, 1, 3600.0),
        (datetime(2026, 12, 1, tzinfo=UTC), 1_000_000, 0, "onnx_cuda", H100, 1, 3600.0),
    ]:
        made = await charge(
            db,
            tenant.id,
            provider.id,
            at=at,
            provider_micro=earned,
            commission_micro=commission,
            runtime=runtime,
            gpu_model=model,
            gpus=gpus,
            seconds=seconds,
        )
        undone = undone or (made if earned == 850_000 else "")
    await refund(db, undone, tenant.id, provider.id, datetime(2026, 12, 2, tzinfo=UTC))


@pytest.mark.usefixtures("november")
async def test_a_tenants_statement_sums_the_month_by_runtime_and_gpu_model_refunds_netted(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    answer = await client.get("/v1/billing/statements/2026-11", headers=tenant.headers)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["month"], body["start"], body["end"], body["complete"]) == (
        "2026-11",
        "2026-11-01",
        "2026-11-30",
        True,
    )
    spend = ("key", "charges", "gpu_hours", "cost", "refunded", "net")
    assert [tuple(line[k] for k in spend) for line in body["by_runtime"]] == [
        ("catboost", 1, 1.0, "0.5", "0", "0.5"),
        ("onnx_cuda", 2, 2.0, "11", "1", "10"),
    ]
    assert [(line["key"], line["net"]) for line in body["by_gpu_model"]] == [
        (A100, "0.5"),
        (H100, "10"),
    ]
    assert tuple(body["total"][k] for k in spend) == ("total", 3, 3.0, "11.5", "1", "10.5")

    as_csv = await client.get("/v1/billing/statements/2026-11.csv", headers=tenant.headers)
    assert as_csv.status_code == 200 and as_csv.headers["content-type"].startswith("text/csv")
    assert 'filename="statement-2026-11.csv"' in as_csv.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert [(r["section"], r["key"], r["net_usdc"]) for r in rows] == [
        ("runtime", "catboost", "0.5"),
        ("runtime", "onnx_cuda", "10"),
        ("gpu_model", A100, "0.5"),
        ("gpu_model", H100, "10"),
        ("total", "total", "10.5"),
    ]

    december = (await client.get("/v1/billing/statements/2026-12", headers=tenant.headers)).json()
    assert (december["end"], december["complete"]) == ("2026-12-09", False)  # so far
    assert december["total"]["net"] == "1"
    await books_balance(app)


@pytest.mark.usefixtures("november")
async def test_a_providers_statement_shows_gross_commission_net_and_refunds(
    client: httpx.AsyncClient, provider: ProviderHandle
) -> None:
    answer = await client.get("/v1/provider/statements/2026-11", headers=auth(provider))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    earned = ("key", "charges", "gross", "commission", "net", "refunded")
    assert [tuple(line[k] for k in earned) for line in body["by_gpu_model"]] == [
        (A100, 1, "0.5", "0.075", "0.425", "0"),
        (H100, 2, "10", "1.5", "8.5", "0.85"),
    ]
    assert (body["total"]["gross"], body["total"]["net"]) == ("10.5", "8.925")
    assert body["payouts"] == [] and body["payouts_total"] == "0"
    as_csv = await client.get("/v1/provider/statements/2026-11.csv", headers=auth(provider))
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert [(r["section"], r["gross_usdc"], r["commission_usdc"], r["net_usdc"]) for r in rows] == [
        ("gpu_model", "0.5", "0.075", "0.425"),
        ("gpu_model", "10", "1.5", "8.5"),
        ("total", "10.5", "1.575", "8.925"),
    ]


@pytest.mark.parametrize(
    ("month", "fix"),
    [
        ("2026-13", "is not a month: write it as YYYY-MM"),
        ("2026-1", "is not a month"),
        ("2026-11-01", "is not a month"),
        ("1999-12", "is not a month"),
        ("november", "is not a month"),
        ("2027-01", "2027-01 has not started yet: the latest statement is 2026-12"),
    ],
)
async def test_a_bad_or_future_month_is_refused_with_what_to_write(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    clock: FrozenClock,
    month: str,
    fix: str,
) -> None:
    move_to(clock, NOW)
    for url, headers in (
        (f"/v1/billing/statements/{month}", tenant.headers),
        (f"/v1/billing/statements/{month}.csv", tenant.headers),
        (f"/v1/provider/statements/{month}", auth(provider)),
    ):
        refused = await client.get(url, headers=headers)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "VALIDATION_ERROR" and fix in error["message"]


@pytest.mark.usefixtures("november")
async def test_a_statement_shows_only_its_own_accounts_money(
    client: httpx.AsyncClient, other_tenant: TenantHandle, provider: ProviderHandle
) -> None:
    theirs = (
        await client.get("/v1/billing/statements/2026-11", headers=other_tenant.headers)
    ).json()
    assert theirs["total"]["charges"] == 0 and theirs["by_runtime"] == []
    wrong_role = await client.get("/v1/billing/statements/2026-11", headers=auth(provider))
    assert wrong_role.status_code == 403
    anonymous = await client.get("/v1/provider/statements/2026-11")
    assert anonymous.status_code == 401


@pytest.mark.usefixtures("november")
async def test_a_month_with_more_charges_than_a_statement_reads_is_refused_not_cut_short(
    client: httpx.AsyncClient, tenant: TenantHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tenant_billing, "MAX_CHARGES", 3)  # November has 3
    answer = await client.get("/v1/billing/statements/2026-11", headers=tenant.headers)
    assert answer.status_code == 409, answer.text
    assert "usage CSV" in answer.json()["error"]["message"]
    monkeypatch.setattr(tenant_billing, "MAX_CHARGES", 4)
    answer = await client.get("/v1/billing/statements/2026-11", headers=tenant.headers)
    assert answer.status_code == 200 and answer.json()["total"]["charges"] == 3
