from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection

from gpu_share.coordinator import migrate
from gpu_share.coordinator.core.orm import Base


def test_migrations_have_a_single_head() -> None:
    assert len(migrate.heads()) == 1


async def test_upgraded_schema_equals_the_models(db_url: str) -> None:
    def diff(conn: Connection) -> list[Any]:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, Base.metadata))

    assert await migrate.run_sync(db_url, diff) == []


async def test_upgrade_twice_is_a_no_op(db_url: str) -> None:
    await migrate.upgrade(db_url)
    await migrate.upgrade(db_url)
