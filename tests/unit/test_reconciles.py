"""The reconcile queue, the reference index and the watch scope: pure logic, no servers."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest

from fibers import controller
from fibers.api import FINALIZER
from fibers.databus import handlers as databus_handlers
from fibers.kubeapi import Unreachable
from fibers.readiness import Readiness
from fibers.reconciles import Again, Pacing, Reconciles
from fibers.replay import handlers as replay_handlers
from fibers.transform import handlers as transform_handlers
from fibers.transform import runs
from fibers.upstream import Dependents, Ref
from fibers.watches import Scope

FAST = Pacing(child_delay=0.01, upstream_delay=0.01, retry_min=0.05, retry_max=0.2, resync=3600)


async def _running(queue: Reconciles, body: Callable[[], Awaitable[None]]) -> None:
    task = asyncio.create_task(queue.run())
    try:
        await body()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_a_burst_of_changes_is_one_reconcile_and_the_resource_asks_for_its_next_time() -> None:
    calls: list[tuple[str, str]] = []
    wake_at = time.time() + 0.3

    async def reconcile(namespace: str, name: str) -> Again | None:
        calls.append((namespace, name))
        return Again(at=wake_at) if len(calls) == 1 else Again()

    async def body() -> None:
        queue = Reconciles(FAST)
        queue.register("Transform", reconcile)
        for _ in range(50):  # e.g. a checkpoint written fifty times, each a watch event
            queue.soon("Transform", "ns", "a", delay=0.05)
        await _running(queue, lambda: _until(lambda: len(calls) == 2))
        assert calls == [("ns", "a"), ("ns", "a")]
        assert time.time() >= wake_at  # the second look came at the time the first asked for
        assert queue.due("Transform", "ns", "a") == pytest.approx(time.time() + 3600, abs=400)  # then the resync

    asyncio.run(body())


def test_one_resource_is_never_reconciled_twice_at_once_and_a_change_meanwhile_is_not_lost() -> None:
    active, most, calls = 0, 0, 0

    async def body() -> None:
        started, release = asyncio.Event(), asyncio.Event()

        async def reconcile(namespace: str, name: str) -> Again | None:
            nonlocal active, most, calls
            active += 1
            most = max(most, active)
            calls += 1
            started.set()
            await release.wait()  # held until the change below has arrived (no race with a clock)
            active -= 1
            return Again()

        queue = Reconciles(FAST)
        queue.register("DatabusConsumer", reconcile)

        async def scenario() -> None:
            queue.soon("DatabusConsumer", "ns", "c")
            await asyncio.wait_for(started.wait(), 5)
            queue.soon("DatabusConsumer", "ns", "c")  # changed while being looked at
            await asyncio.sleep(0.1)  # the queue has handed it to a worker, which saw it running
            assert calls == 1
            release.set()
            await _until(lambda: calls == 2 and active == 0)

        await _running(queue, scenario)
        assert most == 1

    asyncio.run(body())


def test_a_cancelled_queue_ends_even_when_woken_at_that_moment() -> None:
    """asyncio.wait_for could swallow a cancellation arriving with the wake-up (before Python 3.12)."""

    async def body() -> None:
        queue = Reconciles(FAST)
        queue.register("Transform", lambda namespace, name: asyncio.sleep(0, Again()))
        for _ in range(200):
            task = asyncio.create_task(queue.run())
            await asyncio.sleep(0)
            queue.soon("Transform", "ns", "t")  # sets the queue's wake-up
            task.cancel()
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 2)

    asyncio.run(body())


def test_a_failing_reconcile_is_retried_with_backoff_and_a_gone_resource_is_forgotten() -> None:
    times: list[float] = []

    async def reconcile(namespace: str, name: str) -> Again | None:
        times.append(time.monotonic())
        if len(times) < 4:
            raise Unreachable("ConnectError: connection refused")
        return None  # deleted meanwhile

    async def body() -> None:
        queue = Reconciles(FAST)
        queue.register("Transform", reconcile)
        queue.soon("Transform", "ns", "t")
        await _running(queue, lambda: _until(lambda: len(times) == 4 and queue.done == 4))
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert gaps[0] >= 0.04 and gaps[1] >= 0.09 and gaps[2] >= 0.18  # 0.05, 0.1, 0.2 (retry_max)
        assert queue.due("Transform", "ns", "t") is None  # gone: nothing more is due

    asyncio.run(body())


def test_a_deleted_resource_is_retired_only_after_the_reconcile_running_for_it_has_ended() -> None:
    """The delete handler drops a resource's series after `retire`: a reconcile that read the resource just
    before the delete must not set them again once they are gone (a series served for a deleted consumer)."""
    series: set[str] = set()
    inside, release = asyncio.Event(), asyncio.Event()

    async def reconcile(namespace: str, name: str) -> Again | None:
        inside.set()
        await release.wait()
        series.add(name)  # what a reconcile publishes as it ends (metrics, remembered messages)
        return Again()

    async def body() -> None:
        queue = Reconciles(FAST)
        queue.register("DatabusConsumer", reconcile)
        queue.soon("DatabusConsumer", "ns", "c")

        async def deleted() -> None:
            await inside.wait()
            retired = asyncio.create_task(queue.retire("DatabusConsumer", "ns", "c"))
            await asyncio.sleep(0.05)
            assert not retired.done()  # still running: retiring waits for it
            release.set()
            await retired
            series.discard("c")  # the handler's forget_consumer
            await asyncio.sleep(0.05)
            assert series == set() and queue.due("DatabusConsumer", "ns", "c") is None

        await _running(queue, deleted)

    asyncio.run(body())


def test_a_resource_waiting_for_something_without_events_is_looked_at_again() -> None:
    async def body() -> None:
        queue = Reconciles(Pacing(waiting=30, resync=600, resync_jitter=0))
        calls: list[int] = []

        async def reconcile(namespace: str, name: str) -> Again | None:
            calls.append(1)
            return Again(waiting=True)

        queue.register("DatabusConsumer", reconcile)
        queue.soon("DatabusConsumer", "ns", "c")
        await _running(
            queue, lambda: _until(lambda: bool(calls) and queue.due("DatabusConsumer", "ns", "c") is not None)
        )
        assert queue.due("DatabusConsumer", "ns", "c") == pytest.approx(time.time() + 30, abs=2)

    asyncio.run(body())


def test_a_change_upstream_brings_back_exactly_its_readers() -> None:
    async def body() -> None:
        queue = Reconciles(FAST)
        for reader in (("Transform", "ns", "t"), ("DatabusConsumer", "ns", "c"), ("Transform", "other", "t")):
            queue.soon(*reader, delay=3600)  # handed over by kopf (and looked at long ago)
        queue.dependents.note(("Transform", "ns", "t"), [Ref("Connect", "pg", "spec.inputs[0].connectRef", 0)])
        queue.dependents.note(
            ("DatabusConsumer", "ns", "c"), [Ref("Connect", "pg", "spec.sourceRefs[0].connectRef", 0)]
        )
        queue.dependents.note(("Transform", "other", "t"), [Ref("Connect", "pg", "spec.inputs[0].connectRef", 0)])
        queue.changed("Connect", "ns", "pg")
        soon = time.time() + 1
        assert (queue.due("Transform", "ns", "t") or 0) < soon
        assert (queue.due("DatabusConsumer", "ns", "c") or 0) < soon
        assert (queue.due("Transform", "other", "t") or 0) > soon  # same name, another namespace

    asyncio.run(body())


def test_a_childs_event_about_a_resource_kopf_did_not_hand_over_is_dropped() -> None:
    """A standby operator (kopf peering) gets no handler calls: it must not act on child events either."""

    async def body() -> None:
        queue = Reconciles(FAST)
        queue.nudge("DatabusConsumer", "ns", "c", delay=0)
        assert queue.due("DatabusConsumer", "ns", "c") is None
        queue.soon("DatabusConsumer", "ns", "c", delay=60)
        queue.nudge("DatabusConsumer", "ns", "c", delay=0)
        assert (queue.due("DatabusConsumer", "ns", "c") or 60) < time.time() + 1
        queue.forget("DatabusConsumer", "ns", "c")
        queue.nudge("DatabusConsumer", "ns", "c", delay=0)
        assert queue.due("DatabusConsumer", "ns", "c") is None

    asyncio.run(body())


def test_dependents_follow_what_each_reader_references_now() -> None:
    index = Dependents()
    reader = ("Transform", "ns", "t")
    index.note(reader, [Ref("Connect", "a", "f", 0), Ref("Transform", "b", "f", 1)])
    assert index.of("Connect", "ns", "a") == [reader] and index.of("Transform", "ns", "b") == [reader]
    index.note(reader, [Ref("Connect", "a", "f", 0)])  # the transformRef was removed from the spec
    assert index.of("Transform", "ns", "b") == []
    index.forget(reader)
    assert index.of("Connect", "ns", "a") == []


def test_the_watch_scope_is_kopfs_namespaces() -> None:
    assert Scope([]).namespaces == [None] and Scope([""]).namespaces == [None]  # cluster-wide
    assert Scope(["a", "b", "a"]).namespaces == ["a", "b"]
    globbed = Scope(["team-*", "!team-secret"])
    assert globbed.namespaces == [None]  # one watch of the cluster, filtered here
    assert globbed.includes("team-a") and not globbed.includes("team-secret") and not globbed.includes("kube-system")
    assert Scope(["!kube-*"]).includes("default") and not Scope(["!kube-*"]).includes("kube-system")


def _view(spec: dict[str, Any], status: dict[str, Any] | None = None) -> runs.TransformView:
    meta = {"name": "t", "uid": "u", "creationTimestamp": "2026-11-24T00:00:00Z", "generation": 1}
    return runs.TransformView({"metadata": meta, "spec": spec, "status": status or {}})


def test_a_transform_asks_to_be_looked_at_at_its_next_slot_and_its_deadline_only() -> None:
    now = datetime(2026, 11, 24, 10, 7, 30, tzinfo=UTC)
    scheduled = _view({"schedule": "*/15 * * * *"})
    assert runs.next_look(scheduled, [], now) == datetime(2026, 11, 24, 10, 15, tzinfo=UTC)
    assert runs.next_look(_view({"schedule": "*/15 * * * *", "state": "suspended"}), [], now) is None
    assert runs.next_look(_view({}), [], now) is None  # a batch run with no schedule: events only
    for unusable in ("61 * * * *", "0 0 30 2 *"):  # reported as InvalidSpec; never a time, never an exception
        assert runs.next_look(_view({"schedule": unusable}), [], now) is None

    app = {"metadata": {"name": "r1", "creationTimestamp": "2026-11-24T10:07:00Z"}, "status": {}}
    waiting = _view(
        {"submissionDeadlineSeconds": 60}, {"currentRun": {"name": "r1", "submittedAt": "2026-11-24T10:07:00Z"}}
    )
    due = runs.next_look(waiting, [app], now)
    assert due is not None and timedelta(0) < due - datetime(2026, 11, 24, 10, 8, tzinfo=UTC) < timedelta(seconds=1)
    running = {**app, "status": {"applicationState": {"state": "RUNNING"}}}
    assert runs.next_look(waiting, [running], now) is None  # its driver runs: no deadline any more
    failed = _view(
        {"submissionDeadlineSeconds": 60},
        {"currentRun": {"name": "r1", "applicationState": runs.DEADLINE}},
    )
    assert runs.next_look(failed, [app], now) is None  # already failed for it: not again and again


def test_no_kind_has_a_timer_per_object() -> None:
    """Time-triggered work comes from the one queue (fibers.reconciles), not from a kopf timer per resource."""
    assert controller.RECONCILED_KINDS  # the handlers are registered
    spawning = kopf.get_default_registry()._spawning.get_all_handlers()
    timed = {h.selector.any_name for h in spawning if h.selector is not None}  # type: ignore[attr-defined]
    assert "schemas" in timed  # the check sees timers (Schemas keep theirs: it calls the registry only when due)
    assert not timed & {"databusconsumers", "transforms"}
    assert math.isinf(Again().at)


def test_a_childs_change_after_a_quiet_spell_is_looked_at_at_once_and_a_burst_after_it_once() -> None:
    starts: list[float] = []

    async def reconcile(namespace: str, name: str) -> Again | None:
        starts.append(time.monotonic())
        return Again()

    async def body() -> None:
        queue = Reconciles(Pacing(child_delay=0.5, resync=3600))
        queue.register("Transform", reconcile)

        async def scenario() -> None:
            queue.soon("Transform", "ns", "t")
            await _until(lambda: len(starts) == 1)
            await asyncio.sleep(0.6)  # quiet for longer than child_delay
            nudged = time.monotonic()
            queue.nudge("Transform", "ns", "t", delay=0.5)  # e.g. the run's driver ended
            await _until(lambda: len(starts) == 2)
            assert starts[1] - nudged < 0.2  # at once, not child_delay later
            for _ in range(20):  # then a burst: its pods going one by one
                queue.nudge("Transform", "ns", "t", delay=0.5)
                await asyncio.sleep(0.01)
            await _until(lambda: len(starts) == 3)
            assert starts[2] - starts[1] >= 0.49  # one look for the burst, child_delay after the last
            await asyncio.sleep(0.7)
            assert len(starts) == 3

        await _running(queue, scenario)

    asyncio.run(body())


def test_kopf_hands_consumers_and_transforms_over_without_its_change_detection() -> None:
    """kopf's resume, create and update handlers build, compare and store a diff base for each resource and
    log two lines per run: half the CPU of an operator restarted beside 3,000 resources (`bench/operator_restart`).
    These kinds reach the queue from their watch events; only the consumer's deletion is a change handler."""
    assert controller.RECONCILED_KINDS  # importing the controller registers every kind's handlers
    registry = kopf.get_default_registry()
    for plural, deletion in (("databusconsumers", {"consumer_deleted"}), ("transforms", set())):
        resource = kopf.Resource("fibers.dev", "v1beta1", plural)
        assert {h.id for h in registry._changing.get_resource_handlers(resource)} == deletion, plural
        assert registry._watching.has_handlers(resource=resource), plural


