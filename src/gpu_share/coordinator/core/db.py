"""Engine, sessions and write transactions: one code path for SQLite and PostgreSQL.

Reads use `db.read()`. Writes use `db.write()`, which commits on success and rolls
back on error. On SQLite a write transaction starts with `BEGIN IMMEDIATE` and is
serialized in-process, so a read-then-write can never fail halfway with "database
is locked"; on PostgreSQL rows that are claimed are locked with `FOR UPDATE`.
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, exc, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.pool import NullPool

from gpu_share.coordinator.core.driver_sql import (
    DriverTx,
    PostgresTx,
    SqliteTx,
    driver_errors,
    postgres_transaction,
    sqlite_transaction,
)
from gpu_share.coordinator.core.settings import Settings

POOL_SIZE: int = Settings.model_fields["db_pool_size"].default
MAX_OVERFLOW: int = Settings.model_fields["db_max_overflow"].default
"""PostgreSQL's pool when a `Database` is made without one: the settings' defaults."""

PING_AFTER_IDLE_SEC = 5.0
"""A pooled PostgreSQL connection unused this long is tried before it is handed out."""


class Database:
    def __init__(
        self,
        url: str,
        *,
        busy_timeout_ms: int = 10_000,
        echo: bool = False,
        ping_after_idle_sec: float = PING_AFTER_IDLE_SEC,
        pool_size: int = POOL_SIZE,
        max_overflow: int = MAX_OVERFLOW,
    ) -> None:
        """`pool_size` and `max_overflow`: PostgreSQL's pool (`Settings.db_pool_size`):
        the connections kept open, and those opened beyond them under load, each closed
        when given back to a full pool."""
        parsed = make_url(url)
        self.url = url
        self.dialect = parsed.get_backend_name()
        self.is_sqlite = self.dialect == "sqlite"
        kwargs: dict[str, Any] = {"echo": echo}
        if self.is_sqlite:
            ensure_sqlite_directory(url)
            kwargs["connect_args"] = {"timeout": busy_timeout_ms / 1000}
        else:
            kwargs.update(pool_size=pool_size, max_overflow=max_overflow)
        self.engine: AsyncEngine = create_async_engine(url, **kwargs)
        if self.is_sqlite:
            _configure_sqlite(self.engine, busy_timeout_ms)
        else:
            _ping_after_idle(self.engine, ping_after_idle_sec)
        self._write_engine = self.engine.execution_options(sqlite_begin="IMMEDIATE")
        self._sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions = async_sessionmaker(self._write_engine, expire_on_commit=False)
        self._sqlite_write_lock = asyncio.Lock()
        self.backend_pids: set[int] = set()
        """PostgreSQL: the server pids of this pool's open connections. A NOTIFY sent in
        one of its transactions comes back from one of them (`notify`)."""
        if not self.is_sqlite:
            _track_backends(self.engine, self.backend_pids)
            _discard_left_in_transaction(self.engine)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        async with self._sessions() as session:
            yield session

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncSession]:
        """A write transaction: committed when the block ends, rolled back if it raises.

        On PostgreSQL the session's ORM machinery is begun only if the block uses it: a
        block of driver statements only (`driver_of`), which is what the hot paths are,
        commits on the driver (`_DriverFirst`), sparing it the session's begin, commit
        and close, ~0.14 ms of CPU a transaction (bench/README.md, `dispatch.py`)."""
        if self.is_sqlite:
            async with self._sqlite_write_lock, self._write_sessions() as session, session.begin():
                yield session
            return
        async with self.engine.connect() as connection:
            pooled = await connection.get_raw_connection()
            session = AsyncSession(bind=connection, expire_on_commit=False)
            first = _DriverFirst(session, pooled.dbapi_connection)
            try:
                yield session
                await first.end(commit=True)
            except BaseException:  # the block's error, or the commit's (a flush, the COMMIT)
                await asyncio.shield(first.end(commit=False))
                raise

    @asynccontextmanager
    async def driver_write(self, *, one_statement: bool = False) -> AsyncIterator[DriverTx]:
        """A write transaction on the driver's own connection, for the hot statements
        (`driver_sql`): the same pool, the same `BEGIN IMMEDIATE` and in-process turn on
        SQLite, no SQLAlchemy per statement.

        `one_statement`: the caller sends a single statement, atomic by itself; on
        PostgreSQL it then runs without BEGIN and COMMIT (two round trips fewer), and a
        second statement is refused. SQLite runs it in its write transaction as ever."""
        if self.is_sqlite:
            async with (
                self._sqlite_write_lock,
                self.engine.connect() as connection,
                sqlite_transaction(await _driver_connection(connection)) as tx,
            ):
                yield tx
        elif one_statement:
            async with self.engine.connect() as connection:
                yield PostgresTx(await _driver_connection(connection), most_statements=1)
        else:
            async with (
                self.engine.connect() as connection,
                postgres_transaction(await _driver_connection(connection)) as tx,
            ):
                yield tx

    @asynccontextmanager
    async def driver_read(self) -> AsyncIterator[DriverTx]:
        """The driver's connection with no transaction: each statement reads on its own
        (for a read that needs no consistency across statements). Takes no write turn on
        SQLite."""
        async with self.engine.connect() as connection:
            driver = await _driver_connection(connection)
            yield SqliteTx(driver) if self.is_sqlite else PostgresTx(driver)

    async def ping(self) -> bool:
        try:
            async with asyncio.timeout(3), self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception:
            return False
        return True

    async def dispose(self) -> None:
        await self.engine.dispose()


async def driver_of(session: AsyncSession) -> DriverTx:
    """The driver under a write session (`Database.write`), inside its transaction: hot
    statements (`driver_sql`) and the ORM's in one transaction, committed or rolled back
    together by the session. For a transaction whose common path is a few hot statements
    and whose rare path (money, webhooks) is the ORM's.

    SQLite begins the session's transaction (`BEGIN IMMEDIATE`) when it takes its
    connection. SQLAlchemy's asyncpg adapter begins one only before its own first
    statement: it is begun here, as the adapter would, so the session's commit is the
    driver statements' too. What the session holds unflushed is flushed first, as the
    ORM's autoflush does before its own statements: a driver statement sees it.

    Found once per transaction (kept in `session.info`): a claim asks for it for each of
    its statements, and finding it costs more than most of them send."""
    if session.new or session.dirty or session.deleted:
        await session.flush()
    known = session.info.get(_DRIVER_TX)
    if known is not None and known[0] is session.sync_session.get_transaction():
        tx: DriverTx = known[1]
        if known[2] is not None and known[2]._transaction is None:
            await known[2]._start_transaction()  # `_DriverFirst`: begun at its first use
        return tx
    connection = await session.connection()  # begins the session's transaction
    pooled = await connection.get_raw_connection()
    if session.get_bind().dialect.name == "sqlite":
        tx = SqliteTx(pooled.driver_connection)
    else:
        adapter: Any = pooled.dbapi_connection
        if adapter._transaction is None:
            await adapter._start_transaction()
        tx = PostgresTx(pooled.driver_connection)
    session.info[_DRIVER_TX] = (session.sync_session.get_transaction(), tx, None)
    return tx


_DRIVER_TX = "driver_tx"
"""`session.info`'s key for the driver of its transaction (`driver_of`), with that
transaction (None: the session has begun none, `_DriverFirst`) and, where nothing has
begun it yet, the adapter that begins it: a commit or rollback begins another, which
finds its own."""


class _DriverFirst:
    """A PostgreSQL write session whose ORM is begun only if its block uses it.

    The session is bound to one pooled connection. Its driver (`driver_of`) is known from
    the start, and the first driver statement begins the transaction through SQLAlchemy's
    asyncpg adapter, as the adapter's own first statement would: if the ORM is used
    later, its transaction joins that one, and its commit is the driver statements' too.
    A block that never used the ORM commits on the adapter's transaction directly, and
    the session's `after_commit` listeners (`metrics.after_commit`) hear it all the same.
    """

    __slots__ = ("adapter", "session")

    def __init__(self, session: AsyncSession, adapter: Any) -> None:
        self.session = session
        self.adapter = adapter
        session.info[_DRIVER_TX] = (None, PostgresTx(adapter.driver_connection), adapter)

    async def end(self, *, commit: bool) -> None:
        """Commit, or roll back. A rollback never raises (the block's error is the one to
        raise); a connection that could not roll back is discarded at its next checkout
        (`_discard_left_in_transaction`)."""
        session = self.session
        if commit and (session.new or session.dirty or session.deleted):
            await session.flush()  # begins the ORM's transaction, on the adapter's
        if session.sync_session.get_transaction() is not None:
            try:
                if commit:
                    await session.commit()
                else:
                    with contextlib.suppress(Exception):
                        await session.rollback()
            finally:
                await asyncio.shield(session.close())
            return
        transaction, self.adapter._transaction = self.adapter._transaction, None
        sync = session.sync_session
        if commit:
            if transaction is not None:  # None: nothing was sent, nothing was begun
                with driver_errors():
                    await transaction.commit()
            sync.dispatch.after_commit(sync)
        else:
            if transaction is not None:
                with contextlib.suppress(Exception):
                    await transaction.rollback()
            sync.dispatch.after_rollback(sync)


async def _driver_connection(connection: AsyncConnection) -> Any:
    """The asyncpg or aiosqlite connection under a pooled SQLAlchemy one. SQLAlchemy has
    begun nothing on it, so giving it back to the pool costs no rollback."""
    pooled = await connection.get_raw_connection()
    return pooled.driver_connection


def _configure_sqlite(engine: AsyncEngine, busy_timeout_ms: int) -> None:
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event, not the driver, decide how transactions start.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


def _track_backends(engine: AsyncEngine, pids: set[int]) -> None:
    """Keep `pids` to the server pids of the pool's open connections (`backend_pids`)."""
    pool = engine.sync_engine.pool

    @event.listens_for(pool, "connect")
    def _on_connect(dbapi_connection: Any, record: Any) -> None:
        record.info["backend_pid"] = dbapi_connection.driver_connection.get_server_pid()
        pids.add(record.info["backend_pid"])

    def forget(record: Any) -> None:
        pids.discard(record.info.pop("backend_pid", None))

    event.listen(pool, "close", lambda _connection, record: forget(record))
    event.listen(pool, "detach", lambda _connection, record: forget(record))
    event.listen(pool, "invalidate", lambda _connection, record, _error: forget(record))


