"""Which runs a Transform should have, and what its status says (pure: no I/O).

A run is one SparkApplication. `plan` looks at the spec, the recorded status and the
SparkApplications that exist, and decides what to start and what to delete; `report` mirrors the
current run into the Transform's status.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from croniter import croniter

from fibers import conditions
from fibers.conditions import Condition, format_time, parse_time, with_upstream_note
from fibers.transform.sparkapp import (
    FAILING,
    FINISHED_FAILED,
    FINISHED_OK,
    NO_WORKLOAD,
    RUNNING,
    SUSPENDED_BY_SPEC,
    WAITING_FOR_DRIVER,
    executor_states,
    finished,
    state_of,
)
from fibers.transform.spec import spec_hash

SUSPENDED = "SUSPENDED"  # recorded in currentRun.applicationState when suspend stopped a run
DEADLINE = "SubmissionDeadlineExceeded"
INVALID = "InvalidSpec"  # the reason when the spec passes admission but cannot run
NEW = "NEW"  # recorded while the SparkApplication has no state yet (the Spark Operator has not taken it up)
# Recorded while the SparkApplication is suspended by its own spec (waiting for Kueue's admission): not
# the Spark Operator's word SUSPENDED, which is Fibers' own for a run it stopped (resumed by a new run).
QUEUED = "QUEUED"
# No Spark Operator to run what we create: the reasons Ready says so with (Stalled: waiting will not help).
NO_SPARK_OPERATOR = "SparkOperatorMissing"  # the cluster does not serve SparkApplications at all
NOT_TAKEN_UP = "SparkOperatorNotWatching"  # a SparkApplication nobody has touched after UNTOUCHED_AFTER
# The Spark Operator gives a SparkApplication a state within a second or two of its creation in a
# namespace it watches; one with no state after this long is in a namespace it does not watch (or
# no Spark Operator runs). Long enough for a Spark Operator being restarted or upgraded.
UNTOUCHED_AFTER = timedelta(seconds=60)
# A run waiting in its Kueue queue: nothing this operator watches moves when Kueue's Workload says why it
# waits (only admission changes the SparkApplication), so it is looked at again: soon while Kueue has not
# said yet (its Workload is made, then tried, within a second or two), then now and then.
QUEUED_FIRST_LOOK = timedelta(seconds=3)
QUEUED_LOOK = timedelta(seconds=30)
MESSAGE_LIMIT = 2048


@dataclass
class TransformView:
    """A Transform as read from the API, with the parts the planner needs."""

    body: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.body["metadata"]["uid"])

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self.body.get("spec") or {})

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.body.get("status") or {})

    def with_status(self, status: dict[str, Any]) -> TransformView:
        """The same Transform with another status: the one written, or the one a step is building."""
        return TransformView({**self.body, "status": status})

    @property
    def current(self) -> dict[str, Any]:
        return dict(self.status.get("currentRun") or {})

    @property
    def streaming(self) -> bool:
        return self.spec.get("mode") == "streaming"

    @property
    def suspended(self) -> bool:
        return self.spec.get("state") == "suspended"


@dataclass
class Plan:
    start: tuple[str, str] | None = None  # (run name, trigger)
    delete: list[str] = field(default_factory=list)
    schedule_time: datetime | None = None  # the schedule slot a scheduled start is for
    rerun_nonce: str | None = None
    seek_nonce: str | None = None  # spec.seek's, when this plan starts its run
    suspend_current: bool = False
    deadline_failed: str = ""  # message when the current run exceeded its submission deadline


def run_name(transform: str, uid: str, key: str) -> str:
    """Deterministic, so a retried start after a crash names the same SparkApplication.

    The Spark Operator only admits DNS-1035 labels (a letter first, no dots): a Transform's name may be
    any DNS subdomain, so dots become dashes and a leading digit gets a prefix.
    """
    digest = hashlib.sha256(f"{uid}/{key}".encode()).hexdigest()[:8]
    base = re.sub(r"[^a-z0-9-]", "-", transform.lower())
    if not base[:1].isalpha():
        base = f"run-{base}"
    return f"{base[:48]}-{digest}"


def _due_schedule(view: TransformView, now: datetime) -> datetime | None:
    schedule = view.spec.get("schedule")
    if not schedule:
        return None
    last = view.status.get("lastScheduleTime") or view.body["metadata"]["creationTimestamp"]
    previous_slot: datetime = croniter(schedule, now).get_prev(datetime)
    return previous_slot if previous_slot > parse_time(last) else None


def plan(
    view: TransformView, apps: list[dict[str, Any]], now: datetime, trouble: str = "", secrets_digest: str = ""
) -> Plan:
    """What to do with the runs now; `trouble`: why the current run's pods will not start, if they will not;
    `secrets_digest`: the digest of the Secret values it names, when one of those Secrets just changed."""
    result = Plan()
    spec, current = view.spec, view.current
    by_name = {a["metadata"]["name"]: a for a in apps}
    current_app = by_name.get(current.get("name", ""))
    active = [a["metadata"]["name"] for a in apps if not finished(a)]
    digest = spec_hash(spec)

    if view.suspended:
        result.delete = active
        result.suspend_current = bool(current and current_app is not None and not finished(current_app))
        return _trim_history(view, apps, result)

    if current_app is not None and not finished(current_app) and _past_deadline(view, current_app, now):
        result.deadline_failed = deadline_message(view, current_app, trouble)
        result.delete.append(current_app["metadata"]["name"])
        return _trim_history(view, apps, result)

    nonce, seek = spec.get("rerunNonce"), spec.get("seek") or {}
    if nonce and nonce != view.status.get("lastRerunNonce"):
        result.rerun_nonce = nonce
        result.start = (run_name(view.name, view.uid, f"rerun/{nonce}/{digest}"), "rerun")
    elif seek.get("nonce") and seek["nonce"] != view.status.get("lastSeekNonce"):
        result.seek_nonce = seek["nonce"]
        result.start = (run_name(view.name, view.uid, f"seek/{seek['nonce']}/{digest}"), "seek")
    elif _secrets_moved(view, current_app, secrets_digest):
        # Restarted from its checkpoint (a new run of the same spec), to take the new values.
        result.start = (run_name(view.name, view.uid, f"secret/{secrets_digest}/{digest}"), "secret-change")
    elif current.get("applicationState") == SUSPENDED:
        result.start = (run_name(view.name, view.uid, f"resume/{now.timestamp():.0f}/{digest}"), "resume")
    elif spec.get("schedule") and not view.streaming:
        slot = _due_schedule(view, now)
        if slot is not None:
            result.schedule_time = slot
            policy = spec.get("concurrencyPolicy", "Forbid")
            if not active or policy == "Allow":
                result.start = (run_name(view.name, view.uid, f"schedule/{format_time(slot)}"), "schedule")
            elif policy == "Replace":
                result.delete = list(active)
                result.start = (run_name(view.name, view.uid, f"schedule/{format_time(slot)}"), "schedule")
            # Forbid: the slot is skipped (lastScheduleTime still moves on).
    elif not current or current.get("specHash") != digest:
        trigger = "create" if not current else "spec-change"
        result.start = (run_name(view.name, view.uid, f"{trigger}/{digest}"), trigger)
    elif current_app is None and not current.get("applicationState"):
        # Recorded but never created (the operator stopped in between): create it now.
        result.start = (current["name"], current.get("trigger", "create"))

    if result.start and (view.streaming or result.start[1] in ("rerun", "seek")):
        # One streaming query at a time; a rerun or a seek replaces a run still going.
        result.delete = sorted(set(result.delete) | {n for n in active if n != result.start[0]})
    return _trim_history(view, apps, result)


def _secrets_moved(view: TransformView, app: dict[str, Any] | None, now_digest: str) -> bool:
    """A streaming run asked to restart on a Secret change (restartOnSecretChange) runs with values that
    are not the Secrets' any more. Only a run that is still going: a new one takes the values anyway."""
    started_with = view.current.get("secretsDigest")
    going = app is not None and not finished(app)
    wanted = view.streaming and bool(view.spec.get("restartOnSecretChange"))
    return wanted and going and bool(now_digest) and bool(started_with) and now_digest != started_with


