"""What the operator reads of a consumer's instances: exit messages, and a not-ready instance's own reason."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from fibers.consumer.telemetry import Snapshot, Telemetry
from fibers.databus import instances
from fibers.databus.report import decide, stopped_instances, which_instance
from fibers_stack import process

STS_UID = "sts-uid"


def pod(name: str, *, ready: bool, owner: str = STS_UID, ip: str = "127.0.0.1", **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "ownerReferences": [{"kind": "StatefulSet", "uid": owner}], **extra},
        "status": {
            "podIP": ip,
            "containerStatuses": [{"name": "consumer", "ready": ready, "state": {"running": {"startedAt": "x"}}}],
        },
    }


def serving(waiting_since: float | None) -> int:
    """A consumer's /ready on a free local port, as its pod serves it."""
    snapshot = Snapshot(
        events=0,
        mode="ONLINE_CONSUMPTION",
        sinks=[],
        timelines=[],
        checkpoint_writes=0,
        rollbacks={},
        attempt=0,
        api_waiting_since=waiting_since,
    )
    port = process.free_port("127.0.0.1")
    Telemetry(f"c{port}", lambda: snapshot).serve(port)
    return port


def test_a_not_ready_instance_of_the_statefulset_is_asked_why_and_no_other_pod_is() -> None:
    port = serving(time.time() - 60)
    reasons = asyncio.run(
        instances.unready_reasons(
            [
                pod("orders-1", ready=False),
                pod("orders-0", ready=True),  # ready: not asked
                pod("impostor", ready=False, owner="another-uid"),  # labelled as an instance, not the StatefulSet's
                pod("going", ready=False, deletionTimestamp="2026-11-27T00:00:00Z"),
            ],
            STS_UID,
            port,
        )
    )
    assert reasons.startswith("orders-1: waiting for the API server to take its checkpoints since ")
    assert "impostor" not in reasons and "going" not in reasons


def test_an_instance_that_is_ready_or_does_not_answer_gives_no_reason() -> None:
    port = serving(None)  # answers 200
    closed = process.free_port("127.0.0.1")
    assert asyncio.run(instances.unready_reasons([pod("orders-0", ready=False)], STS_UID, port)) == ""
    assert asyncio.run(instances.unready_reasons([pod("orders-0", ready=False)], STS_UID, closed)) == ""


def test_a_consumer_with_no_instance_to_ask_costs_no_http_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every consumer reconcile asks; most have nothing to ask (stopped, or every instance ready). A client
    made anyway loaded the CA bundle each time: ~40 ms of CPU per reconcile, 3/4 of a restart's."""
    made: list[dict[str, Any]] = []
    real = httpx.AsyncClient

    def counted(**options: Any) -> httpx.AsyncClient:
        made.append(options)
        return real(**options)

    monkeypatch.setattr(instances.httpx, "AsyncClient", counted)
    assert asyncio.run(instances.unready_reasons([], STS_UID)) == ""
    assert asyncio.run(instances.unready_reasons([pod("orders-0", ready=True)], STS_UID)) == ""
    assert made == []
    port = serving(time.time() - 60)
    assert asyncio.run(instances.unready_reasons([pod("orders-1", ready=False)], STS_UID, port))
    assert len(made) == 1 and made[0]["verify"] is False  # plain HTTP to a pod: no CA bundle to load


def test_the_exit_message_of_an_instance_not_running_again_is_kept_and_redacted() -> None:
    failed = {
        "metadata": {"name": "orders-0"},
        "status": {
            "containerStatuses": [
                {
                    "ready": False,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 1, "message": "mongodb://u:secret@db failed"}},
                }
            ]
        },
    }
    which, message = instances.exit_message([pod("orders-0", ready=True), {**failed, "metadata": {"name": "orders-2"}}])
    assert "secret" not in message and message.endswith("failed") and which == 2
    assert instances.exit_message([pod("orders-0", ready=True)]) == (-1, "")


def test_ready_names_the_instance_that_failed() -> None:
    """Ready said "an instance exited: …": with three instances, nobody knew which pod to look at."""
    conds, phase = decide({"instances": 3}, {}, "", "", "ValueError: bad row", "", failing=which_instance(1, 3))
    ready = next(c for c in conds if c.type == "Ready")
    assert (phase, ready.reason) == ("Failed", "ValueError")
    assert ready.message == "instance 2 of 3 (pod ordinal 1) exited: ValueError: bad row"
    assert stopped_instances({"fibers.dev/stopped-1": "KeyError: x"}, 3) == (1, "KeyError: x")


def test_a_waiting_instance_is_the_consumers_condition() -> None:
    status = {"readyInstances": 1, "consumptionMode": "ONLINE_CONSUMPTION"}
    said = "orders-1: waiting for the API server to take its checkpoints since 2026-11-27T02:00:00Z"
    conds, phase = decide({"instances": 2}, status, "", "", "", "", unready=said)
    assert phase == "Pending"
    assert (conds[0].status, conds[0].reason) == (False, "InstancesWaiting")
    assert conds[0].message == f"1/2 instances ready; {said}"


def test_a_running_instance_that_says_nothing_yet_is_asked_again_a_few_times_then_left() -> None:
    """Nothing changes while an instance waits (for its relay topic, say) after its first, silent answer."""
    started = datetime(2026, 11, 28, 4, 0, 0, tzinfo=UTC)
    starting = pod("orders-0", ready=False)
    starting["status"]["containerStatuses"][0]["state"]["running"]["startedAt"] = "2026-11-28T04:00:00Z"
    at = instances.look_due

    assert at([starting], STS_UID, started + timedelta(seconds=1)) == started + timedelta(seconds=3)
    assert at([starting], STS_UID, started + timedelta(seconds=20)) == started + timedelta(seconds=30)
    assert at([starting], STS_UID, started + timedelta(minutes=5)) is None  # silent for good: left to the resync
    ready = pod("orders-0", ready=True)
    ready["status"]["containerStatuses"][0]["state"]["running"]["startedAt"] = "2026-11-28T04:00:00Z"
    assert at([ready], STS_UID, started) is None
    assert at([dict(starting, metadata={"name": "x", "ownerReferences": [{"uid": "other"}]})], STS_UID, started) is None


def test_a_stopped_consumer_says_stopped_only_once_its_pods_are_gone() -> None:
    """Ready said Stopped as soon as no pod was ready: an exited pod was still listed (CI saw it), and a user
    reading Stopped then found a pod of the consumer. It says Stopping while any pod of it remains."""
    spec = {"instances": 1, "state": "stopped"}
    conds, phase = decide(spec, {"readyInstances": 0}, "", "", "", "", remaining=1)
    assert (phase, conds[0].reason, conds[0].message) == ("Pending", "Stopping", "1 instance(s) still stopping")
    conds, phase = decide(spec, {"readyInstances": 0}, "", "", "", "", remaining=0)
    assert (phase, conds[0].reason) == ("Stopped", "Stopped")
