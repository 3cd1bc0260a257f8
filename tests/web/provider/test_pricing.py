"""The provider's Pricing tab: a price per GPU model set through the form, its errors,
and the market's recommendation beside it, in a real browser and over HTTP as a
signed-in browser sends it, against a real coordinator and database."""

import re
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.applications import approved_provider
from gpu_share.testing.factories import ProviderHandle, bearer, create_provider
from gpu_share.testing.live import Live
from gpu_share.testing.simulated_agent import AgentFactory, SimulatedAgent, inventory
from tests.coordinator.services.providers.test_provider_applications import APPLICATION
from tests.protocol.test_money import OFF_PATTERN
from tests.web.admin.test_pages import signed_in
from tests.web.conftest import Browsing, screenshot, sign_in, signed_in_client
from tests.web.provider.test_machines import H100
from tests.web.provider.test_performance import csrf_of

CARD = "section#model-nvidia-h100-80gb-hbm3"


async def h100_machine(live: Live, token: str, hostname: str, region: str) -> SimulatedAgent:
    agent = SimulatedAgent(live.base_url)
    await agent.register(token)
    await agent.client.update_inventory(  # a machine of its own: its H100 has its own UUID
        inventory(gpus=[H100], hostname=hostname, region=region, machine=hostname)
    )
    return agent


async def competitor(live: Live, name: str, price: str) -> SimulatedAgent:
    """Another provider's H100 machine in eu-west, priced through the API."""
    other = await create_provider(live.http, name)
    agent = await h100_machine(live, other.enrollment_token, name, "eu-west")
    answer = await live.http.put(
        f"/v1/provider/prices/{quote(H100.model)}",
        json={"price_per_gpu_hour": price, "spot_discount_pct": 50},
        headers=bearer(other.key),
    )
    assert answer.status_code == 200, answer.text
    return agent


async def test_a_provider_without_machines_sees_an_honest_empty_pricing_tab(live: Live) -> None:
    claimed = await approved_provider(live.http, APPLICATION)
    key = claimed["api_key"]
    async with signed_in_client(live.base_url, key) as http:
        page = await http.get("/provider/pricing")
    assert page.status_code == 200
    assert "No machines yet" in page.text and "Suggested" not in page.text
    assert "You will set an hourly rate" not in page.text  # the placeholder is gone


async def test_the_form_refuses_what_is_wrong_and_changes_nothing(live: Live) -> None:
    claimed = await approved_provider(live.http, APPLICATION)
    key, token = claimed["api_key"], claimed["enrollment_token"]
    agent = await h100_machine(live, token, "rack-1", "eu-west")
    async with signed_in_client(live.base_url, key) as http:
        csrf = csrf_of((await http.get("/provider/pricing")).text)
        form = {"csrf": csrf, "gpu_model": H100.model}
        for price, discount, message in [
            ("0", "40", "more than 0 USDC"),
            ("-3", "40", "more than 0 USDC"),
            ("2.1234567", "40", "at most 6 decimal places"),
            ("5000", "40", "at most 1000 USDC"),
            ("two", "40", "is not a number of USDC"),
            ("2", "29", "between 30 and 70"),
            ("2", "forty", "whole number of percent"),
        ]:
            answer = await http.post(
                "/provider/pricing", data={**form, "price": price, "discount": discount}
            )
            assert answer.status_code == 422, (price, discount)
            assert message in answer.text and "Not saved" in answer.text, (price, discount)
        elsewhere = await http.post(
            "/provider/pricing",
            data={**form, "gpu_model": "NVIDIA A100-SXM4-80GB", "price": "2", "discount": "40"},
        )
        assert elsewhere.status_code == 422
        assert "none of your machines runs" in elsewhere.text
        forged = await http.post(
            "/provider/pricing", data={**form, "csrf": "x", "price": "2", "discount": "40"}
        )
        assert forged.status_code == 403
        prices = await live.http.get("/v1/provider/prices", headers=bearer(key))
        assert prices.json()["prices"] == []

        saved = await http.post("/provider/pricing", data={**form, "price": "2", "discount": "40"})
        assert saved.status_code == 303
        removed = await http.post(
            "/provider/pricing/remove", data={"csrf": csrf, "gpu_model": H100.model}
        )
        assert removed.status_code == 303
        page = await http.get("/provider/pricing")
        assert "Removed the price of" in page.text and "No price yet" in page.text
    await agent.aclose()


