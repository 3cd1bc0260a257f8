"""Errors as pages: a browser on a page's address gets a page with the error's status and
the site's security headers, saying what happened and offering a way on; the API, and
anything that does not prefer HTML, keeps getting the JSON error of SPEC §1.8 exactly.

The 429 and the 500 come from routes this test adds to a real app (no page answers
either of them by itself today): the real rate limiter refusing, and a crash."""

import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from playwright.async_api import Page, Response, expect

from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.http.replica import client_address
from gpu_share.coordinator.http.security_headers import PAGE_POLICY
from gpu_share.coordinator.services.accounts import rate_limits
from gpu_share.testing.clock import SystemClock
from gpu_share.testing.factories import create_tenant
from gpu_share.testing.live import Live
from gpu_share.testing.servers import serve
from tests.web.conftest import Browsing, screenshot, sign_in

# One database: how an error reads in a browser; the errors' causes are tested on
# every database elsewhere.
pytestmark = pytest.mark.one_database

JSON = {"Accept": "application/json"}
NO_SUCH_ENDPOINT = {
    "error": {
        "code": "NOT_FOUND",
        "message": "no such endpoint; see /docs for the API",
        "details": None,
    }
}
INTERNAL = {
    "error": {"code": "INTERNAL", "message": "internal error; it has been logged", "details": None}
}
CRASH_SECRET = "the-crash-says-this-and-no-page-may"
ONCE_AN_HOUR = rate_limits.Limit("test-page", 1, 3600, "test page views")


async def crash(_request: Request) -> PlainTextResponse:
    raise RuntimeError(CRASH_SECRET)


async def rate_limited(request: Request) -> PlainTextResponse:
    replica = request.app.state.replica
    await rate_limits.admit(replica.db, ONCE_AN_HOUR, client_address(request), replica.clock.now())
    return PlainTextResponse("admitted")


@dataclass
class Served:
    app: FastAPI
    base_url: str
    http: httpx.AsyncClient


@pytest.fixture
async def served(settings: Settings) -> AsyncIterator[Served]:
    """A real coordinator with two more page addresses: one that crashes, one limited."""
    app = create_app(settings, clock=SystemClock())
    app.add_api_route("/test/crash", crash)
    app.add_api_route("/test/limited", rate_limited)
    async with (
        serve(app) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=30) as http,
    ):
        yield Served(app, base_url, http)


async def opened(page: Page, url: str, status: int) -> Response:
    answer = await page.goto(url)
    assert answer is not None and answer.status == status, url
    return answer


async def assert_a_page_with_its_headers(answer: Response) -> None:
    headers = await answer.all_headers()
    assert headers["content-type"].startswith("text/html")
    assert headers["content-security-policy"] == PAGE_POLICY
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"


