"""What a Transform's status says of its runs (pure: no I/O).

`mirror_run` reads the current run from its SparkApplication (and the job's result ConfigMap); `report`
makes the status and its conditions from it; `run_ended` and `last_success` tell the metrics what ended.
Which runs there should be is `runs.plan`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fibers import conditions
from fibers.conditions import Condition, format_time, parse_time, with_upstream_note
from fibers.transform.runs import (
    DEADLINE,
    INVALID,
    MESSAGE_LIMIT,
    NEW,
    NO_SPARK_OPERATOR,
    NOT_TAKEN_UP,
    QUEUED,
    UNTOUCHED_AFTER,
    TransformView,
)
from fibers.transform.sparkapp import (
    FAILING,
    FINISHED_FAILED,
    FINISHED_OK,
    RUNNING,
    SUSPENDED_BY_SPEC,
    executor_states,
    state_of,
)


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
    conflict: str = "",
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
    if conflict:  # its run's name is taken by an object it does not own
        conds, phase = conditions.stalled("Conflict", conflict), "Failed"
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
