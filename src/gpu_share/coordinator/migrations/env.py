"""Alembic environment: always run by `gpu_share.coordinator.migrate` with a connection."""

from alembic import context

from gpu_share.coordinator.orm import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
