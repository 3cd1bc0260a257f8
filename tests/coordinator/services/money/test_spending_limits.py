"""A tenant's monthly spending cap and low-balance mail (docs/billing.md, "Spending
limits"): new work past the cap is refused with 402 SPENDING_LIMIT, whatever arrives at
once; running work is not stopped; the month is the calendar month (UTC); the tenant is
mailed once when its balance falls below the threshold and once a month at the cap."""

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from gpu_share.coordinator.core.errors import SpendingLimitReached
from gpu_share.coordinator.core.orm import (
    InvokeRow,
    LedgerTransactionRow,
    OutboxMailRow,
    TenantRow,
)
from gpu_share.coordinator.core.settings import BillingMode, Settings
from gpu_share.coordinator.services.money import clawbacks, session_billing, spending_limits
from gpu_share.coordinator.services.money.ledger import TransactionKind
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ProviderHandle, TenantHandle
from gpu_share.testing.rentals import Rentals
from gpu_share.testing.simulated_agent import AgentFactory, SimulatedAgent
from tests.coordinator.services.money.test_billing import (
    CPU_HELLO,
    RATE,
    RESERVE,
    assert_books_balance,
    balances,
    run_for,
    set_price,
    submit,
    top_up,
)
from tests.coordinator.services.money.test_session_billing import open_session

LIMITS = "/v1/billing/limits"


@pytest.fixture
async def priced(app: FastAPI, sim_agent: AgentFactory, provider: ProviderHandle) -> SimulatedAgent:
    agent = await sim_agent()
    await set_price(app, agent, provider, RATE)
    return agent


