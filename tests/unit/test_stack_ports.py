"""The ports the stack, the tests and the benchmarks pick for servers they start a moment later."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fibers_stack import process


def test_a_picked_port_is_one_no_outgoing_connection_can_take_before_the_server_binds_it() -> None:
    # The kernel gives outgoing connections (and `bind(0)`) ports from this range: a port picked from it
    # could be another process's a moment later, and the server started on it fail with EADDRINUSE.
    low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    picked = [process.free_port("127.0.0.1") for _ in range(50)]
    assert all(not low <= port <= high for port in picked)
    assert all(not 30000 <= port <= 32767 for port in picked)  # nor a Kubernetes NodePort
    assert len(set(picked)) == len(picked)  # never the same one twice to one process
    with socket.socket() as s:
        s.bind(("127.0.0.1", picked[-1]))  # free when handed out


def test_a_port_something_listens_on_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as server:
        taken = process.free_port("127.0.0.1")
        server.bind(("127.0.0.1", taken))
        server.listen()
        process._handed_out.discard(taken)  # as if another process had picked and bound it
        other = process.free_port("127.0.0.1")
        offers = iter([taken, other])
        monkeypatch.setattr(process.random, "choice", lambda _: next(offers))
        process._handed_out.discard(other)
        assert process.free_port("127.0.0.1") == other
