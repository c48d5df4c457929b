"""The stack's translation of the chart's monitors into Prometheus scrape jobs (the Prometheus Operator's way)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fibers_stack import prometheus

SERVICE_MONITOR = {
    "metadata": {"name": "fibers", "namespace": "fibers-system"},
    "spec": {
        "selector": {"matchLabels": {"app.kubernetes.io/name": "fibers", "app.kubernetes.io/instance": "fibers"}},
        "namespaceSelector": {"matchNames": ["fibers-system"]},
        "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "5s", "honorLabels": True}],
    },
}


def test_a_service_monitor_becomes_a_job_that_keeps_what_its_selector_and_port_select(tmp_path: Path) -> None:
    [job] = prometheus.scrape_jobs(SERVICE_MONITOR, "servicemonitors", tmp_path)
    assert job["job_name"] == "servicemonitor/fibers-system/fibers/0"
    assert job["honor_labels"] is True and job["scrape_interval"] == "5s"
    assert job["file_sd_configs"] == [
        {"files": [str(tmp_path / "targets" / "servicemonitor_fibers-system_fibers_0.json")], "refresh_interval": "5s"}
    ]
    keeps = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert {
        "source_labels": [
            "__meta_kubernetes_service_label_app_kubernetes_io_name",
            "__meta_kubernetes_service_labelpresent_app_kubernetes_io_name",
        ],
        "regex": "(fibers);true",
        "action": "keep",
    } in keeps
    assert {"source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": "metrics", "action": "keep"} in keeps
    # The Prometheus Operator's job label: the Service's name.
    assert {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"} in job["relabel_configs"]
    assert prometheus._namespaces(SERVICE_MONITOR) == ["fibers-system"]


def test_what_the_translation_does_not_know_is_refused_by_name(tmp_path: Path) -> None:
    relabelled = {
        **SERVICE_MONITOR,
        "spec": {**SERVICE_MONITOR["spec"], "endpoints": [{"port": "m", "relabelings": []}]},
    }
    with pytest.raises(ValueError, match="relabelings"):
        prometheus.scrape_jobs(relabelled, "servicemonitors", tmp_path)
    fields = {**SERVICE_MONITOR, "spec": {**SERVICE_MONITOR["spec"], "selector": {"matchFields": []}}}
    with pytest.raises(ValueError, match="matchFields"):
        prometheus.scrape_jobs(fields, "servicemonitors", tmp_path)
    like = {"matchExpressions": [{"key": "a", "operator": "Like", "values": ["b"]}]}
    with pytest.raises(ValueError, match="Like"):
        prometheus.scrape_jobs(
            {**SERVICE_MONITOR, "spec": {**SERVICE_MONITOR["spec"], "selector": like}}, "servicemonitors", tmp_path
        )


def test_a_pod_monitor_keeps_the_pods_its_expressions_select(tmp_path: Path) -> None:
    """The chart's PodMonitor selects consumer pods by the presence of their label, in any namespace."""
    monitor = {
        "metadata": {"name": "fibers-consumers", "namespace": "fibers-system"},
        "spec": {
            "selector": {
                "matchExpressions": [
                    {"key": "fibers.dev/databusconsumer", "operator": "Exists"},
                    {"key": "tier", "operator": "In", "values": ["a", "b.c"]},
                    {"key": "skip", "operator": "DoesNotExist"},
                ]
            },
            "namespaceSelector": {"any": True},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics"}],
        },
    }
    [job] = prometheus.scrape_jobs(monitor, "podmonitors", tmp_path)
    rules = job["relabel_configs"]
    present = "__meta_kubernetes_pod_labelpresent_"
    assert {"source_labels": [f"{present}fibers_dev_databusconsumer"], "regex": "true", "action": "keep"} in rules
    assert {
        "source_labels": ["__meta_kubernetes_pod_label_tier", f"{present}tier"],
        "regex": r"(a|b\.c);true",
        "action": "keep",
    } in rules
    assert {"source_labels": [f"{present}skip"], "regex": "true", "action": "drop"} in rules
    assert {
        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": "metrics",
        "action": "keep",
    } in rules
    assert {"target_label": "job", "replacement": "fibers-system/fibers-consumers"} in rules
    assert job["honor_labels"] is False
    assert prometheus._namespaces(monitor) == []  # every namespace


def test_targets_carry_the_labels_kubernetes_discovery_would_give_them() -> None:
    labels = prometheus._meta_labels("pod", {"fibers.dev/databusconsumer": "orders-view"})
    assert labels == {
        "__meta_kubernetes_pod_label_fibers_dev_databusconsumer": "orders-view",
        "__meta_kubernetes_pod_labelpresent_fibers_dev_databusconsumer": "true",
    }
