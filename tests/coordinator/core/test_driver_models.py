"""A model's whole row read on the driver (`driver_models`) is the row the ORM reads, as
an object in no session."""

from fastapi import FastAPI
from sqlalchemy import inspect

from gpu_share.coordinator.core import driver_models
from gpu_share.coordinator.core.db import driver_of
from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.testing.simulated_agent import H100, AgentFactory, inventory

_NODE = driver_models.whole_row(NodeRow, "WHERE nodes.id = :node_id")


async def test_a_node_read_on_the_driver_equals_the_orms(
    app: FastAPI, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent(inventory(gpus=[H100]), verified=True)
    db = app.state.replica.db
    async with db.read() as session:
        orm = await session.get(NodeRow, agent.node_id)
        assert orm is not None
        tx = await driver_of(session)
        row = await tx.fetchrow(_NODE, node_id=agent.node_id)
        assert row is not None
        read = driver_models.transient(NodeRow, row)
    for column in NodeRow.__table__.columns:
        assert getattr(read, column.key) == getattr(orm, column.key), column.key
    # the same Python types: aware datetimes, decoded JSON, booleans (SQLite keeps 0 and 1)
    assert read.registered_at.tzinfo is not None
    assert read.gpus and isinstance(read.gpus[0], dict)
    assert read.verification and read.trusted is False and read.delisted is False
    assert inspect(read).transient  # in no session: a change is the caller's to write
    read.polling_until = read.registered_at
    assert inspect(read).attrs.polling_until.history.added == [read.registered_at]
