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

# A running instance that is not ready is asked why again this long after its container started, whatever it
# said before: its reason changes while nothing the operator watches does (still starting and silent, then
# "looking up its relay topics", then "relay topic … does not exist yet"), so without these looks the condition
# would keep its first answer until the slow resync. After the last, nothing more is asked (a silent instance:
# a NetworkPolicy between them) and it costs nothing.
UNREADY_INSTANCE_LOOKS_SECONDS: Final = (3.0, 10.0, 30.0, 60.0)
