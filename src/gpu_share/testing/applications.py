"""Applying as applicants do, through the real API: submit, find the link mailed to the
email in the outbox (as an admin reads it), and open it."""

import re
from typing import Any

import httpx

from gpu_share.testing.factories import ADMIN

CONFIRM_LINK = re.compile(r"https?://\S+/apply/(?:tenant/)?confirm/(gpu_cf_\S+)")


async def mailed_confirm_token(client: httpx.AsyncClient, email: str) -> str:
    """The token of the newest confirmation link mailed to `email`."""
    answer = await client.get("/v1/admin/outbox", params={"limit": 500}, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    for mail in answer.json():  # newest first
        if mail["to"] == email.strip().lower() and mail["cause"].endswith(":confirm"):
            found = CONFIRM_LINK.search(mail["body"])
            assert found, mail["body"]
            return found.group(1)
    raise AssertionError(f"no confirmation mail to {email}")


async def apply_as_provider(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """Apply and confirm the email; the confirmation's answer (with `status_token`)."""
    return await _apply_and_confirm(client, "/v1/provider/applications", body)


async def apply_as_tenant(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """Apply for tenant access and confirm the email; the application, now in review."""
    return await _apply_and_confirm(client, "/v1/tenant/applications", body)


async def _apply_and_confirm(
    client: httpx.AsyncClient, applications: str, body: dict[str, Any]
) -> dict[str, Any]:
    submitted = await client.post(applications, json=body)
    assert submitted.status_code == 201, submitted.text
    token = await mailed_confirm_token(client, body["email"])
    confirmed = await client.post(f"{applications}/confirm/{token}")
    assert confirmed.status_code == 200, confirmed.text
    answer: dict[str, Any] = confirmed.json()
    return answer


async def approved_provider(
    client: httpx.AsyncClient, body: dict[str, Any], tier: str = "enterprise"
) -> dict[str, Any]:
    """Apply as a provider, be approved (as the admin) and claim the account: the claim's
    answer, with the provider's `api_key` and `enrollment_token`."""
    receipt = await apply_as_provider(client, body)
    decided = await client.post(
        f"/v1/admin/provider-applications/{receipt['id']}/approve",
        json={"tier": tier},
        headers=ADMIN,
    )
    assert decided.status_code == 200, decided.text
    claim = decided.json()["claim_url"].rsplit("/", 1)[1]
    claimed = await client.post(f"/v1/provider/claim/{claim}")
    assert claimed.status_code == 200, claimed.text
    answer: dict[str, Any] = claimed.json()
    return answer
