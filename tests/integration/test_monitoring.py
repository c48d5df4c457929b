"""The chart's alert rules against Prometheus' own tool (marker `chart`).

- the PrometheusRule the chart renders passes `promtool check rules`, and `promtool test rules` runs a
  unit test for each alert, firing on a broken pipeline's series and silent on a healthy one's;
- the chart's values reach the rules, and the rules are off by default.

The real Prometheus — scraping the operator pod through the chart's ServiceMonitor, evaluating these
rules, every series they name returning data while the demo's pipeline runs — is checked in
tests/e2e/test_demo.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fibers_stack import fetch, prometheus
from tests.helpers import render_chart

pytestmark = pytest.mark.chart

REPO = Path(__file__).resolve().parents[2]
RELEASE, NAMESPACE = "rel", "fibers-system"
JOB = f"{RELEASE}-fibers-metrics"  # the metrics Service's name: the Prometheus Operator's job label


def rendered(tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    return render_chart(fetch.helm(), NAMESPACE, values, tmp_path)


def rule_groups(tmp_path: Path) -> list[dict[str, Any]]:
    docs = rendered(tmp_path, {"metrics": {"prometheusRule": {"enabled": True}}})
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    return list(rule["spec"]["groups"])


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(prometheus.binary("promtool")), *args], capture_output=True, text=True)
    assert result.returncode == 0, f"promtool {args[0]} {args[1]}:\n{result.stdout}\n{result.stderr}"
    return result


def alerts(groups: list[dict[str, Any]]) -> set[str]:
    return {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}


def test_rules_pass_promtool_check(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups(tmp_path)}))
    assert "SUCCESS" in promtool("check", "rules", str(rules)).stdout


def test_chart_values_reach_the_rules(tmp_path: Path) -> None:
    values = {"metrics": {"prometheusRule": {"enabled": True, "connectorFailedFor": "17m", "consumerLagThreshold": 42}}}
    docs = rendered(tmp_path, values)
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    by_name = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert by_name["FibersConnectorFailed"]["for"] == "17m"
    assert "fibers_databus_consumer_lag > 42" in by_name["FibersConsumerLagGrowing"]["expr"]
    assert not [d for d in rendered(tmp_path, {}) if d["kind"] == "PrometheusRule"]  # off by default


# Each alert: series of a broken pipeline (the alert must fire, with these labels) and of a healthy one
# (it must not). One sample per minute; "for" durations are the chart's defaults.
CONNECTOR = {"namespace": "shop", "name": "orders-cdc"}
CONSUMER = {"namespace": "shop", "name": "orders-view"}
TRANSFORM = {"namespace": "shop", "name": "orders-report"}
# Unix times in the test's clock, which starts at 0: the schedule fired at 10m (600 s).
LAST_SCHEDULE = {"__name__": "fibers_transform_last_schedule_timestamp_seconds", **TRANSFORM}
LAST_SUCCESS = {"__name__": "fibers_transform_last_success_timestamp_seconds", **TRANSFORM}
# A consumer pod's series, as the PodMonitor's scrape labels them.
CONSUMER_POD = {**CONSUMER, "pod": "orders-view-0"}
AGE = {
    "__name__": "fibers_consumer_checkpoint_age_seconds",
    **CONSUMER_POD,
    "topic": "shop.public.orders",
    "partition": "0",
}
PARTITION_LAG = {**AGE, "__name__": "fibers_consumer_lag"}
CASES: dict[str, dict[str, Any]] = {
    "FibersOperatorDown": {
        "at": "10m",
        "firing": [({"__name__": "up", "job": JOB, "namespace": NAMESPACE, "pod": "op-0"}, "1 1 0x10")],
        "healthy": [({"__name__": "up", "job": JOB, "namespace": NAMESPACE, "pod": "op-0"}, "1x12")],
        "labels": {"severity": "critical", "job": JOB, "namespace": NAMESPACE, "pod": "op-0"},
    },
    "FibersReconcileErrors": {
        "at": "30m",
        "firing": [({"__name__": "fibers_reconcile_errors_total", "kind": "Connect"}, "0+2x40")],
        "healthy": [({"__name__": "fibers_reconcile_errors_total", "kind": "Connect"}, "3x40")],
        "labels": {"severity": "warning", "kind": "Connect"},
    },
    "FibersConnectorFailed": {
        "at": "10m",
        "firing": [({"__name__": "fibers_connector_state", **CONNECTOR, "state": "FAILED"}, "1x12")],
        # failed briefly, then restarted: the series goes (the operator removes a left state's series)
        "healthy": [
            ({"__name__": "fibers_connector_state", **CONNECTOR, "state": "FAILED"}, "1 1 stale"),
            ({"__name__": "fibers_connector_state", **CONNECTOR, "state": "RUNNING"}, "_ _ 1x10"),
        ],
        "labels": {"severity": "critical", **CONNECTOR, "state": "FAILED"},
    },
    "FibersConnectorTasksNotRunning": {
        "at": "15m",
        "firing": [
            ({"__name__": "fibers_connector_state", **CONNECTOR, "state": "RUNNING"}, "1x20"),
            ({"__name__": "fibers_connector_running_tasks", **CONNECTOR}, "0x20"),
        ],
        "healthy": [
            ({"__name__": "fibers_connector_state", **CONNECTOR, "state": "RUNNING"}, "1x20"),
            ({"__name__": "fibers_connector_running_tasks", **CONNECTOR}, "0 0 0 1x17"),
        ],
        "labels": {"severity": "warning", **CONNECTOR, "state": "RUNNING"},
    },
    "FibersConsumerLagGrowing": {
        "at": "25m",
        "firing": [({"__name__": "fibers_databus_consumer_lag", **CONSUMER}, "9000+500x30")],
        # as large, but shrinking: the consumer catches up
        "healthy": [({"__name__": "fibers_databus_consumer_lag", **CONSUMER}, "30000-500x30")],
        "labels": {"severity": "warning", **CONSUMER},
    },
    "FibersSinkErrors": {
        "at": "12m",
        "firing": [({"__name__": "fibers_databus_sink_errors", **CONSUMER, "sink": "mongo"}, "0 0 0 1 2 3x10")],
        "healthy": [({"__name__": "fibers_databus_sink_errors", **CONSUMER, "sink": "mongo"}, "4x15")],
        "labels": {"severity": "warning", **CONSUMER, "sink": "mongo"},
    },
    "FibersConsumerCheckpointStale": {  # the chart's defaults: 600 s, for 5m
        "at": "20m",
        # records to consume, and the checkpoint has not moved since the start
        "firing": [(AGE, "0+60x30"), (PARTITION_LAG, "5x30")],
        # as old, but nothing to consume: an idle consumer writes no checkpoint
        "healthy": [(AGE, "0+60x30"), (PARTITION_LAG, "0x30")],
        "labels": {"severity": "critical", **CONSUMER_POD, "topic": "shop.public.orders", "partition": "0"},
    },
    "FibersTransformFailed": {
        "at": "20m",
        "firing": [({"__name__": "fibers_transform_failure_count_total", **TRANSFORM}, "0x10 1x10")],
        "healthy": [({"__name__": "fibers_transform_failure_count_total", **TRANSFORM}, "0x20")],
        "labels": {"severity": "warning", **TRANSFORM},
    },
    "FibersTransformOverdue": {  # the chart's default: overdue 3600 s after the schedule fired
        "at": "80m",
        # fired at 600 s; the last completed run ended before it (at 60 s)
        "firing": [(LAST_SCHEDULE, "0 600x90"), (LAST_SUCCESS, "60x90")],
        # fired at 600 s, and its run completed at 900 s
        "healthy": [(LAST_SCHEDULE, "0 600x90"), (LAST_SUCCESS, "60x14 900x75")],
        "labels": {"severity": "warning", **TRANSFORM},
    },
}


def _series(selector: dict[str, str]) -> str:
    labels = ",".join(f'{k}="{v}"' for k, v in selector.items() if k != "__name__")
    return f"{selector['__name__']}{{{labels}}}"


def test_every_alert_fires_on_a_broken_pipeline_and_not_on_a_healthy_one(tmp_path: Path) -> None:
    groups = rule_groups(tmp_path)
    assert alerts(groups) == set(CASES), "every alert has a case here, and every case an alert"
    # The annotations are templates over the firing series' values; `check rules` parses them. The
    # unit tests compare labels, so the copy they load has none.
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    tests = []
    for alert, case in CASES.items():
        for health in ("firing", "healthy"):
            expected = [{"exp_labels": case["labels"]}] if health == "firing" else []
            tests.append(
                {
                    "name": f"{alert} {health}",
                    "interval": "1m",
                    "input_series": [{"series": _series(s), "values": v} for s, v in case[health]],
                    "alert_rule_test": [{"eval_time": case["at"], "alertname": alert, "exp_alerts": expected}],
                }
            )
    suite = tmp_path / "rules_test.yaml"
    suite.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}))
    promtool("test", "rules", str(suite))
