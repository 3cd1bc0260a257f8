"""The SDK's spending limits against the real coordinator in-process: set, read, remove,
a bad amount refused before it is sent, and a refusal for the cap as
`SpendingLimitReached`."""

from decimal import Decimal

import httpx
import pytest
from fastapi import FastAPI

from gpu_share import AsyncClient, SpendingLimitReached, ValidationError
from gpu_share.protocol.spending_limits import SpendingLimits
from gpu_share.testing.factories import HELLO_WORLD, ProviderHandle, TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory
from tests.coordinator.services.money.test_billing import RATE, set_price, top_up

MNIST = str(HELLO_WORLD["model_url"])


async def test_limits_are_set_read_and_enforced_through_the_sdk(
    app: FastAPI,
    client: httpx.AsyncClient,
    sdk: AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
) -> None:
    agent = await sim_agent()
    await set_price(app, agent, provider, RATE)
    await top_up(client, tenant, "10")
    made = await sdk.set_spending_limits(monthly_cap="0.5", low_balance=Decimal("2"))
    assert isinstance(made, SpendingLimits)
    assert (made.monthly_cap, made.low_balance, made.spent, made.left) == ("0.5", "2", "0", "0.5")
    await sdk.invoke("onnx_cpu", MNIST)  # reserves 0.416667
    with pytest.raises(SpendingLimitReached, match=r"monthly cap of 0\.5 USDC") as refused:
        await sdk.invoke("onnx_cpu", MNIST)
    assert refused.value.status == 402
    assert (await sdk.spending_limits()).left == "0.083333"

    with pytest.raises(ValidationError, match="monthly_cap"):
        await sdk.set_spending_limits(monthly_cap="-3")
    assert (await sdk.spending_limits()).monthly_cap == "0.5"  # nothing was sent

    removed = await sdk.set_spending_limits()
    assert (removed.monthly_cap, removed.low_balance) == (None, None)
    await sdk.invoke("onnx_cpu", MNIST)
