"""The whole onboarding story of SPEC §3 and §5, in real browsers, on each database:

a provider applies in the browser and confirms their email from the mailed link → the
admin approves in the browser → the approval
mail arrives at a real SMTP server → the provider claims their key and token from the
mail's link → the install script, served by the coordinator, installs and starts an
agent → the provider's dashboard shows the machine Online; then a tenant signs in,
uploads a model, invokes it on that machine and sees the result and its logs.

On failure each browser saves a screenshot in the test's folder.
"""

import asyncio
import re
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from playwright.async_api import Page, expect

from gpu_share.coordinator.core.settings import Settings, SmtpSecurity
from gpu_share.examples import DIGITS_EXPECTED_LABELS, DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.factories import create_tenant
from gpu_share.testing.live import Live
from gpu_share.testing.smtp import MailCatcher, smtp_server
from tests.e2e.test_install_script import (
    install,
    start_agent,
    venv_with_this_environments_packages,
)
from tests.web.conftest import Browsing, screenshot, sign_in
from tests.web.tenant.test_console import nav, upload

pytestmark = pytest.mark.slow

CLAIM_LINK = re.compile(r"(http://\S+/provider/claim/gpu_ct_\S+)")
CONFIRM_LINK = re.compile(r"(http://\S+/apply/confirm/gpu_cf_\S+)")


@pytest.fixture
def smtp() -> Iterator[tuple[MailCatcher, int]]:
    with smtp_server() as server:
        yield server


@pytest.fixture
def settings(settings: Settings, smtp: tuple[MailCatcher, int]) -> Settings:
    _catcher, port = smtp
    return settings.model_copy(
        update={
            "smtp_host": "127.0.0.1",
            "smtp_port": port,
            "smtp_security": SmtpSecurity.NONE,
            "mail_interval_sec": 0.3,
        }
    )


async def new_page(browsing: Browsing) -> Page:
    """Another person at another browser: a context of its own (its own cookies)."""
    browser = browsing.page.context.browser
    assert browser is not None
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    return await context.new_page()


async def mail_with(catcher: MailCatcher, subject_part: str, timeout: float = 60) -> str:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        for message in catcher.received:
            if subject_part in message["Subject"]:
                payload = message.get_payload(decode=True)  # undo quoted-printable
                assert isinstance(payload, bytes)
                return payload.decode()
        await asyncio.sleep(0.2)
    raise AssertionError(
        f"no mail about {subject_part!r}: {[m['Subject'] for m in catcher.received]}"
    )


async def apply_in_the_browser(page: Page, base_url: str) -> None:
    await page.goto(f"{base_url}/")
    await page.get_by_role("link", name="Apply to provide GPUs").click()
    await page.get_by_label("Full name").fill("Ana Lima")
    await page.get_by_label("Email").fill("ana@lima-compute.test")
    await page.get_by_label("Company (optional)").fill("Lima Compute")
    await page.locator("#gpu-0-model").select_option("l4-24gb")
    await page.get_by_label("How many").fill("2")
    await page.get_by_label("System RAM (GB)").fill("128")
    await page.get_by_label("Upload (Gbit/s)").fill("1")
    await page.get_by_label("Download (Gbit/s)").fill("1")
    await page.get_by_label("Location").fill("Lisbon, Portugal")
    await page.get_by_role("button", name="Submit application").click()
    await page.wait_for_url(re.compile(r"/apply/sent$"))
    await expect(page.get_by_role("heading", name="Check your mail")).to_be_visible()


async def confirm_in_the_browser(page: Page, catcher: MailCatcher) -> None:
    mail = await mail_with(catcher, "Confirm your email")
    link = CONFIRM_LINK.search(mail)
    assert link is not None, mail
    await page.goto(link.group(1))
    await page.get_by_role("button", name="Confirm my email").click()
    await page.wait_for_url(re.compile(r"/apply/status/gpu_st_"))
    await expect(page.get_by_text("In review. We will write to")).to_be_visible()


