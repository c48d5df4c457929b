"""What a sink remembers, and who writes through it, when the runtime's threads and instances change hands.

- A callback thread the driver gave up on (a write past the callback timeout) cannot be stopped: it must
  not write after the replay's thread, or an older row comes back over a newer change.
- A sink remembers what each key holds (`GuardedCollection`): when this instance takes partitions — at
  start, or back from another instance — another writer may have changed those keys, so it forgets.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from fibers.consumer.assignment import Assignment
from fibers.consumer.callbacks import WindowSink
from fibers.consumer.events import ChangeEvent
from fibers.consumer.mongo_servers import Stored, Write
from fibers.consumer.positions import Positions
from fibers.consumer.sinks import MongoSink
from fibers.consumer.sinkset import SinkSet
from fibers.consumer.stops import ConsumerStopped
from fibers.consumer.store import GuardedCollection
from fibers.databus.timelines import Checkpoints
from tests.unit.test_databus_mongo_servers import FakeServer, change


class SlowFirstWrite(WindowSink):
    """A sink whose first write hangs until released (a server that stopped answering mid-write); every
    write lands on `rows` (the server's table: key → the last change written)."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release, self.rows, self.writes = release, {}, 0

    def flush(self, events: list[ChangeEvent]) -> None:
        self.writes += 1
        if self.writes == 1:
            self.release.wait(10)
        for event in events:
            self.rows[event.key] = (event.scn, event.op)


def deliver(sinks: SinkSet, windows: list[list[ChangeEvent]]) -> None:
    """As the runtime does: the batch again until it is applied (a rollback replays it)."""
    for _ in range(100):
        if sinks.windows(windows, 1).error is None:
            return
    raise AssertionError("the batch was never applied")


def test_a_write_given_up_on_never_lands_after_the_replay_and_the_next_batch() -> None:
    release = threading.Event()
    sink = SlowFirstWrite(release)
    sinks = SinkSet([sink], ["view"], timeout=0.1)
    try:
        server_back = threading.Timer(0.3, release.set)  # the hung write ends after its timeout
        server_back.start()
        deliver(sinks, [[change("k", 10, v=1)]])
        deliver(sinks, [[change("k", 20, "d")]])
        server_back.join()
        time.sleep(0.3)  # the hung write has landed by now, wherever it was going to
        assert sink.rows == {"k": (20, "d")}
        assert sinks.driver.abandoned_threads == 1  # the replay waited for it instead of timing out too
    finally:
        release.set()
        sinks.close()


def test_a_call_that_never_returns_stops_the_consumer_instead_of_blocking_it() -> None:
    release = threading.Event()
    sinks = SinkSet([SlowFirstWrite(release)], ["view"], timeout=0.05)
    try:
        assert sinks.windows([[change("k", 10, v=1)]], 1).error is not None  # timed out, given up on
        with pytest.raises(ConsumerStopped, match=r"sink view: a call given up on .* has not returned"):
            sinks.windows([[change("k", 10, v=1)]], 1)
    finally:
        release.set()
        sinks.close()


@pytest.fixture
def mongo_sink(monkeypatch: pytest.MonkeyPatch) -> MongoSink:
    monkeypatch.setenv(
        "FIBERS_TEST_VIEW_URI", "mongodb://127.0.0.1:1"
    )  # never connected to: the guard's server is fake
    return MongoSink("FIBERS_TEST_VIEW_URI", "db", "view")


def test_a_view_forgets_its_keys_when_the_instance_takes_partitions(mongo_sink: MongoSink) -> None:
    """pod-0 applied k's insert and delete, pod-1 (after a scale-up) wrote k again, the partition came back
    to pod-0 (scale-down): k's delete must be sent, not skipped as "deleted already"."""
    server = FakeServer()
    mongo_sink.collections["view"] = GuardedCollection(None, server=server)
    sinks = SinkSet([mongo_sink], ["view"], timeout=5)
    try:
        deliver(sinks, [[change("k", 100, "c", v=1)]])
        deliver(sinks, [[change("k", 200, "d")]])
        server.holds["k"] = Stored(300, True)  # pod-1's insert, while it held the partition
        sinks.timelines_taken(["t.0"])
        deliver(sinks, [[change("k", 400, "d")]])
        assert server.written[-1] == [Write("k", 400, None)]
    finally:
        sinks.close()


def test_the_sinks_are_told_of_taken_timelines_before_any_of_them_is_read() -> None:
    said: list[Any] = []
    checkpoints = SimpleNamespace(save=lambda *a, **k: None, forget=lambda key: None)
    consumer = SimpleNamespace(
        get_watermark_offsets=lambda tp, timeout: (0, 5),
        incremental_assign=lambda assignments: said.append(("assigned", [a.partition for a in assignments])),
    )
    config = SimpleNamespace(topics=["t"], start_from=SimpleNamespace(timestamp_ms=None, position="earliest"))
    assignment = Assignment(
        config,  # type: ignore[arg-type]
        consumer,  # type: ignore[arg-type]
        members=None,  # type: ignore[arg-type]
        leases=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        positions=Positions(checkpoints),  # type: ignore[arg-type]
        bootstrap=SimpleNamespace(plan=lambda topic, partitions, stored: []),  # type: ignore[arg-type]
        stopping=SimpleNamespace(requested=False),  # type: ignore[arg-type]
        mask=str,
        taken=lambda keys: said.append(("taken", keys)),
    )
    assignment._take([("t", 0), ("t", 2)], Checkpoints(["t"]))
    assert said == [("taken", ["t.0", "t.2"]), ("assigned", [0, 2])]
