"""The marketplace page of the tenant console, in a real browser."""

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.settings import Settings
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.live import Live
from gpu_share.testing.simulated_agent import H100, SimulatedAgent, inventory
from gpu_share.testing.verification import mark_verified
from gpu_share.testing.waiting import eventually
from tests.coordinator.services.providers.test_reliability import add_presence, buckets, set_node
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

        row = await reloaded()  # scored at registration: where it starts, no record yet
        assert "New — no history yet (starts at 90 %)" in row, row
        assert "0.90" not in row and "uptime" not in row
        await screenshot(page, tmp_path, "tenant-marketplace")

        await page.get_by_label("Region").fill("us-east")
        await page.get_by_role("button", name="Show offers").click()
        assert await page.get_by_text("No machine matches right now").is_visible()
    assert browsing.outside == []
    await agent.aclose()


async def test_bad_filters_say_what_to_fix(live: Live) -> None:
    async with signed_in_client(live.base_url, key_of(live)) as http:
        page = await http.get("/console/marketplace", params={"min_reliability": "700"})
        assert page.status_code == 200
        assert "give a percentage from 0 to 100" in page.text, page.text[:3000]


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


async def test_scores_are_percentages_and_a_new_machine_says_it_has_no_history(
    live: Live, settings: Settings
) -> None:
    """On the marketplace and the nodes page: a machine online for ten days shows its
    score and uptime as percentages (its jobs and benchmarks: no history yet); one that
    just arrived shows where it starts, not figures nothing is behind."""
    veteran = SimulatedAgent(live.base_url)
    await veteran.register(live.enrollment_token)
    await veteran.client.update_inventory(inventory(hostname="veteran"))
    newcomer = SimulatedAgent(live.base_url)
    await newcomer.register(live.enrollment_token)
    await newcomer.client.update_inventory(inventory(hostname="newcomer", machine="new"))
    for agent in (veteran, newcomer):
        await verified(live, agent)
    now = datetime.now(UTC)
    database = Database(settings.database_url)
    await add_presence(database, veteran.node_id, buckets(now - timedelta(days=10), now))
    await set_node(database, veteran.node_id, registered_at=now - timedelta(days=10))
    await database.dispose()
    assert veteran.node_id is not None and newcomer.node_id is not None

    async with (
        veteran.beating(),
        newcomer.beating(),
        signed_in_client(live.base_url, key_of(live)) as http,
    ):

        async def reliability_cells() -> dict[str, str]:
            page = (await http.get("/console/marketplace")).text
            rows = re.findall(r"<tr>\s*(<td><code>(nod_\w+)</code>.*?)</tr>", page, re.S)
            # Machine, GPUs, Price, Reliability, …
            return {node: re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[3] for row, node in rows}

        cells = await eventually(  # the reliability loop reads the ten days
            reliability_cells,
            lambda found: "uptime 99." in found.get(str(veteran.node_id), ""),
            what="the veteran's score with its parts",
        )
        old, new = cells[veteran.node_id], cells[newcomer.node_id]
        assert re.match(r"\d{2,3}(\.\d)? %<br>", old), old
        assert re.search(r"uptime \d{2,3}(\.\d)? % · jobs no history yet · stability no", old)
        assert new == "New — no history yet (starts at 90 %)"

        picky = (await http.get("/console/marketplace", params={"min_reliability": "95"})).text
        assert veteran.node_id in picky and newcomer.node_id not in picky  # 95 %, not 0.95

        nodes = (await http.get("/console/nodes")).text
        assert "New — no history yet (starts at 90 %)" in nodes
        assert nodes.count("no history yet") == 1
        assert not re.search(r"<td>0\.\d+</td>", nodes)
    for agent in (veteran, newcomer):
        await agent.aclose()
