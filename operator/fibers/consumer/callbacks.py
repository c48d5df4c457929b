"""The Databus consumer callback API, in Python.

A consumer implements any of these methods; each returns a Result. The dispatcher calls them in
the Databus order: start consumption, then per window start sequence → start source → data
events → end source → end sequence → checkpoint; rollback when a window is replayed; error
when something failed. Bootstrap has the same calls with `bootstrap` in their name.
"""

from __future__ import annotations

import enum
import pkgutil
from collections.abc import Callable
from typing import Any

from fibers import failpoints
from fibers.consumer.events import ChangeEvent


class Result(enum.Enum):
    SUCCESS = "SUCCESS"
    CHECKPOINT = "CHECKPOINT"  # success, and persist the checkpoint now (ignore the throttle)
    SKIP_CHECKPOINT = "SKIP_CHECKPOINT"  # success, but do not persist a checkpoint for this window
    ERROR = "ERROR"  # roll back to the last checkpoint and replay


class Callback:
    """Base class: every callback succeeds unless overridden."""

    def on_start_consumption(self) -> Result:
        return Result.SUCCESS

    def on_stop_consumption(self) -> Result:
        return Result.SUCCESS

    def on_start_data_event_sequence(self, scn: int) -> Result:
        return Result.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> Result:
        return Result.SUCCESS

    def on_start_source(self, source: str) -> Result:
        return Result.SUCCESS

    def on_end_source(self, source: str) -> Result:
        return Result.SUCCESS

    def on_data_event(self, event: ChangeEvent) -> Result:
        return Result.SUCCESS

    def on_checkpoint(self, scn: int) -> Result:
        return Result.SUCCESS

    def on_rollback(self, scn: int) -> Result:
        return Result.SUCCESS

    def on_error(self, error: BaseException) -> Result:
        return Result.SUCCESS

    def on_timelines_taken(self, timelines: list[str]) -> Result:
        """This instance now consumes these timelines (keys "topic.partition"), taken at start or from another
        instance (a rescale, a Lease lost and won back). Not in Databus, which has one consumer per
        source: whatever a callback remembers of the keys it writes may be stale now, since another
        instance may have written them since, and must be forgotten."""
        return Result.SUCCESS

    # Bootstrap twins: the snapshot and catchup phases deliver through these.
    def on_start_bootstrap(self) -> Result:
        return Result.SUCCESS

    def on_stop_bootstrap(self) -> Result:
        return Result.SUCCESS

    def on_start_bootstrap_sequence(self, scn: int) -> Result:
        return Result.SUCCESS

    def on_end_bootstrap_sequence(self, scn: int) -> Result:
        return Result.SUCCESS

    def on_bootstrap_event(self, event: ChangeEvent) -> Result:
        return self.on_data_event(event)

    def on_bootstrap_checkpoint(self, scn: int) -> Result:
        return Result.SUCCESS

    def on_bootstrap_rollback(self, scn: int) -> Result:
        return Result.SUCCESS

    def on_bootstrap_error(self, error: BaseException) -> Result:
        return Result.SUCCESS

    def close(self) -> None:
        """Release connections; called once when the consumer stops."""


Hook = Callable[[Any], Result]


class WindowSink(Callback):
    """Buffers complete windows; subclasses write them in `flush`, once per dispatched batch.

    The runtime hands the callbacks several complete windows at a time and calls `on_end_batch`
    after the last one succeeded; only then may their checkpoints move. A window that fails is
    dropped from the buffer (`on_rollback`), and the windows before it are still written.
    """

    def __init__(self) -> None:
        self.window: list[ChangeEvent] = []
        self.completed: list[ChangeEvent] = []

    def on_start_data_event_sequence(self, scn: int) -> Result:
        self.window = []
        return Result.SUCCESS

    def on_data_event(self, event: ChangeEvent) -> Result:
        self.window.append(event)
        return Result.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> Result:
        self.completed.extend(self.window)
        self.window = []
        return Result.SUCCESS

    def on_rollback(self, scn: int) -> Result:
        self.window = []
        return Result.SUCCESS

    on_start_bootstrap_sequence = on_start_data_event_sequence
    on_end_bootstrap_sequence = on_end_data_event_sequence
    on_bootstrap_rollback = on_rollback

    # The failpoints around this sink's writes (fibers.failpoints), and what its client raises when the
    # server is away: a test makes the real write fail, hang, or the process die just after it.
    failpoint: str = "sink.write"
    failpoint_error: type[Exception] = RuntimeError

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls.failpoint_done = f"{cls.failpoint}.done"  # named once, not per batch

    failpoint_done = "sink.write.done"

    def on_end_batch(self) -> None:
        """Write every complete window received since the last batch (raises on failure)."""
        events, self.completed = self.completed, []
        if events:
            failpoints.hit(self.failpoint, self.failpoint_error)
            self.flush(events)
            failpoints.hit(self.failpoint_done, self.failpoint_error)

    def flush(self, events: list[ChangeEvent]) -> None:
        raise NotImplementedError


class Singles(list[ChangeEvent]):
    """Consecutive records that are each a window of their own (records outside any source transaction).

    The consumer keeps such records in one list rather than a list each: at a hundred thousand records
    a second, building and dispatching a one-record window cost more than the record's own callbacks.
    """


