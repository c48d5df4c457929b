"""Whether a Connect cluster is still starting our connectors' tasks, as its own listing says.

After a wave of creates, or a rebalance, Connect's workers start the connectors and tasks they were given,
one herder thread each; at 5,000 connectors on two workers that took them over 15 minutes, and once a
worker's start of 4,682 of them outran its poll timeout, it left the group and 638 connectors stayed without
a task (connect_scale, issue 46). Meanwhile the sync's topic asks (14,000 in that run) and its periodic
listing with configs (one herder request per connector) only add to Connect's load; neither makes a task
start sooner. So both wait while any of our connectors is listed as not started — the connector
UNASSIGNED, RUNNING without a task, or a task UNASSIGNED — and Connect is making progress: once that number
has not moved for `ConnectPolicy.tasks_starting_patience` seconds (a connector that never gets a task, a
worker gone), they go on as usual.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from fibers.connect.policy import ConnectPolicy
from fibers.connect.rest import ConnectorView


def not_started(view: ConnectorView) -> bool:
    """Connect has not started this connector, or all of its tasks, yet. A paused, stopped or failed one
    is not starting (a stopped connector has no tasks by design)."""
    if view.state == "UNASSIGNED":
        return True
    return view.state == "RUNNING" and (not view.tasks or any(t.state == "UNASSIGNED" for t in view.tasks))


@dataclass
class TasksStarting:
    """Per cluster: how many of our connectors its last listing showed not started, and since when that
    number has not moved."""

    policy: ConnectPolicy
    _count: dict[str, int] = field(default_factory=dict)
    _moved_at: dict[str, float] = field(default_factory=dict)

    def observe(self, cluster: str, listing: dict[str, ConnectorView], ours: Iterable[str], now: float) -> None:
        """Count, in this listing, the connectors named in `ours` that are not started."""
        count = sum(1 for name in ours if (view := listing.get(name)) is not None and not_started(view))
        if count != self._count.get(cluster, 0):
            self._moved_at[cluster] = now
        self._count[cluster] = count

    def holds(self, cluster: str, now: float) -> bool:
        """Whether topic asks and periodic config reads wait: some of ours are starting, and that number
        moved within `tasks_starting_patience` seconds."""
        if not self._count.get(cluster):
            return False
        return now - self._moved_at[cluster] < self.policy.tasks_starting_patience

    def count(self, cluster: str) -> int:
        return self._count.get(cluster, 0)
