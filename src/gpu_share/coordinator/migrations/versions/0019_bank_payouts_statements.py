"""bank payouts: the pain.001 file made for a batch and each payout's bank transfer

`sepa_exports` keeps each batch's SEPA credit-transfer file as it was served, with the
USDC to EUR rate it was made at; `bank_transfers` says, per payout in it, the
end-to-end id the bank reports it under, the cents asked for and the rounding remainder
given back to the provider's pending balance. Statements need no table: they are read
from the ledger.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04 16:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import gpu_share.coordinator.core.orm


revision: str = '0019'
down_revision: str | None = '0018'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('sepa_exports',
    sa.Column('batch_id', sa.String(length=40), nullable=False),
    sa.Column('message_id', sa.String(length=35), nullable=False),
    sa.Column('eur_per_usdc', sa.String(length=24), nullable=False),
    sa.Column('execution_date', sa.String(length=10), nullable=False),
    sa.Column('total_cents', sa.BigInteger(), nullable=False),
    sa.Column('document', sa.Text(), nullable=False),
    sa.Column('created_at', gpu_share.coordinator.core.orm.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['batch_id'], ['payout_batches.id'], name=op.f('fk_sepa_exports_batch_id_payout_batches')),
    sa.PrimaryKeyConstraint('batch_id', name=op.f('pk_sepa_exports')),
    sa.UniqueConstraint('message_id', name=op.f('uq_sepa_exports_message_id'))
    )
    op.create_table('bank_transfers',
    sa.Column('payout_id', sa.String(length=40), nullable=False),
    sa.Column('batch_id', sa.String(length=40), nullable=False),
    sa.Column('end_to_end_id', sa.String(length=35), nullable=False),
    sa.Column('amount_cents', sa.BigInteger(), nullable=False),
    sa.Column('remainder_micro', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['batch_id'], ['sepa_exports.batch_id'], name=op.f('fk_bank_transfers_batch_id_sepa_exports')),
    sa.ForeignKeyConstraint(['payout_id'], ['payouts.id'], name=op.f('fk_bank_transfers_payout_id_payouts')),
    sa.PrimaryKeyConstraint('payout_id', name=op.f('pk_bank_transfers')),
    sa.UniqueConstraint('end_to_end_id', name=op.f('uq_bank_transfers_end_to_end_id'))
    )
    with op.batch_alter_table('bank_transfers', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_bank_transfers_batch_id'), ['batch_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('bank_transfers', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_bank_transfers_batch_id'))

    op.drop_table('bank_transfers')
    op.drop_table('sepa_exports')
