"""decide() and report() for the Connect kind: pure functions over a Target and an observed ConnectorView."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fibers.conditions import READY, RECONCILING, STALLED, Condition, find, format_time
from fibers.connect.offsets import (
    OffsetsInputError,
    OffsetsRequest,
    request_for,
    request_from,
    sink_offsets,
    sink_topics,
    snapshot_signal,
)
from fibers.connect.offsets import parse as parse_offsets
from fibers.connect.offsets import render as render_offsets
from fibers.connect.reconcile import (
    UNASSIGNED_GRACE,
    Outcome,
    Step,
    Target,
    decide,
    report,
    significant,
)
from fibers.connect.rest import ConnectorView, TaskView
from fibers.connect.spec import SpecError, parse
from fibers.kafka_positions import Position
from fibers.kafka_positions import describe as describe_positions
from fibers.startfrom import StartFrom, parse_time

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
CLUSTER = "connect-a"
WORKER = "10.0.0.7:8083"
SECRET = "pa55w0rd-xyz"


def _target(*, owned: bool = True, status: dict[str, Any] | None = None, **spec_fields: Any) -> Target:
    spec = parse(
        {
            "cluster": CLUSTER,
            "class": "io.example.OrdersSink",
            "config": {"topics": "orders", "batch.size": 100},
            "secretConfig": {"db.password": {"secretKeyRef": {"name": "db", "key": "password"}}},
            **spec_fields,
        },
        "orders",
    )
    return Target(
        namespace="ns1",
        name="orders",
        uid="0b6c-uid",
        generation=4,
        spec=spec,
        config=spec.full_config({"db.password": SECRET}, "ns1/orders"),
        secrets=(SECRET,),
        status=dict(status or {}),
        claimed=owned,
        connector_owner="ns1/orders" if owned else None,
        cluster=CLUSTER,
        placed=True,
    )


def _task(id_: int = 0, state: str = "RUNNING", trace: str = "", worker: str = WORKER) -> TaskView:
    return TaskView(id_, state, worker, trace)


def _view(
    target: Target,
    *,
    state: str = "RUNNING",
    tasks: tuple[TaskView, ...] | None = None,
    config: dict[str, str] | None = None,
    trace: str = "",
) -> ConnectorView:
    assert target.spec is not None
    return ConnectorView(
        name=target.spec.connector,
        config=dict(target.config) if config is None else config,
        state=state,
        worker_id=WORKER,
        trace=trace,
        type="sink",
        tasks=(_task(),) if tasks is None else tasks,
    )


def _cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    cond = find(status["conditions"], type_)
    assert cond is not None, f"no {type_} condition in {status['conditions']}"
    return cond


def _failed_task(trace: str = "org.apache.kafka.connect.errors.ConnectException: boom\n\tat X.y(X.java:1)") -> TaskView:
    return _task(0, "FAILED", trace)


def _restarted(count: int, ago: timedelta) -> dict[str, Any]:
    return {"autoRestart": {"count": count, "lastRestartTime": format_time(NOW - ago)}}


# ----- decide --------------------------------------------------------------------------------------


def test_absent_connector_is_created() -> None:
    assert decide(_target(owned=False), None, NOW) == [Step.CREATE]


def test_connector_in_sync_needs_nothing() -> None:
    target = _target()
    assert decide(target, _view(target), NOW) == []


def test_someone_elses_connector_is_not_touched() -> None:
    target = _target(owned=False)
    drifted = _view(target, state="PAUSED", config={"name": "orders", "connector.class": "Other"})
    assert decide(target, drifted, NOW) == []

    status = report(target, drifted, Outcome(), NOW)
    ready, stalled = _cond(status, READY), _cond(status, STALLED)
    assert (ready["status"], ready["reason"]) == ("False", "ConnectorNotOwned")
    assert (stalled["status"], stalled["reason"]) == ("True", "ConnectorNotOwned")
    assert _cond(status, RECONCILING)["status"] == "False"
    assert "connectorName" not in status
    assert "connectorState" not in status
    assert "tasks" not in status
    assert "autoRestart" not in status


def test_connector_reported_in_status_but_not_claimed_is_not_touched() -> None:
    """Ownership is the claim on the resource, not a name in its status (anyone may write status)."""
    target = _target(owned=False, status={"connectorName": "orders"})
    assert not target.owned
    assert decide(target, _view(target, config={}), NOW) == []


def test_config_drift_updates_config() -> None:
    target = _target()
    drifted = {**target.config, "batch.size": "500"}
    assert decide(target, _view(target, config=drifted), NOW) == [Step.UPDATE_CONFIG]


def test_missing_secret_value_in_observed_config_is_drift() -> None:
    target = _target()
    observed = {k: v for k, v in target.config.items() if k != "db.password"}
    assert decide(target, _view(target, config=observed), NOW) == [Step.UPDATE_CONFIG]


def test_state_mismatch_sets_state() -> None:
    target = _target(state="paused")
    assert decide(target, _view(target, state="RUNNING"), NOW) == [Step.SET_STATE]


def test_config_drift_and_state_mismatch_together() -> None:
    target = _target(state="stopped")
    assert decide(target, _view(target, state="RUNNING", config={}), NOW) == [Step.UPDATE_CONFIG, Step.SET_STATE]


def test_unassigned_connector_is_left_to_settle() -> None:
    target = _target()
    assert decide(target, _view(target, state="UNASSIGNED", tasks=()), NOW) == []


def test_failed_connector_is_restarted_not_resumed() -> None:
    target = _target()
    assert decide(target, _view(target, state="FAILED", trace="boom"), NOW) == [Step.RESTART_FAILED]


def test_new_restart_nonce_restarts() -> None:
    target = _target(restartNonce="2", status={"lastRestartNonce": "1"})
    assert decide(target, _view(target), NOW) == [Step.RESTART]


def test_first_restart_nonce_restarts() -> None:
    target = _target(restartNonce="1")
    assert decide(target, _view(target), NOW) == [Step.RESTART]


def test_restart_nonce_already_acted_upon_does_not_restart() -> None:
    target = _target(restartNonce="1", status={"lastRestartNonce": "1"})
    assert decide(target, _view(target), NOW) == []


def test_restart_annotation_restarts() -> None:
    target = _target()
    target.restart_requested = True
    assert decide(target, _view(target), NOW) == [Step.RESTART]


def test_requested_restart_replaces_auto_restart_of_failed_tasks() -> None:
    target = _target()
    target.restart_requested = True
    assert decide(target, _view(target, tasks=(_failed_task(),)), NOW) == [Step.RESTART]


def test_failed_task_is_restarted_automatically() -> None:
    target = _target()
    assert decide(target, _view(target, tasks=(_task(0), _failed_task())), NOW) == [Step.RESTART_FAILED]


def test_failed_task_waits_out_the_backoff() -> None:
    target = _target(autoRestart={"backoffSeconds": 60}, status=_restarted(1, timedelta(0)))
    observed = _view(target, tasks=(_failed_task(),))
    assert decide(target, observed, NOW) == []
    # The second restart waits backoff * 1 * 2 = 120 s after the first.
    assert decide(target, observed, NOW + timedelta(seconds=119)) == []
    assert decide(target, observed, NOW + timedelta(seconds=120)) == [Step.RESTART_FAILED]


def test_exhausted_auto_restart_stalls() -> None:
    target = _target(autoRestart={"maxRestarts": 3}, status=_restarted(3, timedelta(hours=2)))
    observed = _view(target, tasks=(_failed_task(),))
    assert decide(target, observed, NOW) == []

    status = report(target, observed, Outcome(), NOW)
    ready, stalled = _cond(status, READY), _cond(status, STALLED)
    assert (stalled["status"], stalled["reason"]) == ("True", "AutoRestartExhausted")
    assert (ready["status"], ready["reason"]) == ("False", "AutoRestartExhausted")
    assert "gave up after 3 automatic restarts" in ready["message"]
    assert status["phase"] == "Failed"
    assert "nextRestartTime" not in status["autoRestart"]


def test_auto_restart_disabled_stalls_on_failed_tasks() -> None:
    target = _target(autoRestart={"enabled": False})
    observed = _view(target, tasks=(_failed_task(),))
    assert decide(target, observed, NOW) == []

    status = report(target, observed, Outcome(), NOW)
    ready, stalled, reconciling = _cond(status, READY), _cond(status, STALLED), _cond(status, RECONCILING)
    assert (stalled["status"], stalled["reason"]) == ("True", "TasksFailed")
    assert (ready["status"], ready["reason"]) == ("False", "TasksFailed")
    assert reconciling["status"] == "False"
    assert status["phase"] == "Failed"
    assert "nextRestartTime" not in status["autoRestart"]


def test_failing_with_auto_restart_is_reconciling_not_stalled() -> None:
    target = _target()
    status = report(target, _view(target, tasks=(_failed_task(),)), Outcome(), NOW)
    assert _cond(status, STALLED)["status"] == "False"
    reconciling = _cond(status, RECONCILING)
    assert (reconciling["status"], reconciling["reason"]) == ("True", "AutoRestarting")
    assert status["autoRestart"] == {"count": 0, "nextRestartTime": format_time(NOW)}


@pytest.mark.parametrize(
    "observed_kind", ["absent", "config-drift", "state-mismatch", "failed-task", "restart-nonce", "annotation"]
)
def test_paused_reconciliation_does_nothing(observed_kind: str) -> None:
    target = _target(restartNonce="7") if observed_kind == "restart-nonce" else _target()
    target.paused = True
    target.restart_requested = observed_kind == "annotation"
    observed: ConnectorView | None = {
        "absent": None,
        "config-drift": _view(target, config={}),
        "state-mismatch": _view(target, state="STOPPED"),
        "failed-task": _view(target, tasks=(_failed_task(),)),
        "restart-nonce": _view(target),
        "annotation": _view(target),
    }[observed_kind]
    assert decide(target, observed, NOW) == []


@pytest.mark.parametrize(
    ("reason", "stalled"),
    [("SecretNotFound", False), ("SecretUnreadable", False), ("InvalidSpec", True)],
)
def test_problem_target_does_nothing_and_stalls_only_when_not_retried(reason: str, stalled: bool) -> None:
    """A missing Secret is read again until it exists (Reconciling); a bad spec waits for an edit (Stalled)."""
    target = _target()
    target.problem = Condition(READY, False, reason, "what to fix")
    assert decide(target, None, NOW) == []
    status = report(target, None, Outcome(), NOW)
    assert (_cond(status, READY)["status"], _cond(status, READY)["reason"]) == ("False", reason)
    assert _cond(status, STALLED)["status"] == str(stalled)
    assert _cond(status, RECONCILING)["status"] == str(not stalled)


# ----- report --------------------------------------------------------------------------------------


def test_healthy_running_connector_is_ready() -> None:
    target = _target()
    status = report(target, _view(target), Outcome(), NOW)
    ready = _cond(status, READY)
    assert (ready["status"], ready["reason"]) == ("True", "Running")
    assert ready["observedGeneration"] == 4
    assert ready["lastTransitionTime"] == format_time(NOW)
    assert _cond(status, RECONCILING)["status"] == "False"
    assert _cond(status, STALLED)["status"] == "False"
    assert status["phase"] == "Running"
    assert status["observedGeneration"] == 4
    assert status["tasksReady"] == "1/1"
    assert status["runningTasks"] == 1
    assert status["connectorState"] == "RUNNING"
    assert status["workerId"] == WORKER
    assert status["connectorName"] == "orders"
    assert status["cluster"] == CLUSTER
    assert status["tasks"] == [{"id": 0, "state": "RUNNING", "workerId": WORKER}]
    assert status["autoRestart"] == {"count": 0}
    assert status["lastSyncTime"] == format_time(NOW)


def test_tasks_ready_counts_only_running_tasks() -> None:
    target = _target(tasksMax=3)
    tasks = (_task(0), _task(1, "PAUSED"), _task(2))
    status = report(target, _view(target, tasks=tasks), Outcome(), NOW)
    assert status["tasksReady"] == "2/3"
    assert status["runningTasks"] == 2


def test_paused_connector_is_ready_when_paused_is_wanted() -> None:
    target = _target(state="paused")
    status = report(target, _view(target, state="PAUSED", tasks=(_task(0, "PAUSED"),)), Outcome(), NOW)
    assert (_cond(status, READY)["status"], _cond(status, READY)["reason"]) == ("True", "Paused")
    assert status["phase"] == "Paused"


def test_state_transition_is_not_ready() -> None:
    target = _target(state="paused")
    status = report(target, _view(target, state="RUNNING"), Outcome(done=[Step.SET_STATE]), NOW)
    ready = _cond(status, READY)
    assert (ready["status"], ready["reason"]) == ("False", "StateTransition")
    assert _cond(status, RECONCILING)["status"] == "True"


def test_failed_task_message_names_task_worker_and_first_trace_line() -> None:
    target = _target(tasksMax=2)
    trace = "org.apache.kafka.connect.errors.ConnectException: table orders is gone\n\tat A.b(A.java:10)\n"
    observed = _view(target, tasks=(_task(0), _task(1, "FAILED", trace, worker="10.0.0.9:8083")))
    status = report(target, observed, Outcome(), NOW)
    ready = _cond(status, READY)
    assert (ready["status"], ready["reason"]) == ("False", "TasksFailed")
    assert ready["message"] == (
        "task 1 FAILED on 10.0.0.9:8083: org.apache.kafka.connect.errors.ConnectException: table orders is gone"
    )
    assert "A.java" not in ready["message"]
    assert status["tasks"][1]["trace"] == trace


def test_failed_connector_message_uses_connector_trace() -> None:
    target = _target()
    status = report(
        target, _view(target, state="FAILED", trace="java.lang.IllegalStateException: x\n\tat Z"), Outcome(), NOW
    )
    ready = _cond(status, READY)
    assert (ready["status"], ready["reason"]) == ("False", "ConnectorFailed")
    assert ready["message"] == f"connector failed on {WORKER}: java.lang.IllegalStateException: x"


def test_secret_in_task_trace_is_redacted() -> None:
    target = _target()
    trace = f"org.postgresql.util.PSQLException: password {SECRET} rejected for user app\n\tat {SECRET}.x(Y.java:1)"
    status = report(target, _view(target, tasks=(_task(0, "FAILED", trace),)), Outcome(), NOW)
    message = _cond(status, READY)["message"]
    assert SECRET not in message
    assert "password *** rejected" in message
    stored = status["tasks"][0]["trace"]
    assert SECRET not in stored
    assert stored == "org.postgresql.util.PSQLException: password *** rejected for user app\n\tat ***.x(Y.java:1)"
    assert SECRET not in repr(status)


def test_long_task_trace_is_truncated_in_status() -> None:
    target = _target()
    trace = "E: boom\n" + "\tat frame\n" * 1000
    status = report(target, _view(target, tasks=(_task(0, "FAILED", trace),)), Outcome(), NOW)
    assert len(status["tasks"][0]["trace"]) == 2048
    assert status["tasks"][0]["trace"].endswith("…")


def _ready_before(target: Target, at: datetime) -> dict[str, Any]:
    """A status written while the connector was healthy, as the previous status of `target`."""
    status = report(target, _view(target), Outcome(), at)
    assert _cond(status, READY)["status"] == "True"
    return status


def test_short_rebalance_keeps_ready() -> None:
    target = _target()
    target.status = _ready_before(target, NOW - timedelta(minutes=5))
    observed = _view(target, tasks=(_task(0, "UNASSIGNED", worker=""),))

    status = report(target, observed, Outcome(), NOW)
    ready = _cond(status, READY)
    assert (ready["status"], ready["reason"]) == ("True", "Running")
    assert ready["lastTransitionTime"] == format_time(NOW - timedelta(minutes=5))
    assert (_cond(status, RECONCILING)["status"], _cond(status, RECONCILING)["reason"]) == ("True", "Rebalancing")
    assert status["phase"] == "Running"
    assert target.unassigned_since == NOW

    later = NOW + UNASSIGNED_GRACE - timedelta(seconds=1)
    assert _cond(report(target, observed, Outcome(), later), READY)["status"] == "True"


def test_long_unassignment_is_not_ready() -> None:
    target = _target()
    target.status = _ready_before(target, NOW - timedelta(minutes=5))
    target.unassigned_since = NOW - UNASSIGNED_GRACE
    status = report(target, _view(target, tasks=(_task(0, "UNASSIGNED", worker=""),)), Outcome(), NOW)
    ready = _cond(status, READY)
    assert (ready["status"], ready["reason"]) == ("False", "TasksUnassigned")
    assert ready["lastTransitionTime"] == format_time(NOW)
    assert _cond(status, STALLED)["status"] == "False"


def test_unassigned_tasks_when_never_ready_are_starting() -> None:
    target = _target()
    status = report(target, _view(target, tasks=()), Outcome(), NOW)
    ready = _cond(status, READY)
    assert (ready["status"], ready["reason"]) == ("False", "Starting")
    assert target.unassigned_since == NOW


def test_healthy_again_clears_unassigned_since() -> None:
    target = _target()
    target.unassigned_since = NOW - timedelta(seconds=5)
    report(target, _view(target), Outcome(), NOW)
    assert target.unassigned_since is None


def test_short_rebalance_of_the_connector_itself_keeps_ready() -> None:
    target = _target()
    target.status = _ready_before(target, NOW - timedelta(minutes=5))
    observed = _view(target, state="UNASSIGNED", tasks=(_task(0, "UNASSIGNED", worker=""),))
    assert decide(target, observed, NOW) == []
    assert _cond(report(target, observed, Outcome(), NOW), READY)["status"] == "True"


def test_auto_restart_count_increments_after_restart_failed() -> None:
    target = _target(status=_restarted(1, timedelta(minutes=3)))
    observed = _view(target, tasks=(_failed_task(),))
    assert decide(target, observed, NOW) == [Step.RESTART_FAILED]
    status = report(target, observed, Outcome(done=[Step.RESTART_FAILED]), NOW)
    # Third restart waits backoff * 2 * 3 = 360 s after this (second) one.
    assert status["autoRestart"] == {
        "count": 2,
        "lastRestartTime": format_time(NOW),
        "nextRestartTime": format_time(NOW + timedelta(seconds=360)),
    }


def test_first_auto_restart_is_counted() -> None:
    target = _target()
    status = report(target, _view(target, tasks=(_failed_task(),)), Outcome(done=[Step.RESTART_FAILED]), NOW)
    assert status["autoRestart"]["count"] == 1
    assert status["autoRestart"]["lastRestartTime"] == format_time(NOW)


def test_auto_restart_count_resets_after_healthy_for_reset_period() -> None:
    target = _target(autoRestart={"resetAfterSeconds": 600}, status=_restarted(3, timedelta(seconds=600)))
    status = report(target, _view(target), Outcome(), NOW)
    assert status["autoRestart"] == {"count": 0}


def test_auto_restart_count_kept_before_reset_period() -> None:
    target = _target(autoRestart={"resetAfterSeconds": 600}, status=_restarted(3, timedelta(seconds=599)))
    status = report(target, _view(target), Outcome(), NOW)
    assert status["autoRestart"] == {
        "count": 3,
        "lastRestartTime": format_time(NOW - timedelta(seconds=599)),
    }


def test_auto_restart_count_kept_while_failing_past_reset_period() -> None:
    target = _target(status=_restarted(3, timedelta(hours=1)))
    status = report(target, _view(target, tasks=(_failed_task(),)), Outcome(), NOW)
    assert status["autoRestart"]["count"] == 3


@pytest.mark.parametrize("step", [Step.RESTART, Step.CREATE])
def test_restart_nonce_recorded_after_restart_or_create(step: Step) -> None:
    target = _target(restartNonce="n2", status={"lastRestartNonce": "n1"})
    status = report(target, _view(target), Outcome(done=[step]), NOW)
    assert status["lastRestartNonce"] == "n2"


def test_restart_nonce_not_recorded_without_restart() -> None:
    target = _target(restartNonce="n2", status={"lastRestartNonce": "n1"})
    status = report(target, _view(target), Outcome(done=[Step.UPDATE_CONFIG]), NOW)
    assert status["lastRestartNonce"] == "n1"


def test_restart_nonce_not_recorded_when_restart_failed() -> None:
    target = _target(restartNonce="n2")
    status = report(target, _view(target), Outcome(failed=Step.RESTART, error="409: rebalancing"), NOW)
    assert "lastRestartNonce" not in status


def test_connect_rejection_is_retried_so_reconciling_with_redacted_error() -> None:
    target = _target()
    outcome = Outcome(failed=Step.UPDATE_CONFIG, error=f"400: bad value {SECRET}", rejected=True)
    status = report(target, _view(target, config={}), outcome, NOW)
    ready = _cond(status, READY)
    assert (ready["status"], ready["reason"]) == ("False", "ConnectRejected")
    assert SECRET not in ready["message"]
    assert (_cond(status, STALLED)["status"], _cond(status, RECONCILING)["status"]) == ("False", "True")


# ----- offsets -------------------------------------------------------------------------------------


@pytest.mark.parametrize("operation", ["reset", "alter"])
def test_offsets_change_stops_the_connector_first_and_holds_state_and_restarts(operation: str) -> None:
    target = _target(restartNonce="n1")
    target.offsets_request = OffsetsRequest(operation, "cm" if operation == "alter" else "")
    failing = _view(target, tasks=(_task(state="FAILED", trace="boom"),))
    assert decide(target, failing, NOW) == [Step.STOP_FOR_OFFSETS]  # no restart, no resume meanwhile
    step = Step.RESET_OFFSETS if operation == "reset" else Step.ALTER_OFFSETS
    assert decide(target, _view(target, state="STOPPED", tasks=()), NOW) == [step]
    drifted = _view(target, state="STOPPED", tasks=(), config={})
    assert decide(target, drifted, NOW) == [Step.UPDATE_CONFIG, step]
    status = report(target, _view(target, state="STOPPED", tasks=()), Outcome(), NOW)
    assert (_cond(status, READY)["reason"], _cond(status, RECONCILING)["status"]) == ("UpdatingOffsets", "True")
    assert _cond(status, STALLED)["status"] == "False"


def test_once_offsets_are_changed_the_connector_returns_to_its_desired_state() -> None:
    target = _target()
    assert decide(target, _view(target, state="STOPPED", tasks=()), NOW) == [Step.SET_STATE]


def test_listing_offsets_needs_no_stop() -> None:
    target = _target()
    target.offsets_request = OffsetsRequest("list")
    assert decide(target, _view(target), NOW) == [Step.LIST_OFFSETS]
    assert decide(target, _view(target, state="PAUSED"), NOW) == [Step.LIST_OFFSETS, Step.SET_STATE]


def test_paused_reconciliation_leaves_offsets_alone() -> None:
    target = _target()
    target.paused = True
    target.offsets_request = OffsetsRequest("reset")
    assert decide(target, _view(target), NOW) == []


@pytest.mark.parametrize(
    ("result", "status", "reason"),
    [("Succeeded", "True", "Reset"), ("Failed", "False", "ResetFailed")],
)
def test_offsets_operation_result_is_a_condition(result: str, status: str, reason: str) -> None:
    target = _target()
    last = {"operation": "reset", "result": result, "message": "m", "time": format_time(NOW)}
    written = report(target, _view(target), Outcome(offsets={"lastOperation": last}), NOW)
    assert written["offsets"]["lastOperation"]["result"] == result
    assert (_cond(written, "Offsets")["status"], _cond(written, "Offsets")["reason"]) == (status, reason)
    assert _cond(written, READY)["status"] == "True"  # the connector itself is fine
    target.status = written
    again = report(target, _view(target), Outcome(), NOW)  # kept until the next operation
    assert again["offsets"] == written["offsets"]


def test_unknown_offsets_annotation_is_a_condition_naming_it() -> None:
    with pytest.raises(OffsetsInputError, match="is not one of list, reset, alter"):
        request_from({"fibers.dev/offsets": "rewind"}, "orders")
    target = _target()
    target.offsets_problem = "fibers.dev/offsets='rewind' is not one of list, reset, alter"
    cond = _cond(report(target, _view(target), Outcome(), NOW), "Offsets")
    assert (cond["status"], cond["reason"]) == ("False", "InvalidRequest")


def test_offsets_request_from_annotations() -> None:
    assert request_from({}, "orders") is None
    assert request_from({"fibers.dev/offsets": "list"}, "orders") == OffsetsRequest("list")
    assert request_from({"fibers.dev/offsets": "alter"}, "orders") == OffsetsRequest("alter", "orders-offsets")
    given = {"fibers.dev/offsets": "alter", "fibers.dev/offsets-from": "mine"}
    assert request_from(given, "orders") == OffsetsRequest("alter", "mine")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "has no key offsets.json"),
        ("{", "not valid JSON"),
        ('{"offsets": []}', "must be"),
        ('{"offsets": [{"offset": {"position": 1}}]}', r"offsets\[0\] needs a partition"),
    ],
)
def test_offsets_to_alter_are_checked(text: str | None, message: str) -> None:
    with pytest.raises(OffsetsInputError, match=message):
        parse_offsets(text, "ConfigMap ns1/cm")


def test_offsets_render_and_parse_round_trip() -> None:
    listed = {"offsets": [{"partition": {"filename": "/f"}, "offset": {"position": 42}}]}
    assert parse_offsets(render_offsets(listed), "cm") == listed


def test_topics_from_outcome_or_previous_status() -> None:
    target = _target(status={"topics": ["old"]})
    assert report(target, _view(target), Outcome(), NOW)["topics"] == ["old"]
    assert report(target, _view(target), Outcome(topics=["orders"]), NOW)["topics"] == ["orders"]


def test_significant_ignores_only_last_sync_time() -> None:
    target = _target()
    first = report(target, _view(target), Outcome(), NOW)
    target.status = first
    second = report(target, _view(target), Outcome(), NOW + timedelta(minutes=1))
    assert first != second
    assert first["lastSyncTime"] != second["lastSyncTime"]
    assert significant(first) == significant(second)
    assert set(significant(first)) == set(first) - {"lastSyncTime"}

    failing = report(target, _view(target, tasks=(_failed_task(),)), Outcome(), NOW + timedelta(minutes=2))
    assert significant(failing) != significant(first)
    assert significant({**first, "phase": "Failed"}) != significant(first)


SEEK = {"nonce": "n1", "startFrom": {"timestamp": "2025-03-01T09:00:00Z"}}


def test_a_seek_in_the_spec_is_asked_once_per_nonce_and_an_annotation_goes_first() -> None:
    target = _target(seek=SEEK)
    assert target.spec is not None and target.spec.seek is not None
    request = request_for({}, "orders", target.spec, None)
    assert request is not None and (request.operation, request.nonce, request.needs_stop) == ("seek", "n1", True)
    assert request.start == StartFrom(timestamp_ms=parse_time("2025-03-01T09:00:00Z", "t"))
    assert request_for({}, "orders", target.spec, "n1") is None  # done: the status says so
    by_hand = request_for({"fibers.dev/offsets": "list"}, "orders", target.spec, None)
    assert by_hand is not None and by_hand.operation == "list"  # the seek waits for it
    with pytest.raises(SpecError, match="position must be one of earliest, latest"):
        _target(seek={"nonce": "n2", "startFrom": {"position": "bootstrap"}})


def test_a_sink_whose_topics_come_from_a_secret_is_sought_not_sent_a_snapshot() -> None:
    """Decided from the plain config alone, such a sink's seek became a source's snapshot signal."""
    secret_topics = {"topics": {"secretKeyRef": {"name": "db", "key": "topics"}}}
    target = _target(seek=SEEK, config={"batch.size": 100}, secretConfig=secret_topics)
    request = request_for({}, "orders", target.spec, None)
    assert request is not None and request.operation == "seek"


def test_a_seek_stops_the_connector_moves_it_and_records_its_nonce_whatever_the_result() -> None:
    target = _target(seek=SEEK)
    target.offsets_request = request_for({}, "orders", target.spec, None)
    assert decide(target, _view(target), NOW) == [Step.STOP_FOR_OFFSETS]
    assert decide(target, _view(target, state="STOPPED", tasks=()), NOW) == [Step.SEEK_OFFSETS]
    for result, status, reason in (("Succeeded", "True", "Repositioned"), ("Failed", "False", "SeekFailed")):
        last = {"operation": "seek", "result": result, "message": "m", "time": format_time(NOW), "records": 6}
        written = report(target, _view(target), Outcome(offsets={"lastOperation": last}, seek_nonce="n1"), NOW)
        assert written["lastSeekNonce"] == "n1"
        assert (_cond(written, "Offsets")["status"], _cond(written, "Offsets")["reason"]) == (status, reason)
        target.status = written
        assert report(target, _view(target), Outcome(), NOW)["lastSeekNonce"] == "n1"  # kept


def test_a_sink_connector_is_moved_by_kafka_connects_offsets_api_form_and_a_source_has_no_topics() -> None:
    assert sink_topics({"topics": "orders, items", "x": "1"}) == (["orders", "items"], "")
    assert sink_topics({"topics.regex": "shop\\..*"}) == ([], "shop\\..*")
    assert sink_topics({"database.hostname": "db", "topic.prefix": "shop"}) is None  # a source
    positions = [Position("orders", 0, 5, 9), Position("orders", 1, 7, 7)]
    assert sink_offsets(positions) == {
        "offsets": [
            {"partition": {"kafka_topic": "orders", "kafka_partition": 0}, "offset": {"kafka_offset": 5}},
            {"partition": {"kafka_topic": "orders", "kafka_partition": 1}, "offset": {"kafka_offset": 7}},
        ]
    }
    assert describe_positions(positions) == "2 partition(s) of orders: 4 record(s) to replay"


def test_a_sink_created_with_a_start_from_is_created_stopped_and_moved_first_and_a_source_cannot_have_one() -> None:
    target = _target(startFrom={"position": "latest"})
    assert target.spec is not None and target.spec.created_at_offsets == "startFrom"
    sink = {"class": "io.example.OrdersSink", "config": {"topics": "orders"}}
    assert parse({**sink, "offsets": {"onCreate": "reset"}}, "orders").created_at_offsets == "reset"
    assert parse(sink, "orders").created_at_offsets is None
    # The annotation written with the claim (or by a person) asks for a move to spec.startFrom.
    request = request_for({"fibers.dev/offsets": "startFrom"}, "orders", target.spec, None)
    assert request == OffsetsRequest("seek", start=StartFrom(position="latest"))
    with pytest.raises(OffsetsInputError, match=r"needs spec\.startFrom"):
        request_for({"fibers.dev/offsets": "startFrom"}, "orders", _target().spec, None)
    with pytest.raises(SpecError, match="only a sink connector"):
        parse(
            {
                "class": "FileStreamSource",
                "config": {"file": "/f", "topic": "t"},
                "startFrom": {"position": "earliest"},
            },
            "src",
        )


DEBEZIUM_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
CAPTURE = {"topic.prefix": "shop", "table.include.list": "public.orders, public.items,public.debezium_signal"}
SIGNALS = {
    "signal.enabled.channels": "source,kafka",
    "signal.kafka.topic": "shop-signals",
    "signal.kafka.bootstrap.servers": "kafka:9092",
    "signal.data.collection": "public.debezium_signal",
}


def test_a_source_connectors_seek_is_an_incremental_snapshot_asked_on_its_signal_topic_without_a_stop() -> None:
    spec = parse({"class": DEBEZIUM_CLASS, "config": {**CAPTURE, **SIGNALS}, "seek": SEEK}, "cdc")
    request = request_for({}, "cdc", spec, None)
    assert request is not None and (request.operation, request.needs_stop) == ("snapshot", False)
    target = _target()
    target.offsets_request = request
    assert decide(target, _view(target), NOW) == [Step.SNAPSHOT]  # it keeps running
    signal = snapshot_signal(spec.config, "kafka:9092")
    assert (signal.topic, signal.key, signal.bootstrap) == ("shop-signals", "shop", "kafka:9092")
    assert json.loads(signal.value) == {
        "type": "execute-snapshot",
        "data": {"data-collections": ["public.orders", "public.items"], "type": "INCREMENTAL"},
    }
    last = {"operation": "snapshot", "result": "Failed", "message": "m", "time": format_time(NOW)}
    failed = report(target, _view(target), Outcome(offsets={"lastOperation": last}, seek_nonce="n1"), NOW)
    assert _cond(failed, "Offsets")["reason"] == "SeekFailed"


def test_a_source_without_debeziums_kafka_signal_channel_says_what_its_config_lacks() -> None:
    with pytest.raises(OffsetsInputError) as refused:
        snapshot_signal({**CAPTURE, "signal.kafka.topic": "s"}, "kafka:9092")
    message = str(refused.value)
    assert "a source connector has no position in time" in message
    assert "signal.enabled.channels with kafka, signal.kafka.bootstrap.servers, signal.data.collection" in message


@pytest.mark.parametrize("declared", ["kafka:9092", ""])
def test_a_snapshot_signal_goes_only_to_the_kafka_the_platform_declared(declared: str) -> None:
    """The signal's address is in the user's config: elsewhere than the cluster's declared Kafka (another team's
    Kafka, any host:port) it is refused, not sent from the operator's pod."""
    config = {**CAPTURE, **SIGNALS, "signal.kafka.bootstrap.servers": "evil.example:9092"}
    with pytest.raises(OffsetsInputError, match=r"signal\.kafka\.bootstrap\.servers \(evil\.example:9092\) is not"):
        snapshot_signal(config, declared)
    # One broker of the declared list is the same Kafka: the signal goes to the declared list.
    same = {**CAPTURE, **SIGNALS, "signal.kafka.bootstrap.servers": "KAFKA-1:9092"}
    assert snapshot_signal(same, "kafka-0:9092,kafka-1:9092").bootstrap == "kafka-0:9092,kafka-1:9092"
