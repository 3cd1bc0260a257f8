"""The Webhooks page, through the real sign-in (cookie and CSRF): the secret shown once,
an endpoint added (or refused, saying what to fix) and deleted, the delivery log with
its attempts and a replay; the provider's page is the same with its payout events."""

import re

import httpx
from fastapi import FastAPI

from gpu_share.testing.factories import ADMIN, ProviderHandle, TenantHandle
from tests.coordinator.api.keyholders import browser

SECRET = re.compile(r'id="new-secret">(whsec_[A-Za-z0-9+/=]+)<')


async def test_the_page_shows_the_secret_once_and_manages_endpoints_and_deliveries(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, other_tenant: TenantHandle
) -> None:
    async with browser(app, tenant.key) as signed:
        page = await signed.http.get("/console/webhooks")
        assert page.status_code == 200 and "Create the secret" in page.text
        made = await signed.http.post("/console/webhooks/secret", data={"csrf": signed.csrf})
        assert made.status_code == 200
        shown = SECRET.search(made.text)
        assert shown is not None
        again = await signed.http.get("/console/webhooks")
        assert shown[1] not in again.text and "Rotate the secret" in again.text

        refused = await signed.http.post(
            "/console/webhooks/endpoints",
            data={"csrf": signed.csrf, "url": "http://10.0.0.7/h", "event_types": "topup.credited"},
        )
        assert refused.status_code == 422
        assert "private" in refused.text and 'value="http://10.0.0.7/h"' in refused.text
        added = await signed.http.post(
            "/console/webhooks/endpoints",
            data={
                "csrf": signed.csrf,
                "url": "https://hooks.example.com/gpu",
                "event_types": "topup.credited",
            },
        )
        assert added.status_code == 303, added.text
        (endpoint,) = (await client.get("/v1/webhooks/endpoints", headers=tenant.headers)).json()
        await client.post(
            f"/v1/admin/tenants/{tenant.id}/top-ups",
            json={"amount": "3", "reference": "wire-page"},
            headers=ADMIN,
        )
        (delivery,) = (await client.get("/v1/webhooks/deliveries", headers=tenant.headers)).json()
        listed = await signed.http.get("/console/webhooks?status=pending")
        assert delivery["id"] in listed.text and "topup.credited" in listed.text
        none_failed = await signed.http.get("/console/webhooks?status=failed")
        assert delivery["id"] not in none_failed.text

        replayed = await signed.http.post(
            f"/console/webhooks/deliveries/{delivery['id']}/replay", data={"csrf": signed.csrf}
        )
        assert replayed.status_code == 303
        deleted = await signed.http.post(
            f"/console/webhooks/endpoints/{endpoint['id']}/delete", data={"csrf": signed.csrf}
        )
        assert deleted.status_code == 303
        assert (await client.get("/v1/webhooks/endpoints", headers=tenant.headers)).json() == []

    async with browser(app, other_tenant.key) as stranger:
        theirs = await stranger.http.post(
            f"/console/webhooks/deliveries/{delivery['id']}/replay", data={"csrf": stranger.csrf}
        )
        assert theirs.status_code == 404
        assert delivery["id"] not in (await stranger.http.get("/console/webhooks")).text


async def test_the_providers_page_offers_its_payout_events(
    app: FastAPI, provider: ProviderHandle
) -> None:
    async with browser(app, provider.key) as signed:
        page = await signed.http.get("/provider/webhooks")
        assert page.status_code == 200
        assert 'value="payout.paid"' in page.text and "topup.credited" not in page.text
        added = await signed.http.post(
            "/provider/webhooks/endpoints",
            data={
                "csrf": signed.csrf,
                "url": "https://hooks.example.com/pay",
                "event_types": ["payout.paid", "payout.failed"],
            },
        )
        assert added.status_code == 200  # the first endpoint shows the new secret once
        assert SECRET.search(added.text) is not None
