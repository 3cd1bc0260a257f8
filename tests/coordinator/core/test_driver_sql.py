"""Statements on the driver (`driver_sql`, `Database.driver_write`) read and write what the
ORM does, on both databases, and fail the way the ORM's do."""

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import exc, select

from gpu_share.coordinator.core.db import Database, driver_of
from gpu_share.coordinator.core.driver_sql import (
    Sql,
    postgres_transaction,
    sql_list,
    sqlite_transaction,
    sqlite_value,
)
from gpu_share.coordinator.core.orm import LedgerTransactionRow

_INSERT = Sql(
    "INSERT INTO ledger_transactions (id, cause, kind, created_at, details)"
    " VALUES (:id, :cause, :kind, :at, :details)",
    jsons=("details",),
)
_READ = Sql(
    "SELECT id, created_at, details FROM ledger_transactions WHERE id = :id",
    datetimes=("created_at",),
    jsons=("details",),
)
_LATER_THAN = Sql(
    "SELECT id FROM ledger_transactions WHERE created_at > :since ORDER BY id",
)

MOMENT = datetime(2026, 12, 5, 3, 4, 5, 678901, tzinfo=UTC)
DETAILS = {"invoke": "inv_1", "seconds": 1.5, "gpus": [0, 1], "note": "é"}


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = Database(db_url)
    yield database
    await database.dispose()


def test_parameters_are_numbered_for_asyncpg_once_per_name() -> None:
    sql = Sql("SELECT :a, :b::jsonb, :a, 'x'::text WHERE y = :b_c")
    assert sql.pg_text == "SELECT $1, $2::jsonb, $1, 'x'::text WHERE y = $3"
    assert sql.pg_names == ("a", "b", "b_c")


def test_only_plain_constants_make_an_sql_list() -> None:
    assert sql_list(["assigned", "running"]) == "'assigned', 'running'"
    with pytest.raises(ValueError, match="plain constant"):
        sql_list(["done') OR ('1"])


def test_a_naive_datetime_is_refused_as_the_orm_refuses_it() -> None:
    with pytest.raises(ValueError, match="naive"):
        sqlite_value(datetime(2026, 1, 1))


async def test_a_row_written_on_the_driver_reads_alike_through_the_orm(db: Database) -> None:
    async with db.driver_write() as tx:
        await tx.execute(_INSERT, id="t1", cause="c1", kind="k", at=MOMENT, details=DETAILS)
    async with db.read() as session:
        row = await session.get(LedgerTransactionRow, "t1")
    assert row is not None
    assert (row.created_at, row.details) == (MOMENT, DETAILS)


async def test_a_row_written_by_the_orm_reads_alike_on_the_driver(db: Database) -> None:
    local = MOMENT.astimezone(timezone(timedelta(hours=3)))  # the ORM stores it as UTC
    async with db.write() as session:
        session.add(
            LedgerTransactionRow(id="t2", cause="c2", kind="k", created_at=local, details=DETAILS)
        )
    async with db.driver_write() as tx:
        row = await tx.fetchrow(_READ, id="t2")
        missing = await tx.fetchrow(_READ, id="nope")
    assert row is not None and missing is None
    assert row["created_at"] == MOMENT and row["created_at"].utcoffset() == timedelta(0)
    assert row["details"] == DETAILS


async def test_datetimes_compare_in_sql_as_the_orm_stores_them(db: Database) -> None:
    # SQLite compares the stored text: a bound value must be written the same way.
    async with db.write() as session:
        for n in range(3):
            at = MOMENT + timedelta(microseconds=n)
            session.add(
                LedgerTransactionRow(id=f"t{n}", cause=f"c{n}", kind="k", created_at=at, details={})
            )
    async with db.driver_write() as tx:
        later = await tx.fetch(_LATER_THAN, since=MOMENT)
    assert [row["id"] for row in later] == ["t1", "t2"]


async def test_an_error_inside_rolls_everything_back(db: Database) -> None:
    async def insert_then_fail() -> None:
        async with db.driver_write() as tx:
            await tx.execute(_INSERT, id="t3", cause="c3", kind="k", at=MOMENT, details={})
            raise RuntimeError("the handler failed after its first statement")

    with pytest.raises(RuntimeError):
        await insert_then_fail()
    async with db.read() as session:
        assert await session.get(LedgerTransactionRow, "t3") is None


