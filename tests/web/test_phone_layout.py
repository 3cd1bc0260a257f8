"""Every page on a phone (390×844, and 360 wide): nothing wider than the screen, and
the main navigation behind a menu button that opens it.

The pages are enumerated from the app's routes (`page_operations`), so a page added
later is measured without a line here; their path parameters are filled with what the
seeding made (a real artifact, invoke, node and application), and a page that cannot
be filled, or answers no HTML page, is left out and named.
"""

import hashlib
import os
import re
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from playwright.async_api import Page, ViewportSize, expect
from pydantic import SecretStr

from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.settings import Settings
from gpu_share.examples import DIGITS_MODEL
from gpu_share.protocol.accounts import Role
from gpu_share.testing.applications import apply_as_provider
from gpu_share.testing.factories import TEST_ADMIN_KEY, create_provider, create_tenant
from gpu_share.testing.live import Live
from gpu_share.testing.simulated_agent import SimulatedAgent, inventory
from gpu_share.testing.verification import mark_verified
from tests.coordinator.api.operations import page_operations, roles_of
from tests.coordinator.services.providers.test_provider_applications import APPLICATION
from tests.web.conftest import Browsing, sign_in, signed_in_client

# One database: layout; the pages' data is tested on every database elsewhere.
pytestmark = pytest.mark.one_database

PHONE = ViewportSize(width=390, height=844)
NARROWEST = ViewportSize(width=360, height=740)  # the narrowest phones still sold
PUBLIC_PAGES = ["/", "/signin", "/apply"]

# The page's width, and for a failure message the innermost elements whose right edge
# passes the viewport's (one inside a box that scrolls is not, unless positioned out of it).
OVERFLOW = """
() => {
  const limit = window.innerWidth;
  const clipped = (el) => {
    for (let up = el.parentElement; up && up !== document.body; up = up.parentElement) {
      if (getComputedStyle(up).overflowX !== "visible") return true;
    }
    return false;
  };
  const wide = [];
  for (const el of document.body.querySelectorAll("*")) {
    const loose = ["absolute", "fixed"].includes(getComputedStyle(el).position);
    if (el.getBoundingClientRect().right > limit + 0.5 && (loose || !clipped(el))) wide.push(el);
  }
  const innermost = wide.filter((el) => !wide.some((inner) => inner !== el && el.contains(inner)));
  const named = innermost.slice(0, 4).map((el) => el.tagName.toLowerCase()
    + (el.id ? "#" + el.id : "") + Array.from(el.classList, (c) => "." + c).join("")
    + " to " + Math.round(el.getBoundingClientRect().right) + "px");
  return { width: document.documentElement.scrollWidth, viewport: limit, culprits: named };
}
"""


async def seed(live: Live) -> dict[str, str]:
    """A tenant with artifacts, a second key and a finished invoke; a provider with a
    verified machine; an application waiting for review. The values for the pages'
    path parameters."""
    http = live.http
    tenant = await create_tenant(http, "Phone Tenant")
    issued = await http.post(f"/v1/admin/tenants/{tenant.id}/keys")
    assert issued.status_code == 201, issued.text
    model = DIGITS_MODEL.read_bytes()
    uploaded = await http.post(
        "/v1/artifacts",
        params={"kind": "model", "content_sha256": hashlib.sha256(model).hexdigest()},
        content=model,
        headers=tenant.headers,
    )
    assert uploaded.status_code == 201, uploaded.text
    artifact = uploaded.json()

    provider = await create_provider(http, "Phone Farm")
    agent = SimulatedAgent(
        live.base_url, node_inventory=inventory(hostname="rack-1-node-with-a-long-name-4")
    )
    node_id = await agent.register(provider.enrollment_token)
    assert live.replica is not None
    await mark_verified(live.replica, node_id)
    try:
        async with agent.beating():
            invoked = await http.post(
                "/v1/gpu/invoke",
                json={"runtime": "onnx_cpu", "model_url": artifact["url"], "timeout_sec": 120},
                headers=tenant.headers,
            )
            assert invoked.status_code == 202, invoked.text
            for _ in range(50):
                if jobs := await agent.lease(wait=0.2):
                    await agent.complete(jobs[0])
                    break
            else:
                raise AssertionError("the simulated agent never leased the invoke")
    finally:
        await agent.aclose()

    application = await apply_as_provider(http, APPLICATION)
    return {
        "tenant_key": tenant.key,
        "provider_key": provider.key,
        "invoke_id": invoked.json()["id"],
        "artifact_id": artifact["id"],
        "node_id": node_id,
        "key_id": tenant.key_id,
        "tenant_id": tenant.id,
        "provider_id": provider.id,
        "application_id": application["id"],
    }


