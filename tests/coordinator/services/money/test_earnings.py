"""A provider's earnings (SPEC §3.6) from the charges in the books, exact to the
micro-USDC, on SQLite and PostgreSQL; nobody sees another provider's."""

import csv
import io
from datetime import UTC, datetime

import httpx
from fastapi import FastAPI

from gpu_share.coordinator.replica.state import Replica
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.earnings import move_to, post_charge
from gpu_share.testing.factories import ADMIN, ProviderHandle, create_provider

NOW = datetime(2026, 12, 9, 15, tzinfo=UTC)  # Wednesday; the week began Monday the 7th
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


def auth(handle: ProviderHandle) -> dict[str, str]:
    return {"Authorization": f"Bearer {handle.key}"}


async def seed(app: FastAPI, handle: ProviderHandle) -> None:
    db = app.state.replica.db
    assert isinstance(app.state.replica, Replica)
    charges = [
        # (at, earned, commission, node, model, gpus, seconds)
        (
            datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC),
            1_000_001,
            176_471,
            "node_a",
            H100,
            1,
            600.0,
        ),
        (datetime(2026, 12, 1, 8, tzinfo=UTC), 2_500_000, 441_177, "node_a", H100, 2, 1800.0),
        (datetime(2026, 12, 7, 0, 0, tzinfo=UTC), 333_333, 58_823, "node_b", A100, 1, 360.0),
        (datetime(2026, 12, 9, 14, 59, tzinfo=UTC), 7, 1, "node_a", H100, 1, 0.5),
        (datetime(2026, 12, 9, 14, 0, tzinfo=UTC), 4_000_000, 705_882, "node_b", H100, 4, 3600.0),
    ]
    for at, earned, commission, node, model, gpus, seconds in charges:
        await post_charge(
            db,
            handle.id,
            at=at,
            provider_micro=earned,
            commission_micro=commission,
            node_id=node,
            gpu_model=model,
            gpus=gpus,
            seconds=seconds,
        )


async def test_totals_and_groupings_are_exact_to_the_micro_usdc(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    await seed(app, provider)
    move_to(clock, NOW)
    answer = await client.get(
        "/v1/provider/earnings?since=2026-11-30&until=2026-12-09", headers=auth(provider)
    )
    assert answer.status_code == 200, answer.text
    e = answer.json()
    assert e["pending"] == "7.833341" and e["in_transit"] == "0" and e["paid"] == "0"
    assert e["this_week"] == {"amount": "4.33334", "gpu_hours": 4.1001, "charges": 3}
    assert e["this_month"]["amount"] == "6.83334" and e["this_month"]["charges"] == 4
    assert e["total"]["amount"] == "7.833341" and e["total"]["charges"] == 5
    assert [(g["node_id"], g["gpu_model"], g["amount"], g["charges"]) for g in e["per_gpu"]] == [
        ("node_b", H100, "4", 1),
        ("node_a", H100, "3.500008", 3),
        ("node_b", A100, "0.333333", 1),
    ]
    assert [(m["gpu_model"], m["amount"], m["gpu_hours"]) for m in e["per_model"]] == [
        (H100, "7.500008", round((600 + 3600 + 0.5 + 4 * 3600) / 3600, 4)),
        (A100, "0.333333", 0.1),
    ]
    daily = {d["day"]: d["amount"] for d in e["daily"]}
    assert len(daily) == 10 and daily["2026-11-30"] == "1.000001" and daily["2026-12-02"] == "0"
    assert daily["2026-12-09"] == "4.000007"
    newest = e["history"][0]
    assert newest["at"].startswith("2026-12-09T14:59") and newest["amount"] == "0.000007"
    assert newest["tenant_paid"] == "0.000008" and newest["commission"] == "0.000001"
    assert "tenant_id" not in newest and "work_id" not in newest

    december = (
        await client.get("/v1/provider/earnings?since=2026-12-01", headers=auth(provider))
    ).json()
    assert december["total"]["amount"] == "6.83334" and december["until"] == "2026-12-09"


async def test_the_csv_lists_every_charge_of_the_range_oldest_first(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    await seed(app, provider)
    move_to(clock, NOW)
    answer = await client.get(
        "/v1/provider/earnings.csv?since=2026-12-01&until=2026-12-07", headers=auth(provider)
    )
    assert answer.status_code == 200
    assert 'filename="earnings-2026-12-01-2026-12-07.csv"' in answer.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(answer.text)))
    assert [(r["node_id"], r["earned_usdc"], r["gpus"]) for r in rows] == [
        ("node_a", "2.5", "2"),
        ("node_b", "0.333333", "1"),
    ]
    assert rows[0]["time_utc"] == "2026-12-01T08:00:00+00:00"
    assert rows[0]["tenant_paid_usdc"] == "2.941177" and rows[0]["commission_usdc"] == "0.441177"


async def test_a_new_provider_has_honest_zeros(
    client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    move_to(clock, NOW)
    e = (await client.get("/v1/provider/earnings", headers=auth(provider))).json()
    assert e["pending"] == "0" and e["this_week"]["charges"] == 0 and e["history"] == []
    assert e["since"] == "2026-11-10" and e["until"] == "2026-12-09" and len(e["daily"]) == 30


async def test_bad_date_ranges_say_what_to_fix(
    client: httpx.AsyncClient, provider: ProviderHandle
) -> None:
    for query, fix in (
        ("since=2026-12-09&until=2026-12-01", "since: must be on or before until (2026-12-01)"),
        ("since=2025-01-01&until=2026-12-01", "since: the range can span at most 366 days"),
        ("since=yesterday", "since"),
        ("since=9999-12-30&until=9999-12-31", "until: must be on or before "),
        ("until=0001-01-01", "until: must be on or after 2000-01-01"),
        ("since=0001-01-01&until=0001-01-02", "until: must be on or after 2000-01-01"),
        ("since=1999-12-31&until=2000-01-02", "since: must be on or after 2000-01-01"),
    ):
        answer = await client.get(f"/v1/provider/earnings?{query}", headers=auth(provider))
        assert answer.status_code == 422, query
        assert fix in answer.json()["error"]["message"]


async def test_another_providers_earnings_and_payouts_are_invisible(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    other = await create_provider(client, "Other Farm")
    await seed(app, provider)
    move_to(clock, NOW)
    answer = await client.put(
        "/v1/provider/payout-settings",
        json={"method": {"kind": "solana_usdc", "address": "1" * 32}},
        headers=auth(provider),
    )
    assert answer.status_code == 200, answer.text
    made = await client.post(
        f"/v1/admin/providers/{provider.id}/payouts", json={"amount": "1"}, headers=ADMIN
    )
    assert made.status_code == 201

    theirs = (await client.get("/v1/provider/earnings", headers=auth(other))).json()
    assert theirs["pending"] == "0" and theirs["total"]["charges"] == 0 and theirs["per_gpu"] == []
    assert (await client.get("/v1/provider/payouts", headers=auth(other))).json() == []
    assert (await client.get("/v1/provider/payout-settings", headers=auth(other))).json()[
        "method"
    ] is None
    # Knowing the payout's id grants a provider nothing: these routes are the admin's.
    payout_id = made.json()["id"]
    for path in (f"/v1/admin/payouts/{payout_id}/failed", f"/v1/admin/payouts/{payout_id}/paid"):
        answer = await client.post(
            path, json={"reason": "x", "reference": "x"}, headers=auth(other)
        )
        assert answer.status_code == 403
    assert (await client.get("/v1/provider/earnings")).status_code == 401
