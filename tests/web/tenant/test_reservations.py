"""The tenant console's Reservations page, in a real browser: quote, confirm, cancel."""

from pathlib import Path
from urllib.parse import quote

from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.factories import ADMIN, create_provider
from gpu_share.testing.live import Live
from gpu_share.testing.simulated_agent import H100, SimulatedAgent, inventory
from gpu_share.testing.verification import mark_verified
from tests.web.conftest import Browsing, screenshot, sign_in, signed_in_client


def key_of(live: Live) -> str:
    return live.tenant_headers["Authorization"].removeprefix("Bearer ")


async def test_a_tenant_quotes_reserves_and_cancels_in_the_console(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    provider = await create_provider(live.http)
    gpus = [H100.model_copy(update={"index": n, "uuid": f"GPU-{n}"}) for n in range(2)]
    agent = SimulatedAgent(live.base_url)
    await agent.register(provider.enrollment_token)
    await agent.client.update_inventory(
        inventory(hostname="rent-node", runtimes=[RuntimeName.ONNX_CUDA], gpus=gpus)
    )
    assert live.replica is not None and agent.node_id is not None
    await mark_verified(live.replica, agent.node_id)  # only proven GPUs are reserved
    priced = await live.http.put(
        f"/v1/provider/prices/{quote(H100.model)}",
        json={"price_per_gpu_hour": "1.5", "spot_discount_pct": 40},
        headers={"Authorization": f"Bearer {provider.key}"},
    )
    assert priced.status_code == 200, priced.text
    tenant_id = (await live.http.get("/v1/billing/balance", headers=live.tenant_headers)).json()[
        "tenant_id"
    ]
    topped = await live.http.post(
        f"/v1/admin/tenants/{tenant_id}/top-ups",
        json={"amount": "100", "reference": "wire-rsv"},
        headers=ADMIN,
    )
    assert topped.status_code in (200, 201), topped.text

    async with agent.beating():  # online (reservable) however long the browser takes
        page = browsing.page
        await sign_in(page, live.base_url, key_of(live))
        await page.get_by_role("link", name="Reservations").click()
        await page.get_by_label("GPUs").fill("2")
        await page.get_by_label("Hours").fill("4")
        await page.get_by_role("button", name="Get a quote").click()
        assert await page.locator("#quote-cost").inner_text() == "12 USDC"  # 1.5 × 2 × 4
        await page.get_by_role("button", name="Reserve for 12 USDC").click()
        table = page.locator("main table")
        row = await table.locator("tbody tr").first.inner_text()
        assert agent.node_id is not None and agent.node_id in row, row
        assert "active" in row.lower() and "12 USDC" in row, row
        await screenshot(page, tmp_path, "tenant-reservations")

        balance = (await live.http.get("/v1/billing/balance", headers=live.tenant_headers)).json()
        assert balance["available"] == "88" and balance["reserved"] == "12"

        await page.get_by_role("button", name="Cancel").first.click()
        row = await page.locator("main table tbody tr").first.inner_text()
        assert "canceled" in row.lower() and "3 USDC" in row, row  # the hour begun
    assert browsing.outside == []
    await agent.aclose()


async def test_the_providers_machines_show_reserved_gpus(live: Live) -> None:
    provider = await create_provider(live.http)
    gpus = [H100.model_copy(update={"index": n, "uuid": f"GPU-{n}"}) for n in range(2)]
    agent = SimulatedAgent(live.base_url)
    await agent.register(provider.enrollment_token)
    await agent.client.update_inventory(
        inventory(hostname="rent-node", runtimes=[RuntimeName.ONNX_CUDA], gpus=gpus)
    )
    assert live.replica is not None and agent.node_id is not None
    await mark_verified(live.replica, agent.node_id)  # only proven GPUs are reserved
    async with agent.beating():  # online (reservable) however loaded the machine
        made = await live.http.post(
            "/v1/reservations",
            json={"node_id": agent.node_id, "hours": 1},
            headers=live.tenant_headers,
        )
    assert made.status_code == 201, made.text  # no price set: it costs 0
    async with signed_in_client(live.base_url, provider.key) as http:
        page = await http.get("/provider")
    assert page.status_code == 200
    assert "1 GPU reserved" in page.text and ">reserved</span>" in page.text
    await agent.aclose()
