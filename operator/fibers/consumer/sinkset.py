"""The consumer's sinks, each on a thread of its own (`driver`): a batch of windows or a bootstrap page
goes to all of them, and counts as done only where every one of them succeeded."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fibers import failpoints
from fibers.consumer.batches import BatchOutcome, stricter
from fibers.consumer.callbacks import Callback, Result, bootstrap_page, call, end_batch, window_dispatcher
from fibers.consumer.driver import CallbackDriver, CallbackTimeout
from fibers.consumer.events import ChangeEvent
from fibers.consumer.stops import ConsumerStopped
from fibers.consumer.tuning import ABANDONED_WAIT_TIMEOUTS


class SinkFailed(Exception):
    """One of several sinks failed a window: every sink is rolled back to the same checkpoint."""

    def __init__(self, sink: str, error: BaseException) -> None:
        super().__init__(f"sink {sink}: {error}")
        self.sink, self.error = sink, error


@dataclass(slots=True)
class SinkStats:
    """What one callback did, for the consumer's status (summed over instances by the operator)."""

    windows: int = 0
    errors: int = 0
    timeouts: int = 0
    last_batch_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "windows": self.windows,
            "errors": self.errors,
            "timeouts": self.timeouts,
            "lastBatchSeconds": round(self.last_batch_seconds, 4),
        }


