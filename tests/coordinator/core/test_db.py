"""The engine hands out live connections (`Database`, PostgreSQL's pool)."""

import asyncio
import contextlib
import functools
from datetime import UTC, datetime

import asyncpg
import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.pool import QueuePool

from gpu_share.coordinator.core import metrics
from gpu_share.coordinator.core.db import Database, driver_of
from gpu_share.coordinator.core.driver_sql import Sql
from gpu_share.coordinator.core.orm import LedgerTransactionRow


async def _backend_pid(db: Database) -> int:
    async with db.read() as session:
        pid: int = (await session.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        return pid


async def _terminate(db_url: str, pid: int) -> None:
    conn = await asyncpg.connect(db_url.replace("postgresql+asyncpg", "postgresql"))
    try:
        # Waits (up to 5 s) until the backend is gone, not only signalled.
        assert await conn.fetchval("SELECT pg_terminate_backend($1, 5000)", pid)
    finally:
        await conn.close()


@pytest.fixture
def postgres_url(db_url: str) -> str:
    if not db_url.startswith("postgresql"):
        pytest.skip("the pool's ping is PostgreSQL's (SQLite has no server to lose)")
    return db_url


async def test_a_connection_that_died_while_idle_is_replaced_before_use(postgres_url: str) -> None:
    db = Database(postgres_url, ping_after_idle_sec=0.0)
    try:
        dead = await _backend_pid(db)
        await _terminate(postgres_url, dead)
        assert await _backend_pid(db) != dead  # pinged, found dead, replaced: no error
    finally:
        await db.dispose()


async def test_a_connection_used_moments_ago_is_handed_out_without_a_ping(
    postgres_url: str,
) -> None:
    # The other side of the same rule: within the idle window nothing is tried, so a
    # connection killed in between fails its statement (and is then discarded).
    db = Database(postgres_url, ping_after_idle_sec=3600.0)
    try:
        dead = await _backend_pid(db)
        await _terminate(postgres_url, dead)
        with pytest.raises(DBAPIError):
            await _backend_pid(db)
        assert await _backend_pid(db) != dead
    finally:
        await db.dispose()


_POSTED = Sql(
    "INSERT INTO ledger_transactions (id, cause, kind, created_at, details)"
    " VALUES (:cause, :cause, 'top_up', :at, '{}')"
)
_KEPT = Sql("SELECT cause FROM ledger_transactions WHERE cause LIKE 'kept:%'")


async def test_writes_cancelled_as_they_begin_leave_no_connection_that_loses_the_next(
    postgres_url: str,
) -> None:
    # A write cancelled at any point of its start (here: after 0 to 11 turns of the loop,
    # which lands some cancels while asyncpg's BEGIN is on its way) must leave the pool
    # able to run the next write, through the session as through the driver, and commit
    # it. Before, such a connection (the pool's only one here) failed every later session
    # write ("SAVEPOINT can only be used in transaction blocks") or committed nothing.
    db = Database(postgres_url)
    at = datetime.now(UTC)
    try:

        async def cancelled_write(turns: int) -> None:
            async with db.write() as session:
                await (await driver_of(session)).execute(_POSTED, cause=f"cancelled:{turns}", at=at)

        for turns in range(12):
            write = asyncio.create_task(cancelled_write(turns))
            for _ in range(turns):
                await asyncio.sleep(0)
            write.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await write
            async with db.write() as session:
                await (await driver_of(session)).execute(_POSTED, cause=f"kept:{turns}", at=at)
            async with db.driver_write() as tx:
                await tx.execute(_POSTED, cause=f"kept:{100 + turns}", at=at)
        async with db.driver_read() as tx:
            kept = {row["cause"] for row in await tx.fetch(_KEPT)}
        assert kept == {f"kept:{n}" for n in (*range(12), *range(100, 112))}
        async with db.engine.connect() as connection:
            driver = (await connection.get_raw_connection()).driver_connection
            assert hasattr(driver, "_top_xact")  # what the pool's check reads (`db.py`)
    finally:
        await db.dispose()


async def test_the_pool_keeps_its_size_and_closes_what_it_opened_beyond_it(
    postgres_url: str,
) -> None:
    db = Database(postgres_url, pool_size=2, max_overflow=1)
    held = asyncio.Event()
    try:

        async def hold() -> int:
            async with db.read() as session:
                pid: int = (await session.execute(text("SELECT pg_backend_pid()"))).scalar_one()
                await held.wait()
                return pid

        holders = [asyncio.create_task(hold()) for _ in range(3)]
        await asyncio.sleep(0.2)
        waiting = asyncio.create_task(_backend_pid(db))  # a fourth: pool and overflow busy
        await asyncio.sleep(0.2)
        assert not waiting.done()
        held.set()
        pids = await asyncio.gather(*holders)
        assert len(set(pids)) == 3
        assert await waiting in pids
        pool = db.engine.pool
        assert isinstance(pool, QueuePool)
        assert pool.checkedin() == 2  # the overflow connection was closed
        assert len(db.backend_pids) == 2
    finally:
        held.set()
        await db.dispose()


class _Boom(Exception):
    pass


def _posted(cause: str, at: datetime) -> LedgerTransactionRow:
    """`_POSTED`'s row, through the ORM."""
    return LedgerTransactionRow(id=cause, cause=cause, kind="top_up", created_at=at, details={})


async def _kept_causes(db: Database) -> set[str]:
    async with db.driver_read() as tx:
        return {row["cause"] for row in await tx.fetch(_KEPT)}


async def test_a_write_commits_its_driver_and_orm_statements_together_or_neither(
    db_url: str,
) -> None:
    # Driver statements first, then the ORM's, then the driver's again: one transaction,
    # whichever began it; the commit hooks (`metrics.after_commit`) run at its commit and
    # never for a rollback.
    db = Database(db_url)
    at = datetime.now(UTC)
    committed: list[str] = []
    try:
        for fails in (False, True):
            with contextlib.suppress(_Boom):
                async with db.write() as session:
                    tx = await driver_of(session)
                    await tx.execute(_POSTED, cause=f"kept:driver-{fails}", at=at)
                    session.add(_posted(f"kept:orm-{fails}", at))
                    await session.flush()
                    await (await driver_of(session)).execute(
                        _POSTED, cause=f"kept:after-{fails}", at=at
                    )
                    metrics.after_commit(session, functools.partial(committed.append, str(fails)))
                    if fails:
                        raise _Boom
            # Left unflushed at the block's end: committed with it.
            with contextlib.suppress(_Boom):
                async with db.write() as session:
                    await (await driver_of(session)).execute(
                        _POSTED, cause=f"kept:unflushed-driver-{fails}", at=at
                    )
                    session.add(_posted(f"kept:unflushed-{fails}", at))
                    if fails:
                        raise _Boom
        assert await _kept_causes(db) == {
            "kept:driver-False",
            "kept:orm-False",
            "kept:after-False",
            "kept:unflushed-driver-False",
            "kept:unflushed-False",
        }
        assert committed == ["False"]
    finally:
        await db.dispose()


async def test_a_write_of_driver_statements_only_never_begins_the_orm_and_commits(
    postgres_url: str,
) -> None:
    # What the hot paths (claim, result, submit) are: on PostgreSQL such a block commits on
    # the driver, and the session's begin, commit and close are never run (`_DriverFirst`).
    db = Database(postgres_url)
    at = datetime.now(UTC)
    begun: list[Session] = []
    committed: list[str] = []
    rolled_back: list[str] = []

    def on_begin(session: Session, *_: object) -> None:
        begun.append(session)

    event.listen(Session, "after_begin", on_begin)
    try:
        async with db.write() as session:
            await (await driver_of(session)).execute(_POSTED, cause="kept:only-driver", at=at)
            metrics.after_commit(session, lambda: committed.append("yes"))
        with contextlib.suppress(_Boom):
            async with db.write() as session:
                await (await driver_of(session)).execute(_POSTED, cause="kept:lost", at=at)
                metrics.after_commit(session, lambda: rolled_back.append("counted"))
                raise _Boom
        async with db.write():
            pass  # nothing sent: nothing to begin or commit
        assert begun == []
        assert committed == ["yes"]
        assert rolled_back == []
        assert await _kept_causes(db) == {"kept:only-driver"}
        async with db.engine.connect() as connection:
            driver = (await connection.get_raw_connection()).driver_connection
            assert driver is not None
            assert not driver.is_in_transaction()
    finally:
        event.remove(Session, "after_begin", on_begin)
        await db.dispose()


async def test_a_write_whose_last_flush_fails_keeps_none_of_its_statements(db_url: str) -> None:
    db = Database(db_url)
    at = datetime.now(UTC)

    async def write_twice() -> None:
        async with db.write() as session:
            await (await driver_of(session)).execute(_POSTED, cause="kept:not", at=at)
            for n in range(2):  # one cause twice, left for the block's end to flush
                row = LedgerTransactionRow(
                    id=f"twice-{n}", cause="kept:twice", kind="top_up", created_at=at, details={}
                )
                session.add(row)

    try:
        with pytest.raises(IntegrityError):
            await write_twice()
        assert await _kept_causes(db) == set()
        async with db.write() as session:  # the pool's connection is fit for the next
            await (await driver_of(session)).execute(_POSTED, cause="kept:next", at=at)
        assert await _kept_causes(db) == {"kept:next"}
    finally:
        await db.dispose()
