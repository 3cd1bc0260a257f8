from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, inspect

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


async def test_names_migration_goes_down_and_up_again(db_url: str) -> None:
    """0016 adds artifacts.name and nodes.label; going back drops them, and forward again
    restores the schema the models describe."""

    def columns(conn: Connection) -> dict[str, set[str]]:
        found = inspect(conn)
        return {
            table: {c["name"] for c in found.get_columns(table)} for table in ("artifacts", "nodes")
        }

    def downgrade(conn: Connection) -> None:
        command.downgrade(migrate.alembic_config(conn), "0015")
        conn.commit()

    try:
        await migrate.run_sync(db_url, downgrade)
        down = await migrate.run_sync(db_url, columns)
        assert "name" not in down["artifacts"] and "label" not in down["nodes"]
    finally:
        await migrate.upgrade(db_url)
    up = await migrate.run_sync(db_url, columns)
    assert "name" in up["artifacts"] and "label" in up["nodes"]
