"""The admin's overview page counts quarantined nodes apart (docs/trust.md), over plain
HTTP against the app in-process on both databases: a quarantined node that still
heartbeats is not among the nodes online nor the GPUs offered, and is shown quarantined."""

import html
import re

import httpx
from fastapi import FastAPI

from gpu_share.testing.factories import TEST_ADMIN_KEY
from gpu_share.testing.simulated_agent import H100, AgentFactory, inventory
from tests.coordinator.services.platform.test_overview_quarantine import quarantine


async def sign_in(client: httpx.AsyncClient, key: str) -> None:
    form = await client.get("/signin")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    done = await client.post("/signin", data={"csrf": csrf.group(1), "key": key})
    assert done.status_code == 303, done.text


def stat(page: str, stat_id: str) -> str:
    """The text of the overview's stat with this id, tags dropped, spaces collapsed."""
    found = re.search(rf'<a [^>]*id="{stat_id}"[^>]*>(.*?)</a>', page, flags=re.S)
    assert found is not None, f"no stat {stat_id}"
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", found.group(1))).split())


async def test_the_overview_counts_a_quarantined_node_apart_from_the_online_ones(
    app: FastAPI, client: httpx.AsyncClient, sim_agent: AgentFactory
) -> None:
    await sim_agent(inventory(gpus=[H100] * 2, hostname="honest"))
    caught = await sim_agent(inventory(gpus=[H100] * 4, hostname="caught"))
    await sign_in(client, TEST_ADMIN_KEY)
    page = (await client.get("/admin")).text
    assert stat(page, "nodes-online").startswith("2 / 2 Nodes online 6 GPUs offered")
    assert stat(page, "nodes-quarantined").startswith("0 Nodes quarantined")

    await quarantine(app, caught)
    await caught.heartbeat()
    page = (await client.get("/admin")).text
    assert stat(page, "nodes-online") == (
        "1 / 2 Nodes online 2 GPUs offered; quarantined nodes not counted"
    )
    assert stat(page, "nodes-quarantined").startswith("1 Node quarantined Caught returning")
    assert re.search(
        r'class="stat link attention" href="/admin/nodes" id="nodes-quarantined"', page
    )
