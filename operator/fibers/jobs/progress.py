"""A streaming Transform's figures, from its query's progress reports, served by the driver on `/metrics`.

Spark reports each micro-batch (`StreamingQuery.recentProgress`): how long it took, the rows it read
and wrote, and for a Kafka source the offsets it ended at and the latest the topics held. The driver
program reads those reports once a second anyway (for the rows it reports when it stops); each new
one also updates these series, which the chart's PodMonitor scrapes from the driver pod (port
`metrics`, the port named in FIBERS_METRICS_PORT by the operator). Prometheus adds the pod's
namespace; `name` is the Transform's, as in the operator's own `fibers_transform_*` series.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_BATCH_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)


def _offsets(raw: Any) -> dict[tuple[str, str], int]:
    """Kafka's source offsets ({"topic": {"partition": offset}}, as JSON text or parsed) per partition;
    empty for another source's offsets (files: {"logOffset": n})."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    if not isinstance(raw, dict):
        return {}
    found = {}
    for topic, partitions in raw.items():
        if not isinstance(partitions, dict):
            return {}
        for partition, offset in partitions.items():
            if isinstance(offset, int):
                found[(str(topic), str(partition))] = offset
    return found


def input_lag(report: Mapping[str, Any]) -> int | None:
    """Records the Kafka sources' topics held beyond where this micro-batch ended (None: no Kafka source
    said where its topics end)."""
    lag, known = 0, False
    for source in report.get("sources") or []:
        latest = _offsets(source.get("latestOffset"))
        if not latest:
            continue
        known = True
        end = _offsets(source.get("endOffset"))
        lag += sum(max(offset - end.get(partition, 0), 0) for partition, offset in latest.items())
    return lag if known else None


class StreamingMetrics:
    """The driver's series of one streaming run, in a registry of its own."""

    def __init__(self, name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = ["name"]
        self._batches = Counter(
            "fibers_transform_batches", "Micro-batches completed.", labels, registry=self.registry
        ).labels(name)
        self._duration = Histogram(
            "fibers_transform_batch_duration_seconds",
            "Time each micro-batch took (Spark's triggerExecution).",
            labels,
            buckets=_BATCH_BUCKETS,
            registry=self.registry,
        ).labels(name)
        self._rows_in = Counter(
            "fibers_transform_input_rows", "Rows the micro-batches read.", labels, registry=self.registry
        ).labels(name)
        self._lag = Gauge(
            "fibers_transform_input_lag_records",
            "Records the Kafka input topics held beyond what the last micro-batch read.",
            labels,
            registry=self.registry,
        ).labels(name)

    def observe(self, report: Mapping[str, Any]) -> None:
        """One new progress report (each is seen once: `outputs.RowCounter` hands on only new ones)."""
        self._batches.inc()
        duration_ms = (report.get("durationMs") or {}).get("triggerExecution")
        if isinstance(duration_ms, int | float):
            self._duration.observe(duration_ms / 1000)
        rows = report.get("numInputRows")
        if isinstance(rows, int) and rows > 0:
            self._rows_in.inc(rows)
        lag = input_lag(report)
        if lag is not None:
            self._lag.set(lag)

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