def _discard_left_in_transaction(engine: AsyncEngine) -> None:
    """Never hand out a PostgreSQL connection a cancelled task left inside a transaction.

    A task cancelled while its BEGIN is on its way (a request or a loop stopped at
    shutdown) leaves asyncpg's `Transaction` marked as the connection's open one, whether
    or not the server began it. SQLAlchemy's adapter then could not roll it back, and
    the pool took the connection back as it was: every later transaction on it (each
    begun through asyncpg's `Transaction`, as the adapter begins them) became a SAVEPOINT,
    failing outside a transaction block or committing nothing inside the one left open.
    Such a connection is discarded at its next checkout, as a dead one is (the server
    rolls back what it held open), and the pool hands out another.

    asyncpg says whether the server is in a transaction (`is_in_transaction`), but not
    whether a `Transaction` of its own is marked open: that is its `_top_xact`
    (`tests/coordinator/core/test_db.py` pins what this reads)."""
    pool = engine.sync_engine.pool

    @event.listens_for(pool, "checkout")
    def _on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        driver = dbapi_connection.driver_connection
        if driver.is_in_transaction() or getattr(driver, "_top_xact", None) is not None:
            raise exc.DisconnectionError("pooled connection was left inside a transaction")


def _ping_after_idle(engine: AsyncEngine, idle_sec: float) -> None:
    """Hand out only live connections without a round trip per request.

    `pool_pre_ping` would try every connection at every checkout: on PostgreSQL three
    round trips (asyncpg's ping is BEGIN, `;`, ROLLBACK) before each request's first
    statement. A connection that was in use moments ago is alive as far as a ping can
    tell; one that sat idle (across a database restart, a proxy's idle timeout) is tried
    first, and a dead one is replaced, as `pool_pre_ping` would. A connection that dies
    while busy fails its statement, and SQLAlchemy invalidates it then.
    """
    pool = engine.sync_engine.pool

    @event.listens_for(pool, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(pool, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < idle_sec:
            return  # new (just connected) or busy moments ago
        try:
            dbapi_connection.ping()
        except Exception as error:
            # The pool discards this connection and checks out another (up to 3 tries).
            raise exc.DisconnectionError(f"pooled connection is dead: {error}") from error


def ensure_sqlite_directory(url: str) -> None:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)


def null_pool_engine(url: str) -> AsyncEngine:
    """A pool-less engine for one-off administrative work (migrations, test setup)."""
    ensure_sqlite_directory(url)
    return create_async_engine(url, poolclass=NullPool)


def upsert(session: AsyncSession) -> Any:
    """The dialect's INSERT, which has `on_conflict_do_update` on SQLite and PostgreSQL alike."""
    return upsert_for(session.get_bind().dialect.name)


def upsert_for(dialect: str) -> Any:
    """`upsert` by the dialect's name, for statements built once per dialect."""
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


async def one_at_a_time(session: AsyncSession, key: str) -> None:
    """Transactions that call this with the same `key` run one after another from here to
    their end: a transaction-scoped advisory lock on PostgreSQL; SQLite's write
    transactions already run one at a time."""
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": key})
