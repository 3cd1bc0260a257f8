"""A real headless Chromium (Debian's), driven by Playwright, kept off the internet.

Every request the page makes outside loopback is refused and recorded, so a test can
assert that a page needs nothing from the internet (no CDN). Everything the pages'
content security policy refuses (an inline script or style, a source it does not name)
is recorded too, and a test whose pages were refused anything fails: so every browser
test also proves that its pages work under their policy.
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
from playwright.async_api import BrowserContext, ConsoleMessage, Page, Route, async_playwright

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


# What a page's policy refuses reaches the console ("Refused to …"), and as an event.
REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (event) => {
  console.error(`CSP violation: ${event.effectiveDirective} refused ${event.blockedURI || "inline"}`
    + ` in ${event.sourceFile || document.location.href}:${event.lineNumber}`);
});
"""


def refused_by_policy(message: ConsoleMessage) -> bool:
    text = message.text
    return text.startswith(("Refused to", "CSP violation")) or "Content Security Policy" in text


async def watch_policy(context: BrowserContext, refused: list[str]) -> None:
    """Record in `refused` what the policy refuses on any page of `context`."""
    await context.add_init_script(REPORT_VIOLATIONS)

    def on_page(page: Page) -> None:
        page.on(
            "console",
            lambda message: refused.append(message.text) if refused_by_policy(message) else None,
        )

    for page in context.pages:
        on_page(page)
    context.on("page", on_page)


@dataclass
class Browsing:
    page: Page
    outside: list[str] = field(default_factory=list)  # requests that tried to leave loopback
    refused: list[str] = field(default_factory=list)  # what the pages' policy refused


@pytest.fixture
async def browsing() -> AsyncIterator[Browsing]:
    if CHROMIUM is None:  # CI installs it (.ci/run): fail rather than skip silently
        pytest.fail("the browser tests need Debian's chromium: apt-get install chromium")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        refused: list[str] = []
        await watch_policy(context, refused)
        page = await context.new_page()
        browsing = Browsing(page, refused=refused)

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
            assert not browsing.refused, f"the pages' policy refused: {browsing.refused}"
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
