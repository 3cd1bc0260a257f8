"""Which process holds each node's session channel (`services.sessions.channels`), on both
databases: a channel counts while its process beats, moves with its node, and a dead
process's channels go with it."""

from datetime import timedelta

from fastapi import FastAPI
from sqlalchemy import func, select

from gpu_share.coordinator.core.orm import NodeChannelRow, ReplicaRow
from gpu_share.coordinator.services.sessions import channels
from gpu_share.coordinator.services.sessions.channels import Holder
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.simulated_agent import AgentFactory


async def test_a_channel_counts_while_its_process_beats(
    app: FastAPI, sim_agent: AgentFactory, clock: FrozenClock
) -> None:
    node = (await sim_agent()).node_id
    assert node is not None
    db = app.state.replica.db
    now = clock.now()
    async with db.write() as session:
        await channels.beat(session, "rep_a", "http://127.0.0.1:7001", now)
        await channels.attach(session, node, "rep_a", now)
    later = now + timedelta(seconds=channels.DEAD_AFTER_SEC + 1)
    async with db.read() as session:
        assert await channels.holders(session, now) == {
            node: Holder("rep_a", "http://127.0.0.1:7001")
        }
        assert await channels.holders(session, now, [node, "nod_other"]) == {
            node: Holder("rep_a", "http://127.0.0.1:7001")
        }
        assert await channels.holders(session, now, ["nod_other"]) == {}
        assert await channels.holders(session, later) == {}  # rep_a stopped beating

    async with db.write() as session:  # any process's beat removes the dead
        await channels.beat(session, "rep_b", None, later)
    async with db.read() as session:
        replicas = set((await session.scalars(select(ReplicaRow.id))).all())
        left = await session.scalar(select(func.count()).select_from(NodeChannelRow))
    assert replicas == {"rep_b"} and left == 0


async def test_a_channel_moves_with_its_node_and_a_late_goodbye_does_not_undo_it(
    app: FastAPI, sim_agent: AgentFactory, clock: FrozenClock
) -> None:
    node = (await sim_agent()).node_id
    assert node is not None
    db = app.state.replica.db
    now = clock.now()
    async with db.write() as session:
        for replica in ("rep_a", "rep_b"):
            await channels.beat(session, replica, f"http://{replica}", now)
        await channels.attach(session, node, "rep_a", now)
        await channels.attach(session, node, "rep_b", now)  # it reconnected elsewhere
        await channels.detach(session, node, "rep_a")  # the old connection's end, late
    async with db.read() as session:
        assert await channels.holders(session, now) == {node: Holder("rep_b", "http://rep_b")}
    async with db.write() as session:
        await channels.leave(session, "rep_b")
    async with db.read() as session:
        assert await channels.holders(session, now) == {}
        assert await session.get(ReplicaRow, "rep_b") is None
        assert await session.get(ReplicaRow, "rep_a") is not None


async def test_each_process_records_itself_at_start(app: FastAPI, clock: FrozenClock) -> None:
    replica = app.state.replica
    async with replica.db.read() as session:
        row = await session.get(ReplicaRow, replica.id)
    assert row is not None and row.seen_at == clock.now()
    assert row.relay_url is None  # no GPUSHARE_RELAY_HOST: it takes no relayed traffic
