"""The Databus consumer callback API, in Python.

A consumer implements any of these methods; each returns a Result. The dispatcher calls them in
the Databus order: start consumption, then per window start sequence → start source → data
events → end source → end sequence → checkpoint; rollback when a window is replayed; error
when something failed. Bootstrap has the same calls with `bootstrap` in their name.
"""

from __future__ import annotations

import enum
import importlib
from typing import Any

from fibers.databus.events import ChangeEvent


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


def load(spec: str, options: dict[str, Any]) -> Callback:
    """A user callback given as "package.module:Class", constructed with the sink options."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"callback must look like package.module:Class, got {spec!r}")
    cls = getattr(importlib.import_module(module_name), class_name)
    instance = cls(**options)
    if not isinstance(instance, Callback):
        raise TypeError(f"{spec} must subclass fibers.databus.callbacks.Callback")
    return instance
