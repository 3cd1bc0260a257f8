"""The provider's claim link: it shows the key, the enrollment token and the install
command once, each with a Copy button that puts it on the clipboard; opened again, it
says it was used, when, and what to do, and offers nothing to reveal."""

import re
from datetime import timedelta
from pathlib import Path

import httpx
from playwright.async_api import Page, expect

from gpu_share.coordinator.services.providers.provider_applications import CLAIM_VALID_DAYS
from gpu_share.testing.applications import apply_as_provider
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN
from gpu_share.testing.live import Live
from tests.coordinator.services.providers.test_provider_applications import APPLICATION
from tests.web.admin.test_pages import csrf_of
from tests.web.conftest import Browsing, screenshot

REVEAL = "Show my key and token"
USED = "This link was already used"


async def approved_claim_url(client: httpx.AsyncClient) -> str:
    """The one-time link of an applicant the admin just approved (nothing claimed yet)."""
    receipt = await apply_as_provider(client, APPLICATION)
    decided = await client.post(
        f"/v1/admin/provider-applications/{receipt['id']}/approve",
        json={"tier": "community"},
        headers=ADMIN,
    )
    assert decided.status_code == 200, decided.text
    url: str = decided.json()["claim_url"]
    return url


async def revealed_claim(page: Page, live: Live) -> str:
    """A fresh claim link opened in `page`, its secrets shown, the clipboard allowed;
    returns the link."""
    await page.context.grant_permissions(
        ["clipboard-read", "clipboard-write"], origin=live.base_url
    )
    claim_url = await approved_claim_url(live.http)
    await page.goto(claim_url)
    await page.get_by_role("button", name=REVEAL).click()
    await expect(page.locator("#enrollment-token")).to_be_visible()  # the revealed page
    # Its script is deferred: until the page has loaded, a Copy button has no handler, and
    # a click then (on a loaded machine) did nothing.
    await page.wait_for_load_state("load")
    return claim_url


async def clipboard(page: Page) -> str:
    text: str = await page.evaluate("navigator.clipboard.readText()")
    return text


async def test_each_secret_copies_to_the_clipboard_and_the_used_link_offers_nothing_again(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    page = browsing.page
    claim_url = await revealed_claim(page, live)

    for what, shown in (
        ("the provider key", "#provider-key"),
        ("the enrollment token", "#enrollment-token"),
        ("the install command", "#install-command"),
    ):
        text = (await page.locator(shown).inner_text()).strip()
        button = page.get_by_role("button", name=f"Copy {what}")
        await button.click()
        await expect(button).to_have_text("Copied")
        assert await clipboard(page) == text, what
    assert (await clipboard(page)).startswith("curl -fsSL ")
    await expect(page.locator("#copy-status")).to_have_text("Copied to the clipboard")
    await screenshot(page, tmp_path, "claim-copied")
    await expect(page.get_by_role("button", name="Copy the provider key")).to_have_text(
        "Copy", timeout=5000
    )  # the state is for a moment

    again = await page.goto(claim_url)
    assert again is not None and again.status == 410
    await expect(page.locator("#claim-used")).to_contain_text(USED)
    await expect(page.locator("#claim-used time")).to_have_text(
        re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d UTC$")
    )
    await expect(page.get_by_text("Ask the platform admin for a new provider key")).to_be_visible()
    await expect(page.get_by_role("button", name=REVEAL)).to_have_count(0)
    await expect(page.locator("form[action^='/provider/claim/']")).to_have_count(0)
    await page.get_by_role("link", name="Sign in to your dashboard").click()
    await expect(page).to_have_url(f"{live.base_url}/signin?next=/provider")


async def test_without_the_clipboard_api_a_copy_button_copies_the_selected_text(
    live: Live, browsing: Browsing
) -> None:
    """As on a plain-http page off loopback, where browsers offer no `navigator.clipboard`."""
    page = browsing.page
    await revealed_claim(page, live)
    await page.evaluate("Object.defineProperty(navigator, 'clipboard', {value: undefined})")
    button = page.get_by_role("button", name="Copy the enrollment token")
    await button.click()
    await expect(button).to_have_text("Copied")
    token = (await page.locator("#enrollment-token").inner_text()).strip()
    reader = await page.context.new_page()  # a page whose clipboard API is whole
    await reader.goto(f"{live.base_url}/signin")
    assert await clipboard(reader) == token


async def test_a_claim_link_says_what_became_of_it_before_anything_is_shown(
    client: httpx.AsyncClient, clock: FrozenClock
) -> None:
    unknown = await client.get("/provider/claim/gpu_ct_" + "x" * 43)
    assert unknown.status_code == 404 and "This link is not valid." in unknown.text
    assert REVEAL not in unknown.text

    path = "/provider/claim/" + (await approved_claim_url(client)).rsplit("/", 1)[1]
    fresh = await client.get(path)
    assert fresh.status_code == 200 and REVEAL in fresh.text and USED not in fresh.text
    shown = await client.post(path, data={"csrf": csrf_of(fresh.text)})
    assert shown.status_code == 200 and 'id="provider-key"' in shown.text

    # A second click, or another tab still showing the button: the used page, no secrets.
    twice = await client.post(path, data={"csrf": csrf_of(fresh.text)})
    assert twice.status_code == 410 and USED in twice.text
    assert REVEAL not in twice.text and "gpu_pk_" not in twice.text

    late = "/provider/claim/" + (await approved_claim_url(client)).rsplit("/", 1)[1]
    clock.advance(timedelta(days=CLAIM_VALID_DAYS, seconds=1).total_seconds())
    expired = await client.get(late)
    assert expired.status_code == 410 and "This link expired" in expired.text
    assert REVEAL not in expired.text and "ask the platform admin for a new link" in (
        expired.text.lower()
    )
