"""What to do about one connector, and what to report about it (pure: no I/O).

The order follows Strimzi's connector reconciler: existence, ownership, configuration, state,
restarts. `decide` picks the steps; `report` turns what was observed and done into a status.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from fibers import conditions
from fibers.conditions import READY, RECONCILING, STALLED, Condition, format_time, parse_time
from fibers.connect import groups, ownership
from fibers.connect.offsets import OffsetsRequest
from fibers.connect.policy import POLICY
from fibers.connect.rest import ConnectorView, TaskView
from fibers.connect.spec import ConnectSpec
from fibers.redact import redact, truncate

UNASSIGNED_GRACE = timedelta(seconds=POLICY.unassigned_grace)  # a rebalance moves tasks through UNASSIGNED briefly
# Problems the operator keeps retrying by itself (a Secret is read again until it exists): kstatus
# Reconciling, not Stalled. Any other problem waits for the user to change something: Stalled.
WAITING_REASONS = frozenset(
    {"SecretNotFound", "SecretUnreadable", "ClusterNotFound", "NoConnectCluster", groups.KAFKA_UNKNOWN}
)
OFFSETS = "Offsets"  # the condition that reports the last offsets operation


class Step(enum.Enum):
    CREATE = "create"
    UPDATE_CONFIG = "update-config"
    SET_STATE = "set-state"
    RESTART = "restart"
    RESTART_FAILED = "restart-failed"
    STOP_FOR_OFFSETS = "stop-for-offsets"
    LIST_OFFSETS = "list-offsets"
    RESET_OFFSETS = "reset-offsets"
    ALTER_OFFSETS = "alter-offsets"
    SEEK_OFFSETS = "seek-offsets"
    SNAPSHOT = "snapshot"  # a source connector's seek: Debezium's signal for an incremental snapshot


OFFSET_CHANGES = {"reset": Step.RESET_OFFSETS, "alter": Step.ALTER_OFFSETS, "seek": Step.SEEK_OFFSETS}
# Operations on a running connector: it is not stopped for them.
OFFSET_READS = {"list": Step.LIST_OFFSETS, "snapshot": Step.SNAPSHOT}
OFFSET_STEPS = frozenset({Step.STOP_FOR_OFFSETS, *OFFSET_READS.values(), *OFFSET_CHANGES.values()})


Key = tuple[str, str]  # a Connect resource: (namespace, name)


@dataclass
class Target:
    """One Connect resource as the operator knows it between syncs."""

    namespace: str
    name: str
    uid: str
    generation: int
    spec: ConnectSpec | None
    config: dict[str, str] = field(default_factory=dict)  # full desired config, secrets included
    secrets: tuple[str, ...] = ()  # values to keep out of anything we write
    problem: Condition | None = None  # why the spec cannot be acted on (bad spec, missing Secret)
    # Why its sink's consumer group is not its own on the cluster's Kafka (`fibers.connect.groups`).
    group_problem: Condition | None = None
    status: dict[str, Any] = field(default_factory=dict)  # last status written
    paused: bool = False
    restart_requested: bool = False  # the fibers.dev/restart annotation
    unassigned_since: datetime | None = None
    config_verified: bool = False  # Connect is known to hold `config` (seen in a listing, or we wrote it)
    topics_due: float = 0.0  # monotonic time before which an empty topic list is not asked again
    created_at: float = 0.0  # monotonic time of our last successful create
    topic_checks: int = 0
    claimed: bool = False  # the resource carries our claim on its connector name (we may create it)
    # Whose Kafka Connect says the connector is (`fibers.connect.ownership`): our `owner` once a listing
    # with configs showed it, or we created it; None while that is not known. Only then do we change it.
    connector_owner: str | None = None
    # A claim we withdrew (someone else created the connector first): events still showing it predate
    # the withdrawal and do not make the connector ours again.
    disowned: str = ""
    meta: dict[str, Any] = field(default_factory=dict)  # the resource's metadata as last seen
    deleting: bool = False  # the resource is marked for deletion
    first_seen: float = 0.0  # monotonic time the operator first saw the resource
    cluster: str = ""  # the ConnectCluster chosen (see fibers.connect.clusters.place)
    placed: bool = False  # that cluster exists and allows the namespace
    quiet_view: ConnectorView | None = None  # the connector as seen by a reconcile that left nothing to do
    # The connector as seen by the last reconcile that had nothing to do while it converges (None: not
    # listed yet), and when: until it moves, listings at the fast pace need not reconcile it again.
    waiting_view: tuple[ConnectorView | None, float] | None = None
    offsets_request: OffsetsRequest | None = None  # the fibers.dev/offsets annotation, until it is done
    offsets_problem: str = ""  # why that annotation cannot be acted on

    @property
    def context(self) -> dict[str, str]:
        """The resource, as every log line about it names it."""
        return {"namespace": self.namespace, "resource": self.name}

    @property
    def key(self) -> Key:
        return self.namespace, self.name

    @property
    def owner(self) -> str:
        """This resource, as a connector's config names its owner."""
        return ownership.owner_id(self.namespace, self.name)

    @property
    def owned(self) -> bool:
        """The connector is this resource's to change, stop and delete: Kafka Connect says so (the claim
        annotation alone is the resource editor's word, see `fibers.connect.ownership`)."""
        return bool(self.spec and self.connector_owner == self.owner)

    def observe_owner(self, observed: ConnectorView | None) -> None:
        """Learn whose the connector is from a listing: with configs it says; without, what we knew stands."""
        if observed is not None and observed.config is not None:
            self.connector_owner = ownership.owner_of(
                observed.config, us=self.owner, claimed=self.claimed, desired=self.config
            )

    def topics_due_now(self) -> bool:
        """No topics known yet, and the time to ask Connect again has come."""
        return not self.status.get("topics") and time.monotonic() >= self.topics_due

    @property
    def finalizers(self) -> list[str]:
        return list(self.meta.get("finalizers") or [])

    @property
    def restarts(self) -> int:
        return int((self.status.get("autoRestart") or {}).get("count", 0))

    def last_restart(self) -> datetime | None:
        stamp = (self.status.get("autoRestart") or {}).get("lastRestartTime")
        return parse_time(stamp) if stamp else None


