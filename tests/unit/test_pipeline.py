"""`fibers pipeline`: the chain in the order data flows, and its first broken link (pure)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from fibers import kubeconfig, pipeline

WITHOUT_KUBERNETES = Path(__file__).resolve().parents[2] / "tools" / "without-kubernetes"


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


class Listing:
    """Objects by plural: what the API server would list (pure logic, no server)."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]]) -> None:
        self.objects = objects
        self.urls: list[str] = []

    def custom_objects(self, plural: str, namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
        self.urls.append(f"{namespace or '*'}/{plural}")
        assert label_selector == "fibers.dev/pipeline=orders"
        return [o for o in self.objects.get(plural, []) if namespace in (None, o["metadata"]["namespace"])]


def named(name: str, namespace: str, spec: dict[str, Any], ready: bool = True) -> dict[str, Any]:
    obj = body(name, spec, ready)
    obj["metadata"]["namespace"] = namespace
    return obj


def test_fetch_groups_every_namespace_and_json_says_what_the_table_says() -> None:
    listing = Listing(
        {
            "connects": [named("cdc", "team-a", {}), named("cdc", "team-b", {}, ready=False)],
            "databusconsumers": [named("view", "team-a", {"sourceRefs": [{"connectRef": {"name": "cdc"}}]})],
        }
    )
    found = pipeline.fetch(listing, "orders", None)
    assert listing.urls == ["*/connects", "*/transforms", "*/databusconsumers"]  # one list call per kind
    assert list(found) == ["team-a", "team-b"]
    a = pipeline.as_json("team-a", "orders", pipeline.order(found["team-a"]))
    assert (a["ready"], a["firstBroken"]) == (True, None)
    assert [(s["step"], s["readsFrom"], s["ready"]) for s in a["steps"]] == [
        ("Connect/cdc", [], "True"),
        ("DatabusConsumer/view", ["Connect/cdc"], "True"),
    ]
    b = pipeline.as_json("team-b", "orders", pipeline.order(found["team-b"]))
    assert (b["ready"], b["firstBroken"], b["steps"][0]["reason"]) == (False, "Connect/cdc", "TasksFailed")


def test_an_empty_pipeline_in_one_namespace_is_still_reported_there() -> None:
    listing = Listing({})
    found = pipeline.fetch(listing, "orders", "team-a")
    assert listing.urls[0] == "team-a/connects"
    assert list(found) == ["team-a"] and pipeline.order(found["team-a"]) == []
    assert pipeline.as_json("team-a", "orders", [])["ready"] is False


def test_without_the_kubernetes_package_the_command_says_what_to_install() -> None:
    """The operator image has no `kubernetes` package; the laptop command line needs it (fibers[cli])."""
    result = subprocess.run(
        [sys.executable, "-m", "fibers", "pipeline", "orders"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(WITHOUT_KUBERNETES)},
    )
    assert result.returncode == 1 and result.stderr.strip() == kubeconfig.INSTALL_HINT
    assert "Traceback" not in result.stderr


def test_version_and_the_kubectl_plugin_name() -> None:
    result = subprocess.run([sys.executable, "-m", "fibers", "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and re.fullmatch(r"fibers \S+\n", result.stdout), result.stdout
    plugin = Path(sys.executable).parent / "kubectl-fibers"  # installed beside `fibers` (pyproject's scripts)
    result = subprocess.run([plugin, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("usage: kubectl fibers")
