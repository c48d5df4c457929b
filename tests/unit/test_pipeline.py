"""`fibers pipeline`: the chain in the order data flows, and its first broken link (pure)."""

from __future__ import annotations

from typing import Any

from fibers import pipeline


def body(name: str, spec: dict[str, Any], ready: bool = True, **status: Any) -> dict[str, Any]:
    cond = {"type": "Ready", "status": str(ready), "reason": "Running" if ready else "TasksFailed", "message": "m"}
    return {"metadata": {"name": name}, "spec": spec, "status": {"conditions": [cond], **status}}


def demo(cdc_ready: bool = True) -> dict[str, list[dict[str, Any]]]:
    return {
        "Connect": [body("orders-cdc", {}, cdc_ready, topics=["shop.public.orders"], connectorState="RUNNING")],
        "Transform": [
            # reads the aggregation's output by topic, not by reference: still downstream of it
            body("report", {"inputs": [{"name": "x", "kafka": {"topics": ["shop.by-item"]}}]}),
            body(
                "by-item",
                {
                    "inputs": [{"name": "c", "connectRef": {"name": "orders-cdc"}}],
                    "output": {"kafka": {"topic": "shop.by-item"}},
                },
            ),
        ],
        "DatabusConsumer": [
            body("view", {"sourceRefs": [{"connectRef": {"name": "orders-cdc"}}], "sink": {"type": "mongodb"}}, lag=0),
            body("audit", {"sources": ["shop.public.orders"], "sink": {"type": "log"}}),
        ],
    }


def test_steps_come_upstream_first_linked_by_references_and_topics() -> None:
    steps = pipeline.order(demo())
    assert [s.key for s in steps] == [
        "Connect/orders-cdc",
        "Transform/by-item",
        "Transform/report",
        "DatabusConsumer/audit",
        "DatabusConsumer/view",
    ]
    reads = {s.key: s.reads for s in steps}
    assert reads["Transform/report"] == ["Transform/by-item"]
    assert reads["DatabusConsumer/audit"] == reads["DatabusConsumer/view"] == ["Connect/orders-cdc"]


def test_the_first_step_not_ready_is_the_broken_link() -> None:
    text = pipeline.render("shop/orders", pipeline.order(demo(cdc_ready=False)))
    lines = text.splitlines()
    assert lines[0] == "pipeline shop/orders: 5 steps"
    assert lines[2].startswith("✗1  Connect/orders-cdc")
    assert lines[-1] == "first broken link: Connect/orders-cdc: TasksFailed: m"
    healthy = pipeline.render("shop/orders", pipeline.order(demo()))
    assert healthy.splitlines()[-1] == "every step is Ready"
    assert "✗" not in healthy


def test_a_cycle_still_lists_every_step() -> None:
    a = body("a", {"inputs": [{"name": "i", "transformRef": {"name": "b"}}], "output": {"kafka": {"topic": "ta"}}})
    b = body("b", {"inputs": [{"name": "i", "transformRef": {"name": "a"}}], "output": {"kafka": {"topic": "tb"}}})
    assert [s.key for s in pipeline.order({"Transform": [b, a]})] == ["Transform/a", "Transform/b"]


def test_an_empty_pipeline_says_which_label_it_looked_for() -> None:
    assert "labelled fibers.dev/pipeline=none" in pipeline.render("none", [])
