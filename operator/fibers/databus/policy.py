"""The DatabusConsumer operator side's tuning: every number its reconciler runs by, with the reason for it.

The consumer pods' own tuning (the relay loop, checkpoints, Leases) is `fibers.consumer.tuning`.
"""

from __future__ import annotations

from typing import Final

# How long the operator waits for a not-ready instance's own answer to /ready (the reason it shows in the
# consumer's condition), and how much of it it reads: an instance that does not answer in time (a
# NetworkPolicy between them, a stalled pod) is counted as not ready without a reason.
READY_ASK_TIMEOUT_SECONDS: Final = 2.0
READY_ANSWER_BYTES: Final = 512

# A seek stops every instance before it drops the checkpoints: it waits this long for their pods to go
# (their grace period is 30 s, and a stopping consumer writes its last checkpoint within it).
SEEK_STOP_WAIT_SECONDS: Final = 60.0
SEEK_STOP_POLL_SECONDS: Final = 0.5
