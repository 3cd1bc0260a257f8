"""An invoke's, a session's and a reservation's own webhook_url, end to end: submitted
through the API, told by the delivery loop to a real receiver, checked with the
reference implementation of Standard Webhooks."""

import httpx
from fastapi import FastAPI
from standardwebhooks.webhooks import Webhook

from gpu_share.coordinator.services.sessions.sessions import Sessions
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.rentals import Rentals
from gpu_share.testing.simulated_agent import H100, AgentFactory, inventory
from gpu_share.testing.webhook_receiver import Receiver
from tests.coordinator.api.rivals import LoadedChannel
from tests.coordinator.services.webhooks.hooks import secret_of, send_due

CPU_HELLO = {**HELLO_WORLD, "runtime": RuntimeName.ONNX_CPU.value}


async def test_a_finished_invoke_is_told_once_signed_as_standard_webhooks_say(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    receiver: Receiver,
) -> None:
    secret = await secret_of(client, tenant.headers)
    agent = await sim_agent()
    made = await client.post(
        "/v1/gpu/invoke",
        json={**CPU_HELLO, "webhook_url": receiver.url("/done?source=gpu")},
        headers=tenant.headers,
    )
    assert made.status_code == 202, made.text
    invoke_id = made.json()["id"]
    assert made.json()["webhook_url"] == receiver.url("/done?source=gpu")  # said back
    assert await send_due(app) == {}  # nothing to tell while it runs
    (job,) = await agent.lease()
    await agent.complete(job)

    assert sum((await send_due(app)).values()) == 1
    assert await send_due(app) == {}  # delivered: never sent again
    (got,) = receiver.received
    assert got.path == "/done"
    event = Webhook(secret).verify(got.body, got.headers)
    assert event["type"] == "invoke.done"
    assert event["data"]["id"] == invoke_id and event["data"]["status"] == "done"
    log = (await client.get("/v1/webhooks/deliveries", headers=tenant.headers)).json()
    assert [(d["id"], d["status"], d["attempts"]) for d in log] == [
        (got.headers["webhook-id"], "delivered", 1)
    ]


async def test_a_canceled_queued_invoke_is_told_canceled(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    receiver: Receiver,
) -> None:
    secret = await secret_of(client, tenant.headers)
    await sim_agent()
    body = {**CPU_HELLO, "webhook_url": receiver.url()}
    invoke_id = (await client.post("/v1/gpu/invoke", json=body, headers=tenant.headers)).json()[
        "id"
    ]
    for _ in range(2):  # canceling again changes nothing and tells nothing more
        await client.post(f"/v1/gpu/invokes/{invoke_id}/cancel", headers=tenant.headers)
    await send_due(app)
    (got,) = receiver.received
    event = Webhook(secret).verify(got.body, got.headers)
    assert event["type"] == "invoke.canceled"
    assert event["data"]["error"]["code"] == "CANCELED"


async def test_an_invoke_without_webhook_url_tells_nobody(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    receiver: Receiver,
) -> None:
    await secret_of(client, tenant.headers)
    await client.post(
        "/v1/webhooks/endpoints",
        json={"url": receiver.url(), "event_types": ["topup.credited"]},
        headers=tenant.headers,
    )
    agent = await sim_agent()
    await client.post("/v1/gpu/invoke", json=CPU_HELLO, headers=tenant.headers)
    (job,) = await agent.lease()
    await agent.complete(job)
    assert await send_due(app) == {}
    assert receiver.received == []


async def test_a_webhook_url_to_a_private_address_is_refused_at_submit(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await secret_of(client, tenant.headers)
    await sim_agent()
    for url, why in (
        ("http://10.1.2.3/hook", "private"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://[::1]:8080/hook", "loopback"),
    ):
        refused = await client.post(
            "/v1/gpu/invoke", json={**CPU_HELLO, "webhook_url": url}, headers=tenant.headers
        )
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "VALIDATION_ERROR"
        assert error["message"].startswith("webhook_url: refused:"), error
        assert why in error["message"], error["message"]
    listed = await client.get("/v1/gpu/invokes", headers=tenant.headers)
    assert listed.json()["items"] == []


async def test_a_webhook_url_needs_the_accounts_signing_secret_first(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory, receiver: Receiver
) -> None:
    await sim_agent()
    body = {**CPU_HELLO, "webhook_url": receiver.url()}
    refused = await client.post("/v1/gpu/invoke", json=body, headers=tenant.headers)
    assert refused.status_code == 422
    assert "POST /v1/webhooks/secret/rotate" in refused.json()["error"]["message"]
    await secret_of(client, tenant.headers)
    accepted = await client.post("/v1/gpu/invoke", json=body, headers=tenant.headers)
    assert accepted.status_code == 202, accepted.text


async def test_a_sessions_webhook_is_told_when_it_opens_and_closes(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    receiver: Receiver,
) -> None:
    """Its opening and its close (with its status) come through its own webhook_url,
    once each."""
    secret = await secret_of(client, tenant.headers)
    agent = await sim_agent(
        inventory(runtimes=[RuntimeName.ONNX_CUDA, RuntimeName.ONNX_CPU], gpus=[H100]),
        verified=True,
    )
    assert agent.node_id is not None
    replica = app.state.replica
    replica.hub.attach(agent.node_id, LoadedChannel(replica))
    opened = await client.post(
        "/v1/gpu/sessions",
        json={
            "runtime": "onnx_cuda",
            "model_url": HELLO_WORLD["model_url"],
            "webhook_url": receiver.url("/sessions"),
        },
        headers=tenant.headers,
    )
    assert opened.status_code == 201, opened.text
    session_id = opened.json()["id"]
    assert opened.json()["webhook_url"] == receiver.url("/sessions")
    sessions = Sessions(replica.db, replica.hub, replica.clock, replica.settings)
    for _ in range(2):  # the agent says the model is loaded (once counts)
        await sessions.on_ready(agent.node_id, session_id, "cuda", [])
    for _ in range(2):
        await client.delete(f"/v1/gpu/sessions/{session_id}", headers=tenant.headers)
    await send_due(app)
    told = {}
    for got in receiver.received:
        event = Webhook(secret).verify(got.body, got.headers)
        told[event["type"]] = event["data"]
    assert told == {
        "session.opened": {"id": session_id},
        "session.closed": {"id": session_id, "status": "closed", "error": None},
    }


async def test_a_reservations_webhook_is_told_as_it_starts_and_is_canceled(
    app: FastAPI,
    client: httpx.AsyncClient,
    rentals: Rentals,
    tenant: TenantHandle,
    receiver: Receiver,
) -> None:
    secret = await secret_of(client, tenant.headers)
    node = await rentals.node()
    await rentals.top_up(tenant, "100")
    booked = await rentals.book(tenant, node, gpus=1, hours=1, webhook_url=receiver.url())
    reservation_id = booked["id"]
    assert booked["webhook_url"] == receiver.url()
    canceled = await client.post(
        f"/v1/reservations/{reservation_id}/cancel", headers=tenant.headers
    )
    assert canceled.status_code == 200, canceled.text
    await send_due(app)
    told = [Webhook(secret).verify(got.body, got.headers) for got in receiver.received]
    assert sorted(event["type"] for event in told) == [
        "reservation.active",
        "reservation.canceled",
    ]
    assert {event["data"]["id"] for event in told} == {reservation_id}
