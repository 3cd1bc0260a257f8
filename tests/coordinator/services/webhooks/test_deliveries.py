"""Delivery: retries with backoff under a frozen clock, timeouts, giving up after the
retry window, the log and its replay, secret rotation, and exactly one delivery per
cause. Events come from an admin top-up (a tenant endpoint's event) or are emitted
directly, as the other domains do."""

import asyncio
from datetime import timedelta

import httpx
from fastapi import FastAPI
from sqlalchemy import func, select
from standardwebhooks.webhooks import Webhook

from gpu_share.coordinator.core.orm import WebhookDeliveryRow
from gpu_share.coordinator.services.webhooks import deliveries, events
from gpu_share.protocol.webhooks import DeliveryStatus
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, TenantHandle
from gpu_share.testing.webhook_receiver import HANG, Receiver
from tests.coordinator.services.webhooks.hooks import secret_of, send_due, signed_by


async def subscribe(client: httpx.AsyncClient, tenant: TenantHandle, url: str) -> str:
    made = await client.post(
        "/v1/webhooks/endpoints",
        json={"url": url, "event_types": ["topup.credited"]},
        headers=tenant.headers,
    )
    assert made.status_code == 201, made.text
    endpoint_id: str = made.json()["id"]
    return endpoint_id


async def top_up(client: httpx.AsyncClient, tenant: TenantHandle, reference: str) -> None:
    answer = await client.post(
        f"/v1/admin/tenants/{tenant.id}/top-ups",
        json={"amount": "12.5", "reference": reference},
        headers=ADMIN,
    )
    assert answer.status_code in (200, 201), answer.text


async def the_delivery(client: httpx.AsyncClient, tenant: TenantHandle) -> dict:  # type: ignore[type-arg]
    (listed,) = (await client.get("/v1/webhooks/deliveries", headers=tenant.headers)).json()
    detail = await client.get(f"/v1/webhooks/deliveries/{listed['id']}", headers=tenant.headers)
    assert detail.status_code == 200, detail.text
    found: dict = detail.json()  # type: ignore[type-arg]
    return found


async def test_the_first_endpoint_shows_the_secret_once_and_a_top_up_is_told_once(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, receiver: Receiver
) -> None:
    made = await client.post(
        "/v1/webhooks/endpoints",
        json={"url": receiver.url(), "event_types": ["topup.credited"]},
        headers=tenant.headers,
    )
    assert made.status_code == 201, made.text
    secret = made.json()["secret"]
    assert secret.startswith("whsec_")
    second = await subscribe(client, tenant, receiver.url("/second"))
    assert second != made.json()["id"]
    listed = (await client.get("/v1/webhooks/endpoints", headers=tenant.headers)).json()
    assert "secret" not in str(listed) and len(listed) == 2

    for _ in range(2):  # the same payment credited again is a replay: told once
        await top_up(client, tenant, "wire-1")
    assert (await send_due(app)) == {DeliveryStatus.DELIVERED: 2}
    assert sorted(r.path for r in receiver.received) == ["/hook", "/second"]
    for got in receiver.received:
        event = Webhook(secret).verify(got.body, got.headers)
        assert event["type"] == "topup.credited"
        assert event["data"] == {"amount": "12.5", "reference": "wire-1", "via": "admin"}
    assert len({r.headers["webhook-id"] for r in receiver.received}) == 2  # one per endpoint


