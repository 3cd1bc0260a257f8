"""The provider's dashboard in a real browser: their machine appears Online with its GPUs
and live telemetry, under the name they give it; the tabs not filled yet say so honestly."""

from pathlib import Path

from playwright.async_api import expect

from gpu_share.protocol.nodes import GpuInfo, GpuTelemetry, Telemetry
from gpu_share.testing.applications import approved_provider
from gpu_share.testing.live import Live
from gpu_share.testing.simulated_agent import SimulatedAgent, inventory
from tests.coordinator.services.providers.test_provider_applications import APPLICATION
from tests.web.conftest import Browsing, screenshot, sign_in, signed_in_client

H100 = GpuInfo(
    index=0,
    uuid="GPU-7f3a",
    model="NVIDIA H100 80GB HBM3",
    vram_mb=81559,
    driver_version="560.35",
    cuda_version="12.6",
)


def telemetry(utilization: float) -> Telemetry:
    return Telemetry(
        cpu_pct=12.5,
        ram_used_mb=20_000,
        gpus=[
            GpuTelemetry(
                index=0,
                utilization_pct=utilization,
                memory_used_mb=30_000,
                temperature_c=61,
                power_w=350,
            )
        ],
    )


async def test_the_dashboard_shows_a_machine_online_with_live_telemetry(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    claimed = await approved_provider(live.http, APPLICATION)
    key, token = claimed["api_key"], claimed["enrollment_token"]
    page = browsing.page
    await sign_in(page, live.base_url, key)
    assert page.url.endswith("/provider")
    assert await page.get_by_text("No machines yet").is_visible()
    await screenshot(page, tmp_path, "provider-empty")

    agent = SimulatedAgent(live.base_url)
    await agent.register(token)
    await agent.client.update_inventory(inventory(gpus=[H100], hostname="rack-7-node-2"))
    for utilization in (10.0, 55.0):
        await agent.heartbeat(telemetry=telemetry(utilization))
    machine = page.locator("section.machine")
    # Online however long the browser takes to refresh (its own timer, no reload).
    async with agent.beating(telemetry(90.0)):
        await machine.wait_for(timeout=60_000)
        assert "rack-7-node-2" in await machine.locator("h2").inner_text()
        assert (await machine.locator(".badge").first.inner_text()) == "online"
        assert "NVIDIA H100 80GB HBM3" in await machine.inner_text()
        assert "90" in await machine.locator("td").nth(1).inner_text()
        assert await machine.locator("svg.spark path").count() >= 2  # charts drew
        # Each chart names its scale and its time range: fixed tops from the page (the
        # GPU's memory, 100 % and 100 °C), the power's from the values drawn (350 W).
        scales = await machine.locator("figcaption.spark-scale").all_inner_texts()
        for top in ("0–100 %", "0–79.6 GiB", "0–100 °C"):
            assert any(text.startswith(top) for text in scales), (top, scales)
        power = await machine.locator("td").nth(4).locator("[data-spark-top]").inner_text()
        assert power.startswith("0–") and power.endswith(" W") and int(power[2:-2]) > 350, power
        assert all("last 15 min" in text for text in scales), scales
        await screenshot(page, tmp_path, "provider-machines")

    await page.get_by_role("link", name="Earnings").click()
    assert await page.get_by_text("No earnings yet").is_visible()
    assert browsing.outside == []
    await agent.aclose()


async def test_a_provider_sees_only_its_own_machines(live: Live) -> None:
    claimed = await approved_provider(live.http, APPLICATION)
    key = claimed["api_key"]
    other = SimulatedAgent(live.base_url)
    await other.register(live.enrollment_token)  # a machine of another provider
    await other.client.update_inventory(inventory(hostname="someone-elses-box"))
    async with signed_in_client(live.base_url, key) as http:
        fragment = await http.get("/provider/machines.part")
        assert fragment.status_code == 200
        assert "someone-elses-box" not in fragment.text
        assert "No machines yet" in fragment.text
        admin_page = await http.get("/admin")
        assert admin_page.status_code == 403  # a provider's cookie never reaches admin pages
    await other.aclose()


async def test_a_provider_names_a_machine_and_sees_the_name_on_the_machines_page(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    claimed = await approved_provider(live.http, APPLICATION)
    key, token = claimed["api_key"], claimed["enrollment_token"]
    agent = SimulatedAgent(live.base_url)
    await agent.register(token)
    await agent.client.update_inventory(inventory(gpus=[H100], hostname="vm"))
    page = browsing.page
    await sign_in(page, live.base_url, key)
    machine = page.locator("section.machine")
    await expect(machine.locator("h2")).to_contain_text("vm")

    name = machine.get_by_label("Name", exact=True)
    await name.fill(" x" * 40)  # 79 characters once trimmed: refused, kept in the field
    await machine.get_by_role("button", name="Save name").click()
    await expect(machine.get_by_role("alert")).to_contain_text("at most 64 characters")
    await expect(name).to_have_value(("x " * 40).strip())
    await page.wait_for_timeout(6_000)  # past a live refresh: the refusal stays on screen
    await expect(machine.get_by_role("alert")).to_contain_text("at most 64 characters")

    await name.fill("  Rack 7 · H100  ")
    await machine.get_by_role("button", name="Save name").click()
    await expect(page.get_by_text("vm is now called Rack 7 · H100.")).to_be_visible()
    await expect(machine.locator("h2")).to_contain_text("Rack 7 · H100")
    await expect(machine).to_contain_text(f"vm · {agent.node_id}")
    await expect(name).to_have_value("Rack 7 · H100")
    await screenshot(page, tmp_path, "provider-machine-named")

    async with signed_in_client(live.base_url, key) as http:  # the live refresh keeps it
        assert "Rack 7 · H100" in (await http.get("/provider/machines.part")).text
    listed = await live.http.get("/v1/nodes", headers=live.tenant_headers)
    assert [n["label"] for n in listed.json() if n["id"] == agent.node_id] == ["Rack 7 · H100"]

    await name.fill("")  # no name: its hostname again
    await machine.get_by_role("button", name="Save name").click()
    await expect(page.get_by_text("vm has no name now.")).to_be_visible()
    await expect(machine.locator("h2")).not_to_contain_text("Rack 7")
    assert browsing.outside == []
    await agent.aclose()
