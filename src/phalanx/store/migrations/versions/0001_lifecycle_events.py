"""Workload lifecycle events and the resources each reservation holds.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workload_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("uid", sa.String(64), nullable=False),
        sa.Column("transition", sa.String(32), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("local_queue", sa.String(253), nullable=True),
        sa.Column("cluster_queue", sa.String(253), nullable=True),
        sa.Column("priority", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.String(253), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("flavors", sa.JSON(), nullable=True),
        sa.Column("topology", sa.JSON(), nullable=True),
        sa.UniqueConstraint("uid", "transition", "at", name="uq_workload_events_key"),
    )
    op.create_index("ix_workload_events_uid", "workload_events", ["uid"])
    op.create_table(
        "workload_event_resources",
        sa.Column(
            "event_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            sa.ForeignKey("workload_events.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("pod_set", sa.String(63), primary_key=True),
        sa.Column("resource", sa.String(253), primary_key=True),
        sa.Column("flavor", sa.String(253), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("workload_event_resources")
    op.drop_index("ix_workload_events_uid", table_name="workload_events")
    op.drop_table("workload_events")
