"""Each ClusterQueue's quotas over time: one version per spec generation (and one at its
deletion), so that a report can say what share of its quota a ClusterQueue used and how much
it borrowed.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "cluster_queue_quota_versions",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("uid", sa.String(64), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("deleted", sa.Boolean(), nullable=False),
        sa.Column("cluster_queue", sa.String(253), nullable=False),
        sa.Column("cohort", sa.String(253), nullable=True),
        sa.Column("at_us", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("uid", "generation", "deleted", name="uq_cluster_queue_quota_version"),
    )
    op.create_index(
        "ix_cluster_queue_quota_versions_name",
        "cluster_queue_quota_versions",
        ["cluster_queue", "at_us"],
    )
    op.create_table(
        "cluster_queue_quota_amounts",
        sa.Column(
            "version_id",
            _ID,
            sa.ForeignKey("cluster_queue_quota_versions.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("flavor", sa.String(253), primary_key=True),
        sa.Column("resource", sa.String(253), primary_key=True),
        sa.Column("nominal", sa.BigInteger(), nullable=False),
        sa.Column("borrowing_limit", sa.BigInteger(), nullable=True),
        sa.Column("lending_limit", sa.BigInteger(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("cluster_queue_quota_amounts")
    op.drop_index("ix_cluster_queue_quota_versions_name", table_name="cluster_queue_quota_versions")
    op.drop_table("cluster_queue_quota_versions")
