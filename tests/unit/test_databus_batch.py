"""How the consumer splits a dispatched batch into applied and pending windows (pure logic)."""

from __future__ import annotations

from fibers.consumer.batches import BatchOutcome
from fibers.consumer.callbacks import Result, Singles, WindowFailed
from fibers.consumer.events import ChangeEvent

OK, SKIP = Result.SUCCESS, Result.SKIP_CHECKPOINT


def events(*offsets: int, partition: int = 0, tx: str | None = "tx") -> list[ChangeEvent]:
    return [ChangeEvent("t", partition, o, str(o), "u", 100 + o, tx or o) for o in offsets]


def offsets(windows: list[list[ChangeEvent]]) -> list[tuple[str, list[int]]]:
    return [(type(w).__name__, [e.offset for e in w]) for w in windows]


def test_a_record_failing_inside_a_singles_run_splits_the_run_there() -> None:
    batch = [events(1, 2), Singles(events(3, 4, 5, tx=None)), events(6)]
    error = WindowFailed("on_data_event returned ERROR at offset 5")
    outcome = BatchOutcome.of(batch, [OK, OK, OK], error, timelines=1)
    assert offsets(outcome.applied) == [("list", [1, 2]), ("Singles", [3, 4])]
    assert offsets(outcome.pending) == [("Singles", [5]), ("list", [6])]
    assert [e.offset for e in outcome.failed] == [5]
    assert outcome.last[("t", 0)].offset == 4
    assert outcome.error is error


def test_a_failing_first_record_of_a_run_leaves_the_run_whole_and_pending() -> None:
    batch = [events(1, 2), Singles(events(3, 4, tx=None))]
    outcome = BatchOutcome.of(batch, [OK], WindowFailed("x"), timelines=1)
    assert offsets(outcome.applied) == [("list", [1, 2])]
    assert offsets(outcome.pending) == [("Singles", [3, 4])]
    assert [e.offset for e in outcome.failed] == [3]


def test_each_timeline_checkpoints_at_its_last_window_not_skipped() -> None:
    batch = [
        Singles([*events(1, tx=None), *events(1, partition=1, tx=None), *events(2, tx=None)]),
        events(3, 4, partition=1),
    ]
    outcome = BatchOutcome.of(batch, [OK, OK, SKIP, SKIP], None, timelines=2)
    assert outcome.pending == [] and outcome.error is None
    assert {k: e.offset for k, e in outcome.last.items()} == {("t", 0): 1, ("t", 1): 1}
    assert not outcome.force
    assert BatchOutcome.of(batch, [OK, Result.CHECKPOINT, OK, OK], None, timelines=2).force
