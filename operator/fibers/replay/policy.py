"""A Replay's tuning numbers, in one place."""

from __future__ import annotations

from typing import Final

# A running Replay looks again this often: its steps' status changes are not all events it follows, and a
# Replay is short-lived, so a look every few seconds costs one read of the step being moved.
POLL_SECONDS: Final = 2.0
