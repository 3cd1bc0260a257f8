"""The admin overview's money (services/money/books.py): tenants' balances, what they spent
in the last 24 hours and 30 days, providers' earnings due (held and payable) and the next
payout, read from the ledger and shown as USDC."""

import re
from datetime import UTC, timedelta

import httpx
from fastapi import FastAPI

from gpu_share.coordinator.loops import earnings_hold as release_loop
from gpu_share.coordinator.services.money.payout_calendar import next_payout_day
from gpu_share.protocol.payouts import PayoutSchedule
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import (
    ADMIN,
    HELLO_WORLD,
    TEST_ADMIN_KEY,
    ProviderHandle,
    TenantHandle,
    bearer,
)
from gpu_share.testing.simulated_agent import AgentFactory, done_report
from tests.web.admin.test_pages import signed_in


def figure(page: str, card: str) -> tuple[str, str]:
    """A money card's value and its line below, as the admin reads them."""
    found = re.search(
        rf'id="{card}">\s*<span class="value">(.*?)</span>\s*<span class="name">.*?</span>\s*'
        r'<span class="sub">(.*?)</span>',
        page,
        re.S,
    )
    assert found is not None, f"no card {card}"
    value = re.sub(r"<[^>]+>", "", found[1]).split()
    return " ".join(value), found[2]


async def test_the_overview_shows_balances_spend_earnings_due_and_the_next_payout(
    app: FastAPI,
    client: httpx.AsyncClient,
    clock: FrozenClock,
    tenant: TenantHandle,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
) -> None:
    agent = await sim_agent()
    priced = await client.put(
        "/v1/provider/prices/cpu",
        json={"price_per_gpu_hour": "36", "spot_discount_pct": 50},
        headers=bearer(provider.key),
    )
    assert priced.status_code == 200, priced.text
    paid_by = await client.put(
        "/v1/provider/payout-settings",
        json={
            "method": {
                "kind": "solana_usdc",
                "address": "So11111111111111111111111111111111111111112",
            }
        },
        headers=bearer(provider.key),
    )
    assert paid_by.status_code == 200, paid_by.text
    credited = await client.post(
        f"/v1/admin/tenants/{tenant.id}/top-ups",
        json={"amount": "100", "reference": "wire-1"},
        headers=ADMIN,
    )
    assert credited.status_code == 201, credited.text

    await signed_in(client, TEST_ADMIN_KEY)
    empty = (await client.get("/admin")).text
    assert figure(empty, "tenant-balances") == ("100 USDC", "0 USDC more reserved for running work")
    assert figure(empty, "spent")[0] == "0 USDC"

    submitted = await client.post(
        "/v1/gpu/invoke",
        json={**HELLO_WORLD, "runtime": "onnx_cpu", "timeout_sec": 3600},
        headers=tenant.headers,
    )
    assert submitted.status_code == 202, submitted.text
    (job,) = await agent.lease()
    await agent.client.start(job.invoke_id, job.lease_token)
    running = (await client.get("/admin")).text
    assert figure(running, "tenant-balances") == (
        "64 USDC",
        "36 USDC more reserved for running work",
    )
    clock.advance(2000)  # 36 USDC an hour: 20 USDC, 17 of them the provider's
    await agent.client.report(job.invoke_id, done_report(job), retry_for=0)
    await agent.heartbeat()

    page = (await client.get("/admin")).text
    assert figure(page, "tenant-balances")[0] == "80 USDC"
    assert figure(page, "spent") == ("20 USDC", "20 USDC in the last 30 days, net of refunds")
    assert figure(page, "earnings-due") == ("17 USDC", "17 USDC held, 0 USDC payable")
    monday = next_payout_day(PayoutSchedule.WEEKLY, clock.now().astimezone(UTC).date())
    first_business_day = next_payout_day(PayoutSchedule.MONTHLY, clock.now().astimezone(UTC).date())
    soonest = min(monday, first_business_day)
    assert figure(page, "next-payout")[0] == soonest.strftime("%a %d %b")

    clock.advance(timedelta(days=8).total_seconds())  # past the hold
    assert await release_loop.run_once(app.state.replica) == 1
    await signed_in(client, TEST_ADMIN_KEY)  # a browser session lasts less than that
    later = (await client.get("/admin")).text
    assert figure(later, "spent") == ("0 USDC", "20 USDC in the last 30 days, net of refunds")
    assert figure(later, "earnings-due") == ("17 USDC", "0 USDC held, 17 USDC payable")
    day, line = figure(later, "next-payout")
    weekly = next_payout_day(PayoutSchedule.WEEKLY, clock.now().astimezone(UTC).date())
    if day == weekly.strftime("%a %d %b"):
        assert line.startswith("17 USDC payable now to 1 provider")
    else:
        assert f"weekly on {weekly.strftime('%a %d %b')} (17 USDC)" in line

    clock.advance(timedelta(days=30).total_seconds())
    await signed_in(client, TEST_ADMIN_KEY)
    month_later = (await client.get("/admin")).text
    assert figure(month_later, "spent") == ("0 USDC", "0 USDC in the last 30 days, net of refunds")
