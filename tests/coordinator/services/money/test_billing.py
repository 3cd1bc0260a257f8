"""Tenant billing (SPEC §4.3, §4.4; docs/billing.md): reserve at submit, per-second
metering, one settlement per invoke, balances that never go below zero."""

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from gpu_share.coordinator.core.orm import LedgerTransactionRow, NodeRow, ProviderPriceRow
from gpu_share.coordinator.loops import lease_expiry
from gpu_share.coordinator.services.money import billing, ledger
from gpu_share.protocol import agent as wire
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import InvokeError, InvokeStatus
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import (
    ADMIN,
    HELLO_WORLD,
    ProviderHandle,
    TenantHandle,
    create_provider,
)
from gpu_share.testing.simulated_agent import AgentFactory, SimulatedAgent, done_report

CPU_HELLO = {**HELLO_WORLD, "runtime": "onnx_cpu"}  # timeout_sec 600
RATE = 2_500_000  # 2.5 USDC per CPU-hour
RESERVE = 416_667  # 600 s at 2.5 USDC/h, rounded up


async def set_price(
    app: FastAPI, agent: SimulatedAgent, provider: ProviderHandle, micro: int
) -> None:
    """What a provider's price comes to: its price row, and the node's denormalised rate."""
    replica = app.state.replica
    async with replica.db.write() as session:
        await session.merge(
            ProviderPriceRow(
                provider_id=provider.id,
                gpu_model="cpu",
                price_micro_per_hour=micro,
                spot_discount_bps=5000,
                updated_at=replica.clock.now(),
            )
        )
        node = await session.get(NodeRow, agent.node_id)
        assert node is not None
        node.price_per_gpu_hour_micro = micro


async def top_up(
    client: httpx.AsyncClient, tenant: TenantHandle, amount: str, reference: str = "inv-1"
) -> httpx.Response:
    return await client.post(
        f"/v1/admin/tenants/{tenant.id}/top-ups",
        json={"amount": amount, "reference": reference},
        headers=ADMIN,
    )


async def submit(client: httpx.AsyncClient, tenant: TenantHandle, **extra: Any) -> httpx.Response:
    headers = dict(tenant.headers)
    if "key" in extra:
        headers["Idempotency-Key"] = extra.pop("key")
    return await client.post("/v1/gpu/invoke", json={**CPU_HELLO, **extra}, headers=headers)


async def invoke_of(client: httpx.AsyncClient, tenant: TenantHandle, invoke_id: str) -> Any:
    return (await client.get(f"/v1/gpu/invokes/{invoke_id}", headers=tenant.headers)).json()


async def balances(app: FastAPI, tenant: TenantHandle, provider: ProviderHandle) -> dict[str, int]:
    async with app.state.replica.db.read() as session:
        return {
            "available": await ledger.balance(session, ledger.tenant_balance(tenant.id)),
            "reserved": await ledger.balance(session, ledger.tenant_reserved(tenant.id)),
            "provider": await ledger.balance(session, ledger.provider_held(provider.id)),
            "commission": await ledger.balance(session, ledger.COMMISSION),
        }


async def assert_books_balance(app: FastAPI) -> None:
    async with app.state.replica.db.read() as session:
        assert await ledger.books_total(session) == (0, 0)


async def postings(app: FastAPI, cause: str) -> int:
    async with app.state.replica.db.read() as session:
        found = await session.scalar(
            select(func.count()).where(LedgerTransactionRow.cause == cause)
        )
    return int(found or 0)


async def run_for(
    agent: SimulatedAgent, clock: FrozenClock, seconds: float, report: Any = None
) -> wire.LeasedJob:
    (job,) = await agent.lease()
    await agent.client.start(job.invoke_id, job.lease_token)
    clock.advance(seconds)
    await agent.client.report(
        job.invoke_id, report(job) if report else done_report(job), retry_for=0
    )
    await agent.heartbeat()  # still online at the frozen clock's new time
    return job


@pytest.fixture
async def priced(app: FastAPI, sim_agent: AgentFactory, provider: ProviderHandle) -> SimulatedAgent:
    agent = await sim_agent()
    await set_price(app, agent, provider, RATE)
    return agent