async def test_driver_errors_are_sqlalchemys_and_leave_the_connection_usable(
    db: Database,
) -> None:
    async with db.driver_write() as tx:
        await tx.execute(_INSERT, id="t4", cause="same", kind="k", at=MOMENT, details={})
    with pytest.raises(exc.IntegrityError):
        async with db.driver_write() as tx:
            await tx.execute(_INSERT, id="t5", cause="same", kind="k", at=MOMENT, details={})
    broken = Sql("SELECT no_such_column FROM ledger_transactions")
    with pytest.raises(exc.OperationalError):
        async with db.driver_write() as tx:
            await tx.fetch(broken)
    for _ in range(12):  # more than the pool holds: every connection went back clean
        async with db.driver_write() as tx:
            assert len(await tx.fetch(_LATER_THAN, since=MOMENT - timedelta(days=1))) == 1
    async with db.read() as session:
        causes = (await session.scalars(select(LedgerTransactionRow.cause))).all()
    assert causes == ["same"]


async def test_driver_and_orm_writes_take_turns_on_sqlite(db_url: str) -> None:
    # SQLite's writers are serialized in-process (`Database.write`); the driver's too, so
    # a writer waits its turn instead of meeting "database is locked" after the busy
    # timeout. On PostgreSQL they run side by side.
    db = Database(db_url, busy_timeout_ms=50)

    async def on_driver(n: int) -> None:
        async with db.driver_write() as tx:
            await tx.execute(_INSERT, id=f"d{n}", cause=f"d{n}", kind="k", at=MOMENT, details={})
            await asyncio.sleep(0.2)  # past the busy timeout, holding the write

    async def on_orm(n: int) -> None:
        async with db.write() as session:
            row = LedgerTransactionRow(id=f"o{n}", cause=f"o{n}", kind="k", created_at=MOMENT)
            row.details = {}
            session.add(row)
            await asyncio.sleep(0.2)

    try:
        await asyncio.gather(*(on_driver(n) for n in range(3)), *(on_orm(n) for n in range(3)))
        async with db.read() as session:
            ids = (await session.scalars(select(LedgerTransactionRow.id))).all()
    finally:
        await db.dispose()
    assert len(ids) == 6


async def test_one_statement_outside_a_transaction_refuses_a_second(db: Database) -> None:
    async def two_statements() -> None:
        async with db.driver_write(one_statement=True) as tx:
            await tx.execute(_INSERT, id="t6", cause="c6", kind="k", at=MOMENT, details={})
            await tx.execute(_INSERT, id="t7", cause="c7", kind="k", at=MOMENT, details={})

    if db.is_sqlite:  # a write transaction all the same: both land
        await two_statements()
        expected = ["t6", "t7"]
    else:  # the first committed by itself, the second never sent
        with pytest.raises(RuntimeError, match="one statement"):
            await two_statements()
        expected = ["t6"]
    async with db.read() as session:
        ids = (await session.scalars(select(LedgerTransactionRow.id))).all()
    assert sorted(ids) == expected


def _orm_row(row_id: str) -> LedgerTransactionRow:
    row = LedgerTransactionRow(id=row_id, cause=row_id, kind="k", created_at=MOMENT)
    row.details = {}
    return row


async def test_driver_statements_in_an_orm_transaction_commit_with_it(db: Database) -> None:
    async with db.write() as session:
        tx = await driver_of(session)  # the driver first: its statement opens the transaction
        await tx.execute(_INSERT, id="m1", cause="m1", kind="k", at=MOMENT, details={})
        session.add(_orm_row("m2"))  # pending: flushed when the driver is asked for again
        tx = await driver_of(session)
        # one transaction: each sees the other's uncommitted row
        assert len(await tx.fetch(_LATER_THAN, since=MOMENT - timedelta(days=1))) == 2
        await tx.execute(_INSERT, id="m3", cause="m3", kind="k", at=MOMENT, details={})
    async with db.read() as session:
        ids = (await session.scalars(select(LedgerTransactionRow.id))).all()
    assert sorted(ids) == ["m1", "m2", "m3"]


