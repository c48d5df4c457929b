"""Pods that will not start by waiting (fibers.pod_trouble), read as the kubelet and scheduler write them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fibers.conditions import format_time
from fibers.pod_trouble import UNSCHEDULABLE_AFTER, Trouble, due, first, trouble

NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)


def pod(
    name: str, *, waiting: str = "", phase: str = "Pending", unschedulable_for: timedelta | None = None
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if waiting:
        status["containerStatuses"] = [{"name": "c", "state": {"waiting": {"reason": waiting, "message": "why"}}}]
    if unschedulable_for is not None:
        since = format_time(NOW - unschedulable_for)
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": since,
                "message": "0/1 nodes are available: 1 Insufficient cpu.",
            }
        ]
    return {"metadata": {"name": name}, "status": status}


def test_an_image_or_a_secret_key_that_is_not_there_is_trouble_at_once() -> None:
    for reason in ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError"):
        assert trouble(pod("d", waiting=reason), NOW) == Trouble("d", reason, "why")
    assert trouble(pod("d", waiting="ContainerCreating"), NOW) is None  # on its way
    assert trouble(pod("d", waiting="ImagePullBackOff", phase="Running"), NOW) is None


def test_unschedulable_counts_once_it_has_lasted() -> None:
    assert trouble(pod("d", unschedulable_for=UNSCHEDULABLE_AFTER - timedelta(seconds=1)), NOW) is None
    found = trouble(pod("d", unschedulable_for=UNSCHEDULABLE_AFTER), NOW)
    assert found is not None and found.reason == "Unschedulable" and "Insufficient cpu" in found.message
    assert found.describe() == "pod d: Unschedulable: 0/1 nodes are available: 1 Insufficient cpu."


def test_the_first_pod_in_trouble_by_name_is_the_one_said() -> None:
    pods = [pod("run-exec-2", waiting="ErrImagePull"), pod("run-driver"), pod("run-exec-1", waiting="ErrImagePull")]
    found = first(pods, NOW)
    assert found is not None and found.pod == "run-exec-1"
    assert first([pod("run-driver", phase="Running")], NOW) is None


def test_an_unschedulable_pod_not_said_yet_asks_for_a_look_when_it_will_have_waited_long_enough() -> None:
    waiting = pod("d", unschedulable_for=timedelta(seconds=3))
    assert due([waiting], NOW) == NOW + UNSCHEDULABLE_AFTER - timedelta(seconds=3)
    assert due([pod("d", unschedulable_for=UNSCHEDULABLE_AFTER)], NOW) is None  # said already
    assert due([pod("d", waiting="ErrImagePull")], NOW) is None
