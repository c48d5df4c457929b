"""When `fibers-stack up` (the tests' session, `make demo`) reuses the running stack and when it starts anew."""

from __future__ import annotations

import pytest

import fibers_stack
from fibers_stack import kafka


def _running(*processes: str) -> fibers_stack.StackInfo:
    pids = {name: 1000 + i for i, name in enumerate(processes)}
    return fibers_stack.StackInfo(
        run_dir="/nonexistent", pids=pids, cluster_addresses={"kafka": "x"}, postgres_role_checked="fibers_password"
    )


def _one_worker() -> tuple[str, ...]:
    return tuple(name for name in fibers_stack.STOP_ORDER if not name.startswith("kafka-connect-"))


def test_a_stack_with_the_default_single_connect_worker_is_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    # `make demo` inside `make test` calls `up` again: a restart there would pull the stack from under the
    # tests of the session that started it.
    monkeypatch.delenv("FIBERS_CONNECT_WORKERS", raising=False)
    assert fibers_stack._complete(_running(*_one_worker()))


def test_a_stack_with_fewer_connect_workers_than_asked_for_is_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIBERS_CONNECT_WORKERS", "2")
    assert not fibers_stack._complete(_running(*_one_worker()))
    assert fibers_stack._complete(_running(*_one_worker(), "kafka-connect-2"))
    monkeypatch.setenv("FIBERS_CONNECT_WORKERS", str(kafka.CONNECT_WORKERS))
    assert fibers_stack._complete(_running(*_one_worker(), "kafka-connect-2"))  # more than asked for: kept


def test_a_stack_without_a_component_this_version_starts_is_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FIBERS_CONNECT_WORKERS", raising=False)
    assert not fibers_stack._complete(_running(*(n for n in _one_worker() if n != "apicurio")))
