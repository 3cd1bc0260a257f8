"""Apply Alembic migrations at start, under a lock so that replicas take turns."""

import functools
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text

from gpu_share.coordinator.core.db import null_pool_engine

_PG_LOCK_KEY = 0x6770755F73686172  # "gpu_shar"


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", "gpu_share.coordinator:migrations")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@functools.cache
def heads() -> tuple[str, ...]:
    """The revisions a database at "head" is at; read from the package's scripts once."""
    return tuple(ScriptDirectory.from_config(alembic_config()).get_heads())


def _at_heads(connection: Connection) -> bool:
    """Whether the database is at `heads()` already: one read of `alembic_version`,
    where `command.upgrade` would load every script first (each start, each test).
    Without the lock: a revision is written in the transaction that applies it, so
    a database that says "head" has nothing left to apply."""
    current = MigrationContext.configure(connection).get_current_heads()
    connection.rollback()
    return set(current) == set(heads())


def _upgrade(connection: Connection, revision: str) -> None:
    if revision == "head" and _at_heads(connection):
        return
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
        connection.commit()
    try:
        command.upgrade(alembic_config(connection), revision)
        connection.commit()
    finally:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
            connection.commit()


async def upgrade(url: str, revision: str = "head") -> None:
    engine = null_pool_engine(url)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_upgrade, revision)
    finally:
        await engine.dispose()


async def run_sync(url: str, fn: Any) -> Any:
    engine = null_pool_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(fn)
    finally:
        await engine.dispose()
