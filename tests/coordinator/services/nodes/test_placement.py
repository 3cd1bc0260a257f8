"""Placement (SPEC §4.1): only nodes that meet every constraint get work, and a NO_CAPACITY
names what nothing met. Which of the eligible nodes gets it first is test_claims'."""

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import update

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.protocol.nodes import GpuInfo
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.simulated_agent import H100, AgentFactory, SimulatedAgent, inventory
from tests.coordinator.services.work.test_leases import CPU_HELLO, submit

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


@pytest.mark.parametrize(
    ("node", "ask", "constraint", "why"),
    [
        (
            {"region": "eu-west"},
            {"region": "us-east"},
            "region",
            "none is in region us-east (they are in eu-west)",
        ),
        ({}, {"tier": "enterprise"}, "tier", "none is at the enterprise tier"),
        (  # never scored
            {"reliability": None},
            {"min_reliability": 0.5},
            "min_reliability",
            "none has a reliability score yet",
        ),
        (
            {"reliability": {"score": 0.4}},
            {"min_reliability": 0.5},
            "min_reliability",
            "the most reliable has 40 %. Ask for 40 % or less",
        ),
        (
            {"price_per_gpu_hour_micro": 3_000_000},
            {"max_price_per_gpu_hour": "2.5"},
            "max_price_per_gpu_hour",
            "the cheapest asks 3 USDC per GPU-hour. Pay up to 3 USDC per GPU-hour",
        ),
        ({"delisted": True}, {}, "listed", "every machine with onnx_cpu is delisted right now"),
        (
            {"benchmark_state": {"node": {"score": 0.1, "passed": False}}},
            {},
            "listed",
            "after a failed benchmark",
        ),
        (
            {"availability": "closed today"},
            {},
            "availability window",
            "every machine that could is outside its provider's hours right now",
        ),
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
    why: str,
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
    assert error["message"].startswith("No machine online right now can run onnx_cpu")
    assert why in error["message"]


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
