"""Rivals are read in the columns that rank them and judge what they could take
(`rivals.RANKED`), and judged as their whole rows would be."""

from datetime import timedelta
from typing import Any

from fastapi import FastAPI
from sqlalchemy import update

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.nodes import ranking
from gpu_share.coordinator.services.nodes.placement import Requirements, serves
from gpu_share.coordinator.services.work import rivals
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.simulated_agent import H100, AgentFactory, inventory

SHAPES: list[tuple[str, int, dict[str, Any]]] = [
    ("onnx_cpu", 0, {}),
    ("onnx_cuda", 1, {"gpu_model": "H100", "require_verified": True}),
    ("onnx_cuda", 1, {"min_vram_mb": 200_000}),
    ("onnx_cpu", 0, {"tier": "enterprise", "min_reliability": 0.5, "isolated_only": True}),
    ("onnx_cpu", 0, {"region": "eu", "max_price_micro": 1}),
]


async def test_rivals_are_ranked_and_judged_as_their_whole_rows(
    app: FastAPI, sim_agent: AgentFactory, clock: FrozenClock
) -> None:
    cpu = await sim_agent(inventory(runtimes=[RuntimeName.ONNX_CPU]))
    gpu = await sim_agent(inventory(gpus=[H100]), verified=True)
    asking = await sim_agent(inventory(runtimes=[RuntimeName.ONNX_CPU]))
    assert cpu.node_id and gpu.node_id and asking.node_id
    now = clock.now()
    async with app.state.replica.db.write() as session:
        await session.execute(
            update(NodeRow)
            .where(NodeRow.id.in_([cpu.node_id, gpu.node_id]))
            .values(
                polling_until=now + timedelta(seconds=20),
                poll_free_slots=1,
                poll_free_gpus=1,
                price_per_gpu_hour_micro=0,
                reliability={"score": 0.99},
            )
        )
        await session.execute(  # its hardware's proof counts for the tier's rank
            update(NodeRow).where(NodeRow.id == gpu.node_id).values(tier="enterprise")
        )
        await session.execute(
            update(NodeRow)
            .where(NodeRow.id == asking.node_id)
            .values(price_per_gpu_hour_micro=5_000_000, reliability={"score": 0.1})
        )
    async with app.state.replica.db.write() as session:
        me = await session.get(NodeRow, asking.node_id)
        assert me is not None
        read = {node.id: node for node in await rivals.better_pollers(session, me, now)}
        whole = {
            node_id: await session.get(NodeRow, node_id) for node_id in (cpu.node_id, gpu.node_id)
        }
    assert set(read) == set(whole)  # both waiting, both ranked above the asking node
    for node_id, node in whole.items():
        assert node is not None
        assert ranking.rank(read[node_id]) == ranking.rank(node)
        for runtime, gpus, constraints in SHAPES:
            req = Requirements.from_parts(runtime, gpus, constraints)
            assert serves(read[node_id], req, now) == serves(node, req, now), (node_id, req)
    judged = [
        serves(node, Requirements.from_parts(*shape), now)
        for shape in SHAPES
        for node in whole.values()
        if node
    ]
    assert True in judged and False in judged  # the shapes tell the nodes apart
