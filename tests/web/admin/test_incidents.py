"""The spot checks on the pages (docs/trust.md): the admin's incidents with their evidence,
the overview's count of checks waiting for a trusted node, the nodes page's trusted
mark, and the provider's incidents, which never show the tenant's job."""

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.core.orm import InvokeRow, NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TEST_ADMIN_KEY, ProviderHandle, TenantHandle
from gpu_share.testing.rogue_agents import FakeOutputs
from gpu_share.testing.simulated_agent import AgentFactory
from gpu_share.testing.spot_checks import SpotCheckBench
from tests.web.admin.test_pages import csrf_of, signed_in


@pytest.fixture
def settings(settings: Settings) -> Settings:
    settings.spot_check_start_rate = 1.0
    settings.spot_check_floor_rate = 1.0
    return settings


@pytest.fixture
async def bench(
    app: FastAPI,
    client: httpx.AsyncClient,
    clock: FrozenClock,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
) -> AsyncIterator[SpotCheckBench]:
    made = SpotCheckBench(app, client, clock, provider, sim_agent)
    yield made
    for agent in made.agents:
        await agent.aclose()


async def test_the_admin_reads_the_evidence_and_the_provider_the_incident(
    bench: SpotCheckBench, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    rogue = await bench.node()
    await bench.top_up(tenant)
    (job,) = await bench.submit(tenant)
    await bench.run(rogue, FakeOutputs())
    await bench.spot_pass()
    await signed_in(client, TEST_ADMIN_KEY)
    overview = await client.get("/admin")
    assert "1</span>" in overview.text and "check waiting for a trusted node" in overview.text

    trusted = await bench.trusted_node()
    passes = await bench.check_round(trusted)
    (incident,) = [c.caught.incident_id for p in passes for c in p.concluded if c.caught]
    listed = await client.get("/admin/incidents")
    assert listed.status_code == 200 and incident in listed.text
    detail = await client.get(f"/admin/incidents/{incident}")
    assert detail.status_code == 200, detail.text
    async with bench.replica.db.read() as session:
        checked = await session.get(InvokeRow, job)
    assert checked is not None and checked.inputs_sha256 and checked.model_sha256
    for shown in (checked.inputs_sha256, checked.model_sha256, "logits", "What the node returned"):
        assert shown in detail.text
    assert (await client.get("/admin/incidents/inc_nothing")).status_code == 404

    await client.post("/signout", data={"csrf": csrf_of(detail.text)})
    await signed_in(client, bench.provider.key)
    theirs = await client.get("/provider/incidents")
    assert theirs.status_code == 200 and incident in theirs.text
    assert "models.example.com" not in theirs.text and checked.inputs_sha256 not in theirs.text


async def test_the_admin_marks_a_node_trusted_from_the_nodes_page(
    bench: SpotCheckBench, client: httpx.AsyncClient
) -> None:
    node = await bench.node()
    await signed_in(client, TEST_ADMIN_KEY)
    page = await client.get("/admin/nodes")
    assert "Mark trusted" in page.text
    marked = await client.post(
        f"/admin/nodes/{node.node_id}/trusted", data={"csrf": csrf_of(page.text), "trusted": "on"}
    )
    assert marked.status_code == 303, marked.text
    async with bench.replica.db.read() as session:
        row = await session.get(NodeRow, node.node_id)
        assert row is not None and row.trusted
    page = await client.get("/admin/nodes")
    assert "Unmark trusted" in page.text and ">trusted</span>" in page.text
    forged = await client.post(
        f"/admin/nodes/{node.node_id}/trusted", data={"csrf": "forged", "trusted": "off"}
    )
    assert forged.status_code == 403
