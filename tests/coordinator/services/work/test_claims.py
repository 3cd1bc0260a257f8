"""Claims (SPEC §4.1; `services/work/claims.py`): which queued invokes a node gets. One
node only, even under contention; only work it can serve, within its slots and the GPU
memory sessions leave; on-demand before spot; tenants in turn; a better-ranked node
waiting in its long-poll first (the long-poll itself: `test_lease_polls.py`)."""

import asyncio
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.work import fair_share, node_load, preemption, rivals
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.simulated_agent import H100, AgentFactory, inventory
from tests.coordinator.services.nodes.test_placement import invoke, set_node
from tests.coordinator.services.work.test_leases import CPU_HELLO, status_of, submit


async def test_a_job_is_leased_to_one_agent_only(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    first, second = await sim_agent(), await sim_agent()
    invoke_id = await submit(client, tenant)
    got = await asyncio.gather(first.lease(), second.lease())
    assert sorted(len(jobs) for jobs in got) == [0, 1]
    job = (got[0] or got[1])[0]
    assert job.invoke_id == invoke_id
    assert job.model.url == HELLO_WORLD["model_url"] and not job.model.platform
    state = await status_of(client, tenant, invoke_id)
    assert (state["status"], state["attempts"]) == ("assigned", 1)


@pytest.mark.slow
async def test_four_agents_two_hundred_invokes_each_done_exactly_once(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agents = [await sim_agent(inventory(slots=2, hostname=f"sim-{i}")) for i in range(4)]
    ids = [await submit(client, tenant) for _ in range(200)]
    stop = asyncio.Event()
    serving = [asyncio.create_task(a.serve(stop)) for a in agents]
    for _ in range(600):
        done = (
            await client.get(
                "/v1/gpu/invokes", params={"status": "done", "limit": 200}, headers=tenant.headers
            )
        ).json()
        if len(done["items"]) == 200:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.gather(*serving)
    leased = [i for a in agents for i in a.leased]
    assert sorted(leased) == sorted(ids), "every invoke leased exactly once"
    assert sorted(i for a in agents for i in a.reported) == sorted(ids)
    states = [await status_of(client, tenant, i) for i in ids]
    assert {(s["status"], s["attempts"]) for s in states} == {("done", 1)}
    assert sum(1 for a in agents if a.leased) >= 2, "the work was shared"


async def test_a_node_only_leases_jobs_it_can_serve(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    cpu = await sim_agent(inventory(runtimes=[RuntimeName.ONNX_CPU]))
    gpu = await sim_agent(
        inventory(runtimes=[RuntimeName.ONNX_CUDA, RuntimeName.ONNX_CPU], gpus=[H100]),
        verified=True,
    )
    cuda_job = await submit(client, tenant, {**HELLO_WORLD, "gpu_model": "H100"})
    assert await cpu.lease() == []
    assert await gpu.lease(free_gpus=0) == []  # its only GPU is busy
    assert [j.invoke_id for j in await gpu.lease(free_gpus=1)] == [cuda_job]


async def test_a_node_never_holds_more_jobs_than_its_slots(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent(inventory(slots=2))
    for _ in range(4):
        await submit(client, tenant)
    assert len(await agent.lease(slots=8)) == 2
    assert await agent.lease(slots=8) == []


async def test_gpu_jobs_are_not_leased_into_memory_sessions_hold(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    from sqlalchemy import update

    from gpu_share.coordinator.core.orm import SessionRow

    gpu = await sim_agent(
        inventory(runtimes=[RuntimeName.ONNX_CUDA, RuntimeName.ONNX_CPU], gpus=[H100], slots=2),
        verified=True,
    )
    async with app.state.replica.db.write() as session:
        session.add(
            SessionRow(
                id="ses_held",
                tenant_id=tenant.id,
                node_id=gpu.node_id,
                status="ready",
                runtime="onnx_cuda",
                model_url="https://example.com/m.onnx",
                idle_timeout_sec=300,
                max_concurrency=1,
                reserved_mb=80_000,
                created_at=clock.now(),
                touched_at=clock.now(),
                forward_count=0,
            )
        )
    job_id = await submit(client, tenant, {**HELLO_WORLD, "min_vram_gb": 10})
    cpu_id = await submit(client, tenant)
    assert [j.invoke_id for j in await gpu.lease(slots=2)] == [cpu_id]  # CPU work still runs
    async with app.state.replica.db.write() as session:
        await session.execute(
            update(SessionRow).where(SessionRow.id == "ses_held").values(status="closed")
        )
    assert [j.invoke_id for j in await gpu.lease(slots=2)] == [job_id]


async def test_on_demand_work_is_leased_before_spot_work(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    spot = await submit(client, tenant, {**CPU_HELLO, "priority": "spot"})
    on_demand = await submit(client, tenant)
    (first,) = await agent.lease()
    assert first.invoke_id == on_demand
    await agent.complete(first)
    assert [j.invoke_id for j in await agent.lease()] == [spot]


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


def test_priorities_sort_in_the_order_work_is_taken() -> None:
    """The PostgreSQL claim orders by the priority column itself, which relies on this."""
    from gpu_share.protocol.invokes import Priority

    assert sorted(p.value for p in Priority) == [p.value for p in Priority]


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


async def test_each_job_in_a_mixed_queue_is_judged_by_its_own_requirements(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    # A claim weighs each shape of job once (`claims._claim`'s `fits`): jobs of other shapes
    # between them must neither borrow nor lend a verdict.
    west = await sim_agent(inventory(slots=8, region="eu-west", hostname="west"))
    east = await sim_agent(inventory(slots=8, region="us-east", hostname="east"))
    shapes: list[dict[str, Any]] = [
        {"region": "eu-west"},
        {"region": "us-east"},
        {},
        {"timeout_sec": 30},
    ]
    queued = [
        (n % 4, await submit(client, tenant, {**CPU_HELLO, **shapes[n % 4]})) for n in range(8)
    ]
    east_jobs = [job.invoke_id for job in await east.lease(slots=8)]
    assert east_jobs == [i for shape, i in queued if shape in (1, 2, 3)]
    assert [job.invoke_id for job in await west.lease(slots=8)] == [
        i for shape, i in queued if shape == 0
    ]


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
    # The Enterprise bonus ranks it above: it counts for proven hardware only.
    good, plain = await sim_agent(verified=True), await sim_agent(verified=True)
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


async def test_a_claim_of_jobs_past_the_grace_reads_no_rivals(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Reading the rivals loads every node waiting in a long-poll (a thousand in an idle
    # fleet); only a job young enough to be left to one of them needs it.
    agent = await sim_agent()
    young, old = await submit(client, tenant), await submit(client, tenant)
    reads: list[datetime] = []
    read_rivals = rivals.better_pollers

    async def counted(session: AsyncSession, node: NodeRow, now: datetime) -> list[NodeRow]:
        reads.append(now)
        return await read_rivals(session, node, now)

    monkeypatch.setattr(rivals, "better_pollers", counted)
    (job,) = await agent.lease()
    assert job.invoke_id == young
    assert len(reads) == 1
    await agent.complete(job)
    clock.advance(rivals.RANKING_GRACE_SEC + 1)
    assert [j.invoke_id for j in await agent.lease()] == [old]
    assert len(reads) == 1


async def test_a_claim_with_nothing_queued_reads_neither_candidates_nor_placed_work(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An idle fleet's claims (long-polls, results asking for the next job) meet an empty
    # queue; the node's own read says so, and says whether work is placed on it.
    agent = await sim_agent()
    reads: list[str] = []

    def counted(name: str, read: Any) -> Any:
        def counting(*args: Any) -> Any:
            reads.append(name)
            return read(*args)

        return counting

    for module, name in (
        (fair_share, "candidates"),
        (preemption, "placed_on"),
        (node_load, "load_of"),  # the node's load comes with the node's own read
    ):
        monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    assert await agent.lease() == []
    assert reads == []
    invoke_id = await submit(client, tenant)
    assert [job.invoke_id for job in await agent.lease()] == [invoke_id]
    assert reads == ["candidates"]  # nothing is placed on this node