def _past_deadline(view: TransformView, app: dict[str, Any], now: datetime) -> bool:
    """No driver pod running yet, that long after the (last) submission.

    The Spark Operator names driverInfo.podName when it submits, before the pod exists or runs, so the
    state tells whether a driver runs: "" (not taken up), SUBMITTED (driver pod pending) or
    SUBMISSION_FAILED. A restarted streaming run is measured from its own submission attempt.
    """
    if state_of(app) not in WAITING_FOR_DRIVER:
        return False
    return now - _waiting_since(view, app) > timedelta(seconds=_deadline_seconds(view))


def next_look(view: TransformView, apps: list[dict[str, Any]], now: datetime) -> datetime | None:
    """When this Transform must be looked at though nothing it reads changes (None: never).

    The clock is all that moves it then: the next schedule slot, or the submission deadline of a
    current run still waiting for its driver. Everything else arrives as an event.
    """
    times = []
    schedule = view.spec.get("schedule")
    if schedule and not view.streaming and not view.suspended:
        # An unusable one ('0 0 30 2 *') has no next time: the status says so (spec.problem).
        with contextlib.suppress(ValueError, KeyError):
            times.append(croniter(schedule, now).get_next(datetime))
    current = view.current
    if current.get("applicationState") == QUEUED:
        said = current.get("admission") not in (None, "", NO_WORKLOAD)
        times.append(now + (QUEUED_LOOK if said else QUEUED_FIRST_LOOK))
    app = next((a for a in apps if a["metadata"]["name"] == current.get("name")), None)
    acted_on = current.get("applicationState") in (SUSPENDED, DEADLINE)
    if app is not None and not acted_on and not finished(app) and state_of(app) in WAITING_FOR_DRIVER:
        since = _waiting_since(view, app)
        deadline = since + timedelta(seconds=_deadline_seconds(view), milliseconds=100)
        untouched = since + UNTOUCHED_AFTER + timedelta(milliseconds=100)
        times += [t for t in (deadline, untouched if not state_of(app) else None) if t is not None and t > now]
    return min(times) if times else None


