"""What every MongoDB client of Fibers shares (Transform jobs, consumer sinks, the bootstrap store).

Constants only: the operator itself never talks to MongoDB, and this module imports no driver.
"""

from __future__ import annotations

from typing import Final

# How long a client waits for an unreachable server before the operation fails. Under the consumer's
# default callback timeout (60 s), so an outage fails a window (rolled back and retried) rather than
# hanging it; long enough to ride out a server restart's first seconds.
SELECTION_TIMEOUT_MS: Final = 10_000

# Documents per bulk write: FerretDB v1 (SQLite) stops answering when one bulk replaces ~100 existing
# documents; real MongoDB takes any size.
BULK_LIMIT: Final = 50
