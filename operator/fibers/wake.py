"""Sleeping until woken or a timeout: the loops of the operator (the reconcile queue, Connect's sync,
the cluster and registry probes) all wait this way between rounds.

Why not `asyncio.wait_for(event.wait(), timeout)`: before Python 3.12 it can swallow a cancellation
that arrives as the event is set, and a loop whose cancellation is lost never ends (the operator's
shutdown, or a test, then hangs; seen in CI). `asyncio.timeout` does not.
"""

from __future__ import annotations

import asyncio


async def sleep_until_woken(wake: asyncio.Event, timeout: float | None) -> bool:
    """Wait for `wake` at most `timeout` seconds (None: no limit); True when it was set."""
    try:
        async with asyncio.timeout(timeout):
            await wake.wait()
    except TimeoutError:
        return False
    return True
