"""What a consumer pod serves on `/metrics` (`fibers consume --metrics-port`), for the chart's PodMonitor.

The relay loop handles up to a million events a second, so it does not touch a metric per event: it
keeps plain counters (events, windows per sink, rollbacks) and positions (checkpoints, held
timelines) as it does anyway, and `ConsumerCollector` reads them when Prometheus scrapes. Only two
things are observed as they happen, once per batch rather than per event: the time each callback
took over a batch, and the latency of the batch's last window of each timeline. Everything lives in
a registry of its own, so several runtimes in one process (tests, benchmarks) do not share series.

Every series carries `name` (the DatabusConsumer); Prometheus adds `namespace` and `pod` from the
target, so the operator's series and the pods' join on (namespace, name).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fibers.conditions import format_time
from fibers.consumer.tuning import API_WAIT_UNREADY_SECONDS

MODES = ("INIT", "BOOTSTRAP_SNAPSHOT", "BOOTSTRAP_CATCHUP", "ONLINE_CONSUMPTION")
_CALLBACK_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


@dataclass(frozen=True, slots=True)
class Timeline:
    """One partition this instance consumes, as the scrape sees it."""

    topic: str
    partition: int
    lag: int | None  # records after the checkpoint (None: no position yet, or the high watermark is unknown)
    checkpoint_written: float | None  # Unix time of this process's last write of its checkpoint (or its claim)


@dataclass(frozen=True, slots=True)
class SinkFigures:
    name: str
    windows: int
    errors: int
    timeouts: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The runtime's figures at one moment: read from the scrape's thread, so built from copies."""

    events: int
    mode: str
    sinks: list[SinkFigures]
    timelines: list[Timeline]
    checkpoint_writes: int
    rollbacks: dict[str, int]  # phase (online | bootstrap) → windows or pages rolled back
    attempt: int  # the attempt the failing window or page is at; 0 once one goes through
    undecodable: dict[str, int] = field(
        default_factory=dict
    )  # skipped | deadLettered → relay records passed over (spec.onUndecodable)
    api_waiting_since: float | None = (
        None  # Unix time the API server stopped answering checkpoint writes; None: it answers
    )
    waiting_for: str = ""  # what the instance waits for before it can consume ("": nothing), e.g. its topic


