"""usdc deposits: tenants' self-serve USDC top-ups on Solana

`deposits` is a tenant's request to top up: the reference key (a fresh public key,
Solana Pay style) its transfer names and until when it is watched. `deposit_arrivals`
records each finalized transfer credited, keyed by its signature, with the amount the
platform's USDC account actually received.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04 16:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import gpu_share.coordinator.core.orm


revision: str = '0021'
down_revision: str | None = '0020'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('deposits',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('reference', sa.String(length=64), nullable=False),
    sa.Column('amount_hint_micro', sa.BigInteger(), nullable=True),
    sa.Column('created_at', gpu_share.coordinator.core.orm.UTCDateTime(timezone=True), nullable=False),
    sa.Column('expires_at', gpu_share.coordinator.core.orm.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_deposits_tenant_id_tenants')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_deposits')),
    sa.UniqueConstraint('reference', name=op.f('uq_deposits_reference'))
    )
    with op.batch_alter_table('deposits', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_deposits_expires_at'), ['expires_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_deposits_tenant_id_created_at'), ['tenant_id', 'created_at'], unique=False)

    op.create_table('deposit_arrivals',
    sa.Column('signature', sa.String(length=100), nullable=False),
    sa.Column('deposit_id', sa.String(length=40), nullable=False),
    sa.Column('amount_micro', sa.BigInteger(), nullable=False),
    sa.Column('arrived_at', gpu_share.coordinator.core.orm.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['deposit_id'], ['deposits.id'], name=op.f('fk_deposit_arrivals_deposit_id_deposits')),
    sa.PrimaryKeyConstraint('signature', name=op.f('pk_deposit_arrivals'))
    )
    with op.batch_alter_table('deposit_arrivals', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_deposit_arrivals_deposit_id'), ['deposit_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('deposit_arrivals', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_deposit_arrivals_deposit_id'))

    op.drop_table('deposit_arrivals')
    with op.batch_alter_table('deposits', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_deposits_tenant_id_created_at'))
        batch_op.drop_index(batch_op.f('ix_deposits_expires_at'))

    op.drop_table('deposits')
