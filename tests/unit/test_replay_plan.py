"""A Replay's plan (fibers.replay.plan): one step at a time, upstream first, never left half way."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fibers.replay import plan
from fibers.replay.plan import FAILED, REPOSITIONED, SEEKING, SKIPPED, WAITING, ReplaySpec, ReplaySpecError
from fibers.replay.reconciler import Pass, ReplayReconciler, _reads
from fibers.startfrom import StartFrom

NOW_MS = 1_795_770_000_000  # 2026-11-27T09:00:00Z
SPEC = ReplaySpec(StartFrom(timestamp_ms=NOW_MS - 3_600_000), sinks="reapply", pipeline="shop-orders")
NONCE = "replay-fix-1234abcd"


def target(kind: str, name: str, *, seek: str | None = None, sought: str | None = None, **ready: Any) -> dict[str, Any]:
    """A step as the API server returns it: generation 2 carries the seek when `seek` is set."""
    status: dict[str, Any] = {"observedGeneration": 2, "windowScn": 41}
    if sought:
        status["lastSeekNonce"] = sought
    if ready:
        status["conditions"] = [{"type": "Ready", "observedGeneration": 2, **ready}]
    if kind == "Transform" and sought:
        status["currentRun"] = {"name": "r-2", "trigger": "seek", "applicationState": "COMPLETED"}
    spec = {"seek": {"nonce": seek}} if seek else {}
    return {"metadata": {"name": name, "generation": 2}, "spec": spec, "status": status}


def steps() -> dict[str, Any]:
    planned = [("Connect", "cdc", "not repositioned"), ("Transform", "agg", ""), ("DatabusConsumer", "view", "")]
    return {"steps": plan.new_steps(planned)}


def test_the_first_step_to_move_is_told_to_seek_and_nothing_after_it() -> None:
    decision = plan.decide(SPEC, steps(), {"Transform/agg": target("Transform", "agg")}, NONCE, "t0")
    assert decision.seek == (
        "Transform",
        "agg",
        {"nonce": NONCE, "startFrom": {"timestamp": "2026-11-27T08:00:00.000Z"}},
    )
    states = [s["state"] for s in decision.status["steps"]]
    assert states == [SKIPPED, SEEKING, WAITING] and decision.status["phase"] == plan.RUNNING
    assert decision.status["steps"][1]["before"] == "no run" and decision.status["progress"] == "1/3"


def test_a_step_is_repositioned_once_its_status_for_the_seeks_generation_says_it_runs_from_there() -> None:
    status = plan.decide(SPEC, steps(), {"Transform/agg": target("Transform", "agg")}, NONCE, "t0").status
    taken = target("Transform", "agg", seek=NONCE, sought=NONCE, status="False", reason="Submitted")
    still = plan.decide(SPEC, status, {"Transform/agg": taken}, NONCE, "t1")
    assert still.seek is None and still.status["steps"][1]["state"] == SEEKING
    done = target("Transform", "agg", seek=NONCE, sought=NONCE, status="True", reason="Succeeded")
    consumer = target("DatabusConsumer", "view")
    moved = plan.decide(SPEC, still.status, {"Transform/agg": done, "DatabusConsumer/view": consumer}, NONCE, "t2")
    assert moved.status["steps"][1]["state"] == REPOSITIONED
    assert moved.seek == (
        "DatabusConsumer",
        "view",
        {"nonce": NONCE, "startFrom": SPEC.start.to_dict(), "sinks": "reapply"},
    )
    assert moved.status["steps"][2]["before"] == "window SCN 41"


def test_a_stale_ready_of_the_generation_before_the_seek_is_not_taken_for_repositioned() -> None:
    status = {"steps": [{"kind": "DatabusConsumer", "name": "view", "state": SEEKING, "nonce": NONCE}]}
    stale = target("DatabusConsumer", "view", seek=NONCE, sought=NONCE, status="True", reason="Consuming")
    stale["metadata"]["generation"] = 3  # the seek's generation, not observed yet
    decision = plan.decide(SPEC, status, {"DatabusConsumer/view": stale}, NONCE, "t")
    assert decision.status["steps"][0]["state"] == SEEKING


def test_a_failing_step_ends_the_replay_there_the_steps_after_it_untouched() -> None:
    status = {"steps": plan.new_steps([("DatabusConsumer", "store", ""), ("DatabusConsumer", "view", "")])}
    status["steps"][0].update(state=SEEKING, nonce=NONCE)
    failing = target(
        "DatabusConsumer", "store", seek=NONCE, sought=NONCE, status="False", reason="StartBeforeRetention", message="m"
    )
    decision = plan.decide(SPEC, status, {"DatabusConsumer/store": failing}, NONCE, "t")
    assert [s["state"] for s in decision.status["steps"]] == [FAILED, WAITING]
    assert decision.status["phase"] == FAILED and decision.seek is None
    assert decision.status["steps"][0]["message"] == "StartBeforeRetention: m"
    again = plan.decide(SPEC, decision.status, {}, NONCE, "t2")  # finished: nothing more, ever
    assert again.status == decision.status and again.seek is None


def test_a_step_whose_seek_someone_else_replaced_or_that_went_away_fails_the_replay() -> None:
    status = {"steps": [{"kind": "Transform", "name": "agg", "state": SEEKING, "nonce": NONCE}]}
    other = target("Transform", "agg", seek="by-hand", sought="by-hand", status="True", reason="Succeeded")
    assert plan.decide(SPEC, status, {"Transform/agg": other}, NONCE, "t").status["phase"] == FAILED
    assert plan.decide(SPEC, status, {"Transform/agg": None}, NONCE, "t").status["phase"] == FAILED


def test_a_step_that_cannot_take_its_seek_fails_the_replay_and_one_held_up_says_why() -> None:
    """A Connect with a spec the operator refuses never took the seek: the replay said "waiting for the
    operator to take the seek" for ever, and held its steps from every later replay."""
    status = {"steps": [{"kind": "Connect", "name": "sink", "state": SEEKING, "nonce": NONCE}]}
    refused = target("Connect", "sink", seek=NONCE, status="False", reason="InvalidSpec", message="spec.config.x")
    decision = plan.decide(SPEC, status, {"Connect/sink": refused}, NONCE, "t")
    assert decision.status["phase"] == FAILED
    assert decision.status["steps"][0]["message"] == "cannot take the seek: InvalidSpec: spec.config.x"
    held = target("Connect", "sink", seek=NONCE, status="False", reason="SecretNotFound", message="Secret db")
    decision = plan.decide(SPEC, status, {"Connect/sink": held}, NONCE, "t")
    assert decision.status["phase"] == plan.RUNNING
    assert decision.status["steps"][0]["message"] == "the seek waits: SecretNotFound: Secret db"
    # A DatabusConsumer takes a seek whatever its spec (a seek is how it is put right): it is waited for.
    status = {"steps": [{"kind": "DatabusConsumer", "name": "view", "state": SEEKING, "nonce": NONCE}]}
    consumer = target("DatabusConsumer", "view", seek=NONCE, status="False", reason="InvalidSpec", message="m")
    assert plan.decide(SPEC, status, {"DatabusConsumer/view": consumer}, NONCE, "t").status["phase"] == plan.RUNNING