def routes_only(tmp_path: Path) -> FastAPI:
    """An app to read the routes of: never started."""
    settings = Settings(
        data_dir=tmp_path / "routes",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'routes.db'}",
        admin_key=SecretStr(TEST_ADMIN_KEY),
        run_background_loops=False,
    )
    return create_app(settings)


def pages_of(app: FastAPI, role: Role, values: dict[str, str]) -> tuple[list[str], list[str]]:
    """The GET pages of `role` with their parameters filled, and those that could not be."""
    pages: list[str] = []
    left: list[str] = []
    for operation in page_operations(app):
        if operation.method != "GET" or roles_of(operation) != frozenset({role}):
            continue
        missing = [p for p in operation.params if p not in values]
        if missing:
            left.append(f"{operation.path} (no {', '.join(missing)} to fill)")
        else:
            pages.append(operation.path.format_map(values))
    return pages, left


async def is_html_page(http: httpx.AsyncClient, path: str) -> bool:
    answer = await http.get(path)
    return answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")


async def measure(page: Page, url: str) -> str | None:
    """None when the page fits a phone's width and the narrowest's; else what overflows."""
    await page.goto(url)
    await page.wait_for_load_state()
    problems = []
    for size in (NARROWEST, PHONE):  # PHONE last: the viewport stays as the test set it
        await page.set_viewport_size(size)
        found = await page.evaluate(OVERFLOW)
        if found["width"] > found["viewport"]:
            problems.append(
                f"{found['width']}px wide at {size['width']}px: {', '.join(found['culprits'])}"
            )
    return "; ".join(problems) or None


async def save_shot(page: Page, name: str) -> None:
    if target := os.environ.get("GPUSHARE_SCREENSHOTS"):
        Path(target).mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(Path(target) / f"phone-{name}.png"), full_page=True)


async def test_every_page_fits_a_phone_and_its_menu_opens_the_navigation(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    values = await seed(live)
    app = routes_only(tmp_path)
    page = browsing.page
    await page.set_viewport_size(PHONE)
    too_wide: list[str] = []
    left_out: list[str] = []
    visited = 0

    for path in PUBLIC_PAGES:
        visited += 1
        if problem := await measure(page, live.base_url + path):
            too_wide.append(f"public {path}: {problem}")

    keys = {
        Role.TENANT: values["tenant_key"],
        Role.PROVIDER: values["provider_key"],
        Role.ADMIN: TEST_ADMIN_KEY,
    }
    for role, key in keys.items():
        pages, unfilled = pages_of(app, role, values)
        left_out += [f"{role.value} {p}" for p in unfilled]
        await page.context.clear_cookies()
        await sign_in(page, live.base_url, key)

        menu = page.get_by_role("button", name="Menu")
        nav = page.get_by_role("navigation", name="Main")
        first_link = nav.get_by_role("link").first
        await expect(menu).to_be_visible()
        await expect(first_link).to_be_hidden()
        assert await menu.get_attribute("aria-expanded") == "false"
        await menu.click()
        await expect(first_link).to_be_visible()
        assert await menu.get_attribute("aria-expanded") == "true"
        assert await nav.locator("[aria-current=page]").count() == 1
        await save_shot(page, f"{role.value}-menu-open")
        await page.keyboard.press("Escape")
        await expect(first_link).to_be_hidden()
        await menu.click()
        await expect(first_link).to_be_visible()
        await page.mouse.click(195, 830)  # a tap outside the menu (below it) closes it
        await expect(first_link).to_be_hidden()
        assert await menu.get_attribute("aria-expanded") == "false"

        async with signed_in_client(live.base_url, key) as http:
            for path in pages:
                if not await is_html_page(http, path):
                    left_out.append(f"{role.value} {path} (no HTML page)")
                    continue
                visited += 1
                if problem := await measure(page, live.base_url + path):
                    too_wide.append(f"{role.value} {path}: {problem}")
                await save_shot(page, re.sub(r"\W+", "-", f"{role.value}{path}"))

    print(f"{visited} pages measured on phones; left out: {left_out}")
    assert visited >= 30, f"only {visited} pages measured; left out: {left_out}"
    assert not too_wide, "pages wider than a phone's screen:\n" + "\n".join(too_wide)
