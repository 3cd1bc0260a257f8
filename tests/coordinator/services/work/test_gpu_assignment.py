"""Multi-GPU jobs (SPEC §4.3): `gpus: N` on one node with N free GPUs, the GPUs named in the
lease and recorded on the invoke, NVLink preferred, and the topology shown in offers."""

import httpx
from fastapi import FastAPI

from gpu_share.coordinator.core.orm import InvokeRow, NodeRow
from gpu_share.protocol.nodes import GpuLink, GpuLinkKind, GpuTopology
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.simulated_agent import H100, AgentFactory, SimulatedAgent, inventory
from tests.coordinator.services.market.test_offers import offers
from tests.coordinator.services.work.test_leases import submit

GPU_HELLO = {**HELLO_WORLD, "runtime": "onnx_cuda"}
GPU_RUNTIMES = [RuntimeName.ONNX_CUDA, RuntimeName.CATBOOST_CUDA, RuntimeName.ONNX_CPU]

# Two NVLink pairs (0-1, 2-3), joined to each other only across the CPU sockets.
TWO_PAIRS = GpuTopology(
    links=[
        GpuLink(a=0, b=1, kind=GpuLinkKind.NVLINK, nvlinks=4),
        GpuLink(a=0, b=2, kind=GpuLinkKind.SYSTEM),
        GpuLink(a=0, b=3, kind=GpuLinkKind.SYSTEM),
        GpuLink(a=1, b=2, kind=GpuLinkKind.SYSTEM),
        GpuLink(a=1, b=3, kind=GpuLinkKind.SYSTEM),
        GpuLink(a=2, b=3, kind=GpuLinkKind.NVLINK, nvlinks=4),
    ]
)


async def gpu_node(
    sim_agent: AgentFactory,
    count: int,
    *,
    slots: int = 4,
    topology: GpuTopology | None = None,
    verified: bool = True,
) -> SimulatedAgent:
    """`count` H100s, proven by their challenges unless `verified` is false."""
    return await sim_agent(
        inventory(runtimes=GPU_RUNTIMES, gpus=[H100] * count, slots=slots, gpu_topology=topology),
        verified=verified,
    )


async def recorded_indices(app: FastAPI, invoke_id: str) -> list[int] | None:
    async with app.state.replica.db.read() as session:
        row = await session.get(InvokeRow, invoke_id)
        assert row is not None
        indices: list[int] | None = row.gpu_indices
        return indices