def test_every_step_repositioned_or_skipped_is_success() -> None:
    status = {"steps": plan.new_steps([("Connect", "cdc", "why")])}
    decision = plan.decide(SPEC, status, {}, NONCE, "t")
    assert decision.status["phase"] == plan.SUCCEEDED and decision.status["progress"] == "1/1"


def test_the_spec_is_checked_before_anything_moves() -> None:
    parsed = ReplaySpec.parse({"pipeline": "p", "startFrom": {"timestamp": "2026-11-27T08:00:00Z"}}, NOW_MS)
    assert parsed.start.timestamp_ms == NOW_MS - 3_600_000 and parsed.sinks == "skip-existing"
    with pytest.raises(ReplaySpecError, match=r"spec\.startFrom\.timestamp .* is in the future"):
        ReplaySpec.parse({"pipeline": "p", "startFrom": {"timestamp": "2026-11-27T10:00:00Z"}}, NOW_MS)
    with pytest.raises(ReplaySpecError, match="name a pipeline or the resources"):
        ReplaySpec.parse({"startFrom": {"position": "earliest"}}, NOW_MS)


@pytest.mark.parametrize("pipeline", ["orders pipeline", "orders!", "-orders", "a" * 64])
def test_a_pipeline_that_is_no_label_value_is_refused_naming_the_field(pipeline: str) -> None:
    """It is listed by label: before, the API server refused the listing at every look, and the Replay
    retried for ever with no status (its spec is immutable: only deleting it ended that)."""
    with pytest.raises(ReplaySpecError, match=r"spec\.pipeline must be a label value"):
        ReplaySpec.parse({"pipeline": pipeline, "startFrom": {"position": "earliest"}}, NOW_MS)
    assert ReplaySpec.parse({"pipeline": "orders.v2_x-1", "startFrom": {"position": "earliest"}}, NOW_MS).pipeline