WindowDispatcher = Callable[[list[ChangeEvent], list[Result]], None]


class WindowFailed(Exception):
    """A callback returned ERROR (or raised): the window is rolled back and replayed."""


def _own(callback: Callback, name: str) -> Hook | None:
    """The callback's own method, or None when it keeps the base one (which only returns SUCCESS)."""
    method = getattr(callback, name)
    return None if getattr(method, "__func__", None) is getattr(Callback, name) else method


def window_dispatcher(callback: Callback) -> WindowDispatcher:
    """A function that runs windows through the callback in the Databus call order.

    It takes a window, or a `Singles` run (a window per record), and appends to `results` one Result
    per window it completes; at the first window that fails it raises (WindowFailed when a callback
    returned ERROR), so `results` says how many windows are done. Built once per consumer, it leaves
    out the callbacks the consumer does not implement (the base ones only return SUCCESS, so nobody
    can tell): calling six do-nothing methods per single-record window would cost more than the rest
    of the dispatch.
    """
    start_sequence, end_sequence = (
        _own(callback, "on_start_data_event_sequence"),
        _own(callback, "on_end_data_event_sequence"),
    )
    start_source, end_source = _own(callback, "on_start_source"), _own(callback, "on_end_source")
    on_event, on_checkpoint = _own(callback, "on_data_event"), _own(callback, "on_checkpoint")

    def events(window: list[ChangeEvent]) -> None:
        if on_event is not None:
            for event in window:
                if on_event(event) is Result.ERROR:
                    raise WindowFailed(f"on_data_event returned ERROR at offset {event.offset}")

    if not (start_sequence or end_sequence or start_source or end_source or on_checkpoint):

        def only_events(window: list[ChangeEvent], results: list[Result]) -> None:
            if window.__class__ is not Singles:
                events(window)
                results.append(Result.SUCCESS)
            elif on_event is None:
                results.extend([Result.SUCCESS] * len(window))
            else:
                try:
                    for event in window:  # the hot loop of a consumer of plain records: keep it lean
                        if on_event(event) is Result.ERROR:
                            raise WindowFailed(f"on_data_event returned ERROR at offset {event.offset}")
                except Exception:
                    results.extend([Result.SUCCESS] * window.index(event))  # the records before it are done
                    raise
                results.extend([Result.SUCCESS] * len(window))

        return only_events

    def one(window: list[ChangeEvent]) -> Result:
        scn, source = window[-1].scn, window[0].topic
        for name, hook, arg in (
            ("on_start_data_event_sequence", start_sequence, scn),
            ("on_start_source", start_source, source),
        ):
            if hook is not None and hook(arg) is Result.ERROR:
                raise WindowFailed(f"{name} returned ERROR")
        events(window)
        for name, hook, arg in (
            ("on_end_source", end_source, source),
            ("on_end_data_event_sequence", end_sequence, scn),
            ("on_checkpoint", on_checkpoint, scn),
        ):
            result = hook(arg) if hook is not None else Result.SUCCESS
            if result is Result.ERROR:
                raise WindowFailed(f"{name} returned ERROR")
        return result

    def whole(window: list[ChangeEvent], results: list[Result]) -> None:
        if window.__class__ is Singles:
            for event in window:
                results.append(one([event]))
        else:
            results.append(one(window))

    return whole


def call(hook: Callable[..., Result], *args: Any) -> Result:
    """One callback; ERROR raises WindowFailed naming it."""
    result = hook(*args)
    if result is Result.ERROR:
        raise WindowFailed(f"{hook.__name__} returned ERROR")
    return result


def end_batch(callback: Callback) -> None:
    """Let a buffered sink (sinks.WindowSink) write the windows it completed; raises when it cannot."""
    hook = getattr(callback, "on_end_batch", None)
    if hook is not None:
        hook()


def bootstrap_page(
    callback: Callback, events: list[ChangeEvent], scn: int, abandoned: Callable[[], bool] = lambda: False
) -> None:
    """A bootstrap page (snapshot rows or logged changes) in the Databus bootstrap call order, then a buffered
    sink writes it. `abandoned` is asked after each row: when it says so the page stops (the runtime's
    callback driver gave up on this thread, and a replay delivers the page)."""
    call(callback.on_start_bootstrap_sequence, scn)
    for event in events:
        call(callback.on_bootstrap_event, event)
        if abandoned():
            raise TimeoutError("abandoned after the timeout")
    call(callback.on_end_bootstrap_sequence, scn)
    end_batch(callback)
    call(callback.on_bootstrap_checkpoint, scn)


def load(spec: str, options: dict[str, Any]) -> Callback:
    """A user callback given as "package.module:Class", constructed with the sink options.

    The class is checked before it is built: any class of the image can be named, and building one runs its
    code with the spec's options (`subprocess:Popen` would run the spec's command)."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"callback must look like package.module:Class, got {spec!r}")
    cls = pkgutil.resolve_name(spec)
    if not (isinstance(cls, type) and issubclass(cls, Callback)):
        raise TypeError(f"{spec} must subclass fibers.consumer.callbacks.Callback")
    instance: Callback = cls(**options)
    return instance
