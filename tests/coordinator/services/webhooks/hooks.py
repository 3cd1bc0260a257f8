"""What the webhook tests share: running the delivery loop once, getting a secret,
checking a signature with the reference implementation."""

from datetime import UTC, datetime

import httpx
from fastapi import FastAPI
from standardwebhooks.webhooks import Webhook

from gpu_share.coordinator.loops import webhook_delivery
from gpu_share.protocol.webhooks import DeliveryStatus
from gpu_share.testing.webhook_receiver import Received


async def send_due(app: FastAPI) -> dict[DeliveryStatus, int]:
    return await webhook_delivery.run_once(app.state.replica)


async def secret_of(
    client: httpx.AsyncClient, who: dict[str, str], path: str = "/v1/webhooks"
) -> str:
    made = await client.post(f"{path}/secret/rotate", headers=who)
    assert made.status_code == 201, made.text
    secret: str = made.json()["secret"]
    return secret


def signed_by(secret: str, got: Received) -> bool:
    """Whether one of the delivery's signatures is the one the reference implementation
    makes with `secret` (its `verify` reads the real clock; these tests freeze theirs)."""
    stamp = datetime.fromtimestamp(int(got.headers["webhook-timestamp"]), tz=UTC)
    expected = Webhook(secret).sign(got.headers["webhook-id"], stamp, got.body)
    return expected in got.headers["webhook-signature"].split()