async def set_limits(client: httpx.AsyncClient, tenant: TenantHandle, **body: Any) -> Any:
    answer = await client.put(LIMITS, json=body, headers=tenant.headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def limits_of(client: httpx.AsyncClient, tenant: TenantHandle) -> Any:
    answer = await client.get(LIMITS, headers=tenant.headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def mails(app: FastAPI, cause_prefix: str) -> list[OutboxMailRow]:
    async with app.state.replica.db.read() as session:
        found = await session.scalars(
            select(OutboxMailRow)
            .where(OutboxMailRow.cause.startswith(cause_prefix))
            .order_by(OutboxMailRow.created_at, OutboxMailRow.id)
        )
        return list(found.all())


async def invokes_of(app: FastAPI, tenant: TenantHandle) -> int:
    async with app.state.replica.db.read() as session:
        found = await session.scalar(
            select(func.count()).select_from(InvokeRow).where(InvokeRow.tenant_id == tenant.id)
        )
    return int(found or 0)


async def cancel(client: httpx.AsyncClient, tenant: TenantHandle, invoke_id: str) -> None:
    answer = await client.post(f"/v1/gpu/invokes/{invoke_id}/cancel", headers=tenant.headers)
    assert answer.status_code == 200, answer.text


def seconds_to_next_month(now: datetime) -> float:
    _, end, _ = spending_limits.month_of(now)
    return (end - now).total_seconds()


async def test_new_work_past_the_cap_is_refused_with_spending_limit_and_nothing_made(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    await top_up(client, tenant, "10")
    assert (await set_limits(client, tenant, monthly_cap="1"))["monthly_cap"] == "1"
    for _ in range(2):
        assert (await submit(client, tenant)).status_code == 202
    refused = await submit(client, tenant)
    assert refused.status_code == 402
    month = clock.now().strftime("%Y-%m")
    assert refused.json()["error"] == {
        "code": "SPENDING_LIMIT",
        "message": "this invoke may cost up to 0.416667 USDC, which would take this month's "
        "spend past your monthly cap of 1 USDC: 0.833334 USDC is spent or held for running "
        f"work in {month} (UTC). Raise or remove the cap (PUT /v1/billing/limits, or Limits "
        "on the Usage page), ask for less, or wait for next month",
        "details": {
            "monthly_cap": "1",
            "spent": "0.833334",
            "required": "0.416667",
            "month": month,
        },
    }
    assert await invokes_of(app, tenant) == 2
    assert await balances(app, tenant, provider) == {
        "available": 10_000_000 - 2 * RESERVE,
        "reserved": 2 * RESERVE,
        "provider": 0,
        "commission": 0,
    }
    # Asking for less fits: 60 s at 2.5 USDC/h reserves 0.041667.
    assert (await submit(client, tenant, timeout_sec=60)).status_code == 202
    assert (await limits_of(client, tenant))["left"] == "0.124999"
    await assert_books_balance(app)


async def test_concurrent_submits_never_pass_the_cap_together(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    priced: SimulatedAgent,
) -> None:
    await top_up(client, tenant, "100")
    await set_limits(client, tenant, monthly_cap="2.999999")  # room for 7 reserves
    answers = await asyncio.gather(*(submit(client, tenant) for _ in range(20)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [202] * 7 + [402] * 13, [a.text for a in answers if a.status_code >= 500]
    assert {a.json()["error"]["code"] for a in answers if a.status_code == 402} == {
        "SPENDING_LIMIT"
    }
    assert (await balances(app, tenant, provider))["reserved"] == 7 * RESERVE
    assert len(await mails(app, f"spending_cap:{tenant.id}:")) == 1
    await assert_books_balance(app)


async def test_the_month_counts_charges_net_of_refunds_and_held_work_then_starts_again(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    await top_up(client, tenant, "10")
    await set_limits(client, tenant, monthly_cap="0.5")
    assert (await submit(client, tenant)).status_code == 202
    await run_for(priced, clock, 72)  # charged 0.05, the rest of its reserve released
    assert (await limits_of(client, tenant))["spent"] == "0.05"
    queued = await submit(client, tenant)  # 0.05 + 0.416667 fits under 0.5
    assert queued.status_code == 202
    assert (await limits_of(client, tenant))["spent"] == "0.466667"
    assert (await submit(client, tenant)).json()["error"]["code"] == "SPENDING_LIMIT"
    await cancel(client, tenant, queued.json()["id"])  # canceled while queued: free
    assert (await limits_of(client, tenant))["spent"] == "0.05"
    replica = app.state.replica
    async with replica.db.write() as session:  # the charge given back: it costs nothing
        charge = await session.scalar(
            select(LedgerTransactionRow.id).where(
                LedgerTransactionRow.kind == TransactionKind.CHARGE.value
            )
        )
        assert charge is not None
        await clawbacks.refund_charge(session, charge, "wrong results", clock.now())
    assert (await limits_of(client, tenant))["spent"] == "0"

    clock.advance(seconds_to_next_month(clock.now()))
    await priced.heartbeat()
    now = await limits_of(client, tenant)
    assert (now["month"], now["spent"], now["left"]) == (clock.now().strftime("%Y-%m"), "0", "0.5")
    assert (await submit(client, tenant)).status_code == 202
    assert (await submit(client, tenant)).json()["error"]["code"] == "SPENDING_LIMIT"


async def test_the_low_balance_mail_is_sent_once_until_the_balance_rises_again(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    priced: SimulatedAgent,
) -> None:
    await top_up(client, tenant, "1")
    await top_up(client, other_tenant, "1", "other")
    await set_limits(client, tenant, low_balance="0.5")
    first = await submit(client, tenant)  # 0.583333 left: not below
    assert await mails(app, "low_balance:") == []
    second = await submit(client, tenant)  # 0.166666 left: below
    (mail,) = await mails(app, "low_balance:")
    async with app.state.replica.db.read() as session:
        row = await session.get(TenantRow, tenant.id)
        assert row is not None
    assert mail.to_address == row.email
    assert mail.subject == "Your GPU Share balance is below 0.5 USDC"
    assert "your available balance is 0.166666 USDC" in mail.body
    assert (await submit(client, tenant, timeout_sec=60)).status_code == 202  # still below
    for done in (first, second):
        await cancel(client, tenant, done.json()["id"])  # back above the threshold
    assert len(await mails(app, "low_balance:")) == 1
    for _ in range(2):
        assert (await submit(client, tenant)).status_code == 202
    assert len(await mails(app, "low_balance:")) == 2  # fell below once more
    for _ in range(2):  # a tenant without a threshold is never mailed
        assert (await submit(client, other_tenant)).status_code == 202
    assert {m.to_address for m in await mails(app, "low_balance:")} == {row.email}


async def test_the_cap_mail_is_sent_once_a_month(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    await top_up(client, tenant, "10")
    await set_limits(client, tenant, monthly_cap="0.833334")  # exactly two reserves
    for _ in range(2):
        assert (await submit(client, tenant)).status_code == 202
    first_month = clock.now().strftime("%Y-%m")
    (reached,) = await mails(app, f"spending_cap:{tenant.id}:")
    assert reached.cause == f"spending_cap:{tenant.id}:{first_month}"
    assert reached.subject == (
        f"Your GPU Share spending cap of 0.833334 USDC is reached for {first_month}"
    )
    for _ in range(2):
        assert (await submit(client, tenant)).json()["error"]["code"] == "SPENDING_LIMIT"
    assert len(await mails(app, f"spending_cap:{tenant.id}:")) == 1

    clock.advance(seconds_to_next_month(clock.now()))
    await priced.heartbeat()
    # Still held for the two queued invokes: the new month's first refusal mails again.
    assert (await submit(client, tenant)).json()["error"]["code"] == "SPENDING_LIMIT"
    assert (await submit(client, tenant)).json()["error"]["code"] == "SPENDING_LIMIT"
    causes = [m.cause for m in await mails(app, f"spending_cap:{tenant.id}:")]
    assert causes == [
        f"spending_cap:{tenant.id}:{first_month}",
        f"spending_cap:{tenant.id}:{clock.now().strftime('%Y-%m')}",
    ]


async def test_removed_limits_hold_nothing_back_and_other_tenants_are_never_held(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    priced: SimulatedAgent,
) -> None:
    await top_up(client, tenant, "10")
    await top_up(client, other_tenant, "10", "other")
    await set_limits(client, tenant, monthly_cap="0.5", low_balance="5")
    assert (await submit(client, tenant)).status_code == 202
    assert (await submit(client, tenant)).status_code == 402
    for _ in range(3):
        assert (await submit(client, other_tenant)).status_code == 202
    assert (await limits_of(client, other_tenant))["monthly_cap"] is None

    removed = await set_limits(client, tenant)
    assert (removed["monthly_cap"], removed["low_balance"], removed["left"]) == (None, None, None)
    assert (await submit(client, tenant)).status_code == 202
    after = await limits_of(client, tenant)
    assert (after["monthly_cap"], after["spent"]) == (None, "0.833334")  # still counted


async def test_limits_refuse_bad_amounts_with_422_and_keep_what_was_set(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    await set_limits(client, tenant, monthly_cap="5", low_balance="1")
    for body, field, words in (
        ({"monthly_cap": "-1"}, "monthly_cap", "more than 0"),
        ({"monthly_cap": "0"}, "monthly_cap", "more than 0"),
        ({"monthly_cap": "1.0000001"}, "monthly_cap", "six decimal places"),
        ({"monthly_cap": "lots"}, "monthly_cap", "is not a number of USDC"),
        ({"monthly_cap": "1e3"}, "monthly_cap", "is not a number of USDC"),
        ({"low_balance": 1.5}, "low_balance", "decimal string"),
        ({"low_balance": "2", "cap": "3"}, "cap", "Extra inputs"),
    ):
        answer = await client.put(LIMITS, json=body, headers=tenant.headers)
        assert answer.status_code == 422, (body, answer.text)
        error = answer.json()["error"]
        assert error["code"] == "VALIDATION_ERROR"
        assert field in error["message"] and words in error["message"], (body, error)
    kept = await limits_of(client, tenant)
    assert (kept["monthly_cap"], kept["low_balance"]) == ("5", "1")


async def test_a_quote_says_whether_the_work_fits_under_the_cap(
    client: httpx.AsyncClient, tenant: TenantHandle, priced: SimulatedAgent
) -> None:
    await top_up(client, tenant, "10")

    async def quoted(**extra: Any) -> Any:
        body = {**CPU_HELLO, **extra}
        answer = await client.post("/v1/gpu/quote", json=body, headers=tenant.headers)
        assert answer.status_code == 200, answer.text
        return answer.json()

    assert (await quoted())["within_cap"] is True  # no cap
    await set_limits(client, tenant, monthly_cap="0.4")
    over = await quoted()
    assert (over["reserve"], over["covered"], over["within_cap"]) == ("0.416667", True, False)
    assert (await quoted(timeout_sec=60))["within_cap"] is True
    assert (await submit(client, tenant)).json()["error"]["code"] == "SPENDING_LIMIT"


async def test_a_reservation_past_the_cap_is_refused(
    client: httpx.AsyncClient, tenant: TenantHandle, rentals: Rentals
) -> None:
    node = await rentals.node()
    await rentals.top_up(tenant, "100")
    await set_limits(client, tenant, monthly_cap="3")
    quote = await client.post(
        "/v1/reservations/quote", json={"node_id": node.node_id, "hours": 2}, headers=tenant.headers
    )
    assert (quote.json()["cost"], quote.json()["within_cap"]) == ("4", False)
    refused = await rentals.reserve(tenant, node_id=node.node_id, hours=2)  # 4 USDC
    assert refused.status_code == 402
    error = refused.json()["error"]
    assert error["code"] == "SPENDING_LIMIT"
    assert error["message"].startswith("this reservation costs 4 USDC, which would take")
    assert await rentals.balances(tenant) == (100_000_000, 0)
    await rentals.book(tenant, node, hours=1)  # 2 USDC fits
    assert await rentals.balances(tenant) == (98_000_000, 2_000_000)


async def test_a_session_is_held_to_the_cap_when_it_opens_but_never_stopped_by_it(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    replica = app.state.replica
    await top_up(client, tenant, "10")
    await set_limits(client, tenant, monthly_cap="3")  # an hour ahead is 2.5
    assert priced.node_id is not None
    held = await open_session(app, tenant, priced.node_id)
    with pytest.raises(SpendingLimitReached, match="a session on this node reserves an hour"):
        await open_session(app, tenant, priced.node_id)
    clock.advance(1801)  # less than half an hour left in reserve: the next is reserved
    async with replica.db.write() as session:
        assert await session_billing.bill_held(session, held, clock.now(), replica.settings)
    spent = await limits_of(client, tenant)
    assert float(spent["spent"]) > 3  # past the cap, and the session goes on
    await assert_books_balance(app)


class TestFreeBilling:
    @pytest.fixture
    def settings(self, settings: Settings) -> Settings:
        return settings.model_copy(update={"billing": BillingMode.FREE})

    async def test_limits_are_kept_but_hold_nothing_back(
        self,
        app: FastAPI,
        client: httpx.AsyncClient,
        tenant: TenantHandle,
        priced: SimulatedAgent,
    ) -> None:
        answer = await set_limits(client, tenant, monthly_cap="0.000001", low_balance="1")
        assert (answer["billing"], answer["monthly_cap"]) == ("free", "0.000001")
        for _ in range(2):
            made = await submit(client, tenant, max_cost="1")
            assert made.status_code == 202, made.text
        assert await mails(app, "") == []


def test_a_month_is_the_calendar_month_in_utc() -> None:
    start, end, name = spending_limits.month_of(datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC))
    assert (start, end, name) == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
        "2026-12",
    )
    assert spending_limits.month_of(datetime(2027, 1, 1, tzinfo=UTC))[2] == "2027-01"