async def test_a_failed_attempt_is_retried_with_backoff_and_every_attempt_is_logged(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    receiver: Receiver,
    clock: FrozenClock,
) -> None:
    secret = await secret_of(client, tenant.headers)
    await subscribe(client, tenant, receiver.url())
    receiver.answers = [500, 503]
    await top_up(client, tenant, "wire-retry")

    assert await send_due(app) == {DeliveryStatus.PENDING: 1}
    first = await the_delivery(client, tenant)
    assert (first["status"], first["attempts"], first["last_status_code"]) == ("pending", 1, 500)
    assert await send_due(app) == {}  # not due again before its backoff
    clock.advance(deliveries.FIRST_RETRY_SEC * 1.25)  # past the first pause and its jitter
    assert await send_due(app) == {DeliveryStatus.PENDING: 1}
    clock.advance(2 * deliveries.FIRST_RETRY_SEC * 0.75)
    assert await send_due(app) == {}  # the pause doubled
    clock.advance(2 * deliveries.FIRST_RETRY_SEC * 0.5)
    assert await send_due(app) == {DeliveryStatus.DELIVERED: 1}

    done = await the_delivery(client, tenant)
    assert done["status"] == "delivered" and done["next_attempt_at"] is None
    assert [a["status_code"] for a in done["attempt_log"]] == [500, 503, 200]
    assert done["attempt_log"][0]["error"] == "answered HTTP 500"
    assert all(a["duration_ms"] >= 0 for a in done["attempt_log"])
    assert {r.headers["webhook-id"] for r in receiver.received} == {done["id"]}
    for got in receiver.received:  # each attempt signed afresh, all with the one secret
        Webhook(secret).verify(got.body, got.headers)


async def test_an_unanswered_attempt_times_out_and_says_so(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, receiver: Receiver
) -> None:
    await subscribe(client, tenant, receiver.url())
    receiver.answers = [HANG]
    await top_up(client, tenant, "wire-hang")
    assert await send_due(app) == {DeliveryStatus.PENDING: 1}
    (attempt,) = (await the_delivery(client, tenant))["attempt_log"]
    assert attempt["status_code"] is None
    assert attempt["error"].endswith("did not finish within 0.3s"), attempt


async def test_a_delivery_never_answered_2xx_within_the_retry_window_fails_and_replays(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    receiver: Receiver,
    clock: FrozenClock,
) -> None:
    await subscribe(client, tenant, receiver.url())
    receiver.answers = [410, 410]
    await top_up(client, tenant, "wire-gone")
    assert await send_due(app) == {DeliveryStatus.PENDING: 1}
    clock.advance(24 * 3600)  # the retry window (a day) is over at the next attempt
    assert await send_due(app) == {DeliveryStatus.FAILED: 1}
    failed = await client.get(
        "/v1/webhooks/deliveries", params={"status": "failed"}, headers=tenant.headers
    )
    (gone,) = failed.json()
    assert gone["failed_at"] is not None and gone["last_error"] == "answered HTTP 410"
    assert await send_due(app) == {}

    replayed = await client.post(
        f"/v1/webhooks/deliveries/{gone['id']}/replay", headers=tenant.headers
    )
    assert replayed.status_code == 202, replayed.text
    assert replayed.json()["status"] == "pending" and replayed.json()["failed_at"] is None
    assert await send_due(app) == {DeliveryStatus.DELIVERED: 1}
    assert [r.headers["webhook-id"] for r in receiver.received] == [gone["id"]] * 3
    assert (await the_delivery(client, tenant))["attempts"] == 3


async def test_a_rotated_secret_signs_beside_the_new_one_for_a_day(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    receiver: Receiver,
    clock: FrozenClock,
) -> None:
    old = await secret_of(client, tenant.headers)
    await subscribe(client, tenant, receiver.url())
    rotated = await client.post("/v1/webhooks/secret/rotate", headers=tenant.headers)
    new = rotated.json()["secret"]
    assert new != old and rotated.json()["previous_valid_until"] is not None
    await top_up(client, tenant, "wire-a")
    await send_due(app)
    during = receiver.received[-1]
    assert len(during.headers["webhook-signature"].split()) == 2
    for secret in (old, new):
        Webhook(secret).verify(during.body, during.headers)

    clock.advance(24 * 3600 + 1)
    await top_up(client, tenant, "wire-b")
    await send_due(app)
    after = receiver.received[-1]
    assert len(after.headers["webhook-signature"].split()) == 1
    assert signed_by(new, after) and not signed_by(old, after)


async def test_endpoint_events_and_urls_are_checked_with_what_to_fix(
    client: httpx.AsyncClient, tenant: TenantHandle, receiver: Receiver
) -> None:
    for body, words in (
        ({"url": receiver.url(), "event_types": ["payout.paid"]}, "payout.paid cannot be"),
        ({"url": "http://192.168.0.10/hook", "event_types": ["topup.credited"]}, "private"),
        ({"url": "ftp://example.com/hook", "event_types": ["topup.credited"]}, "url"),
        ({"url": receiver.url(), "event_types": []}, "event_types"),
    ):
        refused = await client.post("/v1/webhooks/endpoints", json=body, headers=tenant.headers)
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "VALIDATION_ERROR"
        assert words in refused.json()["error"]["message"], refused.json()
    listed = await client.get("/v1/webhooks/endpoints", headers=tenant.headers)
    assert listed.json() == []


