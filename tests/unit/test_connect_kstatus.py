"""Connect statuses read through the kstatus rules (Argo CD, Flux and `kubectl wait` read them this way).

A status that is both Reconciling=True and Stalled=True says "still working on it" and "gave up" at
once. Every Connect status fixture, and every status `report` writes across the situations below, must
be one or the other (or neither).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fibers.conditions import READY, Condition, find
from fibers.connect.offsets import OffsetsRequest
from fibers.connect.reconcile import Outcome, Step, Target, report
from fibers.connect.rest import ConnectorView, TaskView
from fibers.connect.spec import parse

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "status"
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def kstatus(obj: dict[str, Any]) -> str:
    """The kstatus result (sigs.k8s.io/cli-utils/pkg/kstatus) for a resource with standard conditions."""
    status = obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    conds = status.get("conditions") or []
    reconciling, stalled = (find(conds, t) or {} for t in ("Reconciling", "Stalled"))
    if reconciling.get("status") == "True" and stalled.get("status") == "True":
        raise AssertionError(f"contradictory: Reconciling ({reconciling}) and Stalled ({stalled}) both True")
    if generation is not None and status.get("observedGeneration", generation) != generation:
        return "InProgress"
    if reconciling.get("status") == "True":
        return "InProgress"
    if stalled.get("status") == "True":
        return "Failed"
    ready = find(conds, READY)
    if ready is not None and ready.get("status") == "False":
        return "InProgress"
    return "Current"


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("connect-*.json")), ids=lambda p: p.stem)
def test_connect_fixture_is_never_reconciling_and_stalled(path: Path) -> None:
    kstatus(json.loads(path.read_text()))


def _target(**spec: Any) -> Target:
    parsed = parse({"class": "FileStreamSource", "config": {"file": "/f", "topic": "t"}, **spec}, "c")
    return Target(
        "ns", "c", "uid", 1, parsed, config=parsed.full_config({}, "ns/c"), claimed=True, connector_owner="ns/c"
    )


def _view(state: str = "RUNNING", task: str = "RUNNING") -> ConnectorView:
    return ConnectorView(
        "c",
        None,
        state,
        "w:8083",
        "trace" if state == "FAILED" else "",
        "source",
        (TaskView(0, task, "w:8083", "trace" if task == "FAILED" else ""),),
    )


def _situations() -> dict[str, tuple[Target, ConnectorView | None, Outcome, str]]:
    """name → (target, observed, outcome, the kstatus expected)."""
    cases: dict[str, tuple[Target, ConnectorView | None, Outcome, str]] = {}
    cases["creating"] = (_target(), None, Outcome(done=[Step.CREATE]), "InProgress")
    cases["create failed, retried"] = (_target(), None, Outcome(failed=Step.CREATE, error="x"), "InProgress")
    cases["running"] = (_target(), _view(), Outcome(), "Current")
    cases["paused"] = (_target(state="paused"), _view("PAUSED", "PAUSED"), Outcome(), "Current")
    cases["tasks failing, auto-restarting"] = (_target(), _view(task="FAILED"), Outcome(), "InProgress")
    cases["connector failed, auto-restarting"] = (_target(), _view("FAILED"), Outcome(), "InProgress")
    exhausted = _target(autoRestart={"maxRestarts": 3})
    exhausted.status = {"autoRestart": {"count": 3, "lastRestartTime": "2026-11-23T11:59:00Z"}}
    cases["restarts exhausted"] = (exhausted, _view(task="FAILED"), Outcome(), "Failed")
    cases["auto-restart off, failing"] = (
        _target(autoRestart={"enabled": False}),
        _view(task="FAILED"),
        Outcome(),
        "Failed",
    )
    cases["rejected by Connect, retried"] = (
        _target(),
        _view(),
        Outcome(failed=Step.UPDATE_CONFIG, error="400", rejected=True),
        "InProgress",
    )
    missing = _target()
    missing.problem = Condition(READY, False, "SecretNotFound", "Secret ns/db not found")
    cases["secret missing, read again"] = (missing, None, Outcome(), "InProgress")
    invalid = _target()
    invalid.problem = Condition(READY, False, "InvalidSpec", "spec.config.x: bad")
    cases["invalid spec"] = (invalid, None, Outcome(), "Failed")
    foreign = _target()
    foreign.claimed, foreign.connector_owner = False, "other/c"
    cases["connector not ours"] = (foreign, _view(), Outcome(), "Failed")
    resetting = _target()
    resetting.offsets_request = OffsetsRequest("reset")
    cases["offsets being reset"] = (resetting, _view("STOPPED"), Outcome(), "InProgress")
    paused = _target()
    paused.paused = True
    cases["reconciliation paused, failing"] = (paused, _view(task="FAILED"), Outcome(), "InProgress")
    return cases


@pytest.mark.parametrize("name", sorted(_situations()))
def test_every_reported_status_reads_as_one_kstatus(name: str) -> None:
    target, observed, outcome, expected = _situations()[name]
    status = report(target, observed, outcome, NOW)
    assert kstatus({"metadata": {"generation": 1}, "status": status}) == expected, status["conditions"]
