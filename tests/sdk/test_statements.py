"""The SDK's monthly statement against the real coordinator in-process: this month's
spend by runtime and GPU model as JSON and as CSV, from both clients; a month that is
not YYYY-MM, or has not started, refused as `ValidationError`."""

import asyncio
from datetime import timedelta

import httpx
import pytest
from fastapi import FastAPI

from gpu_share import AsyncClient, Client, ValidationError
from gpu_share.protocol.statements import TenantStatement
from gpu_share.sdk import RetryPolicy
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import HELLO_WORLD, ProviderHandle, TenantHandle
from gpu_share.testing.servers import serve
from gpu_share.testing.simulated_agent import AgentFactory
from tests.coordinator.services.money.test_billing import RATE, run_for, set_price, top_up

MNIST = str(HELLO_WORLD["model_url"])


async def test_this_months_statement_as_json_and_csv_from_both_clients(
    app: FastAPI,
    client: httpx.AsyncClient,
    sdk: AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    agent = await sim_agent()
    await set_price(app, agent, provider, RATE)
    await top_up(client, tenant, "1")
    await sdk.invoke("onnx_cpu", MNIST)
    await run_for(agent, clock, 36)
    month = clock.now().strftime("%Y-%m")

    found = await sdk.statement(month)
    assert isinstance(found, TenantStatement)
    assert (found.month, found.complete, found.total.net) == (month, False, "0.025")
    assert [(line.key, line.charges, line.net) for line in found.by_runtime] == [
        ("onnx_cpu", 1, "0.025")
    ]
    assert (await sdk.statement(clock.now().date())) == found  # any date names its month
    csv = await sdk.statement_csv(month)
    assert "onnx_cpu" in csv and "0.025" in csv

    async with serve(app, lifespan=False) as base_url:

        def blocking() -> tuple[TenantStatement, str]:
            with Client(base_url, tenant.key, retry=RetryPolicy(backoff_base=0.01)) as c:
                return c.statement(month), c.statement_csv(month)

        assert await asyncio.to_thread(blocking) == (found, csv)


@pytest.mark.parametrize("month", ["2026-13", "last month", "next"])
async def test_a_month_that_is_not_yyyy_mm_or_to_come_is_refused(
    sdk: AsyncClient, clock: FrozenClock, month: str
) -> None:
    if month == "next":
        month = (clock.now() + timedelta(days=32)).strftime("%Y-%m")
    with pytest.raises(ValidationError, match="month") as refused:
        await sdk.statement(month)
    assert refused.value.status == 422
    with pytest.raises(ValidationError, match="month"):
        await sdk.statement_csv(month)
