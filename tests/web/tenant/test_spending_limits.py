"""The limits form on the tenant's Usage page, through the real sign-in (cookie and CSRF):
saved limits show on the page and hold in the API; a bad amount is a 422 page that says
what to fix and keeps what was set."""

import re

import httpx
from fastapi import FastAPI

from gpu_share.testing.factories import TenantHandle
from tests.coordinator.api.keyholders import browser


async def test_the_usage_page_sets_shows_and_removes_the_limits(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    async with browser(app, tenant.key) as signed:
        page = await signed.http.get("/console/usage")
        assert page.status_code == 200
        assert 'action="/console/usage/limits"' in page.text
        saved = await signed.http.post(
            "/console/usage/limits",
            data={"csrf": signed.csrf, "monthly_cap": "25", "low_balance": "2.5"},
        )
        assert saved.status_code == 303, saved.text
        assert saved.headers["location"] == "/console/usage#limits"
        shown = await signed.http.get("/console/usage")
        assert "Limits saved: a monthly cap of 25 USDC" in shown.text
        assert re.search(r'id="monthly_cap"[^>]*value="25"', shown.text)
        assert '<span id="month-left">25 USDC</span>' in shown.text
        api = await client.get("/v1/billing/limits", headers=tenant.headers)
        assert (api.json()["monthly_cap"], api.json()["low_balance"]) == ("25", "2.5")

        removed = await signed.http.post(
            "/console/usage/limits",
            data={"csrf": signed.csrf, "monthly_cap": "", "low_balance": ""},
        )
        assert removed.status_code == 303
        api = await client.get("/v1/billing/limits", headers=tenant.headers)
        assert (api.json()["monthly_cap"], api.json()["low_balance"]) == (None, None)


async def test_a_bad_amount_is_a_422_page_naming_the_field_and_nothing_changes(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    await client.put("/v1/billing/limits", json={"monthly_cap": "7"}, headers=tenant.headers)
    async with browser(app, tenant.key) as signed:
        for typed, words in (
            ("-1", "more than 0"),
            ("1.1234567", "six decimal places"),
            ("ten", "is not a number of USDC"),
        ):
            answer = await signed.http.post(
                "/console/usage/limits", data={"csrf": signed.csrf, "monthly_cap": typed}
            )
            assert answer.status_code == 422
            assert "Please fix the limits" in answer.text and words in answer.text
            assert re.search(rf'id="monthly_cap"[^>]*value="{re.escape(typed)}"', answer.text)
        forged = await signed.http.post(
            "/console/usage/limits", data={"csrf": "forged", "monthly_cap": "1"}
        )
        assert forged.status_code == 403
    api = await client.get("/v1/billing/limits", headers=tenant.headers)
    assert api.json()["monthly_cap"] == "7"
