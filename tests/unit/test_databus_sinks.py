"""Several sinks per consumer: the callback driver's threads, the rendered configuration, the checks."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from fibers.consumer.callbacks import Callback, Result, WindowFailed
from fibers.consumer.driver import CallbackDriver, CallbackTimeout
from fibers.consumer.events import ChangeEvent
from fibers.consumer.sinks import MongoSink
from fibers.consumer.testing import Feeder, change
from fibers.databus.config import ConfigError, ConsumerConfig
from fibers.databus.workload import SINK_URI_ENV, render_config, statefulset


def test_the_driver_runs_every_callback_at_once_on_its_own_thread() -> None:
    both_running = threading.Barrier(2, timeout=5)  # passes only if the two calls overlap
    names: list[str] = []

    def work(index: int) -> int:
        names.append(threading.current_thread().name)
        both_running.wait()
        return index * 10

    driver = CallbackDriver(2, timeout=10)
    try:
        assert driver.each(work) == [0, 10]
        assert sorted(names) == ["callback-0_0", "callback-1_0"]
    finally:
        driver.close()


def test_a_hung_callback_times_out_alone_and_is_abandoned() -> None:
    release = threading.Event()
    abandoned: list[bool] = []

    def work(index: int) -> str:
        if index == 1:
            release.wait(10)
            abandoned.append(driver.abandoned())
            return "late"
        return "done"

    driver = CallbackDriver(2, timeout=0.3)
    try:
        first, second = driver.each(work)
        assert first == "done"
        assert isinstance(second, CallbackTimeout)
        release.set()
        deadline = time.monotonic() + 5
        while not abandoned and time.monotonic() < deadline:
            time.sleep(0.01)
        assert abandoned == [True]  # the late thread knows it must stop
        assert driver.each(lambda i: i) == [0, 1]  # a new thread serves the next call
    finally:
        driver.close()


def test_failures_are_returned_per_callback_and_all_raises_the_first() -> None:
    def work(index: int) -> int:
        if index == 1:
            raise ValueError("sink 1 refused")
        return index

    driver = CallbackDriver(3, timeout=5)
    try:
        outcomes = driver.each(work)
        assert outcomes[0] == 0 and outcomes[2] == 2
        assert isinstance(outcomes[1], ValueError)
        with pytest.raises(ValueError, match="sink 1 refused"):
            driver.all(work)
    finally:
        driver.close()


def body(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"},
        "spec": {"sources": ["shop.public.orders"], **spec},
    }


def mongo(name: str | None = None, secret: str = "mongo") -> dict[str, Any]:
    sink = {"type": "mongodb", "uriSecretRef": {"name": secret, "key": "uri"}, "database": "shop", "collection": "o"}
    return {**sink, "name": name} if name else sink


def test_each_sink_gets_its_own_uri_variable_and_secret_reference() -> None:
    spec = body(sinks=[mongo("view"), {"type": "kafka", "topic": "orders-out"}, mongo("copy", secret="other")])
    config = render_config(spec, topics=["shop.public.orders"], kafka_bootstrap="kafka:9092")
    sinks = config["sinks"]
    assert [s["name"] for s in sinks] == ["view", "kafka", "copy"]
    assert [s.get("uriEnv") for s in sinks] == [SINK_URI_ENV, None, "FIBERS_SINK_2_URI"]
    assert all("uriSecretRef" not in s for s in sinks)  # only references, in the pod's env
    env = statefulset(spec, config=config, image="job", service_account=None)["spec"]["template"]["spec"]["containers"][
        0
    ]["env"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in env if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs == {SINK_URI_ENV: "mongo", "FIBERS_SINK_2_URI": "other"}
    parsed = ConsumerConfig.from_dict(config).check()
    assert [s["field"] for s in parsed.sinks] == ["spec.sinks[0]", "spec.sinks[1]", "spec.sinks[2]"]


def test_the_one_sink_form_renders_as_a_list_of_one() -> None:
    config = render_config(body(sink=mongo()), topics=["t"], kafka_bootstrap="kafka:9092")
    parsed = ConsumerConfig.from_dict(config).check()
    assert [(s["name"], s["field"], s["uriEnv"]) for s in parsed.sinks] == [("mongodb", "spec.sink", SINK_URI_ENV)]


@pytest.mark.parametrize(
    ("sinks", "message"),
    [
        ([mongo(), mongo()], "spec.sinks: names must be distinct"),
        ([mongo("a"), {**mongo("b"), "database": "a.b"}], "spec.sinks[1].database"),
        ([{"type": "kafka", "topic": "no spaces"}], "spec.sinks[0].topic"),
    ],
)
def test_sinks_that_cannot_run_are_refused_naming_the_entry(sinks: list[dict[str, Any]], message: str) -> None:
    config = render_config(body(sinks=sinks), topics=["t"], kafka_bootstrap="kafka:9092")
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ConsumerConfig.from_dict(config).check()


class Journal(Callback):
    """Records the Databus calls it gets; refuses a row whose key is "bad"."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def on_start_data_event_sequence(self, scn: int) -> Result:
        self.calls.append(("start", scn))
        return Result.SUCCESS

    def on_data_event(self, event: ChangeEvent) -> Result:
        self.calls.append(("event", event.key))
        return Result.ERROR if event.key == "bad" else Result.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> Result:
        self.calls.append(("end", scn))
        return Result.SUCCESS

    def on_rollback(self, scn: int) -> Result:
        self.calls.append(("rollback", scn))
        return Result.SUCCESS


