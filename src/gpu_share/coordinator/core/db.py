"""Engine, sessions and write transactions: one code path for SQLite and PostgreSQL.

Reads use `db.read()`. Writes use `db.write()`, which commits on success and rolls
back on error. On SQLite a write transaction starts with `BEGIN IMMEDIATE` and is
serialized in-process, so a read-then-write can never fail halfway with "database
is locked"; on PostgreSQL rows that are claimed are locked with `FOR UPDATE`.
"""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.pool import NullPool


class Database:
    def __init__(self, url: str, *, busy_timeout_ms: int = 10_000, echo: bool = False) -> None:
        parsed = make_url(url)
        self.url = url
        self.dialect = parsed.get_backend_name()
        self.is_sqlite = self.dialect == "sqlite"
        kwargs: dict[str, Any] = {"echo": echo}
        if self.is_sqlite:
            ensure_sqlite_directory(url)
            kwargs["connect_args"] = {"timeout": busy_timeout_ms / 1000}
        else:
            kwargs.update(pool_size=10, max_overflow=20, pool_pre_ping=True)
        self.engine: AsyncEngine = create_async_engine(url, **kwargs)
        if self.is_sqlite:
            _configure_sqlite(self.engine, busy_timeout_ms)
        self._write_engine = self.engine.execution_options(sqlite_begin="IMMEDIATE")
        self._sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions = async_sessionmaker(self._write_engine, expire_on_commit=False)
        self._sqlite_write_lock = asyncio.Lock()

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        async with self._sessions() as session:
            yield session

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncSession]:
        if self.is_sqlite:
            async with self._sqlite_write_lock, self._write_sessions() as session, session.begin():
                yield session
        else:
            async with self._write_sessions() as session, session.begin():
                yield session

    async def ping(self) -> bool:
        try:
            async with asyncio.timeout(3), self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception:
            return False
        return True

    async def dispose(self) -> None:
        await self.engine.dispose()


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
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