async def test_a_provider_prices_a_gpu_model_in_a_browser_beside_the_market(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    claimed = await approved_provider(live.http, APPLICATION)
    key, token = claimed["api_key"], claimed["enrollment_token"]
    mine = await h100_machine(live, token, "rack-7-node-2", "eu-west")
    others = [
        await competitor(live, name, price)
        for name, price in (("North Racks", "2.2"), ("Lake Compute", "2.6"), ("Fjord GPU", "3.1"))
    ]
    page = browsing.page
    await sign_in(page, live.base_url, key)
    await page.get_by_role("link", name="Pricing").click()
    card = page.locator(CARD)
    text = await card.inner_text()
    assert "No price yet" in text and "1 machine of yours" in text
    assert "Suggested 2.6 USDC" in text and "3 offers (3 GPUs), in eu-west" in text, text
    assert "2.2 – 3.1 USDC" in text

    await page.get_by_label("Price per GPU-hour (USDC)").fill("2.1234567")
    await page.get_by_label("Spot discount (%)").fill("75")
    await page.get_by_role("button", name="Set price").click()
    alert = card.get_by_role("alert")
    assert "at most 6 decimal places" in await alert.inner_text()
    assert "between 30 and 70 percent" in await alert.inner_text()
    assert await page.get_by_label("Price per GPU-hour (USDC)").input_value() == "2.1234567"
    await screenshot(page, tmp_path, "provider-pricing-error")

    await page.get_by_label("Price per GPU-hour (USDC)").fill("2.4")
    await page.get_by_label("Spot discount (%)").fill("40")
    await page.get_by_role("button", name="Set price").click()
    flash = await page.get_by_role("status").inner_text()
    assert "Saved: NVIDIA H100 80GB HBM3 at 2.4 USDC per GPU-hour, spot 1.44" in flash
    text = await card.inner_text()
    assert "On demand 2.4 USDC per GPU-hour" in text and "Spot 1.44 USDC (40 % off)" in text
    assert "2.4 USDC, 33rd percentile" in text and "33 % of that supply is cheaper" in text
    await screenshot(page, tmp_path, "provider-pricing")

    nodes = (await live.http.get("/v1/nodes", headers=live.tenant_headers)).json()
    assert {n["id"]: n["price_per_gpu_hour"] for n in nodes}[mine.node_id] == "2.4"
    assert browsing.outside == []
    for agent in (mine, *others):
        await agent.aclose()


@pytest.mark.parametrize("price", OFF_PATTERN)
async def test_a_price_off_the_published_pattern_is_shown_beside_its_field_and_not_saved(
    client: httpx.AsyncClient, provider: ProviderHandle, sim_agent: AgentFactory, price: str
) -> None:
    await sim_agent(inventory(gpus=[H100], runtimes=[RuntimeName.ONNX_CUDA]))
    csrf = await signed_in(client, provider.key)
    answer = await client.post(
        "/provider/pricing",
        data={"csrf": csrf, "gpu_model": H100.model, "price": price, "discount": "40"},
    )
    assert answer.status_code == 422, answer.text
    error = re.search(r'<p class="error" id="price-\d+-error">([^<]+)</p>', answer.text)
    assert error and "USDC" in error.group(1), answer.text
    prices = await client.get("/v1/provider/prices", headers=bearer(provider.key))
    assert prices.json()["prices"] == []
