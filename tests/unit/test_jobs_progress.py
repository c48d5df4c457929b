"""A streaming Transform driver's /metrics, from Spark's progress reports as the driver sees them (no Spark)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fibers.jobs.outputs import RowCounter
from fibers.jobs.progress import StreamingMetrics, input_lag


def report(
    *, end: dict[str, Any] | None, latest: dict[str, Any] | None, rows: int = 4, ms: int = 1500
) -> dict[str, Any]:
    """A progress report's fields as PySpark hands them over: a Kafka source's offsets as JSON text."""
    source = {"description": "KafkaV2[Subscribe[shop.orders]]", "numInputRows": rows}
    source["endOffset"] = json.dumps(end) if end is not None else None
    source["latestOffset"] = json.dumps(latest) if latest is not None else None
    return {"durationMs": {"triggerExecution": ms}, "numInputRows": rows, "sources": [source]}


def test_input_lag_is_what_the_topics_hold_beyond_where_the_batch_ended() -> None:
    lagging = report(end={"shop.orders": {"0": 10, "1": 7}}, latest={"shop.orders": {"0": 15, "1": 7}})
    assert input_lag(lagging) == 5
    # A partition the batch has not read from yet counts whole.
    assert input_lag(report(end={"t": {"0": 3}}, latest={"t": {"0": 3, "1": 4}})) == 4
    # A files source has no topics: no lag rather than a made-up 0.
    assert input_lag(report(end={"logOffset": 3}, latest=None)) is None
    assert input_lag({"sources": []}) is None


def test_each_report_counts_once_into_the_drivers_series() -> None:
    metrics = StreamingMetrics("orders-by-item")
    metrics.observe(report(end={"t": {"0": 4}}, latest={"t": {"0": 9}}, rows=4, ms=1500))
    metrics.observe(report(end={"t": {"0": 9}}, latest={"t": {"0": 9}}, rows=5, ms=300))
    samples = {
        (s.name, s.labels.get("le")): s.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in family.samples
        if s.labels.get("name") == "orders-by-item"
    }
    assert samples[("fibers_transform_batches_total", None)] == 2
    assert samples[("fibers_transform_input_rows_total", None)] == 9
    assert samples[("fibers_transform_input_lag_records", None)] == 0  # the second batch caught up
    assert samples[("fibers_transform_batch_duration_seconds_count", None)] == 2
    assert samples[("fibers_transform_batch_duration_seconds_bucket", "0.5")] == 1
    assert samples[("fibers_transform_batch_duration_seconds_bucket", "2.5")] == 2


def test_the_driver_hands_each_report_on_once_however_often_it_reads_the_recent_ones() -> None:
    """Reports reach the counter from the listener and once more from the kept ones after the stop; a report
    already seen is not counted again."""

    def spark_report(at: str, written: int) -> SimpleNamespace:
        return SimpleNamespace(timestamp=at, sink=SimpleNamespace(numOutputRows=written), numInputRows=written)

    seen: list[str] = []
    counter = RowCounter(lambda r: seen.append(r.timestamp))
    first, second = spark_report("2026-11-24T17:00:01.000Z", 4), spark_report("2026-11-24T17:00:02.000Z", 5)
    counter.add([first])  # type: ignore[list-item]
    counter.add([first, second])  # type: ignore[list-item]
    assert seen == [first.timestamp, second.timestamp] and counter.rows == 9
