"""The SDK's webhook calls against the real coordinator in-process and a real receiver on
loopback: endpoints, the secret shown once and rotated, the delivery log and a replay;
refusals as the SDK's errors; the same calls from the blocking client."""

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from gpu_share import AsyncClient, Client, NotFound, ValidationError, verify_webhook
from gpu_share.coordinator.core.settings import Settings
from gpu_share.protocol.webhooks import DeliveryStatus, WebhookEndpointCreated
from gpu_share.sdk import RetryPolicy
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.servers import serve
from gpu_share.testing.webhook_receiver import Receiver, webhook_receiver
from tests.coordinator.services.money.test_billing import top_up
from tests.coordinator.services.webhooks.hooks import send_due


@pytest.fixture
def settings(settings: Settings) -> Settings:
    settings.url_allow_networks = ["127.0.0.1/32"]  # the receiver is on loopback
    settings.webhook_timeout_sec = 0.3
    return settings


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with webhook_receiver() as running:
        yield running


async def test_endpoints_secret_deliveries_and_replay_through_the_sdk(
    app: FastAPI,
    client: httpx.AsyncClient,
    sdk: AsyncClient,
    tenant: TenantHandle,
    receiver: Receiver,
) -> None:
    first = await sdk.add_webhook_endpoint(receiver.url())
    assert isinstance(first, WebhookEndpointCreated)
    assert first.event_types == ["topup.credited"] and first.secret is not None
    second = await sdk.add_webhook_endpoint(receiver.url("/second"), events=["topup.credited"])
    assert second.secret is None  # shown once, with the first endpoint
    assert [e.id for e in await sdk.webhook_endpoints()] == [first.id, second.id]
    await sdk.delete_webhook_endpoint(second.id)
    assert [e.id for e in await sdk.webhook_endpoints()] == [first.id]

    await top_up(client, tenant, "12.5", "wire-sdk")
    assert await send_due(app) == {DeliveryStatus.DELIVERED: 1}
    (got,) = receiver.received
    assert verify_webhook(first.secret, got.headers, got.body)["type"] == "topup.credited"
    (delivery,) = await sdk.webhook_deliveries(status="delivered")
    assert await sdk.webhook_deliveries(status=DeliveryStatus.FAILED) == []
    detail = await sdk.get_webhook_delivery(delivery.id)
    assert (detail.body.encode(), [a.status_code for a in detail.attempt_log]) == (got.body, [200])

    replayed = await sdk.replay_webhook_delivery(delivery.id)
    assert (replayed.id, replayed.status) == (delivery.id, DeliveryStatus.PENDING)
    rotated = await sdk.rotate_webhook_secret()
    assert rotated.secret != first.secret and rotated.previous_valid_until is not None
    assert await send_due(app) == {DeliveryStatus.DELIVERED: 1}
    again = receiver.received[1]
    assert again.headers["webhook-id"] == got.headers["webhook-id"]
    for secret in (first.secret, rotated.secret):  # signed with both during the switch
        verify_webhook(secret, again.headers, again.body)


async def test_refusals_are_the_sdks_errors(sdk: AsyncClient, receiver: Receiver) -> None:
    with pytest.raises(ValidationError, match="url"):
        await sdk.add_webhook_endpoint("ftp://example.com/hook")  # refused before it is sent
    with pytest.raises(ValidationError, match="event_types"):
        await sdk.add_webhook_endpoint(receiver.url(), events=[])
    with pytest.raises(ValidationError, match="status: must be one of pending"):
        await sdk.webhook_deliveries(status="lost")
    assert await sdk.webhook_endpoints() == []
    with pytest.raises(ValidationError) as served:
        await sdk.add_webhook_endpoint(receiver.url(), events=["payout.paid"])  # a provider's
    assert served.value.status == 422
    for call in (
        sdk.delete_webhook_endpoint("whe_unknown"),
        sdk.get_webhook_delivery("whd_unknown"),
        sdk.replay_webhook_delivery("whd_unknown"),
    ):
        with pytest.raises(NotFound):
            await call


async def test_the_blocking_client_manages_webhooks_over_a_real_socket(
    app: FastAPI, tenant: TenantHandle, receiver: Receiver
) -> None:
    async with serve(app, lifespan=False) as base_url:

        def use() -> tuple[str | None, int, str, int]:
            with Client(base_url, tenant.key, retry=RetryPolicy(backoff_base=0.01)) as c:
                made = c.add_webhook_endpoint(receiver.url())
                listed = len(c.webhook_endpoints())
                rotated = c.rotate_webhook_secret().secret
                c.delete_webhook_endpoint(made.id)
                return made.secret, listed, rotated, len(c.webhook_deliveries())

        secret, listed, rotated, deliveries = await asyncio.to_thread(use)
    assert secret is not None and rotated.startswith("whsec_") and rotated != secret
    assert (listed, deliveries) == (1, 0)
