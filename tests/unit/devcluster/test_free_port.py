"""``free_port`` hands out a port free on the address asked about, and never the same one
twice in a process (the rolling install test once started a replica on a port another
replica already served on the host's address: free on 127.0.0.1, taken on the other)."""

from __future__ import annotations

import contextlib
import socket

from phalanx.bench.proc import free_port


def test_a_port_is_never_handed_out_twice() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)


def test_a_port_taken_on_the_address_asked_about_is_not_handed_out() -> None:
    with contextlib.ExitStack() as stack:
        taken: set[int] = set()
        for _ in range(50):
            sock = stack.enter_context(contextlib.closing(socket.socket()))
            sock.bind(("127.0.0.2", 0))
            sock.listen()
            taken.add(sock.getsockname()[1])
        for _ in range(200):
            port = free_port("127.0.0.2")
            assert port not in taken
            with contextlib.closing(socket.socket()) as probe:
                probe.bind(("127.0.0.2", port))  # really free there
