"""Mail is never lost: queued with the decision, delivered through a real SMTP server
(aiosmtpd) by the delivery loop, retried with backoff when the server refuses."""

from typing import Any

import httpx
from fastapi import FastAPI

from gpu_share.coordinator.core.settings import Settings, SmtpSecurity
from gpu_share.coordinator.loops import mail_delivery
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN
from gpu_share.testing.smtp import smtp_server
from tests.coordinator.services.providers.test_provider_applications import APPLICATION


def with_smtp(app: FastAPI, port: int) -> None:
    replica = app.state.replica
    replica.settings = replica.settings.model_copy(
        update={
            "smtp_host": "127.0.0.1",
            "smtp_port": port,
            "smtp_security": SmtpSecurity.NONE,
            "mail_from": "GPU Share <review@gpu-share.test>",
        }
    )


async def outbox(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    mails: list[dict[str, Any]] = (await client.get("/v1/admin/outbox", headers=ADMIN)).json()
    return mails


async def test_without_smtp_mail_waits_in_the_outbox(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    assert settings.smtp_host == ""
    await client.post("/v1/provider/applications", json=APPLICATION)
    assert await mail_delivery.run_once(app.state.replica) == (0, 0)
    (mail,) = await outbox(client)
    assert mail["sent_at"] is None and mail["to"] == "anna@example.com"


async def test_a_decision_mail_arrives_at_the_smtp_server(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    await client.post("/v1/provider/applications", json=APPLICATION)
    with smtp_server() as (catcher, port):
        with_smtp(app, port)
        assert await mail_delivery.run_once(app.state.replica) == (1, 0)
        assert await mail_delivery.run_once(app.state.replica) == (0, 0)  # once only
    (message,) = catcher.received
    assert message["To"] == "anna@example.com"
    assert message["From"] == "GPU Share <review@gpu-share.test>"
    assert "/apply/status/gpu_st_" in message.get_payload()
    (mail,) = await outbox(client)
    assert mail["sent_at"] is not None and mail["attempts"] == 1


async def test_a_refusing_server_gets_the_mail_later_exactly_once(
    app: FastAPI, client: httpx.AsyncClient, clock: FrozenClock
) -> None:
    await client.post("/v1/provider/applications", json=APPLICATION)
    with smtp_server(refuse_first=2) as (catcher, port):
        with_smtp(app, port)
        assert await mail_delivery.run_once(app.state.replica) == (0, 1)
        (waiting,) = await outbox(client)
        assert waiting["sent_at"] is None and "451" in waiting["last_error"]
        assert await mail_delivery.run_once(app.state.replica) == (0, 0)  # not due yet
        clock.advance(30)
        assert await mail_delivery.run_once(app.state.replica) == (0, 1)
        clock.advance(60)
        assert await mail_delivery.run_once(app.state.replica) == (1, 0)
        clock.advance(3600)
        assert await mail_delivery.run_once(app.state.replica) == (0, 0)
    assert len(catcher.received) == 1 and catcher.refused == 2
    (sent,) = await outbox(client)
    assert sent["attempts"] == 3 and sent["last_error"] is None
