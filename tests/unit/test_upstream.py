"""References between kinds (fibers.upstream) and the topics a consumer's sourceRefs resolve to."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fibers import upstream
from fibers.conditions import READY, Condition, with_upstream_note
from fibers.databus.workload import consumed_topics
from fibers.upstream import Ref, Upstream


def connect(ready: bool, topics: list[str], **config: str) -> dict[str, Any]:
    reason = "Running" if ready else "ConnectorFailed"
    cond = {"type": "Ready", "status": str(ready), "reason": reason, "message": "task 0 FAILED: boom"}
    return {"spec": {"config": config}, "status": {"topics": topics, "conditions": [cond]}}


def transform(name: str, *refs: str, topic: str | None = None) -> dict[str, Any]:
    inputs = [{"name": f"i{n}", "transformRef": {"name": ref}} for n, ref in enumerate(refs)]
    output = {"kafka": {"topic": topic}} if topic else {"files": {"path": "/o"}}
    return {"metadata": {"name": name}, "spec": {"inputs": inputs, "output": output}}


def test_refs_name_the_field_and_kind() -> None:
    items = [{"name": "a", "kafka": {}}, {"name": "b", "connectRef": {"name": "pg"}}, {"transformRef": {"name": "t"}}]
    assert upstream.refs_in(items, "spec.inputs") == [
        Ref("Connect", "pg", "spec.inputs[1].connectRef", 1),
        Ref("Transform", "t", "spec.inputs[2].transformRef", 2),
    ]


def test_condition_names_the_first_unhealthy_upstream() -> None:
    pg = Ref("Connect", "pg", "spec.sourceRefs[0].connectRef", 0)
    gone = Ref("Transform", "gone", "spec.sourceRefs[1].transformRef", 1)
    ok = upstream.condition([Upstream(pg, connect(True, ["a"]))], "ns")
    assert (ok.status, ok.reason, ok.message) == (True, "UpstreamReady", "Connect pg: Ready")
    failed = upstream.condition([Upstream(pg, connect(False, ["a"])), Upstream(gone, None)], "ns")
    assert (failed.status, failed.reason) == (False, "UpstreamNotReady")
    assert failed.message == "Connect pg is not Ready (ConnectorFailed: task 0 FAILED: boom)"
    missing = upstream.condition([Upstream(pg, connect(True, ["a"])), Upstream(gone, None)], "ns")
    assert (missing.reason, missing.message) == (
        "UpstreamMissing",
        "Transform gone (spec.sourceRefs[1].transformRef) does not exist in namespace ns",
    )
    assert upstream.condition([], "ns").status is True


def test_ready_message_says_when_upstream_fails_but_ready_stays() -> None:
    bad = Condition(upstream.UPSTREAM_READY, False, "UpstreamNotReady", "Connect pg is not Ready")
    [ready] = with_upstream_note([Condition(READY, True, "Running", "streaming run r is running")], bad)
    assert ready.status is True
    assert ready.message == "streaming run r is running; upstream: Connect pg is not Ready"
    good = Condition(upstream.UPSTREAM_READY, True, "UpstreamReady", "Connect pg: Ready")
    assert with_upstream_note([ready], good) == [ready]


def test_events_on_degrading_and_recovering_only() -> None:
    bad = Condition(upstream.UPSTREAM_READY, False, "UpstreamNotReady", "Connect pg is not Ready")
    good = Condition(upstream.UPSTREAM_READY, True, "UpstreamReady", "Connect pg: Ready")
    was_good = [{"type": "UpstreamReady", "status": "True"}]
    was_bad = [{"type": "UpstreamReady", "status": "False"}]
    assert upstream.transition(None, good) is None
    assert upstream.transition(was_good, good) is None
    assert upstream.transition(was_good, bad) == ("UpstreamDegraded", "Connect pg is not Ready", True)
    assert upstream.transition(None, bad) is None, "a first status is not news"
    assert upstream.transition(was_bad, bad) is None
    assert upstream.transition(was_bad, good) == ("UpstreamRecovered", "upstream recovered: Connect pg: Ready", False)


def test_debezium_metadata_topics_are_not_change_topics() -> None:
    ref = Ref("Connect", "pg", "spec.sourceRefs[0].connectRef", 0)
    body = connect(
        True,
        ["shop.public.orders", "shop.transaction", "__debezium-heartbeat.shop", "shop.public.items"],
        **{"topic.prefix": "shop", "provide.transaction.metadata": "true"},
    )
    assert Upstream(ref, body).change_topics() == ["shop.public.items", "shop.public.orders"]
    assert "shop.transaction" in Upstream(ref, body).topics()


def test_a_consumer_keeps_the_topics_its_checkpoints_are_for() -> None:
    ref = Ref("Connect", "pg", "spec.sourceRefs[0].connectRef", 0)
    spec = {"sources": ["extra"], "sourceRefs": [{"connectRef": {"name": "pg"}}]}
    now = [Upstream(ref, connect(True, ["b", "a"]))]
    assert consumed_topics(spec, now, None, "ns") == (["extra", "a", "b"], "", "")
    assert consumed_topics(spec, now, ["extra", "a"], "ns") == (
        ["extra", "a"],
        "",
        "sourceRefs now resolve to ['extra', 'a', 'b']; consuming ['extra', 'a']",
    )
    waiting = consumed_topics(spec, [Upstream(ref, connect(True, []))], None, "ns")
    assert waiting[1] == "Connect pg (spec.sourceRefs[0].connectRef) has reported no topics yet"
    gone = consumed_topics(spec, [Upstream(ref, None)], None, "ns")
    assert gone[1] == "Connect pg (spec.sourceRefs[0].connectRef) does not exist in namespace ns"
    assert consumed_topics(spec, [Upstream(ref, None)], ["extra", "a"], "ns") == (["extra", "a"], "", "")


@pytest.mark.parametrize(
    ("graph", "start", "cycle"),
    [
        ({"a": transform("a", "b", topic="ta"), "b": transform("b", "a", topic="tb")}, "a", "a → b → a"),
        ({"a": transform("a", "a", topic="ta")}, "a", "a → a"),
        (
            {"a": transform("a", "b"), "b": transform("b", "c"), "c": transform("c", "b")},
            "a",
            "",  # b ↔ c is a cycle of theirs, not through a
        ),
        ({"a": transform("a", "b", "c"), "b": transform("b", "c"), "c": transform("c")}, "a", ""),
        ({"a": transform("a", "missing")}, "a", ""),
    ],
)
def test_a_cycle_through_the_transform_is_found(graph: dict[str, Any], start: str, cycle: str) -> None:
    reads: list[str] = []

    async def get(plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert plural == "transforms"
        reads.append(name)
        return graph.get(name)

    refs = upstream.refs_in(graph[start]["spec"]["inputs"], "spec.inputs")
    assert asyncio.run(upstream.find_cycle(get, "ns", start, refs)) == cycle
    assert len(reads) == len(set(reads)), "each Transform is read once"
