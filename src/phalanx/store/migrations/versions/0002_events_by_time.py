"""An index on (at, transition): reports select a time window first.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_workload_events_at", "workload_events", ["at", "transition"])


def downgrade() -> None:
    op.drop_index("ix_workload_events_at", table_name="workload_events")
