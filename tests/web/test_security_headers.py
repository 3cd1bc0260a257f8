"""Pages keep to themselves: each sends a content security policy with no inline script or
style and `frame-ancestors 'none'`, no other site can frame one, and no request a page
makes repeats the secret in its address (Referer). In a real browser, every page of each
audience and /docs works under its policy (the `browsing` fixture fails a test whose pages
were refused anything)."""

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Page, Request, expect

from gpu_share.coordinator.http.security_headers import PAGE_POLICY
from gpu_share.coordinator.web import TEMPLATE_DIR
from gpu_share.examples import DIGITS_MODEL
from gpu_share.testing.applications import apply_as_provider, mailed_confirm_token
from gpu_share.testing.factories import TEST_ADMIN_KEY, create_provider
from gpu_share.testing.live import Live
from gpu_share.testing.simulated_agent import H100, SimulatedAgent, inventory
from tests.coordinator.services.providers.test_benchmarks import measured_like, report
from tests.coordinator.services.providers.test_provider_applications import APPLICATION
from tests.web.conftest import Browsing, screenshot, sign_in

# One database: headers and the pages' policy; the pages' data is tested on every
# database elsewhere.
pytestmark = pytest.mark.one_database

PUBLIC_PAGES = [
    "/",
    "/apply",
    "/signin",
    "/docs",
    "/apply/sent",
    "/provider/claim/gpu_ct_" + "x" * 43,
]


async def test_pages_carry_the_policy_and_the_api_only_what_it_needs(
    client: httpx.AsyncClient,
) -> None:
    for path in ("/", "/signin", "/apply", "/docs", "/apply/status/gpu_st_" + "x" * 40):
        page = await client.get(path)
        assert page.headers["content-type"].startswith("text/html"), path
        policy = page.headers["content-security-policy"]
        assert policy == PAGE_POLICY, path
        assert "frame-ancestors 'none'" in policy and "script-src 'self';" in policy
        assert "unsafe" not in policy  # no inline script or style anywhere, /docs included
        assert page.headers["x-frame-options"] == "DENY", path
        assert page.headers["x-content-type-options"] == "nosniff", path
        assert page.headers["referrer-policy"] == "no-referrer", path
    for path in ("/health", "/v1/provider/gpu-models", "/static/app.js", "/openapi.json"):
        other = await client.get(path)
        assert other.headers["x-content-type-options"] == "nosniff", path
        assert "content-security-policy" not in other.headers, path
        assert "x-frame-options" not in other.headers, path
    docs = (await client.get("/docs")).text
    assert "<script>" not in docs and not re.search(r"\son[a-z]+=", docs)  # no inline code


def test_no_template_carries_inline_script_handlers_or_style() -> None:
    """What the policy would refuse, found before a browser does: scripts live in /static."""
    found = []
    for template in sorted(TEMPLATE_DIR.rglob("*.html")):
        text = template.read_text()
        for pattern in (r"<script(?![^>]*\bsrc=)", r"\son[a-z]+\s*=", r"\sstyle\s*=", r"<style"):
            found += [f"{template.name}: {m.group(0)!r}" for m in re.finditer(pattern, text)]
    assert found == []


async def visit(page: Page, base_url: str, paths: list[str]) -> None:
    for path in paths:
        answer = await page.goto(base_url + path)
        assert answer is not None and answer.status < 500, path
        await page.wait_for_load_state("load")


async def nav_links(page: Page) -> list[str]:
    links: list[str] = await page.locator("nav[aria-label=Main] a").evaluate_all(
        "links => links.map(a => a.getAttribute('href'))"
    )
    return links