async def approve_in_the_browser(page: Page, base_url: str, admin_key: str) -> None:
    await sign_in(page, base_url, admin_key)
    await page.goto(f"{base_url}/admin/applications")
    await page.get_by_role("link", name="Ana Lima").first.click()
    await page.get_by_label("Community").check()
    await page.get_by_role("button", name=re.compile("^Approve")).click()
    await expect(page.get_by_text("also mailed to the applicant")).to_be_visible()


async def claim_in_the_browser(page: Page, claim_url: str) -> tuple[str, str]:
    await page.goto(claim_url)
    await page.get_by_role("button", name="Show my key and token").click()
    key = (await page.locator("#provider-key").inner_text()).strip()
    token = (await page.locator("#enrollment-token").inner_text()).strip()
    assert key.startswith("gpu_pk_") and token.startswith("gpu_et_")
    return key, token


@pytest.fixture
async def agent_processes() -> AsyncIterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.terminate()
    for process in started:
        try:
            await asyncio.to_thread(process.wait, 30)
        except subprocess.TimeoutExpired:
            process.kill()


async def test_a_provider_is_onboarded_and_a_tenant_runs_on_their_machine(
    live: Live,
    browsing: Browsing,
    smtp: tuple[MailCatcher, int],
    agent_processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    catcher, _port = smtp
    provider = browsing.page
    admin = await new_page(browsing)
    pages = {"provider": provider, "admin": admin}
    try:
        await apply_in_the_browser(provider, live.base_url)
        await confirm_in_the_browser(provider, catcher)
        received = await mail_with(catcher, "We received your application")
        assert "/apply/status/gpu_st_" in received

        admin_key = live.http.headers["Authorization"].removeprefix("Bearer ")
        await approve_in_the_browser(admin, live.base_url, admin_key)
        approval = await mail_with(catcher, "approved")
        claim_url = CLAIM_LINK.search(approval)
        assert claim_url is not None, approval
        key, token = await claim_in_the_browser(provider, claim_url.group(1))

        script = (await live.http.get("/agent/install.sh")).text
        prefix = tmp_path / "opt-gpu-share"
        await asyncio.to_thread(venv_with_this_environments_packages, prefix)
        installed = await asyncio.to_thread(install, script, prefix, "--token", token)
        agent_processes.append(start_agent(installed, tmp_path / "agent.log"))

        await sign_in(provider, live.base_url, key)
        machine = provider.locator("section.machine")
        await machine.wait_for(timeout=120_000)  # the dashboard refreshes by itself
        await expect(machine.locator(".badge").first).to_have_text("online", timeout=60_000)
        await screenshot(provider, tmp_path, "story-provider-online")

        tenant = await new_page(browsing)
        pages["tenant"] = tenant
        tenant_key = (await create_tenant(live.http, "Story Tenant")).key
        await sign_in(tenant, live.base_url, tenant_key)
        await nav(tenant, "Artifacts").click()
        await upload(tenant, DIGITS_MODEL, "model")
        await upload(tenant, DIGITS_INPUTS, "inputs")
        await nav(tenant, "Invokes").click()
        await tenant.get_by_label("Runtime", exact=True).select_option("onnx_cpu")
        await tenant.get_by_label("Inputs", exact=True).select_option(index=1)
        await tenant.get_by_role("button", name="Start invoke").click()
        await tenant.wait_for_url(re.compile(r"/console/invokes/inv_[0-9a-z]{26}$"))
        await expect(tenant.locator("pre.log")).to_contain_text("[agent ", timeout=120_000)
        await tenant.locator("#metrics").wait_for(timeout=120_000)
        assert (await tenant.locator("#invoke-status").inner_text()).strip() == "done"
        assert str(DIGITS_EXPECTED_LABELS) in await tenant.locator("#outputs").inner_text()
        await screenshot(tenant, tmp_path, "story-tenant-done")
        assert browsing.outside == []
    except BaseException:
        for name, page in pages.items():
            await screenshot(page, tmp_path, f"story-failed-{name}")
        raise
