"""The provider's Performance tab and schedule editor, over HTTP as a signed-in browser
sends it (cookie and CSRF token), against a real coordinator and database."""

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.async_api import Locator
from sqlalchemy import select

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import TenantRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.applications import approved_provider
from gpu_share.testing.live import AGENT_START_TIMEOUT_SEC, Live
from gpu_share.testing.simulated_agent import SimulatedAgent, inventory
from gpu_share.testing.waiting import eventually
from tests.coordinator.services.providers.test_provider_applications import APPLICATION
from tests.coordinator.services.providers.test_reliability import (
    add_invoke,
    add_presence,
    add_run,
    buckets,
    run_scores,
    set_node,
)
from tests.web.conftest import Browsing, screenshot, sign_in, signed_in_client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    settings.reliability_interval_sec = 0.2  # scored within the test, not after minutes
    return settings


@pytest.fixture
async def database(settings: Settings) -> AsyncIterator[Database]:
    """The live coordinator's database, for putting evidence in as the services would."""
    db = Database(settings.database_url)
    yield db
    await db.dispose()


async def machine(live: Live, token: str, hostname: str) -> SimulatedAgent:
    agent = SimulatedAgent(live.base_url)
    await agent.register(token)
    await agent.client.update_inventory(inventory(hostname=hostname))
    return agent


async def test_a_new_provider_sees_an_honest_empty_performance_tab(live: Live) -> None:
    claimed = await approved_provider(live.http, APPLICATION)
    key = claimed["api_key"]
    async with signed_in_client(live.base_url, key) as http:
        page = await http.get("/provider/performance")
    assert page.status_code == 200
    assert "No reliability score yet" in page.text
    assert "starts at 90 %" in page.text
    assert "will appear here" not in page.text  # the placeholder tab is gone


async def test_the_performance_tab_shows_each_machine_its_components_and_their_history(
    live: Live, database: Database
) -> None:
    claimed = await approved_provider(live.http, APPLICATION)
    key, token = claimed["api_key"], claimed["enrollment_token"]
    steady = await machine(live, token, "steady-box")
    flaky = await machine(live, token, "flaky-box")
    now = datetime.now(UTC)
    for agent in (steady, flaky):
        await set_node(database, agent.node_id, registered_at=now - timedelta(days=10))
    await add_presence(database, steady.node_id, buckets(now - timedelta(days=10), now))
    await add_presence(database, flaky.node_id, buckets(now - timedelta(days=3), now))
    async with database.read() as session:
        tenant_id = await session.scalar(select(TenantRow.id))  # the live harness's tenant
    assert tenant_id is not None
    for hours in (30, 20, 10):
        await add_invoke(database, tenant_id, steady.node_id, now - timedelta(hours=hours), None)
    await add_invoke(database, tenant_id, flaky.node_id, now - timedelta(hours=5), "NODE_LOST")
    await add_run(database, steady.node_id, now - timedelta(days=9), run_scores(node=0.8))
    await add_run(database, steady.node_id, now - timedelta(days=1), run_scores(node=0.78))

    async with signed_in_client(live.base_url, key) as http:
        page = await http.get("/provider/performance")
    assert page.status_code == 200
    text = page.text
    assert "steady-box" in text and "flaky-box" in text
    assert "All your machines" in text and "2 machines" in text
    assert "3 of 3 jobs and sessions completed; 0 lost" in text
    assert "0 of 1 jobs and sessions completed; 1 lost for provider-side causes" in text
    assert "1 run against the first" in text  # the first run is the baseline, not a run against it
    assert f'href="/provider/machines/{steady.node_id}/schedule"' in text
    charts = re.findall(r"data-values='(\[[^']*\])'", text)
    assert charts and max(len(c.split(",")) for c in charts) >= 10  # a point per day and now
    assert "No reliability score yet" not in text
    # with a record, scores are percentages: no decimals, no "new" placeholders
    assert re.search(r"All your machines: \d{2,3}(\.\d)? %</h2>", text), text
    assert re.search(r"steady-box: \d{2,3}(\.\d)? %</h2>", text)
    assert re.search(r"flaky-box: \d{2,3}(\.\d)? %</h2>", text)
    assert "New — no history yet" not in text
    assert text.count('<div class="value">no history yet</div>') == 1  # flaky-box: no benchmark
    assert not re.search(r'<div class="value">0\.\d+</div>', text)
    for agent in (steady, flaky):
        await agent.aclose()


