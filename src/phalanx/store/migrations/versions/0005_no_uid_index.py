"""Drop ``ix_workload_events_uid``: the unique key (uid, transition, at) already serves every
read by uid, and a second index on uid cost the writer a second scattered insert per event
(Workload UIDs are random: each lands on its own leaf page of a long-lived store).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_workload_events_uid", table_name="workload_events")


def downgrade() -> None:
    op.create_index("ix_workload_events_uid", "workload_events", ["uid"])
