"""Swagger UI at /docs works for real, offline: authorize with a key, try the API."""

import pytest

from gpu_share.coordinator.api.docs import TAGS
from gpu_share.testing.live import Live
from tests.web.conftest import Browsing

# One database: the API document in a browser.
pytestmark = pytest.mark.one_database


async def test_swagger_ui_renders_offline_and_try_it_out_sends_the_key(
    live: Live, browsing: Browsing
) -> None:
    page = browsing.page
    await page.goto(f"{live.base_url}/docs")
    await page.get_by_role("button", name="Authorize").first.click()
    key = live.tenant_headers["Authorization"].removeprefix("Bearer ")
    await page.locator("#auth-bearer-value").fill(key)
    await page.locator(".auth-btn-wrapper button.authorize").click()
    await page.locator(".auth-btn-wrapper button.btn-done").click()

    tags = page.locator(".opblock-tag")
    await tags.first.wait_for()
    assert await tags.count() == len(TAGS)  # every tag is listed, folded
    await page.locator("#operations-tag-discovery").click()
    runtimes = page.locator("#operations-discovery-list_runtimes_v1_gpu_runtimes_get")
    await runtimes.locator(".opblock-summary").click()
    await runtimes.get_by_role("button", name="Execute").click()
    status = runtimes.locator(".live-responses-table tbody .response-col_status").first
    await status.wait_for()
    assert (await status.inner_text()).strip() == "200"  # the key went along: not 401
    assert "onnx_cpu" in await runtimes.locator(".live-responses-table").inner_text()

    await page.locator("#operations-tag-invokes").click()
    invoke = page.locator("#operations-invokes-create_invoke_v1_gpu_invoke_post")
    await invoke.locator(".opblock-summary").click()
    body = await invoke.locator("textarea.body-param__text").input_value()
    assert "mnist-12.onnx" in body  # the seed's Hello World is the example
    await invoke.get_by_role("button", name="Execute").click()
    answer = invoke.locator(".live-responses-table tbody .response-col_status").first
    await answer.wait_for()
    assert (await answer.inner_text()).strip() == "503"  # no GPU node: NO_CAPACITY, not 401
    assert "NO_CAPACITY" in await invoke.locator(".live-responses-table").inner_text()
    assert browsing.outside == []  # nothing was fetched from the internet
