"""The tenant's Usage page after a refund, over plain HTTP against the app in-process
(both databases): the refunded charge is marked refunded with what came back and why,
and what the page says was spent is net of it, as the API's usage and the books say."""

import html
import re

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, ProviderHandle, TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory, SimulatedAgent
from tests.coordinator.services.money.test_refunded_usage import (
    REASON,
    available,
    priced_agent,
    refund,
    run_invoke,
)


@pytest.fixture
async def priced(
    app: FastAPI, sim_agent: AgentFactory, provider: ProviderHandle, clock: FrozenClock
) -> SimulatedAgent:
    return await priced_agent(app, sim_agent, provider, clock)


async def sign_in(client: httpx.AsyncClient, key: str) -> None:
    form = await client.get("/signin")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    done = await client.post("/signin", data={"csrf": csrf.group(1), "key": key})
    assert done.status_code == 303, done.text


def text_of(fragment: str) -> str:
    """What a reader sees of some HTML: tags dropped, entities read, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def charge_rows(page: str) -> dict[str, str]:
    """The Latest charges table's rows by the invoke each names, as text; a refunded
    row is prefixed with "[refunded]"."""
    table = page[page.index("<h2>Latest charges</h2>") :]
    rows = {}
    for attributes, row in re.findall(r"<tr([^>]*)>(.*?)</tr>", table, flags=re.S):
        invoke = re.search(r"/console/invokes/(inv_\w+)", row)
        if invoke:
            marker = "[refunded] " if 'class="refunded"' in attributes else ""
            rows[invoke.group(1)] = marker + text_of(row)
    return rows


async def test_the_usage_page_marks_a_refunded_charge_and_leaves_it_out_of_what_was_spent(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    priced: SimulatedAgent,
    clock: FrozenClock,
) -> None:
    credited = await client.post(
        f"/v1/admin/tenants/{tenant.id}/top-ups",
        json={"amount": "1", "reference": "wire-1"},
        headers=ADMIN,
    )
    assert credited.status_code == 201, credited.text
    kept = await run_invoke(client, tenant, priced, clock, 36)
    undone = await run_invoke(client, tenant, priced, clock, 72)
    assert await refund(app, priced.node_id or "", undone) == 50_000

    await sign_in(client, tenant.key)
    answer = await client.get("/console/usage")
    assert answer.status_code == 200, answer.text
    page = answer.text

    spent = re.search(r'id="spent">([^<]*)<', page)
    assert spent is not None and spent.group(1).strip() == "0.025"  # 0.075 charged, 0.05 back
    refunded = re.search(r'id="refunded">([^<]*)<', page)
    assert refunded is not None and refunded.group(1) == "0.05 USDC"
    assert await available(app, tenant) == 1_000_000 - 25_000  # what the books say

    rows = charge_rows(page)
    assert set(rows) == {kept, undone}
    assert rows[undone].startswith("[refunded] ")
    assert "0.05 USDC refunded 0.05 USDC given back" in rows[undone]
    assert REASON in rows[undone]
    assert not rows[kept].startswith("[refunded]") and "refunded" not in rows[kept]
    assert rows[kept].endswith("0.025 USDC")

    per_runtime = text_of(page[page.index('id="per-runtime"') : page.index('id="per-day"')])
    assert "Refunded" in per_runtime and "onnx_cpu 2 108.0 s 0.05 USDC 0.025 USDC" in per_runtime


async def test_without_refunds_the_page_shows_no_refund_column(
    client: httpx.AsyncClient, tenant: TenantHandle, priced: SimulatedAgent, clock: FrozenClock
) -> None:
    await client.post(
        f"/v1/admin/tenants/{tenant.id}/top-ups",
        json={"amount": "1", "reference": "wire-1"},
        headers=ADMIN,
    )
    await run_invoke(client, tenant, priced, clock, 36)
    await sign_in(client, tenant.key)
    page = (await client.get("/console/usage")).text
    assert 'id="refunded"' not in page and "Refunded</th>" not in page
    spent = re.search(r'id="spent">([^<]*)<', page)
    assert spent is not None and spent.group(1).strip() == "0.025"
