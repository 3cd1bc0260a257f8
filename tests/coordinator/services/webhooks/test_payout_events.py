"""A provider's endpoints are told when a payout is paid or failed, once, by the
transition that settles it."""

import httpx
from fastapi import FastAPI

from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, ProviderHandle, bearer
from gpu_share.testing.webhook_receiver import Receiver
from tests.coordinator.services.money.test_payouts import _one_payout
from tests.coordinator.services.webhooks.hooks import send_due, signed_by

PROVIDER_HOOKS = "/v1/provider/webhooks"


async def test_a_paid_payout_is_told_to_the_providers_endpoint_once(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    clock: FrozenClock,
    receiver: Receiver,
) -> None:
    made = await client.post(
        f"{PROVIDER_HOOKS}/endpoints",
        json={"url": receiver.url(), "event_types": ["payout.paid", "payout.failed"]},
        headers=bearer(provider.key),
    )
    assert made.status_code == 201, made.text
    secret = made.json()["secret"]
    payout_id = await _one_payout(app, client, provider, clock)
    for _ in range(2):  # the second is refused (409): it changes nothing, tells nothing
        await client.post(
            f"/v1/admin/payouts/{payout_id}/paid", json={"reference": "sig-1"}, headers=ADMIN
        )
    await send_due(app)
    (got,) = receiver.received
    assert signed_by(secret, got)
    assert b'"type":"payout.paid"' in got.body and payout_id.encode() in got.body
    log = await client.get(f"{PROVIDER_HOOKS}/deliveries", headers=bearer(provider.key))
    assert [d["event_type"] for d in log.json()] == ["payout.paid"]


async def test_a_provider_can_subscribe_only_payout_events(
    client: httpx.AsyncClient, provider: ProviderHandle, receiver: Receiver
) -> None:
    refused = await client.post(
        f"{PROVIDER_HOOKS}/endpoints",
        json={"url": receiver.url(), "event_types": ["topup.credited"]},
        headers=bearer(provider.key),
    )
    assert refused.status_code == 422
    assert "payout.paid, payout.failed" in refused.json()["error"]["message"]
