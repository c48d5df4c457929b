"""Prometheus metrics of the operator: reconciles per kind, their duration and errors, and the states
of what it runs (connectors, consumer lag, each consumer sink's figures). Served by `fibers run --metrics-port`.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import Counter, Gauge, Histogram, make_wsgi_app

RECONCILES = Counter("fibers_reconciles_total", "Reconciles of one resource.", ["kind"])
RECONCILE_ERRORS = Counter("fibers_reconcile_errors_total", "Reconciles that raised an error.", ["kind"])
RECONCILE_SECONDS = Histogram(
    "fibers_reconcile_seconds",
    "Time one reconcile took.",
    ["kind"],
    buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
CONNECT_CALLS = Counter("fibers_connect_rest_calls_total", "Calls to Kafka Connect REST APIs.", ["cluster"])
CONNECTOR_STATE = Gauge(
    "fibers_connector_state", "1 for the connector's current state.", ["namespace", "name", "state"]
)
RUNNING_TASKS = Gauge("fibers_connector_running_tasks", "Tasks in the RUNNING state.", ["namespace", "name"])
CONSUMER_LAG = Gauge("fibers_databus_consumer_lag", "Relay records not consumed yet.", ["namespace", "name"])
CONSUMER_EVENTS = Gauge(
    "fibers_databus_events_processed", "Events dispatched by running instances.", ["namespace", "name"]
)

# Each sink of a consumer (spec.sinks, or the one spec.sink), summed over its running instances as they
# record them with their checkpoints: gauges, because an instance that restarts counts from zero again.
SINK_WINDOWS = Gauge(
    "fibers_databus_sink_windows", "Windows the sink applied (running instances).", ["namespace", "name", "sink"]
)
SINK_ERRORS = Gauge(
    "fibers_databus_sink_errors", "Windows or pages the sink failed (ERROR or raised).", ["namespace", "name", "sink"]
)
SINK_TIMEOUTS = Gauge(
    "fibers_databus_sink_timeouts",
    "Batches the sink did not finish in the callback timeout.",
    ["namespace", "name", "sink"],
)
SINK_BATCH_SECONDS = Gauge(
    "fibers_databus_sink_last_batch_seconds", "The sink's last batch, slowest instance.", ["namespace", "name", "sink"]
)

_SINK_GAUGES = (SINK_WINDOWS, SINK_ERRORS, SINK_TIMEOUTS, SINK_BATCH_SECONDS)

# Transform runs, named after the Spark Operator's SparkApplication series (spark_application_*) where
# they mean the same: submitted, succeeded and failed runs, and the execution time of each outcome.
_RUN_BUCKETS = (5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
TRANSFORM_SUBMITS = Counter(
    "fibers_transform_submit_count", "Runs submitted (SparkApplications created).", ["namespace", "name"]
)
TRANSFORM_SUCCESSES = Counter("fibers_transform_success_count", "Runs that completed.", ["namespace", "name"])
TRANSFORM_FAILURES = Counter(
    "fibers_transform_failure_count", "Runs that failed (or missed their submission deadline).", ["namespace", "name"]
)


def _execution_time(outcome: str, what: str) -> Histogram:
    return Histogram(
        f"fibers_transform_{outcome}_execution_time_seconds",
        f"Submission to end of runs that {what}.",
        ["namespace", "name"],
        buckets=_RUN_BUCKETS,
    )


TRANSFORM_SUCCESS_SECONDS = _execution_time("success", "completed")
TRANSFORM_FAILURE_SECONDS = _execution_time("failure", "failed")
TRANSFORM_RECORDS = Gauge(
    "fibers_transform_records_written", "Records the last completed run wrote to its output.", ["namespace", "name"]
)
TRANSFORM_LAST_SUCCESS = Gauge(
    "fibers_transform_last_success_timestamp_seconds",
    "When the last completed run ended (Unix time): `time() - this` is the age of the output.",
    ["namespace", "name"],
)
TRANSFORM_LAST_SCHEDULE = Gauge(
    "fibers_transform_last_schedule_timestamp_seconds",
    "When a scheduled Transform's schedule last fired (Unix time); a run that completes ends after it.",
    ["namespace", "name"],
)
_TRANSFORM_SERIES = (
    TRANSFORM_LAST_SCHEDULE,
    TRANSFORM_SUBMITS,
    TRANSFORM_SUCCESSES,
    TRANSFORM_FAILURES,
    TRANSFORM_SUCCESS_SECONDS,
    TRANSFORM_FAILURE_SECONDS,
    TRANSFORM_RECORDS,
    TRANSFORM_LAST_SUCCESS,
)

# The label values each resource's series were given, so they can go with it: a deleted resource's series
# would otherwise be served forever, and alerts would fire (or stay silent) on things that no longer exist.
_last_state: dict[tuple[str, str], str] = {}
_sinks: dict[tuple[str, str], set[str]] = {}


def _remove(series: Gauge | Counter | Histogram, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set
        series.remove(*labels)


def transform_seen(namespace: str, name: str) -> None:
    """A Transform's run counters exist from its first reconcile, at 0, so `increase()` over them works
    (a counter born at its first failure shows no increase in the window it was born in)."""
    for counter in (TRANSFORM_SUBMITS, TRANSFORM_SUCCESSES, TRANSFORM_FAILURES):
        counter.labels(namespace, name)


def transform_submitted(namespace: str, name: str) -> None:
    TRANSFORM_SUBMITS.labels(namespace, name).inc()


def transform_run_ended(namespace: str, name: str, *, succeeded: bool, seconds: float | None) -> None:
    """A run reached its end (counted once: the reconciler calls this on the transition it wrote)."""
    (TRANSFORM_SUCCESSES if succeeded else TRANSFORM_FAILURES).labels(namespace, name).inc()
    if seconds is not None:
        (TRANSFORM_SUCCESS_SECONDS if succeeded else TRANSFORM_FAILURE_SECONDS).labels(namespace, name).observe(seconds)


def transform_last_success(namespace: str, name: str, *, ended_at: float, records: int | None) -> None:
    """The last completed run, as status shows it (set at every reconcile, so it survives an operator restart)."""
    TRANSFORM_LAST_SUCCESS.labels(namespace, name).set(ended_at)
    if records is not None:
        TRANSFORM_RECORDS.labels(namespace, name).set(records)


def transform_last_schedule(namespace: str, name: str, fired_at: float) -> None:
    TRANSFORM_LAST_SCHEDULE.labels(namespace, name).set(fired_at)


def forget_transform(namespace: str, name: str) -> None:
    """A Transform was deleted: its series go with it."""
    for series in _TRANSFORM_SERIES:
        _remove(series, namespace, name)


def consumer_sinks(namespace: str, name: str, sinks: list[dict[str, Any]]) -> None:
    """Each sink's figures as a DatabusConsumer's status.sinks has them (a sink no longer there loses its series)."""
    names = {str(sink["name"]) for sink in sinks}
    for gone in _sinks.get((namespace, name), set()) - names:
        for gauge in _SINK_GAUGES:
            _remove(gauge, namespace, name, gone)
    _sinks[(namespace, name)] = names
    for sink in sinks:
        labels = (namespace, name, str(sink["name"]))
        SINK_WINDOWS.labels(*labels).set(sink.get("windows", 0))
        SINK_ERRORS.labels(*labels).set(sink.get("errors", 0))
        SINK_TIMEOUTS.labels(*labels).set(sink.get("timeouts", 0))
        SINK_BATCH_SECONDS.labels(*labels).set(sink.get("lastBatchSeconds", 0.0))


def forget_consumer(namespace: str, name: str) -> None:
    """A DatabusConsumer was deleted: its series go with it."""
    consumer_sinks(namespace, name, [])
    _sinks.pop((namespace, name), None)
    _remove(CONSUMER_LAG, namespace, name)
    _remove(CONSUMER_EVENTS, namespace, name)


def forget_connector(namespace: str, name: str) -> None:
    """A Connect was deleted: its series go with it."""
    if state := _last_state.pop((namespace, name), None):
        _remove(CONNECTOR_STATE, namespace, name, state)
    _remove(RUNNING_TASKS, namespace, name)


@contextlib.contextmanager
def reconciling(kind: str) -> Iterator[None]:
    """Count and time one reconcile; an exception is counted and re-raised."""
    RECONCILES.labels(kind).inc()
    with RECONCILE_SECONDS.labels(kind).time(), RECONCILE_ERRORS.labels(kind).count_exceptions():
        yield


def connector_state(namespace: str, name: str, state: str | None, running_tasks: int | None) -> None:
    """Keep one series per connector: the old state's series goes when the state changes."""
    key = (namespace, name)
    previous = _last_state.get(key)
    if previous and previous != state:
        CONNECTOR_STATE.remove(namespace, name, previous)
    if state:
        CONNECTOR_STATE.labels(namespace, name, state).set(1)
        _last_state[key] = state
    if running_tasks is not None:
        RUNNING_TASKS.labels(namespace, name).set(running_tasks)


def declare_kinds(kinds: tuple[str, ...]) -> None:
    """The per-kind reconcile counters exist from the start, at 0: an alert on the rate of errors then
    evaluates to 0, not to "no data", before the first error."""
    for kind in kinds:
        RECONCILES.labels(kind)
        RECONCILE_ERRORS.labels(kind)
        RECONCILE_SECONDS.labels(kind)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never holds up the operator's exit


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes and scrapes every few seconds: not worth a log line each."""


def serve(port: int, kinds: tuple[str, ...] = (), checks: Mapping[str, Callable[[], list[str]]] | None = None) -> None:
    """/metrics, and one route per readiness check (path → what the operator still waits for; see
    fibers.readiness): 200 when the list is empty, else 503, with the list as JSON either way."""
    declare_kinds(kinds)
    metrics = make_wsgi_app()
    routes = dict(checks or {})

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        check = routes.get(environ.get("PATH_INFO", ""))
        if check is None:
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        reasons = check()
        body = json.dumps({"ready": not reasons, "waiting": reasons}).encode()
        status = "503 Service Unavailable" if reasons else "200 OK"
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    server = make_server("", port, app, _Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
