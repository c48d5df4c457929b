"""kopf handler for Connect: thin, it only passes each watch event to the sync loop."""

from __future__ import annotations

from typing import Any

import kopf

from fibers.api import GROUP, VERSION
from fibers.connect.spec import PLURAL
from fibers.connect.sync import ConnectSync


@kopf.on.event(GROUP, VERSION, PLURAL)
async def connect_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Creations, changes, deletions and the listing at start-up alike: the loop is level-triggered."""
    sync: ConnectSync = memo.connect
    await sync.observe(event.get("type"), body)
