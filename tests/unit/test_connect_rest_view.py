"""ConnectorView.from_listing on entries of `GET /connectors?expand=status&expand=info`."""

from __future__ import annotations

from typing import Any

from fibers.connect.rest import ConnectorView, TaskView

TRACE = (
    "org.apache.kafka.connect.errors.ConnectException: Exiting WorkerSinkTask due to unrecoverable exception.\n"
    "\tat org.apache.kafka.connect.runtime.WorkerSinkTask.deliverMessages(WorkerSinkTask.java:636)\n"
)

# One value of the listing, as Kafka Connect returns it (tasks deliberately out of order).
LISTING: dict[str, Any] = {
    "orders-sink": {
        "info": {
            "name": "orders-sink",
            "config": {
                "connector.class": "io.example.OrdersSink",
                "tasks.max": "3",
                "topics": "orders",
                "name": "orders-sink",
            },
            "tasks": [
                {"connector": "orders-sink", "task": 0},
                {"connector": "orders-sink", "task": 1},
                {"connector": "orders-sink", "task": 2},
            ],
            "type": "sink",
        },
        "status": {
            "name": "orders-sink",
            "connector": {"state": "RUNNING", "worker_id": "10.0.0.7:8083"},
            "tasks": [
                {"id": 2, "state": "RUNNING", "worker_id": "10.0.0.8:8083"},
                {"id": 0, "state": "RUNNING", "worker_id": "10.0.0.7:8083"},
                {"id": 1, "state": "FAILED", "worker_id": "10.0.0.8:8083", "trace": TRACE},
            ],
            "type": "sink",
        },
    }
}


def test_from_listing_reads_a_full_entry() -> None:
    view = ConnectorView.from_listing("orders-sink", LISTING["orders-sink"])
    assert view == ConnectorView(
        name="orders-sink",
        config={
            "connector.class": "io.example.OrdersSink",
            "tasks.max": "3",
            "topics": "orders",
            "name": "orders-sink",
        },
        state="RUNNING",
        worker_id="10.0.0.7:8083",
        trace="",
        type="sink",
        tasks=(
            TaskView(0, "RUNNING", "10.0.0.7:8083", ""),
            TaskView(1, "FAILED", "10.0.0.8:8083", TRACE),
            TaskView(2, "RUNNING", "10.0.0.8:8083", ""),
        ),
    )


def test_tasks_are_sorted_by_id() -> None:
    view = ConnectorView.from_listing("orders-sink", LISTING["orders-sink"])
    assert [t.id for t in view.tasks] == [0, 1, 2]
    assert view.tasks[1].trace == TRACE


def test_failed_connector_keeps_its_trace() -> None:
    entry = {
        "info": {"name": "c", "config": {"name": "c"}, "tasks": [], "type": "source"},
        "status": {
            "name": "c",
            "connector": {"state": "FAILED", "worker_id": "w:8083", "trace": "java.lang.RuntimeException: x"},
            "tasks": [],
            "type": "source",
        },
    }
    view = ConnectorView.from_listing("c", entry)
    assert (view.state, view.worker_id, view.trace, view.type, view.tasks) == (
        "FAILED",
        "w:8083",
        "java.lang.RuntimeException: x",
        "source",
        (),
    )


def test_non_string_config_values_become_strings() -> None:
    view = ConnectorView.from_listing("c", {"info": {"config": {"tasks.max": 2, "flag": "true"}}})
    assert view.config == {"tasks.max": "2", "flag": "true"}


def test_missing_status_defaults() -> None:
    entry = {"info": {"name": "c", "config": {"name": "c"}, "tasks": [], "type": "sink"}}
    view = ConnectorView.from_listing("c", entry)
    assert view == ConnectorView(name="c", config={"name": "c"}, state="UNASSIGNED", type="sink")
    assert (view.worker_id, view.trace, view.tasks) == ("", "", ())


def test_missing_fields_inside_status_default() -> None:
    entry = {
        "info": {"name": "c", "config": {}, "type": "sink"},
        "status": {"name": "c", "connector": {}, "tasks": [{"id": 0}]},
    }
    view = ConnectorView.from_listing("c", entry)
    assert view.state == "UNASSIGNED"
    assert view.worker_id == ""
    assert view.type == "sink"  # taken from info when status has none
    assert view.tasks == (TaskView(0, "UNASSIGNED", "", ""),)


def test_null_parts_and_empty_entry_default() -> None:
    assert ConnectorView.from_listing("c", {"info": None, "status": None}) == ConnectorView(
        name="c", config={}, state="UNASSIGNED"
    )
    assert ConnectorView.from_listing("c", {}) == ConnectorView(name="c", config=None, state="UNASSIGNED")


def test_a_listing_without_configs_never_asks_for_a_config_update() -> None:
    """Statuses alone (the cheap listing) say nothing about the config: no PUT, and Ready stands."""
    from datetime import UTC, datetime

    from fibers.connect import reconcile
    from fibers.connect.reconcile import Outcome, Target
    from fibers.connect.spec import parse

    spec = parse({"class": "FileStreamSource", "config": {"file": "/f", "topic": "t"}}, "c")
    target = Target(
        "ns", "c", "uid", 1, spec, config=spec.full_config({}, "ns/c"), claimed=True, connector_owner="ns/c"
    )
    entry: dict[str, Any] = {"status": {"connector": {"state": "RUNNING"}, "tasks": [{"id": 0, "state": "RUNNING"}]}}
    running = ConnectorView.from_listing(spec.connector, entry)
    now = datetime.now(UTC)
    assert reconcile.decide(target, running, now) == []
    status = reconcile.report(target, running, Outcome(), now)
    assert status["phase"] == "Running" and status["conditions"][0]["status"] == "True"
    drifted = ConnectorView.from_listing(spec.connector, {**entry, "info": {"config": {"file": "/x"}}})
    assert reconcile.decide(target, drifted, now) == [reconcile.Step.UPDATE_CONFIG]


def test_status_type_wins_over_info_type() -> None:
    entry = {"info": {"type": "unknown"}, "status": {"type": "source", "connector": {"state": "RUNNING"}}}
    assert ConnectorView.from_listing("c", entry).type == "source"


def test_only_kafka_connects_own_errors_are_connect_errors() -> None:
    """A worker starting or stopping serves a bare 404 page for every path: that is no "not found"."""
    from fibers.connect.rest import ConnectError, ConnectUnreachable, Reply, error_from

    own = error_from("http://c:8083", Reply(404, b'{"error_code":404,"message":"Connector x not found"}'))
    assert isinstance(own, ConnectError) and (own.status_code, own.message) == (404, "Connector x not found")
    jetty = (
        b"<html><head><title>Error 404 Not Found</title></head><body><h2>HTTP ERROR 404 Not Found</h2></body></html>"
    )
    starting = error_from("http://c:8083", Reply(404, jetty))
    assert isinstance(starting, ConnectUnreachable) and "HTTP 404" in str(starting)
    assert isinstance(error_from("http://c:8083", Reply(502, b"Bad Gateway")), ConnectUnreachable)
    rebalance = error_from("http://c:8083", Reply(409, b'{"error_code":409,"message":"rebalance"}'))
    assert isinstance(rebalance, ConnectError) and rebalance.rebalancing