async def test_an_unknown_address_is_a_404_page_in_a_browser_and_json_for_the_api(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    page = browsing.page
    url = f"{live.base_url}/console/nothing-here"
    answer = await opened(page, url, 404)
    await assert_a_page_with_its_headers(answer)
    await expect(page.get_by_role("heading", name="Page not found")).to_be_visible()
    await expect(page.get_by_text("There is no page at this address.")).to_be_visible()
    await expect(page.get_by_role("link", name="Sign in", exact=True).last).to_be_visible()
    await screenshot(page, tmp_path, "error-404")
    await page.get_by_role("link", name="Go to the home page").click()
    await expect(page).to_have_url(f"{live.base_url}/")

    for accept in (JSON, {"Accept": "*/*"}, {}):
        api = await live.http.get("/console/nothing-here", headers=accept)
        assert api.status_code == 404 and api.json() == NO_SUCH_ENDPOINT, accept

    # The API's addresses answer JSON even to a browser's navigation.
    v1 = await opened(page, f"{live.base_url}/v1/nothing-here", 404)
    assert (await v1.all_headers())["content-type"] == "application/json"
    assert await v1.json() == NO_SUCH_ENDPOINT
    agent = await opened(page, f"{live.base_url}/agent/nothing-here", 404)
    assert await agent.json() == NO_SUCH_ENDPOINT


async def test_a_signed_in_user_lost_in_a_section_is_offered_the_way_back_to_it(
    live: Live, browsing: Browsing
) -> None:
    page = browsing.page
    await sign_in(page, live.base_url, live.tenant_headers["Authorization"].split()[1])
    await opened(page, f"{live.base_url}/console/invokes/inv_x/nothing", 404)
    await expect(page.get_by_role("heading", name="Page not found")).to_be_visible()
    await expect(page.get_by_role("link", name="Go to your console")).to_be_visible()
    await page.get_by_role("link", name="Back to Invokes").click()
    await expect(page).to_have_url(f"{live.base_url}/console/invokes")


async def test_a_page_of_another_role_is_a_403_page_with_the_way_home(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    page = browsing.page
    await sign_in(page, live.base_url, live.tenant_headers["Authorization"].split()[1])
    answer = await opened(page, f"{live.base_url}/admin/keys", 403)
    await assert_a_page_with_its_headers(answer)
    await expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    await expect(
        page.get_by_text("This page is for admins; you are signed in as a tenant.")
    ).to_be_visible()
    await screenshot(page, tmp_path, "error-403")
    await page.get_by_role("link", name="Go to your console").click()
    await expect(page).to_have_url(f"{live.base_url}/console")


async def test_a_page_for_signed_in_users_fetched_without_a_session_is_a_401_page(
    live: Live, browsing: Browsing
) -> None:
    """The invoke log is read by the page's script (JSON errors); opened in the browser
    without a session it says to sign in, and signing in comes back to it."""
    page = browsing.page
    log_url = f"{live.base_url}/console/invokes/inv_x/log"
    await opened(page, log_url, 401)
    await expect(page.get_by_role("heading", name="Sign in first")).to_be_visible()
    await page.get_by_role("link", name="Sign in", exact=True).last.click()
    await expect(page).to_have_url(f"{live.base_url}/signin?next=/console/invokes/inv_x/log")
    script = await live.http.get(log_url.removeprefix(live.base_url), headers={"Accept": "*/*"})
    assert script.status_code == 401 and script.json()["error"]["code"] == "UNAUTHORIZED"


async def test_a_rate_limited_page_is_a_429_page_that_says_when_to_retry(
    served: Served, browsing: Browsing, tmp_path: Path
) -> None:
    page = browsing.page
    url = f"{served.base_url}/test/limited"
    await opened(page, url, 200)
    answer = await opened(page, url, 429)
    await assert_a_page_with_its_headers(answer)
    retry_after = int((await answer.all_headers())["retry-after"])
    assert 0 < retry_after <= 3600
    await expect(page.get_by_role("heading", name="Too many requests")).to_be_visible()
    await expect(page.locator("#error-detail")).to_contain_text("Too many test page views")
    await expect(page.locator("#error-retry")).to_have_text(
        re.compile(r"^You can try again in \d+ (seconds?|minutes)\.$")
    )
    await expect(page.get_by_role("link", name="Try again")).to_have_attribute(
        "href", "/test/limited"
    )
    await screenshot(page, tmp_path, "error-429")

    api = await served.http.get("/test/limited")
    assert api.status_code == 429 and api.headers["retry-after"]
    assert api.json()["error"]["code"] == "RATE_LIMITED"
    assert api.json()["error"]["details"] == {"limit": 1, "window_sec": 3600}


async def test_a_crash_is_a_500_page_that_shows_no_trace_only_a_logged_reference(
    served: Served, browsing: Browsing, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    page = browsing.page
    with caplog.at_level(logging.ERROR, logger="gpu_share.coordinator"):
        answer = await opened(page, f"{served.base_url}/test/crash", 500)
    await assert_a_page_with_its_headers(answer)
    await expect(
        page.get_by_role("heading", name="Something went wrong on our side")
    ).to_be_visible()
    text = await page.locator("body").inner_text()
    assert CRASH_SECRET not in text and "RuntimeError" not in text and "Traceback" not in text
    assert CRASH_SECRET not in await page.content()
    reference = (await page.locator("#error-reference code").inner_text()).strip()
    assert re.fullmatch(r"[0-9a-f]{12}", reference)
    logged = [r for r in caplog.records if reference in r.getMessage()]
    assert logged and logged[0].exc_info is not None  # the trace is in the log, by reference
    await expect(page.get_by_role("link", name="Try again")).to_be_visible()
    await screenshot(page, tmp_path, "error-500")

    api = await served.http.get("/test/crash")
    assert api.status_code == 500 and api.json() == INTERNAL
    assert api.headers["x-content-type-options"] == "nosniff"


async def test_api_paths_keep_the_json_error_whatever_the_client_accepts(
    client: httpx.AsyncClient,
) -> None:
    tenant = await create_tenant(client)
    browser_like = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    unknown = await client.get("/v1/nothing-here", headers=browser_like)
    assert unknown.status_code == 404 and unknown.json() == NO_SUCH_ENDPOINT
    missing = await client.get(
        "/v1/gpu/invokes/inv_" + "0" * 26, headers={**browser_like, **tenant.headers}
    )
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "NOT_FOUND"
    unauthorized = await client.get("/v1/artifacts", headers=browser_like)
    assert unauthorized.status_code == 401
    assert unauthorized.headers["content-type"] == "application/json"
    assert unauthorized.json()["error"]["code"] == "UNAUTHORIZED"