def test_the_feeder_calls_a_callback_in_the_runtimes_order_and_rolls_back_a_failed_window() -> None:
    journal = Journal()
    feeder = Feeder(journal)
    feeder.window([change("1", {"v": 1}, scn=7, window="tx"), change("2", {"v": 2}, scn=7, window="tx")])
    assert journal.calls == [("start", 7), ("event", "1"), ("event", "2"), ("end", 7)]
    journal.calls.clear()
    with pytest.raises(WindowFailed):
        feeder.window([change("3", {"v": 3}, scn=8), change("bad", {"v": 0}, scn=8)])
    assert journal.calls == [("start", 8), ("event", "3"), ("event", "bad"), ("rollback", 7)]
    assert feeder.rollbacks == [7] and feeder.checkpoint == 7
    feeder.stop()


def test_a_fresh_thread_is_not_taken_for_an_abandoned_one_after_its_id_is_reused() -> None:
    """Thread ids are reused once a thread exits: the replay's new thread often gets the abandoned
    thread's id. Work is given up per submission, so every later batch still runs."""
    driver = CallbackDriver(1, timeout=0.1)

    def hang(index: int) -> str:
        time.sleep(0.3)
        return "late"

    try:
        assert isinstance(driver.each(hang)[0], CallbackTimeout)
        time.sleep(0.5)  # the abandoned thread has returned and exited; its id is free again
        assert [driver.each(lambda i: driver.abandoned())[0] for _ in range(20)] == [False] * 20
    finally:
        driver.close()


def test_a_kafka_sink_fails_the_batch_when_a_record_is_not_delivered() -> None:
    """librdkafka drops a record whose delivery failed from its queue, so `flush` alone returns 0 as if
    all were delivered: the sink must read the delivery reports. No broker answers here, so each
    record's delivery times out (a real producer; message.timeout.ms kept short)."""
    from fibers.consumer.sinks import KafkaSink

    sink = KafkaSink("127.0.0.1:9", "out", settings={"message.timeout.ms": 300})
    events = [ChangeEvent("in", 0, i, str(i), "c", i, i, {"id": i}) for i in range(3)]
    try:
        with pytest.raises(Exception, match="not delivered"):
            sink.flush(events)
    finally:
        sink.producer.purge()


