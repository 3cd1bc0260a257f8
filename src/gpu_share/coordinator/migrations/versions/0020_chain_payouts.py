"""chain payouts: USDC payouts the platform signs and sends on Solana

`chain_payouts` follows each USDC payout the coordinator sends itself: whether it waits
for an admin's approval (above the operator's limits), the signed transaction, its
signature and the last block height its blockhash is valid for (recorded before it is
sent, so a resend after a crash reuses it), and which replica holds it for sending.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04 16:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import gpu_share.coordinator.core.orm


revision: str = '0020'
down_revision: str | None = '0019'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('chain_payouts',
    sa.Column('payout_id', sa.String(length=40), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('destination', sa.String(length=64), nullable=False),
    sa.Column('amount_micro', sa.BigInteger(), nullable=False),
    sa.Column('created_at', gpu_share.coordinator.core.orm.UTCDateTime(timezone=True), nullable=False),
    sa.Column('approved_at', gpu_share.coordinator.core.orm.UTCDateTime(timezone=True), nullable=True),
    sa.Column('claimed_until', gpu_share.coordinator.core.orm.UTCDateTime(timezone=True), nullable=True),
    sa.Column('transaction', sa.Text(), nullable=True),
    sa.Column('signature', sa.String(length=100), nullable=True),
    sa.Column('last_valid_block_height', sa.BigInteger(), nullable=True),
    sa.Column('builds', sa.Integer(), nullable=False),
    sa.Column('rejected', sa.Text(), nullable=True),
    sa.Column('settled_at', gpu_share.coordinator.core.orm.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['payout_id'], ['payouts.id'], name=op.f('fk_chain_payouts_payout_id_payouts')),
    sa.PrimaryKeyConstraint('payout_id', name=op.f('pk_chain_payouts')),
    sa.UniqueConstraint('signature', name=op.f('uq_chain_payouts_signature'))
    )
    with op.batch_alter_table('chain_payouts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_chain_payouts_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_chain_payouts_state'), ['state'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('chain_payouts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_chain_payouts_state'))
        batch_op.drop_index(batch_op.f('ix_chain_payouts_created_at'))

    op.drop_table('chain_payouts')
