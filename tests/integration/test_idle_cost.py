"""At rest the operator costs the API server almost nothing, and still follows what changes (issue 23).

The requests are counted by the API server itself, in its audit log (`fibers_stack.audit`), not by
the operator. This module's operator resyncs once an hour, so whatever reaches a status here came
by a watch event or a due time, never by polling; the Transform tests (test_transform.py) show the
same for SparkApplications, whose state reaches the Transform through the run watch.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fibers_stack import StackInfo, audit
from tests.helpers import Resources, produce, wait_for

IDLE = 20  # of each kind
BUDGET_PER_RESOURCE_PER_MINUTE = 1.0


@pytest.fixture(scope="module")
def operator_env() -> dict[str, str]:
    return {"FIBERS_RESYNC_SECONDS": "3600"}


def _idle_transform(i: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "inputs": [{"name": "changes", "kafka": {"topics": ["idle"]}}],
        "sql": "SELECT * FROM changes",
        "output": {"kafka": {"topic": "idle-out"}},
    }
    if i % 2:  # a suspended streaming query
        return spec | {"mode": "streaming", "state": "suspended", "checkpoint": {"location": "/tmp/idle"}}
    return spec | {"mode": "batch", "schedule": "0 0 1 1 *"}  # next fires on the 1st of January


def test_idle_consumers_and_transforms_stay_within_one_request_per_resource_per_minute(
    consumers: Resources, transforms: Resources, stack_info: StackInfo, namespace: str, unique: str
) -> None:
    for i in range(IDLE):
        consumers.create(f"{unique}-c{i}", {"sources": ["idle"], "sink": {"type": "log"}, "state": "stopped"})
        transforms.create(f"{unique}-t{i}", _idle_transform(i))
    for kind, resources in (("consumer", consumers), ("transform", transforms)):
        wait_for(
            lambda r=resources, k=kind: (
                all((r.status(f"{unique}-{k[0]}{i}") or {}).get("phase") for i in range(IDLE)) or None
            ),
            timeout=120,
            what=f"every idle {kind} with a phase",
        )
    time.sleep(10)  # the last status writes and their watch events
    since = datetime.now(UTC)
    time.sleep(60)
    until = datetime.now(UTC)
    time.sleep(3)  # the audit log is written in batches behind the requests
    found = audit.requests(Path(stack_info.audit_log), since, until, namespaces=(namespace, ""))
    minutes = (until - since).total_seconds() / 60
    budget = BUDGET_PER_RESOURCE_PER_MINUTE * 2 * IDLE * minutes
    assert len(found) <= budget, dict(audit.by_call(found))
    # Idle means idle: none of the per-object reads the timers made (a get and a list per tick each).
    per_object = [r for r in found if r.verb in ("get", "list") and r.resource in ("databusconsumers", "transforms")]
    assert len(per_object) <= 2, dict(audit.by_call(found))


def test_a_consumers_status_follows_its_checkpoint_without_polling(
    consumers: Resources, stack_info: StackInfo, unique: str
) -> None:
    """The checkpoint ConfigMap's watch event brings the consumer back: its status shows what the pod
    checkpointed (the resync, an hour away here, plays no part)."""
    produce(stack_info.kafka_bootstrap, unique, [{"id": i} for i in range(5)], key="id")
    consumers.create(unique, {"sources": [unique], "sink": {"type": "log"}})
    consumers.wait_status(unique, lambda s: s.get("phase") == "Running", timeout=180)
    status = consumers.wait_status(unique, lambda s: int(s.get("eventsProcessed") or 0) >= 5, timeout=60)
    assert status["consumptionMode"] == "ONLINE_CONSUMPTION"
    produce(stack_info.kafka_bootstrap, unique, [{"id": i} for i in range(5, 8)], key="id")
    consumers.wait_status(unique, lambda s: int(s.get("eventsProcessed") or 0) >= 8, timeout=60)
