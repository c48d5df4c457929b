"""Prometheus metrics of the operator: reconciles per kind, their duration and errors, and the states
of what it runs (connectors, consumer lag, each consumer sink's figures). Served by `fibers run --metrics-port`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

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

# The label values each resource's series were given, so they can go with it: a deleted resource's series
# would otherwise be served forever, and alerts would fire (or stay silent) on things that no longer exist.
_last_state: dict[tuple[str, str], str] = {}
_sinks: dict[tuple[str, str], set[str]] = {}


def _remove(gauge: Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set
        gauge.remove(*labels)


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


def serve(port: int) -> None:
    start_http_server(port)
