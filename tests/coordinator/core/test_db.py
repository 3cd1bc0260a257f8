"""The engine hands out live connections (`Database`, PostgreSQL's pool)."""

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from gpu_share.coordinator.core.db import Database


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
