"""Alembic environment: always run by `gpu_share.coordinator.migrate` with a connection."""

from alembic import context

from gpu_share.coordinator.core.orm import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=True,  # ALTERs that SQLite can run too (PostgreSQL alters in place)
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
