"""The operator pod's Ready (fibers.readiness) and what it is made of: pure logic, no servers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from fibers.readiness import Readiness, ReadinessPolicy
from fibers.reconciles import Pacing, Reconciles

FAST = ReadinessPolicy(relist_seconds=0.01, queue_lag_seconds=0.05)


def listing_of(stock: dict[str, set[tuple[str, str]]]) -> Callable[[str], Awaitable[set[tuple[str, str]]]]:
    """What the API server lists of each kind: `stock` as it is at each call."""

    async def listing(plural: str) -> set[tuple[str, str]]:
        return set(stock.get(plural, set()))

    return listing


def test_not_ready_until_started_and_every_object_listed_at_start_up_is_seen() -> None:
    async def body() -> None:
        readiness = Readiness(FAST)
        assert readiness.waiting() == ["the start-up handler (API clients, Connect and reconcile loops)"]
        readiness.started()
        assert readiness.waiting() == ["the listing of what exists at start-up"]
        # kopf may hand an object over before the listing ends: it is not waited for again.
        readiness.seen("connects", "team-a", "early")
        stock = {"connects": {("team-a", "early"), ("team-a", "late")}, "connectclusters": {("", "main")}}
        task = asyncio.create_task(readiness.take_stock(["connects", "connectclusters"], listing_of(stock)))
        await asyncio.sleep(0.005)
        assert readiness.waiting() == [
            "1 connectclusters listed at start-up, not yet seen by their watch: main",
            "1 connects listed at start-up, not yet seen by their watch: team-a/late",
        ]
        readiness.seen("connects", "team-a", "late")
        readiness.seen("connectclusters", None, "main")
        await asyncio.wait_for(task, 1)  # nothing left to wait for: the task ends
        assert readiness.waiting() == []

    asyncio.run(body())


def test_a_standby_is_ready_to_take_over_once_started_whatever_its_watches_listed() -> None:
    readiness = Readiness(FAST)
    assert readiness.waiting_to_take_over() == ["the start-up handler (API clients, Connect and reconcile loops)"]
    readiness.started()
    assert readiness.waiting() == ["the listing of what exists at start-up"]  # the active's question
    assert readiness.waiting_to_take_over() == []


def test_an_object_deleted_before_its_watch_listed_it_is_struck_off() -> None:
    async def body() -> None:
        readiness = Readiness(FAST)
        readiness.started()
        stock = {"transforms": {("ns", "gone"), ("ns", "kept")}}
        task = asyncio.create_task(readiness.take_stock(["transforms"], listing_of(stock)))
        await asyncio.sleep(0.005)
        readiness.seen("transforms", "ns", "kept")
        assert readiness.waiting() == ["1 transforms listed at start-up, not yet seen by their watch: ns/gone"]
        stock["transforms"] = {("ns", "kept")}  # deleted: kopf will never hand it over
        await asyncio.wait_for(task, 1)
        assert readiness.waiting() == []

    asyncio.run(body())


def test_a_listing_that_fails_is_asked_again_and_says_so_meanwhile() -> None:
    async def body() -> None:
        readiness = Readiness(FAST)
        readiness.started()
        answers: list[BaseException | set[tuple[str, str]]] = [ConnectionError("refused"), set()]

        async def listing(plural: str) -> set[tuple[str, str]]:
            answer = answers.pop(0)
            if isinstance(answer, BaseException):
                raise answer
            return answer

        task = asyncio.create_task(readiness.take_stock(["schemas"], listing))
        await asyncio.sleep(0)
        assert readiness.waiting() == ["the listing of what exists at start-up"]
        await asyncio.wait_for(task, 1)
        assert readiness.waiting() == [] and answers == []

    asyncio.run(body())


def test_gates_add_their_reasons() -> None:
    async def body() -> None:
        readiness = Readiness(FAST)
        waits = ["the first listing of pods.core (fibers.dev/consumer) in team-a"]
        readiness.gate(lambda: list(waits))
        readiness.started()
        await readiness.take_stock(["connects"], listing_of({}))
        assert readiness.waiting() == waits
        waits.clear()
        assert readiness.waiting() == []

    asyncio.run(body())


def test_the_queue_is_behind_while_a_due_reconcile_waits_for_a_worker() -> None:
    async def body() -> None:
        queue = Reconciles(Pacing(workers=1, resync=3600))
        busy, release = asyncio.Event(), asyncio.Event()

        async def reconcile(namespace: str, name: str) -> None:
            busy.set()
            await release.wait()

        queue.register("K", reconcile)
        task = asyncio.create_task(queue.run())
        try:
            assert queue.behind() == 0.0
            queue.soon("K", "ns", "first")
            await asyncio.wait_for(busy.wait(), 1)
            queue.soon("K", "ns", "second")  # the one worker is busy: this one waits
            await asyncio.sleep(0.1)
            assert queue.behind() >= 0.1
            release.set()
            await asyncio.sleep(0.05)
            assert queue.behind() == 0.0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(body())
