"""Test a Databus callback without Kafka: feed it windows in the order a consumer pod does.

For users writing their own callback class (`sink.type: callback`): build change events with
`change`, hand them to a `Feeder` window by window, and assert on what your callback wrote. The
Feeder calls the same dispatcher the consumer runtime uses, so the call order — start sequence,
start source, data events, end source, end sequence, checkpoint; rollback after a failed window;
the bootstrap twins — and the calls a class does not implement are the runtime's own:

    from fibers.consumer.testing import Feeder, change

    feeder = Feeder(CustomerTotals(dsn=...))
    feeder.window([change("o1", {"customer": "c1", "amount": 5}, scn=10)])
    feeder.window([change("o1", None, scn=11, op="d")])   # a delete: no row image
    assert feeder.rollbacks == []
    feeder.stop()

What it does not do: read Kafka, keep checkpoints, retry, or time callbacks out (the runtime's
part, tested with the runtime).
"""

from __future__ import annotations

from typing import Any

from fibers.consumer.callbacks import Callback, Result, bootstrap_page, call, end_batch, window_dispatcher
from fibers.consumer.events import ChangeEvent


def change(
    key: str,
    after: dict[str, Any] | None,
    *,
    scn: int,
    op: str = "u",
    before: dict[str, Any] | None = None,
    topic: str = "shop.public.orders",
    partition: int = 0,
    offset: int | None = None,
    window: str | int | None = None,
) -> ChangeEvent:
    """A change event as the runtime builds it from a Debezium record: `after` is the row image (None for a
    delete), `scn` orders changes, `window` groups a transaction (by default the SCN: a window of its own)."""
    return ChangeEvent(
        topic,
        partition,
        scn if offset is None else offset,
        key,
        op,
        scn,
        scn if window is None else window,
        after,
        before,
        0,
        {"op": op, "after": after, "before": before},
    )


class Feeder:
    """Drives one callback through windows, as the consumer runtime's dispatcher does."""

    def __init__(self, callback: Callback) -> None:
        self.callback = callback
        self.rollbacks: list[int] = []  # the SCNs `rollback` was called with
        self.checkpoint = -1  # the SCN of the last window the callback applied
        self._dispatch = window_dispatcher(callback)
        call(callback.on_start_consumption)

    def window(self, events: list[ChangeEvent]) -> Result:
        """Dispatch one window (a source transaction) and let a buffered sink write it; the callback's
        Result for it. A window that fails is rolled back (`on_error`, `on_rollback` with the last
        checkpoint's SCN) and its exception re-raised, as the runtime would before replaying it."""
        results: list[Result] = []
        try:
            self._dispatch(events, results)
            end_batch(self.callback)
        except Exception as exc:
            self.callback.on_error(exc)
            self.rollback()
            raise
        self.checkpoint = max(self.checkpoint, events[-1].scn)
        return results[-1] if results else Result.SUCCESS

    def bootstrap(self, events: list[ChangeEvent]) -> None:
        """Deliver a bootstrap page (snapshot rows or logged changes) through the bootstrap callbacks."""
        scn = max(event.scn for event in events)
        bootstrap_page(self.callback, events, scn)
        self.checkpoint = max(self.checkpoint, scn)

    def rollback(self) -> None:
        """What a failed window costs a callback: `on_rollback` with the last checkpoint's SCN."""
        self.rollbacks.append(self.checkpoint)
        self.callback.on_rollback(self.checkpoint)

    def stop(self) -> None:
        try:
            self.callback.on_stop_consumption()
        finally:
            self.callback.close()
