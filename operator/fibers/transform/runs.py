"""Which runs a Transform should have (pure: no I/O), and the words its runs are recorded with.

A run is one SparkApplication. `plan` looks at the spec, the recorded status and the
SparkApplications that exist, and decides what to start and what to delete; `next_look` says when the
clock alone calls for another look. What the status says of the runs is `report`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from croniter import croniter

from fibers.conditions import format_time, parse_time
from fibers.transform.sparkapp import (
    FINISHED_FAILED,
    FINISHED_OK,
    NO_WORKLOAD,
    WAITING_FOR_DRIVER,
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


def _new_run(view: TransformView, key: str, kept: Mapping[str, object]) -> str:
    """The name of a run a spec, nonce or Secrets digest starts: `key`'s, unless a run kept in history has
    it (the spec, nonce or Secret put back as it was: A → B → A). That run is an old one, not this start,
    whose create would meet it, take it for its own retried submit and report its result; so the name
    takes a count. A retried start needs no such name: it is the one recorded before its create."""
    name, count = run_name(view.name, view.uid, key), 0
    while name in kept:
        count += 1
        name = run_name(view.name, view.uid, f"{key}/{count}")
    return name


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
    recorded_only = bool(current.get("name")) and current_app is None and not current.get("applicationState")
    if recorded_only and current.get("specHash") == digest:
        # Recorded but never created (the operator stopped between its write-ahead and the create, or the create
        # failed): created now, before anything else is due. The slot or nonce it is for was recorded with it,
        # so nothing else would ever start it (a schedule's branch below once hid this one: the run was lost).
        result.start = (current["name"], current.get("trigger", "create"))
    elif nonce and nonce != view.status.get("lastRerunNonce"):
        result.rerun_nonce = nonce
        result.start = (_new_run(view, f"rerun/{nonce}/{digest}", by_name), "rerun")
    elif seek.get("nonce") and seek["nonce"] != view.status.get("lastSeekNonce"):
        result.seek_nonce = seek["nonce"]
        result.start = (_new_run(view, f"seek/{seek['nonce']}/{digest}", by_name), "seek")
    elif _secrets_moved(view, current_app, secrets_digest):
        # Restarted from its checkpoint (a new run of the same spec), to take the new values.
        result.start = (_new_run(view, f"secret/{secrets_digest}/{digest}", by_name), "secret-change")
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
        result.start = (_new_run(view, f"{trigger}/{digest}", by_name), trigger)

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
