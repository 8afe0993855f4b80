"""Each quota reservation as an interval (start, end, wait, preemptions, what it held), filled
from the stored events; the usage report reads these instead of pairing the whole history.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from phalanx.store import intervals

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_BACKFILL_CHUNK = 5_000
_GROUP_KEYS = ["namespace", "local_queue", "cluster_queue"]


def upgrade() -> None:
    reservations = op.create_table(
        "workload_reservations",
        sa.Column(
            "id",
            _ID,
            sa.ForeignKey("workload_events.id", ondelete="CASCADE"),
            primary_key=True,
            autoincrement=False,
        ),
        sa.Column("uid", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("local_queue", sa.String(253), nullable=True),
        sa.Column("cluster_queue", sa.String(253), nullable=True),
        sa.Column("start_us", sa.BigInteger(), nullable=False),
        sa.Column("end_us", sa.BigInteger(), nullable=True),
        sa.Column("closed_us", sa.BigInteger(), nullable=False),
        sa.Column("wait_us", sa.BigInteger(), nullable=False),
        sa.Column("preempted", sa.Boolean(), nullable=False),
        sa.Column("stray_until_us", sa.BigInteger(), nullable=True),
    )
    op.create_index("ix_workload_reservations_uid", "workload_reservations", ["uid"])
    # Both cover what the report reads (SQLite then reads no table row for them).
    op.create_index(
        "ix_workload_reservations_window",
        "workload_reservations",
        ["closed_us", "start_us", "end_us", "stray_until_us", *_GROUP_KEYS],
    )
    op.create_index(
        "ix_workload_reservations_start",
        "workload_reservations",
        ["start_us", "uid", "wait_us", *_GROUP_KEYS],
    )
    resources = op.create_table(
        "workload_reservation_resources",
        sa.Column(
            "reservation_id",
            _ID,
            sa.ForeignKey("workload_reservations.id", ondelete="CASCADE"),
            primary_key=True,
            autoincrement=False,
        ),
        sa.Column("flavor", sa.String(253), primary_key=True),
        sa.Column("resource", sa.String(253), primary_key=True),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sqlite_with_rowid=False,
    )
    preemptions = op.create_table(
        "workload_reservation_preemptions",
        sa.Column(
            "reservation_id",
            _ID,
            sa.ForeignKey("workload_reservations.id", ondelete="CASCADE"),
            primary_key=True,
            autoincrement=False,
        ),
        sa.Column("at_us", sa.BigInteger(), primary_key=True, autoincrement=False),
        sqlite_with_rowid=False,
    )
    op.create_index(
        "ix_workload_reservation_preemptions_at", "workload_reservation_preemptions", ["at_us"]
    )
    backfill(op.get_bind(), reservations, resources, preemptions)


def backfill(
    connection: sa.Connection, reservations: sa.Table, resources: sa.Table, preemptions: sa.Table
) -> None:
    """Pair every stored Workload's events into intervals, inserting them in chunks."""
    pending: list[intervals.Interval] = []

    def flush() -> None:
        rows, held, preempted = intervals.table_rows(pending)
        if rows:
            connection.execute(reservations.insert(), rows)
        if held:
            connection.execute(resources.insert(), held)
        if preempted:
            connection.execute(preemptions.insert(), preempted)
        pending.clear()

    # The events are read through while the intervals are inserted on the same connection:
    # psycopg buffers a result client-side, and SQLite reads one table while writing others.
    for history in intervals.read_histories(connection):
        pending.extend(intervals.pair(history))
        if len(pending) >= _BACKFILL_CHUNK:
            flush()
    flush()


def downgrade() -> None:
    op.drop_index(
        "ix_workload_reservation_preemptions_at", table_name="workload_reservation_preemptions"
    )
    op.drop_table("workload_reservation_preemptions")
    op.drop_table("workload_reservation_resources")
    op.drop_index("ix_workload_reservations_window", table_name="workload_reservations")
    op.drop_index("ix_workload_reservations_start", table_name="workload_reservations")
    op.drop_index("ix_workload_reservations_uid", table_name="workload_reservations")
    op.drop_table("workload_reservations")
