"""The store's tables, as SQLAlchemy 2 typed ORM classes.

One row per Workload lifecycle transition, keyed by (Workload UID, transition, time of the
transition as the Workload's own status records it): the same transition observed twice (a
relist, a restart, a new leader) maps to the same key and is written once.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = ["Base", "EventResource", "WorkloadEvent"]


class Base(DeclarativeBase):
    pass


class WorkloadEvent(Base):
    """One transition of one Workload: created, quota_reserved, admitted, evicted, preempted,
    finished or deleted (see :mod:`phalanx.store.events`)."""

    __tablename__ = "workload_events"
    __table_args__ = (
        UniqueConstraint("uid", "transition", "at", name="uq_workload_events_key"),
        Index("ix_workload_events_uid", "uid"),
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
