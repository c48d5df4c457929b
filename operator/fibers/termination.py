"""The last words of a consumer or driver container: its termination message.

Kubernetes keeps what a container wrote to `/dev/termination-log` in the pod's status
(`state.terminated.message`) after it exits, where the operator reads it and puts it on the
resource's condition: a user sees why a consumer or driver stopped in `kubectl describe`, not an
exit code. The pods also set `terminationMessagePolicy: FallbackToLogsOnError`, so a process that
dies before it can write (an import error, an OOM kill) still leaves the tail of its log.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from fibers.redact import redact

log = logging.getLogger("fibers.termination")

PATH_ENV = "FIBERS_TERMINATION_LOG"  # where to write instead (tests, or a process outside a pod)
DEFAULT_PATH = "/dev/termination-log"
LIMIT = 4096  # bytes: the kubelet keeps at most this much of a termination message
POLICY = "FallbackToLogsOnError"  # the containers' terminationMessagePolicy


last = ""  # the last message written by this process (masked), for a consumer that reports it elsewhere too


def write(message: str, secrets: Iterable[str] = ()) -> None:
    """Record `message` (secrets and URL credentials masked, cut to the kubelet's limit); never raises."""
    global last
    last = redact(message, secrets)
    text = last.encode()
    if len(text) > LIMIT:
        text = text[: LIMIT - 3].decode(errors="ignore").encode() + "…".encode()
    path = os.environ.get(PATH_ENV) or DEFAULT_PATH
    try:
        with open(path, "wb") as out:
            out.write(text)
    except OSError as exc:  # not in a pod (no /dev/termination-log): the log line is all there is
        log.debug("no termination log", extra={"path": path, "error": str(exc)})
