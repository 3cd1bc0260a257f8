"""Work in a dedicated reservation (SPEC §4.3; docs/placement.md): it runs on the
reservation's node and GPUs only, ahead of other tenants' queued work, and nobody
else's work gets those GPUs."""

from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.core.errors import NotFound, Unavailable
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import NodeRow, SessionRow
from gpu_share.coordinator.loops import preemption as preemption_loop
from gpu_share.coordinator.loops import reservations as reservation_loop
from gpu_share.coordinator.services.money import session_billing
from gpu_share.coordinator.services.nodes.placement import Requirements
from gpu_share.coordinator.services.work import reservation_holds
from gpu_share.protocol.agent import LeaseVerdict
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.protocol.sessions import SessionStatus
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.rentals import Rentals


async def submit(client: httpx.AsyncClient, tenant: TenantHandle, **extra: Any) -> httpx.Response:
    return await client.post(
        "/v1/gpu/invoke", json={**HELLO_WORLD, "timeout_sec": 60, **extra}, headers=tenant.headers
    )


async def test_reserved_work_jumps_the_queue_onto_its_gpus_and_others_never_get_them(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    rentals: Rentals,
) -> None:
    agent = await rentals.node(count=2, slots=4)
    await rentals.top_up(tenant, "10")
    await rentals.top_up(other_tenant, "10")
    made = await rentals.book(tenant, agent, hours=1)
    reserved = made["gpu_indices"]
    assert reserved == [1]  # the first GPU, where sessions go, last

    theirs = [(await submit(client, other_tenant)).json()["id"] for _ in range(3)]
    mine = await submit(client, tenant, reservation_id=made["id"])
    assert mine.status_code == 202, mine.text
    assert mine.json()["cost"] == "0"  # billed by the reservation

    jobs = await agent.lease(slots=4, free_gpus=2)
    by_id = {job.invoke_id: job for job in jobs}
    assert mine.json()["id"] in by_id
    assert by_id[mine.json()["id"]].gpu_indices == reserved
    others = [job for job in jobs if job.invoke_id in theirs]
    assert len(others) == 1 and others[0].gpu_indices == [0]
    # The other tenant's remaining work waits for GPU 0 even though GPU 1 … is reserved.
    assert await agent.lease(slots=4, free_gpus=1) == []


async def test_an_idle_reservation_still_keeps_others_off_its_gpus(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    rentals: Rentals,
) -> None:
    agent = await rentals.node(count=1, slots=2)
    await rentals.top_up(tenant, "10")
    await rentals.top_up(other_tenant, "10")
    await rentals.book(tenant, agent, hours=1)
    queued = await submit(client, other_tenant)
    assert queued.status_code == 202, queued.text  # it queues …
    assert await agent.lease(slots=2, free_gpus=1) == []  # … but never on the reserved GPU


