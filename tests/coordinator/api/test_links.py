"""Links that reach anyone but the sender never follow the request's `Host` header, which
the sender chooses: the agent's install script and the install commands come from the
configured public URL alone, mails from it or the server's own address."""

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI

from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.applications import apply_as_provider
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN
from tests.coordinator.services.providers.test_provider_applications import APPLICATION
from tests.e2e.test_install_script import run_script
from tests.web.admin.test_pages import signed_in

EVIL = "evil.example"
PUBLIC = "https://gpu.example"


@asynccontextmanager
async def hostile_client(app: FastAPI, scheme: str = "http") -> AsyncIterator[httpx.AsyncClient]:
    """A client whose every request claims to be for another host."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url=f"{scheme}://testserver",
        headers={"Host": EVIL},
    ) as http:
        yield http


@asynccontextmanager
async def app_with_public_url(settings: Settings, clock: FrozenClock) -> AsyncIterator[FastAPI]:
    app = create_app(settings.model_copy(update={"public_base_url": PUBLIC}), clock=clock)
    async with app.router.lifespan_context(app):
        yield app


async def claimed_provider(http: httpx.AsyncClient) -> dict[str, str]:
    """Apply, confirm, be approved and claim the account, all through `http`."""
    receipt = await apply_as_provider(http, APPLICATION)
    approved = await http.post(
        f"/v1/admin/provider-applications/{receipt['id']}/approve",
        json={"tier": "community"},
        headers=ADMIN,
    )
    assert approved.status_code == 200, approved.text
    claim = await http.post(f"/v1/provider/claim/{approved.json()['claim_url'].rsplit('/', 1)[1]}")
    assert claim.status_code == 200, claim.text
    answers = {"receipt": str(receipt), "approved": approved.text, **claim.json()}
    mails = (await http.get("/v1/admin/outbox", params={"limit": 500}, headers=ADMIN)).json()
    answers |= {f"mail {mail['subject']}": mail["body"] for mail in mails}
    return answers


async def test_the_install_script_never_names_the_host_a_request_claims(app: FastAPI) -> None:
    async with hostile_client(app) as http:
        script = (await http.get("/agent/install.sh")).text
    assert EVIL not in script
    assert "\nSERVER_DEFAULT=''\n" in script  # no public URL: the script guesses nothing


async def test_with_a_public_url_the_install_script_and_page_name_it(
    settings: Settings, clock: FrozenClock
) -> None:
    # The public URL is https, so the session cookie is Secure: the client speaks https.
    async with app_with_public_url(settings, clock) as app, hostile_client(app, "https") as http:
        script = (await http.get("/agent/install.sh")).text
        assert f"\nSERVER_DEFAULT={PUBLIC}\n" in script and EVIL not in script
        provider = await claimed_provider(http)
        assert provider["install_command"].startswith(f"curl -fsSL {PUBLIC}/agent/install.sh ")
        await signed_in(http, provider["api_key"])
        page = (await http.get("/provider")).text
    assert f"curl -fsSL {PUBLIC}/agent/install.sh | sudo bash" in page
    assert "no public URL set" not in page
    assert not [name for name, text in provider.items() if EVIL in text]


async def test_mails_and_install_commands_never_follow_the_host_header(
    app: FastAPI, settings: Settings
) -> None:
    async with hostile_client(app) as http:
        provider = await claimed_provider(http)
        await signed_in(http, provider["api_key"])
        page = (await http.get("/provider")).text
    assert not [name for name, text in provider.items() if EVIL in text]
    mails = [text for name, text in provider.items() if name.startswith("mail ")]
    assert len(mails) >= 3 and all(settings.mail_base_url in text for text in mails)
    assert provider["install_command"].startswith("curl -fsSL https://COORDINATOR/agent/")
    assert EVIL not in page
    assert "--server https://COORDINATOR" in page and "GPUSHARE_PUBLIC_BASE_URL" in page


async def test_the_claim_page_says_what_to_configure_without_a_public_url(app: FastAPI) -> None:
    async with hostile_client(app) as http:
        receipt = await apply_as_provider(http, APPLICATION)
        approved = await http.post(
            f"/v1/admin/provider-applications/{receipt['id']}/approve",
            json={"tier": "community"},
            headers=ADMIN,
        )
        claim_path = "/provider/claim/" + approved.json()["claim_url"].rsplit("/", 1)[1]
        form = await http.get(claim_path)
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf is not None
        page = (await http.post(claim_path, data={"csrf": csrf.group(1)})).text
    assert "Your provider account" in page and EVIL not in page
    assert "https://COORDINATOR/agent/install.sh" in page and "GPUSHARE_PUBLIC_BASE_URL" in page


async def test_a_script_served_without_a_public_url_says_which_flag_and_setting(
    app: FastAPI, tmp_path: Path
) -> None:
    async with hostile_client(app) as http:
        script = (await http.get("/agent/install.sh")).text
    result = run_script(script, "--token", "gpu_et_abc", "--prefix", tmp_path / "opt")
    assert result.returncode == 1
    assert "no coordinator URL: pass --server https://COORDINATOR" in result.stderr
    assert "GPUSHARE_PUBLIC_BASE_URL" in result.stderr
    helped = run_script(script, "--help")
    assert "GPUSHARE_PUBLIC_BASE_URL" in helped.stdout and EVIL not in helped.stdout
