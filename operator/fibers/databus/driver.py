"""The callback driver: user callbacks run on a thread of their own, bounded by the consumer's timeout.

Databus' client hands every window to a callback driver that "monitors errors and timeouts, and
guarantees the consumer's progress"; relay windows and bootstrap pages both go through this one, so a
callback that hangs is noticed the same way in either phase. The consumer's own thread keeps reading
the relay and deciding checkpoints; it never runs user code directly.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class CallbackTimeout(TimeoutError):
    """The callbacks did not return within the consumer's callback timeout."""


class CallbackDriver:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._pool = self._new_pool()
        self._abandoned: set[int] = set()  # idents of callback threads given up on

    @staticmethod
    def _new_pool() -> concurrent.futures.ThreadPoolExecutor:
        return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="callback")

    def run(self, work: Callable[..., T], *args: object) -> T:
        """`work(*args)` on the callback thread; its exception, or CallbackTimeout after the timeout.

        A thread that timed out cannot be stopped (Python has no way to): it is marked abandoned, so
        the work stops at its next callback (`abandoned()`), and a new thread serves the replay; a
        hung callback never blocks the consumer.
        """
        worker: list[int] = []

        def enter() -> T:
            worker.append(threading.get_ident())
            return work(*args)

        future = self._pool.submit(enter)
        try:
            return future.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            if future.done():
                raise  # the callback itself raised a TimeoutError
            self._abandoned.update(worker)
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._new_pool()
            raise CallbackTimeout(f"callbacks took over {self.timeout:g}s") from None

    def abandoned(self) -> bool:
        """True in a callback thread the driver gave up on: its work must not go on (the replay does)."""
        return threading.get_ident() in self._abandoned

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
