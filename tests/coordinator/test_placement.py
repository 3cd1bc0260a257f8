"""Placement (SPEC §4.1): only nodes that meet every constraint, the best ranked one first,
fair share across tenants, and a NO_CAPACITY that names what nothing met."""

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import update

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.protocol.nodes import GpuInfo
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.simulated_agent import H100, AgentFactory, SimulatedAgent, inventory
from tests.coordinator.test_leases import submit

CPU_HELLO = {**HELLO_WORLD, "runtime": "onnx_cpu"}


WEEK = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]


def closed_today(clock: FrozenClock) -> dict[str, Any]:
    """A 24-hour schedule for every day but today (UTC)."""
    today = WEEK[clock.now().weekday()]
    days = [day for day in WEEK if day != today]
    return {
        "always": False,
        "timezone": "UTC",
        "windows": [{"days": days, "start": "00:00", "end": "24:00"}],
    }


async def set_node(app: FastAPI, agent: SimulatedAgent, **values: Any) -> None:
    if not values:
        return
    async with app.state.replica.db.write() as session:
        await session.execute(update(NodeRow).where(NodeRow.id == agent.node_id).values(**values))


async def invoke(client: httpx.AsyncClient, tenant: TenantHandle, **change: Any) -> httpx.Response:
    return await client.post("/v1/gpu/invoke", json={**CPU_HELLO, **change}, headers=tenant.headers)


async def test_a_lone_tenants_invoke_is_not_stuck_behind_anothers_queue(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    agent = await sim_agent()
    busy = [await submit(client, tenant) for _ in range(20)]
    lone = await submit(client, other_tenant)
    (first,) = await agent.lease()
    await agent.complete(first)
    (second,) = await agent.lease()
    assert lone in (first.invoke_id, second.invoke_id)  # within one slot's turn
    assert {first.invoke_id, second.invoke_id} - {lone} <= set(busy)


async def test_one_claim_with_several_slots_takes_tenants_in_turn(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    agent = await sim_agent(inventory(slots=4))
    mine = [await submit(client, tenant) for _ in range(6)]
    theirs = [await submit(client, other_tenant) for _ in range(6)]
    jobs = await agent.lease(slots=4)
    taken = [job.invoke_id for job in jobs]
    assert len([i for i in taken if i in mine]) == 2 and len([i for i in taken if i in theirs]) == 2


async def test_on_demand_goes_before_spot_whatever_the_tenant(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    agent = await sim_agent()
    await invoke(client, other_tenant, priority="spot")
    urgent = (await invoke(client, tenant)).json()["id"]
    (job,) = await agent.lease()
    assert job.invoke_id == urgent


async def test_a_better_ranked_waiting_node_gets_the_job(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    good, plain = await sim_agent(), await sim_agent()
    await set_node(app, good, tier="enterprise", reliability={"score": 0.99})
    await set_node(app, plain, reliability={"score": 0.7})
    waiting = asyncio.create_task(good.lease(wait=20))
    async with asyncio.timeout(30):
        while True:  # until the good node waits in its long-poll
            async with app.state.replica.db.read() as session:
                row = await session.get(NodeRow, good.node_id)
                if row is not None and row.polling_until is not None:
                    break
            await asyncio.sleep(0.02)
    job_id = await submit(client, tenant)
    assert await plain.lease() == []  # it leaves the job to the better node waiting for it
    (job,) = await asyncio.wait_for(waiting, 30)
    assert job.invoke_id == job_id


async def test_a_job_a_better_node_left_goes_to_anyone_after_the_grace(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    good, plain = await sim_agent(), await sim_agent()
    await set_node(
        app,
        good,
        tier="enterprise",
        polling_until=clock.now() + timedelta(seconds=60),
        poll_free_slots=1,
    )
    job_id = await submit(client, tenant)
    assert await plain.lease() == []
    clock.advance(3)
    assert [j.invoke_id for j in await plain.lease()] == [job_id]


@pytest.mark.parametrize(
    ("node", "ask", "constraint"),
    [
        ({"region": "eu-west"}, {"region": "us-east"}, "region"),
        ({}, {"tier": "enterprise"}, "tier"),
        ({}, {"min_reliability": 0.5}, "min_reliability"),
        ({"reliability": {"score": 0.4}}, {"min_reliability": 0.5}, "min_reliability"),
        (
            {"price_per_gpu_hour_micro": 3_000_000},
            {"max_price_per_gpu_hour": "2.5"},
            "max_price_per_gpu_hour",
        ),
        ({"delisted": True}, {}, "listed"),
        ({"benchmark_state": {"node": {"score": 0.1, "passed": False}}}, {}, "listed"),
        ({"availability": "closed today"}, {}, "availability window"),
    ],
)
async def test_no_capacity_names_the_constraint_nothing_met(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    node: dict[str, Any],
    ask: dict[str, Any],
    constraint: str,
) -> None:
    if node.get("availability") == "closed today":
        node = {"availability": closed_today(clock)}
    agent = await sim_agent()
    await set_node(app, agent, **node)
    refused = await invoke(client, tenant, **ask)
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "NO_CAPACITY"
    assert error["details"]["constraint"] == constraint
    assert constraint in error["message"]


async def test_outside_its_window_a_node_gets_no_work(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    agent = await sim_agent()
    job_id = await submit(client, tenant)
    await set_node(app, agent, availability=closed_today(clock))
    assert await agent.lease() == []
    await set_node(app, agent, availability=None)
    assert [j.invoke_id for j in await agent.lease()] == [job_id]


async def test_failed_benchmarks_and_old_cuda_do_not_count_as_gpus(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    old_cuda = GpuInfo(**{**H100.model_dump(), "uuid": "GPU-old", "cuda_version": "11.8"})
    agent = await sim_agent(
        inventory(runtimes=[RuntimeName.ONNX_CUDA, RuntimeName.ONNX_CPU], gpus=[H100, old_cuda])
    )
    assert (await invoke(client, tenant, runtime="onnx_cuda")).status_code == 202
    two = await invoke(client, tenant, runtime="onnx_cuda", gpus=2)
    assert two.json()["error"]["details"]["constraint"] == "gpus"  # onnx_cuda needs CUDA 12
    await set_node(
        app, agent, benchmark_state={"gpus": {H100.uuid: {"score": 0.2, "passed": False}}}
    )
    none_left = await invoke(client, tenant, runtime="onnx_cuda")
    assert none_left.json()["error"]["details"]["constraint"] == "gpus"


def test_priorities_sort_in_the_order_work_is_taken() -> None:
    """The PostgreSQL claim orders by the priority column itself, which relies on this."""
    from gpu_share.protocol.invokes import Priority

    assert sorted(p.value for p in Priority) == [p.value for p in Priority]
