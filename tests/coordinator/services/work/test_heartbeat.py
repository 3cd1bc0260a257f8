"""The heartbeat (`leases.heartbeat`, on the driver): what one beat writes and answers, on
both databases. Its lease verdicts are pinned in test_leases and test_preemption, its
challenge in trust/test_challenges, its benchmark request in providers/test_benchmarks."""

from datetime import timedelta

from fastapi import FastAPI
from sqlalchemy import func, select

from gpu_share.coordinator.core.orm import NodePresenceRow, NodeRow, TelemetrySampleRow
from gpu_share.coordinator.services.nodes import presence
from gpu_share.protocol.nodes import Telemetry
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.simulated_agent import AgentFactory


async def test_a_beat_marks_the_node_keeps_a_sample_and_counts_its_bucket(
    app: FastAPI, sim_agent: AgentFactory, clock: FrozenClock
) -> None:
    agent = await sim_agent()
    # Both beats in one 5-minute bucket: start at a bucket's start.
    clock.advance(presence.BUCKET_SEC - clock.now().timestamp() % presence.BUCKET_SEC)
    first, second = Telemetry(cpu_pct=10.0), Telemetry(cpu_pct=90.0, ram_used_mb=512)
    await agent.heartbeat([], telemetry=first)
    clock.advance(5)
    ack = await agent.heartbeat([], telemetry=second)
    assert ack.leases == [] and not ack.run_benchmark and ack.challenge is None

    async with app.state.replica.db.read() as session:
        node = await session.get(NodeRow, agent.node_id)
        samples = (
            await session.execute(
                select(TelemetrySampleRow.at, TelemetrySampleRow.telemetry)
                .where(TelemetrySampleRow.node_id == agent.node_id)
                .order_by(TelemetrySampleRow.at, TelemetrySampleRow.id)  # in the order written
            )
        ).all()
        beats = await session.scalar(
            select(func.sum(NodePresenceRow.beats)).where(
                NodePresenceRow.node_id == agent.node_id,
                NodePresenceRow.bucket_start == presence.bucket_of(clock.now()),
            )
        )
    assert node is not None
    assert node.last_seen_at == clock.now()
    assert node.telemetry == second.model_dump()
    assert [at for at, _ in samples][-2:] == [clock.now() - timedelta(seconds=5), clock.now()]
    assert [data for _, data in samples][-2:] == [first.model_dump(), second.model_dump()]
    assert beats == 2
