"""kopf handlers for Connect: thin, they only tell the reconciler what changed."""

from __future__ import annotations

from typing import Any

import kopf

from fibers.api import GROUP, VERSION
from fibers.connect.spec import PLURAL
from fibers.connect.sync import ConnectSync


def _sync(memo: Any) -> ConnectSync:
    sync: ConnectSync = memo.connect
    return sync


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def connect_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await _sync(memo).apply(body)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def connect_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await _sync(memo).forget(body)