@dataclass
class Outcome:
    """What the executor did and what went wrong, fed back into `report`."""

    done: list[Step] = field(default_factory=list)
    failed: Step | None = None
    error: str = ""
    rejected: bool = False  # Kafka Connect refused the request itself (4xx other than 409)
    reason: str = "ConnectError"  # the Ready reason for a failed step that may succeed when retried
    topics: list[str] | None = None
    offsets: dict[str, Any] | None = None  # status.offsets after an offsets operation ended
    seek_nonce: str = ""  # the spec.seek.nonce a seek that ended acted on (whether it succeeded or not)


def failed_tasks(view: ConnectorView) -> list[TaskView]:
    return [t for t in view.tasks if t.state == "FAILED"]


def is_failing(view: ConnectorView) -> bool:
    return view.state == "FAILED" or bool(failed_tasks(view))


def at_rest(before: ConnectorView, now: ConnectorView) -> bool:
    """Nothing a decision or a status depends on has moved since `before`, and nothing is waiting on
    the clock (a restart backoff, a rebalance's grace period). A listing without configs says
    nothing about them."""
    return (
        (now.state, now.worker_id, now.trace, now.tasks) == (before.state, before.worker_id, before.trace, before.tasks)
        and (now.config is None or now.config == before.config)
        and not is_failing(now)
        and now.state not in ("UNASSIGNED", "RESTARTING")
        and all(t.state != "UNASSIGNED" for t in now.tasks)
    )


def next_auto_restart(target: Target, now: datetime) -> datetime:
    assert target.spec is not None
    last = target.last_restart()
    if last is None:
        return now
    return last + timedelta(seconds=target.spec.auto_restart.delay(target.restarts))


