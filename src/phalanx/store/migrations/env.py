"""Alembic's environment for the store: run online against the engine the caller passes
(``config.attributes["engine"]``, see :func:`phalanx.store.db.upgrade`)."""

from __future__ import annotations

from alembic import context

from phalanx.store.models import Base

target_metadata = Base.metadata
engine = context.config.attributes["engine"]

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
