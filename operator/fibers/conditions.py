"""kstatus-style conditions (Ready, Reconciling, Stalled) shared by every kind.

A condition's lastTransitionTime moves only when its status changes, so a message that is
refreshed does not look like a new event.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fibers.api import ANNOTATION_PAUSED

READY, RECONCILING, STALLED = "Ready", "Reconciling", "Stalled"


_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC, second precision: the form Kubernetes uses for timestamps."""
    return moment.astimezone(UTC).strftime(_TIME_FORMAT)


def parse_time(stamp: str) -> datetime:
    return datetime.strptime(stamp, _TIME_FORMAT).replace(tzinfo=UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str = ""


def merge(
    previous: list[dict[str, Any]] | None, current: list[Condition], generation: int, now: str
) -> list[dict[str, Any]]:
    """Render conditions, keeping each one's lastTransitionTime while its status is unchanged."""
    before = {c.get("type"): c for c in previous or []}
    rendered = []
    for cond in current:
        status = "True" if cond.status else "False"
        old = before.get(cond.type)
        since = (
            old["lastTransitionTime"] if old and old.get("status") == status and "lastTransitionTime" in old else now
        )
        rendered.append(
            {
                "type": cond.type,
                "status": status,
                "reason": cond.reason,
                "message": cond.message,
                "lastTransitionTime": since,
                "observedGeneration": generation,
            }
        )
    return rendered


def find(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def is_true(conditions: list[dict[str, Any]] | None, type_: str) -> bool:
    cond = find(conditions, type_)
    return bool(cond and cond.get("status") == "True")


def ready(reason: str, message: str) -> list[Condition]:
    """Ready, in kstatus terms: not reconciling, not stalled."""
    return [
        Condition(READY, True, reason, message),
        Condition(RECONCILING, False, reason),
        Condition(STALLED, False, reason),
    ]


def waiting(reason: str, message: str) -> list[Condition]:
    """Not ready, and the operator keeps trying without a change to the resource (Reconciling)."""
    return [
        Condition(READY, False, reason, message),
        Condition(RECONCILING, True, reason, message),
        Condition(STALLED, False, reason),
    ]


def stalled(reason: str, message: str) -> list[Condition]:
    """Not ready until someone changes the resource or what it points at (Stalled)."""
    return [
        Condition(READY, False, reason, message),
        Condition(RECONCILING, False, reason),
        Condition(STALLED, True, reason, message),
    ]


def with_upstream_note(conds: list[Condition], upstream: Condition) -> list[Condition]:
    """Ready's message also says when what the resource reads from is failing (Ready itself is unchanged)."""
    if upstream.status:
        return conds
    return [
        Condition(
            c.type,
            c.status,
            c.reason,
            f"{c.message}; upstream: {upstream.message}" if c.message else f"upstream: {upstream.message}",
        )
        if c.type == READY and upstream.message not in c.message
        else c
        for c in conds
    ]


PAUSED = Condition(
    RECONCILING, False, "ReconciliationPaused", f"reconciliation is paused by the {ANNOTATION_PAUSED} annotation"
)


def paused(meta: dict[str, Any]) -> bool:
    """The resource's owner asked the operator to leave it be (`fibers.dev/paused-reconciliation: "true"`):
    nothing is created, changed, stopped or sought for it; what is running keeps running, and its status
    still says what is observed."""
    return (meta.get("annotations") or {}).get(ANNOTATION_PAUSED) == "true"


def with_paused(conds: list[Condition]) -> list[Condition]:
    """Reconciling says that the operator acts on nothing while paused (Ready as observed, unchanged)."""
    return [PAUSED if c.type == RECONCILING else c for c in conds]
