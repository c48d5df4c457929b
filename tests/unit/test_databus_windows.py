"""Records cut into windows: one open window per timeline, whatever order Kafka interleaves them in."""

from __future__ import annotations

from fibers.consumer.callbacks import Singles
from fibers.consumer.events import ChangeEvent
from fibers.consumer.testing import change
from fibers.consumer.windows import Windows

QUIET = 0.05


def record(partition: int, offset: int, window: str | int) -> ChangeEvent:
    return change(f"k{offset}", {"id": offset}, scn=offset, partition=partition, offset=offset, window=window)


def offsets(ready: list[list[ChangeEvent]]) -> list[tuple[str, list[tuple[int, int]]]]:
    return [("singles" if w.__class__ is Singles else "window", [(e.partition, e.offset) for e in w]) for w in ready]


def test_another_partitions_records_between_a_transactions_records_do_not_split_it() -> None:
    """Kafka returned a transaction's records of partition 0, then partition 1's, then the rest of
    partition 0's: the relay cut partition 0's transaction in two, and a sink could show half of it."""
    windows, ready = Windows(max_events=100, quiet=QUIET), []
    windows.cut([record(0, 1, "t1"), record(0, 2, "t1"), record(1, 1, "t1"), record(0, 3, "t1")], ready)
    assert ready == [] and windows
    windows.close_quiet(10.0, ready, relay_quiet=True)
    assert offsets(ready) == [("window", [(0, 1), (0, 2), (0, 3)]), ("window", [(1, 1)])]
    assert not windows


def test_the_rest_of_a_transaction_in_a_later_poll_joins_its_window() -> None:
    windows, ready = Windows(max_events=100, quiet=QUIET), []
    windows.cut([record(0, 1, "t1"), record(1, 1, "t9")], ready)
    windows.close_quiet(10.0, ready, relay_quiet=False)  # both just grew: open
    windows.cut([record(1, 2, "t9"), record(0, 2, "t1")], ready)
    windows.close_quiet(10.01, ready, relay_quiet=False)
    assert ready == []
    windows.cut([record(0, 3, "t2")], ready)  # partition 0's next transaction ends its first
    assert offsets(ready) == [("window", [(0, 1), (0, 2)])]


def test_a_timeline_quiet_while_others_flow_ends_its_window() -> None:
    """Another partition's steady stream keeps the relay from ever going quiet: a transaction still ends
    once its own timeline has been quiet for the quiet time."""
    windows, ready = Windows(max_events=100, quiet=QUIET), []
    windows.cut([record(0, 1, "t1")], ready)
    windows.close_quiet(10.0, ready, relay_quiet=False)
    windows.cut([record(1, 1, 1)], ready)
    windows.close_quiet(10.02, ready, relay_quiet=False)
    assert offsets(ready) == [("singles", [(1, 1)])]
    windows.cut([record(1, 2, 2)], ready)
    windows.close_quiet(10.06, ready, relay_quiet=False)
    assert offsets(ready) == [("singles", [(1, 1), (1, 2)]), ("window", [(0, 1)])]


def test_records_outside_transactions_run_together_and_end_their_timelines_window() -> None:
    windows, ready = Windows(max_events=100, quiet=QUIET), []
    windows.cut([record(0, 1, 1), record(1, 1, "t1"), record(0, 2, 2), record(1, 2, 3)], ready)
    # partition 1's transaction ends at its own single record; partition 0's singles keep running
    assert offsets(ready) == [("singles", [(0, 1), (0, 2)]), ("window", [(1, 1)]), ("singles", [(1, 2)])]


def test_a_window_ends_at_max_events_and_dropped_timelines_are_forgotten() -> None:
    windows, ready = Windows(max_events=2, quiet=QUIET), []
    windows.cut([record(0, o, "t1") for o in range(1, 4)] + [record(1, 1, "t1")], ready)
    assert offsets(ready) == [("window", [(0, 1), (0, 2)])]
    windows.drop([("shop.public.orders", 0)])  # rolled back: read again from the checkpoint
    windows.close_quiet(10.0, ready, relay_quiet=True)
    assert offsets(ready) == [("window", [(0, 1), (0, 2)]), ("window", [(1, 1)])]