def decide(target: Target, observed: ConnectorView | None, now: datetime) -> list[Step]:
    spec = target.spec
    if spec is None or target.problem or target.paused or target.group_problem:
        return []  # a group another Connect holds: not even an existing connector is changed (see groups)
    if observed is None:
        return [Step.CREATE]
    if not target.owned:
        return []  # someone else's connector: never touch it
    steps = []
    if observed.config is not None and observed.config != target.config:
        steps.append(Step.UPDATE_CONFIG)
    request = target.offsets_request
    if request and request.needs_stop:
        # Connect changes offsets of a STOPPED connector only; the state and restarts wait until then.
        steps.append(OFFSET_CHANGES[request.operation] if observed.state == "STOPPED" else Step.STOP_FOR_OFFSETS)
        return steps
    if request:
        steps.append(OFFSET_READS[request.operation])
    desired = spec.connect_state
    # UNASSIGNED and RESTARTING pass by themselves; a FAILED connector is restarted, not resumed.
    settling = observed.state in ("UNASSIGNED", "RESTARTING") or (observed.state == "FAILED" and desired == "RUNNING")
    if observed.state != desired and not settling:
        steps.append(Step.SET_STATE)
    if (spec.restart_nonce and spec.restart_nonce != target.status.get("lastRestartNonce")) or target.restart_requested:
        steps.append(Step.RESTART)
    elif (
        desired == "RUNNING"
        and spec.auto_restart.enabled
        and is_failing(observed)
        and not spec.auto_restart.exhausted(target.restarts)
        and now >= next_auto_restart(target, now)
    ):
        steps.append(Step.RESTART_FAILED)
    return steps


def _first_line(trace: str, secrets: tuple[str, ...]) -> str:
    return redact(trace.strip().splitlines()[0] if trace.strip() else "no trace", secrets)


def _task_status(task: TaskView, secrets: tuple[str, ...]) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": task.id, "state": task.state, "workerId": task.worker_id}
    if task.trace:
        entry["trace"] = truncate(redact(task.trace, secrets), 2048)
    return entry


def _auto_restart_status(
    target: Target, observed: ConnectorView | None, outcome: Outcome, now: datetime
) -> dict[str, Any]:
    spec = target.spec
    assert spec is not None
    count, last = target.restarts, target.last_restart()
    if Step.RESTART_FAILED in outcome.done:
        count, last = count + 1, now
    healthy = observed is not None and not is_failing(observed) and observed.state != "UNASSIGNED"
    if healthy and last and now - last >= timedelta(seconds=spec.auto_restart.reset_after_seconds):
        count, last = 0, None
    result: dict[str, Any] = {"count": count}
    if last:
        result["lastRestartTime"] = format_time(last)
    failing = observed is not None and is_failing(observed)
    if (
        failing
        and spec.auto_restart.enabled
        and not spec.auto_restart.exhausted(count)
        and spec.connect_state == "RUNNING"
    ):
        due = last + timedelta(seconds=spec.auto_restart.delay(count)) if last else now
        result["nextRestartTime"] = format_time(max(due, now))
    return result