def replay(name: str, created: str, pipeline: str, phase: str | None, steps_: list[tuple[str, str]]) -> dict[str, Any]:
    status = {"steps": [{"kind": k, "name": n} for k, n in steps_], **({"phase": phase} if phase else {})}
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": {"pipeline": pipeline}, "status": status}


def test_of_two_replays_on_one_pipeline_the_newer_gives_way() -> None:
    older = replay("a", "2026-11-27T08:00:00Z", "p", plan.RUNNING, [("Transform", "agg")])
    newer = replay("b", "2026-11-27T08:01:00Z", "p", None, [])
    mine = [{"kind": "Transform", "name": "agg"}]
    assert plan.overlapping(mine, [older, newer], newer) == "a"
    assert plan.overlapping(mine, [older, newer], older) == ""
    done = replay("a", "2026-11-27T08:00:00Z", "p", plan.SUCCEEDED, [("Transform", "agg")])
    assert plan.overlapping(mine, [done, newer], newer) == ""


def connect(*, offsets_reason: str, ready: str, records: int | None = 6) -> dict[str, Any]:
    """A sink Connect whose own seek (the Replay's nonce) ended: Offsets says how, Ready how it runs now."""
    body = target("Connect", "sink", seek=NONCE, sought=NONCE, status=ready, reason="Running")
    last = {"operation": "seek", "result": "Succeeded", **({"records": records} if records is not None else {})}
    body["status"]["offsets"] = {"lastOperation": last}
    body["status"]["conditions"].append({"type": "Offsets", "reason": offsets_reason, "message": "moved: 6 record(s)"})
    return body


def test_a_sink_connect_is_repositioned_once_its_seek_moved_it_and_it_runs_again_with_its_count() -> None:
    status = {"steps": [{"kind": "Connect", "name": "sink", "state": SEEKING, "nonce": NONCE}]}
    moving = plan.decide(
        SPEC, status, {"Connect/sink": connect(offsets_reason="Repositioned", ready="False")}, NONCE, "t"
    )
    assert moving.status["steps"][0]["state"] == SEEKING  # moved, still STOPPED: not running from there yet
    done = plan.decide(SPEC, status, {"Connect/sink": connect(offsets_reason="Repositioned", ready="True")}, NONCE, "t")
    assert (done.status["steps"][0]["state"], done.status["steps"][0]["records"]) == (REPOSITIONED, 6)
    assert done.repositioned == [("Connect", "sink")] and done.status["phase"] == plan.SUCCEEDED
    refused = plan.decide(
        SPEC, status, {"Connect/sink": connect(offsets_reason="SeekFailed", ready="True")}, NONCE, "t"
    )
    assert refused.status["steps"][0]["state"] == FAILED and refused.repositioned == []
    assert plan.seek_of("Connect", SPEC, NONCE) == {"nonce": NONCE, "startFrom": SPEC.start.to_dict()}  # no sinks