def _deadline_seconds(view: TransformView) -> int:
    return int(view.spec.get("submissionDeadlineSeconds", 300))


def _waiting_since(view: TransformView, app: dict[str, Any]) -> datetime:
    """The (last) submission of a run: a restarted streaming run is measured from its own attempt."""
    since = parse_time(view.current.get("submittedAt") or app["metadata"]["creationTimestamp"])
    last_attempt = (app.get("status") or {}).get("lastSubmissionAttemptTime")
    return max(since, parse_time(last_attempt)) if last_attempt else since


def deadline_message(view: TransformView, app: dict[str, Any], trouble: str = "") -> str:
    seconds = _deadline_seconds(view)
    if trouble:  # the kubelet's word on why, rather than a bare timeout
        return f"no driver started within {seconds}s of submission: {trouble}"
    state = state_of(app)
    if state == "":
        return (
            f"the Spark Operator did not take up the run within {seconds}s "
            f"(does it watch namespace {app['metadata'].get('namespace', '')}?)"
        )
    message = f"no driver started within {seconds}s of submission"
    error = ((app.get("status") or {}).get("applicationState") or {}).get("errorMessage")
    return f"{message}: {error}" if error else message


def _trim_history(view: TransformView, apps: list[dict[str, Any]], result: Plan) -> Plan:
    """Delete finished runs beyond the history limits (never the current run, never the Transform)."""
    keep_ok = int(view.spec.get("successfulRunsHistoryLimit", 3))
    keep_failed = int(view.spec.get("failedRunsHistoryLimit", 1))
    current = view.current.get("name")
    newest_first = list(reversed(apps))
    ok = [
        a["metadata"]["name"] for a in newest_first if state_of(a) in FINISHED_OK and a["metadata"]["name"] != current
    ]
    failed = [
        a["metadata"]["name"]
        for a in newest_first
        if state_of(a) in FINISHED_FAILED and a["metadata"]["name"] != current
    ]
    # The current run counts towards its own limit.
    current_app = next((a for a in apps if a["metadata"]["name"] == current), None)
    if current_app is not None and state_of(current_app) in FINISHED_OK:
        keep_ok -= 1
    if current_app is not None and state_of(current_app) in FINISHED_FAILED:
        keep_failed -= 1
    excess = ok[max(keep_ok, 0) :] + failed[max(keep_failed, 0) :]
    result.delete = sorted(set(result.delete) | set(excess))
    return result