async def test_an_invoke_is_metered_per_second_and_charged_to_the_micro_usdc(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    assert (await top_up(client, tenant, "10")).status_code == 201
    answer = await submit(client, tenant)
    assert answer.status_code == 202, answer.text
    assert answer.json()["cost"] is None
    held = await balances(app, tenant, provider)
    assert (held["available"], held["reserved"]) == (10_000_000 - RESERVE, RESERVE)

    await run_for(priced, clock, 12.345)

    state = await invoke_of(client, tenant, answer.json()["id"])
    cost = RATE * 12_345 // 3_600_000  # 8572
    commission = cost * 1500 // 10_000  # 1285
    assert (state["status"], state["cost"], state["rate_per_hour"]) == ("done", "0.008572", "2.5")
    assert await balances(app, tenant, provider) == {
        "available": 10_000_000 - cost,
        "reserved": 0,
        "provider": cost - commission,
        "commission": commission,
    }
    await assert_books_balance(app)
    balance = (await client.get("/v1/billing/balance", headers=tenant.headers)).json()
    assert (balance["available"], balance["reserved"]) == ("9.991428", "0")


async def test_a_submit_the_balance_cannot_cover_is_refused_and_creates_nothing(
    client: httpx.AsyncClient, tenant: TenantHandle, priced: SimulatedAgent
) -> None:
    await top_up(client, tenant, "0.4")
    answer = await submit(client, tenant)
    assert answer.status_code == 402, answer.text
    error = answer.json()["error"]
    assert error["code"] == "INSUFFICIENT_BALANCE"
    assert "0.4 USDC" in error["message"] and "0.416667 USDC" in error["message"]
    listed = (await client.get("/v1/gpu/invokes", headers=tenant.headers)).json()
    assert listed["items"] == []
    assert await priced.lease() == []


async def test_max_cost_caps_the_reserve_and_keeps_dearer_nodes_away(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    dear_farm = await create_provider(client, "Dear Farm")
    dear = SimulatedAgent("http://testserver", transport=httpx.ASGITransport(app=app))
    await dear.register(dear_farm.enrollment_token)
    await set_price(app, dear, dear_farm, 25_000_000)  # 600 s there: 4.166667 USDC
    try:
        await top_up(client, tenant, "10")
        refused = await submit(client, tenant, max_cost="0.000001")
        assert (refused.status_code, refused.json()["error"]["details"]) == (
            503,
            {"constraint": "max_cost"},
        )
        answer = await submit(client, tenant, max_cost="1")
        assert answer.status_code == 202, answer.text
        assert answer.json()["max_cost"] == "1"
        assert (await balances(app, tenant, provider))["reserved"] == 1_000_000
        assert await dear.lease() == []  # 25 USDC/h does not fit 1 USDC in 600 s
        job = await run_for(priced, clock, 3600)  # ran past its timeout: billed up to it
        state = await invoke_of(client, tenant, job.invoke_id)
        assert state["cost"] == "0.416666"
        assert (await balances(app, tenant, provider))["available"] == 10_000_000 - 416_666
        await assert_books_balance(app)
    finally:
        await dear.aclose()


async def test_a_failure_on_the_provider_side_costs_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    await top_up(client, tenant, "1")

    def agent_error(job: wire.LeasedJob) -> wire.ResultReport:
        return wire.ResultReport(
            lease_token=job.lease_token,
            status=InvokeStatus.FAILED,
            error=InvokeError(code="AGENT_ERROR", message="the agent broke"),
        )

    answer = await submit(client, tenant)
    await run_for(priced, clock, 100, agent_error)
    state = await invoke_of(client, tenant, answer.json()["id"])
    assert (state["status"], state["cost"]) == ("failed", "0")
    assert await balances(app, tenant, provider) == {
        "available": 1_000_000,
        "reserved": 0,
        "provider": 0,
        "commission": 0,
    }
    assert await postings(app, f"invoke:{answer.json()['id']}:settle") == 1
    await assert_books_balance(app)


async def test_a_requeued_invoke_is_charged_once_for_its_last_attempt(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    second = await sim_agent()
    await set_price(app, second, provider, RATE)  # same provider, same model: same price
    await top_up(client, tenant, "1")
    invoke_id = (await submit(client, tenant)).json()["id"]
    (lost,) = await priced.lease()
    await priced.client.start(lost.invoke_id, lost.lease_token)
    clock.advance(200)  # runs 200 s, then its node goes silent past the lease
    assert (await lease_expiry.run_once(app.state.replica)).requeued == 1
    await run_for(second, clock, 36)
    state = await invoke_of(client, tenant, invoke_id)
    assert (state["status"], state["attempts"], state["cost"]) == ("done", 2, "0.025")
    assert (await balances(app, tenant, provider))["available"] == 1_000_000 - 25_000
    await assert_books_balance(app)


async def test_a_replayed_result_and_an_idempotent_resubmit_charge_once(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    await top_up(client, tenant, "1")
    first = await submit(client, tenant, key="once")
    again = await submit(client, tenant, key="once")
    assert first.json()["id"] == again.json()["id"]
    assert (await balances(app, tenant, provider))["reserved"] == RESERVE
    job = await run_for(priced, clock, 36)
    await priced.client.report(job.invoke_id, done_report(job, b"again"), retry_for=0)
    assert await postings(app, f"invoke:{job.invoke_id}:settle") == 1
    assert (await balances(app, tenant, provider))["available"] == 1_000_000 - 25_000
    await assert_books_balance(app)


async def test_cancel_charges_the_seconds_run_and_a_queued_cancel_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    await top_up(client, tenant, "2")
    running = (await submit(client, tenant)).json()["id"]
    (job,) = await priced.lease()
    await priced.client.start(job.invoke_id, job.lease_token)
    clock.advance(72)
    await client.post(f"/v1/gpu/invokes/{running}/cancel", headers=tenant.headers)
    await priced.client.report(
        running,
        wire.ResultReport(
            lease_token=job.lease_token,
            status=InvokeStatus.CANCELED,
            error=InvokeError(code="CANCELED", message="canceled by the tenant"),
        ),
        retry_for=0,
    )
    await priced.heartbeat()
    queued = (await submit(client, tenant)).json()["id"]
    await client.post(f"/v1/gpu/invokes/{queued}/cancel", headers=tenant.headers)
    assert (await invoke_of(client, tenant, running))["cost"] == "0.05"  # 72 s at 2.5/h
    assert (await invoke_of(client, tenant, queued))["cost"] == "0"
    assert await balances(app, tenant, provider) == {
        "available": 2_000_000 - 50_000,
        "reserved": 0,
        "provider": 50_000 - 7_500,
        "commission": 7_500,
    }
    await assert_books_balance(app)


async def test_concurrent_submits_never_overdraw(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    priced: SimulatedAgent,
) -> None:
    await top_up(client, tenant, "2.999999")  # 7 reserves of 0.416667 are 2.916669
    answers = await asyncio.gather(*(submit(client, tenant) for _ in range(20)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [202] * 7 + [402] * 13, [a.text for a in answers if a.status_code >= 500]
    held = await balances(app, tenant, provider)
    assert held == {
        "available": 2_999_999 - 7 * RESERVE,
        "reserved": 7 * RESERVE,
        "provider": 0,
        "commission": 0,
    }
    await assert_books_balance(app)


async def test_top_ups_and_a_charge_at_once_lose_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    await top_up(client, tenant, "1", "first")
    (await submit(client, tenant)).json()["id"]
    (job,) = await priced.lease()
    await priced.client.start(job.invoke_id, job.lease_token)
    clock.advance(36)
    await asyncio.gather(
        top_up(client, tenant, "2", "second"),
        priced.client.report(job.invoke_id, done_report(job), retry_for=0),
        top_up(client, tenant, "3", "third"),
    )
    assert await balances(app, tenant, provider) == {
        "available": 6_000_000 - 25_000,
        "reserved": 0,
        "provider": 25_000 - 3_750,
        "commission": 3_750,
    }
    await assert_books_balance(app)


async def test_top_ups_are_admin_only_idempotent_and_refuse_unknown_tenants(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    first = await top_up(client, tenant, "5", "wire-42")
    replay = await top_up(client, tenant, "5", "wire-42")
    assert (first.status_code, replay.status_code) == (201, 200)
    assert (replay.json()["replayed"], replay.json()["available"]) == (True, "5")
    assert (await top_up(client, tenant, "6", "wire-42")).status_code == 409
    keyed = {"amount": "1", "reference": "other"}
    for _ in range(2):
        await client.post(
            f"/v1/admin/tenants/{tenant.id}/top-ups",
            json=keyed,
            headers={**ADMIN, "Idempotency-Key": "k-1"},
        )
    balance = (await client.get("/v1/billing/balance", headers=tenant.headers)).json()
    assert balance["available"] == "6"
    mine = await client.post(
        f"/v1/admin/tenants/{tenant.id}/top-ups",
        json={"amount": "5", "reference": "self"},
        headers=tenant.headers,
    )
    assert mine.status_code == 403
    unknown = await client.post(
        "/v1/admin/tenants/ten_01aaaaaaaaaaaaaaaaaaaaaaaa/top-ups",
        json={"amount": "5", "reference": "x"},
        headers=ADMIN,
    )
    assert unknown.status_code == 404


@pytest.mark.parametrize("amount", ["-1", "0", "0.0000001", "10000000", "lots", 1.5, None])
async def test_a_bad_top_up_amount_is_refused_naming_the_field(
    client: httpx.AsyncClient, tenant: TenantHandle, amount: Any
) -> None:
    answer = await client.post(
        f"/v1/admin/tenants/{tenant.id}/top-ups",
        json={"amount": amount, "reference": "r"},
        headers=ADMIN,
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["details"][0]["loc"][-1] == "amount"


async def test_a_tenant_reads_only_its_own_balance_and_usage(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    await top_up(client, tenant, "1")
    await submit(client, tenant)
    await run_for(priced, clock, 36)
    other = (await client.get("/v1/billing/balance", headers=other_tenant.headers)).json()
    assert (other["tenant_id"], other["available"], other["reserved"]) == (
        other_tenant.id,
        "0",
        "0",
    )
    theirs = (await client.get("/v1/billing/usage", headers=other_tenant.headers)).json()
    assert theirs["total"] == "0"
    csv = (await client.get("/v1/billing/usage.csv", headers=other_tenant.headers)).text
    assert csv.count("\n") == 1  # the header only
    assert (await client.get("/v1/billing/balance")).status_code == 401


async def test_usage_per_day_per_runtime_and_as_csv(
    client: httpx.AsyncClient, tenant: TenantHandle, priced: SimulatedAgent, clock: FrozenClock
) -> None:
    await top_up(client, tenant, "1")
    for seconds in (36, 72):
        await submit(client, tenant)
        await run_for(priced, clock, seconds)
    today = clock.now().date().isoformat()
    by_day = (await client.get("/v1/billing/usage", headers=tenant.headers)).json()
    assert (by_day["total"], len(by_day["lines"])) == ("0.075", 30)
    assert by_day["lines"][-1] == {
        "key": today,
        "charges": 2,
        "seconds": 108.0,
        "cost": "0.075",
        "refunded": "0",
    }
    by_runtime = (
        await client.get("/v1/billing/usage", params={"group": "runtime"}, headers=tenant.headers)
    ).json()
    assert by_runtime["lines"] == [
        {"key": "onnx_cpu", "charges": 2, "seconds": 108.0, "cost": "0.075", "refunded": "0"}
    ]
    csv = await client.get(
        "/v1/billing/usage", params={"format": "csv", "from": today}, headers=tenant.headers
    )
    assert csv.headers["content-type"].startswith("text/csv")
    header, *rows = csv.text.splitlines()
    assert header.startswith("at,work,work_id,runtime") and len(rows) == 2
    assert rows[1].endswith(",72.0,2.5,0.05,0,,")  # not refunded: 0, no time, no reason
    bad = await client.get(
        "/v1/billing/usage", params={"from": today, "to": "2000-01-01"}, headers=tenant.headers
    )
    assert bad.status_code == 422
    for edge in ({"to": "9999-12-31"}, {"to": "0001-01-01"}, {"from": "0001-01-01"}):
        for way in ("json", "csv"):  # a day past the calendar's ends was once a 500
            answer = await client.get(
                "/v1/billing/usage", params={**edge, "format": way}, headers=tenant.headers
            )
            assert answer.status_code == 422, (edge, way)
            assert answer.json()["error"]["message"].startswith(next(iter(edge))), (edge, way)


async def test_a_quote_names_the_node_its_rate_and_what_the_invoke_may_and_should_cost(
    client: httpx.AsyncClient, tenant: TenantHandle, priced: SimulatedAgent, clock: FrozenClock
) -> None:
    await top_up(client, tenant, "0.5")
    quote = (await client.post("/v1/gpu/quote", json=CPU_HELLO, headers=tenant.headers)).json()
    assert quote["node_id"] == priced.node_id
    assert (quote["rate_per_hour"], quote["max_cost"], quote["expected_basis"]) == (
        "2.5",
        "0.416667",
        "timeout",
    )
    assert (quote["expected_cost"], quote["covered"]) == ("0.416667", True)
    enough = {**CPU_HELLO, "max_cost": "0.42"}
    capped = (await client.post("/v1/gpu/quote", json=enough, headers=tenant.headers)).json()
    assert capped["max_cost"] == "0.416667"
    too_little = {**CPU_HELLO, "max_cost": "0.3"}  # 600 s at 2.5/h: no node fits
    refused = await client.post("/v1/gpu/quote", json=too_little, headers=tenant.headers)
    assert (refused.status_code, refused.json()["error"]["details"]) == (
        503,
        {"constraint": "max_cost"},
    )
    await submit(client, tenant)
    await run_for(priced, clock, 36)
    quote = (await client.post("/v1/gpu/quote", json=CPU_HELLO, headers=tenant.headers)).json()
    assert (quote["expected_basis"], quote["expected_seconds"], quote["expected_cost"]) == (
        "history",
        36.0,
        "0.025",
    )
    assert (quote["available"], quote["covered"]) == ("0.475", True)
    gpu = await client.post("/v1/gpu/quote", json=HELLO_WORLD, headers=tenant.headers)
    assert (gpu.status_code, gpu.json()["error"]["code"]) == (503, "NO_CAPACITY")
    bad = await client.post(
        "/v1/gpu/quote", json={**CPU_HELLO, "timeout_sec": 0}, headers=tenant.headers
    )
    assert bad.status_code == 422


async def test_unpriced_nodes_cost_nothing_and_reserve_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    agent = await sim_agent()
    answer = await submit(client, tenant)
    assert answer.status_code == 202
    await run_for(agent, clock, 10)
    state = await invoke_of(client, tenant, answer.json()["id"])
    assert (state["cost"], state["rate_per_hour"]) == ("0", "0")
    assert await balances(app, tenant, provider) == dict.fromkeys(
        ("available", "reserved", "provider", "commission"), 0
    )


async def test_spot_work_is_held_at_the_on_demand_rate_and_charged_the_spot_rate(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    await top_up(client, tenant, "1")
    spot = {**CPU_HELLO, "priority": "spot"}
    quote = (await client.post("/v1/gpu/quote", json=spot, headers=tenant.headers)).json()
    assert (quote["rate_per_hour"], quote["max_cost"], quote["reserve"]) == (
        "1.25",  # the 50 % spot discount
        "0.208334",
        "0.416667",
    )
    answer = await submit(client, tenant, priority="spot")
    assert answer.status_code == 202, answer.text
    assert (await balances(app, tenant, provider))["reserved"] == RESERVE
    await run_for(priced, clock, 36)
    state = await invoke_of(client, tenant, answer.json()["id"])
    assert (state["rate_per_hour"], state["cost"]) == ("1.25", "0.0125")
    assert (await balances(app, tenant, provider))["available"] == 1_000_000 - 12_500
    await assert_books_balance(app)


def _cost_at_finish(**changes: Any) -> int | None:
    start = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    values: dict[str, Any] = {
        "reserved_micro": RESERVE,
        "rate_micro_per_hour": RATE,
        "preemptions": 0,
        "timeout_sec": 600,
        "started_at": start,
        "finished_at": start + timedelta(seconds=36),
        "error_code": None,
        "node_id": "node_1",
    }
    return billing.cost_at_finish(**{**values, **changes})


def test_the_cost_written_with_the_verdict_is_the_one_settling_charges() -> None:
    """`cost_at_finish` is what `settle` will compute, so the verdict's statement writes it
    and settling writes nothing more (settling would correct a difference, at one more
    statement a job)."""
    assert _cost_at_finish() == billing.metered(RATE, 36_000) == 25_000
    start = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    # at most the timeout, at most the reserve
    assert _cost_at_finish(finished_at=start + timedelta(hours=1)) == billing.metered(RATE, 600_000)
    assert _cost_at_finish(reserved_micro=1_000) == 1_000
    # a failure on the provider's side costs nothing; an unpriced or free invoke nothing
    assert _cost_at_finish(error_code=ErrorCode.AGENT_ERROR) == 0
    assert _cost_at_finish(error_code=ErrorCode.RUNTIME_ERROR) == 25_000
    assert _cost_at_finish(reserved_micro=0) == 0
    assert _cost_at_finish(rate_micro_per_hour=None, reserved_micro=0) == 0
    # preempted attempts were charged from the reserve: the ledger says what is left
    assert _cost_at_finish(preemptions=1) is None
    assert _cost_at_finish(preemptions=1, reserved_micro=0) == 0