async def test_every_page_of_every_audience_works_under_its_policy(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    page = browsing.page
    application = await apply_as_provider(live.http, APPLICATION)
    await live.http.post("/v1/provider/applications", json={**APPLICATION, "email": "b@e.test"})
    confirm = await mailed_confirm_token(live.http, "b@e.test")
    await live.http.post(
        "/v1/tenant/applications",
        json={"name": "T", "email": "t@e.test", "intended_use": "Scoring"},
    )
    tenant_confirm = await mailed_confirm_token(live.http, "t@e.test")
    provider = await create_provider(live.http, "Policy Farm")
    agent = SimulatedAgent(live.base_url, node_inventory=inventory(gpus=[H100]))
    await agent.register(provider.enrollment_token)
    async with agent.beating():  # online when the invoke is placed, however loaded the machine
        for efficiency in (0.8, 0.2):  # a history to draw, and a delisting
            benchmark = report(measured_like(H100, "h100-80gb", efficiency))
            await agent.client.report_benchmark(benchmark)
        model = await live.upload(DIGITS_MODEL.read_bytes(), "model")  # the meter shows it
        invoke_id = await live.invoke(model_url=model)  # waits: the agent takes no work

    await visit(
        page,
        live.base_url,
        [
            *PUBLIC_PAGES,
            f"/apply/confirm/{confirm}",
            f"/apply/tenant/confirm/{tenant_confirm}",
            f"/apply/status/{application['status_token']}",
            "/apply/status/gpu_st_not-a-real-link-at-all",  # the message page
        ],
    )
    await page.goto(f"{live.base_url}/docs")  # Swagger runs: its dialog opens
    await page.get_by_role("button", name="Authorize").first.click()
    await expect(page.locator("#auth-bearer-value")).to_be_visible()
    await page.goto(f"{live.base_url}/apply")  # the form's script runs: one more GPU entry
    await page.get_by_role("button", name="Add another GPU model").click()
    await expect(page.locator(".gpu-entry")).to_have_count(2)

    audiences: list[tuple[str, list[str]]] = [
        (TEST_ADMIN_KEY, [f"/admin/applications/{application['id']}"]),
        (provider.key, [f"/provider/machines/{agent.node_id}/schedule"]),
        (live.tenant_headers["Authorization"].removeprefix("Bearer "), []),
    ]
    for key, details in audiences:
        await page.context.clear_cookies()
        await sign_in(page, live.base_url, key)
        await visit(page, live.base_url, [*await nav_links(page), *details])
        await screenshot(page, tmp_path, f"policy-{page.url.rsplit('/', 1)[-1]}")
    await page.goto(f"{live.base_url}/console/invokes/{invoke_id}")  # the log follows
    await expect(page.locator("pre.log[data-follow]")).to_be_visible()
    await page.goto(f"{live.base_url}/console/artifacts")
    fill = page.locator(".meter rect")
    assert float(await fill.get_attribute("width") or 0) >= 1  # drawn without a style
    await agent.aclose()
    assert browsing.outside == []


async def test_no_other_site_can_frame_a_page(live: Live, browsing: Browsing) -> None:
    page = browsing.page
    await page.set_content(f'<iframe src="{live.base_url}/signin"></iframe>')
    frame = page.frames[-1]
    await page.wait_for_timeout(500)
    assert "Sign in" not in await frame.content()
    framed = [line for line in browsing.refused if "frame-ancestors" in line]
    assert framed, browsing.refused  # the browser refused it, and said why
    browsing.refused.clear()  # the refusal this test wanted


async def test_a_secret_link_never_leaves_in_a_referer(live: Live, browsing: Browsing) -> None:
    application = await apply_as_provider(live.http, APPLICATION)
    secret = application["status_token"]
    page = browsing.page
    sent: list[dict[str, Any]] = []

    async def note(request: Request) -> None:
        sent.append({"url": request.url, "referer": await request.header_value("referer")})

    page.on("request", note)
    await page.goto(f"{live.base_url}/apply/status/{secret}")
    await page.wait_for_load_state("load")
    await page.get_by_role("link", name="Become a provider").click()
    await page.wait_for_load_state("load")
    assert len(sent) >= 4, sent  # the page, its script, style and icon, the next page
    assert [r for r in sent if r["referer"]] == []