def mirror_run(current: dict[str, Any], app: dict[str, Any] | None, result: dict[str, str]) -> dict[str, Any]:
    """currentRun as the SparkApplication's status (and the job's result ConfigMap) shows it.

    On a failure the job's own words win: it writes Spark's error to the result ConfigMap (`error`),
    where the Spark Operator only knows the driver's exit code ("driver container failed with
    ExitCode: 1, Reason: Error").
    """
    run = dict(current)
    if app is None:
        return run
    status = app.get("status") or {}
    state = state_of(app)
    run["applicationState"] = QUEUED if state in SUSPENDED_BY_SPEC else state or NEW
    if state not in SUSPENDED_BY_SPEC:
        run.pop("admission", None)
    if (status.get("driverInfo") or {}).get("podName"):
        run["driverPod"] = status["driverInfo"]["podName"]
    if status.get("executionAttempts") is not None:
        run["attempts"] = int(status["executionAttempts"])
    if status.get("lastSubmissionAttemptTime") and state:
        run["startedAt"] = status["lastSubmissionAttemptTime"]
    if status.get("terminationTime") and state in FINISHED_OK | FINISHED_FAILED:
        run["finishedAt"] = status["terminationTime"]
    executors = executor_states(app)
    if executors:
        run["executors"] = executors
    else:
        run.pop("executors", None)
    if state in FINISHED_FAILED | FAILING:
        message = result.get("error") or (status.get("applicationState") or {}).get("errorMessage")
        if message:
            run["errorMessage"] = str(message)[:MESSAGE_LIMIT]
    else:
        run.pop("errorMessage", None)
    for key in ("recordsOut", "streamedBack"):
        value = str(result.get(key, ""))
        if value.isdigit():  # the job writes "null" when there was nothing to count
            run[key] = int(value)
    return run


def report(
    view: TransformView,
    run: dict[str, Any],
    now: datetime,
    *,
    waiting: str = "",
    invalid: str = "",
    no_spark_operator: str = "",
    upstream: Condition | None = None,
    inputs: list[dict[str, Any]] | None = None,
    paused: bool = False,
) -> dict[str, Any]:
    """The Transform's status from its current run (and UpstreamReady, when given).

    `no_spark_operator` says why no SparkApplication can be run (the CRD is not served); `inputs`: the
    topics behind each Kafka input as resolved now (None: not resolved this time, the last ones kept).
    """
    kept = ("lastSuccessfulRun", "lastScheduleTime", "lastRerunNonce", "lastSeekNonce", "inputs")
    status = {k: v for k, v in view.status.items() if k in kept}
    if inputs is not None:
        status["inputs"] = inputs
    generation = int(view.body["metadata"].get("generation", 0))
    state = run.get("applicationState", "")
    if run:
        status["currentRun"] = run
    if state in FINISHED_OK:
        status["lastSuccessfulRun"] = run["name"]
    conds, phase = _conditions(view, run, state, waiting, now)
    if no_spark_operator:
        conds, phase = conditions.stalled(NO_SPARK_OPERATOR, no_spark_operator), "Pending"
    if invalid:  # the spec cannot run: say so, whatever the last run did
        conds, phase = conditions.stalled(INVALID, invalid), "Failed"
    if upstream is not None:
        conds = [*with_upstream_note(conds, upstream), upstream]
    if paused:
        conds = conditions.with_paused(conds)
    status.update(
        observedGeneration=generation,
        phase=phase,
        conditions=conditions.merge(view.status.get("conditions"), conds, generation, format_time(now)),
    )
    return status


def resolved_inputs(spec: dict[str, Any], referenced: dict[int, list[str]]) -> list[dict[str, Any]]:
    """Each Kafka input's topics: as given, or (connectRef, transformRef) as what it references says now
    (`referenced`: input index → topics; an input whose reference is not there yet is left out). What a
    Replay counts and repositions for the Transform, and what a person reads to see what it reads."""
    resolved = []
    for index, item in enumerate(spec.get("inputs") or []):
        if "kafka" in item:
            resolved.append({"name": item["name"], "topics": list(item["kafka"].get("topics") or [])})
        elif index in referenced:
            resolved.append({"name": item["name"], "topics": referenced[index]})
    return resolved