async def test_a_new_machine_shows_no_history_instead_of_made_up_figures(
    live: Live, database: Database
) -> None:
    """Half an hour old, online all along, its first benchmark run done: nothing yet says
    how reliable it is, so no score, component or drop is shown as a number."""
    claimed = await approved_provider(live.http, APPLICATION)
    key, token = claimed["api_key"], claimed["enrollment_token"]
    fresh = await machine(live, token, "fresh-box")
    now = datetime.now(UTC)
    since = now - timedelta(minutes=30)
    await set_node(database, fresh.node_id, registered_at=since)
    await add_presence(database, fresh.node_id, buckets(since, now + timedelta(minutes=10)))
    await add_run(database, fresh.node_id, since + timedelta(minutes=2), run_scores(node=0.8))

    async with signed_in_client(live.base_url, key) as http:
        text = (await http.get("/provider/performance")).text
    assert "fresh-box: New — no history yet (starts at 90 %)</h2>" in text
    assert "All your machines: New — no history yet (starts at 90 %)</h2>" in text
    assert text.count('<div class="value">no history yet</div>') == 6  # 3 parts, twice
    assert "is the baseline; later runs are measured against it" in text
    assert "latest 0" not in text and "worst 0" not in text  # no drop against itself
    assert "0.900" not in text and "0.933" not in text and "93.3 %" not in text

    await add_run(database, fresh.node_id, now - timedelta(minutes=1), run_scores(node=0.4))
    async with signed_in_client(live.base_url, key) as http:
        text = (await http.get("/provider/performance")).text
    assert "no history yet (starts" not in text  # a run measured against the first
    assert re.search(r"fresh-box: \d{2}(\.\d)? %</h2>", text), text
    assert "1 run against the first" in text and "latest 47.4 %, worst 47.4 %" in text
    await fresh.aclose()


async def test_a_real_agents_benchmarks_and_score_in_a_browser(
    live: Live, browsing: Browsing, settings: Settings, tmp_path: Path
) -> None:
    """A real agent process benchmarks itself; the provider sees its figures on the
    Benchmarks tab and its neutral first score, parts and charts on the Performance tab."""
    claimed = await approved_provider(live.http, APPLICATION)
    key, token = claimed["api_key"], claimed["enrollment_token"]
    live.enrollment_token = token
    live.agent(
        "bench", env={"GPUSHARE_AGENT_BENCHMARKS": "1", "GPUSHARE_AGENT_BENCHMARK_QUIET_SEC": "0"}
    )
    page = browsing.page
    await sign_in(page, live.base_url, key)
    await page.get_by_role("link", name="Benchmarks").click()
    machine = page.locator("section.machine")

    async def shown(region: Locator) -> str:
        await page.reload()
        return await region.inner_text() if await region.count() else ""

    text = await eventually(  # the agent starts, then runs its CPU suite
        lambda: shown(machine),
        lambda text: "Last run" in text,
        what="the agent's first benchmark run on the Benchmarks tab",
        timeout=AGENT_START_TIMEOUT_SEC + 120,
        every=0.25,
    )
    assert "CPU matmul" in text and "GFLOP/s" in text, text
    assert "passed" in text or "delisted" in text  # the verdict: tests/e2e/test_benchmarks.py
    await screenshot(page, tmp_path, "provider-benchmarks")

    await page.get_by_role("link", name="Performance").click()
    main = await eventually(  # the reliability loop runs every 0.2 s here
        lambda: shown(page.locator("main")),
        lambda text: "No reliability score yet" not in text,
        what="the machine's first reliability score",
    )
    assert "New — no history yet (starts at 90 %)" in main and "Uptime in your windows" in main
    assert "0.0 %" not in main and "0.9" not in main, main
    assert await page.locator("svg.spark").count() == 0  # minutes old: no line to draw yet
    assert await page.get_by_text("Charts of each score by day appear here").is_visible()
    await screenshot(page, tmp_path, "provider-performance")
    assert browsing.outside == []


