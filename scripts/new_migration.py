"""Autogenerate a migration from the models' metadata: `python scripts/new_migration.py "msg"`.

Runs against a scratch PostgreSQL database brought to the current head, so the
generated operations are portable (SQLite runs them in batch mode).
"""

import asyncio
import sys

from alembic import command
from sqlalchemy import Connection

from gpu_share.coordinator.migrate import alembic_config, run_sync, upgrade
from gpu_share.testing.databases import scratch_postgres_url


async def main(message: str) -> None:
    async with scratch_postgres_url() as url:
        await upgrade(url)

        def _revision(conn: Connection) -> None:
            command.revision(alembic_config(conn), message=message, autogenerate=True)

        await run_sync(url, _revision)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
