"""The Kubernetes API server going away is weather, not a bug: one line and a retry, not a traceback.

While the API server restarts (or is overloaded), every handler that reads or writes an object fails.
kopf logs an unexpected exception with its whole traceback each time it retries (every few seconds,
per object); a `kopf.TemporaryError` is logged as one line and retried after `delay`. The handlers
wrap their reconcile calls in `api_outage_is_temporary`, so an outage reads as what it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import kopf

from fibers.kube import describe
from fibers.kubeapi import ApiError, Unreachable, retry_delay, transient

RETRY_SECONDS = 5.0  # how soon a handler tries again after the API server did not answer


@contextmanager
def api_outage_is_temporary(delay: float = RETRY_SECONDS) -> Iterator[None]:
    """`delay` unless the server said how long to wait (Retry-After on a 429 or 503)."""
    try:
        yield
    except (ApiError, Unreachable) as exc:
        if not transient(exc):
            raise
        what = "did not answer" if isinstance(exc, Unreachable) else "is unavailable"
        wait = retry_delay(exc, 0, base=delay, cap=delay)
        raise kopf.TemporaryError(f"the Kubernetes API server {what}: {describe(exc)}", delay=wait) from None