async def test_the_schedule_editor_saves_windows_and_says_what_to_fix(live: Live) -> None:
    claimed = await approved_provider(live.http, APPLICATION)
    key, token = claimed["api_key"], claimed["enrollment_token"]
    agent = await machine(live, token, "evening-box")
    url = f"/provider/machines/{agent.node_id}/schedule"
    async with signed_in_client(live.base_url, key) as http:
        form = await http.get(url)
        assert form.status_code == 200
        assert "evening-box" in form.text and 'value="always" data-schedule' in form.text
        csrf = csrf_of(form.text)
        window = {"window-0-days": ["mon", "fri"], "window-0-start": "18:00"}

        forged = await http.post(url, data={"mode": "schedule", **window, "window-0-end": "23:00"})
        assert forged.status_code == 403  # no CSRF token: refused, nothing saved

        wrong = await http.post(
            url,
            data={
                "csrf": csrf,
                "rows": "2",
                "mode": "schedule",
                "timezone": "Europe",  # a folder of zones, not one
                **window,
                "window-0-end": "09:00",
                "window-1-start": "25:00",
                "window-1-end": "26:00",
            },
        )
        assert wrong.status_code == 422
        page = wrong.text
        assert 'id="timezone-error"' in page and "IANA time zone" in page
        assert 'id="window-0-end-error"' in page and "must be after start 18:00" in page
        assert 'id="window-1-days-error"' in page and "choose at least one day" in page
        assert 'id="window-1-start-error"' in page and "HH:MM" in page
        assert 'value="Europe"' in page and 'value="18:00"' in page  # kept as typed

        more = await http.post(url, data={"csrf": csrf, "mode": "schedule", "add": "1", **window})
        assert more.status_code == 200 and 'name="window-1-start"' in more.text

        saved = await http.post(
            url,
            data={
                "csrf": csrf,
                "rows": "2",
                "mode": "schedule",
                "timezone": "Europe/Berlin",
                **window,
                "window-0-end": "24:00",
            },
        )
        assert saved.status_code == 303
        shown = await http.get(url)
        assert "Saved: evening-box is now listed its weekly windows" in shown.text
        assert 'value="Europe/Berlin"' in shown.text and 'value="24:00"' in shown.text
    stored = await live.http.get(
        f"/v1/provider/nodes/{agent.node_id}/availability",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert stored.json() == {
        "always": False,
        "timezone": "Europe/Berlin",
        "windows": [{"days": ["mon", "fri"], "start": "18:00", "end": "24:00"}],
    }
    await agent.aclose()


async def test_another_providers_machine_has_no_schedule_page(live: Live) -> None:
    claimed = await approved_provider(live.http, APPLICATION)
    key = claimed["api_key"]
    other = await machine(live, live.enrollment_token, "someone-elses-box")
    async with signed_in_client(live.base_url, key) as http:
        page = await http.get(f"/provider/machines/{other.node_id}/schedule")
        assert page.status_code == 404 and "someone-elses-box" not in page.text
        csrf = csrf_of((await http.get("/provider/performance")).text)
        post = await http.post(
            f"/provider/machines/{other.node_id}/schedule", data={"csrf": csrf, "mode": "always"}
        )
        assert post.status_code == 404
    await other.aclose()
