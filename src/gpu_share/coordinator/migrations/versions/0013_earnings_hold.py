"""earnings hold: each charge's provider share held until it can be trusted

Charges posted before this revision stay in the providers' pending (payable) accounts:
nothing moves retroactively (docs/payouts.md, "The hold").

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import gpu_share.coordinator.core.orm


revision: str = '0013'
down_revision: str | None = '0012'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('earnings_holds',
    sa.Column('charge_id', sa.String(length=40), nullable=False),
    sa.Column('provider_id', sa.String(length=40), nullable=False),
    sa.Column('node_id', sa.String(length=40), nullable=False),
    sa.Column('hold', sa.String(length=24), nullable=False),
    sa.Column('earned_at', gpu_share.coordinator.core.orm.UTCDateTime(timezone=True), nullable=False),
    sa.Column('amount_micro', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['charge_id'], ['ledger_transactions.id'], name=op.f('fk_earnings_holds_charge_id_ledger_transactions')),
    sa.PrimaryKeyConstraint('charge_id', name=op.f('pk_earnings_holds'))
    )
    with op.batch_alter_table('earnings_holds', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_earnings_holds_hold_earned_at'), ['hold', 'earned_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_earnings_holds_node_id'), ['node_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_earnings_holds_provider_id_earned_at'), ['provider_id', 'earned_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('earnings_holds', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_earnings_holds_provider_id_earned_at'))
        batch_op.drop_index(batch_op.f('ix_earnings_holds_node_id'))
        batch_op.drop_index(batch_op.f('ix_earnings_holds_hold_earned_at'))

    op.drop_table('earnings_holds')
