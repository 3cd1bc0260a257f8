"""The SDK's billing calls against the real coordinator in-process: quote, balance,
usage, `max_cost` and `cost` on invokes, 402 as `InsufficientBalance`."""

import httpx
import pytest
from fastapi import FastAPI

from gpu_share import AsyncClient, InsufficientBalance
from gpu_share.protocol.billing import Quote
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import HELLO_WORLD, ProviderHandle, TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory
from tests.coordinator.services.money.test_billing import RATE, run_for, set_price, top_up

MNIST = str(HELLO_WORLD["model_url"])


async def test_quote_balance_usage_and_cost_through_the_sdk(
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
    with pytest.raises(InsufficientBalance, match="top up"):
        await sdk.invoke("onnx_cpu", MNIST)
    await top_up(client, tenant, "1")
    quote = await sdk.quote("onnx_cpu", MNIST, max_cost="0.5")
    assert isinstance(quote, Quote)
    assert (quote.node_id, quote.rate_per_hour, quote.max_cost) == (
        agent.node_id,
        "2.5",
        "0.416667",
    )
    queued = await sdk.invoke("onnx_cpu", MNIST, max_cost="0.5")
    assert (queued.max_cost, queued.cost) == ("0.5", None)
    assert (await sdk.balance()).reserved == "0.416667"
    await run_for(agent, clock, 36)
    assert (await sdk.get_invoke(queued.id)).cost == "0.025"
    assert (await sdk.balance()).available == "0.975"
    usage = await sdk.usage(group="runtime")
    assert [(line.key, line.cost) for line in usage.lines] == [("onnx_cpu", "0.025")]