def test_a_watch_event_is_looked_at_only_when_it_changes_what_the_reconcile_acts_on() -> None:
    """At a restart each resource is looked at once, from the listing; after that, its spec, labels and
    annotations are what a reconcile acts on, and our own status writes (or kopf's annotations) are no reason
    to look again. A resource created again under its name is new."""
    queue = Reconciles(FAST)
    key = ("DatabusConsumer", "shop", "orders")
    meta: dict[str, Any] = {"namespace": "shop", "name": "orders", "uid": "u1", "generation": 1}

    def looked_at(event_type: str | None, **changes: Any) -> bool:
        meta.update(changes)
        queue.forget(*key)  # what was due is done: only this event can make it due again
        queue.observe(key[0], event_type, dict(meta))
        return queue.due(*key) is not None

    assert looked_at(None)  # the watch's listing at start-up
    assert not looked_at("MODIFIED", resourceVersion="2")  # a status write of ours
    assert not looked_at("MODIFIED", annotations={"kopf.fibers.dev/last-handled-configuration": "{}"})
    assert looked_at("MODIFIED", generation=2)  # its spec
    assert looked_at("MODIFIED", annotations={"fibers.dev/restart": "now"})
    assert looked_at("MODIFIED", labels={"fibers.dev/pipeline": "orders"})
    assert not looked_at(None)  # listed again after a lost watch: nothing changed
    assert not looked_at("MODIFIED", deletionTimestamp="2026-11-29T12:00:00Z", generation=3)  # its deletion's
    assert not looked_at("DELETED")
    del meta["deletionTimestamp"]
    assert looked_at("ADDED", uid="u2", generation=1)  # created again