def _ready(
    target: Target, observed: ConnectorView | None, outcome: Outcome, now: datetime
) -> tuple[list[Condition], str]:
    """Ready / Reconciling / Stalled and the phase, from what was observed and done."""
    spec = target.spec
    secrets = target.secrets

    def stalled(reason: str, message: str) -> tuple[list[Condition], str]:
        return [
            Condition(READY, False, reason, message),
            Condition(RECONCILING, False, reason, message),
            Condition(STALLED, True, reason, message),
        ], "Failed"

    def progressing(reason: str, message: str, phase: str = "Pending") -> tuple[list[Condition], str]:
        return [
            Condition(READY, False, reason, message),
            Condition(RECONCILING, True, reason, message),
            Condition(STALLED, False, reason, message),
        ], phase

    if problem := target.problem or target.group_problem:
        if problem.reason in WAITING_REASONS:
            return progressing(problem.reason, problem.message)
        return stalled(problem.reason, problem.message)
    assert spec is not None
    if outcome.failed and outcome.rejected:  # tried again at every sync, so not given up on
        return progressing(
            "ConnectRejected", f"Kafka Connect refused to {outcome.failed.value}: {redact(outcome.error, secrets)}"
        )
    if observed is None:
        if outcome.failed:
            return progressing(outcome.reason, f"could not create the connector: {redact(outcome.error, secrets)}")
        return progressing("Creating", f"creating connector {spec.connector}")
    if not target.owned:
        if target.claimed and target.connector_owner is None:
            return progressing("Verifying", f"reading connector {spec.connector}'s config to confirm it is ours")
        whose = ownership.described(target.connector_owner) if target.connector_owner is not None else "another's"
        return stalled(
            "ConnectorNotOwned",
            f"connector {spec.connector} already exists on ConnectCluster {target.cluster} and is {whose}; it is "
            "left untouched. Choose another connectorName, or delete it there.",
        )
    request = target.offsets_request
    if request and request.needs_stop and not target.paused:
        doing = "stopping the connector" if observed.state != "STOPPED" else "applying them to the STOPPED connector"
        return progressing("UpdatingOffsets", f"{request.operation} offsets: {doing}", observed.state.capitalize())
    paused_note = Condition(
        RECONCILING,
        False,
        "ReconciliationPaused",
        "reconciliation is paused by the fibers.dev/paused-reconciliation annotation",
    )
    failing = is_failing(observed)
    if failing:
        if observed.state == "FAILED":
            message = f"connector failed on {observed.worker_id}: {_first_line(observed.trace, secrets)}"
        else:
            message = "; ".join(
                f"task {t.id} FAILED on {t.worker_id}: {_first_line(t.trace, secrets)}" for t in failed_tasks(observed)
            )
        reason = "ConnectorFailed" if observed.state == "FAILED" else "TasksFailed"
        if (
            spec.auto_restart.enabled
            and spec.auto_restart.exhausted(target.restarts)
            and spec.connect_state == "RUNNING"
        ):
            return stalled("AutoRestartExhausted", f"{message} (gave up after {target.restarts} automatic restarts)")
        restarting = spec.auto_restart.enabled and spec.connect_state == "RUNNING"
        conds = [
            Condition(READY, False, reason, message),
            Condition(RECONCILING, restarting, "AutoRestarting" if restarting else reason, message),
            Condition(STALLED, not restarting, reason, message),
        ]
        if target.paused:
            conds[1] = paused_note
        return conds, "Failed"

    desired = spec.connect_state
    pending = [s for s in outcome.done if s in (Step.CREATE, Step.UPDATE_CONFIG, Step.SET_STATE, Step.RESTART)]
    rebalancing = desired == "RUNNING" and observed.state in ("UNASSIGNED", "RESTARTING")
    if observed.state != desired and not rebalancing:
        if target.paused:
            return [
                Condition(READY, False, "StateMismatch", f"connector is {observed.state}, spec wants {desired}"),
                paused_note,
                Condition(STALLED, False, "ReconciliationPaused", ""),
            ], observed.state.capitalize()
        return progressing("StateTransition", f"moving connector from {observed.state} to {desired}")
    unassigned = [t for t in observed.tasks if t.state == "UNASSIGNED"]
    if desired == "RUNNING" and (rebalancing or unassigned or not observed.tasks):
        target.unassigned_since = target.unassigned_since or now
        was_ready = conditions.is_true(target.status.get("conditions"), READY)
        if was_ready and now - target.unassigned_since < UNASSIGNED_GRACE:
            return [
                Condition(READY, True, "Running", "tasks are being reassigned (rebalance)"),
                Condition(RECONCILING, True, "Rebalancing", "tasks are being reassigned"),
                Condition(STALLED, False, "Running", ""),
            ], "Running"
        waited = now - target.unassigned_since
        reason = "TasksUnassigned" if waited >= UNASSIGNED_GRACE else "Starting"
        return progressing(reason, f"{len(unassigned) or 'no'} task(s) not assigned yet")
    target.unassigned_since = None
    if pending or (observed.config is not None and observed.config != target.config):
        return progressing(
            "Updating",
            f"applied {', '.join(s.value for s in pending) or 'changes'}; waiting to verify",
            phase=observed.state.capitalize(),
        )
    phase = (
        "Suspended"
        if spec.state == "suspended"
        else {"RUNNING": "Running", "PAUSED": "Paused", "STOPPED": "Stopped"}[desired]
    )
    reconciling = paused_note if target.paused else Condition(RECONCILING, False, phase, "")
    return [
        Condition(READY, True, phase, f"connector is {desired}"),
        reconciling,
        Condition(STALLED, False, phase, ""),
    ], phase


