"""Signing in and out: a session is a row the cookie names, so signing out, revoking the
key or the session's end closes it on every replica, even for a copy of the cookie; and a
valid key signs in from an address that others locked out with wrong guesses."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from playwright.async_api import expect
from sqlalchemy import select, update

from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.orm import BrowserSessionRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.loops import housekeeping
from gpu_share.coordinator.services.accounts.browser_sessions import SESSION_HOURS
from gpu_share.coordinator.web.session import SESSION_COOKIE
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, TenantHandle, bearer
from gpu_share.testing.live import Live
from tests.web.admin.test_pages import csrf_of, signed_in
from tests.web.conftest import Browsing, screenshot
from tests.web.tenant.test_console import key_of
from tests.web.tenant.test_console import sign_in as sign_in_to_console

ENDED = "Your session ended"
EXPIRED = "Your session expired — sign in again"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"rate_limit_failed_keys": 3})


@asynccontextmanager
async def browser_on(app: FastAPI, cookie: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """Another browser (its own cookie jar) on `app`, holding a copy of a session cookie."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        if cookie is not None:
            http.cookies.set(SESSION_COOKIE, cookie, domain="testserver.local")
        yield http


async def sent_to_sign_in(http: httpx.AsyncClient, saying: str = ENDED) -> bool:
    """Whether /console sends this browser to sign in, saying why its session is over."""
    console = await http.get("/console")
    if console.status_code != 303:
        assert console.status_code == 200, console.text
        return False
    assert console.headers["location"] == "/signin?next=/console"
    signin = await http.get(console.headers["location"])
    assert saying in signin.text
    return True


async def sessions_of(app: FastAPI, key_id: str) -> list[BrowserSessionRow]:
    async with app.state.replica.db.read() as session:
        rows = await session.scalars(
            select(BrowserSessionRow).where(BrowserSessionRow.key_id == key_id)
        )
        return list(rows)