def test_named_resources_are_planned_by_their_specs_so_a_source_connector_is_skipped_under_keep() -> None:
    """Named in spec.resources (rather than by a pipeline label), each resource is read before it is planned:
    planned from its name alone, a Debezium source looked like a step to move, and `sources: keep` became an
    incremental snapshot the user had not asked for (its tables sent again downstream)."""
    bodies = {
        ("connects", "orders-cdc"): {"metadata": {"name": "orders-cdc"}, "spec": {"class": "Pg", "config": {}}},
        ("connects", "orders-sink"): {"metadata": {"name": "orders-sink"}, "spec": {"config": {"topics": "t"}}},
        # a sink whose topics come from a Secret: a sink all the same (it used to be skipped as a source)
        ("connects", "secret-sink"): {
            "metadata": {"name": "secret-sink"},
            "spec": {
                "class": "S",
                "config": {},
                "secretConfig": {"topics": {"secretKeyRef": {"name": "s", "key": "t"}}},
            },
        },
    }

    class Kube:
        async def get_object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
            assert namespace == "shop"  # only the Replay's own namespace is read
            return bodies.get((plural, name))

    names = ["orders-cdc", "orders-sink", "secret-sink", "not-there-yet"]
    replay = {
        "metadata": {"namespace": "shop", "name": "r", "uid": "u"},
        "spec": {"startFrom": {"position": "earliest"}, "resources": [{"kind": "Connect", "name": n} for n in names]},
    }
    p = Pass(replay, {})
    reconciler = ReplayReconciler(Kube())  # type: ignore[arg-type]
    asyncio.run(reconciler._read_spec(p))
    asyncio.run(reconciler._plan_steps(p))
    states = {s["name"]: s["state"] for s in p.status["steps"]}
    assert states == {"orders-cdc": SKIPPED, "orders-sink": WAITING, "secret-sink": WAITING, "not-there-yet": WAITING}


def test_a_suspended_transform_is_repositioned_by_its_pending_seek_instead_of_holding_the_replay() -> None:
    """A suspended Transform takes no seek until resumed, so the Replay waited on it for ever ("waiting for the
    operator to take the seek"); its first run after the resume is the seek's, as a stopped consumer's is."""
    body = target("Transform", "agg", seek=NONCE)
    body["spec"]["state"] = "suspended"
    assert plan.step_state("Transform", body, NONCE) == (
        REPOSITIONED,
        "suspended: its run of the seek starts when it is resumed",
    )
    body["spec"]["state"] = "running"
    assert plan.step_state("Transform", body, NONCE)[0] == SEEKING  # running: it must take the seek first


def test_records_to_replay_are_counted_on_the_operators_own_kafka_only() -> None:
    """A step's bootstrapServers is its user's: a count there would have the operator's pod connect wherever a
    namespace points it (and a Transform's was counted on the wrong Kafka). Such a step is not counted."""
    elsewhere = {"spec": {"relay": {"bootstrapServers": "evil.example:9092"}}, "status": {"sources": ["t"]}}
    assert _reads("DatabusConsumer", elsewhere, "kafka:9092") == ("", ["t"])
    same = {"spec": {"relay": {"bootstrapServers": "kafka:9092"}}, "status": {"sources": ["t"]}}
    assert _reads("DatabusConsumer", same, "kafka:9092") == ("kafka:9092", ["t"])
    transform = {"spec": {"kafka": {"bootstrapServers": "other:9092"}}, "status": {"inputs": [{"topics": ["u"]}]}}
    assert _reads("Transform", transform, "kafka:9092") == ("", ["u"])
    transform["spec"] = {}
    assert _reads("Transform", transform, "kafka:9092") == ("kafka:9092", ["u"])
