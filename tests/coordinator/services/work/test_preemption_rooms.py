"""The room a preemption frees is the preempted-for work's (docs/placement.md, "Spot"):
it is placed, by the claim's rules, on exactly the GPUs the stopped spot work leaves,
and they and the slot go to it, not to whoever else comes to the node meanwhile."""

import httpx
from fastapi import FastAPI

from gpu_share.coordinator.core.orm import InvokeRow
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory, SimulatedAgent, done_report, inventory
from tests.coordinator.services.work.test_preemption import (
    CPU_HELLO,
    gpus,
    preempt,
    running_gpu_spot,
    running_spot,
    submit,
    waited,
)


async def placement_of(app: FastAPI, invoke_id: str) -> tuple[str, str | None, list[int] | None]:
    async with app.state.replica.db.read() as session:
        row = await session.get(InvokeRow, invoke_id)
        assert row is not None
        return row.status, row.node_id, row.gpu_indices


async def stop(agent: SimulatedAgent, job_id: str, token: str) -> None:
    await agent.client.report_preempted(job_id, token, retry_for=0)


async def test_on_demand_work_is_placed_on_the_gpus_its_preemption_frees_and_gets_them(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    """One GPU is idle and another runs a 1-GPU spot job: a 2-GPU job stops that one and is
    placed on those two; a 1-GPU job arriving meanwhile does not get the idle one."""
    agent = await sim_agent(inventory(runtimes=[RuntimeName.ONNX_CUDA], gpus=gpus(4), slots=4))
    wide = await running_gpu_spot(client, tenant, agent, 2)
    narrow = await running_gpu_spot(client, tenant, agent, 1)
    assert wide.gpu_indices is not None and narrow.gpu_indices is not None
    (idle,) = {0, 1, 2, 3} - {*wide.gpu_indices, *narrow.gpu_indices}
    theirs = sorted([*narrow.gpu_indices, idle])
    urgent = await submit(client, tenant, {**HELLO_WORLD, "gpus": 2})
    waited(app)
    await agent.heartbeat([wide, narrow])
    assert await preempt(app) == [narrow.invoke_id]
    assert await placement_of(app, urgent) == ("queued", agent.node_id, theirs)

    late = await submit(client, other_tenant, {**HELLO_WORLD, "gpus": 1})
    assert await agent.lease(slots=2) == []  # the idle GPU waits for the work placed on it
    await stop(agent, narrow.invoke_id, narrow.lease_token)
    (taken,) = await agent.lease(slots=2)
    assert (taken.invoke_id, taken.gpu_indices) == (urgent, theirs)
    assert (await placement_of(app, late))[:2] == ("queued", None)


async def test_the_slot_a_preemption_frees_goes_to_the_work_it_was_for(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    """Fair share would serve the tenant served longest ago first; the slot is the placed
    work's all the same."""
    agent = await sim_agent(inventory(slots=1))
    spot = await running_spot(client, tenant, agent)  # serves `tenant`: it goes to the back
    urgent = await submit(client, tenant, CPU_HELLO)
    waited(app)
    assert await preempt(app) == [spot.invoke_id]
    rival = await submit(client, other_tenant, CPU_HELLO)  # never served: first in fair share
    await stop(agent, spot.invoke_id, spot.lease_token)
    (taken,) = await agent.lease()
    assert taken.invoke_id == urgent
    await agent.client.start(taken.invoke_id, taken.lease_token)
    await agent.client.report(taken.invoke_id, done_report(taken), retry_for=0)
    (after,) = await agent.lease()
    assert after.invoke_id == rival  # then on-demand before spot, as ever


async def test_a_cpu_slot_beside_the_gpus_stays_free_for_placed_work_only_while_it_waits(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    """Two slots, one GPU: a spot job holds the GPU, the other slot is idle. A GPU job
    placed here holds a slot while the spot job stops; once it runs, the other slot is
    anyone's."""
    node = inventory(runtimes=[RuntimeName.ONNX_CUDA, RuntimeName.ONNX_CPU], gpus=gpus(1), slots=2)
    agent = await sim_agent(node)
    spot = await running_gpu_spot(client, tenant, agent, 1)
    urgent = await submit(client, tenant, HELLO_WORLD)
    waited(app)
    await agent.heartbeat([spot])
    assert await preempt(app) == [spot.invoke_id]
    cpu = await submit(client, other_tenant, CPU_HELLO)
    assert await agent.lease(slots=1) == []  # the one free slot: the placed work's
    await stop(agent, spot.invoke_id, spot.lease_token)
    jobs = await agent.lease(slots=2)
    assert [job.invoke_id for job in jobs] == [urgent, cpu]
