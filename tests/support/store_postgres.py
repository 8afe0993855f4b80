"""A throwaway PostgreSQL on loopback for the store's tests, from Debian's packages
(``apt-get install postgresql``): initdb into a temporary folder, ``pg_ctl start`` on a free
port with its socket in that folder, one database per test. As root (CI containers) the
server runs as the ``postgres`` user, since initdb refuses root."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LocalPostgres", "PostgresUnavailable", "postgres_server"]


class PostgresUnavailable(Exception):
    pass


def _binary(name: str) -> str:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))[-1:]
    if not found:
        raise PostgresUnavailable(f"{name} not found: apt-get install -y postgresql")
    return found if isinstance(found, str) else found[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalPostgres:
    """One server in a temporary folder; :meth:`stop` and :meth:`start` again keep its data
    and port (a database outage, as the tests need one)."""

    def __init__(self) -> None:
        self.initdb, self.pg_ctl = _binary("initdb"), _binary("pg_ctl")
        self.folder = Path(tempfile.mkdtemp(prefix="phalanx-pg-"))
        self.data = self.folder / "data"
        self.log = self.folder / "postgres.log"
        self.prefix: list[str] = []
        self.user = pwd.getpwuid(os.getuid()).pw_name
        if os.getuid() == 0:
            self.user = "postgres"
            entry = pwd.getpwnam(self.user)
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)
            self.prefix = ["runuser", "-u", self.user, "--"]
        self.port = _free_port()

    @property
    def url(self) -> str:
        """The admin URL (``postgresql+psycopg://USER@127.0.0.1:PORT/postgres``)."""
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/postgres"

    def init(self) -> None:
        self._run(self.initdb, "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8")

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder} -c fsync=off"
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "-o", options, "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            [*self.prefix, self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop"],
            check=False,
            capture_output=True,
        )

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self, *argv: str) -> None:
        try:
            subprocess.run([*self.prefix, *argv], check=True, capture_output=True)
        except subprocess.CalledProcessError as error:
            raise PostgresUnavailable(f"{argv[0]}: {error.stderr.decode()}") from error


@contextlib.contextmanager
def postgres_server() -> Iterator[LocalPostgres]:
    """Start a server; yield it (its admin URL is ``.url``); remove it afterwards."""
    server = LocalPostgres()
    try:
        server.init()
        server.start()
    except PostgresUnavailable:
        shutil.rmtree(server.folder, ignore_errors=True)
        raise
    try:
        yield server
    finally:
        server.remove()
