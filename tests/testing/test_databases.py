"""`empty_tables`: what every PostgreSQL test starts with. Rows in parent and child
tables go, and serial ids start again at 1."""

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import httpx
from pydantic import SecretStr

from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.orm import Base
from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.databases import asyncpg_dsn, empty_tables
from gpu_share.testing.factories import TEST_ADMIN_KEY, create_provider, create_tenant
from gpu_share.testing.simulated_agent import SimulatedAgent, inventory

TABLES = [table.name for table in Base.metadata.sorted_tables]


async def _fill(url: str, data_dir: Path) -> None:
    """A tenant, a provider and a node that has sent a heartbeat: rows in parent and
    child tables, and in one with a serial id (`telemetry_samples`)."""
    settings = Settings(
        data_dir=data_dir,
        database_url=url,
        admin_key=SecretStr(TEST_ADMIN_KEY),
        run_background_loops=False,
    )
    app = create_app(settings, clock=FrozenClock(datetime.now(UTC)))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            await create_tenant(c)
            provider = await create_provider(c)
        agent = SimulatedAgent("http://testserver", transport=transport, node_inventory=inventory())
        await agent.register(provider.enrollment_token)
        await agent.heartbeat()
        await agent.aclose()


async def _counts(url: str) -> dict[str, int]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        return {t: await conn.fetchval(f'SELECT count(*) FROM "{t}"') for t in TABLES}
    finally:
        await conn.close()


async def _next_sample_id(url: str) -> int:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        sequence = "pg_get_serial_sequence('telemetry_samples', 'id')"
        return int(await conn.fetchval(f"SELECT nextval({sequence})"))
    finally:
        await conn.close()


async def _drop_a_column(url: str) -> None:
    """What a migration's downgrade leaves: a dropped column stays in the catalog."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await conn.execute("ALTER TABLE tenants ADD COLUMN scratch integer")
        await conn.execute("ALTER TABLE tenants DROP COLUMN scratch")
    finally:
        await conn.close()


def test_every_row_goes_and_serial_ids_start_again(postgres_database: str, tmp_path: Path) -> None:
    asyncio.run(_drop_a_column(postgres_database))
    asyncio.run(empty_tables(postgres_database))
    asyncio.run(_fill(postgres_database, tmp_path / "data"))
    filled = asyncio.run(_counts(postgres_database))
    assert all(filled[t] > 0 for t in ("tenants", "providers", "nodes", "telemetry_samples"))

    asyncio.run(empty_tables(postgres_database))
    assert set(asyncio.run(_counts(postgres_database)).values()) == {0}
    assert asyncio.run(_next_sample_id(postgres_database)) == 1
    asyncio.run(empty_tables(postgres_database))  # and nothing left to trip on
