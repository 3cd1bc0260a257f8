"""The marketplace page of the tenant console, in a real browser."""

from pathlib import Path

import pytest

from gpu_share.coordinator.core.settings import Settings
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.live import Live
from gpu_share.testing.simulated_agent import H100, SimulatedAgent, inventory
from gpu_share.testing.verification import mark_verified
from gpu_share.testing.waiting import eventually
from tests.coordinator.services.work.test_gpu_assignment import TWO_PAIRS
from tests.web.conftest import Browsing, screenshot, sign_in, signed_in_client


@pytest.fixture
def settings(settings: Settings) -> Settings:
    settings.reliability_interval_sec = 0.2  # scored within the test, not after minutes
    return settings


def key_of(live: Live) -> str:
    return live.tenant_headers["Authorization"].removeprefix("Bearer ")


async def verified(live: Live, agent: SimulatedAgent) -> None:
    """The agent's hardware passed its challenges: offered by default."""
    assert live.replica is not None and agent.node_id is not None
    await mark_verified(live.replica, agent.node_id)


async def test_the_marketplace_lists_offers_and_filters_them(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    agent = SimulatedAgent(live.base_url)
    await agent.register(live.enrollment_token)
    await agent.client.update_inventory(inventory(hostname="market-node", region="eu-west"))
    await verified(live, agent)
    page = browsing.page
    async with agent.beating():  # online (offered) however long the browser takes
        await sign_in(page, live.base_url, key_of(live))
        await page.get_by_role("link", name="Marketplace").click()
        table = page.locator("main table")
        assert agent.node_id is not None and agent.node_id in await table.inner_text()

        async def reloaded() -> str:
            await page.reload()
            return await table.inner_text()

        await eventually(  # the reliability loop scores the new node: neutral, with its parts
            reloaded, lambda text: "uptime" in text, what="the node's score shown with its parts"
        )
        row = await table.locator("tbody tr").first.inner_text()
        assert "0.90" in row and "uptime 0.90 · jobs 0.90 · stability 0.90" in row, row
        await screenshot(page, tmp_path, "tenant-marketplace")

        await page.get_by_label("Region").fill("us-east")
        await page.get_by_role("button", name="Show offers").click()
        assert await page.get_by_text("No machine matches right now").is_visible()
    assert browsing.outside == []
    await agent.aclose()


async def test_bad_filters_say_what_to_fix(live: Live) -> None:
    async with signed_in_client(live.base_url, key_of(live)) as http:
        page = await http.get("/console/marketplace", params={"min_reliability": "7"})
        assert page.status_code == 200
        assert "less than or equal to 1" in page.text, page.text[:3000]


async def test_nvlink_is_shown_and_filtered_on(live: Live) -> None:
    linked = SimulatedAgent(live.base_url)
    await linked.register(live.enrollment_token)
    await linked.client.update_inventory(
        inventory(runtimes=[RuntimeName.ONNX_CUDA], gpus=[H100] * 4, gpu_topology=TWO_PAIRS)
    )
    await verified(live, linked)
    async with linked.beating(), signed_in_client(live.base_url, key_of(live)) as http:
        page = await http.get("/console/marketplace", params={"nvlink": "true"})
        assert page.status_code == 200
        assert linked.node_id is not None and linked.node_id in page.text
        assert ">NVLink</span>" in page.text and "GPU 0–1: 4 links;" in page.text
        assert 'value="true" selected' in page.text
        page = await http.get("/console/marketplace", params={"nvlink": "false"})
        assert linked.node_id not in page.text
    await linked.aclose()
