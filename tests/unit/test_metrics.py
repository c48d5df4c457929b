"""The operator's per-resource series follow their resources: set while they exist, gone with them."""

from __future__ import annotations

from prometheus_client import REGISTRY

from fibers import metrics


def series(name: str, resource: str) -> list[dict[str, str]]:
    """The label sets of `name`'s samples about `resource`."""
    return [
        dict(sample.labels)
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.name == name and sample.labels.get("name") == resource
    ]


def test_a_deleted_connects_series_go_with_it() -> None:
    metrics.connector_state("shop", "gone-cdc", "RUNNING", 1)
    metrics.connector_state("shop", "gone-cdc", "FAILED", 0)  # a new state replaces the old one's series
    assert [s["state"] for s in series("fibers_connector_state", "gone-cdc")] == ["FAILED"]
    metrics.forget_connector("shop", "gone-cdc")
    assert series("fibers_connector_state", "gone-cdc") == []
    assert series("fibers_connector_running_tasks", "gone-cdc") == []
    metrics.forget_connector("shop", "gone-cdc")  # twice is harmless


def test_a_deleted_consumers_series_go_with_it_and_a_removed_sink_goes_at_once() -> None:
    metrics.CONSUMER_LAG.labels("shop", "gone-view").set(3)
    metrics.CONSUMER_EVENTS.labels("shop", "gone-view").set(30)
    metrics.consumer_sinks("shop", "gone-view", [{"name": "view", "windows": 5}, {"name": "feed", "windows": 5}])
    assert {s["sink"] for s in series("fibers_databus_sink_windows", "gone-view")} == {"view", "feed"}
    metrics.consumer_sinks("shop", "gone-view", [{"name": "view", "windows": 6}])  # spec.sinks lost "feed"
    assert [s["sink"] for s in series("fibers_databus_sink_timeouts", "gone-view")] == ["view"]
    metrics.forget_consumer("shop", "gone-view")
    for name in ("fibers_databus_consumer_lag", "fibers_databus_events_processed", "fibers_databus_sink_windows"):
        assert series(name, "gone-view") == [], name