async def test_another_accounts_endpoints_and_deliveries_are_not_found(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    receiver: Receiver,
) -> None:
    endpoint_id = await subscribe(client, tenant, receiver.url())
    await top_up(client, tenant, "wire-mine")
    (mine,) = (await client.get("/v1/webhooks/deliveries", headers=tenant.headers)).json()
    for method, path in (
        ("DELETE", f"/v1/webhooks/endpoints/{endpoint_id}"),
        ("GET", f"/v1/webhooks/deliveries/{mine['id']}"),
        ("POST", f"/v1/webhooks/deliveries/{mine['id']}/replay"),
    ):
        answer = await client.request(method, path, headers=other_tenant.headers)
        assert answer.status_code == 404, (path, answer.text)
        assert answer.json()["error"]["code"] == "NOT_FOUND"
    assert (await client.get("/v1/webhooks/deliveries", headers=other_tenant.headers)).json() == []
    assert (await client.get("/v1/webhooks/endpoints", headers=other_tenant.headers)).json() == []
    deleted = await client.delete(f"/v1/webhooks/endpoints/{endpoint_id}", headers=tenant.headers)
    assert deleted.status_code == 204
    await send_due(app)  # queued before the delete: still sent
    assert len(receiver.received) == 1


async def test_an_event_is_emitted_once_per_cause_and_claimed_by_one_sender(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, receiver: Receiver
) -> None:
    await secret_of(client, tenant.headers)
    replica = app.state.replica
    now = replica.clock.now()
    for _ in range(2):
        async with replica.db.write() as session:
            await events.emit(
                session,
                owner_id=tenant.id,
                event_type="invoke.done",
                data={"id": "inv_x"},
                cause="inv_x:final",
                now=now,
                url=receiver.url(),
            )
    async with replica.db.read() as session:
        count = await session.scalar(select(func.count()).select_from(WebhookDeliveryRow))
    assert count == 1
    async with replica.db.write() as session:
        first = await deliveries.claim_due(session, now, hold_sec=10)
    async with replica.db.write() as session:
        second = await deliveries.claim_due(session, now, hold_sec=10)
    assert len(first) == 1 and second == []  # held by the first sender
    async with replica.db.write() as session:  # its claim ran out: another sender takes it
        third = await deliveries.claim_due(session, now + timedelta(minutes=5), hold_sec=10)
    assert [c.id for c in third] == [first[0].id]


async def test_two_replicas_sending_at_once_send_each_delivery_once(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, receiver: Receiver
) -> None:
    await subscribe(client, tenant, receiver.url())
    for n in range(5):
        await top_up(client, tenant, f"wire-{n}")
    first, second = await asyncio.gather(send_due(app), send_due(app))
    assert first.get(DeliveryStatus.DELIVERED, 0) + second.get(DeliveryStatus.DELIVERED, 0) == 5
    ids = [r.headers["webhook-id"] for r in receiver.received]
    assert len(ids) == len(set(ids)) == 5


async def test_a_burst_of_events_drains_in_one_run_batch_after_batch(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, receiver: Receiver
) -> None:
    await secret_of(client, tenant.headers)
    replica = app.state.replica
    # A batch is 50 requests at once to a receiver in this process: on a loaded machine they
    # outlast the 0.3 s these tests give an unanswered attempt, and come back as retries.
    replica.settings.webhook_timeout_sec = 30
    burst = deliveries.BATCH + 7  # more than one batch
    async with replica.db.write() as session:
        for n in range(burst):
            await events.emit(
                session,
                owner_id=tenant.id,
                event_type="invoke.done",
                data={"id": f"inv_{n}"},
                cause=f"inv_{n}:final",
                now=replica.clock.now(),
                url=receiver.url(),
            )
    assert await send_due(app) == {DeliveryStatus.DELIVERED: burst}
    assert len(receiver.received) == burst and await send_due(app) == {}
