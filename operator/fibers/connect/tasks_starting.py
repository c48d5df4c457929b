"""Whether a Connect cluster is still starting our connectors' tasks, as its own listing says.

After a wave of creates, or a rebalance, Connect's workers start the connectors and tasks they were given,
one herder thread each; at 5,000 connectors on two workers that took them over 15 minutes, and once a
worker's start of 4,682 of them outran its poll timeout, it left the group and 638 connectors stayed without
a task (connect_scale, issue 46). Meanwhile the sync's topic asks (14,000 in that run) and its periodic
listing with configs (one herder request per connector) only add to Connect's load; neither makes a task
start sooner. So both wait while some of our connectors are listed as not started — the connector
UNASSIGNED, RUNNING without a task, or a task UNASSIGNED — and Connect is getting through them.

A connector that never gets a task (one whose class makes no task configs, a worker gone) must not hold
them back for good, nor again at every later change: once none of the connectors not started has been
first seen, nor any of them started, for `ConnectPolicy.tasks_starting_patience` seconds, those left are
stalled and no longer count, until Connect starts them.
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
class _Cluster:
    waiting: dict[str, float] = field(default_factory=dict)  # not started: when first seen so
    stalled: set[str] = field(default_factory=set)  # not started, and no longer waited for
    progress_at: float = float("-inf")  # when Connect last started one we were waiting for


@dataclass
class TasksStarting:
    """Per cluster: which of our connectors its listings show not started, since when, and when Connect last
    started one of them."""

    policy: ConnectPolicy
    _clusters: dict[str, _Cluster] = field(default_factory=dict)

    def observe(self, cluster: str, listing: dict[str, ConnectorView], ours: Iterable[str], now: float) -> None:
        """Take this listing's word for the connectors named in `ours` (our resources' connectors)."""
        state = self._clusters.setdefault(cluster, _Cluster())
        unstarted = {name for name in ours if (view := listing.get(name)) is not None and not_started(view)}
        started = {name for name in state.waiting if name not in unstarted and name in listing}
        if started:
            state.progress_at = now
        for name in unstarted:
            state.waiting.setdefault(name, now)
        state.waiting = {name: seen for name, seen in state.waiting.items() if name in unstarted}
        state.stalled &= unstarted  # started (or gone): waited for again should it stop
        if not self._moving(state, now):
            state.stalled |= unstarted

    def holds(self, cluster: str, now: float) -> bool:
        """Whether topic asks and periodic config reads wait for Connect to start ours."""
        state = self._clusters.get(cluster)
        return state is not None and self._moving(state, now)

    def count(self, cluster: str) -> int:
        """How many of ours are waited for."""
        state = self._clusters.get(cluster)
        return len(state.waiting.keys() - state.stalled) if state else 0

    def _moving(self, state: _Cluster, now: float) -> bool:
        """Some not stalled are waiting, and one of those was seen first, or one started, within patience."""
        patience = self.policy.tasks_starting_patience
        fresh = [seen for name, seen in state.waiting.items() if name not in state.stalled]
        if not fresh:
            return False
        return now - state.progress_at < patience or now - max(fresh) < patience
