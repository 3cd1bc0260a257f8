"""names: an artifact keeps its uploaded file's name, a node its provider's label

Artifacts uploaded and nodes registered before this revision have none; pages fall back
to the id (and a node to its hostname).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0016'
down_revision: str | None = '0015'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('name', sa.String(length=200), nullable=True))
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('label', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.drop_column('label')
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.drop_column('name')