@pytest.mark.parametrize("kind", ["Transform", "Replay"])
def test_a_late_deleted_event_of_an_earlier_resource_does_not_end_the_one_created_under_its_name(kind: str) -> None:
    """kopf handles each uid's events apart: after a delete and an apply, the new resource's first event may
    be handled before the old one's DELETED. That DELETED must not retire the new one, which would then be
    looked at by nothing (not even its children's events) until it changed."""
    queue = Reconciles(FAST)
    old = {"namespace": "shop", "name": "etl", "uid": "u1", "generation": 1}
    new = {**old, "uid": "u2"}
    handler: Any = {"Transform": transform_handlers.transform_event, "Replay": replay_handlers.replay_event}[kind]

    async def event(event_type: str | None, meta: dict[str, Any]) -> None:
        raw: Any = {"type": event_type, "object": {"metadata": dict(meta)}}
        memo = kopf.Memo(reconciles=queue, readiness=Readiness())
        await handler(event=raw, body=kopf.Body(raw["object"]), memo=memo)

    asyncio.run(event(None, old))
    asyncio.run(event("ADDED", new))
    asyncio.run(event("DELETED", old))
    assert queue.due(kind, "shop", "etl") is not None  # the new one is still looked at
    asyncio.run(event("DELETED", new))
    assert queue.due(kind, "shop", "etl") is None


def test_a_consumer_is_handed_over_once_it_carries_the_finalizer_its_delete_handler_needs() -> None:
    """kopf adds its finalizer after the event handlers have run: a consumer whose StatefulSet was made first
    could be deleted without its delete handler (checkpoint retention, its series)."""
    queue = Reconciles(FAST)
    meta: dict[str, Any] = {"namespace": "shop", "name": "orders", "uid": "u1", "generation": 1}

    async def event(kind: str | None) -> None:
        raw: Any = {"type": kind, "object": {"metadata": dict(meta)}}
        memo = kopf.Memo(reconciles=queue, readiness=Readiness())
        await databus_handlers.consumer_event(event=raw, body=kopf.Body(raw["object"]), memo=memo)

    asyncio.run(event("ADDED"))
    assert queue.due("DatabusConsumer", "shop", "orders") is None
    meta["finalizers"] = [FINALIZER]
    asyncio.run(event("MODIFIED"))  # kopf's patch
    assert queue.due("DatabusConsumer", "shop", "orders") is not None
