"""The store's tables, as SQLAlchemy 2 typed ORM classes.

One row per Workload lifecycle transition, keyed by (Workload UID, transition, time of the
transition as the Workload's own status records it): the same transition observed twice (a
relist, a restart, a new leader) maps to the same key and is written once.

Beside them, each quota reservation as an interval (``workload_reservations``, with what it
held and when it was preempted), derived from the events in the same transaction that writes
them (:mod:`phalanx.store.intervals`); the usage report reads these.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = [
    "Base",
    "EventResource",
    "QuotaAmount",
    "QuotaVersion",
    "Reservation",
    "ReservationPreemption",
    "ReservationResource",
    "WorkloadEvent",
]


class Base(DeclarativeBase):
    pass


class WorkloadEvent(Base):
    """One transition of one Workload: created, quota_reserved, admitted, evicted, preempted,
    finished or deleted (see :mod:`phalanx.store.events`)."""

    __tablename__ = "workload_events"
    __table_args__ = (
        # Also the index of every read by uid (revision 0005 dropped a second one on uid).
        UniqueConstraint("uid", "transition", "at", name="uq_workload_events_key"),
        Index("ix_workload_events_at", "at", "transition"),
    )

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True
    )
    uid: Mapped[str] = mapped_column(String(64))
    transition: Mapped[str] = mapped_column(String(32))
    at: Mapped[dt.datetime] = mapped_column(DateTime())
    """UTC, without tzinfo (SQLite keeps none): the transition's time from the Workload."""
    namespace: Mapped[str] = mapped_column(String(253))
    name: Mapped[str] = mapped_column(String(253))
    local_queue: Mapped[str | None] = mapped_column(String(253))
    cluster_queue: Mapped[str | None] = mapped_column(String(253))
    priority: Mapped[int | None] = mapped_column(BigInteger())
    reason: Mapped[str | None] = mapped_column(String(253))
    message: Mapped[str | None] = mapped_column(Text())
    """For an eviction or preemption, Kueue's message: it names the preemptor and why."""
    flavors: Mapped[dict[str, Any] | None] = mapped_column(JSON())
    """Pod set -> resource -> flavor, from the Workload's admission."""
    topology: Mapped[list[Any] | None] = mapped_column(JSON())
    """Each pod set's topology assignment (levels and domains) from the admission."""
    resources: Mapped[list[EventResource]] = relationship(
        back_populates="event", cascade="all, delete-orphan", lazy="selectin"
    )


class EventResource(Base):
    """What a reservation holds: one pod set's total of one resource in one flavor, in the
    resource's base unit (milli-CPU, bytes, devices)."""

    __tablename__ = "workload_event_resources"

    event_id: Mapped[int] = mapped_column(
        ForeignKey("workload_events.id", ondelete="CASCADE"), primary_key=True
    )
    pod_set: Mapped[str] = mapped_column(String(63), primary_key=True)
    resource: Mapped[str] = mapped_column(String(253), primary_key=True)
    flavor: Mapped[str] = mapped_column(String(253))
    amount: Mapped[int] = mapped_column(BigInteger())
    event: Mapped[WorkloadEvent] = relationship(back_populates="resources")


_ID = BigInteger().with_variant(Integer(), "sqlite")
WINDOW_INDEX = (
    "closed_us",
    "start_us",
    "end_us",
    "stray_until_us",
    "namespace",
    "local_queue",
    "cluster_queue",
)
"""``ix_workload_reservations_window``: the reservations overlapping a window, covered."""
START_INDEX = ("start_us", "uid", "wait_us", "namespace", "local_queue", "cluster_queue")
"""``ix_workload_reservations_start``: the reservations starting in a window, covered."""


