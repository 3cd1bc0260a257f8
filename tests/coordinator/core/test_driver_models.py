"""A model's whole row read on the driver (`driver_models`) is the row the ORM reads, as
an object in no session."""

from datetime import UTC, datetime

import pytest
from fastapi import FastAPI
from sqlalchemy import func, inspect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.orm.exc import DetachedInstanceError

from gpu_share.coordinator.core import driver_models
from gpu_share.coordinator.core.db import driver_of
from gpu_share.coordinator.core.orm import InvokeRow, NodeRow
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.simulated_agent import H100, AgentFactory, inventory

_NODE = driver_models.whole_row(NodeRow, "WHERE nodes.id = :node_id")


class _Elsewhere(DeclarativeBase):  # not the coordinator's tables
    pass


class _ServerFilled(_Elsewhere):
    __tablename__ = "server_filled"

    id: Mapped[str] = mapped_column(primary_key=True)
    checked_at: Mapped[datetime] = mapped_column(server_default=func.now())


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


async def test_a_row_written_on_the_driver_is_what_the_orms_flush_writes(
    app: FastAPI, tenant: TenantHandle
) -> None:
    moment = datetime(2026, 12, 5, 9, 30, tzinfo=UTC)

    def made(invoke_id: str) -> InvokeRow:
        return InvokeRow(
            id=invoke_id,
            tenant_id=tenant.id,
            status="queued",
            runtime="onnx_cpu",
            priority="on_demand",
            model_url="https://example.com/m.onnx",
            inputs_url="",
            timeout_sec=60,
            gpus=0,
            constraints={"region": "eu"},
            warnings=["w"],
            max_attempts=3,
            created_at=moment,
        )

    on_driver = made("inv_driver")
    db = app.state.replica.db
    async with db.write() as session:
        session.add(made("inv_orm"))
        tx = await driver_of(session)
        await tx.execute(
            driver_models.insert_of(InvokeRow), **driver_models.flushed_values(on_driver)
        )
    assert (on_driver.attempts, on_driver.preemptions, on_driver.reserved_micro) == (0, 0, 0)
    async with db.read() as session:
        by_orm = await session.get(InvokeRow, "inv_orm")
        by_driver = await session.get(InvokeRow, "inv_driver")
    assert by_orm is not None and by_driver is not None
    for column in InvokeRow.__table__.columns:
        if column.key != "id":
            assert getattr(by_driver, column.key) == getattr(by_orm, column.key), column.key


def test_a_column_the_database_fills_must_be_set() -> None:
    with pytest.raises(ValueError, match="checked_at"):
        driver_models.flushed_values(_ServerFilled(id="x"))  # type: ignore[arg-type]


_SOME = ("id", "gpus", "tier", "registered_at", "delisted")
_SOME_NODE = driver_models.some_columns(NodeRow, _SOME, "WHERE nodes.id = :node_id")


async def test_a_node_read_in_some_columns_has_those_and_refuses_the_others(
    app: FastAPI, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent(inventory(gpus=[H100]), verified=True)
    async with app.state.replica.db.read() as session:
        orm = await session.get(NodeRow, agent.node_id)
        assert orm is not None
        tx = await driver_of(session)
        row = await tx.fetchrow(_SOME_NODE, node_id=agent.node_id)
        assert row is not None
        read = driver_models.partial(NodeRow, row, _SOME)
    for key in _SOME:
        assert getattr(read, key) == getattr(orm, key), key
    assert read.delisted is False and read.registered_at.tzinfo is not None
    assert orm.hostname  # the row has one; the read left it out, and says so
    with pytest.raises(DetachedInstanceError):
        _ = read.hostname


def test_some_columns_refuses_a_name_the_model_lacks() -> None:
    with pytest.raises(ValueError, match="hostnme"):
        driver_models.some_columns(NodeRow, ("id", "hostnme"), "")
