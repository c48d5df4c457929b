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


def test_reconcile_counters_of_declared_kinds_are_served_at_zero_before_any_reconcile() -> None:
    """An error-rate alert evaluates to 0 rather than "no data" on an operator that has had no error."""

    def values(series: str, kind: str) -> list[float]:
        return [
            sample.value
            for family in REGISTRY.collect()
            for sample in family.samples
            if sample.name == series and sample.labels.get("kind") == kind
        ]

    assert values("fibers_reconcile_errors_total", "NeverReconciled") == []
    metrics.declare_kinds(("NeverReconciled",))
    assert values("fibers_reconcile_errors_total", "NeverReconciled") == [0.0]
    # The time histogram too: its series do not appear with the first reconcile (nor stay after the last resource).
    assert values("fibers_reconcile_seconds_count", "NeverReconciled") == [0.0]


def test_a_transform_run_is_counted_once_when_it_ends_and_its_series_go_with_the_transform() -> None:
    from fibers.transform.report import RunEnd, last_success, run_ended

    submitted = {"name": "r1", "submittedAt": "2026-11-24T10:00:00Z", "applicationState": "RUNNING"}
    done = {**submitted, "applicationState": "COMPLETED", "finishedAt": "2026-11-24T10:01:30Z", "recordsOut": 42}
    assert run_ended({"currentRun": submitted}, {"currentRun": done}) == RunEnd(True, 90.0)
    assert run_ended({"currentRun": done}, {"currentRun": done}) is None  # the same end, seen again
    failed = {**submitted, "name": "r2", "applicationState": "FAILED"}
    assert run_ended({"currentRun": done}, {"currentRun": failed}) == RunEnd(False, None)  # a new run
    assert run_ended({"currentRun": done}, {"currentRun": {**submitted, "name": "r2"}}) is None
    assert last_success({"currentRun": done}) == (1795514490.0, 42)
    assert last_success({"currentRun": failed}) is None

    metrics.transform_submitted("shop", "gone-report")
    metrics.transform_run_ended("shop", "gone-report", succeeded=True, seconds=90.0)
    metrics.transform_last_success("shop", "gone-report", ended_at=1795514490.0, records=42)
    assert series("fibers_transform_success_count_total", "gone-report") == [
        {"namespace": "shop", "name": "gone-report"}
    ]
    assert series("fibers_transform_records_written", "gone-report")
    metrics.forget_transform("shop", "gone-report")
    for family in REGISTRY.collect():
        for sample in family.samples:
            assert sample.labels.get("name") != "gone-report", sample.name
