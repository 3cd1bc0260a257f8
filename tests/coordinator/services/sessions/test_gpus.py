"""Sessions holding whole GPUs (SPEC §1.7, §4.3; docs/placement.md, Multi-GPU): `gpus: N`
places a session on one node with N free GPUs, the GPUs are named in the open message and
recorded on the session, invokes and other sessions keep off them, and a reservation's
session gets the reservation's GPUs."""

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.core.orm import SessionRow
from gpu_share.protocol.sessions import OpenSession, SessionStatus
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.rentals import RATE, Rentals
from gpu_share.testing.simulated_agent import SimulatedAgent

SESSION = {"runtime": "onnx_cuda", "model_url": HELLO_WORLD["model_url"]}


class AgentChannel:
    """The agent's end of the session channel: records the open messages and answers
    that the model is loaded, as an agent would once it has."""

    def __init__(self, app: FastAPI) -> None:
        self.hub = app.state.replica.hub
        self.opened: list[OpenSession] = []

    async def send_text(self, data: str) -> None:
        if json.loads(data)["type"] != "open":
            return
        message = OpenSession.model_validate_json(data)
        self.opened.append(message)
        self.hub.settle(message.session_id, SessionStatus.READY)

    async def send_bytes(self, data: bytes) -> None:
        raise AssertionError("no forwards here")


@pytest.fixture
async def four_gpus(
    app: FastAPI, tenant: TenantHandle, rentals: Rentals
) -> tuple[SimulatedAgent, AgentChannel]:
    agent = await rentals.node(count=4, slots=4)
    assert agent.node_id is not None
    channel = AgentChannel(app)
    app.state.replica.hub.attach(agent.node_id, channel)
    await rentals.top_up(tenant, "100")
    return agent, channel


async def open_session(
    client: httpx.AsyncClient, tenant: TenantHandle, **extra: Any
) -> httpx.Response:
    return await client.post("/v1/gpu/sessions", json={**SESSION, **extra}, headers=tenant.headers)


async def test_a_two_gpu_session_holds_two_gpus_that_invokes_then_keep_off(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    four_gpus: tuple[SimulatedAgent, AgentChannel],
) -> None:
    agent, channel = four_gpus
    made = await open_session(client, tenant, gpus=2)
    assert made.status_code == 201, made.text
    held = made.json()["gpu_indices"]
    assert made.json()["gpus"] == 2 and len(set(held)) == 2 and set(held) <= {0, 1, 2, 3}
    assert 0 not in held  # the node's first GPU, where shared sessions go, last
    assert channel.opened[-1].gpu_indices == held
    offers = await client.get("/v1/offers", params={"gpus": 3}, headers=tenant.headers)
    assert agent.node_id not in [o["node_id"] for o in offers.json()]  # 2 of 4 are free
    offers = await client.get("/v1/offers", params={"gpus": 2}, headers=tenant.headers)
    assert agent.node_id in [o["node_id"] for o in offers.json()]
    assert made.json()["rate_per_hour"] == "4"  # 2 GPUs × 2 USDC per GPU-hour
    async with app.state.replica.db.read() as session:
        row = await session.get(SessionRow, made.json()["id"])
        assert row is not None and row.gpu_indices == held and row.reserved_mb == 0
        assert row.rate_micro_per_hour == 2 * RATE

    first = await client.post(
        "/v1/gpu/invoke", json={**HELLO_WORLD, "gpus": 2, "timeout_sec": 60}, headers=tenant.headers
    )
    second = await client.post(
        "/v1/gpu/invoke", json={**HELLO_WORLD, "gpus": 2, "timeout_sec": 60}, headers=tenant.headers
    )
    assert first.status_code == 202 and second.status_code == 202, second.text
    (job,) = await agent.lease(slots=4, free_gpus=4)
    assert job.invoke_id == first.json()["id"]
    assert job.gpu_indices is not None and set(job.gpu_indices) == {0, 1, 2, 3} - set(held)
    assert await agent.lease(slots=4, free_gpus=4) == []  # the second waits

    # Every GPU is held now: another whole-GPU session finds none.
    busy = await open_session(client, tenant, gpus=1)
    assert busy.status_code == 503, busy.text
    assert busy.json()["error"]["code"] == "NO_CAPACITY"
    assert busy.json()["error"]["details"]["constraint"] == "gpus"

    closed = await client.delete(f"/v1/gpu/sessions/{made.json()['id']}", headers=tenant.headers)
    assert closed.status_code == 200, closed.text
    (job,) = await agent.lease(slots=4, free_gpus=4)
    assert job.invoke_id == second.json()["id"] and set(job.gpu_indices or []) == set(held)


async def test_a_session_on_the_first_gpu_keeps_off_a_node_whose_first_gpu_a_session_holds(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    four_gpus: tuple[SimulatedAgent, AgentChannel],
) -> None:
    whole = await open_session(client, tenant, gpus=4)
    assert whole.status_code == 201 and sorted(whole.json()["gpu_indices"]) == [0, 1, 2, 3]
    shared = await open_session(client, tenant)
    assert shared.status_code == 503, shared.text


async def test_more_gpus_than_any_node_has_is_503_naming_gpus(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    four_gpus: tuple[SimulatedAgent, AgentChannel],
) -> None:
    answer = await open_session(client, tenant, gpus=8)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "NO_CAPACITY"
    assert answer.json()["error"]["details"]["constraint"] == "gpus"


@pytest.mark.parametrize("gpus", [1, 4])
async def test_gpus_on_a_cpu_runtime_is_422(
    client: httpx.AsyncClient, tenant: TenantHandle, gpus: int
) -> None:
    answer = await open_session(client, tenant, runtime="onnx_cpu", gpus=gpus)
    assert answer.status_code == 422, answer.text
    assert "gpus" in answer.text


async def test_too_many_gpus_is_422(client: httpx.AsyncClient, tenant: TenantHandle) -> None:
    answer = await open_session(client, tenant, gpus=17)
    assert answer.status_code == 422, answer.text


async def test_a_reservations_session_gets_the_reservations_gpus(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    rentals: Rentals,
    four_gpus: tuple[SimulatedAgent, AgentChannel],
) -> None:
    agent, channel = four_gpus
    made = await rentals.book(tenant, agent, gpus=2, hours=1)
    reserved = made["gpu_indices"]
    reservation_id = made["id"]

    one = await open_session(client, tenant, gpus=1, reservation_id=reservation_id)
    assert one.status_code == 201, one.text
    assert one.json()["gpu_indices"] == [min(reserved)] and one.json()["cost"] == "0"
    assert channel.opened[-1].gpu_indices == [min(reserved)]
    shared = await open_session(client, tenant, reservation_id=reservation_id)
    assert shared.status_code == 201, shared.text
    assert shared.json()["gpus"] == 0 and shared.json()["gpu_indices"] == [max(reserved)]
    two = await open_session(client, tenant, gpus=2, reservation_id=reservation_id)
    assert two.status_code == 503, two.text  # one of its two GPUs is held already
    assert two.json()["error"]["details"]["constraint"] == "gpus"
    three = await open_session(client, tenant, gpus=3, reservation_id=reservation_id)
    assert three.status_code == 422, three.text
    assert three.json()["error"]["details"]["constraint"] == "gpus"

    # Outside the reservation, a 2-GPU session gets the two GPUs nobody reserved.
    outside = await open_session(client, tenant, gpus=2)
    assert outside.status_code == 201, outside.text
    assert set(outside.json()["gpu_indices"]) == {0, 1, 2, 3} - set(reserved)
