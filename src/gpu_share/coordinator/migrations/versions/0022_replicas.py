"""replicas: coordinator processes, and which one holds each node's session channel

`replicas` lists the running coordinator processes (beaten while they run) and the
address their peers relay session traffic to; `node_channels` says which of them holds
a node's WebSocket, so a forward that reaches another replica is relayed to it.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04 23:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import gpu_share.coordinator.core.orm


revision: str = '0022'
down_revision: str | None = '0021'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('replicas',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('relay_url', sa.String(length=200), nullable=True),
    sa.Column('started_at', gpu_share.coordinator.core.orm.UTCDateTime(timezone=True), nullable=False),
    sa.Column('seen_at', gpu_share.coordinator.core.orm.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_replicas'))
    )
    op.create_table('node_channels',
    sa.Column('node_id', sa.String(length=40), nullable=False),
    sa.Column('replica_id', sa.String(length=40), nullable=False),
    sa.Column('connected_at', gpu_share.coordinator.core.orm.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], name=op.f('fk_node_channels_node_id_nodes')),
    sa.PrimaryKeyConstraint('node_id', name=op.f('pk_node_channels'))
    )
    with op.batch_alter_table('node_channels', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_node_channels_replica_id'), ['replica_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('node_channels', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_node_channels_replica_id'))
    op.drop_table('node_channels')
    op.drop_table('replicas')
