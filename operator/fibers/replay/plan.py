"""A Replay's plan: its steps, and at each look what to do next (pure: no I/O).

A Replay moves its steps back one at a time, upstream first. Each step is told to seek by its own
spec.seek (a DatabusConsumer's checkpoints dropped and taken again from the position; a Transform run
again from it; a sink connector's consumer group moved through Kafka Connect's offsets API), with a
nonce of the Replay's, so writing it twice is one seek. A source connector has no position in time: it is
skipped (the topic it writes keeps what the steps after it read again), or with `sources: snapshot` asked
to send its tables again (Debezium's incremental snapshot, through its own seek). The next step is told
only once this one runs from the new position, as its own status says for the generation that carries
the seek. A step that fails ends the Replay there: the steps before it are repositioned, the ones after
untouched (Waiting), never left half way.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from fibers.conditions import find
from fibers.startfrom import StartFrom, StartFromError

KIND, PLURAL = "Replay", "replays"
SEEKABLE = ("Connect", "Transform", "DatabusConsumer")
WAITING, SEEKING, REPOSITIONED, SKIPPED, FAILED = "Waiting", "Seeking", "Repositioned", "Skipped", "Failed"
PENDING, RUNNING, SUCCEEDED = "Pending", "Running", "Succeeded"  # phases (and FAILED)
FINISHED = (SUCCEEDED, FAILED)
# A step's Ready=False with one of these reasons, for the generation that carries the seek, will not clear
# by waiting: the step failed.
STEP_FAILURES = {
    "InvalidSpec",
    "StartBeforeRetention",
    "RelayFallOff",
    "RelayChanged",
    "ConsumerFailing",
    "CheckpointInvalid",
    "RunFailed",
    "SubmissionDeadlineExceeded",
    "StreamEnded",
    "Conflict",
}


_LABEL_VALUE = re.compile(r"(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")

# A step's Ready=False with one of these reasons, for the generation that carries the seek, keeps the operator
# from taking the seek until a person changes something. (A DatabusConsumer takes its seek whatever its spec:
# the seek is how a consumer is put right.)
SEEK_BLOCKED = {
    "Connect": {"InvalidSpec", "Conflict", "ConnectorNotOwned", "ConsumerGroupInUse"},
    "Transform": {"InvalidSpec", "Conflict"},
    "DatabusConsumer": {"Conflict"},
}


class ReplaySpecError(ValueError):
    """The Replay cannot run; the message names the field."""


@dataclass(frozen=True)
class ReplaySpec:
    start: StartFrom
    sinks: str = "skip-existing"
    sources: str = "keep"  # keep | snapshot: what a source connector in the replay does
    pipeline: str | None = None
    resources: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, spec: dict[str, Any], now_ms: int) -> ReplaySpec:
        try:
            start = StartFrom.parse(spec.get("startFrom"), "spec.startFrom", ("earliest", "latest")).check(
                now_ms, "spec.startFrom"
            )
        except StartFromError as exc:
            raise ReplaySpecError(str(exc)) from None
        resources = tuple((str(r["kind"]), str(r["name"])) for r in spec.get("resources") or [])
        if not spec.get("pipeline") and not resources:
            raise ReplaySpecError("spec: name a pipeline or the resources to replay")
        if spec.get("pipeline") and not _LABEL_VALUE.fullmatch(str(spec["pipeline"])):
            # it is looked up as a label value: the API server would refuse the listing at every look
            raise ReplaySpecError("spec.pipeline must be a label value (letters, digits, -, _ and ., up to 63)")
        sinks, sources = str(spec.get("sinks") or "skip-existing"), str(spec.get("sources") or "keep")
        return cls(start, sinks, sources, spec.get("pipeline"), resources)


@dataclass
class Decision:
    """What this look decided: the status to write, and the seek to write on one step (if any)."""

    status: dict[str, Any]
    seek: tuple[str, str, dict[str, Any]] | None = None  # (kind, name, spec.seek)
    changed_steps: list[str] = field(default_factory=list)  # "Kind/name: state" for Events
    repositioned: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) moved in this look


def nonce(replay_name: str, uid: str) -> str:
    """The seek nonce this Replay writes on every step: its own, so a second write is the same seek."""
    return f"replay-{replay_name[:40]}-{hashlib.sha256(uid.encode()).hexdigest()[:8]}"


def new_steps(planned: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """Status entries for the planned steps ((kind, name, why skipped or "")), in order."""
    return [
        {"kind": kind, "name": name, "state": SKIPPED if why else WAITING, **({"message": why} if why else {})}
        for kind, name, why in planned
    ]


def seek_of(kind: str, spec: ReplaySpec, seek_nonce: str) -> dict[str, Any]:
    seek: dict[str, Any] = {"nonce": seek_nonce, "startFrom": spec.start.to_dict()}
    if kind == "DatabusConsumer":
        seek["sinks"] = spec.sinks
    return seek


def position(kind: str, body: dict[str, Any]) -> str:
    """Where a step is, for the record: a consumer's last window SCN, a Transform's last run."""
    status = body.get("status") or {}
    if kind == "Connect":
        return f"connector {status.get('connectorState', 'not running')}"
    if kind == "DatabusConsumer":
        return f"window SCN {status['windowScn']}" if "windowScn" in status else "no checkpoint"
    run = status.get("currentRun") or {}
    return f"run {run['name']} ({run.get('applicationState', '-')})" if run.get("name") else "no run"


def step_state(kind: str, body: dict[str, Any] | None, seek_nonce: str) -> tuple[str, str]:
    """Where a step told to seek stands: (SEEKING | REPOSITIONED | FAILED, message)."""
    if body is None:
        return FAILED, "deleted while the replay ran"
    meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
    if (spec.get("seek") or {}).get("nonce") != seek_nonce:
        return FAILED, "its spec.seek was changed by someone else while the replay ran"
    if kind == "Transform" and spec.get("state") == "suspended":
        # A suspended Transform takes no seek until it is resumed: its first run then is the seek's.
        return REPOSITIONED, "suspended: its run of the seek starts when it is resumed"
    generation = int(meta.get("generation", 0))
    ready = find(status.get("conditions"), "Ready") or {}
    if int(status.get("observedGeneration", -1)) != generation:
        return SEEKING, "waiting for the operator to take the seek"
    if status.get("lastSeekNonce") != seek_nonce:
        # The operator has seen the seek and not taken it: what holds it is on Ready. Some of that only a person
        # changes, and the replay would wait for ever (holding its steps from every other replay).
        if ready.get("status") != "False":
            return SEEKING, "waiting for the operator to take the seek"
        why = f"{ready.get('reason', 'waiting')}: {ready.get('message', '')}"
        if ready.get("reason") in SEEK_BLOCKED.get(kind, ()):
            return FAILED, f"cannot take the seek: {why}"
        return SEEKING, f"the seek waits: {why}"
    if kind == "Connect":
        moved = find(status.get("conditions"), "Offsets") or {}
        if moved.get("reason") not in ("Repositioned", "SnapshotRequested"):
            return FAILED, f"{moved.get('reason', 'SeekFailed')}: {moved.get('message', '')}"
        if ready.get("status") != "True" and spec.get("state", "running") == "running":
            return SEEKING, f"moved; {ready.get('reason', 'waiting')}: {ready.get('message', '')}"
        return REPOSITIONED, str(moved.get("message", ""))
    if kind == "DatabusConsumer" and spec.get("state") in ("stopped", "suspended"):
        return REPOSITIONED, "stopped: it starts from the new position when it runs again"
    if kind == "Transform" and (status.get("currentRun") or {}).get("trigger") != "seek":
        return SEEKING, "waiting for the run of the seek"
    if ready.get("status") == "True":
        return REPOSITIONED, f"{ready.get('reason', 'Ready')}: running from the new position"
    if ready.get("reason") in STEP_FAILURES:
        return FAILED, f"{ready['reason']}: {ready.get('message', '')}"
    return SEEKING, f"{ready.get('reason', 'waiting')}: {ready.get('message', '')}".strip()


def decide(
    spec: ReplaySpec, status: dict[str, Any], targets: dict[str, dict[str, Any] | None], seek_nonce: str, now: str
) -> Decision:
    """The next move over the planned steps (`status.steps`), given each step's body as read now
    (`targets`, by "Kind/name"; None: gone)."""
    status = {**status, "steps": [dict(s) for s in status.get("steps") or []]}
    decision = Decision(status)
    if status.get("phase") in FINISHED:
        return decision
    status.setdefault("startedAt", now)
    status["phase"] = RUNNING
    for step in status["steps"]:
        key = f"{step['kind']}/{step['name']}"
        if step["state"] in (REPOSITIONED, SKIPPED):
            continue
        body = targets.get(key)
        if step["state"] == WAITING:
            if body is None:
                _finish(step, FAILED, "not found", now, decision)
            else:
                step.update(state=SEEKING, nonce=seek_nonce, before=position(step["kind"], body), startedAt=now)
                decision.seek = (step["kind"], step["name"], seek_of(step["kind"], spec, seek_nonce))
                decision.changed_steps.append(f"{key}: told to seek")
                break
        state, message = step_state(step["kind"], body, seek_nonce)
        if state == SEEKING:
            step["message"] = message
            break
        if state == REPOSITIONED and step["kind"] == "Connect" and body is not None:
            last = ((body.get("status") or {}).get("offsets") or {}).get("lastOperation") or {}
            if "records" in last:
                step["records"] = last["records"]
        _finish(step, state, message, now, decision)
        if state == FAILED:
            break
    failed = next((s for s in status["steps"] if s["state"] == FAILED), None)
    done = sum(s["state"] in (REPOSITIONED, SKIPPED) for s in status["steps"])
    status["progress"] = f"{done}/{len(status['steps'])}"
    if failed is not None:
        status.update(phase=FAILED, finishedAt=now)
    elif done == len(status["steps"]):
        status.update(phase=SUCCEEDED, finishedAt=now)
    return decision


def _finish(step: dict[str, Any], state: str, message: str, now: str, decision: Decision) -> None:
    step.update(state=state, message=message, finishedAt=now)
    decision.changed_steps.append(f"{step['kind']}/{step['name']}: {state.lower()}")
    if state == REPOSITIONED:
        decision.repositioned.append((step["kind"], step["name"]))


def overlapping(mine: list[dict[str, Any]], others: list[dict[str, Any]], me: dict[str, Any]) -> str:
    """The name of an older unfinished Replay with a step of mine ("" if none): the newer one gives way."""
    keys = {(s["kind"], s["name"]) for s in mine}
    my_age = (me["metadata"]["creationTimestamp"], me["metadata"]["name"])
    for other in others:
        meta, ostatus = other["metadata"], other.get("status") or {}
        if meta["name"] == me["metadata"]["name"] or ostatus.get("phase") in FINISHED:
            continue
        if (meta["creationTimestamp"], meta["name"]) > my_age:
            continue
        same_pipeline = bool(me["spec"].get("pipeline")) and other["spec"].get("pipeline") == me["spec"]["pipeline"]
        if same_pipeline or keys & {(s["kind"], s["name"]) for s in ostatus.get("steps") or []}:
            return str(meta["name"])
    return ""
