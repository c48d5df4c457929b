"""How a consumer stops: the stop request (a signal, or an embedding caller) with the pauses it cuts
short, and the exceptions that end a run, each with what it means for the pod."""

from __future__ import annotations

import threading

from fibers.consumer.tuning import MAX_RETRY_PAUSE_SECONDS, TRANSIENT_RETRY_BASE_SECONDS, TRANSIENT_RETRY_CAP_SECONDS

UNDECODABLE_EXIT = 6  # the exit code of a consumer stopped on a record it cannot decode (spec.onUndecodable: fail)
# The relay no longer holds what the consumer must read next (it fell off, or startFrom is before what Kafka
# keeps) and there is no bootstrap store to read it from: no restart changes that, a seek does.
RELAY_GONE_EXIT = 5
# A relay that dropped the records the consumer was reading while it read them: a restart resumes from the
# checkpoint and finds it fell off (bootstrapping from the store, or stopping with RELAY_GONE_EXIT).
RELAY_LOST_EXIT = 7
# Stops no restart changes: the pod says why on the checkpoint ConfigMap and waits to be replaced.
FOR_GOOD_EXITS = frozenset({UNDECODABLE_EXIT, RELAY_GONE_EXIT})


class ConsumerStopped(Exception):
    """The consumer cannot go on; the message says why (exit code in `code`)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class StoppedWaiting(Exception):
    """A stop request came while the consumer waited for a server: it ends cleanly, without a checkpoint."""


class BootstrapInterrupted(Exception):
    """A bootstrap stopped between pages: the consumer is stopping, or no longer owns its timelines."""


class Stopping:
    """The consumer's stop request. Every pause of the consumer waits on it, so a stop ends the pause."""

    def __init__(self) -> None:
        self._event = threading.Event()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self) -> None:
        self._event.set()

    def wait(self, seconds: float) -> bool:
        """Pause `seconds`, or less when a stop comes; True when it did."""
        return self._event.wait(seconds)

    def transient(self, attempt: int) -> None:
        """The pause before trying a server that did not answer again: doubling, bounded."""
        exponent = min(attempt - 1, 30)  # bounded: no overflow however long the outage
        self.wait(min(TRANSIENT_RETRY_BASE_SECONDS * 2**exponent, TRANSIENT_RETRY_CAP_SECONDS))

    def replay(self, backoff: float, tries: int) -> None:
        """The pause before a failed window or page is delivered again: the callback policy's backoff,
        doubled per attempt, bounded."""
        self.wait(min(backoff * 2 ** (tries - 1), MAX_RETRY_PAUSE_SECONDS))