class Reservation(Base):
    """One quota reservation of one Workload as an interval (see
    :mod:`phalanx.store.intervals` for the pairing). Times are integer microseconds since the
    Unix epoch (UTC); ``id`` is the id of the ``quota_reserved`` event that opened it."""

    __tablename__ = "workload_reservations"
    __table_args__ = (
        Index("ix_workload_reservations_uid", "uid"),
        # Both cover what the report reads (SQLite then reads no table row for them).
        Index("ix_workload_reservations_window", *WINDOW_INDEX),
        Index("ix_workload_reservations_start", *START_INDEX),
    )

    id: Mapped[int] = mapped_column(
        _ID, ForeignKey("workload_events.id", ondelete="CASCADE"), primary_key=True
    )
    uid: Mapped[str] = mapped_column(String(64))
    namespace: Mapped[str] = mapped_column(String(253))
    local_queue: Mapped[str | None] = mapped_column(String(253))
    cluster_queue: Mapped[str | None] = mapped_column(String(253))
    start_us: Mapped[int] = mapped_column(BigInteger())
    """The ``quota_reserved`` time."""
    end_us: Mapped[int | None] = mapped_column(BigInteger())
    """When it stopped holding quota (released, finished, deleted, or evicted before a later
    reservation); NULL while open."""
    closed_us: Mapped[int] = mapped_column(BigInteger())
    """When the event that ended it happened (``end_us`` unless a later reservation ended it:
    then that reservation's time); while open, 2**63 - 1 (never): the report's window is the
    one range ``closed_us > since`` of ``ix_workload_reservations_window``."""
    wait_us: Mapped[int] = mapped_column(BigInteger())
    """From the Workload's creation (first reservation) or the previous reservation's end."""
    preempted: Mapped[bool] = mapped_column(Boolean())
    stray_until_us: Mapped[int | None] = mapped_column(BigInteger())
    """Set on a reservation still open after its Workload finished or was deleted: its last
    event; windows starting after it leave the reservation out."""


class ReservationResource(Base):
    """What a reservation holds of one resource in one flavor, summed over pod sets."""

    __tablename__ = "workload_reservation_resources"
    __table_args__ = {"sqlite_with_rowid": False}

    reservation_id: Mapped[int] = mapped_column(
        _ID, ForeignKey("workload_reservations.id", ondelete="CASCADE"), primary_key=True
    )
    flavor: Mapped[str] = mapped_column(String(253), primary_key=True)
    resource: Mapped[str] = mapped_column(String(253), primary_key=True)
    amount: Mapped[int] = mapped_column(BigInteger())


class ReservationPreemption(Base):
    """A ``preempted`` event, attributed to the reservation open at it."""

    __tablename__ = "workload_reservation_preemptions"
    __table_args__ = (
        Index("ix_workload_reservation_preemptions_at", "at_us"),
        {"sqlite_with_rowid": False},
    )

    reservation_id: Mapped[int] = mapped_column(
        _ID, ForeignKey("workload_reservations.id", ondelete="CASCADE"), primary_key=True
    )
    at_us: Mapped[int] = mapped_column(BigInteger(), primary_key=True)


class QuotaVersion(Base):
    """One version of a ClusterQueue's quotas: a spec generation as the writer first saw it,
    or its deletion (``deleted``, no amounts). It holds from ``at_us`` to the next version of
    the same ClusterQueue name (see :mod:`phalanx.store.quotas`)."""

    __tablename__ = "cluster_queue_quota_versions"
    __table_args__ = (
        UniqueConstraint("uid", "generation", "deleted", name="uq_cluster_queue_quota_version"),
        Index("ix_cluster_queue_quota_versions_name", "cluster_queue", "at_us"),
    )

    id: Mapped[int] = mapped_column(_ID, primary_key=True)
    uid: Mapped[str] = mapped_column(String(64))
    generation: Mapped[int] = mapped_column(BigInteger())
    deleted: Mapped[bool] = mapped_column(Boolean())
    cluster_queue: Mapped[str] = mapped_column(String(253))
    cohort: Mapped[str | None] = mapped_column(String(253))
    at_us: Mapped[int] = mapped_column(BigInteger())
    """Microseconds since the Unix epoch (UTC): the ClusterQueue's creation for its first
    generation, else when the writer first saw the generation (or the deletion)."""


class QuotaAmount(Base):
    """One flavor and resource of a quota version, in the resource's base unit."""

    __tablename__ = "cluster_queue_quota_amounts"

    version_id: Mapped[int] = mapped_column(
        _ID, ForeignKey("cluster_queue_quota_versions.id", ondelete="CASCADE"), primary_key=True
    )
    flavor: Mapped[str] = mapped_column(String(253), primary_key=True)
    resource: Mapped[str] = mapped_column(String(253), primary_key=True)
    nominal: Mapped[int] = mapped_column(BigInteger())
    borrowing_limit: Mapped[int | None] = mapped_column(BigInteger())
    lending_limit: Mapped[int | None] = mapped_column(BigInteger())
