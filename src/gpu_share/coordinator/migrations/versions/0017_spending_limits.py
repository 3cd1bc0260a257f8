"""spending limits: a tenant's monthly cap on new work and its low-balance threshold

One row per tenant that set either; none before this revision, so no tenant has limits.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 16:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import gpu_share.coordinator.core.orm


revision: str = '0017'
down_revision: str | None = '0016'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('spending_limits',
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('monthly_cap_micro', sa.BigInteger(), nullable=True),
    sa.Column('low_balance_micro', sa.BigInteger(), nullable=True),
    sa.Column('updated_at', gpu_share.coordinator.core.orm.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_spending_limits_tenant_id_tenants')),
    sa.PrimaryKeyConstraint('tenant_id', name=op.f('pk_spending_limits'))
    )


def downgrade() -> None:
    op.drop_table('spending_limits')
