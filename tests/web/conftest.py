"""A real headless Chromium (Debian's), driven by Playwright, kept off the internet.

Every request the page makes outside loopback is refused and recorded, so a test can
assert that a page needs nothing from the internet (no CDN).
"""

import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

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
