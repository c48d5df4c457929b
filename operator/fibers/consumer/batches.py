"""A batch of windows handed to the sinks at once: what each sink did with it, and where the checkpoints
may move to (pure: no I/O)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from fibers.consumer.callbacks import Result, Singles
from fibers.consumer.events import ChangeEvent


@dataclass(slots=True)
class BatchOutcome:
    """What the callback threads did with a batch of windows."""

    applied: list[list[ChangeEvent]] = field(default_factory=list)  # windows dispatched successfully, in order
    pending: list[list[ChangeEvent]] = field(default_factory=list)  # from the failed window on (to read again)
    last: dict[tuple[str, int], ChangeEvent] = field(default_factory=dict)  # per timeline, to checkpoint at
    force: bool = False  # a callback asked for CHECKPOINT: write now, ignoring the throttle
    error: BaseException | None = None  # what stopped the batch (the window `failed`)

    @property
    def failed(self) -> list[ChangeEvent]:
        """The window that failed: the first pending one (of a Singles run, its first record)."""
        first = self.pending[0]
        return [first[0]] if first.__class__ is Singles else first

    @classmethod
    def of(
        cls, windows: list[list[ChangeEvent]], results: list[Result], error: BaseException | None, timelines: int
    ) -> BatchOutcome:
        """Split the batch where the results end (inside a Singles run, if that is where a record failed)
        and find each timeline's last window to checkpoint at, walking back only until every timeline has one."""
        applied, pending, position = windows, [], 0
        for index, window in enumerate(windows):
            size = len(window) if window.__class__ is Singles else 1
            if position + size > len(results):
                cut = len(results) - position
                applied = [*windows[:index], *([Singles(window[:cut])] if cut else [])]
                pending = [Singles(window[cut:]) if cut else window, *windows[index + 1 :]]
                break
            position += size
        last: dict[tuple[str, int], ChangeEvent] = {}
        for event, result in window_ends_backwards(applied, results):
            if result is not Result.SKIP_CHECKPOINT:
                last.setdefault((event.topic, event.partition), event)
                if len(last) >= timelines:
                    break
        return cls(applied, pending, last, Result.CHECKPOINT in results, error)


def window_starts(windows: list[list[ChangeEvent]]) -> Iterator[ChangeEvent]:
    """Each window's first event (of a Singles run, every event: each is a window of its own)."""
    for window in windows:
        if window.__class__ is Singles:
            yield from window
        else:
            yield window[0]


def window_ends_backwards(
    windows: list[list[ChangeEvent]], results: list[Result]
) -> Iterator[tuple[ChangeEvent, Result]]:
    """Each window's last event with the window's result, the last window first."""
    index = len(results)
    for window in reversed(windows):
        if window.__class__ is Singles:
            for event in reversed(window):
                index -= 1
                yield event, results[index]
        else:
            index -= 1
            yield window[-1], results[index]


def stricter(a: Result, b: Result) -> Result:
    """Two callbacks' results for one window: skipping a checkpoint wins, then asking for one."""
    for result in (Result.SKIP_CHECKPOINT, Result.CHECKPOINT):
        if result in (a, b):
            return result
    return Result.SUCCESS


@dataclass(slots=True)
class Progress:
    """The run's figures, shared by the relay, the bootstrap and the metrics: events dispatched, windows
    or pages rolled back, and the attempt the failing one is at."""

    events: int = 0
    rollbacks: dict[str, int] = field(default_factory=lambda: {"online": 0, "bootstrap": 0})
    attempt: int = 0  # 0: the last window or page went through
