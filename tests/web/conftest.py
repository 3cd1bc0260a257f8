"""A real headless Chromium (Debian's), driven by Playwright, kept off the internet.

Every request the page makes outside loopback is refused and recorded, so a test can
assert that a page needs nothing from the internet (no CDN).
"""

import os
import re
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.async_api import Page, Route, async_playwright

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass
class Browsing:
    page: Page
    outside: list[str] = field(default_factory=list)  # requests that tried to leave loopback


@pytest.fixture
async def browsing() -> AsyncIterator[Browsing]:
    if CHROMIUM is None:  # CI installs it (.ci/run): fail rather than skip silently
        pytest.fail("the browser tests need Debian's chromium: apt-get install chromium")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        page = await context.new_page()
        browsing = Browsing(page)

        async def guard(route: Route) -> None:
            url = route.request.url
            if url.startswith(("data:", "blob:")) or urlsplit(url).hostname in LOOPBACK:
                await route.continue_()
            else:
                browsing.outside.append(url)
                await route.abort()

        await context.route("**/*", guard)
        try:
            yield browsing
        finally:
            await context.close()
            await browser.close()


async def screenshot(page: Page, tmp_path: Path, name: str) -> Path:
    """Save a full-page screenshot to tmp_path, and to $GPUSHARE_SCREENSHOTS when set."""
    path = tmp_path / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    if target := os.environ.get("GPUSHARE_SCREENSHOTS"):
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)
    return path


async def sign_in(page: Page, base_url: str, key: str) -> None:
    await page.goto(f"{base_url}/signin")
    await page.get_by_label("API key").fill(key)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_load_state()


@asynccontextmanager
async def signed_in_client(base_url: str, key: str) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client that signed in through the form, as a browser does (cookie and CSRF)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        form = await http.get("/signin")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf is not None
        answer = await http.post("/signin", data={"csrf": csrf.group(1), "key": key})
        assert answer.status_code == 303, answer.text
        yield http