async def test_a_cookie_copied_before_sign_out_opens_nothing_after_it(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    csrf = await signed_in(client, tenant.key)
    copied = client.cookies[SESSION_COOKIE]
    async with browser_on(app, copied) as thief:
        assert not await sent_to_sign_in(thief)
        signed_out = await client.post("/signout", data={"csrf": csrf})
        assert signed_out.status_code == 303 and signed_out.headers["location"] == "/"
        assert SESSION_COOKIE not in client.cookies
        assert await sent_to_sign_in(thief)
        assert SESSION_COOKIE not in thief.cookies  # the ended session's cookie is dropped
    [row] = await sessions_of(app, tenant.key_id)
    assert row.ended_at is not None


async def test_the_cookie_carries_neither_the_key_nor_the_id_the_database_keeps(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    await signed_in(client, tenant.key)
    cookie = client.cookies[SESSION_COOKIE]
    [row] = await sessions_of(app, tenant.key_id)
    assert tenant.key not in cookie and tenant.key_id not in cookie and row.id not in cookie


async def test_revoking_a_key_ends_its_browser_sessions(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    await signed_in(client, tenant.key)
    async with browser_on(app) as second:
        await signed_in(second, tenant.key)
        revoked = await client.post(f"/v1/admin/keys/{tenant.key_id}/revoke", headers=ADMIN)
        assert revoked.status_code == 200
        assert await sent_to_sign_in(client) and await sent_to_sign_in(second)
    rows = await sessions_of(app, tenant.key_id)
    assert len(rows) == 2 and all(row.ended_at is not None for row in rows)


async def test_a_session_ends_after_its_hours_and_is_forgotten_a_day_later(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, clock: FrozenClock
) -> None:
    await signed_in(client, tenant.key)
    clock.advance(SESSION_HOURS * 3600 - 1)
    assert not await sent_to_sign_in(client)
    clock.advance(1)
    assert await sent_to_sign_in(client, saying=EXPIRED)
    await housekeeping.run_once(app.state.replica)
    assert len(await sessions_of(app, tenant.key_id)) == 1
    clock.advance(timedelta(days=1).total_seconds() + 1)
    await housekeeping.run_once(app.state.replica)
    assert await sessions_of(app, tenant.key_id) == []


async def test_a_sign_out_on_one_replica_holds_on_another(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, settings: Settings
) -> None:
    if not settings.database_url.startswith("postgresql"):
        pytest.skip("several replicas share a database on PostgreSQL only")
    other = create_app(settings, clock=app.state.replica.clock)
    async with other.router.lifespan_context(other):
        csrf = await signed_in(client, tenant.key)
        async with browser_on(other, client.cookies[SESSION_COOKIE]) as elsewhere:
            assert not await sent_to_sign_in(elsewhere)  # the cookie is good on both replicas
            assert (await client.post("/signout", data={"csrf": csrf})).status_code == 303
            assert await sent_to_sign_in(elsewhere)


async def test_a_valid_key_signs_in_from_an_address_others_locked_out(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    for attempt in range(4):  # past the limit of 3
        await client.get("/v1/artifacts", headers=bearer(f"gpu_sk_guess{attempt}"))
    assert (await client.get("/v1/artifacts", headers=bearer("gpu_sk_x"))).status_code == 429
    app.state.replica.key_cache.clear()
    form = await client.get("/signin")
    wrong = await client.post("/signin", data={"csrf": csrf_of(form.text), "key": "gpu_sk_x"})
    assert wrong.status_code == 429 and "too many failed key lookups" in wrong.text
    right = await client.post("/signin", data={"csrf": csrf_of(form.text), "key": tenant.key})
    assert right.status_code == 303 and right.headers["location"] == "/console"
    assert (await client.get("/console")).status_code == 200


async def test_in_a_browser_signing_out_ends_the_session_for_a_copy_of_its_cookie(
    live: Live, browsing: Browsing
) -> None:
    page = browsing.page
    await sign_in_to_console(page, live.base_url, key_of(live.tenant_headers))
    copied = await page.context.cookies()
    browser = page.context.browser
    assert browser is not None
    elsewhere = await browser.new_context()
    try:
        await elsewhere.add_cookies(copied)  # type: ignore[arg-type]
        thief = await elsewhere.new_page()
        await thief.goto(f"{live.base_url}/console")
        await expect(thief).to_have_url(f"{live.base_url}/console")

        await page.get_by_role("button", name="Sign out").click()
        await expect(page.get_by_text("You are signed out.")).to_be_visible()

        await thief.goto(f"{live.base_url}/console")
        await expect(thief).to_have_url(f"{live.base_url}/signin?next=/console")
        await expect(thief.get_by_text(ENDED)).to_be_visible()
    finally:
        await elsewhere.close()


async def test_in_a_browser_an_expired_session_says_so_on_the_sign_in_page(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    page = browsing.page
    await sign_in_to_console(page, live.base_url, key_of(live.tenant_headers))
    assert live.replica is not None
    async with live.replica.db.write() as session:  # its hours are over
        await session.execute(
            update(BrowserSessionRow).values(expires_at=live.replica.clock.now() - timedelta(1))
        )

    await page.goto(f"{live.base_url}/console/invokes")
    await expect(page).to_have_url(f"{live.base_url}/signin?next=/console/invokes")
    note = page.get_by_role("status").filter(has_text=EXPIRED)
    await expect(note).to_have_text("Your session expired — sign in again.")
    await screenshot(page, tmp_path, "signin-session-expired")
    await page.get_by_label("API key").fill(key_of(live.tenant_headers))
    await page.get_by_role("button", name="Sign in").click()
    await expect(page).to_have_url(f"{live.base_url}/console/invokes")  # back where it was
    await expect(page.get_by_text(EXPIRED)).to_have_count(0)


async def test_in_a_browser_a_tampered_session_cookie_is_called_not_valid(
    live: Live, browsing: Browsing
) -> None:
    page = browsing.page
    await sign_in_to_console(page, live.base_url, key_of(live.tenant_headers))
    [cookie] = [c for c in await page.context.cookies() if c["name"] == SESSION_COOKIE]
    session_id, _, seal = cookie["value"].rpartition(".")
    forged = f"{session_id[:-1]}{'A' if session_id[-1] != 'A' else 'B'}.{seal}"
    await page.context.add_cookies(
        [{"name": SESSION_COOKIE, "value": forged, "domain": cookie["domain"], "path": "/"}]
    )

    await page.goto(f"{live.base_url}/console")
    await expect(page).to_have_url(f"{live.base_url}/signin?next=/console")
    await expect(page.get_by_role("status")).to_contain_text(
        "Your session was not valid (its cookie was changed"
    )
    assert SESSION_COOKIE not in {c["name"] for c in await page.context.cookies()}
    await page.goto(f"{live.base_url}/signin")  # said once: the cookie is gone
    await expect(page.get_by_role("status")).to_have_count(0)