class SinkSet:
    """The callbacks, their names and figures, and the threads they run on (one per callback)."""

    def __init__(self, callbacks: list[Callback], names: list[str], timeout: float) -> None:
        self.callbacks, self.names = callbacks, names
        self.stats = [SinkStats() for _ in callbacks]
        self.driver = CallbackDriver(len(callbacks), timeout)
        self._dispatchers = [window_dispatcher(callback) for callback in callbacks]
        # One thread at a time in each callback. A thread the driver gave up on cannot be stopped: still in a
        # write when the replay began, it went on writing older rows after the replay's and the next batch's
        # (a row deleted at SCN 20 came back as it was at 10) and changed the sink's memory of its keys. The
        # replay waits for it (`settle`), then does the work; a thread given up on while waiting does none.
        self._busy = [threading.Lock() for _ in callbacks]
        self.timers: list[Callable[[float], None]] | None = None  # each sink's batch histogram, when served

    def settle(self) -> None:
        """Before an attempt: wait until every thread given up on has left its callback, so the attempt's
        timeout counts its own work (`ABANDONED_WAIT_TIMEOUTS`); stop the consumer if one never does."""
        limit = self.driver.timeout * ABANDONED_WAIT_TIMEOUTS
        for name, busy in zip(self.names, self._busy, strict=True):
            if not busy.acquire(timeout=limit):
                raise ConsumerStopped(
                    f"sink {name}: a call given up on after the callback timeout has not returned {limit:g}s later; "
                    "the consumer restarts, which ends it"
                )
            busy.release()

    def hook(self, name: str, *args: Any) -> None:
        """Call a start or stop hook of every callback, each on its thread; any failure stops the consumer."""
        self.settle()

        def run(index: int) -> Result:
            with self._busy[index]:
                if self.driver.abandoned():
                    raise CallbackTimeout("abandoned after the timeout")
                return call(getattr(self.callbacks[index], name), *args)

        self.driver.all(run)

    def timelines_taken(self, timelines: list[str]) -> None:
        """Every callback forgets what it remembers of its keys (`Callback.on_timelines_taken`), before the
        timelines' first window."""
        self.hook("on_timelines_taken", timelines)

    def tell(self, name: str, *args: Any) -> None:
        """Tell every callback of a failure (on_error, on_rollback and their bootstrap twins)."""
        for callback in self.callbacks:
            getattr(callback, name)(*args)

    def windows(self, windows: list[list[ChangeEvent]], timelines: int) -> BatchOutcome:
        """The batch through every sink: a window counts only when all of them succeeded."""
        self.settle()
        outcomes = self.driver.each(lambda i: self._run_windows(i, windows))
        done = [([], o) if isinstance(o, BaseException) else o for o in outcomes]  # (results, error) each
        failure = self.first_failure([error for _, error in done])
        combined = done[0][0]
        for results, _ in done[1:]:  # zip stops at the shorter: the windows every callback got through
            combined = [stricter(a, b) for a, b in zip(combined, results, strict=False)]
        return BatchOutcome.of(windows, combined, failure, timelines)

    def page(self, events: list[ChangeEvent], scn: int) -> BaseException | None:
        """One bootstrap page through every sink; the first failure (None: all applied it)."""
        self.settle()
        return self.first_failure(self.driver.each(lambda i: self._page(i, events, scn)))

    def first_failure(self, outcomes: list[Any]) -> BaseException | None:
        """The first failure among the callbacks' outcomes (an exception, or anything else for none), named
        by its sink when there are several; every failure is counted in its sink's figures."""
        first: BaseException | None = None
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, BaseException):
                stats = self.stats[index]
                if isinstance(outcome, CallbackTimeout):
                    stats.timeouts += 1
                else:
                    stats.errors += 1
                first = first or (SinkFailed(self.names[index], outcome) if len(self.callbacks) > 1 else outcome)
        return first

    def figures(self) -> list[dict[str, Any]]:
        """Each sink's figures for status, in the spec's order (the stats are stored with sorted keys)."""
        return [{"name": name, **stats.as_dict()} for name, stats in zip(self.names, self.stats, strict=True)]

    def close(self) -> None:
        """The stop hook and `close` of every callback, then their threads."""
        try:
            for callback in self.callbacks:
                try:
                    callback.on_stop_consumption()
                finally:
                    callback.close()
        finally:
            self.driver.close()

    def _run_windows(self, index: int, windows: list[list[ChangeEvent]]) -> tuple[list[Result], BaseException | None]:
        """In callback `index`'s thread, once no other thread is in it: see `_windows`."""
        with self._busy[index]:
            return self._windows(index, windows)

    def _windows(self, index: int, windows: list[list[ChangeEvent]]) -> tuple[list[Result], BaseException | None]:
        """Dispatch windows until one fails; then a buffered sink writes.

        Returns a Result per window (per record of a Singles run) done, and what stopped it, if anything.
        """
        started = time.perf_counter()
        results: list[Result] = []
        error: BaseException | None = None
        dispatch = self._dispatchers[index]
        failpoints.hit("callback")
        for window in windows:
            if self.driver.abandoned():  # timed out: the rollback replays these windows; write nothing
                return [], CallbackTimeout("abandoned after the timeout")
            try:
                dispatch(window, results)
            except Exception as exc:  # any failure of a window rolls it back
                error = exc
                break
        if self.driver.abandoned():
            return [], CallbackTimeout("abandoned after the timeout")
        if results:
            try:
                end_batch(self.callbacks[index])  # a buffered sink writes the successful windows now
            except Exception as exc:  # nothing of this batch is known to be applied
                return [], exc
        stats = self.stats[index]
        stats.windows += len(results)
        stats.last_batch_seconds = time.perf_counter() - started
        if self.timers:
            self.timers[index](stats.last_batch_seconds)
        return results, error

    def _page(self, index: int, events: list[ChangeEvent], scn: int) -> None:
        """In callback `index`'s thread, once no other thread is in it: one bootstrap page, timed like a batch
        of windows."""
        started = time.perf_counter()
        failpoints.hit("callback")
        with self._busy[index]:
            if self.driver.abandoned():  # timed out before it began: the replay delivers the page
                raise CallbackTimeout("abandoned after the timeout")
            bootstrap_page(self.callbacks[index], events, scn, self.driver.abandoned)
        if self.timers:
            self.timers[index](time.perf_counter() - started)
