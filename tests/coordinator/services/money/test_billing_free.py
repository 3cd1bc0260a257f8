"""Free billing (`gpu-share up`, SPEC §4.4): nothing reserved, nothing posted, cost "0"."""

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from gpu_share.coordinator.core.orm import LedgerTransactionRow
from gpu_share.coordinator.core.settings import BillingMode, Settings
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ProviderHandle, TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory
from tests.coordinator.services.money.test_billing import (
    CPU_HELLO,
    RATE,
    invoke_of,
    run_for,
    set_price,
    submit,
)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"billing": BillingMode.FREE})


async def test_free_billing_reserves_nothing_and_costs_nothing_on_a_priced_node(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    agent = await sim_agent()
    await set_price(app, agent, provider, RATE)
    answer = await submit(client, tenant, max_cost="1")  # no balance at all: still accepted
    assert answer.status_code == 202, answer.text
    assert answer.json()["cost"] == "0"
    await run_for(agent, clock, 600)
    state = await invoke_of(client, tenant, answer.json()["id"])
    assert (state["status"], state["cost"], state["rate_per_hour"]) == ("done", "0", "0")
    balance = (await client.get("/v1/billing/balance", headers=tenant.headers)).json()
    assert (balance["billing"], balance["available"], balance["reserved"]) == ("free", "0", "0")
    quote = (await client.post("/v1/gpu/quote", json=CPU_HELLO, headers=tenant.headers)).json()
    assert (quote["max_cost"], quote["covered"]) == ("0", True)
    async with app.state.replica.db.read() as session:
        assert await session.scalar(select(func.count()).select_from(LedgerTransactionRow)) == 0
