"""Mail is never lost: queued with the decision, delivered through a real SMTP server
(aiosmtpd) by the delivery loop, retried with backoff when the server refuses for now,
and marked failed, with its reason, when it cannot be built or is refused for good.
Headers carry no line a node or an applicant wrote."""

from datetime import datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.core.settings import Settings, SmtpSecurity
from gpu_share.coordinator.loops import mail_delivery
from gpu_share.coordinator.services.mail import outbox as outbox_service
from gpu_share.coordinator.services.mail.outbox import Mail
from gpu_share.testing.applications import apply_as_provider
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, TEST_ADMIN_KEY
from gpu_share.testing.simulated_agent import H100, AgentFactory, inventory
from gpu_share.testing.smtp import smtp_server
from tests.coordinator.services.providers.test_benchmarks import measured_like, report
from tests.coordinator.services.providers.test_provider_applications import APPLICATION
from tests.web.admin.test_pages import signed_in


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


async def outbox(client: httpx.AsyncClient, **params: bool) -> list[dict[str, Any]]:
    answer = await client.get("/v1/admin/outbox", params=params, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    mails: list[dict[str, Any]] = answer.json()
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
    await apply_as_provider(client, APPLICATION)  # the confirmation, then "received"
    with smtp_server() as (catcher, port):
        with_smtp(app, port)
        assert await mail_delivery.run_once(app.state.replica) == (2, 0)
        assert await mail_delivery.run_once(app.state.replica) == (0, 0)  # once only
    confirm, received = sorted(catcher.received, key=lambda m: "received" in str(m["Subject"]))
    assert received["To"] == "anna@example.com"
    assert received["From"] == "GPU Share <review@gpu-share.test>"
    assert "/apply/status/gpu_st_" in received.get_payload()
    assert "/apply/confirm/gpu_cf_" in confirm.get_payload()
    for mail in await outbox(client):
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


async def test_a_hostname_with_a_line_break_is_mailed_in_one_clean_subject_and_to_no_one_else(
    app: FastAPI, client: httpx.AsyncClient, sim_agent: AgentFactory
) -> None:
    """A node names itself; its name must not write headers of the mail about it."""
    hostile = "rack-1\r\nBcc: x@evil.test\r\n\r\nforged body"
    agent = await sim_agent(inventory(hostname=hostile, gpus=[H100]))
    run = await agent.client.report_benchmark(report(measured_like(H100, "l4-24gb")))
    assert run.passed is False
    queued = next(m for m in await outbox(client) if m["cause"].endswith(f":delisted:{H100.uuid}"))
    assert "\r" not in queued["subject"] and "\n" not in queued["subject"]
    with smtp_server() as (catcher, port):
        with_smtp(app, port)
        assert await mail_delivery.run_once(app.state.replica) == (1, 0)
    (message,) = catcher.received
    assert catcher.recipients == [["gpu.farm@example.com"]]  # no Bcc went anywhere
    assert message["Bcc"] is None and message["To"] == "gpu.farm@example.com"
    subject = str(message["Subject"]).replace("\r\n", "")  # unfolded (RFC 5322 2.2.3)
    assert subject.startswith("GPU 0 (NVIDIA H100 80GB HBM3") and "delisted" in subject
    assert "rack-1 Bcc: x@evil.test forged body" in subject  # on one line, as text
    body = message.get_payload(decode=True)
    assert isinstance(body, bytes) and b"\nforged body" not in body  # no line of its own


UNBUILDABLE = [
    "anna@example.com\r\nBcc: x@evil.test",
    "anna@example.com, eve@evil.test",
    "anna,eve@example.com",
    "not an address",
]


async def queue_directly(app: FastAPI, cause: str, to: str, now: datetime) -> None:
    """A mail whose recipient never passed the input's checks (a row from before them)."""
    async with app.state.replica.db.write() as session:
        await outbox_service.enqueue(session, cause, Mail(to, "Hello", "A body"), now)


@pytest.mark.parametrize("to", UNBUILDABLE)
async def test_a_mail_that_cannot_be_built_is_failed_with_its_reason_and_never_retried(
    app: FastAPI, client: httpx.AsyncClient, clock: FrozenClock, to: str
) -> None:
    await queue_directly(app, "test:unbuildable", to, clock.now())
    await queue_directly(app, "test:fine", "bob@example.com", clock.now())
    with smtp_server() as (catcher, port):
        with_smtp(app, port)
        assert await mail_delivery.run_once(app.state.replica) == (1, 1)  # the next still goes
        for _ in range(3):
            clock.advance(86_400)
            assert await mail_delivery.run_once(app.state.replica) == (0, 0)
    assert catcher.recipients == [["bob@example.com"]]
    failed = next(m for m in await outbox(client) if m["cause"] == "test:unbuildable")
    assert failed["sent_at"] is None and failed["failed_at"] is not None
    assert failed["next_attempt_at"] is None and failed["attempts"] == 1
    assert "not one valid email address" in failed["last_error"]
    assert [m["cause"] for m in await outbox(client, failed=True)] == ["test:unbuildable"]
    assert [m["cause"] for m in await outbox(client, unsent=True)] == []  # failed: not waiting

    await signed_in(client, TEST_ADMIN_KEY)
    page = (await client.get("/admin/outbox?show=failed")).text
    assert '<span class="badge s-failed">failed</span>' in page
    assert "not one valid email address" in page
    assert "bob@example.com" not in page  # only the failed ones
    assert "1 failed, not sent" in (await client.get("/admin")).text  # the overview says so


async def test_a_recipient_the_server_refuses_for_good_is_failed_at_once(
    app: FastAPI, client: httpx.AsyncClient, clock: FrozenClock
) -> None:
    await queue_directly(app, "test:gone", "gone@example.com", clock.now())
    with smtp_server(unknown=frozenset({"gone@example.com"})) as (catcher, port):
        with_smtp(app, port)
        assert await mail_delivery.run_once(app.state.replica) == (0, 1)
        clock.advance(86_400)
        assert await mail_delivery.run_once(app.state.replica) == (0, 0)
    assert catcher.received == []
    (failed,) = await outbox(client)
    assert failed["failed_at"] is not None and "550" in failed["last_error"]


async def test_a_server_that_never_takes_the_mail_has_it_failed_after_two_days(
    app: FastAPI, client: httpx.AsyncClient, clock: FrozenClock
) -> None:
    await queue_directly(app, "test:busy", "anna@example.com", clock.now())
    tries = 0
    with smtp_server(refuse_first=1000) as (catcher, port):
        with_smtp(app, port)
        while not (await outbox(client))[0]["failed_at"]:
            assert tries < 100, "the mail is retried forever"
            clock.advance(3600)
            tries += await mail_delivery.run_once(app.state.replica) == (0, 1)
    (failed,) = await outbox(client)
    assert 40 <= failed["attempts"] <= 60 and catcher.refused == failed["attempts"]
    assert "451" in failed["last_error"] and "gave up" in failed["last_error"]
    clock.advance(86_400)
    assert await mail_delivery.run_once(app.state.replica) == (0, 0)