def _conditions(
    view: TransformView, run: dict[str, Any], state: str, waiting: str, now: datetime
) -> tuple[list[Condition], str]:
    if view.suspended:
        return conditions.ready("Suspended", "suspended: no run is active"), "Suspended"
    if waiting:
        return conditions.waiting("InputsNotReady", waiting), "Pending"
    if not run:
        if view.spec.get("schedule"):
            return conditions.ready("Scheduled", f"waiting for the schedule {view.spec['schedule']}"), "Scheduled"
        return conditions.waiting("Submitting", "creating the first run"), "Pending"
    name = run.get("name", "")
    if run.get("errorMessage") and state == DEADLINE:
        return conditions.stalled(DEADLINE, run["errorMessage"]), "Failed"
    if state in FINISHED_FAILED:
        message = f"run {name} failed: {run.get('errorMessage') or 'no message from Spark'}"
        return conditions.stalled("RunFailed", message), "Failed"
    if state in FAILING:
        # Not final: the Spark Operator retries (streaming runs) or marks it FAILED at its next look.
        what = "could not be submitted" if state == "SUBMISSION_FAILED" else "is failing"
        message = f"run {name} {what}: {run.get('errorMessage') or 'no message from Spark'}"
        return conditions.waiting("RunFailing", message), "Running" if state == "FAILING" else "Pending"
    if state in FINISHED_OK:
        if view.streaming:
            return conditions.stalled("StreamEnded", f"streaming run {name} ended"), "Failed"
        back = f", {run['streamedBack']} streamed back" if "streamedBack" in run else ""
        records = f": {run['recordsOut']} records{back}" if "recordsOut" in run else ""
        return conditions.ready("Succeeded", f"run {name} completed{records}"), "Succeeded"
    trouble = run.get("podTrouble") or {}
    if trouble and state not in FINISHED_OK | FINISHED_FAILED:
        return conditions.waiting(trouble["reason"], f"run {name}: pod {trouble['pod']}: {trouble['message']}"), (
            "Running" if state in RUNNING else "Pending"
        )
    if state in RUNNING:
        executors = _executors_text(run)
        if view.streaming:
            return conditions.ready("Running", f"streaming run {name} is running{executors}"), "Running"
        return conditions.waiting("Running", f"run {name} is running{executors}"), "Running"
    submitted = run.get("submittedAt")
    if state == NEW and submitted and now - parse_time(submitted) > UNTOUCHED_AFTER:
        namespace = view.body["metadata"].get("namespace", "")
        message = (
            f"run {name}: no Spark Operator has taken up SparkApplication {name} in "
            f"{int(UNTOUCHED_AFTER.total_seconds())}s; is namespace {namespace} one of its job namespaces "
            "(the Spark Operator chart's spark.jobNamespaces)?"
        )
        return conditions.stalled(NOT_TAKEN_UP, message), "Pending"
    if state == QUEUED:
        queue = view.spec.get("queue")
        where = f"waiting for admission in queue {queue}" if queue else "suspended by its SparkApplication's spec"
        why = f": {run['admission']}" if run.get("admission") else ""
        return conditions.waiting("WaitingForAdmission", f"run {name} {where}{why}"), "Pending"
    pending = {
        NEW: f"run {name} created, waiting for the Spark Operator to submit it",
        "PENDING_RERUN": f"run {name} failed and is submitted again (attempt {int(run.get('attempts', 0)) + 1})",
        "UNKNOWN": f"run {name}: the state of its driver pod is unknown",
    }
    message = pending.get(state, f"run {name} submitted, waiting for its driver")
    return conditions.waiting("Submitted", message), "Pending"


# The Spark Operator says UNKNOWN of an executor whose pod is gone while its driver runs (deleted, evicted, or
# failed and removed by Spark) or whose node stopped answering: to a reader, an executor the run lost.
EXECUTOR_STATE_WORDS = {"UNKNOWN": "lost"}


def _executors_text(run: dict[str, Any]) -> str:
    counts = run.get("executors") or {}
    if not counts:
        return ""
    words = (f"{n} {EXECUTOR_STATE_WORDS.get(state, state.lower())}" for state, n in counts.items())
    return ", executors: " + ", ".join(words)


@dataclass(frozen=True)
class RunEnd:
    """A run that reached its end between two statuses: what the metrics count."""

    succeeded: bool
    seconds: float | None  # submission to end, when both are known


def _final(state: str) -> bool:
    return state in FINISHED_OK | FINISHED_FAILED or state == DEADLINE


def run_ended(before: dict[str, Any], after: dict[str, Any]) -> RunEnd | None:
    """The current run ended in `after` and had not in `before` (a new run, or the same one moving on)."""
    old, new = before.get("currentRun") or {}, after.get("currentRun") or {}
    state = str(new.get("applicationState", ""))
    if not _final(state) or (old.get("name") == new.get("name") and _final(str(old.get("applicationState", "")))):
        return None
    seconds = None
    if new.get("submittedAt") and new.get("finishedAt"):
        seconds = max(0.0, (parse_time(new["finishedAt"]) - parse_time(new["submittedAt"])).total_seconds())
    return RunEnd(succeeded=state in FINISHED_OK, seconds=seconds)


def last_success(status: dict[str, Any]) -> tuple[float, int | None] | None:
    """When the current run completed (Unix time) and the records it wrote, if it completed."""
    run = status.get("currentRun") or {}
    if run.get("applicationState") not in FINISHED_OK or not run.get("finishedAt"):
        return None
    records = run.get("recordsOut")
    return parse_time(run["finishedAt"]).timestamp(), int(records) if isinstance(records, int) else None
