"""The provider's earnings CSV says where each charge stands (docs/payouts.md), on SQLite
and PostgreSQL: `status` held, payable or refunded and, while held, `payable_at`, the
same as `GET /v1/provider/earnings` says of the same charges and as the balances of
held and payable earnings add up to; a release moves a charge from held to payable."""

import csv
import io
from datetime import UTC, datetime, timedelta

import httpx
from fastapi import FastAPI

from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.money import clawbacks, earnings_hold
from gpu_share.coordinator.services.money.earnings_hold import HoldPolicy
from gpu_share.protocol.money import to_micro
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.earnings import move_to, post_charge
from gpu_share.testing.factories import ProviderHandle

NOW = datetime(2026, 12, 9, 15, tzinfo=UTC)
RANGE = "since=2026-11-25&until=2026-12-09"


def auth(provider: ProviderHandle) -> dict[str, str]:
    return {"Authorization": f"Bearer {provider.key}"}


async def csv_rows(client: httpx.AsyncClient, provider: ProviderHandle) -> list[dict[str, str]]:
    answer = await client.get(f"/v1/provider/earnings.csv?{RANGE}", headers=auth(provider))
    assert answer.status_code == 200, answer.text
    return list(csv.DictReader(io.StringIO(answer.text, newline="")))


async def test_the_csv_says_which_charges_are_held_until_when_payable_or_refunded(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    clock: FrozenClock,
    settings: Settings,
) -> None:
    db = app.state.replica.db
    move_to(clock, NOW)
    hold = HoldPolicy.of(settings)
    await post_charge(  # posted before holds existed: payable at once
        db, provider.id, at=datetime(2026, 11, 26, 9, tzinfo=UTC), provider_micro=5
    )
    released_at = datetime(2026, 11, 27, 9, tzinfo=UTC)  # its hold passes before NOW
    refunded_at = datetime(2026, 12, 8, 10, tzinfo=UTC)
    held_at = datetime(2026, 12, 8, 23, tzinfo=UTC)
    for at, share in ((released_at, 40), (refunded_at, 7), (held_at, 250_000)):
        await post_charge(db, provider.id, at=at, provider_micro=share, node_id="node_c", held=True)
    async with db.write() as session:
        assert await earnings_hold.release_due(session, NOW, hold) == 1
        (undone,) = [
            c for c in await clawbacks.held_charges(session, "node_c") if c.held_micro == 7
        ]
        assert await clawbacks.refund_charge(session, undone.charge_id, "mismatch", NOW) == 7

    rows = await csv_rows(client, provider)
    assert [(r["earned_usdc"], r["status"], r["payable_at"]) for r in rows] == [
        ("0.000005", "payable", ""),
        ("0.00004", "payable", ""),
        ("0.000007", "refunded", ""),
        ("0.25", "held", hold.payable_at("standard", held_at).isoformat()),
    ]
    assert list(rows[0])[-2:] == ["status", "payable_at"]

    # The API says the same of each charge, and the balances add up to the CSV's.
    earned = (await client.get(f"/v1/provider/earnings?{RANGE}", headers=auth(provider))).json()
    by_time = {datetime.fromisoformat(h["at"]): h["payable_at"] for h in earned["history"]}
    for row in rows:
        at, payable_at = datetime.fromisoformat(row["time_utc"]), row["payable_at"]
        api = by_time[at]
        assert (datetime.fromisoformat(api) if api else None) == (
            datetime.fromisoformat(payable_at) if payable_at else None
        )
    held = sum(to_micro(r["earned_usdc"]) for r in rows if r["status"] == "held")
    payable = sum(to_micro(r["earned_usdc"]) for r in rows if r["status"] == "payable")
    assert (to_micro(earned["held"]), to_micro(earned["payable"])) == (held, payable)

    # Once its hold has passed and the release ran, the held charge is payable.
    later = hold.payable_at("standard", held_at)
    move_to(clock, later + timedelta(seconds=1))
    async with db.write() as session:
        assert await earnings_hold.release_due(session, clock.now(), hold) == 1
    rows = await csv_rows(client, provider)
    assert [(r["status"], r["payable_at"]) for r in rows][-1] == ("payable", "")
