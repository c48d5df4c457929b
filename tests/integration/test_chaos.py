"""Faults on the real node, small: the chaos benchmark's scenarios (bench/chaos.py) at a size the suite
can afford, asserting what must hold whatever the timing — nothing duplicated, orphaned, lost, or
touched that is not ours. The benchmark runs them at full size and reports the figures.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes.client import ApiClient

from bench import chaos
from fibers_stack import StackInfo

pytestmark = pytest.mark.chaos


@pytest.fixture
def ctx(stack_info: StackInfo, kube: ApiClient, crds: None) -> Iterator[chaos.Context]:
    # A 3 s Connect sync interval (the benchmark's is 10 s): a short outage is seen, and the suite stays short.
    with chaos.context(stack_info, kube, seed=15, sync_interval=3) as context:
        yield context


def test_operator_killed_during_connect_churn_leaves_nothing_behind(ctx: chaos.Context) -> None:
    figures = chaos.operator_kills(ctx, resources=24, kills=8, foreign=3)
    assert figures["unconverged"] == 0
    assert (figures["duplicates"], figures["orphans"], figures["foreign_lost"]) == (0, 0, 0)
    assert figures["deleted_resources"] > 0 and figures["operations"] > figures["resources"]


def test_operator_killed_after_rerun_requests_makes_exactly_one_run_each(ctx: chaos.Context) -> None:
    figures = chaos.transform_kills(ctx, transforms=1, reruns=1)  # the benchmark makes 30 (bench/chaos.py)
    assert (figures["extra_spark_applications"], figures["missing_runs"]) == (0, 0)
    assert figures["spark_applications"] == 2
    # The kill exactly between the write-ahead status write and the create: the run recorded is created
    # by the next operator, under its name and submission id, and no other.
    ahead = chaos.transform_write_ahead_kill(ctx, "t0")
    assert ahead == {
        "created_before_restart": False,
        "same_run": True,
        "same_submission_id": True,
        "spark_applications": 3,
    }


def test_consumer_pods_deleted_under_write_load_lose_nothing(ctx: chaos.Context) -> None:
    figures = chaos.consumer_kills(ctx, kills=3)
    assert figures["rows_differing"] == 0
    assert figures["transactions"] > 0


def test_connect_kafka_and_api_server_faults_are_survived_and_reported(ctx: chaos.Context) -> None:
    figures = chaos.faults(ctx, resources=4, outage=22)  # longer than the 15 s REST timeout
    for fault in ("kafka_connect_restart", "kafka_restart", "apiserver_restart", "connect_unreachable"):
        assert figures[fault]["operator_alive"], fault
        assert figures[fault]["recovery_seconds"] is not None, fault
    assert figures["connect_unreachable"]["reported"], "22 s without Connect must show on the resources"
    assert figures["rows_differing"] == 0
    assert figures["operator_crashes"] == 0
    assert figures["operator_log_tracebacks"] == 0


def test_a_standby_takes_over_when_the_active_operator_dies_and_never_acts_before(ctx: chaos.Context) -> None:
    figures = chaos.standby(ctx, resources=4)
    assert figures["active_acted_on"] >= 4  # the logs show who acted: the check below can fail
    assert figures["standby_acted_while_active_lived"] == 0
    assert (figures["duplicates"], figures["unconverged"]) == (0, 0)


def test_operator_killed_at_each_move_of_a_replay_moves_every_step_exactly_once(ctx: chaos.Context) -> None:
    from bench.chaos_replay import replay_kills

    figures = replay_kills(ctx, kills=4, transform=False)  # the benchmark adds a Transform
    assert figures["kills"] >= 2 and figures["replay_phase"] == "Succeeded"
    assert (figures["redelivered_extra"], figures["view_wrong"]) == (0, 0)
    assert figures["steps"] == {"Connect/file": ["Repositioned", 6], "DatabusConsumer/view": ["Repositioned", 6]}