class ConsumerCollector(Collector):
    """Series made at scrape time from a `Snapshot` of the runtime."""

    def __init__(self, name: str, snapshot: Callable[[], Snapshot]) -> None:
        self._name, self._snapshot = name, snapshot

    def collect(self) -> Iterator[Metric]:
        now, s, name = time.time(), self._snapshot(), self._name

        def counter(metric: str, help_: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
            return CounterMetricFamily(f"fibers_consumer_{metric}", help_, labels=["name", *labels])

        def gauge(metric: str, help_: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"fibers_consumer_{metric}", help_, labels=["name", *labels])

        events = counter("events", "Events this instance dispatched (relay and bootstrap).")
        events.add_metric([name], s.events)
        yield events
        windows = counter("windows", "Windows (or bootstrap pages) a sink applied.", ["sink"])
        errors = counter("callback_errors", "Windows or pages a sink failed (ERROR or raised).", ["sink"])
        timeouts = counter("callback_timeouts", "Batches a sink did not finish in the callback timeout.", ["sink"])
        for sink in s.sinks:
            windows.add_metric([name, sink.name], sink.windows)
            errors.add_metric([name, sink.name], sink.errors)
            timeouts.add_metric([name, sink.name], sink.timeouts)
        yield from (windows, errors, timeouts)
        rollbacks = counter("rollbacks", "Windows (online) or pages (bootstrap) rolled back to retry.", ["phase"])
        for phase, count in sorted(s.rollbacks.items()):
            rollbacks.add_metric([name, phase], count)
        yield rollbacks
        attempt = gauge("retry_attempt", "Attempts at the window or page that keeps failing (0: none fails).")
        attempt.add_metric([name], s.attempt)
        yield attempt
        passed = counter("undecodable_records", "Relay records passed over undecoded (spec.onUndecodable).", ["action"])
        for action, count in sorted(s.undecodable.items()):
            passed.add_metric([name, action], count)
        yield passed
        waiting = gauge(
            "api_waiting_seconds", "Seconds the instance has been waiting for the API server to take its checkpoints."
        )
        waiting.add_metric([name], max(now - s.api_waiting_since, 0.0) if s.api_waiting_since else 0.0)
        yield waiting
        writes = counter("checkpoint_writes", "Checkpoint writes to the ConfigMap.")
        writes.add_metric([name], s.checkpoint_writes)
        yield writes
        mode = gauge("mode", "1 for the instance's consumption mode (the earliest of its timelines).", ["mode"])
        for each in MODES:
            mode.add_metric([name, each], 1.0 if each == s.mode else 0.0)
        yield mode
        held = gauge("timelines", "Partitions this instance holds (their Leases).")
        held.add_metric([name], len(s.timelines))
        yield held
        lag = gauge("lag", "Relay records after the checkpoint, per partition.", ["topic", "partition"])
        age = gauge(
            "checkpoint_age_seconds",
            "Seconds since this instance last wrote the partition's checkpoint (or took the partition).",
            ["topic", "partition"],
        )
        for t in s.timelines:
            labels = [name, t.topic, str(t.partition)]
            if t.lag is not None:
                lag.add_metric(labels, t.lag)
            if t.checkpoint_written is not None:
                age.add_metric(labels, max(now - t.checkpoint_written, 0.0))
        yield from (lag, age)


class Telemetry:
    """One consumer instance's metrics: the collector over its snapshots and the two histograms."""

    def __init__(self, name: str, snapshot: Callable[[], Snapshot]) -> None:
        self.name = name
        self.registry = CollectorRegistry(auto_describe=False)
        self.callback_seconds = Histogram(
            "fibers_consumer_callback_seconds",
            "Time one sink took over a batch of windows (or a bootstrap page), its end-of-batch write included.",
            ["name", "sink"],
            buckets=_CALLBACK_BUCKETS,
            registry=self.registry,
        )
        self.window_latency = Histogram(
            "fibers_consumer_window_latency_seconds",
            "From the change's event time at the source (Debezium's ts_ms) to every sink having applied its "
            "window; one observation per timeline and batch, for the batch's last window.",
            ["name"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._latency = self.window_latency.labels(name)
        self.registry.register(ConsumerCollector(name, snapshot))
        self._snapshot = snapshot

    def sink_timer(self, sink: str) -> Callable[[float], None]:
        """`observe` of one sink's callback histogram, looked up once rather than per batch."""
        return self.callback_seconds.labels(self.name, sink).observe

    def applied(self, event_times_ms: Iterable[int]) -> None:
        """Windows applied now whose changes happened at these source times (0: unknown, skipped)."""
        now_ms = time.time() * 1000
        for ts_ms in event_times_ms:
            if ts_ms:
                self._latency.observe(max(now_ms - ts_ms, 0.0) / 1000)

    def serve(self, port: int) -> None:
        """`/metrics` and `/ready` on this port, from a daemon thread (the pod's container port `metrics`)."""
        metrics = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            if environ.get("PATH_INFO") != "/ready":
                return metrics(environ, start_response)  # type: ignore[no-any-return]
            problem = unready(self._snapshot(), time.time())
            start_response("503 Service Unavailable" if problem else "200 OK", [("Content-Type", "text/plain")])
            return [(problem or "ready").encode()]

        server = make_server("", port, app, _ThreadingServer, _Quiet)
        threading.Thread(target=server.serve_forever, name="telemetry", daemon=True).start()


def unready(snapshot: Snapshot, now: float) -> str:
    """Why the instance is not ready ("": it is): it waits for something it needs to start (its relay topic),
    or the API server has not taken its checkpoints for a while.
    Said with the time it began rather than a duration, so the condition the operator makes of it stays put."""
    if snapshot.waiting_for:
        return snapshot.waiting_for
    since = snapshot.api_waiting_since
    if since is not None and now - since >= API_WAIT_UNREADY_SECONDS:
        began = format_time(datetime.fromtimestamp(since, UTC))
        return f"waiting for the API server to take its checkpoints since {began}"
    return ""


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a probe every few seconds is no news
        pass
