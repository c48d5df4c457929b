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
# An instance still running after that wait (a kubelet that lost touch, a slow foreground delete) keeps the
# checkpoints in place; the seek looks again this often, each time waiting as above.
SEEK_RECHECK_SECONDS: Final = 30.0

# A running instance that is not ready and does not say why yet (its process still starting, before its /ready
# answers) is asked again this long after its container started: nothing else changes while it waits (for its
# relay topic, say), so without these looks its reason would wait for the slow resync. After the last, the
# instance is taken as silent (a NetworkPolicy between them) and costs nothing more.
SILENT_INSTANCE_LOOKS_SECONDS: Final = (3.0, 10.0, 30.0, 60.0)
