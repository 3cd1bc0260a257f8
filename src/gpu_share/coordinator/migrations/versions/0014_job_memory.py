"""job memory: what each job on a node may use, as its agent reports it, for the offers

Nodes registered before this revision show none until their agent next reports its
inventory (at its next start).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0014'
down_revision: str | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('job_memory_mb', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.drop_column('job_memory_mb')
