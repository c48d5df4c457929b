"""kopf handlers for Replay: thin, they hand each Replay to the reconcile queue (`ReplayReconciler`).

No finalizer: deleting a Replay undoes nothing (a step told to seek has sought), so it needs no operator.
"""

from __future__ import annotations

from typing import Any

import kopf

from fibers.api import GROUP, VERSION
from fibers.readiness import Readiness
from fibers.reconciles import Reconciles
from fibers.replay.plan import KIND, PLURAL


@kopf.on.event(GROUP, VERSION, PLURAL)
async def replay_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Found at start-up, created, or changed (its own status too): looked at now; gone: forgotten."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    readiness: Readiness = memo.readiness
    readiness.seen(PLURAL, namespace, name)
    reconciles: Reconciles = memo.reconciles
    ended = reconciles.observe(KIND, event.get("type"), body["metadata"])  # a late DELETED of an earlier one is not
    if event.get("type") == "DELETED":
        if ended:
            await reconciles.retire(KIND, namespace, name)
        return
    reconciles.soon(KIND, namespace, name)  # its own status too: each step's write brings the next look