async def test_a_two_gpu_job_goes_to_a_node_with_two_free_gpus_and_gets_two_of_them(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    small, big = await gpu_node(sim_agent, 1), await gpu_node(sim_agent, 4)
    invoke_id = await submit(client, tenant, {**GPU_HELLO, "gpus": 2})

    assert await small.lease(free_gpus=1) == []
    (job,) = await big.lease()

    assert job.invoke_id == invoke_id and job.gpus == 2
    assert job.gpu_indices is not None and len(set(job.gpu_indices)) == 2
    assert set(job.gpu_indices) <= {0, 1, 2, 3}
    assert await recorded_indices(app, invoke_id) == job.gpu_indices


async def test_two_jobs_of_two_gpus_share_a_four_gpu_node_and_a_third_waits(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    node = await gpu_node(sim_agent, 4)
    ids = [await submit(client, tenant, {**GPU_HELLO, "gpus": 2}) for _ in range(3)]

    # The agent claims more GPUs free than there are: the coordinator counts what it gave.
    first, second = await node.lease(slots=4, free_gpus=8)
    assert await node.lease(slots=2, free_gpus=8) == []

    assert first.gpu_indices and second.gpu_indices
    assert sorted(first.gpu_indices + second.gpu_indices) == [0, 1, 2, 3]
    await node.complete(first)
    (third,) = await node.lease(slots=2)
    assert third.invoke_id == ids[2]
    assert sorted(third.gpu_indices or []) == sorted(first.gpu_indices)


async def test_only_the_gpus_the_agent_says_are_free_are_given(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    node = await gpu_node(sim_agent, 4)
    await submit(client, tenant, {**GPU_HELLO, "gpus": 2})

    assert await node.lease(free_gpus=1, free_gpu_indices=[2]) == []
    (job,) = await node.lease(free_gpus=2, free_gpu_indices=[1, 3])
    assert job.gpu_indices == [1, 3]


async def test_a_multi_gpu_job_gets_gpus_linked_by_nvlink(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    node = await gpu_node(sim_agent, 4, topology=TWO_PAIRS)
    for _ in range(2):
        await submit(client, tenant, {**GPU_HELLO, "gpus": 2})

    # GPU 0 is busy on the agent's side: 1 and 2 are free but not linked; 2 and 3 are.
    (job,) = await node.lease(free_gpus=3, free_gpu_indices=[1, 2, 3])
    assert job.gpu_indices == [2, 3]
    (job,) = await node.lease(free_gpus=4)
    assert job.gpu_indices == [0, 1]


async def test_a_cpu_job_takes_no_gpu(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    node = await gpu_node(sim_agent, 2)
    gpu_job = await submit(client, tenant, {**GPU_HELLO, "gpus": 2})
    cpu_job = await submit(client, tenant, {**HELLO_WORLD, "runtime": "onnx_cpu", "gpus": 2})

    jobs = {job.invoke_id: job for job in await node.lease(slots=2, free_gpus=2)}

    assert jobs[gpu_job].gpu_indices == [0, 1]
    assert jobs[cpu_job].gpus == 0 and jobs[cpu_job].gpu_indices is None
    assert await recorded_indices(app, cpu_job) is None


async def test_more_gpus_than_any_node_has_is_no_capacity_naming_gpus(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await gpu_node(sim_agent, 4)
    for gpus in (5, 16):
        refused = await client.post(
            "/v1/gpu/invoke", json={**GPU_HELLO, "gpus": gpus}, headers=tenant.headers
        )
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "NO_CAPACITY"
        assert error["details"]["constraint"] == "gpus"
        assert f"{gpus} GPUs" in error["message"]
    accepted = await client.post(
        "/v1/gpu/invoke", json={**GPU_HELLO, "gpus": 4}, headers=tenant.headers
    )
    assert accepted.status_code == 202


async def test_offers_show_the_topology_and_filter_on_nvlink(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    linked = await gpu_node(sim_agent, 4, topology=TWO_PAIRS)
    plain = await gpu_node(sim_agent, 4)

    shown = {o["node_id"]: o for o in await offers(client, tenant)}
    assert shown[linked.node_id]["nvlink"] is True
    assert {"a": 0, "b": 1, "kind": "nvlink", "nvlinks": 4} in (
        shown[linked.node_id]["gpu_topology"]["links"]
    )
    assert shown[plain.node_id]["nvlink"] is False
    assert shown[plain.node_id]["gpu_topology"] is None

    assert [o["node_id"] for o in await offers(client, tenant, nvlink="true")] == [linked.node_id]
    assert [o["node_id"] for o in await offers(client, tenant, nvlink="false")] == [plain.node_id]
    # No four of its GPUs are all linked to each other.
    assert await offers(client, tenant, nvlink="true", gpus=4) == []

    async with app.state.replica.db.read() as session:
        row = await session.get(NodeRow, linked.node_id)
        assert row is not None and row.gpu_topology == TWO_PAIRS.model_dump(mode="json")


async def test_an_inventory_without_topology_clears_it(
    app: FastAPI, sim_agent: AgentFactory
) -> None:
    node = await gpu_node(sim_agent, 2, topology=TWO_PAIRS)
    await node.client.update_inventory(inventory(runtimes=GPU_RUNTIMES, gpus=[H100] * 2))
    async with app.state.replica.db.read() as session:
        row = await session.get(NodeRow, node.node_id)
        assert row is not None and row.gpu_topology is None
