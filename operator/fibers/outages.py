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
from fibers.kubeapi import ApiError, Unreachable

RETRY_SECONDS = 5.0  # how soon a handler tries again after the API server did not answer
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})  # overloaded, restarting, or behind a proxy that is


@contextmanager
def api_outage_is_temporary(delay: float = RETRY_SECONDS) -> Iterator[None]:
    try:
        yield
    except Unreachable as exc:  # connection refused or reset, timed out: no answer at all
        raise kopf.TemporaryError(f"the Kubernetes API server did not answer: {describe(exc)}", delay=delay) from None
    except ApiError as exc:
        if exc.status not in TRANSIENT_STATUSES:
            raise
        raise kopf.TemporaryError(f"the Kubernetes API server is unavailable: {describe(exc)}", delay=delay) from None
