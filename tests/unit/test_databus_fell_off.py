"""A consumer that fell off its relay, with rows in its sinks, is brought back by a bootstrap: the
snapshot has no deleted rows, so the deletes since its last window must come from the store's log."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fibers.consumer.bootstrap import Bootstrap
from fibers.consumer.positions import Positions
from fibers.databus.checkpoint import Checkpoint


class Store:
    """The bootstrap store as `_start` reads it: what it applied per partition, where each log begins."""

    def __init__(self, applied: dict[int, tuple[int, int]], first_logged: dict[int, int]) -> None:
        self.applied, self.first = applied, first_logged

    def applier_state(self, topic: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
        return self.applied

    def first_logged(self, topic: str, partitions: list[int]) -> dict[int, int]:
        return self.first


def start(store: Store, last_window: int | None) -> Checkpoint:
    """The bootstrap checkpoint `_start` writes for timeline t.0 (online at `last_window`, or new)."""
    saved: list[Any] = []
    positions = Positions(SimpleNamespace(save=lambda cps, force=False: saved.append(cps)))  # type: ignore[arg-type]
    if last_window is not None:
        positions.checkpoints["t.0"] = Checkpoint.initial().online(last_window)
    bootstrap = Bootstrap(
        None,  # type: ignore[arg-type]
        positions,
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        low_watermark=lambda topic, partition: 0,
        still_ours=lambda keys: None,
        mask=str,
    )
    cp = bootstrap._start("t", ["t.0"], store, [0])  # type: ignore[arg-type]
    assert saved, "the bootstrap checkpoint is written before anything is delivered"
    return cp


def test_the_catch_up_starts_at_the_last_window_when_the_log_holds_every_change_after_it() -> None:
    """Applied k (SCN 100) and stopped; k deleted at 150; the store has applied up to 200: a catch-up from
    200 never delivered the delete, and the sink kept k for good."""
    cp = start(Store(applied={0: (200, 40)}, first_logged={0: 5}), last_window=100)
    assert (cp.bootstrap_since_scn, cp.bootstrap_start_scn) == (100, 100)


def test_a_log_beginning_after_the_last_window_starts_where_the_store_has_applied() -> None:
    """What the log never held cannot be delivered: the store's own start, as before, and a warning."""
    cp = start(Store(applied={0: (200, 40)}, first_logged={0: 160}), last_window=100)
    assert (cp.bootstrap_since_scn, cp.bootstrap_start_scn) == (100, 200)


def test_a_full_bootstrap_starts_where_the_store_has_applied() -> None:
    cp = start(Store(applied={0: (200, 40)}, first_logged={0: 5}), last_window=None)
    assert (cp.bootstrap_since_scn, cp.bootstrap_start_scn) == (0, 200)