async def test_driver_statements_in_an_orm_transaction_roll_back_with_it(db: Database) -> None:
    async def write_then_fail(driver_first: bool) -> None:
        async with db.write() as session:
            if not driver_first:
                session.add(_orm_row("r0"))
                await session.flush()
            tx = await driver_of(session)
            await tx.execute(_INSERT, id="r1", cause="r1", kind="k", at=MOMENT, details={})
            session.add(_orm_row("r2"))
            await session.flush()
            raise RuntimeError("the handler failed after its writes")

    for driver_first in (True, False):
        with pytest.raises(RuntimeError):
            await write_then_fail(driver_first)
    async with db.read() as session:
        assert (await session.scalars(select(LedgerTransactionRow.id))).all() == []
    for _ in range(12):  # more than the pool holds: every connection went back clean
        async with db.write() as session:
            tx = await driver_of(session)
            assert await tx.fetch(_LATER_THAN, since=MOMENT - timedelta(days=1)) == []


async def test_a_transaction_finds_its_driver_once_and_the_next_finds_its_own(
    db: Database,
) -> None:
    async with db.write() as session:
        assert await driver_of(session) is await driver_of(session)  # kept for the transaction
    async with db.read() as session:  # a session that ends transactions as it goes
        first = await driver_of(session)
        await first.execute(_INSERT, id="c1", cause="c1", kind="k", at=MOMENT, details={})
        await session.commit()  # its connection went back to the pool
        second = await driver_of(session)
        assert second is not first
        await second.execute(_INSERT, id="c2", cause="c2", kind="k", at=MOMENT, details={})
        await session.rollback()
        third = await driver_of(session)
        assert third is not second
        await third.execute(_INSERT, id="c3", cause="c3", kind="k", at=MOMENT, details={})
        await session.commit()
    async with db.read() as session:
        ids = (await session.scalars(select(LedgerTransactionRow.id))).all()
    assert sorted(ids) == ["c1", "c3"]  # the second's went with its rollback


async def test_a_write_cancelled_while_it_begins_leaves_no_transaction_open(db: Database) -> None:
    # A request or a loop stopped at shutdown may be cancelled while its BEGIN IMMEDIATE
    # is on its way: aiosqlite runs the BEGIN all the same, and the connection went back
    # to the pool holding SQLite's write lock (every other writer then waited out the
    # busy timeout: a server's shutdown hung on it in CI).
    if not db.is_sqlite:
        pytest.skip("SQLite's write transactions; asyncpg's are its own")
    async with db.engine.connect() as connection:
        raw = (await connection.get_raw_connection()).driver_connection
        assert raw is not None
        beginning = asyncio.create_task(sqlite_transaction(raw).__aenter__())
        await asyncio.sleep(0)  # the BEGIN is handed to aiosqlite's thread
        beginning.cancel()
        with pytest.raises(asyncio.CancelledError):
            await beginning
        await raw.execute("SELECT 1")  # runs after whatever was queued before it
        assert not raw.in_transaction


async def test_a_postgres_write_cancelled_while_it_begins_leaves_the_connection_clean(
    db: Database,
) -> None:
    # The same cancel on PostgreSQL: the BEGIN reaches the server all the same. The
    # connection goes back to the pool, and the next transaction on it must begin,
    # commit and be seen by others, not run inside the one left open (where its COMMIT
    # would commit nothing).
    if db.is_sqlite:
        pytest.skip("asyncpg's transactions; SQLite's are the test above")
    async with db.engine.connect() as connection:
        raw = (await connection.get_raw_connection()).driver_connection
        assert raw is not None
        await raw.execute("CREATE TEMP TABLE IF NOT EXISTS cancelled_begin (n int)")
        beginning = asyncio.create_task(postgres_transaction(raw).__aenter__())
        await asyncio.sleep(0)  # the BEGIN is on the wire
        beginning.cancel()
        with pytest.raises(asyncio.CancelledError):
            await beginning
        async with postgres_transaction(raw) as tx:
            await tx.execute(Sql("INSERT INTO cancelled_begin (n) VALUES (1)"))
        assert not raw.is_in_transaction()
        await raw.execute("ROLLBACK")  # were it still open, this would undo the INSERT
        assert await raw.fetchval("SELECT count(*) FROM cancelled_begin") == 1
        await raw.execute("DROP TABLE cancelled_begin")
