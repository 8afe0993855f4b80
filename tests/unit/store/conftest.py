"""The store's tests run on SQLite and on a real PostgreSQL (see ``store_postgres``): every
test taking ``store_url`` runs once per backend, each on an empty database of its own."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from store_postgres import PostgresUnavailable, postgres_server

_counter = itertools.count()


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    try:
        with postgres_server() as server:
            yield server.url
    except PostgresUnavailable as error:
        if os.environ.get("CI"):
            raise  # .ci/run installs it: missing there is a failure, not a skip
        pytest.skip(f"no PostgreSQL here: {error}")


@contextlib.contextmanager
def _postgres_database(admin_url: str) -> Iterator[str]:
    """An empty database of its own on the session's server; dropped afterwards."""
    name = f"store_{os.getpid()}_{next(_counter)}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/store.db"
        return
    with _postgres_database(request.getfixturevalue("postgres_admin_url")) as url:
        yield url


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """PostgreSQL only: for what SQLite cannot do at all (concurrent writers)."""
    with _postgres_database(postgres_admin_url) as url:
        yield url