def test_a_history_keeps_every_snapshot_row_whole_and_keys_relay_changes_by_position() -> None:
    """Snapshot rows all had offset -1, so the history kept one document per partition, and bootstrap
    events (no record value) were stored without their row."""
    from fibers.consumer.sinks import history_document

    rows = [ChangeEvent("t", 0, -1, str(k), "r", 50, "snapshot", {"id": k, "v": k * 10}) for k in range(3)]
    documents = dict(map(history_document, rows))
    assert len(documents) == 3
    assert [d["after"] for d in documents.values()] == [{"id": k, "v": k * 10} for k in range(3)]
    assert all(d["op"] == "r" and d["_scn"] == 50 for d in documents.values())
    assert history_document(rows[0]) == history_document(rows[0])  # a replayed page writes the same documents
    relay = ChangeEvent("t", 1, 7, "4", "u", 99, 7, {"id": 4}, raw={"op": "u", "after": {"id": 4}})
    assert history_document(relay) == (
        "t/1/7",
        {"op": "u", "after": {"id": 4}, "_key": "4", "_scn": 99, "_topic": "t", "_partition": 1, "_offset": 7},
    )


@pytest.mark.parametrize(
    ("on_undecodable", "message"),
    [
        ({"action": "explode"}, "spec.onUndecodable.action must be one of fail, skip, deadLetter"),
        ({"action": "deadLetter"}, "spec.onUndecodable.deadLetterTopic"),
        ({"action": "deadLetter", "deadLetterTopic": "in"}, "must not be a topic the consumer reads"),
    ],
)
def test_an_undecodable_policy_that_cannot_run_is_refused_naming_the_field(
    on_undecodable: dict[str, Any], message: str
) -> None:
    config = ConsumerConfig.from_dict(
        {
            "name": "c",
            "namespace": "n",
            "relay": {"bootstrapServers": "kafka:9092", "topics": ["in"]},
            "sink": {"type": "log"},
            "checkpoint": {"configMapName": "c-checkpoint"},
            "startPosition": "earliest",
            "onUndecodable": on_undecodable,
        }
    )
    with pytest.raises(ConfigError, match=message):
        config.check()


def test_a_view_of_several_topics_keeps_each_topics_rows_apart() -> None:
    """A view keeps one document per row key. Two tables' rows of one key (order 1, item 1: a Debezium
    connector capturing both, read through its sourceRef) were one document, each change overwriting the
    other's row, and the key's SCN guard skipping the older table's changes. Such a view is refused unless
    its collection names each topic's own (`{topic}`), and then each topic's rows go to their collection."""
    topics = ["shop.public.orders", "shop.public.items"]
    shared = render_config(body(sink=mongo()), topics=topics, kafka_bootstrap="kafka:9092")
    with pytest.raises(ConfigError, match=r"spec.sink.collection: .*2 topics.*\{topic\}"):
        ConsumerConfig.from_dict(shared).check()
    history = render_config(body(sink={**mongo(), "type": "history"}), topics=topics, kafka_bootstrap="kafka:9092")
    ConsumerConfig.from_dict(history).check()  # a history is keyed by topic, partition and offset
    ConsumerConfig.from_dict(render_config(body(sink=mongo()), topics=topics[:1], kafka_bootstrap="k:9092")).check()

    apart = render_config(body(sink={**mongo(), "collection": "v_{topic}"}), topics=topics, kafka_bootstrap="k:9092")
    sink = ConsumerConfig.from_dict(apart).check().sinks[0]
    applied: dict[str, list[str]] = {}

    class Collection:
        def __init__(self, name: str) -> None:
            self.name = name

        def apply(self, events: list[ChangeEvent]) -> None:
            applied.setdefault(self.name, []).extend(f"{e.topic}/{e.key}" for e in events)

    view = MongoSink.__new__(MongoSink)
    view.template, view.collections = sink["collection"], {}
    view.open = Collection  # type: ignore[assignment]
    order = change("1", {"id": 1, "total": 9}, scn=100, topic=topics[0])
    item = change("1", None, scn=200, op="d", before={"id": 1}, topic=topics[1])
    view.flush([order, item])
    assert applied == {"v_shop.public.orders": ["shop.public.orders/1"], "v_shop.public.items": ["shop.public.items/1"]}
