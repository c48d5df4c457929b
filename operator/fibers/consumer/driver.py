"""The callback driver: user callbacks run on threads of their own, bounded by the consumer's timeout.

Databus' client hands every window to a multi-threaded callback driver that "monitors errors and
timeouts, and guarantees the consumer's progress"; relay windows and bootstrap pages both go
through this one, so a callback that hangs is noticed the same way in either phase. Each of a
consumer's callbacks (its sinks) has a thread of its own, and a window goes to all of them at
once: a slow MongoDB write and a Kafka produce overlap instead of adding up. The consumer's own
thread keeps reading the relay and deciding checkpoints; it never runs user code directly.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class CallbackTimeout(TimeoutError):
    """The callbacks did not return within the consumer's callback timeout."""


class _Submission:
    """One piece of work handed to one callback's thread; `abandoned` once the driver gave up on it.

    Tracked per submission, not per thread id: ids are reused as soon as a thread exits, so the new
    thread serving the replay would often be taken for the one given up on.
    """

    __slots__ = ("abandoned",)

    def __init__(self) -> None:
        self.abandoned = False


class CallbackDriver:
    def __init__(self, callbacks: int, timeout: float) -> None:
        self.timeout = timeout
        self._pools = [self._new_pool(i) for i in range(callbacks)]
        self._current = threading.local()  # in a callback thread: the submission it is working on
        self.abandoned_threads = 0  # threads given up on (each may still be stuck in a server's call)

    @staticmethod
    def _new_pool(index: int) -> concurrent.futures.ThreadPoolExecutor:
        return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"callback-{index}")

    def each(self, work: Callable[[int], T]) -> list[T | BaseException]:
        """`work(i)` on callback i's thread, for every callback at once; per callback, what it returned
        or raised, or a CallbackTimeout when the timeout passed first (for all of them together).

        A thread that timed out cannot be stopped (Python has no way to): it is marked abandoned, so
        its work stops at the next callback (`abandoned()`), and a new thread serves the replay; a hung
        callback never blocks the consumer.
        """
        submissions = [_Submission() for _ in self._pools]

        def enter(index: int) -> T:
            self._current.submission = submissions[index]
            try:
                return work(index)
            finally:
                self._current.submission = None

        futures = [pool.submit(enter, i) for i, pool in enumerate(self._pools)]
        deadline = time.monotonic() + self.timeout
        outcomes: list[T | BaseException] = []
        for index, future in enumerate(futures):
            try:
                outcomes.append(future.result(timeout=max(deadline - time.monotonic(), 0)))
            except concurrent.futures.TimeoutError as exc:
                if future.done():  # the callback itself raised a TimeoutError
                    outcomes.append(exc)
                    continue
                submissions[index].abandoned = True
                self.abandoned_threads += 1
                self._pools[index].shutdown(wait=False, cancel_futures=True)
                self._pools[index] = self._new_pool(index)
                outcomes.append(CallbackTimeout(f"callbacks took over {self.timeout:g}s"))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    def all(self, work: Callable[[int], T]) -> list[T]:
        """`each`, raising the first failure (start and stop hooks, where any failure ends the consumer)."""
        outcomes = self.each(work)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes  # type: ignore[return-value]  # no exceptions left in it

    def abandoned(self) -> bool:
        """True in a callback thread the driver gave up on: its work must not go on (the replay does)."""
        submission = getattr(self._current, "submission", None)
        return submission is not None and submission.abandoned

    def close(self) -> None:
        for pool in self._pools:
            pool.shutdown(wait=False, cancel_futures=True)
