"""webhooks: signing secrets, endpoints, deliveries and their attempts; webhook_url on
invokes, sessions and reservations

Objects created before this revision have no webhook_url and are never told of.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04 16:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import gpu_share.coordinator.core.orm


revision: str = '0018'
down_revision: str | None = '0017'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC_TIME = gpu_share.coordinator.core.orm.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table('webhook_secrets',
    sa.Column('owner_id', sa.String(length=40), nullable=False),
    sa.Column('secret', sa.String(length=80), nullable=False),
    sa.Column('previous_secret', sa.String(length=80), nullable=True),
    sa.Column('previous_until', UTC_TIME, nullable=True),
    sa.Column('created_at', UTC_TIME, nullable=False),
    sa.Column('rotated_at', UTC_TIME, nullable=True),
    sa.PrimaryKeyConstraint('owner_id', name=op.f('pk_webhook_secrets'))
    )
    op.create_table('webhook_endpoints',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('owner_id', sa.String(length=40), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('event_types', sa.JSON(), nullable=False),
    sa.Column('created_at', UTC_TIME, nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_endpoints'))
    )
    with op.batch_alter_table('webhook_endpoints', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhook_endpoints_owner_id_created_at'), ['owner_id', 'created_at'], unique=False)

    op.create_table('webhook_deliveries',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('owner_id', sa.String(length=40), nullable=False),
    sa.Column('cause', sa.String(length=120), nullable=False),
    sa.Column('target', sa.String(length=40), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('event_type', sa.String(length=40), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('created_at', UTC_TIME, nullable=False),
    sa.Column('next_attempt_at', UTC_TIME, nullable=False),
    sa.Column('retry_from', UTC_TIME, nullable=False),
    sa.Column('claimed_until', UTC_TIME, nullable=True),
    sa.Column('claim_token', sa.String(length=32), nullable=True),
    sa.Column('delivered_at', UTC_TIME, nullable=True),
    sa.Column('failed_at', UTC_TIME, nullable=True),
    sa.Column('last_status_code', sa.Integer(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_deliveries')),
    sa.UniqueConstraint('cause', 'target', name=op.f('uq_webhook_deliveries_cause_target'))
    )
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhook_deliveries_owner_id_id'), ['owner_id', 'id'], unique=False)
        batch_op.create_index(batch_op.f('ix_webhook_deliveries_status_next_attempt_at'), ['status', 'next_attempt_at'], unique=False)

    op.create_table('webhook_attempts',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('delivery_id', sa.String(length=40), nullable=False),
    sa.Column('at', UTC_TIME, nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('duration_ms', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['delivery_id'], ['webhook_deliveries.id'], name=op.f('fk_webhook_attempts_delivery_id_webhook_deliveries'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_attempts'))
    )
    with op.batch_alter_table('webhook_attempts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhook_attempts_delivery_id_at'), ['delivery_id', 'at'], unique=False)

    for table in ('invokes', 'gpu_sessions', 'reservations'):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column('webhook_url', sa.Text(), nullable=True))


def downgrade() -> None:
    for table in ('reservations', 'gpu_sessions', 'invokes'):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column('webhook_url')
    with op.batch_alter_table('webhook_attempts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhook_attempts_delivery_id_at'))
    op.drop_table('webhook_attempts')
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhook_deliveries_status_next_attempt_at'))
        batch_op.drop_index(batch_op.f('ix_webhook_deliveries_owner_id_id'))
    op.drop_table('webhook_deliveries')
    with op.batch_alter_table('webhook_endpoints', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhook_endpoints_owner_id_created_at'))
    op.drop_table('webhook_endpoints')
    op.drop_table('webhook_secrets')