async def test_naming_a_reservation_that_is_not_yours_or_not_active_is_refused(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await rentals.node(count=2)
    await rentals.top_up(tenant, "10")
    start = clock.now().replace(second=0, microsecond=0) + timedelta(hours=2)
    later = await rentals.book(tenant, agent, hours=1, gpus=1, starts_at=start.isoformat())
    now = await rentals.book(tenant, agent, hours=1, gpus=1)
    foreign = await submit(client, other_tenant, reservation_id=now["id"])
    assert foreign.status_code == 404, foreign.text
    pending = await submit(client, tenant, reservation_id=later["id"])
    assert pending.status_code == 409, pending.text
    assert "not active" in pending.json()["error"]["message"]
    too_big = await submit(client, tenant, reservation_id=now["id"], gpus=2)
    assert too_big.status_code == 422, too_big.text
    await client.post(f"/v1/reservations/{now['id']}/cancel", headers=tenant.headers)
    ended = await submit(client, tenant, reservation_id=now["id"])
    assert ended.status_code == 409, ended.text


async def test_offers_count_reserved_gpus_as_not_free(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    rentals: Rentals,
) -> None:
    agent = await rentals.node(count=2)
    await rentals.top_up(tenant, "10")
    await rentals.book(tenant, agent, hours=1)
    offers = (await client.get("/v1/offers", headers=tenant.headers)).json()
    mine = next(o for o in offers if o["node_id"] == agent.node_id)
    assert mine["gpu_count"] == 2 and mine["reserved_gpus"] == 1
    two = (await client.get("/v1/offers", params={"gpus": 2}, headers=tenant.headers)).json()
    assert agent.node_id not in [o["node_id"] for o in two]


async def test_sessions_go_to_their_reservation_and_others_keep_off_a_reserved_first_gpu(
    app: FastAPI,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    rentals: Rentals,
) -> None:
    agent = await rentals.node(count=1)
    await rentals.top_up(tenant, "10")
    made = await rentals.book(tenant, agent, hours=1)
    assert made["gpu_indices"] == [0]
    reservation_id = made["id"]
    replica = app.state.replica
    now = replica.clock.now()
    req = Requirements(runtime=RuntimeName.ONNX_CUDA)
    async with replica.db.write() as session:
        node = await session.get(NodeRow, agent.node_id)
        assert node is not None
        holds = await reservation_holds.held_on(session, now)
        assert reservation_holds.sessions_barred(node, holds)  # anyone else's session
        assert not reservation_holds.sessions_barred(node, holds, reservation_id)
        placed = await reservation_holds.session_node(
            session, tenant.id, reservation_id, req, 256, {node.id}, now
        )
        assert placed.id == node.id
        with pytest.raises(NotFound):
            await reservation_holds.session_node(
                session, other_tenant.id, reservation_id, req, 256, {node.id}, now
            )
        with pytest.raises(Unavailable):
            await reservation_holds.session_node(
                session, tenant.id, reservation_id, req, 256, set(), now
            )
        row = SessionRow(
            id=new_id("ses"),
            tenant_id=tenant.id,
            node_id=node.id,
            status=SessionStatus.READY.value,
            runtime="onnx_cuda",
            model_url="https://example.com/model.onnx",
            idle_timeout_sec=300,
            max_concurrency=1,
            reserved_mb=256,
            created_at=now,
            touched_at=now,
            forward_count=0,
            reservation_id=reservation_id,
        )
        await session_billing.open_billing(session, row, node, replica.settings, now)
        assert (row.rate_micro_per_hour, row.reserved_micro, row.cost_micro) == (0, 0, 0)


async def test_queued_work_of_a_reservation_that_ends_fails_free(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await rentals.node(count=1)
    await rentals.top_up(tenant, "10")
    made = await rentals.book(tenant, agent, hours=1)
    queued = await submit(client, tenant, reservation_id=made["id"])
    assert queued.status_code == 202, queued.text
    clock.advance(3600)
    assert (await reservation_loop.run_once(app.state.replica)).ended == 1
    got = await client.get(f"/v1/gpu/invokes/{queued.json()['id']}", headers=tenant.headers)
    assert got.json()["status"] == "failed" and got.json()["cost"] == "0"
    assert got.json()["error"]["code"] == "CANCELED"
    assert got.json()["reservation_id"] == made["id"]


async def test_a_reservation_starting_preempts_other_tenants_spot_work_on_its_gpus(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await rentals.node(count=1, slots=2)
    await rentals.top_up(tenant, "10")
    await rentals.top_up(other_tenant, "10")
    spot = await submit(client, other_tenant, priority="spot", timeout_sec=7200)
    assert spot.status_code == 202, spot.text
    # A spot job may take a GPU a reservation needs soon: it gives way at the start.
    start = clock.now().replace(second=0, microsecond=0) + timedelta(minutes=30)
    made = await rentals.book(tenant, agent, hours=1, starts_at=start.isoformat())
    (job,) = await agent.lease(slots=2, free_gpus=1)
    assert job.invoke_id == spot.json()["id"] and job.gpu_indices == [0]
    await agent.client.start(job.invoke_id, job.lease_token)
    assert await preemption_loop.run_once(app.state.replica) == []  # not started yet

    clock.advance((start - clock.now()).total_seconds() + 1)
    await agent.heartbeat([job])
    assert await preemption_loop.run_once(app.state.replica) == [job.invoke_id]
    assert await preemption_loop.run_once(app.state.replica) == []  # asked once
    ack = await agent.heartbeat([job])
    assert ack.leases[0].verdict is LeaseVerdict.PREEMPT
    await agent.client.report_preempted(job.invoke_id, job.lease_token, retry_for=0)
    logs = (
        await client.get(f"/v1/gpu/invokes/{job.invoke_id}/logs", headers=other_tenant.headers)
    ).text
    assert f"reservation {made['id']} holds its GPUs" in logs

    mine = await submit(client, tenant, reservation_id=made["id"])
    assert mine.status_code == 202, mine.text
    (taken,) = await agent.lease(slots=2, free_gpus=1)
    assert taken.invoke_id == mine.json()["id"] and taken.gpu_indices == [0]
    # The preempted spot job waits for the reservation to end, never on its GPU.
    assert await agent.lease(slots=2, free_gpus=0) == []


async def test_a_reservation_never_preempts_its_own_or_unreserved_gpus_work(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    rentals: Rentals,
) -> None:
    agent = await rentals.node(count=2, slots=4)
    await rentals.top_up(tenant, "10")
    await rentals.top_up(other_tenant, "10")
    made = await rentals.book(tenant, agent, hours=1)
    assert made["gpu_indices"] == [1], made
    outside = await submit(client, other_tenant, priority="spot")
    inside = await submit(client, tenant, priority="spot", reservation_id=made["id"])
    assert inside.status_code == 202, inside.text
    jobs = await agent.lease(slots=4, free_gpus=2)
    placed = {job.invoke_id: job.gpu_indices for job in jobs}
    assert placed == {outside.json()["id"]: [0], inside.json()["id"]: [1]}
    assert await preemption_loop.run_once(app.state.replica) == []


async def test_on_demand_work_keeps_off_gpus_a_reservation_needs_before_its_timeout(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await rentals.node(count=1, slots=2)
    await rentals.top_up(tenant, "10")
    await rentals.top_up(other_tenant, "50")
    start = clock.now().replace(second=0, microsecond=0) + timedelta(hours=1)
    await rentals.book(tenant, agent, hours=1, starts_at=start.isoformat())
    long = await submit(client, other_tenant, timeout_sec=2 * 3600)
    assert long.status_code == 202, long.text
    assert await agent.lease(slots=2, free_gpus=1) == []  # it could still run at the start
    short = await submit(client, other_tenant, timeout_sec=600)
    (job,) = await agent.lease(slots=2, free_gpus=1)
    assert job.invoke_id == short.json()["id"]  # done (or timed out) before the start


async def test_a_reservation_takes_the_gpus_on_demand_work_is_not_using_first(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    rentals: Rentals,
) -> None:
    agent = await rentals.node(count=3, slots=4)
    await rentals.top_up(tenant, "10")
    await rentals.top_up(other_tenant, "10")
    busy = await submit(client, other_tenant, timeout_sec=600)
    assert busy.status_code == 202, busy.text
    (job,) = await agent.lease(slots=4, free_gpus=3)
    await agent.client.start(job.invoke_id, job.lease_token)
    made = await rentals.book(tenant, agent, hours=1, gpus=2)
    assert job.gpu_indices is not None
    assert job.gpu_indices[0] not in made["gpu_indices"]
