"""A provider's enrollment tokens on their Machines page, in a real browser: rotating one
shows the new token once and refuses the old; revoking one refuses it too; each token says
how many machines it enrolled."""

from pathlib import Path

import httpx

from gpu_share.agent.client import Unauthorized
from gpu_share.testing.applications import approved_provider
from gpu_share.testing.live import Live
from gpu_share.testing.simulated_agent import SimulatedAgent, inventory
from tests.coordinator.services.providers.test_provider_applications import APPLICATION
from tests.web.conftest import Browsing, screenshot, sign_in, signed_in_client


async def registers(live: Live, token: str, name: str) -> bool:
    agent = SimulatedAgent(live.base_url, node_inventory=inventory(hostname=name))
    try:
        await agent.register(token)
    except Unauthorized:
        return False
    finally:
        await agent.aclose()
    return True


async def test_a_provider_rotates_then_revokes_a_token_in_the_browser(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    claimed = await approved_provider(live.http, APPLICATION)
    key, token = claimed["api_key"], claimed["enrollment_token"]
    page = browsing.page
    await sign_in(page, live.base_url, key)
    section = page.locator("#enrollment-tokens")
    rows = section.locator("tbody tr")
    assert await rows.count() == 1
    assert token[:13] in await rows.first.inner_text()  # its prefix, never the token
    assert token not in await page.content()

    await section.get_by_role("button", name=f"Rotate token {token[:13]}").click()
    await page.wait_for_load_state()
    fresh = (await page.locator("#new-enrollment-token").inner_text()).strip()
    assert fresh.startswith("gpu_et_") and fresh != token
    assert fresh in await page.locator("#new-install-command").inner_text()
    assert "in place of the one just revoked" in await page.locator("#issued-token").inner_text()
    await screenshot(page, tmp_path, "provider-token-rotated")
    old_row = section.locator("tbody tr", has_text=token[:13])
    assert "revoked" in await old_row.inner_text()
    assert await registers(live, token, "with-the-old-token") is False
    assert await registers(live, fresh, "with-the-new-token") is True

    await page.goto(f"{live.base_url}/provider")
    assert fresh not in await page.content()  # shown that once
    new_row = section.locator("tbody tr", has_text=fresh[:13])
    assert (await new_row.locator("td.num").first.inner_text()).strip() == "1"  # machines
    await new_row.get_by_role("button", name=f"Revoke token {fresh[:13]}").click()
    await page.wait_for_load_state()
    assert "is revoked" in await page.locator("body").inner_text()
    assert "revoked" in await section.locator("tbody tr", has_text=fresh[:13]).inner_text()
    assert await registers(live, fresh, "after-the-revoke") is False

    await section.get_by_role("button", name="Issue a new token").click()
    await page.wait_for_load_state()
    issued = (await page.locator("#new-enrollment-token").inner_text()).strip()
    assert await registers(live, issued, "with-an-issued-token") is True
    assert browsing.outside == []


async def test_token_forms_need_the_pages_csrf_and_a_providers_session(live: Live) -> None:
    claimed = await approved_provider(live.http, APPLICATION)
    key = claimed["api_key"]
    async with httpx.AsyncClient(base_url=live.base_url) as anonymous:
        answer = await anonymous.post("/provider/enrollment-tokens", data={"csrf": "x"})
        assert answer.status_code == 303 and answer.headers["location"].startswith("/signin")
    async with signed_in_client(live.base_url, key) as http:
        forged = await http.post("/provider/enrollment-tokens", data={"csrf": "forged"})
        assert forged.status_code == 403
        listed = (await http.get("/provider")).text
        assert listed.count('class="revoked"') == 0 and "Issue a new token" in listed
