"""Records cut into windows, one open window per timeline (pure: no I/O).

A window is one source transaction of one timeline (topic, partition), or one record outside any
transaction. Kafka hands the consumer records of several partitions interleaved as its fetches
return them, so another timeline's record says nothing about this one's transaction: each timeline
keeps its own open window, which ends when the timeline's next transaction begins, when it reaches
`max_events`, or when the timeline has been quiet for `quiet` seconds (Debezium writes a
transaction's events together, so its silence means the transaction is complete).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fibers.consumer.callbacks import Singles
from fibers.consumer.events import ChangeEvent

Timeline = tuple[str, int]  # (topic, partition)


@dataclass(slots=True)
class _Open:
    """A timeline's window still being read, and when it last grew (to tell its silence)."""

    window: str | int
    events: list[ChangeEvent]
    size_seen: int = 0
    grew_at: float = 0.0


class Windows:
    """The open windows of every timeline; complete windows are appended to the caller's `ready` list."""

    def __init__(self, max_events: int, quiet: float) -> None:
        self.max_events, self.quiet = max_events, quiet
        self._open: dict[Timeline, _Open] = {}

    def __bool__(self) -> bool:
        """True while a transaction is open: the relay waits only a short silence for its rest."""
        return bool(self._open)

    def cut(self, events: Iterable[ChangeEvent], ready: list[list[ChangeEvent]]) -> None:
        """Add a poll's decoded events in order. The hot loop: one dict lookup per record."""
        open_, limit = self._open, self.max_events
        singles: Singles | None = ready[-1] if ready and ready[-1].__class__ is Singles else None
        for event in events:
            if event.window.__class__ is int:  # a record of its own (no transaction): a whole window
                if open_ and (current := open_.pop((event.topic, event.partition), None)) is not None:
                    ready.append(current.events)
                    singles = None
                if singles is None:
                    singles = Singles()
                    ready.append(singles)
                singles.append(event)
                continue
            timeline = (event.topic, event.partition)
            current = open_.get(timeline)
            if current is not None and current.window == event.window and len(current.events) < limit:
                current.events.append(event)
            else:
                if current is not None:
                    ready.append(current.events)
                    singles = None
                open_[timeline] = _Open(event.window, [event])

    def close_quiet(self, now: float, ready: list[list[ChangeEvent]], *, relay_quiet: bool) -> None:
        """End the windows whose timeline has been quiet for `quiet` seconds, or every one when the whole
        relay just was (the poll that returned nothing waited that long)."""
        for timeline, current in list(self._open.items()):
            if relay_quiet or (len(current.events) == current.size_seen and now - current.grew_at >= self.quiet):
                ready.append(current.events)
                del self._open[timeline]
            elif len(current.events) != current.size_seen:
                current.size_seen, current.grew_at = len(current.events), now

    def drop(self, timelines: Iterable[Timeline]) -> None:
        """Forget the open windows of timelines read again from their checkpoint (rolled back, or taken
        by another instance): their records come again."""
        for timeline in timelines:
            self._open.pop(timeline, None)
