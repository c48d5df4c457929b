"""When a Connect being deleted lets go of its connector: the pure decision (`fibers.connect.deletion`).

Without it, a Connect whose ConnectCluster was deleted, or whose Kafka Connect is gone for good, kept
its finalizer for ever, and with it its namespace.
"""

from __future__ import annotations

import pytest

from fibers.api import ANNOTATION_DELETION_POLICY
from fibers.connect import deletion
from fibers.connect.deletion import ClusterState, Verdict

GRACE = 600.0
NOW = 10_000.0


def decide(state: ClusterState, since: float | None = None, *, orphan: bool = False) -> deletion.Decision:
    return deletion.decide(
        connector="orders-cdc",
        cluster="shared",
        state=state,
        unreachable_since=since,
        now=NOW,
        grace=GRACE,
        orphan=orphan,
    )


def test_a_cluster_that_answers_gets_the_connector_deleted_first() -> None:
    decision = decide(ClusterState.ANSWERS)
    assert decision.verdict is Verdict.DELETE and not decision.releases


def test_a_missing_connect_cluster_releases_at_once_with_a_warning_naming_the_connector() -> None:
    decision = decide(ClusterState.MISSING)
    assert decision.verdict is Verdict.RELEASE and decision.releases
    assert "orders-cdc" in decision.message and "ConnectCluster shared does not exist" in decision.message


@pytest.mark.parametrize("waited", [0.0, 1.0, GRACE - 1])
def test_an_unreachable_cluster_is_waited_for_during_the_grace_period(waited: float) -> None:
    decision = decide(ClusterState.UNREACHABLE, NOW - waited)
    assert decision.verdict is Verdict.WAIT and not decision.releases
    assert f"{GRACE - waited:.0f} s" in decision.message  # the DeleteFailed Event says when it ends


@pytest.mark.parametrize("waited", [GRACE, GRACE * 10])
def test_an_unreachable_cluster_past_the_grace_period_releases_with_a_warning(waited: float) -> None:
    decision = decide(ClusterState.UNREACHABLE, NOW - waited)
    assert decision.verdict is Verdict.RELEASE
    assert "orders-cdc" in decision.message and "may remain" in decision.message


def test_the_orphan_policy_releases_at_once_whatever_the_cluster() -> None:
    for state in ClusterState:
        decision = decide(state, NOW, orphan=True)
        assert decision.verdict is Verdict.ORPHAN and decision.releases
        assert "orders-cdc" in decision.message


def test_only_orphan_is_a_policy() -> None:
    assert deletion.orphans({ANNOTATION_DELETION_POLICY: "orphan"})
    assert deletion.orphans({ANNOTATION_DELETION_POLICY: "Orphan"})  # as Kubernetes spells propagationPolicy
    assert not deletion.orphans({ANNOTATION_DELETION_POLICY: "delete"})
    assert not deletion.orphans({})
