"""artifact signature: a model's inputs and outputs, read from it at upload

Models uploaded before this revision have none (they were not checked at upload).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0015'
down_revision: str | None = '0014'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('signature', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.drop_column('signature')
