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

__all__ = ["PostgresUnavailable", "postgres_server"]


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


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """Start a server; yield its admin URL (``postgresql+psycopg://USER@127.0.0.1:PORT/postgres``)."""
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    folder = Path(tempfile.mkdtemp(prefix="phalanx-pg-"))
    data = folder / "data"
    prefix: list[str] = []
    user = pwd.getpwuid(os.getuid()).pw_name
    if os.getuid() == 0:
        user = "postgres"
        entry = pwd.getpwnam(user)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
        prefix = ["runuser", "-u", user, "--"]
    port = _free_port()
    log = folder / "postgres.log"
    try:
        subprocess.run(
            [*prefix, initdb, "-D", str(data), "-U", user, "--auth=trust", "-E", "UTF8"],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                *prefix,
                pg_ctl,
                "-D",
                str(data),
                "-l",
                str(log),
                "-w",
                "-t",
                "60",
                "-o",
                f"-c listen_addresses=127.0.0.1 -p {port} -k {folder} -c fsync=off",
                "start",
            ],
            check=True,
            capture_output=True,
        )
    except subprocess.CalledProcessError as error:
        shutil.rmtree(folder, ignore_errors=True)
        raise PostgresUnavailable(f"{error.cmd[len(prefix)]}: {error.stderr.decode()}") from error
    try:
        yield f"postgresql+psycopg://{user}@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(folder, ignore_errors=True)