def _offsets_condition(offsets: dict[str, Any] | None, problem: str) -> list[Condition]:
    """`Offsets`: the last operation asked with the annotation, once there was one (kstatus ignores it)."""
    if problem:
        return [Condition(OFFSETS, False, "InvalidRequest", problem)]
    last = (offsets or {}).get("lastOperation")
    if not last:
        return []
    operation, ok = last.get("operation", ""), last.get("result") == "Succeeded"
    done = {
        "list": "Listed",
        "reset": "Reset",
        "alter": "Altered",
        "seek": "Repositioned",
        "snapshot": "SnapshotRequested",
    }
    reason = done.get(operation, "Done")
    if not ok:  # a source's seek fails as a seek: a seek is what the user asked for
        reason = "SeekFailed" if operation == "snapshot" else f"{operation.capitalize()}Failed"
    return [Condition(OFFSETS, ok, reason, last.get("message", ""))]


def report(target: Target, observed: ConnectorView | None, outcome: Outcome, now: datetime) -> dict[str, Any]:
    """The full status to write for this target."""
    conds, phase = _ready(target, observed, outcome, now)
    offsets = outcome.offsets if outcome.offsets is not None else target.status.get("offsets")
    conds += _offsets_condition(offsets, target.offsets_problem)
    status: dict[str, Any] = {
        "observedGeneration": target.generation,
        "phase": phase,
        "conditions": conditions.merge(target.status.get("conditions"), conds, target.generation, format_time(now)),
        "lastSyncTime": format_time(now),
    }
    spec = target.spec
    if spec is None:
        return status
    if target.cluster:
        status["cluster"] = target.cluster
    if target.owned:
        status["connectorName"] = spec.connector
    if (Step.CREATE in outcome.done or Step.RESTART in outcome.done) and spec.restart_nonce:
        status["lastRestartNonce"] = spec.restart_nonce
    elif target.status.get("lastRestartNonce"):
        status["lastRestartNonce"] = target.status["lastRestartNonce"]
    if seek_nonce := outcome.seek_nonce or target.status.get("lastSeekNonce"):
        status["lastSeekNonce"] = seek_nonce
    if observed is not None and target.owned:
        running = sum(t.state == "RUNNING" for t in observed.tasks)
        status.update(
            {
                "connectorState": observed.state,
                "workerId": observed.worker_id,
                "runningTasks": running,
                "tasksReady": f"{running}/{len(observed.tasks)}",
                "tasks": [_task_status(t, target.secrets) for t in observed.tasks],
            }
        )
        status["autoRestart"] = _auto_restart_status(target, observed, outcome, now)
    if offsets:
        status["offsets"] = offsets
    topics = outcome.topics if outcome.topics is not None else target.status.get("topics")
    if topics:
        status["topics"] = topics
    return status


def significant(status: dict[str, Any]) -> dict[str, Any]:
    """The part of a status whose change is worth a write (lastSyncTime alone is not)."""
    return {k: v for k, v in status.items() if k != "lastSyncTime"}
