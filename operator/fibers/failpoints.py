"""Named fault-injection points, armed by tests and free when they are not (as etcd's gofail).

Code at an I/O boundary calls `hit("mongo.write")` just before the call that may fail, and
`hit("mongo.write.done")` just after it returned. Unarmed — always, in production — `hit` reads one
module global and returns. A test arms points through the `FIBERS_FAILPOINTS` environment variable of
the process it starts (or `arm()` in its own process); everything else keeps talking to the real
servers, so a fault goes through the same handling a real one would.

A spec is `point=action;point=action…`; an action is `[skip+][count*]kind[(argument)]`:

- `error`: raise the exception the boundary raises for a real failure (the caller names it), or
  FailpointError;
- `sleep(seconds)`: wait, then go on (a slow server);
- `hang(seconds)`: the same with a long default (3600 s): a server that never answers;
- `kill`: SIGKILL this process (a node gone, a pod deleted with no grace).

`skip+` lets that many hits pass first; `count*` fires that many times, then the point is off again
(no count: every hit). Example: `checkpoint.write=2+3*error;kafka.produce.done=kill`.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("fibers.failpoints")
ENV = "FIBERS_FAILPOINTS"
HANG_SECONDS = 3600.0  # `hang` without an argument: longer than any timeout a test waits out
_ACTION = re.compile(r"^(?:(\d+)\+)?(?:(\d+)\*)?(error|sleep|hang|kill)(?:\(([0-9.]+)\))?$")


class FailpointError(RuntimeError):
    """The failure an armed point raises when its boundary names no exception of its own."""


@dataclass
class _Action:
    kind: str
    argument: float | None
    skip: int
    count: int | None  # None: fire at every hit

    def due(self) -> bool:
        """Count one hit; whether this one fires."""
        if self.skip > 0:
            self.skip -= 1
            return False
        if self.count is None:
            return True
        if self.count <= 0:
            return False
        self.count -= 1
        return True


def parse(spec: str) -> dict[str, _Action]:
    """Point name → action, from a spec (ValueError naming the part that is not one)."""
    actions: dict[str, _Action] = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, action = part.partition("=")
        match = _ACTION.match(action.strip())
        if not name.strip() or match is None:
            raise ValueError(f"{ENV}: {part!r} is not point=[skip+][count*]error|sleep(s)|hang(s)|kill")
        skip, count, kind, argument = match.groups()
        actions[name.strip()] = _Action(
            kind, float(argument) if argument else None, int(skip or 0), int(count) if count else None
        )
    return actions


_armed: dict[str, _Action] = parse(os.environ.get(ENV, ""))
_lock = threading.Lock()
fired: dict[str, int] = {}  # point → times it fired in this process (tests read it)


def arm(spec: str) -> None:
    """Arm points in this process (replacing any armed before); `arm("")` disarms every point."""
    global _armed
    with _lock:
        _armed = parse(spec)
        fired.clear()


Raises = Callable[[str], BaseException]  # an exception type, or a function making one, from a message


def hit(name: str, error: Raises | None = None) -> None:
    """Pass the point `name`: nothing unless a test armed it. `error` makes the exception the boundary
    raises on a real failure, from a message."""
    if not _armed:
        return
    _fire(name, error)


def _fire(name: str, error: Raises | None) -> None:
    with _lock:
        action = _armed.get(name)
        if action is None or not action.due():
            return
        fired[name] = fired.get(name, 0) + 1
    log.warning("failpoint fired", extra={"point": name, "action": action.kind})  # what a test reads back
    if action.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action.kind in ("sleep", "hang"):
        time.sleep(action.argument if action.argument is not None else HANG_SECONDS)
        return
    raise (error or FailpointError)(f"failpoint {name}: injected failure")
