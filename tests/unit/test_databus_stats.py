"""Instance figures a consumer pod writes on its checkpoint ConfigMap are read as untrusted input:
bounded, numbers as numbers, only the spec's sinks, and a bad one skipped and named, never raised."""

from __future__ import annotations

import json
from typing import Any

from fibers.databus.stats import STATS_MAX_CHARS, instance_stats, mirror

SINKS = ["view", "history"]


def _status(*figures: Any) -> tuple[dict[str, Any], list[str]]:
    annotations = {f"fibers.dev/stats-{i}": f if isinstance(f, str) else json.dumps(f) for i, f in enumerate(figures)}
    stats, skipped = instance_stats(annotations, len(figures))
    status: dict[str, Any] = {}
    mirror(status, stats, SINKS)
    return status, skipped


def test_figures_of_the_instances_are_summed_per_sink_in_spec_order() -> None:
    one = {"lag": 3, "eventsProcessed": 10, "sinks": [{"name": "history", "windows": 2, "lastBatchSeconds": 0.5}]}
    two = {"lag": 1, "eventsProcessed": 5, "sinks": [{"name": "view", "windows": 4}, {"name": "history", "errors": 1}]}
    status, skipped = _status(one, two)
    assert skipped == []
    assert (status["lag"], status["eventsProcessed"]) == (4, 15)
    assert status["sinks"] == [
        {"name": "view", "windows": 4, "errors": 0, "timeouts": 0, "lastBatchSeconds": 0.0},
        {"name": "history", "windows": 2, "errors": 1, "timeouts": 0, "lastBatchSeconds": 0.5},
    ]


def test_malformed_figures_are_skipped_and_named_not_raised() -> None:
    good = {"lag": 2}
    status, skipped = _status("{not json", "[1, 2]", good)
    assert skipped == ["fibers.dev/stats-0: not JSON", "fibers.dev/stats-1: not a JSON object"]
    assert status["lag"] == 2


def test_an_oversized_annotation_is_not_read() -> None:
    huge = {"lag": 1, "padding": "x" * STATS_MAX_CHARS}
    status, skipped = _status(huge)
    assert skipped == [f"fibers.dev/stats-0: over {STATS_MAX_CHARS} characters"] and status == {}


def test_sink_names_the_spec_does_not_have_never_reach_status_or_metrics() -> None:
    """Each becomes a Prometheus label value: a pod writing new names would grow the series without end."""
    invented = [{"name": f"sink-{i}", "windows": 1} for i in range(100)]
    status, _ = _status({"sinks": [*invented, {"name": "view", "windows": 1}]})
    assert [s["name"] for s in status["sinks"]] == ["view"]


def test_numbers_that_are_not_numbers_count_as_zero() -> None:
    status, skipped = _status({"lag": "lots", "eventsProcessed": -5, "sinks": [{"name": "view", "windows": "x"}]})
    assert skipped == [] and (status["lag"], status["eventsProcessed"]) == (0, 0)
    assert status["sinks"][0]["windows"] == 0
